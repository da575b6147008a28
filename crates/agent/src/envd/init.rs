//! `/init`, `/envs` and `/health`: the server's side of the handshake. It waits for `/health`,
//! then calls `/init` once to hand the agent the sandbox's env vars, access token and (for a
//! sandbox restored from a checkpoint) its own hostname.

use crate::config::Config;
use crate::envd::log::SandboxLog;
use crate::rpc::RpcError;
use airlock_wire::envd::InitRequest;
use airlock_wire::logs::LogLevel;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The settings `/init` changes, and the log that records a new identity.
type Handshake = (Arc<Config>, Arc<SandboxLog>);

pub fn routes(config: Arc<Config>, log: Arc<SandboxLog>) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/init", post(init))
        .route("/envs", get(envs))
        .with_state((config, log))
}

async fn init(
    State((config, log)): State<Handshake>,
    Json(body): Json<InitRequest>,
) -> Result<StatusCode, RpcError> {
    if let Some(name) = config.apply_init(body)? {
        log.write(
            LogLevel::Info,
            format!("sandbox {name} started"),
            [("sandbox", name.clone())],
        );
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn envs(State((config, _)): State<Handshake>) -> Json<BTreeMap<String, String>> {
    Json(config.current().env_vars)
}
