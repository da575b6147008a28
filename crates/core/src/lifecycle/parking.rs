//! Paused sandboxes kept in memory. A pause writes the sandbox's image to disk as always, but
//! then, instead of destroying its runtime, freezes it (the cgroup freezer) and keeps it: the
//! sandbox is *parked*. Its resume is then a thaw, about a millisecond, instead of a
//! `runsc restore` of the image, about 200 ms. Nothing in a parked sandbox runs, from the end
//! of its pause to its resume.
//!
//! Parked runtimes cost memory and nothing else. They are let go, oldest first, when together
//! they hold more than `Limits::paused_memory_mb` or the host runs short of memory, and all of
//! them when the server stops; a sandbox whose runtime was let go resumes from its image, as
//! before. The image is written either way, so a crash loses nothing that a pause kept.

use super::sandbox::{Parked, Sandbox};
use super::{available_memory_mb, Lifecycle};
use crate::driver::Placement;
use crate::egress::Egress;
use crate::ids::SandboxId;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a thawed runtime's agent may take to answer before the resume falls back to the
/// image.
const THAWED_AGENT_WAIT: Duration = Duration::from_secs(2);

impl Lifecycle {
    /// Freezes the runtime of a sandbox that was just paused and keeps it, if parking is on;
    /// `None` if the caller must destroy it.
    pub(super) fn park(
        &self,
        id: &SandboxId,
        placement: Placement,
        egress: &Egress,
    ) -> Option<Parked> {
        if self.limits.paused_memory_mb == 0 {
            return None;
        }
        if let Err(e) = self.driver.set_frozen(id, true) {
            tracing::warn!(sandbox = %id, error = %e, "freezing a paused sandbox failed; letting its runtime go");
            return None;
        }
        Some(Parked {
            placement,
            egress: egress.clone(),
            since: Instant::now(),
        })
    }

    /// Brings a parked runtime back for a resume: with the sandbox's rules as they are now,
    /// then thawed, its agent answering. `None` if it could not be (the runtime is then
    /// destroyed, and the caller restores the image).
    pub(super) async fn unpark(&self, sandbox: &Sandbox, parked: Parked) -> Option<Placement> {
        let id = sandbox.id();
        let Parked {
            placement, egress, ..
        } = parked;
        let ready = async {
            // The rules first: nothing in it may send under the old ones once it runs again.
            let rules = sandbox.record().egress.clone();
            if rules != egress {
                let slot = placement.slot;
                self.driver
                    .set_egress(slot, &rules)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            self.driver
                .set_frozen(id, false)
                .map_err(|e| e.to_string())?;
            self.agent
                .wait_ready(placement.agent, THAWED_AGENT_WAIT)
                .await
        }
        .await;
        match ready {
            Ok(()) => Some(placement),
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "a parked sandbox did not come back; resuming it from its image");
                self.release(id.clone(), placement.slot).await;
                None
            }
        }
    }

    /// Lets parked runtimes go, oldest first, while together they hold more than their budget
    /// or the host has less memory available than the pools leave it. Each is destroyed in the
    /// background under its sandbox's verb lock, so a resume meanwhile waits and then restores
    /// the image; one whose verb lock is taken (it is being resumed, say) is left alone.
    pub(super) fn evict_parked(&self) {
        let (parked, mut held) = self.parked();
        let budget = self.limits.paused_memory_mb << 20;
        let short = || available_memory_mb() < self.limits.pool_min_available_mb;
        for sandbox in parked {
            if held <= budget && !short() {
                return;
            }
            let Some(verb) = sandbox.try_lock_verb() else {
                continue;
            };
            // Under the verb lock, a runtime still parked belongs to a sandbox still paused.
            let Some(runtime) = sandbox.take_parked() else {
                continue;
            };
            held = held.saturating_sub(self.driver.memory_used(sandbox.id()).unwrap_or(0));
            tracing::info!(sandbox = %sandbox.id(), "letting a paused sandbox's runtime go: the memory kept for paused sandboxes is spent; it resumes from its image");
            let release = self.release(sandbox.id().clone(), runtime.placement.slot);
            self.destroying.spawn(async move {
                release.await;
                drop(verb);
            });
        }
    }

    /// The sandboxes whose runtime is parked, oldest first, and the memory those runtimes hold.
    pub(super) fn parked(&self) -> (Vec<Arc<Sandbox>>, u64) {
        let mut parked: Vec<(Instant, Arc<Sandbox>)> = self
            .sandboxes
            .all()
            .into_iter()
            .filter_map(|s| Some((s.parked_since()?, s)))
            .collect();
        parked.sort_by_key(|(since, _)| *since);
        let held = parked
            .iter()
            .filter_map(|(_, s)| self.driver.memory_used(s.id()))
            .sum();
        (parked.into_iter().map(|(_, s)| s).collect(), held)
    }

    /// Destroys a paused sandbox's parked runtime, if it has one, in the background.
    pub(super) fn let_parked_go(&self, sandbox: &Sandbox) {
        self.destroy_parked_task(sandbox);
    }

    /// Destroys a paused sandbox's parked runtime, if it has one, and waits until it is gone.
    /// The destroy is a task of its own: a caller that is cancelled does not cut it short.
    pub(super) async fn destroy_parked(&self, sandbox: &Sandbox) {
        if let Some(destroy) = self.destroy_parked_task(sandbox) {
            let _ = destroy.await;
        }
    }

    fn destroy_parked_task(&self, sandbox: &Sandbox) -> Option<tokio::task::JoinHandle<()>> {
        let runtime = sandbox.take_parked()?;
        let release = self.release(sandbox.id().clone(), runtime.placement.slot);
        Some(self.destroying.spawn(release))
    }
}
