//! After a (re)start: the sandboxes the catalog names on this node are adopted (running ones
//! whose runtime and agent still answer, paused ones whose image is there) or removed, and host
//! resources and images that nothing names are swept.

use super::sandbox::{Phase, Sandbox};
use super::{paused_image, Lifecycle, LifecycleError, PAUSED_PREFIX, SNAPSHOT_PREFIX};
use crate::driver::Placement;
use crate::egress::Egress;
use crate::ids::SandboxId;
use crate::store::{SandboxState, Store, StoreError};
use futures::StreamExt;
use std::collections::HashSet;
use std::time::Duration;

/// Sandboxes whose runtime and agent are checked at once after a restart.
const ADOPTIONS_AT_ONCE: usize = 8;

#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub adopted: Vec<SandboxId>,
    pub paused: Vec<SandboxId>,
    pub removed: Vec<SandboxId>,
}

/// The slots and policies of the sandboxes a restart of the node called `node` will try to
/// adopt: the driver puts them in force when it starts, before anything else runs, so no
/// sandbox is ever unconfined. The catalog first forgets what the node left half done (see
/// [`crate::store::SandboxRecords::recover_node`]).
pub async fn adoptable_policies(
    store: &Store,
    node: &str,
) -> Result<Vec<(u32, Egress)>, StoreError> {
    store.sandboxes().recover_node(node).await?;
    Ok(store
        .sandboxes()
        .of_node(node)
        .await?
        .into_iter()
        .filter(|r| r.state == SandboxState::Running)
        .filter_map(|r| Some((r.slot?, r.egress)))
        .collect())
}

impl Lifecycle {
    /// Adopts every recorded running sandbox whose runtime and agent still answer, destroys the
    /// rest, keeps paused ones whose image is on disk or in object storage, then sweeps host
    /// resources and images that no record names.
    pub async fn recover(&self) -> Result<RecoveryReport, LifecycleError> {
        let mut report = RecoveryReport::default();
        let mut running = Vec::new();
        self.store.sandboxes().recover_node(&self.node).await?;
        for record in self.store.sandboxes().of_node(&self.node).await? {
            match (record.state, record.slot) {
                (SandboxState::Paused, _) => {
                    let image = paused_image(&record.id);
                    let kept = self.driver.has_image(&image)
                        || self.paused_in_object_store(&record.id).await?;
                    if kept {
                        report.paused.push(record.id.clone());
                        self.sandboxes
                            .adopt(Sandbox::new(record, Phase::Paused, None));
                    } else {
                        tracing::warn!(sandbox = %record.id, "paused sandbox has no image; forgetting it");
                        self.store.sandboxes().delete(&record.id).await?;
                        report.removed.push(record.id);
                    }
                }
                (SandboxState::Running, Some(slot)) => running.push((record, slot)),
                (SandboxState::Running, None) => {
                    self.store.sandboxes().delete(&record.id).await?;
                    report.removed.push(record.id);
                }
            }
        }
        // Each check waits on runsc and then the agent, mostly idle: several at once.
        let checked: Vec<_> = futures::stream::iter(running)
            .map(|(record, slot)| async move {
                let placement = self.reach(&record.id, slot).await;
                (record, slot, placement)
            })
            .buffer_unordered(ADOPTIONS_AT_ONCE)
            .collect()
            .await;
        let mut keep = Vec::new();
        for (record, slot, placement) in checked {
            // One whose timeout passed while no server ran is adopted all the same: the reaper
            // then does what its timeout asks (a pause, say), as if the server had run.
            if let Some(placement) = placement {
                keep.push((record.id.clone(), slot));
                report.adopted.push(record.id.clone());
                self.sandboxes
                    .adopt(Sandbox::new(record, Phase::Running, Some(placement)));
            } else {
                self.discard(&record.id, slot).await;
                report.removed.push(record.id);
            }
        }
        // Best effort: what cannot be removed now is tried again at the next start, and must not
        // keep the server from serving.
        if let Err(e) = self.driver.sweep_orphans(&keep).await {
            tracing::warn!(error = %e, "removing leftovers of earlier runs failed");
        }
        if let Err(e) = self.sweep_images().await {
            tracing::warn!(error = %e, "removing images no record names failed");
        }
        Ok(report)
    }

    /// Where a recorded running sandbox runs, if its runtime runs and its agent answers. Its
    /// policy has been in force since the driver started (`adoptable_policies`).
    async fn reach(&self, id: &SandboxId, slot: u32) -> Option<Placement> {
        let placement = self.driver.adopt(id, slot).await?;
        self.agent
            .wait_ready(placement.agent, Duration::from_secs(2))
            .await
            .ok()
            .map(|()| placement)
    }

    /// Deletes paused and snapshot images that no record names (a crash between writing an
    /// image and recording it, or between forgetting a record and deleting its image). With
    /// object storage, a paused image names only the sandboxes paused on this node: one of
    /// another node was taken over there, and the copy here is of an older pause.
    async fn sweep_images(&self) -> Result<(), LifecycleError> {
        let shared = self.shares_images();
        let mut named: HashSet<String> = self
            .store
            .sandboxes()
            .all()
            .await?
            .iter()
            .filter(|r| r.state == SandboxState::Paused && (r.node == self.node || !shared))
            .map(|r| paused_image(&r.id))
            .collect();
        named.extend(
            self.store
                .snapshots()
                .all()
                .await?
                .into_iter()
                .map(|s| s.image),
        );
        let images = self.driver.images().map_err(LifecycleError::Driver)?;
        for image in images {
            let ours = image.starts_with(PAUSED_PREFIX) || image.starts_with(SNAPSHOT_PREFIX);
            if ours && !named.contains(&image) {
                tracing::info!(image, "deleting an image no sandbox or snapshot names");
                self.driver
                    .delete_image(&image)
                    .await
                    .map_err(LifecycleError::Driver)?;
            }
        }
        Ok(())
    }
}
