//! Collecting what nothing uses any more: the layers and rootfs mounts of old builds and of
//! deleted templates, COPY uploads of deleted templates, the root filesystems the built-in
//! templates had before they were built from Dockerfiles, old builds' records and logs, and
//! image blobs that no pull has used for [`BLOBS_UNUSED_FOR`].
//!
//! It runs when the server starts, once the built-in templates are built and before it answers
//! any request or fills any pool: then every root filesystem in use is one a store names (a
//! template's, a running or paused sandbox's, a snapshot's), and no build is under way. One
//! templates dir may serve several data dirs (the test suite's do): what any of their stores
//! names is kept.

use super::layers::is_mount_point;
use super::{BuildError, Builder};
use crate::store::Store;
use crate::template::KNOWN_TEMPLATES;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Builds kept per template (newest first), with their logs; older ones are forgotten.
pub const BUILDS_KEPT: usize = 10;

/// How long an image's layer blob is kept after a pull last used it. Images' layers live on as
/// unpacked layers while a template uses them; the blobs only spare a rebuild the download.
const BLOBS_UNUSED_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a collection removed.
#[derive(Debug, Default)]
pub struct Collected {
    pub layers: usize,
    pub mounts: usize,
    pub blobs: usize,
    pub bytes: u64,
}

impl Builder {
    /// Removes what no template, sandbox or snapshot uses, in this server's store or in
    /// `others` (the stores of the other data dirs that keep their templates here). Call it
    /// only while nothing else builds or creates sandboxes (see the module's comment).
    pub async fn collect_garbage(&self, others: &[Store]) -> Result<Collected, BuildError> {
        let mut done = Collected::default();
        self.store.templates().prune_builds(BUILDS_KEPT).await?;
        let stores: Vec<&Store> = std::iter::once(self.store.as_ref()).chain(others).collect();
        let InUse {
            rootfs: in_use,
            layers,
            chains_known,
        } = self.in_use(&stores).await?;
        let mut template_ids = HashSet::new();
        for store in &stores {
            template_ids.extend(
                store
                    .templates()
                    .user_templates()
                    .await?
                    .into_iter()
                    .map(|t| t.id.to_string()),
            );
        }

        let mounts: HashSet<PathBuf> = entries(self.layers.mounts_dir())
            .into_iter()
            .map(
                |path| match path.to_str().and_then(|p| p.strip_suffix(".layers")) {
                    Some(mount) => PathBuf::from(mount),
                    None => path,
                },
            )
            .collect();
        for mount in mounts.iter().filter(|m| !in_use.contains(*m)) {
            done.bytes += size_of(mount).await;
            self.layers.remove_rootfs(mount).await?;
            done.mounts += 1;
        }
        if chains_known {
            for layer in entries(self.layers.layers_dir()) {
                let hidden = layer
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'));
                if !hidden && !layers.contains(&layer) {
                    remove(&layer, &mut done).await?;
                    self.store.templates().forget_layer(&layer).await?;
                    done.layers += 1;
                }
            }
        } else {
            tracing::warn!(
                "a sandbox's or snapshot's root filesystem was mounted before Airlock recorded \
                 its layers, so which it needs is unknown: no layer is collected"
            );
        }

        // The built-ins' root filesystems from before they were Dockerfiles
        // (`{name}-{hash}/rootfs`), unless something still runs on one.
        for dir in entries(&self.templates_dir) {
            let name = dir.file_name().unwrap_or_default().to_string_lossy();
            let legacy = KNOWN_TEMPLATES
                .iter()
                .any(|t| name.strip_prefix(&format!("{t}-")).is_some_and(is_sha256));
            if legacy && !in_use.iter().any(|r| r.starts_with(&dir)) {
                remove(&dir, &mut done).await?;
            }
        }

        for blob in entries(self.registries.blobs_dir()) {
            let unused_for = std::fs::metadata(&blob)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|at| at.elapsed().ok());
            // A download a stopped build or server left half-way is never used.
            let partial = blob.to_string_lossy().contains(".partial-");
            if partial || unused_for.is_some_and(|d| d > BLOBS_UNUSED_FOR) {
                remove(&blob, &mut done).await?;
                done.blobs += 1;
            }
        }

        // COPY uploads of templates that no longer exist, then the archives no template's
        // upload names; and the uploads as they were kept before they were filed by digest.
        template_ids.extend(KNOWN_TEMPLATES.iter().map(|t| t.to_string()));
        for dir in entries(self.uploads.records_root()) {
            let name = dir.file_name().unwrap_or_default().to_string_lossy();
            if !template_ids.contains(name.as_ref()) {
                remove(&dir, &mut done).await?;
            }
        }
        let named: HashSet<String> = entries(self.uploads.records_root())
            .iter()
            .flat_map(|dir| entries(dir))
            .filter_map(|record| std::fs::read_to_string(record).ok())
            .map(|digest| digest.trim().to_owned())
            .collect();
        for blob in entries(self.uploads.blobs_dir()) {
            let name = blob.file_name().unwrap_or_default().to_string_lossy();
            if !named.contains(name.as_ref()) {
                remove(&blob, &mut done).await?;
            }
        }
        remove(&self.templates_dir.join("uploads"), &mut done).await?;
        Ok(done)
    }
}

/// What the stores' templates, sandboxes and snapshots run on.
pub(super) struct InUse {
    /// Every root filesystem in use.
    pub rootfs: HashSet<PathBuf>,
    /// The layers under them.
    pub layers: HashSet<PathBuf>,
    /// `false` if a rootfs was mounted before its chain was recorded: then which layers it
    /// needs is unknown, and none may go.
    pub chains_known: bool,
}

impl Builder {
    pub(super) async fn in_use(&self, stores: &[&Store]) -> Result<InUse, BuildError> {
        let (mut templates, mut rootfs) = (Vec::new(), HashSet::new());
        for store in stores {
            templates.extend(store.templates().all().await?);
            rootfs.extend(store.sandboxes().all().await?.into_iter().map(|s| s.rootfs));
            rootfs.extend(store.snapshots().all().await?.into_iter().map(|s| s.rootfs));
        }
        // The layers under every rootfs in use: a template's are in its record; an older
        // build's (that a sandbox still runs on) were recorded when it was mounted.
        let mut layers: HashSet<PathBuf> =
            templates.iter().flat_map(|t| t.layers.clone()).collect();
        let mut chains_known = true;
        let named: HashSet<&PathBuf> = templates.iter().map(|t| &t.rootfs).collect();
        for fs in rootfs.iter().filter(|r| !named.contains(r)) {
            if !fs.starts_with(self.layers.mounts_dir()) {
                continue;
            }
            match self.layers.chain_of(fs) {
                Some(chain) => layers.extend(chain),
                None => chains_known = false,
            }
        }
        rootfs.extend(templates.iter().map(|t| t.rootfs.clone()));
        Ok(InUse {
            rootfs,
            layers,
            chains_known,
        })
    }
}

/// The directories (or files) in `dir`; none if it cannot be read.
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|e| e.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// What `path` takes on disk (0 for a mount point: its files are its layers').
async fn size_of(path: &Path) -> u64 {
    if is_mount_point(path) {
        return 0;
    }
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || crate::disk_usage::bytes_on_disk(&path).unwrap_or(0))
        .await
        .unwrap_or(0)
}

async fn remove(path: &Path, done: &mut Collected) -> Result<(), BuildError> {
    done.bytes += size_of(path).await;
    crate::walk::remove_path(path)
        .await
        .map_err(BuildError::io(format!("removing {}", path.display())))
}

fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}
