//! What the pools are meant to hold, decided from demand alone, and how fast they may be
//! filled: pure, so the policy is tested without a runtime.
//!
//! Pools once thrashed: the memory budget was checked against what the ready sandboxes held
//! at that moment, so the least wanted pool refilled whenever the measure dipped under the
//! budget and a pool wanted more lately took that sandbox back once it rose again, restoring
//! and destroying sandboxes in a loop with nobody using the server. Here the targets depend
//! only on when each template was wanted, what demand asks it to keep and an estimate of what
//! its sandboxes hold, all of which move only when creates come; a ready sandbox given to
//! another template must have waited `min_age` first, and every restore spends a token of
//! [`RestoreBudget`].

use std::time::{Duration, Instant};

/// One template's pool as the plan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PoolDemand {
    /// How long since a create last wanted it (or it was built, or first seen).
    pub idle_for: Duration,
    /// What it keeps before any other pool grows: `--pool-size`.
    pub base: usize,
    /// What demand asks it to keep, growth included.
    pub keep: usize,
    /// What one of its ready sandboxes holds.
    pub each_bytes: u64,
}

impl PoolDemand {
    /// A pool of `pool_size` grown to `grown` by creates that found it empty, or nothing once
    /// nobody has wanted it for `idle_after`: an unused template has only its golden image.
    pub fn new(
        idle_for: Duration,
        idle_after: Duration,
        pool_size: usize,
        grown: usize,
        each_bytes: u64,
    ) -> Self {
        let idle = idle_for >= idle_after;
        PoolDemand {
            idle_for,
            base: if idle { 0 } else { pool_size.min(grown) },
            keep: if idle { 0 } else { grown },
            each_bytes,
        }
    }
}

/// How many ready sandboxes each pool is meant to hold, in the order given, while
/// `budget_bytes` and `room` (sandboxes the host may still hold) last: first every pool its
/// `base`, then growth; in each round the pool wanted most lately first. So a burst that
/// grows one pool takes no other template's sandboxes, only what they leave. The last pool
/// served may pass the budget by part of one sandbox, so a budget smaller than one sandbox
/// still pools one. Ties keep the given order, so the same pools win on every pass.
pub(super) fn targets(pools: &[PoolDemand], budget_bytes: u64, room: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..pools.len()).collect();
    order.sort_by_key(|&i| pools[i].idle_for);
    let mut targets = vec![0; pools.len()];
    let (mut bytes_left, mut room_left) = (budget_bytes, room);
    let rounds: [fn(&PoolDemand) -> usize; 2] = [|p| p.base, |p| p.keep];
    for round in rounds {
        for &i in &order {
            let pool = &pools[i];
            let wanted = round(pool).saturating_sub(targets[i]);
            if wanted == 0 || bytes_left == 0 {
                continue;
            }
            let fits = bytes_left.div_ceil(pool.each_bytes.max(1));
            let n = wanted.min(room_left).min(fits as usize);
            targets[i] += n;
            room_left -= n;
            bytes_left = bytes_left.saturating_sub(n as u64 * pool.each_bytes);
        }
    }
    targets
}

/// How many of a pool's ready sandboxes, ready for the durations given (oldest first), go:
/// all of a pool that keeps nothing (its template is unused); else those beyond its target
/// that waited `min_age`, oldest first. So no restore is thrown away before it could serve a
/// create, whether the pool shrank or another template's needs the room.
pub(super) fn surplus(ages: &[Duration], keep: usize, target: usize, min_age: Duration) -> usize {
    if keep == 0 {
        return ages.len();
    }
    let over = ages.len().saturating_sub(target.min(keep));
    ages.iter()
        .take(over)
        .take_while(|age| **age >= min_age)
        .count()
}

/// The pools' CPU budget: a token bucket of restores. It holds up to half a minute's worth,
/// so a pool emptied by a burst refills at once, and refills at `per_minute`, so no policy,
/// however wrong, can keep the host busy restoring.
#[derive(Debug)]
pub(super) struct RestoreBudget {
    per_minute: u32,
    tokens: f64,
    at: Instant,
}

impl RestoreBudget {
    pub fn new(per_minute: u32, now: Instant) -> Self {
        RestoreBudget {
            per_minute,
            tokens: Self::capacity(per_minute),
            at: now,
        }
    }

    fn capacity(per_minute: u32) -> f64 {
        (f64::from(per_minute) / 2.0).max(1.0)
    }

    /// Spends a token for one restore, if one is left at `now`.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() / 60.0
            * f64::from(self.per_minute);
        self.tokens = (self.tokens + earned).min(Self::capacity(self.per_minute));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
