//! Draining a node for maintenance (`airlock node drain NAME`, E2B's `POST /nodes/{nodeID}`
//! with status `draining`): it takes no new sandbox and resumes none, its pools are emptied,
//! and its running sandboxes are paused with auto-resume on, so that the next request for one
//! resumes it on another node, from object storage. Then its volumes move into object storage
//! too (`volumes/moves.rs`), so that the sandboxes that mount them resume elsewhere as well.

use super::sandbox::{Phase, Sandbox};
use super::Lifecycle;
use crate::store::PauseMode;
use futures::StreamExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sandboxes a drain pauses at once: each pause is a checkpoint and an upload.
const PAUSES_AT_ONCE: usize = 2;
/// How long a drain waits for killed sandboxes that mounted a volume to be torn down.
const TEARDOWN_WAIT: Duration = Duration::from_secs(30);

impl Lifecycle {
    /// Whether this node is draining: it takes no sandbox.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts draining, once; the pauses go on in the background.
    pub fn drain(self: &Arc<Self>) {
        if self.draining.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::info!("draining: no new sandboxes here; pausing the running ones");
        for pooled in self.pools.drain() {
            self.destroying
                .spawn(self.release(pooled.id, pooled.placement.slot));
        }
        let this = self.clone();
        tokio::spawn(async move { this.pause_for_drain().await });
    }

    /// Takes sandboxes again. A drain's pauses under way finish; those not begun are not.
    pub fn undrain(&self) {
        if self.draining.swap(false, Ordering::SeqCst) {
            tracing::info!("no longer draining: taking sandboxes again");
            self.refill.notify_one();
        }
    }

    async fn pause_for_drain(&self) {
        let running: Vec<_> = self
            .sandboxes
            .all()
            .into_iter()
            .filter(|s| s.phase() == Phase::Running)
            .collect();
        futures::stream::iter(running)
            .for_each_concurrent(PAUSES_AT_ONCE, |sandbox| async move {
                if !self.draining() {
                    return;
                }
                let id = sandbox.id().clone();
                if let Err(e) = self.store.sandboxes().set_auto_resume(&id).await {
                    return tracing::warn!(sandbox = %id, error = %e, "a drain could not pause a sandbox");
                }
                sandbox.update_record(|r| r.auto_resume = true);
                match self.pause(id.as_str(), PauseMode::Full, false).await {
                    // Its runtime is not kept here: it will resume elsewhere.
                    Ok(()) => self.destroy_parked(&sandbox).await,
                    Err(e) => tracing::warn!(sandbox = %id, error = %e, "a drain could not pause a sandbox"),
                }
            })
            .await;
        tracing::info!("drained: every running sandbox is paused");
        self.move_volumes_out().await;
    }

    /// Moves this node's volumes into object storage, one at a time, each once no sandbox here
    /// runs on it: its paused sandboxes' runtimes kept here go first. One still in use stays.
    async fn move_volumes_out(&self) {
        if !self.volumes.can_move() {
            return;
        }
        let volumes = match self.volumes.kept_here().await {
            Ok(volumes) => volumes,
            Err(e) => return tracing::warn!(error = %e, "listing the volumes to move failed"),
        };
        for volume in volumes {
            if !self.draining() {
                return;
            }
            let users = self.users_once_torn_down(&volume.id).await;
            if users.iter().any(|s| s.phase() != Phase::Paused) {
                tracing::warn!(
                    volume = volume.id,
                    "a drain leaves a volume here: a sandbox here still runs on it"
                );
                continue;
            }
            if !self.all_resume_elsewhere(&users).await {
                tracing::warn!(volume = volume.id, "a drain leaves a volume here: a paused sandbox that mounts it has its image here only, and resumes only here");
                continue;
            }
            for sandbox in &users {
                self.destroy_parked(sandbox).await;
            }
            if let Err(e) = self.volumes.move_out(&volume).await {
                tracing::warn!(volume = volume.id, error = %e, "a drain could not move a volume; it stays here");
            }
        }
        tracing::info!("drained: the volumes are in object storage");
    }

    /// Whether every one of `paused` has its image in object storage, so that it can resume
    /// on another node (one whose upload failed is here only, and so must its volumes be).
    async fn all_resume_elsewhere(&self, paused: &[Arc<Sandbox>]) -> bool {
        for sandbox in paused {
            if !matches!(self.paused_in_object_store(sandbox.id()).await, Ok(true)) {
                return false;
            }
        }
        true
    }

    /// The sandboxes here that mount volume `id`, once those killed have been torn down (for
    /// up to [`TEARDOWN_WAIT`]).
    async fn users_once_torn_down(&self, id: &str) -> Vec<Arc<Sandbox>> {
        let deadline = Instant::now() + TEARDOWN_WAIT;
        loop {
            let users: Vec<_> = (self.sandboxes.all().into_iter())
                .filter(|s| s.record().volume_mounts.iter().any(|m| m.volume_id == id))
                .collect();
            let stopping = users.iter().any(|s| s.phase() == Phase::Stopping);
            if !stopping || Instant::now() > deadline {
                return users;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
