//! Volumes moving between nodes through object storage (issue 32). A volume's files are on
//! one node's disk; a node drained for maintenance moves its volumes out, so that its paused
//! sandboxes that mount them resume elsewhere and their content API keeps answering:
//!
//! 1. **Out** ([`Volumes::move_out`], on the drained node, once no sandbox here uses the
//!    volume). The driver seals it (refused while anything uses it), GNU tar archives its
//!    image (sparse: only what was written), the archive goes to `volumes/{id}/{generation}`,
//!    and the row says so (`stored`) and names no node; then the local files go.
//! 2. **In** (on the first node a request for it reaches: a content API call, or a create or
//!    resume that mounts it, once admitted). The row names this node first (one node wins),
//!    the archive is fetched and unpacked beside the volumes, moved into place, the volume
//!    opened, and then the row forgets the archive, which is deleted. A take-in is a task of
//!    its own, so a request that goes away does not cut it short; one that fails gives the
//!    volume back (on no node); a node that stops half-way fetches it again at its next start.
//!
//! Each volume has a turn on this node ([`Volumes::turn`]): a move, out or in, holds it alone,
//! and every use of its files here (each content API call) holds it shared, so nothing writes
//! to a volume while it moves. A volume is as available as its node otherwise: one whose node
//! is lost waits for it.

use super::{VolumeError, Volumes};
use crate::archive::tar;
use crate::driver::Driver;
use crate::objects::ImageObjects;
use crate::store::{VolumeRecord, VolumeRecords};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::process::Command;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

/// The folder of object storage that volumes moving between nodes wait in.
pub const VOLUMES: &str = "volumes";

/// The one file of a volume's image in object storage.
const ARCHIVE: &str = "volume.tar";

/// A use of a volume's files on this node: while it lives, the volume does not move.
pub struct VolumeUse {
    _held: OwnedRwLockReadGuard<()>,
}

impl Volumes {
    /// Moves volumes through `objects` from now on (set once, at boot, before
    /// [`Volumes::open_all`]); false if set already.
    pub fn use_object_store(&self, objects: ImageObjects) -> bool {
        self.objects.set(objects).is_ok()
    }

    /// Whether volumes can move between nodes here.
    pub fn can_move(&self) -> bool {
        self.objects.get().is_some()
    }

    /// The volumes this node keeps whole (not one it is still taking in).
    pub async fn kept_here(&self) -> Result<Vec<VolumeRecord>, VolumeError> {
        let mut volumes = self.records.of_node(&self.node).await?;
        volumes.retain(|v| v.stored.is_none());
        Ok(volumes)
    }

    /// Volume `id`'s turn on this node (see the module's comment).
    pub(super) fn turn(&self, id: &str) -> Arc<RwLock<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        turns.entry(id.to_owned()).or_default().clone()
    }

    /// Makes sure `volume`'s files are on this node, and holds them here until the use is
    /// dropped: they are, or they wait in object storage and are taken in now. Refused if
    /// another node keeps them.
    pub(super) async fn use_here(&self, volume: &VolumeRecord) -> Result<VolumeUse, VolumeError> {
        for _ in 0..3 {
            let using = self.turn(&volume.id).read_owned().await;
            let now = self.records.by_id(&volume.id).await?;
            let now = now.ok_or_else(|| VolumeError::NotFound(volume.name.clone()))?;
            let here = now.node == self.node;
            match &now.stored {
                None if here => return Ok(VolumeUse { _held: using }),
                Some(_) if here || now.node.is_empty() => {}
                _ => return Err(elsewhere(&now)),
            }
            drop(using);
            self.take_in(now).await?;
        }
        Err(moving(volume, "it moved again meanwhile"))
    }

    /// Whether `volume` can be used here without another node giving it up: it is here, or
    /// on no node (waiting in object storage). No side effect.
    pub(super) fn may_come_here(&self, volume: &VolumeRecord) -> Result<(), VolumeError> {
        let here = volume.node == self.node;
        if here || (volume.node.is_empty() && volume.stored.is_some()) {
            return Ok(());
        }
        Err(elsewhere(volume))
    }

    /// Moves `volume`, kept here and used by no sandbox here, into object storage, to be taken
    /// in by the next node that needs it. Waits for the content API calls on it to end. On
    /// failure it stays here, open as before.
    pub async fn move_out(&self, volume: &VolumeRecord) -> Result<(), VolumeError> {
        let objects = (self.objects.get()).ok_or_else(|| moving(volume, "no object store"))?;
        let _alone = self.turn(&volume.id).write_owned().await;
        match self.records.by_id(&volume.id).await? {
            Some(now) if now.node == self.node && now.stored.is_none() => {}
            _ => return Ok(()), // deleted, or not this node's whole any more
        }
        let dir = self.dir(&volume.id);
        let image = self.driver.seal_volume(&dir).await?;
        let prefix = format!(
            "{VOLUMES}/{}/{}",
            volume.id,
            chrono::Utc::now().timestamp_micros()
        );
        let uploaded = self.upload(volume, objects, &image, &prefix).await;
        let recorded = match uploaded {
            Ok(bytes) => (self.records)
                .move_out(&volume.id, &self.node, &prefix)
                .await
                .map(|moved| (moved, bytes))
                .map_err(VolumeError::from),
            Err(e) => Err(e),
        };
        match recorded {
            Ok((moved, bytes)) => {
                if moved {
                    tracing::info!(volume = volume.id, mib = bytes >> 20, "moved a volume into object storage: the next node that needs it takes it in");
                } else {
                    let _ = objects.delete(&prefix).await; // deleted meanwhile
                }
                remove_files(&dir, &image).await;
                Ok(())
            }
            Err(e) => {
                let _ = objects.delete(&prefix).await;
                self.driver.open_volume(&dir).await?;
                Err(e)
            }
        }
    }

    async fn upload(
        &self,
        volume: &VolumeRecord,
        objects: &ImageObjects,
        image: &Path,
        prefix: &str,
    ) -> Result<u64, VolumeError> {
        let work = self.work_dir()?;
        let (parent, name) = (image.parent().unwrap_or(&self.root), image.file_name());
        let mut archive = Command::new("tar");
        archive
            .arg("--create")
            .arg("--sparse")
            .arg("--file")
            .arg(work.path().join(ARCHIVE))
            .arg("--directory")
            .arg(parent)
            .arg(name.unwrap_or_default());
        tar(archive, "archiving a volume")
            .await
            .map_err(|e| moving(volume, &e))?;
        objects
            .upload(prefix, work.path())
            .await
            .map_err(|e| moving(volume, &e.to_string()))
    }

    /// Brings `volume` (as the row is now: on no node, or this node's half-way) onto this
    /// node, in a task of its own, holding its turn alone.
    async fn take_in(&self, volume: VolumeRecord) -> Result<(), VolumeError> {
        let taker = TakeIn {
            node: self.node.clone(),
            records: self.records.clone(),
            driver: self.driver.clone(),
            root: self.root.clone(),
            objects: self.objects.get().cloned(),
            turn: self.turn(&volume.id),
        };
        let name = volume.name.clone();
        match tokio::spawn(async move { taker.run(volume).await }).await {
            Ok(done) => done,
            Err(e) => Err(moving_named(&name, &e.to_string())),
        }
    }

    /// Finishes a take-in that this node's last run did not (its row names this node and the
    /// archive still); a failure gives the volume back, on no node.
    pub(super) async fn finish_take_in(&self, volume: VolumeRecord) {
        let id = volume.id.clone();
        if let Err(e) = self.take_in(volume).await {
            tracing::warn!(volume = id, error = %e, "taking in a volume this node had begun to failed; it waits in object storage");
        }
    }

    /// Deletes a volume that waits in object storage, unless a node took it in meanwhile:
    /// its row, then its archive.
    pub(super) async fn delete_stored(
        &self,
        volume: &VolumeRecord,
        stored: &str,
    ) -> Result<bool, VolumeError> {
        let records = &self.records;
        if !(records
            .delete_stored(&volume.owner, &volume.id, stored)
            .await?)
        {
            // Gone, or a node took it in: a delete there deletes it.
            return match records.get(&volume.owner, &volume.id).await? {
                Some(now) => Err(elsewhere(&now)),
                None => Ok(false),
            };
        }
        if let Some(objects) = self.objects.get() {
            if let Err(e) = objects.delete(stored).await {
                tracing::warn!(volume = volume.id, error = %e, "deleting a deleted volume's archive failed; object storage's collection deletes it later");
            }
        }
        Ok(true)
    }

    fn work_dir(&self) -> Result<tempfile::TempDir, VolumeError> {
        work_dir(&self.root)
    }
}

/// What a take-in needs, owned: it runs as a task of its own.
struct TakeIn {
    node: String,
    records: VolumeRecords,
    driver: Arc<dyn Driver>,
    root: PathBuf,
    objects: Option<ImageObjects>,
    turn: Arc<RwLock<()>>,
}

impl TakeIn {
    async fn run(self, volume: VolumeRecord) -> Result<(), VolumeError> {
        let _alone = self.turn.clone().write_owned().await;
        // What the row says now: a take-in just before this one may have done it all.
        let now = self.records.by_id(&volume.id).await?;
        let now = now.ok_or_else(|| VolumeError::NotFound(volume.name.clone()))?;
        let stored = match (&now.stored, now.node.as_str()) {
            (None, node) if node == self.node => return Ok(()),
            (Some(stored), "") => {
                if !(self.records.take_in(&now.id, &self.node, stored).await?) {
                    return Err(moving(&now, "another node is taking it in"));
                }
                tracing::info!(volume = now.id, "taking in a volume from object storage");
                stored.clone()
            }
            (Some(stored), node) if node == self.node => stored.clone(),
            _ => return Err(elsewhere(&now)),
        };
        let fetched = self.fetch(&now, &stored).await;
        match fetched {
            Ok(()) => Ok(()),
            Err(e) => {
                // On no node again, so that the next try, here or on another node, takes it in.
                self.records.give_back(&now.id, &self.node, &stored).await?;
                Err(e)
            }
        }
    }

    /// Fetches the archive of `volume` (this node's in the row, `stored` still named),
    /// unpacks it beside the volumes and moves it into place, opens it, and forgets the
    /// archive.
    async fn fetch(&self, volume: &VolumeRecord, stored: &str) -> Result<(), VolumeError> {
        let objects = (self.objects.as_ref()).ok_or_else(|| moving(volume, "no object store"))?;
        let work = work_dir(&self.root)?;
        objects
            .download(stored, work.path())
            .await
            .map_err(|e| moving(volume, &e.to_string()))?;
        let unpacked = work.path().join("unpacked");
        std::fs::create_dir(&unpacked).map_err(VolumeError::io("making a work directory"))?;
        let mut unpack = Command::new("tar");
        unpack
            .arg("--extract")
            .arg("--file")
            .arg(work.path().join(ARCHIVE))
            .arg("--directory")
            .arg(&unpacked);
        tar(unpack, "unpacking a volume")
            .await
            .map_err(|e| moving(volume, &e))?;
        let dir = self.root.join(&volume.id);
        // What a take-in here left half-way, and the mount point the sealed volume had.
        let _ = self.driver.close_volume(&dir).await;
        for entry in std::fs::read_dir(&unpacked).map_err(VolumeError::io("reading a volume"))? {
            let entry = entry.map_err(VolumeError::io("reading a volume"))?;
            let target = self.root.join(entry.file_name());
            let _ = crate::walk::remove_path(&target).await;
            std::fs::rename(entry.path(), &target)
                .map_err(VolumeError::io(format!("placing {}", target.display())))?;
        }
        std::fs::create_dir_all(&dir)
            .map_err(VolumeError::io(format!("creating {}", dir.display())))?;
        self.driver.open_volume(&dir).await?;
        if !(self.records.settle_in(&volume.id, &self.node).await?) {
            // Deleted meanwhile: its files go too.
            let _ = self.driver.delete_volume(&dir).await;
            return Err(VolumeError::NotFound(volume.name.clone()));
        }
        if let Err(e) = objects.delete(stored).await {
            // Named by no row now: object storage's collection deletes it in a day.
            tracing::warn!(volume = volume.id, error = %e, "deleting a volume's archive from object storage failed");
        }
        tracing::info!(volume = volume.id, "took in a volume from object storage");
        Ok(())
    }
}

/// A work directory beside the volumes (on their disk, so that what is unpacked there is
/// moved into place by a rename).
fn work_dir(root: &Path) -> Result<tempfile::TempDir, VolumeError> {
    tempfile::Builder::new()
        .prefix(".moving-")
        .tempdir_in(root)
        .map_err(VolumeError::io("making a work directory"))
}

async fn remove_files(dir: &Path, image: &Path) {
    for path in [image, dir] {
        if let Err(e) = crate::walk::remove_path(path).await {
            tracing::warn!(path = %path.display(), error = %e, "removing a moved volume's files failed");
        }
    }
}

fn elsewhere(volume: &VolumeRecord) -> VolumeError {
    VolumeError::Elsewhere {
        name: volume.name.clone(),
        node: volume.node.clone(),
    }
}

fn moving(volume: &VolumeRecord, detail: &str) -> VolumeError {
    moving_named(&volume.name, detail)
}

fn moving_named(name: &str, detail: &str) -> VolumeError {
    VolumeError::Moving {
        name: name.to_owned(),
        detail: detail.to_owned(),
    }
}
