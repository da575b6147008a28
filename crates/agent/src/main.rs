//! `airlock-agent`: the daemon inside every Airlock sandbox.
//!
//! It serves E2B's envd protocol natively on port 49983: Connect-JSON `process.Process` and
//! `filesystem.Filesystem`, plus plain HTTP `/files`, `/health`, `/envs` and `/init`. The server
//! reaches it over the sandbox's own network link and calls `/init` once to hand it the sandbox's
//! env vars and access token.

mod auth;
mod files;
mod fs;
mod interpreter;
mod process;
mod rpc;
mod state;
mod users;
mod watch;

use airlock_wire::envd::InitRequest;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use state::{Agent, AgentState};
use std::collections::BTreeMap;
use std::net::SocketAddr;

fn router(state: AgentState) -> Router {
    let authed = Router::new()
        .route("/init", post(init))
        .route("/envs", get(envs))
        .merge(process::routes())
        .merge(fs::routes())
        .merge(watch::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .merge(files::routes())
        .merge(authed)
        .with_state(state)
}

async fn init(State(agent): State<AgentState>, Json(body): Json<InitRequest>) -> StatusCode {
    agent.apply_init(body);
    StatusCode::NO_CONTENT
}

async fn envs(State(agent): State<AgentState>) -> Json<BTreeMap<String, String>> {
    Json(agent.config().env_vars)
}

/// Points stdin, stdout and stderr at /dev/null. The host hands the agent a log file as its stdio;
/// once the agent is up, nothing a sandbox process does should be able to grow that file.
fn detach_stdio() -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for fd in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors with a valid open fd; no Rust object owns
        // fds 0-2 exclusively, and std's stdio handles keep working against /dev/null.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_AGENT_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let port = std::env::var("AIRLOCK_AGENT_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(airlock_wire::ENVD_PORT);
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("airlock-agent: cannot listen on {addr}: {e}");
            std::process::exit(1);
        }
    };
    if std::env::var_os("AIRLOCK_AGENT_KEEP_STDIO").is_none() {
        if let Err(e) = detach_stdio() {
            eprintln!("airlock-agent: cannot detach stdio: {e}");
        }
    }
    let agent = Agent::new();
    interpreter::start(agent.clone()).await;
    let app = router(agent);
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("airlock-agent: server failed: {e}");
        std::process::exit(1);
    }
}
