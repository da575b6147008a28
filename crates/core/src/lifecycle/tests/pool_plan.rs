//! The pools' plan: what each pool holds, what it gives up, how fast pools fill; and, against
//! the recording driver, that pools hold still when nobody creates.

use super::*;
use crate::lifecycle::pool_plan::{surplus, targets, PoolDemand, RestoreBudget};
use std::time::Instant;

const MB: u64 = 1 << 20;
const IDLE_AFTER: Duration = Duration::from_secs(1800);

fn wanted(secs_ago: u64, grown: usize) -> PoolDemand {
    PoolDemand::new(Duration::from_secs(secs_ago), IDLE_AFTER, 2, grown, 20 * MB)
}

#[test]
fn every_pool_gets_its_base_before_any_pool_grows() {
    // A burst grew `0`'s pool to 10; the budget holds 8 sandboxes.
    let pools = [wanted(1, 10), wanted(50, 2), wanted(100, 2)];
    assert_eq!(targets(&pools, 160 * MB, 100), [4, 2, 2]);
    // Without room for every base, the pools wanted most lately get theirs.
    assert_eq!(targets(&pools, 60 * MB, 100), [2, 1, 0]);
    // Room under --max-sandboxes bounds the plan as memory does.
    assert_eq!(targets(&pools, 160 * MB, 3), [2, 1, 0]);
}

#[test]
fn ties_are_served_in_the_order_given_on_every_pass() {
    let pools = [wanted(5, 2), wanted(5, 2), wanted(5, 2)];
    for _ in 0..3 {
        assert_eq!(targets(&pools, 80 * MB, 100), [2, 2, 0]);
    }
}

#[test]
fn an_unused_template_has_no_pool_and_a_tiny_budget_still_pools_one() {
    let unused = wanted(IDLE_AFTER.as_secs(), 6);
    assert_eq!((unused.base, unused.keep), (0, 0));
    assert_eq!(targets(&[unused, wanted(9, 2)], 1000 * MB, 100), [0, 2]);
    assert_eq!(targets(&[wanted(1, 2), wanted(9, 2)], MB, 100), [1, 0]);
}

#[test]
fn a_ready_sandbox_goes_only_once_it_waited_unless_its_template_is_unused() {
    let min_age = Duration::from_secs(60);
    let ages = |secs: &[u64]| {
        secs.iter()
            .map(|s| Duration::from_secs(*s))
            .collect::<Vec<_>>()
    };
    // Shrunk to 2 of 4 (a burst's refill): only those ready a minute go, the oldest first.
    assert_eq!(surplus(&ages(&[90, 70, 30, 2]), 2, 2, min_age), 2);
    assert_eq!(surplus(&ages(&[70, 30, 20, 2]), 2, 2, min_age), 1);
    // Keeps 3 but the plan has room for 1: the same.
    assert_eq!(surplus(&ages(&[90, 30, 10]), 3, 1, min_age), 1);
    assert_eq!(
        surplus(&ages(&[30, 20]), 2, 0, min_age),
        0,
        "too young to move"
    );
    // Unused (keeps nothing): all go, its template has only its golden image.
    assert_eq!(surplus(&ages(&[3, 1]), 0, 0, min_age), 2);
}

#[test]
fn restores_follow_the_budget_however_often_pools_ask() {
    let start = Instant::now();
    let mut budget = RestoreBudget::new(40, start);
    let taken_at = |budget: &mut RestoreBudget, at: Duration| budget.try_take(start + at);
    let at_once = (0..100)
        .filter(|_| taken_at(&mut budget, Duration::ZERO))
        .count();
    assert_eq!(at_once, 20, "half a minute's worth at once");
    // Then asked ten times a second for a minute: 40 more.
    let later = (1..=600)
        .filter(|i| taken_at(&mut budget, Duration::from_millis(100 * i)))
        .count();
    assert!((39..=40).contains(&later), "about 40: {later}");
}

/// Another template of base's root filesystem, with its golden image.
async fn add_template(store: &Store, driver: &RecordingDriver, dir: &std::path::Path, name: &str) {
    store
        .templates()
        .put(&TemplateRecord::bare(name, "h", dir.join("rootfs")))
        .await
        .unwrap();
    driver
        .images
        .lock()
        .unwrap()
        .insert(format!("golden-{name}-h-test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_takes_no_other_pools_sandboxes_and_pools_then_hold_still() {
    let driver = Arc::new(RecordingDriver {
        memory_each: 20 * MB,
        // The pools' memory, as measured, strays by up to ±40 % of a sandbox each.
        memory_jitter: 8 * MB,
        ..Default::default()
    });
    let limits = Limits {
        pool_size: 2,
        pool_max: 6,
        pool_memory_mb: 130,
        pool_min_available_mb: 0,
        ..Limits::default()
    };
    let (dir, store, lc) = setup(driver.clone(), limits).await;
    for name in ["base", "t1", "t2"] {
        add_template(&store, &driver, dir.path(), name).await;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let pools = tokio::spawn(lc.clone().run_pools(stop.clone()));
    // Passes run back to back, as fast as they can, rather than every two seconds.
    let passes = |n: usize| {
        let lc = lc.clone();
        async move {
            for _ in 0..n {
                lc.refill.notify_one();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let pooled = || lc.pool_loads().iter().map(|p| p.ready).sum::<usize>();
    passes(100).await;
    assert_eq!(pooled(), 6, "every template's base: {:?}", lc.pool_loads());
    // A burst of base: its pool grows into what the budget has left, and no more.
    let burst: Vec<_> = (0..5).map(|_| lc.create(params())).collect();
    let mut made = Vec::new();
    for create in burst {
        made.push(create.await.unwrap());
    }
    for sbx in &made {
        lc.kill(sbx.id().as_str()).await.unwrap();
    }
    lc.settle().await;
    let killed = made.len();
    passes(100).await;
    let placed = || driver.next_slot.load(std::sync::atomic::Ordering::SeqCst);
    let destroyed = || driver.destroyed.lock().unwrap().len();
    let (placed_then, destroyed_then) = (placed(), destroyed());
    assert_eq!(destroyed_then, killed, "no pooled sandbox was destroyed");
    passes(200).await;
    assert_eq!(
        (placed(), destroyed()),
        (placed_then, destroyed_then),
        "nothing restored or destroyed with nobody creating: {:?}",
        lc.pool_loads()
    );
    stop.cancel();
    pools.await.unwrap();
}
