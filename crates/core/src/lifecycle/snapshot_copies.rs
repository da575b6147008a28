//! This node's copies of snapshot images, when images are shared through object storage. A
//! create from a snapshot taken elsewhere downloads its image and keeps it for the next one;
//! the copies are then tended every minute:
//! - a copy of a snapshot deleted (or taken again under its name) through another node is
//!   deleted, so that a deleted snapshot's memory and files stay on no disk;
//! - past `Limits::snapshot_cache_mb`, the copies started from least recently are deleted,
//!   as long as object storage has them (the next create downloads them again). A snapshot
//!   whose upload failed is on this node alone and is never trimmed.

use super::create::{Launch, Started};
use super::{Lifecycle, LifecycleError, SNAPSHOT_PREFIX};
use crate::ids::SandboxId;
use crate::store::SnapshotRecord;
use std::collections::HashSet;
use std::time::Instant;

impl Lifecycle {
    /// Starts sandbox `id` from `snapshot`, downloading its image first if this node has no
    /// copy. The image is held from the check until the restore is done, so that the copies'
    /// sweep cannot delete it in between.
    pub(super) async fn start_from_snapshot(
        &self,
        id: &SandboxId,
        snapshot: &SnapshotRecord,
        launch: Launch,
    ) -> Result<Started, LifecycleError> {
        let _held = self.remote.snapshot_images_in_use.read().await;
        self.fetch_snapshot(snapshot).await?;
        (self.start(id, &snapshot.rootfs, Some(&snapshot.image), launch)).await
    }

    /// Notes that a sandbox is being started from snapshot `image` now.
    pub(super) fn snapshot_used(&self, image: &str) {
        let mut uses = self.remote.snapshot_uses.lock().unwrap();
        uses.insert(image.to_owned(), Instant::now());
    }

    /// Deletes this node's copies of deleted snapshots, then trims the rest to the budget.
    /// Skipped while a snapshot is being made or started from here, or downloaded (one round
    /// at a time: a second finds the locks taken).
    pub(super) async fn tend_snapshot_copies(&self) {
        if !self.shares_images() {
            return; // each snapshot is on this node alone, and its delete deletes it here
        }
        let (Ok(_alone), Ok(_no_fetch)) = (
            self.remote.snapshot_images_in_use.try_write(),
            self.remote.snapshot_fetches.try_lock(),
        ) else {
            return; // the next round
        };
        let copies: Vec<String> = match self.driver.images() {
            Ok(images) => (images.into_iter())
                .filter(|image| image.starts_with(SNAPSHOT_PREFIX))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "listing this node's images failed");
                return;
            }
        };
        if copies.is_empty() {
            return;
        }
        let recorded: HashSet<String> = match self.store.snapshots().all().await {
            Ok(snapshots) => snapshots.into_iter().map(|s| s.image).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "reading the snapshots failed");
                return;
            }
        };
        let (live, deleted): (Vec<String>, Vec<String>) = copies
            .into_iter()
            .partition(|image| recorded.contains(image));
        for image in &deleted {
            tracing::info!(image, "deleting this node's copy of a deleted snapshot");
            self.delete_snapshot_copy(image).await;
        }
        self.trim_snapshot_copies(live).await;
    }

    /// Deletes copies in `live`, least recently started from first (those not started from
    /// since this server started count as oldest), until they fit the budget.
    async fn trim_snapshot_copies(&self, live: Vec<String>) {
        let budget = self.limits.snapshot_cache_mb << 20;
        let mut sized: Vec<(Option<Instant>, String, u64)> = {
            let uses = self.remote.snapshot_uses.lock().unwrap();
            (live.into_iter())
                .map(|image| {
                    let bytes = self.driver.image_size(&image);
                    (uses.get(&image).copied(), image, bytes)
                })
                .collect()
        };
        let mut total: u64 = sized.iter().map(|(_, _, bytes)| bytes).sum();
        if total <= budget {
            return;
        }
        sized.sort();
        for (_, image, bytes) in sized {
            if total <= budget {
                break;
            }
            match self.snapshot_stored(&image).await {
                Ok(true) => {}
                Ok(false) => continue, // the only copy there is
                Err(e) => {
                    tracing::warn!(image, error = %e, "object storage does not answer; snapshot copies are trimmed later");
                    return;
                }
            }
            tracing::info!(image, bytes, budget, "deleting this node's least recently used snapshot copy: the copies are over their budget (--snapshot-cache-mb)");
            if self.delete_snapshot_copy(&image).await {
                total -= bytes;
            }
        }
    }

    async fn delete_snapshot_copy(&self, image: &str) -> bool {
        self.remote.snapshot_uses.lock().unwrap().remove(image);
        match self.driver.delete_image(image).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(image, error = %e, "deleting a snapshot copy failed");
                false
            }
        }
    }
}
