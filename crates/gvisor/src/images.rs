//! Checkpoint images on the host: `images/{name}`, each a flat directory of runsc's files,
//! written as `.{name}.partial` and renamed when whole, so an image is whole or absent.

use airlock_core::driver::DriverError;
use std::path::{Path, PathBuf};

pub(crate) struct Images {
    dir: PathBuf,
}

impl Images {
    pub fn new(dir: PathBuf) -> Self {
        Images { dir }
    }

    /// The directory the images are in (for its disk's free space).
    pub fn root(&self) -> &Path {
        &self.dir
    }

    /// The directory of image `image`, whether it exists or not.
    pub fn dir_of(&self, image: &str) -> Result<PathBuf, DriverError> {
        if !airlock_core::driver::valid_image_name(image) {
            return Err(DriverError::Command {
                what: format!("using image '{image}'"),
                detail: "not a valid image name".into(),
            });
        }
        Ok(self.dir.join(image))
    }

    /// Where a checkpoint into `image` is written until it is whole.
    pub fn partial(&self, image: &str) -> PathBuf {
        self.dir.join(format!(".{image}.partial"))
    }

    pub fn delete(&self, image: &str) -> Result<(), DriverError> {
        let dir = self.dir_of(image)?;
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(DriverError::io(format!("deleting {}", dir.display()))(e))
            }
            _ => Ok(()),
        }
    }

    /// The names of the whole images, sorted.
    pub fn names(&self) -> Result<Vec<String>, DriverError> {
        let what = || format!("listing {}", self.dir.display());
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(DriverError::io(what()))? {
            let entry = entry.map_err(DriverError::io(what()))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            // A checkpoint under way writes `.{name}.partial`: not an image yet.
            if is_partial(&name) {
                continue;
            }
            names.push(name);
        }
        names.sort();
        Ok(names)
    }

    /// The disk image `image` takes (0 if it does not exist).
    pub fn size(&self, image: &str) -> u64 {
        self.dir_of(image)
            .and_then(|dir| {
                airlock_core::disk_usage::bytes_on_disk(&dir)
                    .map_err(DriverError::io("measuring an image"))
            })
            .unwrap_or(0)
    }

    /// Deletes the checkpoints' work in progress (at start only: while serving, one may be a
    /// pause under way).
    pub fn remove_partial(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(is_partial) {
                if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                    tracing::warn!(path = %entry.path().display(), error = %e, "removing a half-written image failed");
                }
            }
        }
    }
}

/// Whether `name` in the images dir is a checkpoint's work in progress.
fn is_partial(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".partial")
}
