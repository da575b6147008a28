//! A drained node's volumes move through object storage: node A drains, its volume goes into
//! object storage, and the next node that needs it (A again for a create, B for the content
//! API) takes it in, its files and all. Two lifecycles on one store, one recording driver each
//! (a volume is a plain directory there), and an in-memory object store. (tests/cluster moves
//! a real ext4 volume through a real S3 server, with the paused sandbox that mounts it.)

use super::*;
use crate::objects::ImageObjects;
use crate::volumes::{MountRequest, VolumeLimits};

const OTHER: &str = "other-node";

fn node(
    name: &str,
    store: &Arc<Store>,
    data: &std::path::Path,
    objects: &Arc<object_store::memory::InMemory>,
) -> (Arc<Lifecycle>, Arc<Volumes>) {
    let driver = Arc::new(RecordingDriver::default());
    let limits = VolumeLimits {
        size_mb: 16,
        per_key: 4,
        per_key_mb: 64,
    };
    let dir = data.join(format!("{name}-volumes"));
    let volumes =
        Arc::new(Volumes::new(name, store.clone(), driver.clone(), &dir, limits).unwrap());
    let shared = ImageObjects::with_store(objects.clone());
    assert!(volumes.use_object_store(shared.clone()));
    let lc = Lifecycle::new(
        name.into(),
        store.clone(),
        driver,
        TestAgent::ready(),
        Limits::default(),
        volumes.clone(),
    );
    assert!(lc.use_object_store(shared));
    (lc, volumes)
}

/// Waits until volume `id` is in object storage, on no node; its object's prefix.
async fn moved_out(store: &Store, id: &str) -> String {
    for _ in 0..500 {
        let now = store.volumes().by_id(id).await.unwrap().unwrap();
        if let Some(stored) = now.stored {
            assert_eq!(now.node, "", "on no node while it waits");
            return stored;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the drain did not move the volume into object storage");
}

fn mounting_data() -> CreateParams {
    CreateParams {
        volume_mounts: vec![MountRequest {
            name: "data".into(),
            path: "/mnt/data".into(),
        }],
        ..params()
    }
}

#[tokio::test]
async fn a_drained_nodes_volume_moves_to_the_next_node_that_needs_it() {
    let (data, store, _) = setup(Arc::default(), Limits::default()).await;
    let objects = Arc::new(object_store::memory::InMemory::new());
    let archive = ImageObjects::with_store(objects.clone());
    let (a, volumes_a) = node(NODE, &store, data.path(), &objects);
    let (b, volumes_b) = node(OTHER, &store, data.path(), &objects);
    let volume = volumes_a.create("k1", "data", 0).await.unwrap();
    let file = |volumes: &Volumes| volumes.dir(&volume.id).join("kept.txt");
    std::fs::write(file(&volumes_a), "on the volume").unwrap();
    let id = a.create(mounting_data()).await.unwrap().id().clone();
    a.kill(id.as_str()).await.unwrap();

    // Drained, node A moves the volume out: on no node, its files gone from A.
    a.drain();
    let stored = moved_out(&store, &volume.id).await;
    gone(&volumes_a.dir(&volume.id)).await;
    assert!(archive.has(&stored).await.unwrap());
    assert_eq!(
        store.volumes().all_stored().await.unwrap(),
        [stored.as_str()]
    );

    // Ready again, A starts a sandbox that mounts it: the volume comes back first.
    a.undrain();
    let on_a = a.create(mounting_data()).await.unwrap().id().clone();
    assert_eq!(
        std::fs::read_to_string(file(&volumes_a)).unwrap(),
        "on the volume"
    );
    let back = store.volumes().by_id(&volume.id).await.unwrap().unwrap();
    assert_eq!((back.node.as_str(), back.stored), (NODE, None));
    assert!(
        !archive.has(&stored).await.unwrap(),
        "its archive goes once it is in"
    );
    // Kept on A, it is not B's to mount or serve.
    let Err(refused) = b.create(mounting_data()).await else {
        panic!("a volume kept on another node was mounted");
    };
    assert!(refused.to_string().contains("kept on node"), "{refused}");
    assert!(volumes_b
        .open(&volume.id, Some(&volume.token))
        .await
        .is_err());

    // Drained again, A moves it out again, and B's content API takes it in.
    a.kill(on_a.as_str()).await.unwrap();
    a.drain();
    moved_out(&store, &volume.id).await;
    volumes_b
        .open(&volume.id, Some(&volume.token))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(file(&volumes_b)).unwrap(),
        "on the volume"
    );
    let there = store.volumes().by_id(&volume.id).await.unwrap().unwrap();
    assert_eq!((there.node.as_str(), there.stored), (OTHER, None));

    // A paused sandbox whose image is on its node only (this driver's images are not files:
    // their uploads fail) resumes only there, so a drain leaves its volume there too.
    let paused = b.create(mounting_data()).await.unwrap().id().clone();
    b.pause(paused.as_str(), PauseMode::Full, false)
        .await
        .unwrap();
    b.drain();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kept = store.volumes().by_id(&volume.id).await.unwrap().unwrap();
    assert_eq!((kept.node.as_str(), kept.stored), (OTHER, None));
    assert!(file(&volumes_b).is_file());
}

/// Waits until `path` is gone (a move removes the local files after it records the move).
async fn gone(path: &std::path::Path) {
    for _ in 0..500 {
        if !path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} is still there", path.display());
}
