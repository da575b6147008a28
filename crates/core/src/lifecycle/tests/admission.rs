//! Admission, quotas and the state machine's guarantees, against the recording driver.

use super::*;
use crate::store::{PauseMode, SandboxState};

/// An API key with these limits, as `airlock key create` makes one; returns its id.
async fn key_with(store: &Store, limits: crate::store::KeyLimits) -> String {
    let sha = format!("{:064x}", rand::random::<u128>());
    store
        .keys()
        .add(&sha, "limited", 0, limits, false)
        .await
        .unwrap();
    crate::store::key_id(&sha)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_never_exceed_the_capacity() {
    let driver = Arc::new(RecordingDriver {
        delay: Duration::from_millis(20),
        ..Default::default()
    });
    let limits = Limits {
        max_sandboxes: 8,
        pool_size: 0,
        ..Limits::default()
    };
    let (_dir, _store, lc) = setup(driver.clone(), limits).await;
    // Collected: all forty are under way before any is awaited.
    let creates: Vec<_> = (0..40)
        .map(|_| {
            let lc = lc.clone();
            tokio::spawn(async move { lc.create(params()).await })
        })
        .collect();
    let results: Vec<_> = futures_join(creates.into_iter()).await;
    let made = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(LifecycleError::Capacity(8))))
        .count();
    assert_eq!((made, refused), (8, 32));
    assert_eq!(
        driver.running.lock().unwrap().len(),
        8,
        "nothing was started beyond it"
    );
}

pub(super) async fn futures_join<T: Send + 'static>(
    handles: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn each_key_is_held_to_its_own_limits() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let limited = key_with(
        &store,
        crate::store::KeyLimits {
            max_running: Some(2),
            max_paused: Some(1),
            max_snapshot_mb: Some(5),
        },
    )
    .await;
    let as_key = |owner: &str| CreateParams {
        owner: Some(owner.into()),
        ..params()
    };
    let a = lc.create(as_key(&limited)).await.unwrap();
    let b = lc.create(as_key(&limited)).await.unwrap();
    assert!(matches!(
        lc.create(as_key(&limited)).await,
        Err(LifecycleError::Quota(m)) if m.contains("at most 2")
    ));
    lc.create(as_key("k2"))
        .await
        .expect("another key is unaffected");

    // Paused: one at most. A refused pause leaves the sandbox running.
    lc.pause(a.id().as_str(), PauseMode::Full, false)
        .await
        .unwrap();
    assert!(matches!(
        lc.pause(b.id().as_str(), PauseMode::Full, false).await,
        Err(LifecycleError::Quota(m)) if m.contains("paused")
    ));
    assert_eq!(
        lc.running(b.id().as_str()).await.unwrap().phase(),
        Phase::Running
    );
    // A paused sandbox frees its running place, and resuming needs one.
    let c = lc.create(as_key(&limited)).await.unwrap();
    assert!(matches!(
        lc.resume(a.id().as_str(), None, PauseMode::Full).await,
        Err(LifecycleError::Quota(_))
    ));
    assert_eq!(
        lc.record(a.id().as_str()).unwrap().state,
        SandboxState::Paused
    );
    lc.kill(c.id().as_str()).await.unwrap();
    lc.resume(a.id().as_str(), None, PauseMode::Full)
        .await
        .unwrap();

    // Snapshot disk: each image takes 3 MiB here, and the key may use 5.
    lc.snapshot(b.id().as_str(), Some("one")).await.unwrap();
    lc.snapshot(b.id().as_str(), Some("two")).await.unwrap();
    assert!(matches!(
        lc.snapshot(b.id().as_str(), Some("three")).await,
        Err(LifecycleError::Quota(m)) if m.contains("MiB")
    ));
    assert_eq!(
        lc.snapshots(&limited).await.unwrap()[0].size_bytes,
        IMAGE_SIZE
    );
}

#[tokio::test]
async fn an_automatic_pause_without_disk_space_keeps_the_sandbox_running() {
    let driver = Arc::new(RecordingDriver {
        fail_checkpoint: true,
        ..Default::default()
    });
    let (_dir, store, lc) = setup(driver, Limits::default()).await;
    let sbx = lc
        .create(CreateParams {
            timeout: Some(Duration::ZERO),
            pause_on_timeout: true,
            ..params()
        })
        .await
        .unwrap();
    assert_eq!(lc.reap_expired(), 1);
    lc.settle().await;
    let id = sbx.id().as_str();
    assert_eq!(lc.running(id).await.unwrap().phase(), Phase::Running);
    let end_at = lc.record(id).unwrap().end_at;
    assert!(end_at > now_unix(), "it tries again later");
    assert_eq!(
        store
            .sandboxes()
            .get(sbx.id())
            .await
            .unwrap()
            .unwrap()
            .end_at,
        end_at
    );
}

#[tokio::test]
async fn traffic_waits_for_a_snapshot_and_a_kill_waits_for_a_pause() {
    let driver = Arc::new(RecordingDriver {
        delay: Duration::from_millis(100),
        ..Default::default()
    });
    let (_dir, _store, lc) = setup(driver.clone(), Limits::default()).await;
    let sbx = lc.create(params()).await.unwrap();
    let id = sbx.id().to_string();
    let snapshot = {
        let (lc, id) = (lc.clone(), id.clone());
        tokio::spawn(async move { lc.snapshot(&id, Some("snap")).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(sbx.phase(), Phase::Snapshotting);
    assert_eq!(
        lc.record(&id).unwrap().state,
        SandboxState::Running,
        "the API shows it running"
    );
    let traffic = lc.running(&id).await.unwrap();
    assert_eq!(
        traffic.phase(),
        Phase::Running,
        "traffic waited for the snapshot"
    );
    snapshot.await.unwrap().unwrap();

    let pause = {
        let (lc, id) = (lc.clone(), id.clone());
        tokio::spawn(async move { lc.pause(&id, PauseMode::Full, false).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(sbx.phase(), Phase::Pausing);
    assert!(
        lc.running(&id).await.is_err(),
        "no traffic to a sandbox being paused"
    );
    lc.kill(&id).await.unwrap();
    pause.await.unwrap().unwrap();
    assert!(lc.record(&id).is_err(), "killed once the pause was done");
    lc.settle().await;
    assert!(
        !driver.has_image(&paused_image(sbx.id())),
        "its image is gone too"
    );
}

/// Waits (at most 10 s) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_fill_only_the_room_left_and_give_way_to_creates() {
    let driver = Arc::new(RecordingDriver::default());
    driver
        .images
        .lock()
        .unwrap()
        .insert("golden-base-h-test".into());
    let limits = Limits {
        max_sandboxes: 3,
        pool_size: 5,
        pool_max: 5,
        pool_min_available_mb: 0,
        ..Limits::default()
    };
    let (_dir, _store, lc) = setup(driver.clone(), limits).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let pools = tokio::spawn(lc.clone().run_pools(stop.clone()));
    let ready = || lc.pool_loads().iter().map(|p| p.ready).sum::<usize>();
    until("the pool holds the room", || ready() == 3).await;
    assert_eq!(
        lc.pool_loads()[0].keep,
        5,
        "it would keep more, had it room"
    );
    // Creates the pool cannot serve (other resources): each gets in, and a pooled sandbox
    // gives way to it.
    let sized = || CreateParams {
        cpu_count: Some(1),
        ..params()
    };
    for _ in 0..3 {
        lc.create(sized()).await.unwrap();
    }
    assert_eq!(ready(), 0);
    assert!(matches!(
        lc.create(sized()).await,
        Err(LifecycleError::Capacity(3))
    ));
    stop.cancel();
    pools.await.unwrap();
    until("the pooled ones are destroyed", || {
        driver.running.lock().unwrap().len() == 3
    })
    .await;
}
