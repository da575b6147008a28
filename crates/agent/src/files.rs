//! `/files` upload and download (being written).
use crate::state::AgentState;
use axum::Router;
pub fn routes() -> Router<AgentState> {
    Router::new()
}
