//! Volumes (E2B's `Volume`): named directories on the host that outlive sandboxes. A volume
//! belongs to the API key that made it; another key's volume is not found, exactly as one that
//! does not exist. Its files are reached through the volume content API, which authenticates
//! with the volume's own token, and each write is held to the volume's size limit.
//!
//! This owns both the `volumes` rows and the directories under `<data>/volumes/<id>`.

mod tree;

use crate::ids::{constant_time_eq, random_token};
use crate::store::{valid_volume_name, Store, StoreError, VolumeRecord};
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

pub struct Volumes {
    store: Arc<Store>,
    root: PathBuf,
    size_limit_mb: u64,
}

impl Volumes {
    /// Volumes kept under `root` (created, mode 0700: only the server walks it), each new one
    /// holding at most `size_limit_mb`.
    pub fn new(store: Arc<Store>, root: &Path, size_limit_mb: u64) -> Result<Self, VolumeError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(VolumeError::io(format!("creating {}", root.display())))?;
        Ok(Volumes {
            store,
            root: root.to_owned(),
            size_limit_mb,
        })
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Makes `owner` a volume called `name`, with an empty directory.
    pub fn create(&self, owner: &str, name: &str, now: i64) -> Result<VolumeRecord, VolumeError> {
        if !valid_volume_name(name) {
            return Err(VolumeError::BadName(name.to_owned()));
        }
        let record = VolumeRecord {
            id: random_token(ID_LEN).to_lowercase(),
            owner: owner.to_owned(),
            name: name.to_owned(),
            token: random_token(TOKEN_LEN),
            size_limit_mb: self.size_limit_mb,
            created_at: now,
        };
        let dir = self.dir(&record.id);
        // Owned by E2B's `user`, as whom sandboxes that mount it run.
        std::fs::create_dir(&dir)
            .and_then(|()| std::os::unix::fs::chown(&dir, Some(DEFAULT_UID), Some(DEFAULT_GID)))
            .map_err(VolumeError::io(format!("creating {}", dir.display())))?;
        match self.store.insert_volume(&record) {
            Ok(true) => Ok(record),
            Ok(false) => {
                let _ = std::fs::remove_dir(&dir);
                Err(VolumeError::NameTaken(name.to_owned()))
            }
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(e.into())
            }
        }
    }

    /// `owner`'s volume `id`.
    pub fn get(&self, owner: &str, id: &str) -> Result<VolumeRecord, VolumeError> {
        self.store
            .volume(owner, id)?
            .ok_or_else(|| VolumeError::NotFound(id.to_owned()))
    }

    pub fn list(&self, owner: &str) -> Result<Vec<VolumeRecord>, VolumeError> {
        Ok(self.store.volumes(owner)?)
    }

    /// Deletes `owner`'s volume `id` and its files; `false` if it has none such.
    pub fn delete(&self, owner: &str, id: &str) -> Result<bool, VolumeError> {
        if !self.store.delete_volume(owner, id)? {
            return Ok(false);
        }
        let dir = self.dir(id);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            // The row is gone, so nothing reaches these files any more; say what is left.
            tracing::warn!(volume = id, dir = %dir.display(), error = %e, "removing a deleted volume's files failed");
        }
        Ok(true)
    }

    /// The files of volume `id`, for a caller that holds its token. A wrong token and a missing
    /// volume answer alike, so the answer does not say which volumes exist.
    pub fn open(&self, id: &str, token: Option<&str>) -> Result<VolumeTree, VolumeError> {
        let record = self.store.volume_by_id(id)?;
        let (Some(record), Some(token)) = (record, token) else {
            return Err(VolumeError::Unauthorized);
        };
        if !constant_time_eq(record.token.as_bytes(), token.as_bytes()) {
            return Err(VolumeError::Unauthorized);
        }
        VolumeTree::open(&self.dir(id), record.size_limit_mb)
    }
}
