//! Collecting object storage (`serve --object-store`): once a day, one node deletes what no
//! record names any more and nobody wrote for a day ([`UNUSED_FOR`]):
//! - templates' layers (`layers/{key}`) that no template, sandbox or snapshot stands on, and
//!   the chains (`rootfs/{mount}.json`) of root filesystems that none of them uses;
//! - paused images (`paused/{id}/{generation}`) that no paused sandbox names (a kill or a
//!   resume whose delete failed, or an earlier pause's);
//! - snapshot images (`snapshots/{image}`) that no snapshot names;
//! - volumes' archives (`volumes/{id}/{generation}`) that no volume moving between nodes names
//!   (a take-in whose delete failed).
//!
//! Why it is safe:
//! - A build that finds a layer already in object storage skips its upload and then records a
//!   template that stands on it. So builds hold the store's objects lock shared from before
//!   they look until their template is recorded, and a collection runs only while it holds
//!   that lock alone (on PostgreSQL an advisory lock: across every node).
//! - Paused and snapshot images are uploaded before their records are written: the day's
//!   grace covers those in flight (and anything a node of an older release writes).
//! - A bucket two databases share would lose each other's objects, so the bucket is marked
//!   with the database that first used it ([`Builder::claim_object_store`]); a server on
//!   another database marks it shared, and then nobody collects it.
//! - One node a day: the turn is taken in the database ([`crate::store::Settings`]).

use super::shared_layers::{chain_object, layer_prefix, mount_name, Chain, SharedLayers};
use super::Builder;
use crate::objects::{ImageObjects, Listed, CHAINS, LAYERS, PAUSED, SNAPSHOTS};
use crate::store::Store;
use crate::volumes::VOLUMES;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What nobody wrote for this long, and no record names, is collected.
pub const UNUSED_FOR: Duration = Duration::from_secs(24 * 3600);

/// How often a node asks whether the day's collection is due.
const ASK_EVERY: Duration = Duration::from_secs(3600);

/// The object that says whose the bucket is.
const OWNER: &str = "airlock-owner.json";

/// Whether a collection takes the day's turn first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Once a day, one node of the cluster.
    Daily,
    /// Now (tests).
    Now,
}

/// What [`OWNER`] holds: the identity of the database whose bucket it is, or that several
/// databases share it.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
enum Owner {
    Database(String),
    Shared,
}

/// What a collection deleted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ObjectsCollected {
    pub layers: usize,
    pub chains: usize,
    pub paused: usize,
    pub snapshots: usize,
    pub volumes: usize,
}

/// Why a collection did not run.
#[derive(Debug, thiserror::Error)]
pub enum NotCollected {
    #[error("the server has no object store")]
    NoObjectStore,
    #[error("the bucket is not this database's alone ({OWNER} says so): nothing is collected")]
    NotOurs,
    #[error("a build is putting layers in object storage, or another node is collecting")]
    Busy,
    #[error("a node collected object storage less than a day ago")]
    NotDue,
    #[error("{0}")]
    Failed(String),
}

impl NotCollected {
    fn failed(e: impl std::fmt::Display) -> Self {
        NotCollected::Failed(e.to_string())
    }
}

impl Builder {
    /// Marks the object store as this database's if it is nobody's yet, or as shared if it is
    /// another's (then no server collects it). Called at start.
    pub async fn claim_object_store(&self) -> Result<(), NotCollected> {
        self.shared.claim_store(&self.store).await
    }

    /// Collects object storage once a day (one node of the cluster), until `stop`.
    pub async fn run_object_collection(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ASK_EVERY) => {}
            }
            match self
                .shared
                .collect(&self.store, UNUSED_FOR, Turn::Daily)
                .await
            {
                Ok(done) => tracing::info!(
                    layers = done.layers,
                    chains = done.chains,
                    paused = done.paused,
                    snapshots = done.snapshots,
                    volumes = done.volumes,
                    "collected object storage: what no record names and nobody wrote for a day"
                ),
                Err(NotCollected::NotDue | NotCollected::Busy) => {}
                Err(e) => tracing::warn!(error = %e, "object storage was not collected"),
            }
        }
    }
}

impl SharedLayers {
    /// See [`Builder::claim_object_store`].
    pub async fn claim_store(&self, store: &Store) -> Result<(), NotCollected> {
        let (objects, ours) = self.store_and_owner(store).await?;
        match read_owner(objects).await? {
            Some(owner) if owner == ours || owner == Owner::Shared => Ok(()),
            Some(_) => {
                tracing::warn!(store = %objects, "another Airlock database uses this object store too: it is marked shared, and nothing in it is collected any more (give each cluster a bucket or prefix of its own)");
                write_owner(objects, &Owner::Shared).await
            }
            None => write_owner(objects, &ours).await,
        }
    }

    /// Deletes from object storage what no record of `store` names and was last written
    /// `unused_for` ago or longer (see the module's comment). With [`Turn::Daily`], only if
    /// no node did so in the last day, once the lock is held (a round that could not run
    /// leaves the turn to the next).
    pub async fn collect(
        &self,
        store: &Store,
        unused_for: Duration,
        turn: Turn,
    ) -> Result<ObjectsCollected, NotCollected> {
        let (objects, ours) = self.store_and_owner(store).await?;
        if read_owner(objects).await? != Some(ours) {
            return Err(NotCollected::NotOurs);
        }
        let lock = store.objects_lock().try_alone().await;
        let _alone = lock
            .map_err(NotCollected::failed)?
            .ok_or(NotCollected::Busy)?;
        if turn == Turn::Daily {
            let now = chrono::Utc::now().timestamp();
            let due_before = now - UNUSED_FOR.as_secs() as i64;
            let settings = store.settings();
            let taken = settings.take_collection_turn(due_before, now).await;
            if !taken.map_err(NotCollected::failed)? {
                return Err(NotCollected::NotDue);
            }
        }
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(unused_for).map_err(NotCollected::failed)?;
        let named = self.named_objects(store, objects).await?;
        let mut done = ObjectsCollected::default();
        for (folder, depth, count) in [
            (LAYERS, 1, &mut done.layers),
            (PAUSED, 2, &mut done.paused),
            (SNAPSHOTS, 1, &mut done.snapshots),
            (VOLUMES, 2, &mut done.volumes),
        ] {
            let listed = objects
                .listing(folder)
                .await
                .map_err(NotCollected::failed)?;
            for (prefix, newest) in images(&listed, depth) {
                let keep = newest > cutoff || named.contains(&prefix);
                // Layers whose sandboxes' chains are unknown stay, every one.
                if keep || (folder == LAYERS && !named.layers_known) {
                    continue;
                }
                objects
                    .delete(&prefix)
                    .await
                    .map_err(NotCollected::failed)?;
                *count += 1;
            }
        }
        let chains = objects
            .listing(CHAINS)
            .await
            .map_err(NotCollected::failed)?;
        for chain in chains {
            if chain.modified > cutoff || named.contains(&chain.path) || !named.layers_known {
                continue;
            }
            objects
                .delete_small(&chain.path)
                .await
                .map_err(NotCollected::failed)?;
            done.chains += 1;
        }
        Ok(done)
    }

    /// The object store, and the owner that `store`'s database would be of it.
    async fn store_and_owner(&self, store: &Store) -> Result<(&ImageObjects, Owner), NotCollected> {
        let objects = self.objects.get().ok_or(NotCollected::NoObjectStore)?;
        let identity = store.settings().identity().await;
        Ok((
            objects,
            Owner::Database(identity.map_err(NotCollected::failed)?),
        ))
    }

    /// Every object that a record names, directly or through a chain of layers.
    async fn named_objects(
        &self,
        store: &Store,
        objects: &ImageObjects,
    ) -> Result<Named, NotCollected> {
        let failed = NotCollected::failed;
        let mut named = Named {
            prefixes: HashSet::new(),
            layers_known: true,
        };
        let templates = store.templates().all().await.map_err(failed)?;
        let (sandboxes, snapshots) = (
            store.sandboxes().all().await.map_err(failed)?,
            store.snapshots().all().await.map_err(failed)?,
        );
        for template in &templates {
            for layer in template.layers.iter().chain([&template.rootfs]) {
                if let Ok(key) = self.key_of(layer) {
                    named.prefixes.insert(layer_prefix(&key));
                }
            }
            named.name_chain(&template.rootfs);
        }
        let of_templates: HashSet<&Path> = templates.iter().map(|t| t.rootfs.as_path()).collect();
        let mut rootfs: HashSet<&Path> = HashSet::new();
        rootfs.extend(sandboxes.iter().map(|s| s.rootfs.as_path()));
        rootfs.extend(snapshots.iter().map(|s| s.rootfs.as_path()));
        // A sandbox's or snapshot's rootfs that no template names any more (a deleted one's,
        // an older build's) stands on the layers its chain in object storage names.
        for fs in rootfs.into_iter().filter(|fs| !of_templates.contains(fs)) {
            if let Ok(key) = self.key_of(fs) {
                named.prefixes.insert(layer_prefix(&key));
                continue;
            }
            named.name_chain(fs);
            let record = objects.get_small(&chain_object(&mount_name(fs))).await;
            match record
                .map_err(NotCollected::failed)?
                .map(|r| serde_json::from_slice::<Chain>(&r))
            {
                Some(Ok(chain)) => named
                    .prefixes
                    .extend(chain.layers.iter().map(|key| layer_prefix(key))),
                _ => {
                    tracing::warn!(rootfs = %fs.display(), "a sandbox's or snapshot's root filesystem has no chain in object storage: no layer is collected");
                    named.layers_known = false;
                }
            }
        }
        let paused = store.paused_images().all().await.map_err(failed)?;
        named.prefixes.extend(paused);
        let volumes = store.volumes().all_stored().await.map_err(failed)?;
        named.prefixes.extend(volumes);
        named
            .prefixes
            .extend((snapshots.iter()).map(|s| crate::objects::snapshot_prefix(&s.image)));
        Ok(named)
    }
}

/// What records name in object storage.
struct Named {
    /// Images' prefixes (`layers/{key}`, `paused/{id}/{generation}`, `snapshots/{image}`) and
    /// chains' objects (`rootfs/{mount}.json`).
    prefixes: HashSet<String>,
    /// False if a rootfs in use has no known chain: then no layer may go.
    layers_known: bool,
}

impl Named {
    fn contains(&self, prefix: &str) -> bool {
        self.prefixes.contains(prefix)
    }

    fn name_chain(&mut self, rootfs: &Path) {
        self.prefixes.insert(chain_object(&mount_name(rootfs)));
    }
}

/// The images among `listed` (each the objects under one prefix `depth` folders below its
/// folder: `layers/{key}` is 1, `paused/{id}/{generation}` 2), with when the newest of their
/// objects was written.
fn images(listed: &[Listed], depth: usize) -> BTreeMap<String, chrono::DateTime<chrono::Utc>> {
    let mut images: BTreeMap<String, chrono::DateTime<chrono::Utc>> = BTreeMap::new();
    for object in listed {
        let parts: Vec<&str> = object.path.split('/').collect();
        if parts.len() <= depth + 1 {
            continue; // not inside an image
        }
        let prefix = parts[..=depth].join("/");
        let newest = images.entry(prefix).or_insert(object.modified);
        *newest = (*newest).max(object.modified);
    }
    images
}

async fn read_owner(objects: &ImageObjects) -> Result<Option<Owner>, NotCollected> {
    let record = objects
        .get_small(OWNER)
        .await
        .map_err(NotCollected::failed)?;
    match record.map(|r| serde_json::from_slice::<Owner>(&r)) {
        None => Ok(None),
        Some(Ok(owner)) => Ok(Some(owner)),
        // Not ours to read: someone else's, so shared.
        Some(Err(_)) => Ok(Some(Owner::Shared)),
    }
}

async fn write_owner(objects: &ImageObjects, owner: &Owner) -> Result<(), NotCollected> {
    let record = serde_json::to_vec(owner).expect("an owner serializes");
    objects
        .put_small(OWNER, record)
        .await
        .map_err(NotCollected::failed)
}

#[cfg(test)]
mod tests {
    use super::super::layers::Layers;
    use super::*;
    use crate::ids::{SandboxId, TemplateName};
    use crate::store::{SnapshotRecord, TemplateRecord};

    /// The test S3 server's bucket, under a prefix of this test's own: the bucket is shared.
    fn own_prefix(url: &str) -> ImageObjects {
        let mut url = url::Url::parse(url).unwrap();
        url.set_path(&format!("/collect-{:016x}", rand::random::<u64>()));
        ImageObjects::open(url.as_str()).unwrap()
    }

    /// A small image of one file in a fresh directory.
    async fn upload(objects: &ImageObjects, prefix: &str) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("checkpoint.img"), b"pages").unwrap();
        objects.upload(prefix, dir.path()).await.unwrap();
    }

    /// A template's layers and chain, a snapshot's of a template deleted since, and those of
    /// a template never recorded; paused and snapshot images named by records and not. A
    /// collection deletes what no record names, and nothing while it is fresh, while a build
    /// holds the lock, or once the bucket is another database's. Needs the S3 server
    /// ./test.sh starts.
    #[tokio::test]
    #[ignore = "needs an S3 server at AIRLOCK_TEST_S3_URL; ./test.sh runs it"]
    async fn s3_objects_no_record_names_are_collected() {
        let url = std::env::var("AIRLOCK_TEST_S3_URL").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("db")).unwrap();
        let shared = SharedLayers::new(&tmp.path().join("templates"));
        let layers = Layers::new(&tmp.path().join("templates"));
        let objects = own_prefix(&url);
        assert!(shared.use_object_store(objects.clone()));
        shared.claim_store(&store).await.unwrap();

        let [base, kept, old, orphan] = ["base", "kept", "old", "orphan"].map(|k| {
            let dir = layers.layer(k);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(k), k).unwrap();
            dir
        });
        let mut mounts = Vec::new();
        for (name, top) in [("t", &kept), ("gone", &old), ("never", &orphan)] {
            let mount = layers.rootfs_mount(name, &top.file_name().unwrap().to_string_lossy());
            shared
                .publish(&[base.clone(), top.clone()], &mount)
                .await
                .unwrap();
            mounts.push(mount);
        }
        store
            .templates()
            .put(&TemplateRecord {
                name: TemplateName::parse("t").unwrap(),
                content_hash: "h".into(),
                rootfs: mounts[0].clone(),
                built_at: 1,
                size_bytes: 1,
                layers: vec![base.clone(), kept.clone()],
                defaults: Default::default(),
            })
            .await
            .unwrap();
        // A snapshot of a sandbox of a template deleted since: its rootfs is `gone`.
        let snapshot = SnapshotRecord {
            id: TemplateName::parse("snap").unwrap(),
            image: "snapshot-k-snap-1".into(),
            template: TemplateName::parse("gone").unwrap(),
            rootfs: mounts[1].clone(),
            source_sandbox: SandboxId::generate(),
            access_token: None,
            created_at: 1,
            owner: "k".into(),
            size_bytes: 1,
            volume_mounts: Vec::new(),
        };
        store.snapshots().put(&snapshot).await.unwrap();
        let paused = SandboxId::generate();
        let (named_pause, stale_pause) = (
            crate::objects::paused_prefix(&paused, "2"),
            crate::objects::paused_prefix(&paused, "1"),
        );
        store
            .paused_images()
            .put(&paused, &named_pause, 5)
            .await
            .unwrap();
        let named_snapshot = crate::objects::snapshot_prefix(&snapshot.image);
        let stale_snapshot = crate::objects::snapshot_prefix("snapshot-k-deleted-2");
        // A volume waiting in object storage (moved off a drained node), and the archive of an
        // earlier move that no row names.
        let (moving, stale_move) = ("volumes/v1/2".to_owned(), "volumes/v1/1".to_owned());
        let volume = crate::store::VolumeRecord {
            id: "v1".into(),
            owner: "k".into(),
            name: "data".into(),
            token: "t".into(),
            size_limit_mb: 1,
            created_at: 1,
            node: "n1".into(),
            stored: None,
        };
        let room = crate::store::VolumeQuota {
            count: 1,
            total_mb: 1,
        };
        assert!(store.volumes().admit(&volume, room).await.unwrap());
        assert!(store.volumes().move_out("v1", "n1", &moving).await.unwrap());
        for prefix in [
            &named_pause,
            &stale_pause,
            &named_snapshot,
            &stale_snapshot,
            &moving,
            &stale_move,
        ] {
            upload(&objects, prefix).await;
        }
        let chain = |i: usize| chain_object(&mount_name(&mounts[i]));
        let has = |prefix: String| {
            let objects = objects.clone();
            async move { objects.has(&prefix).await.unwrap() }
        };

        let nothing = ObjectsCollected::default();
        let fresh = shared.collect(&store, UNUSED_FOR, Turn::Now).await.unwrap();
        assert_eq!(fresh, nothing, "everything was written just now");
        {
            let _build = store.objects_lock().shared().await.unwrap();
            let busy = shared.collect(&store, Duration::ZERO, Turn::Daily).await;
            assert!(matches!(busy, Err(NotCollected::Busy)), "{busy:?}");
        }
        // The busy round left the day's turn to this one.
        let done = shared
            .collect(&store, Duration::ZERO, Turn::Daily)
            .await
            .unwrap();
        let expected = ObjectsCollected {
            layers: 1,
            chains: 1,
            paused: 1,
            snapshots: 1,
            volumes: 1,
        };
        assert_eq!(done, expected);
        for key in ["base", "kept", "old"] {
            assert!(has(layer_prefix(key)).await, "{key} is stood on");
        }
        assert!(!has(layer_prefix("orphan")).await);
        assert!(objects.get_small(&chain(0)).await.unwrap().is_some());
        assert!(objects.get_small(&chain(1)).await.unwrap().is_some());
        assert!(objects.get_small(&chain(2)).await.unwrap().is_none());
        assert!(has(named_pause.clone()).await && !has(stale_pause).await);
        assert!(has(named_snapshot.clone()).await && !has(stale_snapshot).await);
        assert!(has(moving).await && !has(stale_move).await);
        assert_eq!(
            shared
                .collect(&store, Duration::ZERO, Turn::Now)
                .await
                .unwrap(),
            nothing
        );
        let again = shared.collect(&store, Duration::ZERO, Turn::Daily).await;
        assert!(matches!(again, Err(NotCollected::NotDue)), "{again:?}");

        // Another database's server on the same bucket marks it shared: nothing is collected.
        store.snapshots().delete("k", &snapshot.id).await.unwrap();
        let other = Store::open(&tmp.path().join("other")).unwrap();
        shared.claim_store(&other).await.unwrap();
        let refused = shared.collect(&store, Duration::ZERO, Turn::Now).await;
        assert!(matches!(refused, Err(NotCollected::NotOurs)), "{refused:?}");
        assert!(
            has(named_snapshot).await,
            "no longer named, but the bucket is shared"
        );
    }

    #[test]
    fn objects_are_grouped_into_images_by_their_prefix() {
        let at = |secs| chrono::DateTime::from_timestamp(secs, 0).unwrap();
        let listed: Vec<Listed> = [
            ("layers/k1/layer.tar", 10),
            ("layers/k1/manifest.json", 20),
            ("layers/k2/manifest.json", 5),
            ("layers/stray", 99),
            ("paused/sbx/111/pages.img", 7),
            ("paused/sbx/222/manifest.json", 8),
        ]
        .into_iter()
        .map(|(path, secs)| Listed {
            path: path.into(),
            modified: at(secs),
        })
        .collect();
        let layers = images(&listed[..4], 1);
        assert_eq!(
            layers.into_iter().collect::<Vec<_>>(),
            [("layers/k1".into(), at(20)), ("layers/k2".into(), at(5))]
        );
        let paused = images(&listed[4..], 2);
        assert_eq!(
            paused.keys().collect::<Vec<_>>(),
            ["paused/sbx/111", "paused/sbx/222"]
        );
    }
}
