//! Paused images in object storage, as far as a recording driver shows them: object storage is
//! a copy, never a condition of a pause. (tests/integration/test_object_store.py moves real
//! images through a real S3 server.)

use super::*;
use crate::objects::ImageObjects;

#[tokio::test]
async fn a_pause_whose_upload_fails_still_pauses_and_counts_the_failure() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let objects = Arc::new(object_store::memory::InMemory::new());
    assert!(lc.use_object_store(ImageObjects::with_store(objects)));
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
