//! One key's share of the templates disk. A key's account holds every layer its builds made
//! that is still on disk (a `RUN`'s or `COPY`'s layer is its own, see `run.rs`), and its `COPY`
//! uploads. Layers that nothing uses any more (a failed build's steps, a deleted template's or
//! an old build's layers) stay as a cache while the key has room, and are the first to go,
//! oldest first, when it needs room: so a key can neither fill the disk with failed builds
//! nor lose a layer that a template, sandbox, snapshot or running build of its stands on.
//!
//! A running build claims each layer it stands on ([`Builder::claim_cached`]) under the same
//! lock under which layers are let go, so a layer is never taken from under a build that has
//! just found it in the cache.

use super::collect::InUse;
use super::{BuildError, Builder};
use crate::ids::TemplateName;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

impl Builder {
    /// The disk `key`'s templates take: its builds' layers still on disk, and its uploads.
    pub async fn storage_of(&self, key: &str) -> Result<u64, BuildError> {
        let layers: u64 = self
            .store
            .templates()
            .layers_of(key)
            .await?
            .into_iter()
            .filter(|(layer, _)| layer.is_dir())
            .map(|(_, bytes)| bytes)
            .sum();
        Ok(layers + self.uploads.bytes_of(&self.templates_of(key).await?))
    }

    async fn templates_of(&self, key: &str) -> Result<Vec<TemplateName>, BuildError> {
        let own = self.store.templates().user_templates_of(key).await?;
        Ok(own.into_iter().map(|t| t.id).collect())
    }

    /// Lets go of `key`'s unused layers, oldest first, until its templates take no more than
    /// `target` bytes or none is left to let go; returns what they take then.
    pub async fn make_room(&self, key: &str, target: u64) -> Result<u64, BuildError> {
        let mut used = self.storage_of(key).await?;
        if used <= target {
            return Ok(used);
        }
        let InUse {
            layers: in_use,
            chains_known,
            ..
        } = self.in_use(&[self.store.as_ref()]).await?;
        if !chains_known {
            return Ok(used);
        }
        let mut unused: Vec<(PathBuf, u64)> = self
            .store
            .templates()
            .layers_of(key)
            .await?
            .into_iter()
            .filter(|(layer, _)| layer.is_dir() && !in_use.contains(layer))
            .collect();
        unused.sort_by_key(|(layer, _)| modified(layer));
        let mut gone = Vec::new();
        {
            let claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
            let claimed: HashSet<&PathBuf> = claims.values().flatten().collect();
            for (layer, bytes) in unused {
                if used <= target {
                    break;
                }
                if claimed.contains(&layer) {
                    continue;
                }
                // Renamed out of the cache under the lock (no build can find it after this);
                // removed after it.
                match self.layers.set_aside(&layer) {
                    Ok(aside) => {
                        gone.push((layer, aside));
                        used = used.saturating_sub(bytes);
                    }
                    Err(e) => tracing::warn!(layer = %layer.display(), error = %e,
                        "letting go of an unused layer failed"),
                }
            }
        }
        for (layer, aside) in gone {
            self.layers.remove_aside(&aside).await?;
            self.store.templates().forget_layer(&layer).await?;
        }
        Ok(used)
    }

    /// Whether layer `key` is in the cache; if it is, build `build` now stands on it.
    pub(super) fn claim_cached(&self, build: &str, key: &str) -> bool {
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        let layer = self.layers.layer(key);
        let cached = layer.is_dir();
        if cached {
            claims.entry(build.to_owned()).or_default().push(layer);
        }
        cached
    }

    /// Build `build` stands on `layer`, which it made.
    pub(super) fn claim(&self, build: &str, layer: &Path) {
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims
            .entry(build.to_owned())
            .or_default()
            .push(layer.to_owned());
    }

    /// Build `build` has ended: what it stood on is a template's now, or unused.
    pub(super) fn release_claims(&self, build: &str) {
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.remove(build);
    }
}

fn modified(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(std::time::UNIX_EPOCH)
}
