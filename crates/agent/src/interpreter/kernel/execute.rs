//! Running user code in a kernel: the execution loop, which streams the run's events and
//! interrupts, waits or gives up as the kernel and the client behave.

use super::process::{exited, KillReason};
use super::run_state::RunState;
use super::{Kernel, RunEnd};
use crate::interpreter::events::{Event, Output};
use jupyter_protocol::{ExecuteRequest, JupyterMessage};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::{sleep_until, Instant};

/// After a disconnect: interrupt again after this long without going idle...
const INTERRUPT_RETRY: Duration = Duration::from_secs(5);
/// ...and replace the kernel if it still is not idle this long after that.
const INTERRUPT_GIVE_UP: Duration = Duration::from_secs(10);
/// The kernel went idle for our request but its `execute_reply` has not come yet.
const REPLY_GRACE: Duration = Duration::from_secs(3);
/// The `execute_reply` came but no idle status (dropped by a full IOPub queue): give up after
/// this long without IOPub traffic.
const IDLE_GRACE: Duration = Duration::from_secs(5);
/// Deno's kernel may publish a run's output and result after its idle status: for such kernels,
/// IOPub is read on until it has been quiet this long...
const SETTLE_QUIET: Duration = Duration::from_millis(100);
/// ...but no longer than this.
const SETTLE_MAX: Duration = Duration::from_secs(1);
/// After the process exits, messages still in flight are read for this long.
const EXIT_DRAIN: Duration = Duration::from_millis(300);

impl Kernel {
    /// The error a run reports when the kernel process is gone.
    fn death_event(&self) -> Event {
        let status = self.exit.borrow().clone().unwrap_or_default();
        match self.switch.reason() {
            Some(KillReason::Restarted) => {
                Event::error("ContextRestarting", "Context was restarted")
            }
            Some(KillReason::Deleted) => Event::error("ContextDeleted", "Context was deleted"),
            Some(KillReason::Unresponsive) => Event::error(
                "KernelDied",
                "The kernel did not respond to interrupts and was stopped; its state is lost",
            ),
            None => Event::error(
                "KernelDied",
                format!(
                    "The kernel process exited unexpectedly ({status}). Its state is lost; the \
                     next run in this context starts a fresh kernel."
                ),
            ),
        }
    }

    /// Reads messages that come after the idle status, until IOPub goes quiet.
    async fn settle(&mut self, msg_id: &str, run: &mut RunState, out: &mut Output) {
        let cap = Instant::now() + SETTLE_MAX;
        loop {
            let until = (Instant::now() + SETTLE_QUIET).min(cap);
            match tokio::time::timeout_at(until, self.iopub_rx.recv()).await {
                Ok(Some(m)) if m.is_child_of(msg_id) => run.on_iopub(m, out).await,
                Ok(Some(_)) => {}
                _ => return,
            }
        }
    }

    /// Runs user code, streaming its events to `out` (everything but `end_of_execution`).
    /// `identity` is the agent's current identity generation.
    pub async fn execute(
        &mut self,
        code: String,
        globals: &BTreeMap<String, String>,
        per_run: &BTreeMap<String, String>,
        identity: u64,
        out: &mut Output,
    ) -> RunEnd {
        // Whatever arrived between runs (late output of background threads) belongs to no one.
        while self.iopub_rx.try_recv().is_ok() {}
        while self.shell_rx.try_recv().is_ok() {}

        if !self.reseed(identity).await {
            out.send(&self.death_event()).await;
            return RunEnd::KernelGone;
        }
        let changes = self.env.before(globals, per_run);
        if !self.apply_env(&changes).await {
            out.send(&self.death_event()).await;
            return RunEnd::KernelGone;
        }

        let request: JupyterMessage = ExecuteRequest {
            code,
            silent: false,
            store_history: true,
            user_expressions: None,
            allow_stdin: false,
            stop_on_error: true,
        }
        .into();
        let msg_id = request.header.msg_id.clone();
        tracing::trace!("shell -> execute_request {msg_id}");
        if let Err(e) = self.shell.send(request).await {
            // A shell socket that cannot send is broken for good: start afresh next time.
            out.send(&Event::error(
                "KernelError",
                format!("sending the code: {e}"),
            ))
            .await;
            return RunEnd::KernelGone;
        }

        let mut run = RunState::new(self.spec.dialect());
        let end = self.follow(&msg_id, &mut run, out).await;
        run.release(end == RunEnd::Done, out).await;
        end
    }

    /// Streams the run of request `msg_id` until the kernel is done with it or gone.
    async fn follow(&mut self, msg_id: &str, run: &mut RunState, out: &mut Output) -> RunEnd {
        let mut last_iopub = Instant::now();
        // Set once the client left and the kernel was interrupted.
        let mut interrupted: Option<(Instant, u8)> = None;
        loop {
            if run.idle_at.is_some() && run.replied {
                if self.spec.dialect().late_output() {
                    self.settle(msg_id, run, out).await;
                }
                return RunEnd::Done;
            }
            let far = Instant::now() + Duration::from_secs(86400);
            let escalate_at = interrupted.map(|(at, n)| {
                at + if n < 2 {
                    INTERRUPT_RETRY
                } else {
                    INTERRUPT_GIVE_UP
                }
            });
            let reply_grace_at = run.idle_at.map(|at| at + REPLY_GRACE);
            let idle_grace_at = run.replied.then_some(last_iopub + IDLE_GRACE);
            tokio::select! {
                // Biased: a flood of output must not starve the disconnect check and the timers.
                biased;
                _ = out.closed(), if interrupted.is_none() => {
                    tracing::info!("client left mid-execution; interrupting kernel '{}'", self.spec.name);
                    self.interrupt().await;
                    interrupted = Some((Instant::now(), 1));
                }
                _ = sleep_until(escalate_at.unwrap_or(far)), if escalate_at.is_some() => {
                    match interrupted {
                        Some((_, 1)) => {
                            self.interrupt().await;
                            interrupted = Some((Instant::now(), 2));
                        }
                        _ => {
                            tracing::warn!("kernel '{}' ignores interrupts; stopping it", self.spec.name);
                            self.switch.kill(KillReason::Unresponsive);
                            return RunEnd::KernelGone;
                        }
                    }
                }
                // Before IOPub: while truncated output floods in, nothing else is written, and the
                // keepalive is what reveals a client that left.
                _ = sleep_until(out.keepalive_at()), if !out.is_gone() => {
                    out.send(&Event::Keepalive).await;
                }
                Some(m) = self.iopub_rx.recv() => {
                    last_iopub = Instant::now();
                    if m.is_child_of(msg_id) {
                        run.on_iopub(m, out).await;
                    }
                }
                Some(m) = self.shell_rx.recv() => {
                    if m.is_child_of(msg_id) && m.msg_type == "execute_reply" {
                        run.on_reply(m, out).await;
                    }
                }
                _ = exited(&mut self.exit) => {
                    // Output the kernel sent just before it died is still worth showing.
                    let drain_until = Instant::now() + EXIT_DRAIN;
                    while let Ok(Some(m)) = tokio::time::timeout_at(drain_until, self.iopub_rx.recv()).await {
                        if m.is_child_of(msg_id) {
                            run.on_iopub(m, out).await;
                        }
                    }
                    run.release(false, out).await;
                    out.send(&self.death_event()).await;
                    return RunEnd::KernelGone;
                }
                _ = sleep_until(reply_grace_at.unwrap_or(far)), if reply_grace_at.is_some() && !run.replied => {
                    return RunEnd::Done;
                }
                _ = sleep_until(idle_grace_at.unwrap_or(far)), if idle_grace_at.is_some() && run.idle_at.is_none() => {
                    tracing::warn!("kernel '{}' replied but never went idle", self.spec.name);
                    return RunEnd::Done;
                }
            }
        }
    }
}
