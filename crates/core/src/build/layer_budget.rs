//! A node's templates' files within a size budget (`serve --layer-cache-mb`), when layers are
//! shared through object storage (issue 32). A node of a cluster fetches the layers of every
//! template it starts; without a budget it would keep them all, for good. Every minute, once the
//! layers here take more than the budget, the node lets go of what it can fetch again:
//!
//! 1. layers that no mounted root filesystem stands on (an old build's, a deleted template's, a
//!    build's cached step fetched for reuse);
//! 2. then the root filesystems started over least recently (those not started over since the
//!    server started first): each is unmounted, with the layers that only it stood on.
//!
//! Only a layer that object storage holds goes: one on this node alone is the only copy there
//! is. A template let go of is fetched again at its next start here, as on a new node; its
//! golden image stays, since the same layers mounted at the same path are the same files.
//!
//! Nothing goes that is in use:
//! - a root filesystem that a sandbox here stands on, from its launch until its destroy is done
//!   (the driver's [`crate::driver::Driver::rootfs_in_use`]: running, paused in memory, pooled,
//!   booting a golden image);
//! - one made ready for a launch in the last [`SPARED_FOR`] (a launch between that check and
//!   its runtime);
//! - anything while a build waits or runs, or a fetch is under way: the round is skipped.
//!
//! The driver's word is what protects a sandbox: `umount` does not refuse a rootfs that
//! sandboxes stand on (measured: a template's mount came off with six sandboxes running on it,
//! which ran on, while its layers would have gone from under them). It does refuse one that a
//! process on the host holds open, which then stays too.

use super::layers::is_mount_point;
use super::shared_layers::{layer_prefix, SharedLayers};
use super::Builder;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long a root filesystem made ready for a launch is spared: far longer than a launch waits
/// for its turn and its agent.
pub const SPARED_FOR: Duration = Duration::from_secs(600);

/// How often the budget is checked.
const ROUND: Duration = Duration::from_secs(60);

/// What one round let go of.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    pub mounts: usize,
    pub layers: usize,
    pub bytes: u64,
}

/// What a round must not let go of, besides what it finds busy.
pub struct Spared {
    /// The root filesystems sandboxes here stand on.
    pub in_use: HashSet<PathBuf>,
    /// Root filesystems made ready for a launch within this long are spared too.
    pub used_within: Duration,
}

impl Builder {
    /// Keeps this node's layers within `budget_bytes`, checked every minute until `stop`.
    pub async fn run_layer_budget(self: Arc<Self>, budget_bytes: u64, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ROUND) => {}
            }
            self.tend_layer_budget(budget_bytes).await;
        }
    }

    /// One round of the budget; skipped while a build waits or runs. What takes time (sizing
    /// new layers, asking object storage) is done before anything is held.
    pub async fn tend_layer_budget(&self, budget_bytes: u64) -> Option<Trimmed> {
        let survey = self.shared.survey(budget_bytes).await?;
        let Ok(_no_build) = self.builds_under_way.try_write() else {
            return None;
        };
        let spared = Spared {
            in_use: self.driver.rootfs_in_use().into_iter().collect(),
            used_within: SPARED_FOR,
        };
        let trimmed = self.shared.trim(&survey, &spared).await?;
        if trimmed.bytes > 0 {
            tracing::info!(
                mounts = trimmed.mounts,
                layers = trimmed.layers,
                freed_mb = trimmed.bytes >> 20,
                budget_mb = budget_bytes >> 20,
                "let go of templates' files that object storage holds, least recently used \
                 first: this node's layers were over their budget (--layer-cache-mb)"
            );
        }
        Some(trimmed)
    }
}

/// What a round found before it holds anything: the layers here and what each takes, and
/// (if they are over the budget) which of them object storage holds.
pub struct Survey {
    budget: u64,
    sizes: HashMap<String, u64>,
    stored: HashSet<String>,
}

/// A rootfs mount here, with the layers it stands on.
struct Mount {
    path: PathBuf,
    chain: Vec<PathBuf>,
    last_use: Option<Instant>,
}

impl SharedLayers {
    /// The layers here with what each takes, and, if they are over `budget`, which of them
    /// object storage holds (a layer known to be there is not asked about again). `None`
    /// without an object store, or when it does not answer.
    pub async fn survey(&self, budget: u64) -> Option<Survey> {
        let objects = self.objects.get()?;
        let sizes = self.layer_sizes().await;
        let mut stored = HashSet::new();
        if sizes.values().sum::<u64>() > budget {
            let known = (self.known_stored.lock().unwrap_or_else(|e| e.into_inner())).clone();
            for key in sizes.keys() {
                if known.contains(key) {
                    stored.insert(key.clone());
                    continue;
                }
                match objects.has(&layer_prefix(key)).await {
                    Ok(true) => {
                        stored.insert(key.clone());
                        let mut known = self.known_stored.lock().unwrap_or_else(|e| e.into_inner());
                        known.insert(key.clone());
                    }
                    Ok(false) => {} // the only copy there is
                    Err(e) => {
                        tracing::warn!(error = %e, "object storage does not answer; the layer budget waits for the next round");
                        return None;
                    }
                }
            }
        }
        Some(Survey {
            budget,
            sizes,
            stored,
        })
    }

    /// Lets go of layers and mounts, least recently used first, until this node's layers take
    /// at most the survey's budget or nothing more may go. `None` if the round could not run:
    /// a fetch under way, or a mount whose layers are unknown.
    pub async fn trim(&self, survey: &Survey, spared: &Spared) -> Option<Trimmed> {
        let _turn = self.fetching.try_lock().ok()?;
        let started = Instant::now();
        let (budget, sizes) = (survey.budget, &survey.sizes);
        let mut total: u64 = sizes.values().sum();
        let mut done = Trimmed::default();
        if total <= budget {
            return Some(done);
        }
        let (mut candidates, mut staying) = self.mounts(spared, started)?;
        // Least recently used last, so that it is popped first.
        candidates.sort_by(|a, b| b.last_use.cmp(&a.last_use).then(b.path.cmp(&a.path)));
        let mut keys: Vec<&String> = sizes.keys().collect();
        keys.sort();
        loop {
            let standing: HashSet<&PathBuf> = (candidates.iter().chain(&staying))
                .flat_map(|m| &m.chain)
                .collect();
            for key in &keys {
                if total <= budget {
                    return Some(done);
                }
                let layer = self.layers.layer(key);
                let loose = !standing.contains(&layer) && layer.is_dir();
                if !loose || self.is_spared(&layer, spared, started) {
                    continue;
                }
                if !survey.stored.contains(*key) || !self.retire(&layer, started) {
                    continue;
                }
                let removed = self.remove_layer(key).await;
                self.settle(&layer);
                if removed {
                    let bytes = sizes[*key];
                    total = total.saturating_sub(bytes);
                    done.layers += 1;
                    done.bytes += bytes;
                }
            }
            // The least recently used mount goes next; its layers are loose then, unless
            // another mount stands on them too.
            let Some(mount) = candidates.pop() else {
                return Some(done);
            };
            if !self.retire(&mount.path, started) {
                staying.push(mount);
                continue;
            }
            let unmounted = self.layers.unmount_if_idle(&mount.path).await;
            self.settle(&mount.path);
            match unmounted {
                Ok(true) => done.mounts += 1,
                Ok(false) => {
                    // A process on the host holds it open: it stays, and so do its layers.
                    tracing::info!(rootfs = %mount.path.display(), "a template's rootfs over the layer budget is busy; kept");
                    staying.push(mount);
                }
                Err(e) => {
                    tracing::warn!(rootfs = %mount.path.display(), error = %e, "unmounting a template's rootfs failed");
                    return Some(done);
                }
            }
        }
    }

    /// The rootfs mounts here: those that may go (with their last use), and those that stay.
    /// `None` if a mount's layers are unknown (mounted before Airlock recorded them): then no
    /// layer is known to be free.
    fn mounts(&self, spared: &Spared, now: Instant) -> Option<(Vec<Mount>, Vec<Mount>)> {
        let entries = std::fs::read_dir(self.layers.mounts_dir()).ok();
        let (mut may_go, mut stay) = (Vec::new(), Vec::new());
        for path in entries.into_iter().flatten().flatten().map(|e| e.path()) {
            if !is_mount_point(&path) {
                continue;
            }
            let Some(chain) = self.layers.chain_of(&path) else {
                tracing::warn!(rootfs = %path.display(), "a template's rootfs was mounted before Airlock recorded its layers; none is let go of for the layer budget");
                return None;
            };
            let last_use = self.last_use(&path);
            let mount = Mount {
                path,
                chain,
                last_use,
            };
            match self.is_spared(&mount.path, spared, now) {
                true => stay.push(mount),
                false => may_go.push(mount),
            }
        }
        Some((may_go, stay))
    }

    fn last_use(&self, rootfs: &Path) -> Option<Instant> {
        let uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        uses.last.get(rootfs).copied()
    }

    /// Whether `rootfs` (a mount, or a layer as a template's whole rootfs) stays this round.
    fn is_spared(&self, rootfs: &Path, spared: &Spared, now: Instant) -> bool {
        spared.in_use.contains(rootfs)
            || self
                .last_use(rootfs)
                .is_some_and(|used| now.saturating_duration_since(used) < spared.used_within)
    }

    /// Marks `rootfs` as being let go of, unless a launch made it ready since the round began
    /// at `round`: from now on, a launch over it waits for the round (see `RootfsUses`).
    fn retire(&self, rootfs: &Path, round: Instant) -> bool {
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        if uses.last.get(rootfs).is_some_and(|used| *used >= round) {
            return false;
        }
        uses.retiring.insert(rootfs.to_owned())
    }

    /// Ends [`SharedLayers::retire`]: launches take `rootfs` as they find it again. Its last
    /// use stays noted: a launch that waited meanwhile noted one, and is not yet under way.
    fn settle(&self, rootfs: &Path) {
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        uses.retiring.remove(rootfs);
    }

    async fn remove_layer(&self, key: &str) -> bool {
        let removed = match self.layers.set_aside(&self.layers.layer(key)) {
            Ok(aside) => self
                .layers
                .remove_aside(&aside)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match removed {
            Ok(()) => {
                self.sizes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(key);
                true
            }
            Err(e) => {
                tracing::warn!(layer = key, error = %e, "letting go of a layer failed");
                false
            }
        }
    }

    /// Every layer here by key, with what it takes on disk: measured once per layer, off the
    /// async workers (a layer never changes).
    async fn layer_sizes(&self) -> HashMap<String, u64> {
        let keys: Vec<String> = std::fs::read_dir(self.layers.layers_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .collect();
        let known = self.sizes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut sizes = HashMap::new();
        for key in keys {
            let bytes = match known.get(&key) {
                Some(bytes) => *bytes,
                None => {
                    let layer = self.layers.layer(&key);
                    let measured = tokio::task::spawn_blocking(move || {
                        crate::disk_usage::bytes_on_disk(&layer).unwrap_or(0)
                    });
                    measured.await.unwrap_or(0)
                }
            };
            sizes.insert(key, bytes);
        }
        *self.sizes.lock().unwrap_or_else(|e| e.into_inner()) = sizes.clone();
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::super::layers::Layers;
    use super::*;
    use crate::objects::ImageObjects;

    fn random_key() -> String {
        format!(
            "{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        )
    }

    /// A layer of 1 MiB at `key` in `templates`, holding a file named after it.
    fn layer(templates: &Path, key: &str) {
        let dir = Layers::new(templates).layer(key);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("from-{key}")), vec![7u8; 1 << 20]).unwrap();
    }

    /// One round as `Builder::tend_layer_budget` runs it: the survey, then the trim.
    async fn trim(node: &SharedLayers, budget: u64, spared: &Spared) -> Option<Trimmed> {
        let survey = node.survey(budget).await?;
        node.trim(&survey, spared).await
    }

    fn spared(in_use: &[&Path], used_within: Duration) -> Spared {
        Spared {
            in_use: in_use.iter().map(|p| p.to_path_buf()).collect(),
            used_within,
        }
    }

    /// A launch over a rootfs that a round is letting go of does not take it as present, and
    /// a rootfs made ready after the round began is not let go of.
    #[test]
    fn a_rootfs_being_let_go_of_is_not_taken_as_present() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = SharedLayers::new(tmp.path());
        let (old, fresh) = (tmp.path().join("old"), tmp.path().join("fresh"));
        assert!(shared.note_use(&old));
        let round = Instant::now();
        assert!(shared.note_use(&fresh));
        assert!(shared.retire(&old, round));
        assert!(
            !shared.note_use(&old),
            "a launch meanwhile waits for the round"
        );
        assert!(
            !shared.retire(&fresh, round),
            "made ready since the round began"
        );
        shared.settle(&old);
        assert!(shared.note_use(&old));
    }

    /// Node B fetches two templates from object storage that share their bottom layer, and has
    /// a layer of its own that object storage lacks. Over the budget, the template no sandbox
    /// stands on is unmounted with the layer only it stood on; the shared layer, the other
    /// template and the only copy of a layer stay; the template is fetched again at its next
    /// start. A mount a process here holds open stays, and nothing goes while a fetch runs or
    /// while everything was used lately. Needs root (overlay mounts) and the S3 server
    /// ./test.sh starts.
    #[tokio::test]
    #[ignore = "needs root and an S3 server at AIRLOCK_TEST_S3_URL; ./test.sh runs it"]
    async fn s3_layers_over_their_budget_go_least_recently_used_first() {
        let url = std::env::var("AIRLOCK_TEST_S3_URL").unwrap();
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let (dir_a, dir_b) = (tmp.path().join("a"), tmp.path().join("b"));
        let [bottom, first, second, only_here] = [(); 4].map(|()| random_key());
        for key in [&bottom, &first, &second] {
            layer(&dir_a, key);
        }
        layer(&dir_b, &only_here);
        let node_a = SharedLayers::new(&dir_a);
        let node_b = SharedLayers::new(&dir_b);
        for node in [&node_a, &node_b] {
            assert!(node.use_object_store(ImageObjects::open(&url).unwrap()));
        }
        let (a, b) = (Layers::new(&dir_a), Layers::new(&dir_b));
        for (name, top) in [("t1", &first), ("t2", &second)] {
            let chain = [a.layer(&bottom), a.layer(top)];
            node_a
                .publish(&chain, &a.rootfs_mount(name, top))
                .await
                .unwrap();
        }
        let (t1, t2) = (b.rootfs_mount("t1", &first), b.rootfs_mount("t2", &second));
        let _unmount = Unmount(vec![t1.clone(), t2.clone()]);
        use crate::lifecycle::RootfsSource;
        node_b.prepare(&t1).await.unwrap();
        node_b.prepare(&t2).await.unwrap();

        let no_spare = Duration::ZERO;
        assert_eq!(
            trim(&node_b, u64::MAX, &spared(&[], no_spare)).await,
            Some(Trimmed::default()),
            "within the budget"
        );
        assert_eq!(
            trim(&node_b, 0, &spared(&[], SPARED_FOR)).await,
            Some(Trimmed::default()),
            "both were started over just now"
        );
        {
            let _fetch = node_b.fetching.lock().await;
            assert_eq!(trim(&node_b, 0, &spared(&[], no_spare)).await, None);
        }
        assert!(is_mount_point(&t1) && is_mount_point(&t2));

        let trimmed = trim(&node_b, 0, &spared(&[&t1], no_spare)).await.unwrap();
        assert_eq!((trimmed.mounts, trimmed.layers), (1, 1), "{trimmed:?}");
        assert!(is_mount_point(&t1) && !is_mount_point(&t2));
        assert!(!b.has(&second), "the layer only t2 stood on goes");
        assert!(b.has(&bottom) && b.has(&first), "t1's layers stay");
        assert!(b.has(&only_here), "the only copy stays");

        node_b.prepare(&t2).await.unwrap();
        assert!(
            t2.join(format!("from-{second}")).is_file(),
            "t2 fetched again"
        );
        // The positive control: held open, t2 stays, and so does what it stands on; t1,
        // idle, goes now.
        let _open = std::fs::File::open(t2.join(format!("from-{bottom}"))).unwrap();
        let trimmed = trim(&node_b, 0, &spared(&[], no_spare)).await.unwrap();
        assert_eq!((trimmed.mounts, trimmed.layers), (1, 1), "{trimmed:?}");
        assert!(!is_mount_point(&t1) && is_mount_point(&t2));
        assert!(!b.has(&first) && b.has(&bottom) && b.has(&second));
    }

    /// Unmounts the test's mounts however it ends.
    struct Unmount(Vec<PathBuf>);

    impl Drop for Unmount {
        fn drop(&mut self) {
            for mount in &self.0 {
                let _ = std::process::Command::new("umount")
                    .arg(mount)
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
}
