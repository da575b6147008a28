//! The daemon inside every Airlock sandbox, and the agent's composition root: it builds the
//! settings, the sandbox's log and the watcher table, hands each service what it uses, and
//! serves envd's one route table. Nothing imports it but `main`.
//!
//! It serves E2B's envd protocol natively on port 49983: Connect-JSON `process.Process` and
//! `filesystem.Filesystem`, plus plain HTTP `/files`, `/health`, `/envs` and `/init`. The server
//! reaches it over the sandbox's own network link and calls `/init` once to hand it the sandbox's
//! env vars, access token and (for a sandbox restored from a checkpoint) its own hostname.

use crate::config::Config;
use crate::envd::filesystem::watch::WatcherTable;
use crate::envd::log::{self, SandboxLog};
use crate::envd::{control, files, filesystem, init, process};
use crate::pid1::{caps, oom, reaper};
use crate::{auth, interpreter, sudo};
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;

/// envd's routes, each service with the state it owns or shares, behind the token guard.
fn router(config: Arc<Config>, log: Arc<SandboxLog>) -> Router {
    let watchers = Arc::new(WatcherTable::default());
    let routes = Router::new()
        .merge(init::routes(config.clone(), log.clone()))
        .merge(files::routes(config.clone()))
        .merge(process::routes(config.clone(), log.clone()))
        .merge(filesystem::routes(config.clone(), watchers.clone()))
        .merge(log::routes(log.clone()))
        .merge(control::routes(config.clone(), watchers, log));
    auth::guard(routes, config, auth::Port::Envd)
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

/// Runs the daemon until its server fails.
pub fn run() {
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
    let config = Arc::new(Config::default());
    let log = Arc::new(SandboxLog::default());
    log.write(
        airlock_wire::logs::LogLevel::Info,
        "agent started",
        [("envd_version", airlock_wire::ENVD_VERSION.to_owned())],
    );
    interpreter::start(config.clone()).await;
    let app = router(config, log);
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("airlock-agent: server failed: {e}");
        std::process::exit(1);
    }
}
