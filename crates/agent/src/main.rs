//! `airlock-agent`: the daemon inside every Airlock sandbox.
//!
//! It serves E2B's envd protocol natively on port 49983: Connect-JSON `process.Process` and
//! `filesystem.Filesystem`, plus plain HTTP `/files`, `/health`, `/envs` and `/init`. The server
//! reaches it over the sandbox's own network link and calls `/init` once to hand it the sandbox's
//! env vars, access token and (for a sandbox restored from a checkpoint) its own hostname.

use airlock_agent::state::{Agent, AgentState};
use airlock_agent::{
    auth, caps, files, fs, idle, interpreter, layer, log, oom, process, provision, reaper, reboot,
    rpc, sudo, watch,
};
use airlock_wire::envd::InitRequest;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use std::collections::BTreeMap;
use std::net::SocketAddr;

fn router(state: AgentState) -> Router {
    let routes = Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/init", post(init))
        .route("/envs", get(envs))
        .merge(files::routes())
        .merge(process::routes())
        .merge(fs::routes())
        .merge(watch::routes())
        .merge(log::routes())
        .merge(reboot::routes())
        .merge(idle::routes())
        .with_state(state.clone());
    auth::guard(routes, state, auth::Port::Envd)
}

async fn init(
    State(agent): State<AgentState>,
    Json(body): Json<InitRequest>,
) -> Result<StatusCode, rpc::RpcError> {
    agent.apply_init(body)?;
    Ok(StatusCode::NO_CONTENT)
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

fn main() {
    // Templates link /usr/bin/sudo to this binary (see `sudo`).
    let invoked_as = std::env::args().next().unwrap_or_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::path::Path::new(&invoked_as).file_name() == Some("sudo".as_ref()) {
        sudo::client::main(&args);
    }
    // Tools the build runs inside a build sandbox, with this same static binary: an image may
    // have nothing else to run them with.
    let tool = match args.first().map(String::as_str) {
        Some("unpack-layer") => Some(layer::main(&args[1..])),
        Some("provision") => Some(provision::main(&args[1..])),
        _ => None,
    };
    if let Some(result) = tool {
        if let Err(e) = result {
            eprintln!("airlock-agent {}: {e}", args[0]);
            std::process::exit(1);
        }
        return;
    }
    // Before the runtime starts its threads: the bounding set is per thread, and every thread
    // (and so every process the agent forks) must inherit the reduced one.
    if let Err(e) = caps::keep_sys_admin_from_children() {
        eprintln!("airlock-agent: cannot drop CAP_SYS_ADMIN from the bounding set: {e}");
        // As root that leaves sandbox processes able to regain it; elsewhere (a dev run on the
        // host) it merely could not be dropped.
        if nix::unistd::geteuid().is_root() {
            std::process::exit(1);
        }
    }
    if let Err(e) = caps::refuse_tracing() {
        eprintln!("airlock-agent: cannot make itself non-dumpable: {e}");
        std::process::exit(1);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("airlock-agent: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(serve());
}

async fn serve() {
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
    // The duties of a sandbox's first process; a development run on a host has neither.
    if std::process::id() == 1 {
        for (name, duty) in [("oom-guard", oom::guard as fn()), ("reaper", reaper::reap)] {
            if let Err(e) = std::thread::Builder::new().name(name.into()).spawn(duty) {
                tracing::error!(thread = name, error = %e, "cannot start a thread");
            }
        }
        if let Err(e) = sudo::server::listen() {
            tracing::error!(error = %e, "cannot answer sudo calls");
        }
    }
    let agent = Agent::new();
    agent.log.write(
        airlock_wire::logs::LogLevel::Info,
        "agent started",
        [("envd_version", airlock_wire::ENVD_VERSION.to_owned())],
    );
    interpreter::start(agent.clone()).await;
    let app = router(agent);
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("airlock-agent: server failed: {e}");
        std::process::exit(1);
    }
}
