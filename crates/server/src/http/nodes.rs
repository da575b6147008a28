//! `GET /nodes` and `GET /nodes/{nodeID}`: the machines that run sandboxes, in E2B's shapes,
//! for an operator's key. One `airlock serve` is one node, named by `--node-name`.

use crate::http::auth::Operator;
use crate::http::error::ApiError;
use crate::AppState;
use airlock_core::store::SandboxState;
use airlock_request::JsonBody;
use airlock_wire::nodes::{Node, NodeDetail, NodeStatus, NodeStatusChange};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

pub async fn list(_: Operator, State(state): State<AppState>) -> Json<Vec<Node>> {
    Json(vec![this_node(&state).node])
}

pub async fn detail(
    _: Operator,
    State(state): State<AppState>,
    Path(node_id): Path<String>,
) -> Result<Json<NodeDetail>, ApiError> {
    if node_id != state.node_name {
        return Err(ApiError::not_found(format!(
            "no node '{node_id}' (GET /nodes lists them)"
        )));
    }
    Ok(Json(this_node(&state)))
}

/// E2B's `POST /nodes/{nodeID}`: `draining` drains this node (see
/// `airlock_core::lifecycle::Lifecycle::drain`), `ready` takes it back.
pub async fn set_status(
    _: Operator,
    State(state): State<AppState>,
    Path(node_id): Path<String>,
    JsonBody(change): JsonBody<NodeStatusChange>,
) -> Result<StatusCode, ApiError> {
    if node_id != state.node_name {
        return Err(ApiError::not_found(format!(
            "no node '{node_id}' (GET /nodes lists them)"
        )));
    }
    match change.status {
        NodeStatus::Draining => state.lifecycle.drain(),
        NodeStatus::Ready => state.lifecycle.undrain(),
        NodeStatus::Unhealthy => {
            return Err(ApiError::bad_request(
                "a node is unhealthy only by failing its health checks: ask for ready or draining",
            ))
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// This server's node: the sandboxes running here and what they were given.
pub(crate) fn this_node(state: &AppState) -> NodeDetail {
    let running: Vec<_> = state
        .lifecycle
        .list_records()
        .into_iter()
        .filter(|r| r.state == SandboxState::Running)
        .collect();
    NodeDetail {
        node: Node {
            node_id: state.node_name.clone(),
            status: if state.lifecycle.draining() {
                NodeStatus::Draining
            } else {
                NodeStatus::Ready
            },
            sandbox_count: running.len() as u32,
            allocated_cpu: running.iter().map(|r| r.resources.cpu_count).sum(),
            allocated_memory_mib: running
                .iter()
                .map(|r| u64::from(r.resources.memory_mb))
                .sum(),
        },
        sandboxes: running.iter().map(|r| r.id.to_string()).collect(),
    }
}
