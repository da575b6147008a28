//! A stopping server leaves running sandboxes running for the next start to adopt, unless it
//! is told to stop them.

use super::*;
use std::sync::atomic::Ordering;

#[tokio::test]
async fn a_stop_keeps_running_sandboxes_for_the_next_start() {
    let driver = Arc::new(RecordingDriver::default());
    let (dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let sbx = lc.create(params()).await.unwrap();
    let streams = sbx.stopped();

    assert_eq!(lc.shutdown(OnExit::KeepRunning).await, 1);
    assert!(!driver.destroyed.lock().unwrap().contains(sbx.id()));
    assert_eq!(
        store
            .sandboxes()
            .get(sbx.id())
            .await
            .unwrap()
            .unwrap()
            .state,
        SandboxState::Running
    );
    tokio::time::timeout(Duration::from_secs(1), streams)
        .await
        .expect("its open streams are cut, so the server's connections can close");
    assert!(
        !driver.host_given_back.load(Ordering::SeqCst),
        "forwarding stays on while sandboxes run"
    );

    let next = restarted(&dir, &store, &driver);
    let report = next.recover().await.unwrap();
    assert_eq!(report.adopted, [sbx.id().clone()]);
}

#[tokio::test]
async fn a_stop_told_to_stop_sandboxes_kills_them_and_gives_the_host_back() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let sbx = lc.create(params()).await.unwrap();
    assert_eq!(lc.shutdown(OnExit::StopSandboxes).await, 0);
    assert!(driver.destroyed.lock().unwrap().contains(sbx.id()));
    assert!(store.sandboxes().get(sbx.id()).await.unwrap().is_none());
    assert!(driver.host_given_back.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_timeout_that_passed_while_no_server_ran_does_what_it_asked_at_the_next_start() {
    let driver = Arc::new(RecordingDriver::default());
    let (dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let pausing = lc
        .create(CreateParams {
            pause_on_timeout: true,
            ..params()
        })
        .await
        .unwrap();
    let killed = lc.create(params()).await.unwrap();
    lc.shutdown(OnExit::KeepRunning).await;
    for sbx in [&pausing, &killed] {
        store
            .sandboxes()
            .set_end_at(sbx.id(), now_unix() - 1)
            .await
            .unwrap();
    }

    let next = restarted(&dir, &store, &driver);
    let report = next.recover().await.unwrap();
    assert_eq!(report.adopted.len(), 2, "both still ran");
    assert_eq!(next.reap_expired(), 2);
    next.settle().await;
    assert_eq!(
        store
            .sandboxes()
            .get(pausing.id())
            .await
            .unwrap()
            .unwrap()
            .state,
        SandboxState::Paused,
        "it asked to be paused at its timeout"
    );
    assert!(driver.has_image(&paused_image(pausing.id())));
    assert!(store.sandboxes().get(killed.id()).await.unwrap().is_none());
    assert!(driver.destroyed.lock().unwrap().contains(killed.id()));
}
