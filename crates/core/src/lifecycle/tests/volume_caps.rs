//! Each key is held to a number of volumes and to their total size, also under concurrent
//! creates, and another key is not held to the first one's.

use super::*;
use crate::volumes::{VolumeError, VolumeLimits};

fn volumes(limits: VolumeLimits) -> (tempfile::TempDir, Volumes) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
    let driver = Arc::new(RecordingDriver::default());
    let volumes = Volumes::new(store, driver, &dir.path().join("volumes"), limits).unwrap();
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
    assert!(volumes.delete("alice", &first.id).await.unwrap());
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
