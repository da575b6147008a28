//! Pools: for each template, a few sandboxes already restored from its golden image (see
//! `goldens.rs`), so that a create only hands one over. Pooled sandboxes belong to no one and are not in the registry; they hold no place
//! among the running until a create admits them. Each is still a sandbox on the host, so pools
//! fill only the room that running sandboxes leave under `max_sandboxes`, and give way to a
//! create admitted at that cap.
//!
//! A pool grows with demand: each create that finds it empty makes it keep one more (up to
//! `pool_max`), so the next burst of creates finds them ready. It shrinks back by half each
//! `pool_shrink_after` in which no create found it empty. What each pool holds within the
//! memory budget, and how fast pools are filled, is `pool_plan`'s decision.

use super::create::{Launch, Started};
use super::launches::Turn;
use super::load::IDLE_SANDBOX_MB;
use super::pool_plan::{surplus, targets, PoolDemand, RestoreBudget};
use super::{available_memory_mb, Lifecycle};
use crate::egress::Egress;
use crate::ids::{SandboxId, TemplateName};
use crate::store::TemplateRecord;
use airlock_wire::envd::InitRequest;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Ready sandboxes of each template, and the turn to make golden images.
#[derive(Default)]
pub(super) struct Pools {
    ready: Mutex<HashMap<TemplateName, Pool>>,
    /// Held while a golden image is made, a built template published or stale images
    /// deleted: so no image is made twice, nor deleted as stale while its template is being
    /// published.
    pub(super) golden_turn: tokio::sync::Mutex<()>,
    /// Golden images made, and attempts that failed, since the server started.
    pub(super) goldens_made: AtomicU64,
    pub(super) goldens_failed: AtomicU64,
    /// Since the server started: restores into pools; ready sandboxes destroyed to make room
    /// for another template's or a create; and ready sandboxes destroyed, for any reason,
    /// within [`WASTED_WITHIN`] of being ready, none of which served a create.
    restores: AtomicU64,
    evictions: AtomicU64,
    wasted: AtomicU64,
}

/// A ready sandbox destroyed unused sooner than this after its restore was a wasted restore.
const WASTED_WITHIN: Duration = Duration::from_secs(60);

/// A ready sandbox in its pool.
struct Pooled {
    started: Started,
    ready_at: Instant,
    /// It has settled and been frozen (or the freeze was tried): a create thaws it.
    settled: bool,
    /// What it held once frozen (measured once: the pools' plan moves only with demand).
    bytes: Option<u64>,
}

impl Pooled {
    fn new(started: Started) -> Self {
        Pooled {
            started,
            ready_at: Instant::now(),
            settled: false,
            bytes: None,
        }
    }
}

#[derive(Default)]
struct Pool {
    ready: Vec<Pooled>,
    /// Restores under way.
    filling: usize,
    /// When a create last asked for one (or the template was published, or first seen).
    wanted_at: Option<Instant>,
    /// Kept ready beyond `pool_size`: one more for each create that found the pool empty.
    extra: usize,
    /// When a create last found the pool empty, or `extra` was last halved.
    missed_at: Option<Instant>,
    /// What one of its ready sandboxes holds, as last measured on settled ones.
    each_bytes: Option<u64>,
}

impl Pool {
    /// What its settled ready sandboxes hold on average, if any was measured.
    fn settled_size(&self) -> Option<u64> {
        let sizes: Vec<u64> = self.ready.iter().filter_map(|p| p.bytes).collect();
        (!sizes.is_empty()).then(|| sizes.iter().sum::<u64>() / sizes.len() as u64)
    }

    /// What demand asks it to keep, before the memory budget and the room on the host.
    fn grown(&self, pool_size: usize) -> usize {
        pool_size + self.extra
    }
}

/// The sandboxes all pools hold: ready ones and restores under way.
fn held(pools: &HashMap<TemplateName, Pool>) -> usize {
    pools.values().map(|p| p.ready.len() + p.filling).sum()
}

impl Pools {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TemplateName, Pool>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ready sandboxes and restores under way, in all pools: each holds a sandbox's room on
    /// the host.
    pub fn count(&self) -> usize {
        held(&self.lock())
    }

    /// Ready sandboxes and restores under way in one template's pool.
    fn held_by(&self, template: &TemplateName) -> usize {
        self.lock()
            .get(template)
            .map_or(0, |p| p.ready.len() + p.filling)
    }

    /// Takes a ready sandbox out of the pool wanted least lately.
    fn take_least_wanted(&self) -> Option<(TemplateName, Pooled)> {
        let mut pools = self.lock();
        let (name, pool) = pools
            .iter_mut()
            .filter(|(_, pool)| !pool.ready.is_empty())
            .min_by_key(|(_, pool)| pool.wanted_at)?;
        Some((name.clone(), pool.ready.remove(0)))
    }

    /// A create of `template` is to be expected now (it was just built).
    pub(super) fn wanted_now(&self, template: &TemplateName) {
        self.lock().entry(template.clone()).or_default().wanted_at = Some(Instant::now());
    }

    /// Every pooled sandbox, taken out of the pools.
    pub fn drain(&self) -> Vec<Started> {
        self.lock()
            .values_mut()
            .flat_map(|p| p.ready.drain(..))
            .map(|p| p.started)
            .collect()
    }
}

impl Lifecycle {
    /// How pooled sandboxes and golden images are started: in the background, after every
    /// caller's launch.
    pub(super) fn default_launch(&self) -> Launch {
        Launch {
            turn: Turn::Background,
            resources: self.limits.default_resources,
            egress: Egress::default(),
            volumes: Vec::new(),
        }
    }

    /// Every pool as it is now, by template.
    pub(super) fn pool_loads(&self) -> Vec<super::PoolLoad> {
        let mut loads: Vec<super::PoolLoad> = self
            .pools
            .lock()
            .iter()
            .map(|(template, pool)| super::PoolLoad {
                template: template.clone(),
                ready: pool.ready.len(),
                filling: pool.filling,
                keep: pool.grown(self.limits.pool_size),
            })
            .collect();
        loads.sort_by(|a, b| a.template.cmp(&b.template));
        loads
    }

    /// Takes a ready sandbox of the template from its pool, if one is there. Either way the
    /// template is wanted now: an emptied pool is filled again, and one found empty grows.
    pub(super) fn take_pooled(&self, template: &TemplateRecord) -> Option<Started> {
        let pooled = {
            let mut pools = self.pools.lock();
            let pool = pools.entry(template.name.clone()).or_default();
            pool.wanted_at = Some(Instant::now());
            let pooled = pool.ready.pop();
            if pooled.is_none() {
                let most = self.limits.pool_max.saturating_sub(self.limits.pool_size);
                pool.extra = (pool.extra + 1).min(most);
                pool.missed_at = Some(Instant::now());
            }
            pooled
        };
        self.refill.notify_one();
        let pooled = pooled?;
        if pooled.settled {
            self.set_pooled_frozen(&pooled.started.id, false);
        }
        if pooled.started.image.as_deref() != Some(self.golden_image(template).as_str()) {
            // Restored before the template was rebuilt.
            self.discard_pooled(pooled);
            return None;
        }
        Some(pooled.started)
    }

    /// Destroys a ready sandbox no create took, in the background (each takes seconds, and
    /// other pools wait meanwhile), counting a restore wasted if it was that young.
    fn discard_pooled(&self, pooled: Pooled) {
        if pooled.ready_at.elapsed() < WASTED_WITHIN {
            self.pools.wasted.fetch_add(1, Ordering::Relaxed);
        }
        let Started { id, placement, .. } = pooled.started;
        self.destroying.spawn(self.release(id, placement.slot));
    }

    /// Puts back a pooled sandbox a create took from the template's pool and could not use
    /// (it was refused admission).
    pub(super) fn return_pooled(&self, template: &TemplateName, pooled: Started) {
        // It settles again (it did nothing meanwhile) before it is frozen.
        self.pools
            .lock()
            .entry(template.clone())
            .or_default()
            .ready
            .push(Pooled::new(pooled));
    }

    /// Makes room for a sandbox just admitted to run: pooled sandboxes hold no place among
    /// the running, yet each is a sandbox on the host, so at `--max-sandboxes` ready ones give
    /// way, from the pools wanted least lately.
    pub(super) fn pools_give_way(&self) {
        while self.sandboxes.occupying() + self.pools.count() > self.limits.max_sandboxes {
            let Some((name, pooled)) = self.pools.take_least_wanted() else {
                return;
            };
            tracing::info!(template = %name, "the server is at --max-sandboxes: a ready pooled sandbox gives way to a create");
            self.pools.evictions.fetch_add(1, Ordering::Relaxed);
            self.discard_pooled(pooled);
        }
    }

    /// Freezes the ready sandboxes that have waited in their pools for `settle`: nothing of
    /// anyone's runs in them yet. Not at once: a freshly restored sandbox has work of its own
    /// to finish first (the code interpreter's kernel, ~70 ms of it), which freezing it at
    /// once would leave for its first user's request.
    pub(super) fn freeze_settled_pooled(&self, settle: Duration) {
        let mut pools = self.pools.lock();
        for pooled in pools.values_mut().flat_map(|p| p.ready.iter_mut()) {
            if !pooled.settled && pooled.ready_at.elapsed() >= settle {
                pooled.settled = true;
                self.set_pooled_frozen(&pooled.started.id, true);
                pooled.bytes = self.driver.memory_used(&pooled.started.id);
            }
        }
    }

    /// Freezes a ready sandbox, or thaws it when a create takes it. A failure is logged: the
    /// create then finds its agent not answering, as for any broken pooled sandbox.
    fn set_pooled_frozen(&self, id: &SandboxId, frozen: bool) {
        if let Err(e) = self.driver.set_frozen(id, frozen) {
            tracing::warn!(sandbox = %id, frozen, error = %e, "freezing or thawing a pooled sandbox failed");
        }
    }

    /// Keeps every template's golden image made and its pool filled as planned, until `stop`
    /// fires.
    pub async fn run_pools(self: Arc<Self>, stop: CancellationToken) {
        if self.limits.pool_size == 0 {
            return;
        }
        let mut announced = HashSet::new();
        let mut restores = RestoreBudget::new(self.limits.pool_restores_per_min, Instant::now());
        loop {
            // A draining node keeps no pools (see `drain.rs`).
            let templates = if self.draining() {
                Vec::new()
            } else {
                self.store
                    .templates()
                    .named_templates()
                    .await
                    .unwrap_or_default()
            };
            let pass_started = Instant::now();
            let mut pooled = Vec::new();
            for template in &templates {
                if stop.is_cancelled() {
                    return;
                }
                let golden = self.golden_image(template);
                if !self.driver.has_image(&golden) {
                    // A build publishing a template holds the turn while its start command gets
                    // ready (minutes, perhaps): the other pools are filled meanwhile.
                    let Ok(_turn) = self.pools.golden_turn.try_lock() else {
                        continue;
                    };
                    if self.driver.has_image(&golden) {
                        continue;
                    }
                    match self.make_golden(template, Some(&golden)).await {
                        Ok(()) => self.delete_stale_goldens().await,
                        Err(e) => {
                            tracing::warn!(template = %template.name, error = %e, "making the golden image failed")
                        }
                    }
                    continue;
                }
                if announced.insert(golden.clone()) {
                    tracing::info!(template = %template.name, image = %golden, "golden image reused");
                }
                pooled.push((template, golden));
            }
            let plan = self.plan_pools(pooled.iter().map(|(t, _)| *t), pass_started);
            for (i, target) in plan {
                let (template, golden) = &pooled[i];
                if !self
                    .fill_pool(template, golden, target, &mut restores, &stop)
                    .await
                {
                    break;
                }
            }
            tokio::select! {
                _ = self.refill.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// What each template's pool is meant to hold now ([`targets`]): the templates' indexes
    /// and targets, the pool wanted most lately first. Pools shrink as demand fades, and give
    /// up what they hold beyond their target (see [`surplus`]). A template seen for the
    /// first time counts as wanted from the start of the pass that found it
    /// (`pass_started`): templates found together are wanted alike.
    fn plan_pools<'a>(
        &self,
        templates: impl Iterator<Item = &'a TemplateRecord>,
        pass_started: Instant,
    ) -> Vec<(usize, usize)> {
        let templates: Vec<&TemplateRecord> = templates.collect();
        let room = self
            .limits
            .max_sandboxes
            .saturating_sub(self.sandboxes.occupying());
        let mut pools = self.pools.lock();
        let demands: Vec<PoolDemand> = templates
            .iter()
            .map(|template| {
                let pool = pools.entry(template.name.clone()).or_default();
                let wanted_at = *pool.wanted_at.get_or_insert(pass_started);
                let idle_for = wanted_at.elapsed();
                if idle_for >= self.limits.pool_idle {
                    pool.extra = 0;
                }
                self.decay(template, pool);
                pool.each_bytes = pool.settled_size().or(pool.each_bytes);
                let each_bytes = pool.each_bytes.unwrap_or(IDLE_SANDBOX_MB << 20);
                let (size, idle_after) = (self.limits.pool_size, self.limits.pool_idle);
                PoolDemand::new(idle_for, idle_after, size, pool.grown(size), each_bytes)
            })
            .collect();
        let targets = targets(&demands, self.limits.pool_memory_mb << 20, room);
        for ((template, demand), &target) in templates.iter().zip(&demands).zip(&targets) {
            let pool = pools.get_mut(&template.name).expect("entered above");
            let ages: Vec<Duration> = pool.ready.iter().map(|p| p.ready_at.elapsed()).collect();
            let going = surplus(&ages, demand.keep, target, self.limits.pool_min_age);
            let unkept = ages.len().saturating_sub(demand.keep).min(going);
            if going == 0 {
                continue;
            }
            if demand.keep == 0 {
                tracing::info!(template = %template.name, sandboxes = going, "emptying the pool of a template nobody created a sandbox of lately");
            } else if going > unkept {
                tracing::info!(template = %template.name, sandboxes = going - unkept, "the pools' memory budget goes to templates wanted more lately: ready sandboxes give way");
            }
            let evicted = (going - unkept) as u64;
            self.pools.evictions.fetch_add(evicted, Ordering::Relaxed);
            for pooled in pool.ready.drain(..going).collect::<Vec<_>>() {
                self.discard_pooled(pooled);
            }
        }
        let mut plan: Vec<(usize, usize)> = targets.into_iter().enumerate().collect();
        plan.sort_by_key(|&(i, _)| demands[i].idle_for);
        plan
    }

    /// Halves what a pool keeps beyond `pool_size` once no create has found it empty for
    /// `pool_shrink_after`.
    fn decay(&self, template: &TemplateRecord, pool: &mut Pool) {
        let calm = pool
            .missed_at
            .is_none_or(|at| at.elapsed() >= self.limits.pool_shrink_after);
        if pool.extra > 0 && calm {
            pool.extra /= 2;
            pool.missed_at = Some(Instant::now());
            tracing::info!(template = %template.name, keep = pool.grown(self.limits.pool_size), "no create found the pool empty lately: it shrinks");
        }
    }

    /// What the pools restored and destroyed unused since the server started.
    pub(super) fn pool_churn(&self) -> super::PoolChurn {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        super::PoolChurn {
            restores: read(&self.pools.restores),
            evictions: read(&self.pools.evictions),
            wasted: read(&self.pools.wasted),
        }
    }

    /// Restores sandboxes from the golden image until the pool holds `target`, while the host
    /// has memory to spare, the pools' memory budget and the room under --max-sandboxes last,
    /// and the restore budget has a token for each. Returns false once that budget is spent:
    /// no other pool is filled this pass.
    async fn fill_pool(
        &self,
        template: &TemplateRecord,
        golden: &str,
        target: usize,
        restores: &mut RestoreBudget,
        stop: &CancellationToken,
    ) -> bool {
        loop {
            // First, as it is cheap: most passes find every pool as planned. Only this task
            // fills pools, so a pool below its target stays below until it does.
            if self.pools.held_by(&template.name) >= target {
                return true;
            }
            if stop.is_cancelled() || available_memory_mb() < self.limits.pool_min_available_mb {
                return true;
            }
            // Refills yield to creates: while callers' launches wait or use every place, a
            // refill would only slow them (the pass comes back within seconds).
            if !self.launches.idle() {
                return true;
            }
            // What the pools hold now only stops a fill: it never takes another pool's
            // sandbox (the plan does that, from demand), so its ups and downs move nothing.
            if self.pooled_memory() >= self.limits.pool_memory_mb << 20 {
                return true;
            }
            // Pools fill only the room that running sandboxes leave under --max-sandboxes.
            if self.sandboxes.occupying() + self.pools.count() >= self.limits.max_sandboxes {
                return true;
            }
            if !restores.try_take(Instant::now()) {
                return false;
            }
            self.pools
                .lock()
                .entry(template.name.clone())
                .or_default()
                .filling += 1;
            self.pools.restores.fetch_add(1, Ordering::Relaxed);
            let id = SandboxId::generate();
            let result = self
                .restore_golden(&id, template, golden, self.default_launch())
                .await;
            let result = match result {
                Ok(started) => {
                    // The hostname now: the restored copy becomes itself before anyone asks.
                    let init = InitRequest {
                        default_user: Some(template.defaults.user.clone()),
                        default_workdir: template.defaults.workdir.clone(),
                        hostname: Some(started.id.to_string()),
                        ..Default::default()
                    };
                    match self.agent.init(started.placement.agent, None, &init).await {
                        Ok(()) => Ok(started),
                        Err(e) => {
                            self.release(started.id, started.placement.slot).await;
                            Err(e.into())
                        }
                    }
                }
                Err(e) => Err(e),
            };
            let occupying = self.sandboxes.occupying();
            let mut pools = self.pools.lock();
            if let Some(pool) = pools.get_mut(&template.name) {
                pool.filling -= 1;
            }
            let pooled = held(&pools);
            let pool = pools.entry(template.name.clone()).or_default();
            match result {
                // Creates took the room meanwhile (they do not wait for restores under way).
                Ok(started) if occupying + pooled >= self.limits.max_sandboxes => {
                    drop(pools);
                    self.discard_pooled(Pooled::new(started));
                    return true;
                }
                Ok(started) => pool.ready.push(Pooled::new(started)),
                Err(e) => {
                    tracing::warn!(template = %template.name, error = %e, "filling the pool failed");
                    return true;
                }
            }
        }
    }

    /// The memory all pools' ready sandboxes hold now.
    pub(super) fn pooled_memory(&self) -> u64 {
        let ids: Vec<SandboxId> = self
            .pools
            .lock()
            .values()
            .flat_map(|p| p.ready.iter().map(|s| s.started.id.clone()))
            .collect();
        ids.iter()
            .filter_map(|id| self.driver.memory_used(id))
            .sum()
    }
}
