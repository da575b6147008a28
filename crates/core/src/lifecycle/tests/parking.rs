//! Paused sandboxes whose runtime is kept frozen (parked): resumed by a thaw, let go past
//! their budget, and resumed from their image after that.

use super::*;

#[tokio::test]
async fn a_parked_sandbox_resumes_by_a_thaw_with_the_rules_set_while_it_was_paused() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, _store, lc) = setup(driver.clone(), Limits::default()).await;
    let sbx = lc.create(params()).await.unwrap();
    let (id, slot) = (sbx.id().clone(), sbx.record().slot.unwrap());
    lc.pause(id.as_str(), PauseMode::Full, false).await.unwrap();
    assert!(
        driver.has_image(&paused_image(&id)),
        "the image is written all the same"
    );
    assert!(driver.is_frozen(&id), "its runtime is kept, frozen");
    assert!(!driver.destroyed.lock().unwrap().contains(&id));
    assert_eq!(lc.host_load().parked, 1);

    let egress = Egress::from_request(Some(false), &["pypi.org".into()], &[]).unwrap();
    lc.set_network(id.as_str(), egress.clone(), None)
        .await
        .unwrap();
    let resumed = lc.resume(id.as_str(), None, PauseMode::Full).await.unwrap();
    assert_eq!(resumed.record().slot, Some(slot), "thawed where it ran");
    assert!(!driver.is_frozen(&id));
    assert_eq!(driver.egress.lock().unwrap()[&slot], egress);
    assert!(
        driver
            .egress_set_while_frozen
            .load(std::sync::atomic::Ordering::SeqCst),
        "the new rules hold before anything in it runs again"
    );
    assert!(!driver.has_image(&paused_image(&id)), "the image is spent");
    assert_eq!(lc.host_load().parked, 0);

    // Killing a parked sandbox destroys its runtime with it.
    lc.pause(id.as_str(), PauseMode::Full, false).await.unwrap();
    lc.kill(id.as_str()).await.unwrap();
    lc.settle().await;
    assert!(driver.destroyed.lock().unwrap().contains(&id));
    assert!(!driver.has_image(&paused_image(&id)));
}

#[tokio::test]
async fn parked_runtimes_go_oldest_first_past_their_budget_and_resume_from_their_image() {
    let driver = Arc::new(RecordingDriver {
        memory_each: 1 << 20,
        ..Default::default()
    });
    let limits = Limits {
        paused_memory_mb: 1,
        pool_min_available_mb: 0,
        ..Limits::default()
    };
    let (_dir, _store, lc) = setup(driver.clone(), limits).await;
    let older = lc.create(params()).await.unwrap();
    let newer = lc.create(params()).await.unwrap();
    let older_slot = older.record().slot.unwrap();
    lc.pause(older.id().as_str(), PauseMode::Full, false)
        .await
        .unwrap();
    lc.pause(newer.id().as_str(), PauseMode::Full, false)
        .await
        .unwrap();
    // Two runtimes of 1 MiB against 1 MiB: the second pause lets the older one go.
    lc.settle().await;
    assert!(driver.destroyed.lock().unwrap().contains(older.id()));
    assert!(!driver.destroyed.lock().unwrap().contains(newer.id()));
    assert_eq!(lc.host_load().parked, 1);

    let resumed = lc
        .resume(older.id().as_str(), None, PauseMode::Full)
        .await
        .unwrap();
    assert_ne!(
        resumed.record().slot,
        Some(older_slot),
        "restored from its image"
    );
    assert!(driver.running.lock().unwrap().contains(older.id()));
}

#[tokio::test]
async fn a_stopping_server_lets_parked_runtimes_go_and_keeps_the_images() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let sbx = lc.create(params()).await.unwrap();
    lc.pause(sbx.id().as_str(), PauseMode::Full, false)
        .await
        .unwrap();
    lc.shutdown(OnExit::KeepRunning).await;
    assert!(driver.destroyed.lock().unwrap().contains(sbx.id()));
    assert!(driver.has_image(&paused_image(sbx.id())));
    let row = store.sandboxes().get(sbx.id()).await.unwrap().unwrap();
    assert_eq!(row.state, SandboxState::Paused);
}
