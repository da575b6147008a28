//! Draining a node for maintenance (`airlock node drain NAME`, E2B's `POST /nodes/{nodeID}`
//! with status `draining`): it takes no new sandbox and resumes none, its pools are emptied,
//! and its running sandboxes are paused with auto-resume on, so that the next request for one
//! resumes it on another node, from object storage.

use super::sandbox::Phase;
use super::Lifecycle;
use crate::store::PauseMode;
use futures::StreamExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Sandboxes a drain pauses at once: each pause is a checkpoint and an upload.
const PAUSES_AT_ONCE: usize = 2;

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
                    Ok(()) => self.let_parked_go(&sandbox),
                    Err(e) => tracing::warn!(sandbox = %id, error = %e, "a drain could not pause a sandbox"),
                }
            })
            .await;
        tracing::info!("drained: every running sandbox is paused");
    }
}
