//! Templates' layers in object storage (`serve --object-store`), so that a template built on one
//! node starts on every other (issue 32).
//!
//! * **Publish.** A finished build puts each layer of its template that object storage lacks
//!   under `layers/{key}` (one `layer.tar` in an image of `objects.rs`: whole or absent), then
//!   the template's chain of layers under `rootfs/{mount name}.json`. Only then is the template
//!   recorded, so no node sees a template it cannot fetch.
//! * **Reuse in builds.** A layer's key is the hash of everything that made it (`run.rs`), so a
//!   build on any node takes a step's layer from object storage instead of running the step
//!   again: a new node "builds" the built-in templates by downloading them.
//! * **Fetch on first use.** A launch over a rootfs this node lacks fetches the chain's missing
//!   layers and mounts them ([`SharedLayers::prepare`]): the first sandbox of a template on a
//!   node pays the download, the next ones nothing.
//!
//! Layers are archived and unpacked by GNU tar, which keeps what overlayfs needs: whiteouts
//! (character devices 0/0), `trusted.overlay.*` xattrs (opaque directories), owners, modes,
//! capabilities and hard links. Every node keeps templates at the same path (records name
//! absolute paths), as the Kubernetes DaemonSet's host path does.

use super::layers::{is_mount_point, Layers};
use crate::archive::tar;
use crate::lifecycle::RootfsSource;
use crate::objects::{ImageObjects, CHAINS, LAYERS};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use tokio::process::Command;

/// The one file of a layer's image in object storage.
const LAYER_FILE: &str = "layer.tar";
/// What GNU tar keeps and restores beyond plain files (see the module's comment).
const TAR_KEEPS: [&str; 4] = [
    "--numeric-owner",
    "--xattrs",
    "--xattrs-include=*",
    "--sparse",
];

pub(super) fn layer_prefix(key: &str) -> String {
    format!("{LAYERS}/{key}")
}

pub(super) fn chain_object(mount_name: &str) -> String {
    format!("{CHAINS}/{mount_name}.json")
}

/// A template's rootfs mount in object storage: its layers' keys, bottom first.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Chain {
    pub layers: Vec<String>,
}

/// This node's layers, with object storage behind them once the server has one.
pub struct SharedLayers {
    pub(super) layers: Layers,
    pub(super) objects: OnceLock<ImageObjects>,
    /// One fetch at a time: two creates of a template this node lacks download it once. The
    /// layer budget's round holds it too (see `layer_budget.rs`).
    pub(super) fetching: tokio::sync::Mutex<()>,
    /// Which root filesystems were started over here, and when (for the layer budget).
    pub(super) uses: Mutex<RootfsUses>,
    /// What each layer here takes on disk, as measured once (a layer never changes).
    pub(super) sizes: Mutex<HashMap<String, u64>>,
    /// Layers object storage was found to hold (the layer budget asks once per layer).
    pub(super) known_stored: Mutex<HashSet<String>>,
}

/// When each root filesystem (a mount, or a template's one layer) was last made ready for a
/// launch here, and which the layer budget is letting go of right now.
#[derive(Default)]
pub(super) struct RootfsUses {
    pub last: HashMap<PathBuf, Instant>,
    /// A launch over one of these does not take it as present: it waits for the fetch turn,
    /// which the budget's round holds, and then finds it gone and fetches it again.
    pub retiring: HashSet<PathBuf>,
}

impl SharedLayers {
    pub fn new(templates_dir: &Path) -> Self {
        SharedLayers {
            layers: Layers::new(templates_dir),
            objects: OnceLock::new(),
            fetching: tokio::sync::Mutex::new(()),
            uses: Mutex::default(),
            sizes: Mutex::default(),
            known_stored: Mutex::default(),
        }
    }

    /// Notes that a launch over `rootfs` is being prepared now; false if the layer budget is
    /// letting go of it at this moment (the launch must then wait for it, see [`RootfsUses`]).
    pub(super) fn note_use(&self, rootfs: &Path) -> bool {
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        uses.last.insert(rootfs.to_owned(), Instant::now());
        !uses.retiring.contains(rootfs)
    }

    /// Shares layers through `objects` from now on (set once, at boot); false if set already.
    pub fn use_object_store(&self, objects: ImageObjects) -> bool {
        self.objects.set(objects).is_ok()
    }

    /// Puts what a template built here stands on into object storage, if the server has one:
    /// each layer of `chain` (bottom first) that is not there yet, then the chain under the
    /// name of its mount at `rootfs`.
    pub async fn publish(&self, chain: &[PathBuf], rootfs: &Path) -> Result<(), String> {
        let Some(objects) = self.objects.get() else {
            return Ok(());
        };
        let keys = chain
            .iter()
            .map(|layer| self.key_of(layer))
            .collect::<Result<Vec<_>, _>>()?;
        for key in &keys {
            let there = objects.has(&layer_prefix(key)).await;
            if !there.map_err(|e| e.to_string())? {
                self.upload_layer(objects, key).await?;
            }
        }
        if self.key_of(rootfs).is_ok() {
            // A rootfs that is a single layer is not a mount: it needs no chain.
            return Ok(());
        }
        let record = serde_json::to_vec(&Chain { layers: keys }).expect("a chain serializes");
        objects
            .put_small(&chain_object(&mount_name(rootfs)), record)
            .await
            .map_err(|e| e.to_string())
    }

    /// Takes layer `key` from object storage if this node lacks it: whether it is here now.
    pub async fn fetch_layer(&self, key: &str) -> Result<bool, String> {
        if self.layers.has(key) {
            return Ok(true);
        }
        let _turn = self.fetching.lock().await;
        self.fetch_locked(key).await
    }

    /// [`SharedLayers::fetch_layer`] with the fetch turn held.
    async fn fetch_locked(&self, key: &str) -> Result<bool, String> {
        let Some(objects) = self.objects.get() else {
            return Ok(self.layers.has(key));
        };
        if self.layers.has(key) {
            return Ok(true);
        }
        let prefix = layer_prefix(key);
        if !objects.has(&prefix).await.map_err(|e| e.to_string())? {
            return Ok(false);
        }
        let started = Instant::now();
        let work = self.work_dir("fetch", key)?;
        let fetched = async {
            let image = work.join("image");
            let bytes = objects
                .download(&prefix, &image)
                .await
                .map_err(|e| e.to_string())?;
            let root = work.join("root");
            std::fs::create_dir(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
            let mut untar = Command::new("tar");
            untar
                .arg("--extract")
                .arg("--file")
                .arg(image.join(LAYER_FILE))
                .arg("--directory")
                .arg(&root)
                .args(TAR_KEEPS)
                .args(["--same-permissions", "--same-owner"]);
            tar(untar, "unpacking a layer").await?;
            self.layers
                .keep_fetched(&root, key)
                .map_err(|e| format!("keeping layer {key}: {e}"))?;
            Ok::<_, String>(bytes)
        }
        .await;
        let _ = crate::walk::remove_path(&work).await;
        let bytes = fetched?;
        tracing::info!(layer = key, mib = bytes >> 20, elapsed = ?started.elapsed(), "fetched a layer from object storage");
        Ok(true)
    }

    async fn upload_layer(&self, objects: &ImageObjects, key: &str) -> Result<(), String> {
        let started = Instant::now();
        let work = self.work_dir("upload", key)?;
        let uploaded = async {
            let mut archive = Command::new("tar");
            archive
                .arg("--create")
                .arg("--file")
                .arg(work.join(LAYER_FILE))
                .arg("--directory")
                .arg(self.layers.layer(key))
                .args(TAR_KEEPS)
                .arg(".");
            tar(archive, "archiving a layer").await?;
            objects
                .upload(&layer_prefix(key), &work)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        let _ = crate::walk::remove_path(&work).await;
        let bytes = uploaded?;
        tracing::info!(layer = key, mib = bytes >> 20, elapsed = ?started.elapsed(), "put a layer in object storage");
        Ok(())
    }

    /// A fresh directory for one transfer, among the layers' work directories (which the next
    /// start sweeps if the server stops meanwhile).
    fn work_dir(&self, what: &str, key: &str) -> Result<PathBuf, String> {
        let dir = self
            .layers
            .layers_dir()
            .join(format!(".work-{what}-{key}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// The key of `layer`, which must be one of this node's layers.
    pub(super) fn key_of(&self, layer: &Path) -> Result<String, String> {
        match (layer.parent(), layer.file_name()) {
            (Some(dir), Some(name)) if dir == self.layers.layers_dir() => {
                Ok(name.to_string_lossy().into_owned())
            }
            _ => Err(format!(
                "{} is not a layer of this node's templates dir ({}): every node must keep \
                 templates at the same path (--templates-dir)",
                layer.display(),
                self.layers.layers_dir().display()
            )),
        }
    }

    /// The layers of the rootfs mount at `rootfs`: as this node mounted it before, or as
    /// object storage has it.
    async fn chain_of(&self, rootfs: &Path) -> Result<Vec<String>, String> {
        if let Some(chain) = self.layers.chain_of(rootfs) {
            return chain.iter().map(|l| self.key_of(l)).collect();
        }
        let Some(objects) = self.objects.get() else {
            return Err(format!(
                "{} is not on this node, and the server has no object store",
                rootfs.display()
            ));
        };
        let record = objects
            .get_small(&chain_object(&mount_name(rootfs)))
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "{} is neither on this node nor in object storage",
                    rootfs.display()
                )
            })?;
        let chain: Chain = serde_json::from_slice(&record)
            .map_err(|e| format!("the chain of {} is damaged: {e}", rootfs.display()))?;
        Ok(chain.layers)
    }
}

#[async_trait::async_trait]
impl RootfsSource for SharedLayers {
    /// A rootfs is a mount of layers (or, for a template with no layers of its own, one
    /// layer): fetches what this node lacks and mounts it.
    async fn prepare(&self, rootfs: &Path) -> Result<(), String> {
        // Noted first: the layer budget lets go of nothing used lately, and a use it missed
        // sees that it is being let go of.
        let settled = self.note_use(rootfs);
        if settled && is_mount_point(rootfs) {
            return Ok(());
        }
        if let Ok(key) = self.key_of(rootfs) {
            let here = match settled {
                true => self.fetch_layer(&key).await?,
                false => {
                    let _turn = self.fetching.lock().await;
                    self.fetch_locked(&key).await?
                }
            };
            return match here {
                true => Ok(()),
                false => Err(format!("layer {key} is not in object storage")),
            };
        }
        if rootfs.parent() != Some(self.layers.mounts_dir()) {
            if rootfs.is_dir() {
                // Not a template mount (a root filesystem from before layers): used as it is.
                return Ok(());
            }
            return Err(format!(
                "{} is not in this node's templates dir: every node must keep templates at the \
                 same path (--templates-dir)",
                rootfs.display()
            ));
        }
        let _turn = self.fetching.lock().await;
        if is_mount_point(rootfs) {
            return Ok(());
        }
        let keys = self.chain_of(rootfs).await?;
        for key in &keys {
            if !self.fetch_locked(key).await? {
                return Err(format!(
                    "layer {key} of {} is neither on this node nor in object storage",
                    rootfs.display()
                ));
            }
        }
        let chain: Vec<PathBuf> = keys.iter().map(|k| self.layers.layer(k)).collect();
        self.layers
            .mount_rootfs(&chain, rootfs)
            .await
            .map_err(|e| e.to_string())
    }
}

pub(super) fn mount_name(rootfs: &Path) -> String {
    rootfs
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::process::Command as Cmd;

    fn run(args: &[&str]) {
        let out = Cmd::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    }

    fn random_key() -> String {
        format!(
            "{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        )
    }

    /// Two layers as overlayfs writes them, in node A's templates dir: the upper one made
    /// through a real overlay mount, so that it holds a whiteout (a deleted file), an opaque
    /// directory (one removed and made again), a hard link, a symlink, a setuid file and a
    /// file of uid 1000.
    fn two_layers(templates: &Path, lower: &str, upper: &str) {
        let layers = Layers::new(templates);
        let (l, u) = (layers.layer(lower), layers.layer(upper));
        std::fs::create_dir_all(l.join("d")).unwrap();
        std::fs::write(l.join("d/old"), b"old").unwrap();
        std::fs::write(l.join("gone"), b"gone").unwrap();
        let (work, merged) = (templates.join("work"), templates.join("merged"));
        for d in [&u, &work, &merged] {
            std::fs::create_dir_all(d).unwrap();
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            l.display(),
            u.display(),
            work.display()
        );
        let target = merged.to_str().unwrap();
        run(&["mount", "-t", "overlay", "overlay", "-o", &options, target]);
        std::fs::remove_file(merged.join("gone")).unwrap();
        std::fs::remove_dir_all(merged.join("d")).unwrap();
        std::fs::create_dir(merged.join("d")).unwrap();
        std::fs::write(merged.join("d/new"), b"new").unwrap();
        std::fs::write(merged.join("suid"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(merged.join("suid"), PermissionsExt::from_mode(0o4755)).unwrap();
        std::fs::hard_link(merged.join("suid"), merged.join("suid-link")).unwrap();
        std::os::unix::fs::symlink("d/new", merged.join("sym")).unwrap();
        std::fs::write(merged.join("users"), b"x").unwrap();
        std::os::unix::fs::chown(merged.join("users"), Some(1000), Some(1000)).unwrap();
        run(&["umount", target]);
    }

    /// A template's two layers, published by node A, are fetched and mounted by node B, whose
    /// templates dir has never seen them, and B's rootfs shows what A's does: the whiteout
    /// hides the deleted file, the opaque directory hides the lower one's files, and links,
    /// modes and owners are as they were. Needs root (overlay mounts, whiteouts) and the S3
    /// server ./test.sh starts.
    #[tokio::test]
    #[ignore = "needs root and an S3 server at AIRLOCK_TEST_S3_URL; ./test.sh runs it"]
    async fn s3_layers_built_on_one_node_start_on_another() {
        let url = std::env::var("AIRLOCK_TEST_S3_URL").unwrap();
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let (dir_a, dir_b) = (tmp.path().join("a"), tmp.path().join("b"));
        let (lower, upper) = (random_key(), random_key());
        two_layers(&dir_a, &lower, &upper);

        let node_a = SharedLayers::new(&dir_a);
        let node_b = SharedLayers::new(&dir_b);
        // Without an object store, B cannot make the rootfs: the probe sees a missing one.
        let rootfs_b = Layers::new(&dir_b).rootfs_mount("tpl", &upper);
        let alone = node_b.prepare(&rootfs_b).await.unwrap_err();
        assert!(alone.contains("no object store"), "{alone}");
        for node in [&node_a, &node_b] {
            assert!(node.use_object_store(ImageObjects::open(&url).unwrap()));
        }
        let a = Layers::new(&dir_a);
        let chain = [a.layer(&lower), a.layer(&upper)];
        let rootfs_a = a.rootfs_mount("tpl", &upper);
        node_a.publish(&chain, &rootfs_a).await.unwrap();

        node_b.prepare(&rootfs_b).await.unwrap();
        assert!(is_mount_point(&rootfs_b));
        let seen = std::panic::catch_unwind(|| {
            let r = &rootfs_b;
            assert!(
                !r.join("gone").exists(),
                "the whiteout hides the lower file"
            );
            let d: Vec<_> = std::fs::read_dir(r.join("d")).unwrap().collect();
            assert_eq!(
                d.len(),
                1,
                "the opaque directory hides the lower one's files"
            );
            assert_eq!(std::fs::read(r.join("d/new")).unwrap(), b"new");
            let suid = std::fs::metadata(r.join("suid")).unwrap();
            assert_eq!(suid.mode() & 0o7777, 0o4755);
            assert_eq!(suid.nlink(), 2, "the hard link is one");
            assert_eq!(
                std::fs::read_link(r.join("sym")).unwrap(),
                Path::new("d/new")
            );
            let users = std::fs::metadata(r.join("users")).unwrap();
            assert_eq!((users.uid(), users.gid()), (1000, 1000));
        });
        // Prepared again: mounted already, nothing fetched.
        node_b.prepare(&rootfs_b).await.unwrap();
        run(&["umount", rootfs_b.to_str().unwrap()]);
        seen.unwrap();
        // A layer nobody published is not there.
        assert!(!node_b.fetch_layer(&random_key()).await.unwrap());
    }
}
