//! Freezing idle sandboxes: when, and what wakes them.

use super::*;

const QUIET: Duration = Duration::from_millis(50);

/// Lets `sbx` be quiet for long enough, then gives the freezer its turn.
async fn quiet_then_freezer(lc: &Lifecycle, sbx: &Arc<Sandbox>) {
    tokio::time::sleep(QUIET).await;
    lc.freeze_if_idle(sbx, QUIET).await;
}

fn freezing() -> Limits {
    Limits {
        freeze_after: Some(QUIET),
        ..Limits::default()
    }
}

#[tokio::test]
async fn a_quiet_sandbox_is_frozen_and_traffic_thaws_it_first() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, _store, lc) = setup(driver.clone(), freezing()).await;
    let sbx = lc.create(params()).await.unwrap();
    lc.freeze_if_idle(&sbx, QUIET).await;
    assert!(
        !driver.is_frozen(sbx.id()),
        "not before it has been quiet for long enough"
    );

    quiet_then_freezer(&lc, &sbx).await;
    assert!(driver.is_frozen(sbx.id()) && sbx.is_frozen());

    let awake = lc.wake(&sbx);
    assert!(
        !driver.is_frozen(sbx.id()),
        "thawed before the traffic goes on"
    );
    tokio::time::sleep(QUIET * 2).await;
    lc.freeze_if_idle(&sbx, QUIET).await;
    assert!(
        !driver.is_frozen(sbx.id()),
        "never while traffic is in flight"
    );

    drop(awake);
    lc.freeze_if_idle(&sbx, QUIET).await;
    assert!(
        !driver.is_frozen(sbx.id()),
        "quiet counts from the end of the traffic"
    );
    quiet_then_freezer(&lc, &sbx).await;
    assert!(driver.is_frozen(sbx.id()));
}

#[tokio::test]
async fn a_sandbox_in_which_something_runs_stays_awake() {
    let driver = Arc::new(RecordingDriver::default());
    let agent = TestAgent::ready();
    *agent.busy.lock().unwrap() = Some("12 sleep".into());
    let (_dir, _store, lc) = setup_with_agent(driver.clone(), freezing(), agent.clone()).await;
    let sbx = lc.create(params()).await.unwrap();
    quiet_then_freezer(&lc, &sbx).await;
    assert!(!driver.is_frozen(sbx.id()));

    // Its process ended: it is asked again only after a while.
    *agent.busy.lock().unwrap() = None;
    lc.freeze_if_idle(&sbx, QUIET).await;
    assert!(!driver.is_frozen(sbx.id()));
}

#[tokio::test]
async fn traffic_that_comes_and_goes_while_the_agent_is_asked_cancels_the_freeze() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, _store, lc) = setup(driver.clone(), freezing()).await;
    let sbx = lc.create(params()).await.unwrap();
    tokio::time::sleep(QUIET).await;
    let generation = sbx.freeze_candidate(QUIET).unwrap();
    drop(lc.wake(&sbx));
    let froze = sbx
        .freeze_if_quiet(generation, || driver.set_frozen(sbx.id(), true))
        .unwrap();
    assert!(!froze && !driver.is_frozen(sbx.id()));
}

#[tokio::test]
async fn pausing_snapshotting_and_killing_a_frozen_sandbox_work() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, _store, lc) = setup(driver.clone(), freezing()).await;
    let frozen = |lc: &Arc<Lifecycle>, sbx: Arc<Sandbox>| {
        let lc = lc.clone();
        async move {
            quiet_then_freezer(&lc, &sbx).await;
            assert!(sbx.is_frozen());
            sbx
        }
    };
    // The recording driver's checkpoint fails on a frozen sandbox.
    let sbx = frozen(&lc, lc.create(params()).await.unwrap()).await;
    lc.snapshot(sbx.id().as_str(), Some("snap")).await.unwrap();
    assert!(!sbx.is_frozen(), "awake after its snapshot");
    let sbx = frozen(&lc, sbx).await;
    lc.pause(sbx.id().as_str(), PauseMode::Full, false)
        .await
        .unwrap();
    let resumed = lc
        .resume(sbx.id().as_str(), None, PauseMode::Full)
        .await
        .unwrap();
    assert!(!resumed.is_frozen());
    let sbx = frozen(&lc, resumed).await;
    lc.kill(sbx.id().as_str()).await.unwrap();
    lc.destroying.close();
    lc.destroying.wait().await;
    assert!(driver.destroyed.lock().unwrap().contains(sbx.id()));
}
