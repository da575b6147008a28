//! `GET /nodes` and `GET /nodes/{nodeID}`: the machines that run sandboxes, in E2B's shapes,
//! for an operator's key. One `airlock serve` is one node, named by `--node-name`.

use crate::http::auth::Operator;
use crate::http::error::ApiError;
use crate::AppState;
use airlock_core::store::SandboxState;
use airlock_wire::nodes::{Node, NodeDetail, NodeStatus};
use axum::extract::{Path, State};
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

/// This server's node: the sandboxes running here and what they were given.
fn this_node(state: &AppState) -> NodeDetail {
    let running: Vec<_> = state
        .lifecycle
        .list_records()
        .into_iter()
        .filter(|r| r.state == SandboxState::Running)
        .collect();
    NodeDetail {
        node: Node {
            node_id: state.node_name.clone(),
            status: NodeStatus::Ready,
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
