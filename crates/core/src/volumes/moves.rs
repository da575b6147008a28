//! Volumes moving between nodes through object storage (issue 32). A volume's files are on
//! one node's disk; a node drained for maintenance moves its volumes out, so that its paused
//! sandboxes that mount them resume elsewhere and their content API keeps answering:
//!
//! 1. **Out** ([`Volumes::move_out`], on the drained node, once no sandbox here uses the
//!    volume). The driver seals it (refused while anything uses it), GNU tar archives its
//!    image (sparse: only what was written), the archive goes to `volumes/{id}/{generation}`,
//!    and the row says so (`stored`) and names no node; the local files go.
//! 2. **In** ([`Volumes::take_in`], on the first node a request for it reaches: a content API
//!    call, a create that mounts it, the resume of a sandbox that does). The row names this
//!    node first (one node wins), the archive is fetched and unpacked, the volume opened, and
//!    then the row forgets the archive, which is deleted. A node that stops half-way names
//!    itself with the archive still named: its next start fetches it again.
//!
//! A volume is as available as its node otherwise: one whose node is lost waits for it.

use super::{VolumeError, Volumes};
use crate::archive::tar;
use crate::objects::ImageObjects;
use crate::store::VolumeRecord;
use std::path::Path;
use tokio::process::Command;

/// The folder of object storage that volumes moving between nodes wait in.
pub const VOLUMES: &str = "volumes";

/// The one file of a volume's image in object storage.
const ARCHIVE: &str = "volume.tar";

impl Volumes {
    /// Moves volumes through `objects` from now on (set once, at boot); false if set already.
    pub fn use_object_store(&self, objects: ImageObjects) -> bool {
        self.objects.set(objects).is_ok()
    }

    /// Whether volumes can move between nodes here.
    pub fn can_move(&self) -> bool {
        self.objects.get().is_some()
    }

    /// The volumes this node keeps.
    pub async fn kept_here(&self) -> Result<Vec<VolumeRecord>, VolumeError> {
        Ok(self.records.of_node(&self.node).await?)
    }

    /// Moves `volume`, kept here and used by no sandbox here, into object storage, to be taken
    /// in by the next node that needs it. On failure it stays here, open as before.
    pub async fn move_out(&self, volume: &VolumeRecord) -> Result<(), VolumeError> {
        let objects = self
            .objects
            .get()
            .ok_or_else(|| moving(volume, "no object store"))?;
        let dir = self.dir(&volume.id);
        let image = self.driver.seal_volume(&dir).await?;
        let prefix = format!(
            "{VOLUMES}/{}/{}",
            volume.id,
            chrono::Utc::now().timestamp_micros()
        );
        let moved = async {
            let work = tempfile::tempdir_in(&self.root)
                .map_err(VolumeError::io("making a work directory"))?;
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
            let bytes = objects
                .upload(&prefix, work.path())
                .await
                .map_err(|e| moving(volume, &e.to_string()))?;
            Ok::<_, VolumeError>(bytes)
        }
        .await;
        let recorded = match moved {
            Ok(bytes) => self
                .records
                .move_out(&volume.id, &self.node, &prefix)
                .await
                .map(|moved| (moved, bytes))
                .map_err(VolumeError::from),
            Err(e) => Err(e),
        };
        match recorded {
            Ok((true, bytes)) => {
                tracing::info!(
                    volume = volume.id,
                    mib = bytes >> 20,
                    "moved a volume into object storage: the next node that needs it takes it in"
                );
                self.remove_files(&dir, &image).await;
                Ok(())
            }
            // Deleted meanwhile: nothing is to move.
            Ok((false, _)) => {
                let _ = objects.delete(&prefix).await;
                self.remove_files(&dir, &image).await;
                Ok(())
            }
            Err(e) => {
                let _ = objects.delete(&prefix).await;
                self.driver.open_volume(&dir).await?;
                Err(e)
            }
        }
    }

    /// Brings `volume`, waiting in object storage under `stored`, onto this node (see the
    /// module's comment). Several requests at once fetch it once.
    pub(super) async fn take_in(
        &self,
        volume: &VolumeRecord,
        stored: &str,
    ) -> Result<(), VolumeError> {
        let turn = {
            let mut taking = self.taking_in.lock().await;
            taking.entry(volume.id.clone()).or_default().clone()
        };
        let _turn = turn.lock().await;
        // What the row says now: a take-in just before this one may have done it all.
        let now = self.records.by_id(&volume.id).await?;
        let now = now.ok_or_else(|| VolumeError::NotFound(volume.name.clone()))?;
        match (&now.stored, now.node.as_str()) {
            (None, node) if node == self.node => return Ok(()),
            (Some(stored), "") => {
                if !(self.records.take_in(&now.id, &self.node, stored).await?) {
                    return Err(moving(volume, "another node is taking it in"));
                }
                tracing::info!(volume = now.id, "taking in a volume from object storage");
            }
            (Some(_), node) if node == self.node => {}
            (_, node) => {
                return Err(VolumeError::Elsewhere {
                    name: now.name.clone(),
                    node: node.to_owned(),
                })
            }
        }
        let stored = now.stored.as_deref().unwrap_or(stored);
        let fetched = self.fetch_in(&now, stored).await;
        if fetched.is_err() {
            // On no node again, so that the next try, here or on another node, takes it in.
            self.records.give_back(&now.id, &self.node, stored).await?;
        }
        fetched
    }

    /// Fetches the archive of `volume` (this node's in the row, `stored` still named), opens
    /// it, and forgets the archive.
    pub(super) async fn fetch_in(
        &self,
        volume: &VolumeRecord,
        stored: &str,
    ) -> Result<(), VolumeError> {
        let objects = self
            .objects
            .get()
            .ok_or_else(|| moving(volume, "no object store"))?;
        let work =
            tempfile::tempdir_in(&self.root).map_err(VolumeError::io("making a work directory"))?;
        objects
            .download(stored, work.path())
            .await
            .map_err(|e| moving(volume, &e.to_string()))?;
        let mut unpack = Command::new("tar");
        unpack
            .arg("--extract")
            .arg("--file")
            .arg(work.path().join(ARCHIVE))
            .arg("--directory")
            .arg(&self.root);
        tar(unpack, "unpacking a volume")
            .await
            .map_err(|e| moving(volume, &e))?;
        let dir = self.dir(&volume.id);
        std::fs::create_dir_all(&dir)
            .map_err(VolumeError::io(format!("creating {}", dir.display())))?;
        self.driver.open_volume(&dir).await?;
        self.records.settle_in(&volume.id, &self.node).await?;
        if let Err(e) = objects.delete(stored).await {
            // Named by no row now: object storage's collection deletes it in a day.
            tracing::warn!(volume = volume.id, error = %e, "deleting a volume's archive from object storage failed");
        }
        tracing::info!(volume = volume.id, "took in a volume from object storage");
        Ok(())
    }

    /// Deletes a volume that waits in object storage: its row, then its archive.
    pub(super) async fn delete_stored(
        &self,
        volume: &VolumeRecord,
        stored: &str,
    ) -> Result<bool, VolumeError> {
        if !self.records.delete(&volume.owner, &volume.id).await? {
            return Ok(false);
        }
        if let Some(objects) = self.objects.get() {
            if let Err(e) = objects.delete(stored).await {
                tracing::warn!(volume = volume.id, error = %e, "deleting a deleted volume's archive failed; object storage's collection deletes it later");
            }
        }
        Ok(true)
    }

    async fn remove_files(&self, dir: &Path, image: &Path) {
        for path in [image, dir] {
            if let Err(e) = crate::walk::remove_path(path).await {
                tracing::warn!(path = %path.display(), error = %e, "removing a moved volume's files failed");
            }
        }
    }
}

fn moving(volume: &VolumeRecord, detail: &str) -> VolumeError {
    VolumeError::Moving {
        name: volume.name.clone(),
        detail: detail.to_owned(),
    }
}
