//! A drained node's volumes move through object storage with their paused sandboxes: node A
//! drains, its volume goes into object storage, and node B, asked about the paused sandbox,
//! takes the volume in (its files and all) before it takes the sandbox over. Two lifecycles on
//! one store, one recording driver each (a volume is a plain directory there), and an
//! in-memory object store. (tests/cluster moves a real ext4 volume through a real S3 server.)

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
    let lc = Lifecycle::new(
        name.into(),
        store.clone(),
        driver,
        TestAgent::ready(),
        Limits::default(),
        volumes.clone(),
    );
    assert!(lc.use_object_store(ImageObjects::with_store(objects.clone())));
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

    // Drained, node A pauses the sandbox, then moves the volume out.
    a.drain();
    let stored = moved_out(&store, &volume.id).await;
    assert!(
        !volumes_a.dir(&volume.id).exists(),
        "its files left the drained node"
    );
    assert!(archive.has(&stored).await.unwrap());
    assert_eq!(
        store.volumes().all_stored().await.unwrap(),
        [stored.as_str()]
    );

    // Ready again, A resumes the sandbox: its volume comes back first.
    a.undrain();
    a.resume(id.as_str(), None, PauseMode::Full).await.unwrap();
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
    // Kept on A, it is not B's to mount.
    let Err(refused) = b.create(mounting_data()).await else {
        panic!("a volume kept on another node was mounted");
    };
    assert!(refused.to_string().contains("kept on node"), "{refused}");

    // Drained again, A moves it out again, and a create on B that mounts it takes it in.
    a.drain();
    moved_out(&store, &volume.id).await;
    let on_b = b.create(mounting_data()).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(file(&volumes_b)).unwrap(),
        "on the volume"
    );
    let there = store.volumes().by_id(&volume.id).await.unwrap().unwrap();
    assert_eq!((there.node.as_str(), there.stored), (OTHER, None));
    // The paused sandbox on A resumes only where its volume is now.
    a.undrain();
    assert!(a.resume(id.as_str(), None, PauseMode::Full).await.is_err());
    b.kill(on_b.id().as_str()).await.unwrap();
}
