//! Sweeping what a crashed or stopped server left: runsc containers, bundles, netns, cgroups
//! and links that no kept sandbox names. Only this server's: its runsc root and data dir, its
//! instance's netns and cgroups, and links in its network namespace.

use crate::network::links;
use crate::GvisorDriver;
use airlock_core::driver::DriverError;
use airlock_core::ids::SandboxId;
use futures::StreamExt;
use std::collections::{BTreeSet, HashSet};

/// Orphans torn down at once by [`GvisorDriver::sweep`].
const ORPHANS_AT_ONCE: usize = 8;

impl GvisorDriver {
    /// Tears down every sandbox-like thing of this instance but the sandboxes in `keep` (with
    /// their slots).
    pub(crate) async fn sweep(&self, keep: &[(SandboxId, u32)]) -> Result<(), DriverError> {
        let keep_ids: HashSet<&str> = keep.iter().map(|(id, _)| id.as_str()).collect();
        let keep_slots: HashSet<u32> = keep.iter().map(|(_, slot)| *slot).collect();

        let mut found = BTreeSet::new();
        found.extend(self.runsc.list().await?);
        found.extend(self.bundles.ids()?);
        found.extend(
            links::netns_names()?
                .iter()
                .filter_map(|name| self.instance.netns_id(name).map(str::to_owned)),
        );
        found.extend(self.cgroups.ids());

        let mut orphans = Vec::new();
        for id in found
            .into_iter()
            .filter(|id| !keep_ids.contains(id.as_str()))
        {
            // Everything of ours carries a valid id; anything else is not ours to remove.
            if SandboxId::parse(&id).is_err() {
                tracing::warn!(name = %id, "ignoring a sandbox-like name that is not an Airlock id");
                continue;
            }
            tracing::info!(%id, "removing orphaned sandbox");
            orphans.push(id);
        }
        // Several at once: most of a teardown is `runsc delete` waiting for the sandbox to die
        // (1.5-2 s each), and a crashed server leaves every pooled sandbox behind.
        let mut teardowns = Vec::new();
        for id in &orphans {
            teardowns.push(self.teardown(id, None));
        }
        let torn_down: Vec<Result<(), DriverError>> = futures::stream::iter(teardowns)
            .buffer_unordered(ORPHANS_AT_ONCE)
            .collect()
            .await;
        let mut result = torn_down.into_iter().collect::<Result<(), _>>();
        // Links of slots no kept sandbox holds, including any whose netns was deleted above and
        // that the kernel has not removed yet.
        for slot in links::link_slots()? {
            if !keep_slots.contains(&slot) {
                tracing::info!(slot, "removing orphaned veth");
                result = result.and(self.network.forget_slot(slot).await);
            }
        }
        result
    }
}
