//! Back-pressure on launches: turns in arrival order, callers before background work, and a
//! prompt refusal instead of a wait past the bound.

use super::super::launches::{Launches, Turn};
use super::*;

/// Lets every spawned task run as far as it can.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn callers_launch_in_arrival_order_and_before_background_work() {
    let launches = Arc::new(Launches::new(1, Duration::from_secs(3600)));
    let first = launches.acquire(Turn::User).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiter = |name: &'static str, turn: Turn| {
        let (launches, order) = (launches.clone(), order.clone());
        tokio::spawn(async move {
            let _place = launches.acquire(turn).await.unwrap();
            order.lock().unwrap().push(name);
        })
    };
    // The background launch is queued first, yet both callers go before it.
    let tasks = [
        waiter("pool refill", Turn::Background),
        waiter("create 1", Turn::User),
    ];
    settle().await;
    let late = waiter("create 2", Turn::User);
    settle().await;
    assert_eq!(
        launches.load(),
        (1, 2),
        "one under way, two callers waiting"
    );
    assert!(!launches.idle(), "a pool does not fill while callers wait");
    drop(first);
    for task in tasks.into_iter().chain([late]) {
        task.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["create 1", "create 2", "pool refill"]
    );
    assert_eq!(launches.load(), (0, 0));
    assert!(launches.idle());
}

#[tokio::test]
async fn a_caller_that_gives_up_leaves_no_place_taken() {
    let launches = Arc::new(Launches::new(1, Duration::from_secs(3600)));
    let first = launches.acquire(Turn::User).await.unwrap();
    let gone = {
        let launches = launches.clone();
        tokio::spawn(async move { launches.acquire(Turn::User).await.map(|_| ()) })
    };
    settle().await;
    gone.abort();
    let _ = gone.await;
    assert_eq!(launches.load(), (1, 0), "it left the queue");
    // One that goes away after its place was granted, before it saw it, gives the place back.
    let mut granted_unseen = Box::pin(launches.acquire(Turn::User));
    assert!(poll_once(granted_unseen.as_mut()).is_none());
    drop(first);
    assert_eq!(launches.load(), (1, 0), "the place went to the waiter");
    drop(granted_unseen);
    assert_eq!(launches.load(), (0, 0), "and came back when it went away");
    assert!(launches.acquire(Turn::User).await.is_ok());
}

#[tokio::test]
async fn a_wait_past_the_bound_is_refused_at_once_and_says_how_long() {
    // Two places, and a caller may wait about one launch (the first guess, 1 s, before any
    // launch was measured).
    let launches = Launches::new(2, Duration::from_secs(1));
    let _a = launches.acquire(Turn::User).await.unwrap();
    let _b = launches.acquire(Turn::User).await.unwrap();
    let mut third = std::pin::pin!(launches.acquire(Turn::User));
    let mut fourth = std::pin::pin!(launches.acquire(Turn::User));
    assert!(
        poll_once(third.as_mut()).is_none(),
        "one round ahead: it waits"
    );
    assert!(
        poll_once(fourth.as_mut()).is_none(),
        "the same round: it waits too"
    );
    // A fifth would wait two rounds.
    let refused = launches.acquire(Turn::User).await.err().expect("refused");
    assert_eq!(refused.expected_wait, Duration::from_secs(2));
    // Background work is never refused: it waits.
    let background = poll_once(std::pin::pin!(launches.acquire(Turn::Background)));
    assert!(background.is_none());
}

/// Polls a future once.
fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
    let waker = std::task::Waker::noop();
    match f.poll(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_past_the_launches_gets_prompt_refusals_and_leaks_nothing() {
    let driver = Arc::new(RecordingDriver {
        delay: Duration::from_millis(300),
        ..Default::default()
    });
    let limits = Limits {
        pool_size: 0,
        max_launches: 1,
        max_launch_wait: Duration::ZERO,
        ..Limits::default()
    };
    let (_dir, _store, lc) = setup(driver.clone(), limits).await;
    // Collected: all six are under way before any is awaited.
    let creates: Vec<_> = (0..6)
        .map(|_| {
            let lc = lc.clone();
            tokio::spawn(async move { lc.create(params()).await })
        })
        .collect();
    let results = admission::futures_join(creates.into_iter()).await;
    let made = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(LifecycleError::Overloaded { retry_after_secs }) if *retry_after_secs >= 1))
        .count();
    let errors: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    assert_eq!((made, refused), (1, 5), "{errors:?}");
    assert_eq!(driver.running.lock().unwrap().len(), 1);
    assert_eq!(lc.list_records().len(), 1, "the refused left no sandbox");
}
