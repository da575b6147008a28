//! A node's side of the cluster (`airlock serve --role node`): every request must carry the
//! cluster secret, since only gateways may reach a node; the caller a gateway names beside it
//! stands in for the API key (see `crate::http::auth`). Gateways poll [`report`].

use super::{ClusterSecret, CALLER_HEADER, GATEWAY_HEADERS, OPERATOR_HEADER, SECRET_HEADER};
use crate::http::error::ApiError;
use crate::AppState;
use airlock_core::lifecycle::host_cores;
use airlock_wire::nodes::NodeReport;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The API key a gateway checked for a request it forwarded: the node takes it as the caller.
#[derive(Debug, Clone)]
pub struct ForwardedCaller {
    pub id: String,
    pub operator: bool,
}

/// In front of everything a node serves but `/health` (Kubernetes' probes carry no secret):
/// a request without the cluster secret is refused, and the gateway's headers never go further
/// (the proxy would otherwise hand the secret to a sandbox).
pub async fn require_gateway(
    State(secret): State<ClusterSecret>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    let headers = req.headers();
    let from_gateway = headers
        .get(SECRET_HEADER)
        .is_some_and(|given| secret.matches(given.as_bytes()));
    if !from_gateway {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this is an Airlock node: it answers only its cluster's gateways; send requests to a \
             gateway (airlock serve --role gateway)",
        )
        .into_response();
    }
    let caller = headers
        .get(CALLER_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty())
        .map(|id| ForwardedCaller {
            id: id.to_owned(),
            operator: headers.get(OPERATOR_HEADER).is_some_and(|v| v == "1"),
        });
    for name in GATEWAY_HEADERS {
        req.headers_mut().remove(*name);
    }
    if let Some(caller) = caller {
        req.extensions_mut().insert(caller);
    }
    next.run(req).await
}

/// `GET /cluster/node`: this node's load, for its gateways' health polls and placement.
pub async fn report(State(state): State<AppState>) -> Json<NodeReport> {
    let load = state.lifecycle.host_load();
    let detail = crate::http::nodes::this_node(&state);
    Json(NodeReport {
        node: detail.node,
        cpus: host_cores() as u32,
        memory_available_mib: load.memory_available_bytes.unwrap_or(0) >> 20,
        max_sandboxes: load.max_sandboxes as u32,
        launches_queued: load.launches_queued as u32,
        warm_templates: state.lifecycle.warm_templates(),
    })
}
