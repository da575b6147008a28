//! Volumes (E2B's `Volume`): named directories on the host that outlive sandboxes. A volume
//! belongs to the API key that made it; another key's volume is not found, exactly as one that
//! does not exist. Its files are reached through the volume content API, which authenticates
//! with the volume's own token, and from the sandboxes that mount it. The driver holds each
//! one on a filesystem of the volume's size, so the limit holds for every writer.
//!
//! This owns both the `volumes` rows and the directories under `<data>/volumes/<id>`. Each key
//! is held to a number of volumes and to their total size ([`VolumeLimits`]). In a cluster a
//! volume's files are on one node (the one that made it, at first): only that node serves them
//! and runs the sandboxes that mount it (the gateways send both there). A drained node moves
//! its volumes through object storage to the next node that needs them (see [`moves`]).

mod moves;
mod path;
mod tree;

use crate::driver::{Driver, DriverError};
use crate::ids::{constant_time_eq, random_token};
use crate::store::{
    valid_volume_name, Store, StoreError, VolumeMount, VolumeQuota, VolumeRecord, VolumeRecords,
    VolumeUsage,
};
use airlock_wire::MAX_VOLUME_MOUNTS;
pub use moves::{VolumeUse, VOLUMES};
use std::path::{Path, PathBuf};
use std::sync::Arc;
pub use tree::{EntryKind, EntryStat, MetadataChange, NewFile, VolumeTree};
use tree::{DEFAULT_GID, DEFAULT_UID};

/// Characters of a volume id and of its token.
const ID_LEN: usize = 20;
const TOKEN_LEN: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume '{0}' not found")]
    NotFound(String),
    #[error("a volume named '{0}' exists already")]
    NameTaken(String),
    #[error(
        "invalid volume name {0:?}: use 1-64 lowercase letters, digits, '.', '_' and '-', \
         starting with a letter or digit"
    )]
    BadName(String),
    #[error("the volume token is missing or wrong")]
    Unauthorized,
    #[error("path '{0}' not found in the volume")]
    PathNotFound(String),
    #[error("{0}")]
    BadPath(String),
    #[error("'{0}' exists already")]
    Exists(String),
    #[error("the volume is full: it may hold {0} MB")]
    Full(u64),
    #[error("this API key has its maximum of {0} volumes (--key-max-volumes); delete one first")]
    TooMany(usize),
    #[error(
        "this API key's volumes may hold {max_mb} MiB together (--key-max-volume-mb); it has \
         {used_mb} MiB in volumes, and a new one holds {size_mb} MiB; delete one first"
    )]
    KeyFull {
        used_mb: u64,
        size_mb: u64,
        max_mb: u64,
    },
    #[error(
        "the server's disk has {free_mb} MiB free, too little for a new volume of {size_mb} MiB \
         (--volume-size-mb)"
    )]
    NoDisk { free_mb: u64, size_mb: u64 },
    #[error("volume '{name}' is mounted by sandbox {sandbox}; kill it (or let it end) first")]
    InUse { name: String, sandbox: String },
    #[error(
        "volume '{name}' is kept on node '{node}': its files are served there, and a sandbox \
         that mounts it runs there"
    )]
    Elsewhere { name: String, node: String },
    /// Its files are moving between nodes and could not be brought here now.
    #[error("volume '{name}' is moving between nodes and its files cannot be fetched now ({detail}); try again")]
    Moving { name: String, detail: String },
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl VolumeError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VolumeError {
        let what = what.into();
        move |source| VolumeError::Io { what, source }
    }
}

/// A create's wish to see volume `name` at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRequest {
    pub name: String,
    pub path: String,
}

/// Where a volume may not be mounted: the system's own trees and the agent's.
const RESERVED_PATHS: &[&str] = &["/proc", "/sys", "/dev", "/opt/airlock", "/etc/hosts"];

/// What volumes may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeLimits {
    /// MiB each new volume holds.
    pub size_mb: u64,
    /// Most volumes one API key may have.
    pub per_key: usize,
    /// Most MiB one API key's volumes may hold together (the sum of their sizes).
    pub per_key_mb: u64,
}

pub struct Volumes {
    /// This node's name: the volumes it makes are kept here.
    node: String,
    records: VolumeRecords,
    driver: Arc<dyn Driver>,
    root: PathBuf,
    limits: VolumeLimits,
    /// Where volumes wait while they move between nodes (see `moves.rs`), if anywhere.
    objects: std::sync::OnceLock<crate::objects::ImageObjects>,
    /// Each volume's turn: held alone while it moves in or out, shared by each use of its
    /// files here (see `moves.rs`).
    turns: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
}

impl Volumes {
    /// Node `node`'s volumes, kept under `root` (created, mode 0700: only the server walks
    /// it), held to `limits`.
    pub fn new(
        node: &str,
        store: Arc<Store>,
        driver: Arc<dyn Driver>,
        root: &Path,
        limits: VolumeLimits,
    ) -> Result<Self, VolumeError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(VolumeError::io(format!("creating {}", root.display())))?;
        Ok(Volumes {
            node: node.to_owned(),
            records: store.volumes().clone(),
            driver,
            root: root.to_owned(),
            limits,
            objects: std::sync::OnceLock::new(),
            turns: Default::default(),
        })
    }

    /// Makes this node's volumes usable after a start (the host's mounts do not outlive a
    /// reboot).
    pub async fn open_all(&self) -> Result<(), VolumeError> {
        for volume in self.records.claim_of_node(&self.node).await? {
            match volume.stored {
                // A take-in that the last run did not finish.
                Some(_) => self.finish_take_in(volume).await,
                None => self.driver.open_volume(&self.dir(&volume.id)).await?,
            }
        }
        Ok(())
    }

    /// Undoes [`Volumes::open_all`] once no sandbox runs (a clean shutdown). Failures are
    /// logged: the next start takes over what is left.
    pub async fn close_all(&self) {
        let volumes = match self.records.of_node(&self.node).await {
            Ok(volumes) => volumes,
            Err(e) => return tracing::warn!(error = %e, "listing volumes to unmount failed"),
        };
        for volume in volumes {
            if let Err(e) = self.driver.close_volume(&self.dir(&volume.id)).await {
                tracing::warn!(volume = volume.id, error = %e, "unmounting a volume failed");
            }
        }
    }

    /// Where volume `id` is on the host.
    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// What one key's volumes may add up to.
    fn quota(&self) -> VolumeQuota {
        VolumeQuota {
            count: self.limits.per_key as u64,
            total_mb: self.limits.per_key_mb,
        }
    }

    /// Why `owner`, holding `usage`, may not have a new volume called `name`, if it may not.
    fn refusal(&self, usage: VolumeUsage, name: &str) -> Option<VolumeError> {
        let limits = &self.limits;
        if usage.name_taken {
            Some(VolumeError::NameTaken(name.to_owned()))
        } else if usage.count >= limits.per_key as u64 {
            Some(VolumeError::TooMany(limits.per_key))
        } else if usage.total_mb.saturating_add(limits.size_mb) > limits.per_key_mb {
            Some(VolumeError::KeyFull {
                used_mb: usage.total_mb,
                size_mb: limits.size_mb,
                max_mb: limits.per_key_mb,
            })
        } else {
            None
        }
    }

    /// Makes `owner` a volume called `name`, empty. A create that the key's quota or the disk
    /// refuses is refused before anything is made; the quota is checked again, with the record
    /// written in the same step, once the volume's filesystem is made, so creates at the same
    /// time (on this server or on other gateways) never pass it together.
    pub async fn create(
        &self,
        owner: &str,
        name: &str,
        now: i64,
    ) -> Result<VolumeRecord, VolumeError> {
        if !valid_volume_name(name) {
            return Err(VolumeError::BadName(name.to_owned()));
        }
        if let Some(refused) = self.refusal(self.records.usage(owner, name).await?, name) {
            return Err(refused);
        }
        // The file is sparse, but a volume the disk cannot hold would fail its writers later.
        let size_mb = self.limits.size_mb;
        if let Some(space) = crate::disk_usage::disk_space(&self.root) {
            if space.available >> 20 < size_mb {
                return Err(VolumeError::NoDisk {
                    free_mb: space.available >> 20,
                    size_mb,
                });
            }
        }
        let record = VolumeRecord {
            id: random_token(ID_LEN).to_lowercase(),
            owner: owner.to_owned(),
            name: name.to_owned(),
            token: random_token(TOKEN_LEN),
            size_limit_mb: size_mb,
            created_at: now,
            node: self.node.clone(),
            stored: None,
        };
        let dir = self.dir(&record.id);
        std::fs::create_dir(&dir)
            .map_err(VolumeError::io(format!("creating {}", dir.display())))?;
        let made = async {
            self.driver.create_volume(&dir, size_mb).await?;
            // Owned by E2B's `user`, as whom sandboxes that mount it run; no `lost+found`.
            std::os::unix::fs::chown(&dir, Some(DEFAULT_UID), Some(DEFAULT_GID))
                .and_then(|()| match std::fs::remove_dir(dir.join("lost+found")) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                })
                .map_err(VolumeError::io(format!("preparing {}", dir.display())))?;
            self.admit(&record).await
        }
        .await;
        if made.is_err() {
            if let Err(e) = self.driver.delete_volume(&dir).await {
                tracing::warn!(dir = %dir.display(), error = %e, "removing a volume that was not made failed");
            }
        }
        made.map(|()| record)
    }

    /// Records a made volume within its key's quota, or says why not.
    async fn admit(&self, record: &VolumeRecord) -> Result<(), VolumeError> {
        // A refusal whose reason is gone when it is looked up (a volume deleted meanwhile)
        // is tried again.
        for _ in 0..3 {
            if self.records.admit(record, self.quota()).await? {
                return Ok(());
            }
            let usage = self.records.usage(&record.owner, &record.name).await?;
            if let Some(refused) = self.refusal(usage, &record.name) {
                return Err(refused);
            }
        }
        Err(VolumeError::TooMany(self.limits.per_key))
    }

    /// `owner`'s volume `id`.
    pub async fn get(&self, owner: &str, id: &str) -> Result<VolumeRecord, VolumeError> {
        self.records
            .get(owner, id)
            .await?
            .ok_or_else(|| VolumeError::NotFound(id.to_owned()))
    }

    pub async fn list(&self, owner: &str) -> Result<Vec<VolumeRecord>, VolumeError> {
        Ok(self.records.of(owner).await?)
    }

    /// Deletes `volume` (as [`Volumes::get`] found it) and its files; `false` if it is gone
    /// meanwhile. The caller makes sure that no sandbox mounts it (see
    /// `Lifecycle::delete_volume`).
    pub(crate) async fn delete(&self, volume: &VolumeRecord) -> Result<bool, VolumeError> {
        if let (Some(stored), "") = (&volume.stored, volume.node.as_str()) {
            return self.delete_stored(volume, stored).await;
        }
        // Its files here (one half taken in is finished first), and no call on them meanwhile.
        drop(self.use_here(volume).await?);
        let _alone = self.turn(&volume.id).write_owned().await;
        let id = volume.id.as_str();
        if !self.records.delete(&volume.owner, id).await? {
            return Ok(false);
        }
        let dir = self.dir(id);
        if let Err(e) = self.driver.delete_volume(&dir).await {
            // The row is gone, so nothing reaches these files any more; say what is left.
            tracing::warn!(volume = id, dir = %dir.display(), error = %e, "removing a deleted volume's files failed");
        }
        Ok(true)
    }

    /// The volumes a create asks for, checked: `owner`'s, by name, kept on this node, each at
    /// its own absolute path outside the system's trees.
    pub async fn resolve(
        &self,
        owner: Option<&str>,
        requests: &[MountRequest],
    ) -> Result<Vec<VolumeMount>, VolumeError> {
        if requests.len() > MAX_VOLUME_MOUNTS {
            return Err(VolumeError::BadPath(format!(
                "a sandbox may mount at most {MAX_VOLUME_MOUNTS} volumes"
            )));
        }
        let owned = match owner {
            Some(owner) => self.records.of(owner).await?,
            None => Vec::new(),
        };
        let mut mounts: Vec<VolumeMount> = Vec::new();
        for request in requests {
            let path = check_mount_path(&request.path)?;
            if mounts.iter().any(|m| m.path == path) {
                return Err(VolumeError::BadPath(format!(
                    "two volumes are mounted at '{path}'"
                )));
            }
            let volume = owned
                .iter()
                .find(|v| v.name == request.name)
                .ok_or_else(|| VolumeError::NotFound(request.name.clone()))?;
            self.may_come_here(volume)?;
            mounts.push(VolumeMount {
                volume_id: volume.id.clone(),
                name: volume.name.clone(),
                path,
            });
        }
        Ok(mounts)
    }

    /// Fails with the name of the first of `mounts` whose volume `owner` no longer has, or
    /// that is kept on another node. No side effect: [`Volumes::bring_here`] then takes in
    /// those waiting in object storage.
    pub async fn check_still_there(
        &self,
        owner: Option<&str>,
        mounts: &[VolumeMount],
    ) -> Result<(), VolumeError> {
        for volume in self.mounted(owner, mounts).await? {
            self.may_come_here(&volume)?;
        }
        Ok(())
    }

    /// Makes the files of `mounts` (checked by [`Volumes::check_still_there`]) present on
    /// this node, taking in those that wait in object storage; for a create or resume that
    /// was admitted.
    pub async fn bring_here(
        &self,
        owner: Option<&str>,
        mounts: &[VolumeMount],
    ) -> Result<(), VolumeError> {
        for volume in self.mounted(owner, mounts).await? {
            drop(self.use_here(&volume).await?);
        }
        Ok(())
    }

    /// The records of the volumes of `mounts`, `owner`'s; the first one it lacks is not found.
    async fn mounted(
        &self,
        owner: Option<&str>,
        mounts: &[VolumeMount],
    ) -> Result<Vec<VolumeRecord>, VolumeError> {
        let mut volumes = Vec::with_capacity(mounts.len());
        for mount in mounts {
            let volume = match owner {
                Some(owner) => self.records.get(owner, &mount.volume_id).await?,
                None => None,
            };
            volumes.push(volume.ok_or_else(|| VolumeError::NotFound(mount.name.clone()))?);
        }
        Ok(volumes)
    }

    /// The files of volume `id`, for a caller that holds its token. A wrong token and a missing
    /// volume answer alike, so the answer does not say which volumes exist.
    pub async fn open(&self, id: &str, token: Option<&str>) -> Result<VolumeTree, VolumeError> {
        let record = self.records.by_id(id).await?;
        let (Some(record), Some(token)) = (record, token) else {
            return Err(VolumeError::Unauthorized);
        };
        if !constant_time_eq(record.token.as_bytes(), token.as_bytes()) {
            return Err(VolumeError::Unauthorized);
        }
        let held = self.use_here(&record).await?;
        Ok(VolumeTree::open(&self.dir(id), record.size_limit_mb)?.holding(held))
    }
}

/// `path` as a mount point: absolute, with no `.`, `..` or empty parts, and not `/` or in a
/// tree of [`RESERVED_PATHS`]. Returned without a trailing slash.
fn check_mount_path(path: &str) -> Result<String, VolumeError> {
    let bad = |why: &str| Err(VolumeError::BadPath(format!("mount path '{path}' {why}")));
    if path == "/" {
        return bad("may not be the root");
    }
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    let Some(rest) = trimmed.strip_prefix('/') else {
        return bad("must be absolute");
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.iter().any(|part| matches!(*part, "" | "." | "..")) || rest.contains('\0') {
        return bad("must be a plain path, without '.', '..' or empty parts");
    }
    path::check_caps("mount path", trimmed, &parts)?;
    let reserved = |r: &&str| trimmed == *r || trimmed.starts_with(&format!("{r}/"));
    if RESERVED_PATHS.iter().any(reserved) {
        return bad("is in a tree the sandbox's system needs");
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::check_mount_path;

    #[test]
    fn mount_paths_are_plain_and_outside_the_system() {
        assert_eq!(check_mount_path("/mnt/data/").unwrap(), "/mnt/data");
        assert_eq!(check_mount_path("/home/user/v").unwrap(), "/home/user/v");
        for bad in [
            "",
            "/",
            "mnt",
            "/mnt//x",
            "/mnt/../etc",
            "/./x",
            "/proc",
            "/proc/1",
            "/dev/x",
            "/opt/airlock/volumes/0",
            "/etc/hosts",
        ] {
            assert!(check_mount_path(bad).is_err(), "{bad:?} was taken");
        }
        assert!(check_mount_path("/procfs").is_ok());
        let too_deep = "/d".repeat(super::path::MAX_DEPTH + 1);
        assert!(check_mount_path(&too_deep).is_err());
    }
}
