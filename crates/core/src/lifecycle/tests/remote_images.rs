//! Paused images in object storage, as far as a recording driver shows them: object storage is
//! a copy, never a condition of a pause. (tests/integration/test_object_store.py moves real
//! images through a real S3 server.)

use super::*;
use crate::objects::ImageObjects;
use crate::store::SnapshotRecord;

type InMemory = object_store::memory::InMemory;

/// A node that shares images through an in-memory object store, on a recording driver.
async fn sharing(
    limits: Limits,
) -> (
    tempfile::TempDir,
    Arc<Store>,
    Arc<Lifecycle>,
    Arc<RecordingDriver>,
    Arc<InMemory>,
) {
    let driver = Arc::new(RecordingDriver::default());
    let (dir, store, lc) = setup(driver.clone(), limits).await;
    let objects = Arc::new(InMemory::new());
    assert!(lc.use_object_store(ImageObjects::with_store(objects.clone())));
    (dir, store, lc, driver, objects)
}

#[tokio::test]
async fn a_pause_whose_upload_fails_still_pauses_and_counts_the_failure() {
    let (_dir, store, lc, driver, _) = sharing(Limits::default()).await;
    let sbx = lc.create(params()).await.unwrap();
    let id = sbx.id().clone();
    // The recording driver's images are not files, so there is nothing to upload.
    lc.pause(id.as_str(), PauseMode::Full, false).await.unwrap();
    assert!(
        driver.has_image(&paused_image(&id)),
        "the image stays on disk"
    );
    assert_eq!(lc.image_transfers().upload_failures, 1);
    assert_eq!(lc.image_transfers().uploads, 0);
    assert_eq!(store.paused_images().get(&id).await.unwrap(), None);
    lc.resume(id.as_str(), None, PauseMode::Full).await.unwrap();
    assert_eq!(
        lc.image_transfers().downloads,
        0,
        "its own image was on disk"
    );
}

#[tokio::test]
async fn a_paused_sandbox_another_node_took_over_is_forgotten_here() {
    let (_dir, store, lc, driver, _) = sharing(Limits::default()).await;
    let kept = lc.create(params()).await.unwrap().id().clone();
    let moved = lc.create(params()).await.unwrap().id().clone();
    let quiet = lc.create(params()).await.unwrap().id().clone();
    for id in [&kept, &moved, &quiet] {
        lc.pause(id.as_str(), PauseMode::Full, false).await.unwrap();
    }
    // Another node takes one over (as `record_or_adopt` there does), and may pause it again.
    assert!(store
        .sandboxes()
        .move_paused(&moved, NODE, "other-node")
        .await
        .unwrap());

    // Still this node's: served as before, image and all.
    assert_eq!(lc.record_or_adopt(kept.as_str()).await.unwrap().id, kept);
    assert!(driver.has_image(&paused_image(&kept)));
    // Taken over: this node's copy is of an older pause. It is forgotten, so it cannot be
    // resumed here (nor taken back: this test's other node put no image in object storage).
    assert!(lc.record_or_adopt(moved.as_str()).await.is_err());
    assert!(
        !driver.has_image(&paused_image(&moved)),
        "its old image is gone"
    );
    assert!(
        driver.destroyed.lock().unwrap().contains(&moved),
        "and so is its parked runtime, before the answer: a takeover here reuses its id at once"
    );
    assert!(
        lc.record(moved.as_str()).is_err(),
        "and so is its record here"
    );
    assert!(lc
        .resume(moved.as_str(), None, PauseMode::Full)
        .await
        .is_err());
    assert_eq!(
        store.sandboxes().get(&moved).await.unwrap().unwrap().node,
        "other-node",
        "the catalog's row is the other node's, untouched"
    );

    // One taken over that no request asks this node for is forgotten by the reaper's rounds.
    assert!(store
        .sandboxes()
        .move_paused(&quiet, NODE, "other-node")
        .await
        .unwrap());
    assert!(lc.record(quiet.as_str()).is_ok());
    lc.forget_taken_over().await;
    assert!(lc.record(quiet.as_str()).is_err());
    assert!(!driver.has_image(&paused_image(&quiet)));
    assert!(lc.record(kept.as_str()).is_ok(), "its own stays");
}

#[tokio::test]
async fn a_snapshot_deleted_through_another_node_leaves_no_copy_here() {
    let (_dir, store, lc, driver, _) = sharing(Limits::default()).await;
    let source = lc.create(params()).await.unwrap().id().clone();
    let gone = lc.snapshot(source.as_str(), Some("gone")).await.unwrap();
    let kept = lc.snapshot(source.as_str(), Some("kept")).await.unwrap();
    assert!(driver.has_image(&gone.image) && driver.has_image(&kept.image));
    // Another node deletes "gone": its record (and the object, and its own copy).
    assert!(store.snapshots().delete("k1", &gone.id).await.unwrap());

    // While a snapshot is being made here, its image has no record yet: nothing is swept.
    let making = lc.remote.snapshot_images_in_use.read().await;
    lc.tend_snapshot_copies().await;
    assert!(driver.has_image(&gone.image));
    drop(making);

    lc.tend_snapshot_copies().await;
    assert!(
        !driver.has_image(&gone.image),
        "the deleted snapshot's copy is gone"
    );
    assert!(driver.has_image(&kept.image), "a live snapshot's stays");
    let copy = lc
        .create(CreateParams {
            template: kept.id.to_string(),
            ..params()
        })
        .await;
    assert!(copy.is_ok(), "and still starts: {:?}", copy.err());
}

#[tokio::test]
async fn a_snapshot_taken_again_under_its_name_gets_an_image_of_its_own() {
    let (_dir, store, lc, driver, _) = sharing(Limits::default()).await;
    let source = lc.create(params()).await.unwrap().id().clone();
    let first = lc.snapshot(source.as_str(), Some("ready")).await.unwrap();
    let second = lc.snapshot(source.as_str(), Some("ready")).await.unwrap();
    // Same name, another image: a node that kept the first take's image never restores it
    // for the second.
    assert_ne!(first.image, second.image);
    assert!(
        !driver.has_image(&first.image),
        "the first take's image is gone here"
    );
    let recorded = store.snapshots().get("k1", &second.id).await.unwrap();
    assert_eq!(recorded.unwrap().image, second.image);
    // Another node's copy of the first take is named by no record: its sweep deletes it.
    driver.images.lock().unwrap().insert(first.image.clone());
    lc.tend_snapshot_copies().await;
    assert!(!driver.has_image(&first.image));
    assert!(driver.has_image(&second.image));
}

/// Marks snapshot `image` as whole in object storage, as its upload would have (the recording
/// driver's images are not files, so no upload succeeds).
async fn stored(objects: &InMemory, image: &str) {
    use object_store::ObjectStoreExt;
    let manifest = object_store::path::Path::from(format!("snapshots/{image}/manifest.json"));
    objects.put(&manifest, b"{}".to_vec().into()).await.unwrap();
}

#[tokio::test]
async fn snapshot_copies_past_their_budget_go_least_recently_used_first() {
    // Room for one stored copy of IMAGE_SIZE (3 MiB); a copy on this node alone does not
    // count.
    let limits = Limits {
        snapshot_cache_mb: 4,
        ..Limits::default()
    };
    let (_dir, _, lc, driver, objects) = sharing(limits).await;
    let source = lc.create(params()).await.unwrap().id().clone();
    let only_here = lc
        .snapshot(source.as_str(), Some("only-here"))
        .await
        .unwrap();
    let old = lc.snapshot(source.as_str(), Some("old")).await.unwrap();
    let recent = lc.snapshot(source.as_str(), Some("recent")).await.unwrap();
    for snapshot in [&old, &recent] {
        stored(&objects, &snapshot.image).await;
    }
    let start_from = |snapshot: &SnapshotRecord| CreateParams {
        template: snapshot.id.to_string(),
        ..params()
    };
    lc.create(start_from(&only_here)).await.unwrap();
    lc.create(start_from(&old)).await.unwrap();
    lc.create(start_from(&recent)).await.unwrap();

    // While a create from a snapshot is between its check for the image and its restore,
    // nothing is trimmed.
    let starting = lc.remote.snapshot_images_in_use.read().await;
    lc.tend_snapshot_copies().await;
    assert!(driver.has_image(&old.image));
    drop(starting);

    lc.tend_snapshot_copies().await;
    assert!(
        !driver.has_image(&old.image),
        "the least recently used copy that object storage holds goes"
    );
    assert!(driver.has_image(&recent.image), "the recent one stays");
    assert!(
        driver.has_image(&only_here.image),
        "a snapshot whose upload failed is on this node alone: never trimmed, though older"
    );
    // Within budget now (one stored copy): another round deletes nothing.
    lc.tend_snapshot_copies().await;
    assert!(driver.has_image(&recent.image) && driver.has_image(&only_here.image));
}

#[tokio::test]
async fn snapshot_copies_within_their_budget_stay() {
    let (_dir, _, lc, driver, objects) = sharing(Limits::default()).await;
    let source = lc.create(params()).await.unwrap().id().clone();
    let mut images = Vec::new();
    for name in ["a", "b", "c"] {
        let snapshot = lc.snapshot(source.as_str(), Some(name)).await.unwrap();
        stored(&objects, &snapshot.image).await;
        images.push(snapshot.image);
    }
    lc.tend_snapshot_copies().await;
    assert!(images.iter().all(|image| driver.has_image(image)));
}
