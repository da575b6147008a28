//! Killing sandboxes, and destroying what a sandbox holds on the host.

use super::sandbox::{Phase, Sandbox};
use super::{paused_image, Lifecycle, LifecycleError, OnExit};
use crate::ids::SandboxId;
use crate::store::EventType;

impl Lifecycle {
    /// Kills a sandbox, running or paused: it is gone for every caller at once, and its open
    /// streams are cut; the host cleanup finishes in the background (`shutdown` waits for it).
    /// A verb at work on it (a pause, say) is waited for first.
    pub async fn kill(&self, id: &str) -> Result<(), LifecycleError> {
        let sandbox = self.find(id)?;
        let Some(_verb) = sandbox.lock_verb().await else {
            return Err(LifecycleError::Busy(id.to_owned()));
        };
        self.stop(&sandbox).await
    }

    /// [`Lifecycle::kill`] of a sandbox whose verb lock the caller holds.
    pub(super) async fn stop(&self, sandbox: &Sandbox) -> Result<(), LifecycleError> {
        if sandbox.phase().shown().is_none() {
            return Err(LifecycleError::SandboxNotFound(sandbox.id().to_string()));
        }
        // Out of its key's quota at once, though its row stays until its cleanup is done.
        self.store.sandboxes().stopping(sandbox.id()).await?;
        let placement = sandbox.placement();
        // A paused sandbox may still have its runtime, parked.
        let runtime = placement.or_else(|| sandbox.take_parked().map(|p| p.placement));
        sandbox.set_phase(Phase::Stopping, None);
        self.sandboxes.remove(sandbox.id());
        self.emit(&sandbox.record(), EventType::Killed, None);
        let id = sandbox.id().clone();
        if placement.is_none() {
            self.forget_paused(&id, true).await;
            let driver = self.driver.clone();
            let id = id.clone();
            self.destroying.spawn(async move {
                if let Err(e) = driver.delete_image(&paused_image(&id)).await {
                    tracing::error!(sandbox = %id, error = %e, "deleting image failed");
                }
            });
        }
        // Its row goes once nothing of it is left on the host (a volume it mounted is then
        // free to delete).
        match runtime {
            Some(runtime) => {
                self.destroying.spawn(self.discard(&id, runtime.slot));
            }
            None => self.store.sandboxes().delete(&id).await?,
        }
        Ok(())
    }

    /// Destroys what a sandbox holds on the host (the driver frees its slot); its row (if any)
    /// stays.
    pub(super) fn release(
        &self,
        id: SandboxId,
        slot: u32,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let driver = self.driver.clone();
        async move {
            if let Err(e) = driver.destroy(&id, slot).await {
                tracing::error!(sandbox = %id, error = %e, "destroying sandbox failed");
            }
        }
    }

    /// Destroys whatever a sandbox holds and forgets it; the slot is free again only after that.
    /// Failures are logged: the orphan sweep at the next start catches anything left.
    pub(super) fn discard(
        &self,
        id: &SandboxId,
        slot: u32,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (store, id) = (self.store.clone(), id.clone());
        let release = self.release(id.clone(), slot);
        async move {
            release.await;
            if let Err(e) = store.sandboxes().delete(&id).await {
                tracing::error!(sandbox = %id, error = %e, "forgetting sandbox failed");
            }
        }
    }

    /// Stops serving sandboxes and waits until the host holds nothing it must not keep. With
    /// [`OnExit::KeepRunning`] running sandboxes run on (their streams are cut) for the next
    /// start to adopt; with [`OnExit::StopSandboxes`] they are killed. Pooled sandboxes and
    /// parked runtimes go either way: paused sandboxes stay on disk. Returns how many sandboxes
    /// were left running; only with none does the driver give the host back what it changed.
    pub async fn shutdown(&self, on_exit: OnExit) -> usize {
        let mut left_running = 0;
        for sandbox in self.sandboxes.all() {
            let Some(_verb) = sandbox.lock_verb().await else {
                continue;
            };
            match (sandbox.phase(), on_exit) {
                // On disk: only the runtime kept to resume it fast goes.
                (Phase::Paused, _) => self.let_parked_go(&sandbox),
                (Phase::Running, OnExit::KeepRunning) => {
                    sandbox.cut_streams();
                    left_running += 1;
                }
                _ => {
                    let _ = self.stop(&sandbox).await;
                }
            }
        }
        for p in self.pools.drain() {
            self.destroying.spawn(self.release(p.id, p.placement.slot));
        }
        self.settle().await;
        self.flush_events().await;
        if left_running == 0 {
            self.driver.shutdown().await;
        }
        left_running
    }

    /// Waits for the background destroys started so far.
    pub async fn settle(&self) {
        self.destroying.close();
        self.destroying.wait().await;
        self.destroying.reopen();
    }
}
