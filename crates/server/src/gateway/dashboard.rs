//! The dashboard's overview through a gateway: every healthy node is asked for the caller's
//! sandboxes and its headroom, and the answers are put together, with the paused sandboxes
//! of nodes that do not answer. (Its page and build logs
//! come from any node, and a sandbox's actions from the sandbox's node, as routed.)

use super::forward::{CheckedCaller, Kind};
use super::nodes::NodeAddress;
use super::GatewayState;
use crate::dashboard::Overview;
use crate::http::error::ApiError;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::HashSet;

/// The overview's path on a node.
const OVERVIEW: &str = "/dashboard/api/state";

/// The most a node's overview may take (some thousands of sandboxes with their metadata).
const MAX_OVERVIEW: usize = 64 << 20;

/// `GET /dashboard/api/state`: the cluster's overview for `caller`. The first healthy node
/// also lists the caller's paused sandboxes of the nodes that do not answer (from the catalog:
/// they resume elsewhere). A node that fails to answer is left out (and logged); 503 if none
/// answers.
pub async fn overview(gw: &GatewayState, caller: &CheckedCaller) -> Response {
    let nodes = gw.nodes.all_healthy();
    let healthy: HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let mut silent: Vec<String> = (gw.nodes.list().into_iter())
        .map(|n| n.node_id)
        .filter(|name| !healthy.contains(name.as_str()))
        .collect();
    silent.sort();
    let uris = (0..nodes.len()).map(|i| match i {
        0 if !silent.is_empty() => format!("{OVERVIEW}?pausedOn={}", silent.join(",")),
        _ => OVERVIEW.to_owned(),
    });
    let asks = (nodes.iter().zip(uris)).map(|(node, uri)| of_node(gw, caller, node, uri));
    let answers: Vec<Overview> = futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect();
    match Overview::of_nodes(answers) {
        Some(all) => Json(all).into_response(),
        None => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no node answered for the dashboard (GET /nodes shows them)",
        )
        .into_response(),
    }
}

async fn of_node(
    gw: &GatewayState,
    caller: &CheckedCaller,
    node: &NodeAddress,
    uri: String,
) -> Option<Overview> {
    let mut ask = Request::new(Body::empty());
    *ask.method_mut() = Method::GET;
    *ask.uri_mut() = uri.parse().ok()?;
    let answer = gw.forward.send(node, ask, Some(caller), Kind::Api).await;
    let status = answer.status();
    let body = axum::body::to_bytes(answer.into_body(), MAX_OVERVIEW).await;
    let parsed = match body {
        Ok(body) if status.is_success() => {
            serde_json::from_slice::<Overview>(&body).map_err(|e| e.to_string())
        }
        Ok(body) => Err(format!("{status}: {}", String::from_utf8_lossy(&body))),
        Err(e) => Err(e.to_string()),
    };
    parsed
        .inspect_err(
            |e| tracing::warn!(node = %node.name, error = %e, "a node's dashboard overview failed"),
        )
        .ok()
}
