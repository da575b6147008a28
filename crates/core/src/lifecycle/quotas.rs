//! Admission of creates, pauses and resumes: a place on this node (the registry's room), and a
//! place in the key's quota of running or paused sandboxes, which the sandbox catalog admits
//! in the same write that records the change, so that it holds across gateways and nodes.

use super::sandbox::{Phase, Sandbox};
use super::{KeyQuota, Lifecycle, LifecycleError};
use crate::ids::SandboxId;
use std::sync::Arc;

fn over_running_quota(quota: &KeyQuota) -> LifecycleError {
    LifecycleError::Quota(format!(
        "this API key may run at most {} sandboxes at once; kill or pause one first",
        quota.running
    ))
}

fn over_paused_quota(quota: &KeyQuota) -> LifecycleError {
    LifecycleError::Quota(format!(
        "this API key may keep at most {} sandboxes paused; kill or resume one first",
        quota.paused
    ))
}

impl Lifecycle {
    fn refuse_if_draining(&self) -> Result<(), LifecycleError> {
        if self.draining() {
            return Err(LifecycleError::Draining(self.node.clone()));
        }
        Ok(())
    }

    /// Admits a new sandbox (in [`Phase::Starting`]): its catalog row is written, in no list
    /// until [`crate::store::SandboxRecords::started`].
    pub(super) async fn admit_create(
        &self,
        sandbox: &Arc<Sandbox>,
        quota: &KeyQuota,
    ) -> Result<(), LifecycleError> {
        self.refuse_if_draining()?;
        self.sandboxes
            .admit(sandbox.clone(), self.limits.max_sandboxes)?;
        let admitted = self
            .store
            .sandboxes()
            .admit(&sandbox.record(), quota.running)
            .await;
        match admitted {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.sandboxes.remove(sandbox.id());
                Err(over_running_quota(quota))
            }
            Err(e) => {
                self.sandboxes.remove(sandbox.id());
                Err(e.into())
            }
        }
    }

    /// Forgets an admitted create that failed (its host resources are the caller's to free).
    pub(super) async fn forget_create(&self, id: &SandboxId) {
        self.sandboxes.remove(id);
        if let Err(e) = self.store.sandboxes().delete(id).await {
            // It counts in its key's quota until this node's next start forgets it.
            tracing::error!(sandbox = %id, error = %e, "forgetting a failed create failed");
        }
    }

    /// Moves a paused sandbox to [`Phase::Resuming`] if the node and its key have room.
    pub(super) async fn admit_resume(
        &self,
        sandbox: &Sandbox,
        quota: &KeyQuota,
    ) -> Result<(), LifecycleError> {
        self.refuse_if_draining()?;
        self.sandboxes
            .admit_resume(sandbox, self.limits.max_sandboxes)?;
        let records = self.store.sandboxes();
        match records.begin_resume(sandbox.id(), quota.running).await {
            Ok(true) => Ok(()),
            refused => {
                sandbox.set_phase(Phase::Paused, None);
                Err(refused
                    .err()
                    .map_or_else(|| over_running_quota(quota), Into::into))
            }
        }
    }

    /// Moves a running sandbox to [`Phase::Pausing`] if its key may keep one more paused.
    pub(super) async fn admit_pause(
        &self,
        sandbox: &Sandbox,
        quota: &KeyQuota,
    ) -> Result<(), LifecycleError> {
        let records = self.store.sandboxes();
        match records.begin_pause(sandbox.id(), quota.paused).await {
            Ok(true) => {
                sandbox.enter(Phase::Pausing);
                Ok(())
            }
            refused => Err(refused
                .err()
                .map_or_else(|| over_paused_quota(quota), Into::into)),
        }
    }

    /// A pause or resume that failed after its admission: the catalog keeps the sandbox as
    /// it was.
    pub(super) async fn end_transition(&self, id: &SandboxId) {
        if let Err(e) = self.store.sandboxes().end_transition(id).await {
            // It counts as pausing or resuming until this node's next start.
            tracing::error!(sandbox = %id, error = %e, "recording a failed pause or resume failed");
        }
    }
}
