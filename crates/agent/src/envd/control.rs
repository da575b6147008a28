//! The server's own controls of a sandbox: a reboot that keeps the files ([`REBOOT_PATH`]), and
//! whether the sandbox may be frozen ([`IDLE_PATH`], by `pid1::idle`'s rule).
//!
//! A reboot that keeps the files: every process of the sandbox but the agent ends, and the agent
//! forgets what it kept for them (watchers, code contexts and their kernels), so what is left is
//! the file system and an agent as after a boot. A filesystem-only pause does this before its
//! checkpoint, which then holds little but the files; a resume with `on_resume="reboot"` does it
//! after the restore. The server then runs the template's start command again.

use crate::config::Config;
use crate::envd::filesystem::watch::WatcherTable;
use crate::envd::log::SandboxLog;
use crate::pid1::{idle, reaper};
use crate::rpc::RpcError;
use airlock_wire::logs::LogLevel;
use airlock_wire::{IdleReport, IDLE_PATH, REBOOT_PATH};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the processes get to be gone: SIGKILL is not refused, so this only bounds a stuck
/// kernel.
const END_WITHIN: Duration = Duration::from_secs(10);

/// What a reboot forgets, whom it tells, and the log it writes to.
#[derive(Clone)]
struct Reboot {
    config: Arc<Config>,
    watchers: Arc<WatcherTable>,
    log: Arc<SandboxLog>,
}

pub fn routes(config: Arc<Config>, watchers: Arc<WatcherTable>, log: Arc<SandboxLog>) -> Router {
    let state = Reboot {
        config,
        watchers,
        log,
    };
    Router::new()
        .route(REBOOT_PATH, post(reboot))
        .with_state(state)
        .route(IDLE_PATH, get(report_idle))
}

async fn reboot(State(kept): State<Reboot>) -> Result<StatusCode, RpcError> {
    let ended = tokio::task::spawn_blocking(end_every_other_process)
        .await
        .map_err(|e| RpcError::internal(format!("ending the processes: {e}")))??;
    // Forgets what the agent kept for the sandbox's processes, now that they have all ended.
    kept.watchers.clear();
    kept.config.rebooted();
    kept.log.write(
        LogLevel::Info,
        format!("sandbox rebooted: {ended} processes ended, files kept"),
        [("event", "reboot".to_owned())],
    );
    Ok(StatusCode::NO_CONTENT)
}

async fn report_idle() -> Json<IdleReport> {
    let busy = tokio::task::spawn_blocking(idle::busy_process)
        .await
        .ok()
        .flatten();
    Json(IdleReport { busy })
}

/// SIGKILLs every process but this one until none is left; returns how many there were.
fn end_every_other_process() -> Result<usize, RpcError> {
    let me = std::process::id() as i32;
    let deadline = Instant::now() + END_WITHIN;
    let mut ended = std::collections::HashSet::new();
    loop {
        let left: Vec<i32> = reaper::pids()
            .into_iter()
            .filter(|&pid| pid != me && !reaper::has_ended(pid))
            .collect();
        if left.is_empty() {
            return Ok(ended.len());
        }
        if Instant::now() > deadline {
            return Err(RpcError::internal(format!(
                "processes {left:?} did not end within {END_WITHIN:?}"
            )));
        }
        for pid in left {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            ended.insert(pid);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
