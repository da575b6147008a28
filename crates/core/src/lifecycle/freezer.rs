//! Idle sandboxes cost no CPU: a running sandbox with nothing in flight for a while (no request,
//! no open proxied stream) is asked whether anything in it runs, and frozen (the driver's cgroup
//! freezer) when nothing does. Traffic thaws it before it is served ([`Lifecycle::wake`]), and
//! every verb that works on a running sandbox holds it awake while it does.
//!
//! What "nothing runs" means is the agent's to say (`airlock-agent`'s `idle` module): every
//! process but the agent and the code interpreter's kernels keeps the sandbox awake, so a
//! sandbox never sleeps through a deadline a process of its own has set. Pooled sandboxes are
//! frozen once they have been ready as long (they settle first), and thawed when a create
//! takes one.

use super::sandbox::{Awake, Sandbox};
use super::Lifecycle;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often running sandboxes are looked at.
const SCAN_EVERY: Duration = Duration::from_millis(250);
/// How long a sandbox whose agent said something runs (or did not answer) is left alone.
const BUSY_RECHECK: Duration = Duration::from_secs(2);

impl Lifecycle {
    /// Counts traffic to `sandbox` until the guard is dropped; thaws it first if it is frozen.
    pub fn wake(&self, sandbox: &Arc<Sandbox>) -> Awake {
        sandbox.wake(|| self.driver.set_frozen(sandbox.id(), false))
    }

    /// Freezes idle sandboxes until `stop` fires; does nothing if freezing is off.
    pub async fn run_freezer(self: Arc<Self>, stop: CancellationToken) {
        let Some(quiet_for) = self.limits.freeze_after else {
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SCAN_EVERY) => {}
                _ = stop.cancelled() => return,
            }
            for sandbox in self.sandboxes.all() {
                self.freeze_if_idle(&sandbox, quiet_for).await;
            }
            self.freeze_settled_pooled(quiet_for);
        }
    }

    pub(super) async fn freeze_if_idle(&self, sandbox: &Arc<Sandbox>, quiet_for: Duration) {
        let Some(generation) = sandbox.freeze_candidate(quiet_for) else {
            return;
        };
        // A verb at work (a pause, a snapshot, a kill) has it.
        let Some(_verb) = sandbox.try_lock_verb() else {
            return;
        };
        let Some(agent) = sandbox.agent() else {
            return;
        };
        let id = sandbox.id();
        match self
            .agent
            .busy(agent, sandbox.access_token().as_deref())
            .await
        {
            Ok(None) => {
                match sandbox.freeze_if_quiet(generation, || self.driver.set_frozen(id, true)) {
                    Ok(true) => tracing::debug!(%id, "frozen"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(%id, error = %e, "freezing failed");
                        sandbox.check_again_in(BUSY_RECHECK);
                    }
                }
            }
            Ok(Some(process)) => {
                tracing::trace!(%id, %process, "stays awake");
                sandbox.check_again_in(BUSY_RECHECK);
            }
            Err(e) => {
                tracing::debug!(%id, error = %e, "could not ask whether it is idle");
                sandbox.check_again_in(BUSY_RECHECK);
            }
        }
    }
}
