//! How full the host is, for its operator: sandboxes by phase and how many of them are frozen,
//! each pool, and the memory the pools and the host have left. The server shows it at
//! `/metrics`; nothing here is per API key, so no tenant sees it.

use super::{Lifecycle, Phase};
use crate::ids::TemplateName;

/// A snapshot of the host's load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLoad {
    /// Sandboxes in each phase (phases with none are left out).
    pub phases: Vec<(Phase, usize)>,
    /// Running sandboxes that are frozen now.
    pub frozen: usize,
    /// Paused sandboxes whose runtime is kept, frozen, for a fast resume; and the memory
    /// those runtimes hold, and may hold (`--paused-memory-mb`).
    pub parked: usize,
    pub parked_memory_bytes: u64,
    pub parked_memory_budget_bytes: u64,
    /// The most sandboxes that may occupy a place among the running (`--max-sandboxes`).
    pub max_sandboxes: usize,
    /// Sandboxes being launched now (restored or booted), callers' launches waiting for their
    /// turn, and the most launched at once (`--max-launches`).
    pub launches: usize,
    pub launches_queued: usize,
    pub max_launches: usize,
    pub pools: Vec<PoolLoad>,
    /// The memory all pools' ready sandboxes hold now, by their cgroups' charge.
    pub pooled_memory_bytes: u64,
    /// What they may hold together (`--pool-memory-mb`).
    pub pool_memory_budget_bytes: u64,
    /// The host's `MemAvailable` and `MemTotal`; `None` where `/proc/meminfo` is unreadable.
    pub memory_available_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    /// Golden images made, and attempts that failed, since the server started.
    pub golden_images_made: u64,
    pub golden_images_failed: u64,
    pub pool_churn: PoolChurn,
    /// Paused images moved to and from object storage.
    pub image_transfers: super::ImageTransfers,
    /// Running and paused sandboxes of each API key (by key id), in that order.
    pub per_key: Vec<(String, usize, usize)>,
}

/// One template's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLoad {
    pub template: TemplateName,
    /// Ready sandboxes in it, frozen until a create takes one.
    pub ready: usize,
    /// Restores under way into it.
    pub filling: usize,
    /// How many it keeps now: `--pool-size` plus what demand has grown it by.
    pub keep: usize,
}

/// What the pools restored and destroyed unused, since the server started: how much CPU they
/// spend (a restore costs a launch) and whether any of it was wasted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolChurn {
    /// Restores into pools.
    pub restores: u64,
    /// Ready sandboxes destroyed to make room for another template's pool or for a create.
    pub evictions: u64,
    /// Ready sandboxes destroyed unused within a minute of their restore, for any reason.
    pub wasted: u64,
}

impl Phase {
    /// The phase's name in reports: lower case, one word.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Pausing => "pausing",
            Phase::Paused => "paused",
            Phase::Resuming => "resuming",
            Phase::Snapshotting => "snapshotting",
            Phase::Stopping => "stopping",
        }
    }
}

impl Lifecycle {
    /// The host's load now.
    pub fn host_load(&self) -> HostLoad {
        let mut phases: Vec<(Phase, usize)> = Vec::new();
        let mut frozen = 0;
        for sandbox in self.sandboxes.all() {
            let phase = sandbox.phase();
            match phases.iter_mut().find(|(p, _)| *p == phase) {
                Some((_, n)) => *n += 1,
                None => phases.push((phase, 1)),
            }
            frozen += usize::from(sandbox.is_frozen());
        }
        phases.sort_by_key(|(p, _)| p.as_str());
        let (parked, parked_memory_bytes) = self.parked();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let (golden_images_made, golden_images_failed) = self.golden_counts();
        let mut per_key: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
        for record in self.list_records() {
            let Some(owner) = &record.owner else {
                continue;
            };
            let (running, paused) = per_key.entry(owner.clone()).or_default();
            match record.state {
                crate::store::SandboxState::Running => *running += 1,
                crate::store::SandboxState::Paused => *paused += 1,
            }
        }
        let (launches, launches_queued) = self.launches.load();
        HostLoad {
            launches,
            launches_queued,
            max_launches: self.limits.max_launches,
            golden_images_made,
            golden_images_failed,
            pool_churn: self.pool_churn(),
            image_transfers: self.image_transfers(),
            per_key: per_key
                .into_iter()
                .map(|(key, (running, paused))| (key, running, paused))
                .collect(),
            phases,
            frozen,
            parked: parked.len(),
            parked_memory_bytes,
            parked_memory_budget_bytes: self.limits.paused_memory_mb << 20,
            max_sandboxes: self.limits.max_sandboxes,
            pools: self.pool_loads(),
            pooled_memory_bytes: self.pooled_memory(),
            pool_memory_budget_bytes: self.limits.pool_memory_mb << 20,
            memory_available_bytes: meminfo_bytes(&meminfo, "MemAvailable:"),
            memory_total_bytes: meminfo_bytes(&meminfo, "MemTotal:"),
        }
    }
}

/// What an idle sandbox holds on the host, by its cgroup's charge (measured: 18-20 MiB).
pub const IDLE_SANDBOX_MB: u64 = 20;
/// The host's memory left to the host itself and the server, outside the sandboxes' share.
pub const HOST_RESERVE_MB: u64 = 1024;

/// The default `--max-sandboxes`: as many idle sandboxes as the host's memory holds, less the
/// host's reserve (256 where `/proc/meminfo` is unreadable).
pub fn memory_sized_max_sandboxes() -> usize {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo_bytes(&meminfo, "MemTotal:").map_or(256, |bytes| max_sandboxes_for(bytes >> 20))
}

/// [`memory_sized_max_sandboxes`] for a host of `total_mb`.
fn max_sandboxes_for(total_mb: u64) -> usize {
    (total_mb.saturating_sub(HOST_RESERVE_MB) / IDLE_SANDBOX_MB).max(1) as usize
}

/// A `/proc/meminfo` field (given in kB there), in bytes.
pub(super) fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb << 10)
}

#[cfg(test)]
mod tests {
    use super::{max_sandboxes_for, meminfo_bytes};

    #[test]
    fn the_default_room_follows_the_hosts_memory() {
        // 24 GiB: 23 GiB for sandboxes of 20 MiB.
        assert_eq!(max_sandboxes_for(24 * 1024), 1177);
        assert_eq!(max_sandboxes_for(4 * 1024), 153);
        assert_eq!(max_sandboxes_for(512), 1, "a tiny host still runs one");
    }

    #[test]
    fn reads_meminfo_fields_in_bytes() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal:"), Some(24_576_000 << 10));
        assert_eq!(meminfo_bytes(meminfo, "MemAvailable:"), Some(2 << 20));
        assert_eq!(meminfo_bytes(meminfo, "SwapTotal:"), None);
    }
}
