//! Sends a request on to a node as it came, bodies streaming both ways, with the cluster secret
//! and the caller the gateway checked. The Host header stays, unlike at the proxy into a
//! sandbox: a node routes sandbox traffic by it (`{port}-{id}.{domain}`).

use super::nodes::{NodeAddress, NodeClient};
use crate::cluster::{ClusterSecret, CALLER_HEADER, OPERATOR_HEADER, SECRET_HEADER};
use crate::http::error::ApiError;
use crate::proxy::retarget;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::time::Duration;

/// How long a node has to begin its answer to an API call (a create may wait its turn to
/// start, up to `--max-launch-wait-secs`, and then start). Sandbox traffic has no such bound:
/// a command's stream begins when the command does, but an upload may take long to send.
const API_ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// Who the gateway found a request to be from.
#[derive(Debug, Clone)]
pub struct CheckedCaller {
    pub id: String,
    pub operator: bool,
}

/// What a forwarded request is, for how long its answer may take to begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Api,
    SandboxTraffic,
}

pub struct Forwarder {
    pub client: NodeClient,
    pub secret: ClusterSecret,
}

impl Forwarder {
    /// `req`, sent to `node` as `caller`'s (`None`: a route with its own authority).
    pub async fn send(
        &self,
        node: &NodeAddress,
        req: Request,
        caller: Option<&CheckedCaller>,
        kind: Kind,
    ) -> Response {
        let (mut parts, body) = req.into_parts();
        if let Err(e) = retarget(&mut parts, &node.endpoint) {
            return e.into_response();
        }
        let headers = &mut parts.headers;
        match HeaderValue::from_str(self.secret.as_str()) {
            Ok(secret) => headers.insert(SECRET_HEADER, secret),
            Err(_) => return internal("the cluster secret is not a header value"),
        };
        if let Some(caller) = caller {
            match HeaderValue::from_str(&caller.id) {
                Ok(id) => headers.insert(CALLER_HEADER, id),
                Err(_) => return internal("a key id is not a header value"),
            };
            if caller.operator {
                headers.insert(OPERATOR_HEADER, HeaderValue::from_static("1"));
            }
        }
        let sent = self.client.request(hyper::Request::from_parts(parts, body));
        let answer = match kind {
            Kind::Api => match tokio::time::timeout(API_ANSWER_TIMEOUT, sent).await {
                Ok(answer) => answer,
                Err(_) => {
                    return unreachable(
                        node,
                        &format!("it did not answer in {API_ANSWER_TIMEOUT:?}"),
                    )
                }
            },
            Kind::SandboxTraffic => sent.await,
        };
        match answer {
            Ok(resp) => resp.map(Body::new),
            Err(e) => {
                tracing::warn!(node = %node.name, endpoint = %node.endpoint, error = %e,
                    "forwarding to a node failed");
                unreachable(node, "the connection to it failed")
            }
        }
    }
}

/// 503 for a node that did not take or answer a request.
fn unreachable(node: &NodeAddress, why: &str) -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "node '{}' cannot be reached ({why}); try again: gateways stop using a node that \
             does not answer within seconds",
            node.name
        ),
    )
    .into_response()
}

fn internal(why: &str) -> Response {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, why).into_response()
}
