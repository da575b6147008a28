//! This node's copies of snapshot images, when images are shared through object storage. A
//! create from a snapshot taken elsewhere downloads its image and keeps it for the next one;
//! the copies are then tended every minute:
//! - a copy of a snapshot deleted (or taken again under its name) through another node is
//!   deleted, so that a deleted snapshot's memory and files stay on no disk;
//! - past `Limits::snapshot_cache_mb`, counting the copies that object storage holds too, the
//!   ones started from least recently are deleted (the next create downloads them again). A
//!   snapshot whose upload failed is on this node alone: it neither counts nor goes.

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
        self.start(id, &snapshot.rootfs, Some(&snapshot.image), launch)
            .await
    }

    /// Notes that a sandbox is being started from snapshot `image` now.
    pub(super) fn snapshot_used(&self, image: &str) {
        let mut uses = self.remote.snapshot_uses.lock().unwrap();
        uses.insert(image.to_owned(), Instant::now());
    }

    /// When a sandbox was last started from snapshot `image` (`None`: not since this start).
    fn last_use(&self, image: &str) -> Option<Instant> {
        self.remote
            .snapshot_uses
            .lock()
            .unwrap()
            .get(image)
            .copied()
    }

    /// Deletes this node's copies of deleted snapshots, then trims the rest to the budget.
    /// Skipped while a snapshot is being made or started from here, or downloaded (one round
    /// at a time: a second finds the locks taken).
    pub(super) async fn tend_snapshot_copies(&self) {
        if !self.shares_images() {
            return; // each snapshot is on this node alone, and its delete deletes it here
        }
        // Found before anything is held: object storage may be slow to answer.
        let found_at = Instant::now();
        let over_budget = self.snapshot_copies_over_budget().await;
        let (Ok(_alone), Ok(_no_fetch)) = (
            self.remote.snapshot_images_in_use.try_write(),
            self.remote.snapshot_fetches.try_lock(),
        ) else {
            return; // the next round
        };
        let copies: HashSet<String> = match self.snapshot_copies() {
            Ok(copies) => copies.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "listing this node's images failed");
                return;
            }
        };
        (self.remote.snapshot_uses.lock().unwrap()).retain(|image, _| copies.contains(image));
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
        for image in copies.iter().filter(|image| !recorded.contains(*image)) {
            tracing::info!(image, "deleting this node's copy of a deleted snapshot");
            self.delete_snapshot_copy(image).await;
        }
        for image in over_budget.iter().filter(|image| recorded.contains(*image)) {
            if self.last_use(image).is_some_and(|used| used > found_at) {
                continue; // started from since: no longer the least recently used
            }
            tracing::info!(image, budget_mb = self.limits.snapshot_cache_mb, "deleting this node's least recently used snapshot copy: the copies in object storage too are over their budget (--snapshot-cache-mb)");
            self.delete_snapshot_copy(image).await;
        }
    }

    /// The snapshot images on this node's disk.
    fn snapshot_copies(&self) -> Result<Vec<String>, crate::driver::DriverError> {
        let images = self.driver.images()?;
        Ok((images.into_iter())
            .filter(|image| image.starts_with(SNAPSHOT_PREFIX))
            .collect())
    }

    /// The copies here that object storage holds too, least recently started from first (those
    /// not started from since this server started count as oldest), that must go for the rest
    /// of them to fit the budget. Copies on this node alone (their upload failed) neither count
    /// nor go. Empty within the budget, and when object storage does not answer.
    async fn snapshot_copies_over_budget(&self) -> Vec<String> {
        let budget = self.limits.snapshot_cache_mb << 20;
        let sized: Vec<(String, u64)> = (self.snapshot_copies().unwrap_or_default().into_iter())
            .map(|image| {
                let bytes = self.driver.image_size(&image);
                (image, bytes)
            })
            .collect();
        if sized.iter().map(|(_, bytes)| bytes).sum::<u64>() <= budget {
            return Vec::new(); // no question for object storage
        }
        let mut stored = Vec::new();
        for (image, bytes) in sized {
            match self.snapshot_stored(&image).await {
                Ok(true) => stored.push((image, bytes)),
                Ok(false) => {} // the only copy there is
                Err(e) => {
                    tracing::warn!(error = %e, "object storage does not answer; snapshot copies are trimmed later");
                    return Vec::new();
                }
            }
        }
        let mut total: u64 = stored.iter().map(|(_, bytes)| bytes).sum();
        let mut by_use: Vec<(Option<Instant>, String, u64)> = (stored.into_iter())
            .map(|(image, bytes)| (self.last_use(&image), image, bytes))
            .collect();
        by_use.sort();
        let mut over = Vec::new();
        for (_, image, bytes) in by_use {
            if total <= budget {
                break;
            }
            total -= bytes;
            over.push(image);
        }
        over
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
