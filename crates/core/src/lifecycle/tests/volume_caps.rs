//! Each key is held to a number of volumes and to their total size, also under concurrent
//! creates, and another key is not held to the first one's.

use super::*;
use crate::volumes::{MountRequest, VolumeError, VolumeLimits};

fn volumes(limits: VolumeLimits) -> (tempfile::TempDir, Volumes) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
    let driver = Arc::new(RecordingDriver::default());
    let volumes = Volumes::new(NODE, store, driver, &dir.path().join("volumes"), limits).unwrap();
    (dir, volumes)
}

#[tokio::test]
async fn concurrent_creates_stop_at_the_count() {
    let (dir, volumes) = volumes(VolumeLimits {
        size_mb: 1,
        per_key: 3,
        per_key_mb: 1 << 20,
    });
    let names: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
    let creates = names.iter().map(|name| volumes.create("alice", name, 0));
    let results = futures::future::join_all(creates).await;
    let made = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(made, 3, "{results:?}");
    assert!(results
        .iter()
        .all(|r| matches!(r, Ok(_) | Err(VolumeError::TooMany(3)))));
    // A create that lost the race took back the volume it had made.
    let dirs = std::fs::read_dir(dir.path().join("volumes"))
        .unwrap()
        .count();
    assert_eq!(dirs, 3);
    // Another key has room of its own.
    volumes.create("bob", "v0", 0).await.unwrap();
}

#[tokio::test]
async fn creates_stop_at_the_total_size_and_start_again_after_a_delete() {
    let (_dir, volumes) = volumes(VolumeLimits {
        size_mb: 16,
        per_key: 10,
        per_key_mb: 40,
    });
    let first = volumes.create("alice", "a", 0).await.unwrap();
    volumes.create("alice", "b", 0).await.unwrap();
    let refused = volumes.create("alice", "c", 0).await.unwrap_err();
    assert!(
        matches!(
            refused,
            VolumeError::KeyFull {
                used_mb: 32,
                size_mb: 16,
                max_mb: 40
            }
        ),
        "{refused}"
    );
    assert!(refused.to_string().contains("--key-max-volume-mb"));
    assert!(volumes.delete(&first).await.unwrap());
    volumes.create("alice", "c", 0).await.unwrap();
}

#[tokio::test]
async fn a_volume_larger_than_the_free_disk_is_refused() {
    let (dir, volumes) = volumes(VolumeLimits {
        size_mb: 1 << 40,
        per_key: 10,
        per_key_mb: u64::MAX,
    });
    let refused = volumes.create("alice", "huge", 0).await.unwrap_err();
    assert!(matches!(refused, VolumeError::NoDisk { .. }), "{refused}");
    let left = std::fs::read_dir(dir.path().join("volumes"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "nothing is made of it");
}

#[tokio::test]
async fn a_volume_is_served_and_mounted_only_on_its_node() {
    let limits = VolumeLimits {
        size_mb: 1,
        per_key: 10,
        per_key_mb: 1 << 20,
    };
    let (dir, here) = volumes(limits);
    let volume = here.create("alice", "data", 0).await.unwrap();
    assert_eq!(volume.node, NODE);
    let mount = MountRequest {
        name: "data".into(),
        path: "/mnt/data".into(),
    };
    // The positive control: its own node serves it and mounts it.
    here.open(&volume.id, Some(&volume.token)).await.unwrap();
    let mounts = here
        .resolve(Some("alice"), std::slice::from_ref(&mount))
        .await
        .unwrap();
    here.check_still_there(Some("alice"), &mounts)
        .await
        .unwrap();

    // Another node on the same database refuses all of it, and says where the volume is.
    let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
    let driver = Arc::new(RecordingDriver::default());
    let there = Volumes::new("node-b", store, driver, &dir.path().join("b"), limits).unwrap();
    let elsewhere = |e: VolumeError| {
        assert!(
            matches!(&e, VolumeError::Elsewhere { name, node } if name == "data" && node == NODE),
            "{e}"
        );
    };
    match there.open(&volume.id, Some(&volume.token)).await {
        Ok(_) => panic!("another node served the volume's files"),
        Err(e) => elsewhere(e),
    }
    elsewhere(there.resolve(Some("alice"), &[mount]).await.unwrap_err());
    elsewhere(
        there
            .check_still_there(Some("alice"), &mounts)
            .await
            .unwrap_err(),
    );
    elsewhere(there.delete(&volume).await.unwrap_err());
    // The delete above left the volume alone.
    assert_eq!(here.get("alice", &volume.id).await.unwrap().node, NODE);
    assert!(here.delete(&volume).await.unwrap());
}
