//! Each sandbox's CPU, memory and disk use, sampled every [`SAMPLE_EVERY`] while it runs and
//! kept for its life (E2B's sandbox metrics). Samples come from the driver (the sandbox's
//! cgroup and disk), so they count everything the sandbox holds on the host: its processes,
//! gVisor's kernel and its file server. A paused sandbox gets none until it runs again.

use super::sandbox::Phase;
use super::Lifecycle;
use crate::ids::SandboxId;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often running sandboxes are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept per sandbox: its last 24 hours (older ones are dropped).
const KEPT: usize = 24 * 3600 / 5;

/// One sample, as E2B's metrics report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When it was taken, in Unix milliseconds.
    pub at_ms: i64,
    pub cpu_count: u32,
    /// Share of its CPUs used since the previous sample, 0-100.
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub mem_total: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

#[derive(Default)]
struct Series {
    /// The previous reading of its CPU time, to take the next sample's share from.
    last_cpu: Option<(Instant, u64)>,
    samples: VecDeque<Sample>,
}

/// The samples of every sandbox the lifecycle knows.
#[derive(Default)]
pub(super) struct Metrics {
    series: Mutex<HashMap<SandboxId, Series>>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Series>> {
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Lifecycle {
    /// Samples every running sandbox every [`SAMPLE_EVERY`], until `stop` fires.
    pub async fn run_metrics(self: std::sync::Arc<Self>, stop: CancellationToken) {
        loop {
            self.sample_all();
            tokio::select! {
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Takes one sample of each running sandbox, and forgets the samples of sandboxes gone.
    fn sample_all(&self) {
        let sandboxes = self.sandboxes.all();
        // Read the host first: the lock is not held across file reads, so metrics calls
        // never wait for them.
        let readings: Vec<_> = sandboxes
            .iter()
            .filter(|s| s.phase() == Phase::Running)
            .filter_map(|s| Some((s, self.driver.usage(s.id())?)))
            .collect();
        let now = Instant::now();
        let at_ms = chrono::Utc::now().timestamp_millis();
        let mut series = self.metrics.lock();
        series.retain(|id, _| sandboxes.iter().any(|s| s.id() == id));
        for (sandbox, usage) in readings {
            let resources = sandbox.record().resources;
            let entry = series.entry(sandbox.id().clone()).or_default();
            let cpu_used_pct = match entry.last_cpu {
                Some((then, cpu_ns)) => {
                    let wall = now.duration_since(then).as_nanos() as f64;
                    let used = usage.cpu_ns.saturating_sub(cpu_ns) as f64;
                    let cpus = f64::from(resources.cpu_count.max(1));
                    (100.0 * used / (wall * cpus)).clamp(0.0, 100.0)
                }
                None => 0.0,
            };
            entry.last_cpu = Some((now, usage.cpu_ns));
            if entry.samples.len() == KEPT {
                entry.samples.pop_front();
            }
            entry.samples.push_back(Sample {
                at_ms,
                cpu_count: resources.cpu_count,
                cpu_used_pct,
                mem_used: usage.memory_bytes,
                mem_cache: usage.memory_cache_bytes,
                mem_total: u64::from(resources.memory_mb) << 20,
                disk_used: usage.disk_bytes,
                disk_total: u64::from(resources.disk_mb) << 20,
            });
        }
    }

    /// The sandbox's samples taken from `from_ms` to `to_ms` (Unix milliseconds, inclusive),
    /// oldest first.
    pub fn metrics(&self, id: &SandboxId, from_ms: i64, to_ms: i64) -> Vec<Sample> {
        self.metrics
            .lock()
            .get(id)
            .map(|s| {
                let samples = s.samples.iter();
                let within = samples.filter(|m| (from_ms..=to_ms).contains(&m.at_ms));
                within.copied().collect()
            })
            .unwrap_or_default()
    }

    /// The sandbox's latest sample, if it has one.
    pub fn latest_metrics(&self, id: &SandboxId) -> Option<Sample> {
        self.metrics
            .lock()
            .get(id)
            .and_then(|s| s.samples.back().copied())
    }
}
