//! Paused and snapshot images in object storage (`serve --object-store`), so that a sandbox
//! paused on one node can be resumed on another, and a snapshot started on any node.
//!
//! A pause uploads the image before the sandbox is recorded paused, and records where
//! (`store::PausedImages`); the local copy stays, so a resume on the same node needs no
//! download. A resume whose local image is missing downloads it. The image is spent once
//! resumed, and gone with its sandbox's kill, in object storage as on disk. A snapshot's image
//! goes under `snapshots/{image}` before the snapshot is recorded; a create from it on a node
//! without it downloads it and keeps it; a delete deletes it.
//!
//! Object storage is a copy, never a condition: a pause or snapshot whose upload fails still
//! succeeds (the image stays on this node's disk only, and the failure is logged and counted).

use super::sandbox::{Phase, Sandbox};
use super::{paused_image, Lifecycle, LifecycleError};
use crate::ids::SandboxId;
use crate::objects::{snapshot_prefix, ImageObjects, ObjectsError};
use crate::store::{SandboxRecord, SandboxState, SnapshotRecord};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Instant;

/// Paused images moved to and from object storage since the server started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImageTransfers {
    pub uploads: u64,
    pub upload_failures: u64,
    pub downloads: u64,
    pub download_failures: u64,
}

/// The object store, once set, and what went through it.
#[derive(Default)]
pub(super) struct RemoteImages {
    objects: OnceLock<ImageObjects>,
    uploads: AtomicU64,
    upload_failures: AtomicU64,
    downloads: AtomicU64,
    download_failures: AtomicU64,
    /// One snapshot download at a time: creates from one snapshot download it once.
    pub(super) snapshot_fetches: tokio::sync::Mutex<()>,
    /// Held (shared) by whatever needs snapshot images to stay where they are: a snapshot
    /// from its checkpoint until it is recorded (its image has no record yet), and a create
    /// from a snapshot until its sandbox is restored. The sweep of this node's copies
    /// (`snapshot_copies.rs`) deletes only while it holds it alone.
    pub(super) snapshot_images_in_use: tokio::sync::RwLock<()>,
    /// When each snapshot image here was last started from, for the copies' size budget.
    pub(super) snapshot_uses: std::sync::Mutex<HashMap<String, Instant>>,
}

fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Lifecycle {
    /// Keeps paused images in `objects` from now on (set once, before serving); false if a
    /// store was set already.
    pub fn use_object_store(&self, objects: ImageObjects) -> bool {
        self.remote.objects.set(objects).is_ok()
    }

    /// Whether paused images go to object storage, where other nodes take them over.
    pub(super) fn shares_images(&self) -> bool {
        self.remote.objects.get().is_some()
    }

    /// What went to and from object storage.
    pub fn image_transfers(&self) -> ImageTransfers {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ImageTransfers {
            uploads: read(&self.remote.uploads),
            upload_failures: read(&self.remote.upload_failures),
            downloads: read(&self.remote.downloads),
            download_failures: read(&self.remote.download_failures),
        }
    }

    /// Uploads sandbox `id`'s paused `image` and records where, if there is an object store.
    /// A failure is logged and counted, and leaves no record: the image is then on this
    /// node's disk only.
    pub(super) async fn upload_paused(&self, id: &SandboxId, image: &str) {
        let Some(objects) = self.remote.objects.get() else {
            return;
        };
        // Time-ordered and new for each pause (see objects::paused_prefix).
        let generation = chrono::Utc::now().timestamp_micros().to_string();
        let prefix = crate::objects::paused_prefix(id, &generation);
        let started = std::time::Instant::now();
        let recorded = match self.upload_image(objects, image, &prefix).await {
            Ok(bytes) => self
                .store
                .paused_images()
                .put(id, &prefix, bytes)
                .await
                .map(|()| bytes)
                .map_err(|e| format!("recording it: {e}")),
            Err(e) => Err(e),
        };
        match recorded {
            Ok(bytes) => {
                count(&self.remote.uploads);
                tracing::info!(sandbox = %id, object = prefix, bytes, elapsed = ?started.elapsed(), "paused image uploaded");
            }
            Err(e) => {
                count(&self.remote.upload_failures);
                tracing::warn!(sandbox = %id, store = %objects, error = e, "uploading the paused image failed; it stays on this node only");
                let _ = objects.delete(&prefix).await;
            }
        }
    }

    /// Uploads the driver's `image` under `prefix`; the bytes uploaded.
    async fn upload_image(
        &self,
        objects: &ImageObjects,
        image: &str,
        prefix: &str,
    ) -> Result<u64, String> {
        let dir = self.driver.image_path(image).map_err(|e| e.to_string())?;
        objects
            .upload(prefix, &dir)
            .await
            .map_err(|e| e.to_string())
    }

    /// Downloads the image under `prefix` as the driver's `image`: whether it did (a failed
    /// download is logged and counted).
    async fn download_image(
        &self,
        objects: &ImageObjects,
        prefix: &str,
        image: &str,
    ) -> Result<bool, LifecycleError> {
        let dir = self
            .driver
            .image_path(image)
            .map_err(LifecycleError::Driver)?;
        let started = std::time::Instant::now();
        match objects.download(prefix, &dir).await {
            Ok(bytes) => {
                count(&self.remote.downloads);
                tracing::info!(image, object = prefix, bytes, elapsed = ?started.elapsed(), "image downloaded");
                Ok(true)
            }
            Err(e) => {
                count(&self.remote.download_failures);
                tracing::warn!(image, store = %objects, error = %e, "downloading an image failed");
                Ok(false)
            }
        }
    }

    /// Whether sandbox `id`'s paused image is in object storage, where this server can fetch it.
    pub(super) async fn paused_in_object_store(
        &self,
        id: &SandboxId,
    ) -> Result<bool, LifecycleError> {
        if self.remote.objects.get().is_none() {
            return Ok(false);
        }
        Ok(self.store.paused_images().get(id).await?.is_some())
    }

    /// Downloads sandbox `id`'s paused `image` from object storage, if it is recorded there;
    /// returns whether the image is now on this node's disk.
    pub(super) async fn fetch_paused(
        &self,
        id: &SandboxId,
        image: &str,
    ) -> Result<bool, LifecycleError> {
        let Some(objects) = self.remote.objects.get() else {
            return Ok(false);
        };
        let Some(prefix) = self.store.paused_images().get(id).await? else {
            return Ok(false);
        };
        match self.download_image(objects, &prefix, image).await? {
            true => Ok(true),
            false => Err(LifecycleError::ImageUnavailable(id.to_string())),
        }
    }

    /// Forgets sandbox `id`'s paused image in object storage (a resume spent it): its record
    /// now, its objects in the background. With `all`, every image of the sandbox (a kill).
    pub(super) async fn forget_paused(&self, id: &SandboxId, all: bool) {
        let Some(objects) = self.remote.objects.get() else {
            return;
        };
        let prefix = match self.store.paused_images().get(id).await {
            Ok(prefix) => prefix,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "reading where its paused image is failed");
                None
            }
        };
        if prefix.is_none() && !all {
            return;
        }
        if let Err(e) = self.store.paused_images().delete(id).await {
            tracing::warn!(sandbox = %id, error = %e, "forgetting its paused image failed");
        }
        let (objects, id) = (objects.clone(), id.clone());
        self.destroying.spawn(async move {
            // Only the spent generation on a resume: a pause right after writes a new one.
            let deleted = match (all, prefix) {
                (false, Some(prefix)) => objects.delete(&prefix).await,
                _ => objects.delete_sandbox(&id).await,
            };
            if let Err(e) = deleted {
                tracing::warn!(sandbox = %id, error = %e, "deleting its paused image from object storage failed");
            }
        });
    }
}

impl Lifecycle {
    /// Whether paused `sandbox`, known to this node, is still this node's. Another node takes
    /// a paused sandbox over when this one is draining or does not answer, resumes it there,
    /// and may pause it again: then this node's copy (its record, its image on disk, its
    /// parked runtime) is of an older pause, and is forgotten here so that nothing resumes it.
    async fn still_ours(&self, sandbox: &Arc<Sandbox>) -> Result<bool, LifecycleError> {
        if !self.shares_images() {
            return Ok(true); // no other node can take it
        }
        let row = self.store.sandboxes().get(sandbox.id()).await?;
        if row.is_some_and(|r| r.node == self.node) {
            return Ok(true);
        }
        // A verb at work on it here (a kill, say) finishes first.
        let Some(_verb) = sandbox.try_lock_verb() else {
            return Ok(true);
        };
        let id = sandbox.id().clone();
        tracing::info!(sandbox = %id, "another node took this paused sandbox over; forgetting this node's copy");
        sandbox.set_phase(Phase::Stopping, None);
        // Its runtime is gone before its id is free here: a takeover restores the sandbox
        // under the same id at once, which a runtime still being destroyed would refuse. (If
        // this request is cancelled meanwhile, the id is freed and the destroy goes on.)
        let forgotten = self.sandboxes.remove_on_drop(id.clone());
        self.destroy_parked(sandbox).await;
        drop(forgotten);
        self.driver
            .delete_image(&paused_image(&id))
            .await
            .map_err(LifecycleError::Driver)?;
        Ok(false)
    }

    /// Forgets the paused sandboxes in this node's memory that another node took over
    /// meanwhile (see `still_ours`), so that they leave this node's overview and parked
    /// runtimes even if no request for them comes here.
    pub(super) async fn forget_taken_over(&self) {
        if !self.shares_images() {
            return; // no other node can take one
        }
        let paused: Vec<Arc<Sandbox>> = (self.sandboxes.all().into_iter())
            .filter(|s| s.phase() == Phase::Paused)
            .collect();
        if paused.is_empty() {
            return;
        }
        // Read after the sandboxes above: one taken over by this node meanwhile is in both.
        let ours: HashSet<SandboxId> = match self.store.sandboxes().of_node(&self.node).await {
            Ok(rows) => rows.into_iter().map(|r| r.id).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "reading this node's sandboxes failed");
                return;
            }
        };
        for sandbox in paused.iter().filter(|s| !ours.contains(s.id())) {
            if let Err(e) = self.still_ours(sandbox).await {
                tracing::warn!(sandbox = %sandbox.id(), error = %e, "forgetting a sandbox another node took over failed");
            }
        }
    }
}

impl Lifecycle {
    /// Uploads snapshot `image`, so that any node can start sandboxes from it. As for pauses,
    /// a failure is logged and counted, and the snapshot then starts on this node only.
    pub(super) async fn upload_snapshot(&self, image: &str) {
        let Some(objects) = self.remote.objects.get() else {
            return;
        };
        let started = std::time::Instant::now();
        match self
            .upload_image(objects, image, &snapshot_prefix(image))
            .await
        {
            Ok(bytes) => {
                count(&self.remote.uploads);
                tracing::info!(image, bytes, elapsed = ?started.elapsed(), "snapshot image uploaded");
            }
            Err(e) => {
                count(&self.remote.upload_failures);
                tracing::warn!(image, store = %objects, error = e, "uploading the snapshot image failed; it starts on this node only");
            }
        }
    }

    /// Makes `snapshot`'s image present here: a snapshot taken on another node is downloaded
    /// from object storage (and kept, for the next sandbox from it).
    pub(super) async fn fetch_snapshot(
        &self,
        snapshot: &SnapshotRecord,
    ) -> Result<(), LifecycleError> {
        let image = &snapshot.image;
        self.snapshot_used(image);
        if self.driver.has_image(image) {
            return Ok(());
        }
        let unavailable = || LifecycleError::SnapshotUnavailable(snapshot.id.to_string());
        let Some(objects) = self.remote.objects.get() else {
            return Err(unavailable());
        };
        let _turn = self.remote.snapshot_fetches.lock().await;
        if self.driver.has_image(image) {
            return Ok(());
        }
        match self
            .download_image(objects, &snapshot_prefix(image), image)
            .await?
        {
            true => Ok(()),
            false => Err(unavailable()),
        }
    }

    /// Whether object storage holds snapshot `image` whole (false without an object store).
    pub(super) async fn snapshot_stored(&self, image: &str) -> Result<bool, ObjectsError> {
        match self.remote.objects.get() {
            Some(objects) => objects.has(&snapshot_prefix(image)).await,
            None => Ok(false),
        }
    }

    /// Deletes snapshot `image` from object storage (its snapshot was deleted). Other nodes'
    /// copies go at their next [`Lifecycle::tend_snapshot_copies`].
    pub(super) async fn forget_snapshot(&self, image: &str) {
        let Some(objects) = self.remote.objects.get() else {
            return;
        };
        if let Err(e) = objects.delete(&snapshot_prefix(image)).await {
            tracing::warn!(image, error = %e, "deleting the snapshot image from object storage failed");
        }
    }

    /// Sandbox `id` if this node has it; else a paused one that another node left in object
    /// storage, taken over so that it resumes here. A gateway sends a paused sandbox's verbs
    /// and traffic here when its own node does not answer.
    pub async fn record_or_adopt(&self, id: &str) -> Result<Arc<SandboxRecord>, LifecycleError> {
        let not_found = || LifecycleError::SandboxNotFound(id.to_owned());
        if let Ok(sandbox) = self.find(id) {
            if sandbox.phase() != Phase::Paused || self.still_ours(&sandbox).await? {
                return Ok(sandbox.record());
            }
        }
        let Ok(parsed) = SandboxId::parse(id) else {
            return Err(not_found());
        };
        let Some(mut record) = self.store.sandboxes().get(&parsed).await? else {
            return Err(not_found());
        };
        let elsewhere = record.state == SandboxState::Paused && record.node != self.node;
        if !elsewhere {
            return Err(not_found());
        }
        if !self.paused_in_object_store(&parsed).await? {
            return Err(not_found());
        }
        // Its volumes must be able to come here: they moved into object storage (its node was
        // drained), and its resume takes them in. One kept on another node keeps it there.
        // Whoever asks is not known yet: the answer names nothing of them.
        let owner = record.owner.as_deref();
        if (self.volumes)
            .check_still_there(owner, &record.volume_mounts)
            .await
            .is_err()
        {
            return Err(LifecycleError::Busy(id.to_owned()));
        }
        let moved = self
            .store
            .sandboxes()
            .move_paused(&parsed, &record.node, &self.node)
            .await?;
        if !moved {
            // Another request took it over here first, or another node did, or a verb is
            // under way on it there.
            return self
                .record(id)
                .map_err(|_| LifecycleError::Busy(id.to_owned()));
        }
        tracing::info!(sandbox = id, from = %record.node, "taking over a paused sandbox of another node");
        // An image of it on this disk is from an earlier stay here: the latest pause is the
        // one in object storage.
        self.driver
            .delete_image(&paused_image(&parsed))
            .await
            .map_err(LifecycleError::Driver)?;
        record.node = self.node.clone();
        let sandbox = Sandbox::new(record, Phase::Paused, None);
        let record = sandbox.record();
        self.sandboxes.adopt(sandbox);
        Ok(record)
    }
}
