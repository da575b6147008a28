//! Every sandbox of this node, by id, from its admission to its kill; and the node's share of
//! admission. A phase change that takes a place among the node's running is made here, under
//! the one lock that also counts the places: so 40 creates at once against room for 8 give
//! exactly 8 sandboxes. A key's quotas hold across nodes, so the sandbox catalog admits them
//! (`store::SandboxRecords::admit`).

use super::sandbox::{Phase, Sandbox};
use super::LifecycleError;
use crate::ids::SandboxId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub(super) struct Registry(Mutex<HashMap<SandboxId, Arc<Sandbox>>>);

/// See [`Registry::remove_on_drop`].
pub(super) struct Removal<'a> {
    registry: &'a Registry,
    id: SandboxId,
}

impl Drop for Removal<'_> {
    fn drop(&mut self) {
        self.registry.remove(&self.id);
    }
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, id: &SandboxId) -> Option<Arc<Sandbox>> {
        self.map().get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        self.map().values().cloned().collect()
    }

    pub fn find(&self, matches: impl Fn(&Sandbox) -> bool) -> Option<Arc<Sandbox>> {
        self.map().values().find(|s| matches(s)).cloned()
    }

    pub fn remove(&self, id: &SandboxId) {
        self.map().remove(id);
    }

    /// Removes `id` when the guard is dropped: at the end of the caller's scope, or when the
    /// caller's future is cancelled, so that an id is never left taken.
    pub fn remove_on_drop(&self, id: SandboxId) -> Removal<'_> {
        Removal { registry: self, id }
    }

    /// Sandboxes that hold a place among the running (see [`Phase::occupies`]).
    pub fn occupying(&self) -> usize {
        self.map().values().filter(|s| s.phase().occupies()).count()
    }

    /// Puts back a sandbox a restart found (running or paused), with no admission.
    pub fn adopt(&self, sandbox: Arc<Sandbox>) {
        self.map().insert(sandbox.id().clone(), sandbox);
    }

    /// Admits a new sandbox (in [`Phase::Starting`]) if the node has room.
    pub fn admit(&self, sandbox: Arc<Sandbox>, max_sandboxes: usize) -> Result<(), LifecycleError> {
        let mut map = self.map();
        room_to_run(&map, max_sandboxes)?;
        map.insert(sandbox.id().clone(), sandbox);
        Ok(())
    }

    /// Moves a paused sandbox to [`Phase::Resuming`] if the node has room for it to run.
    pub fn admit_resume(
        &self,
        sandbox: &Sandbox,
        max_sandboxes: usize,
    ) -> Result<(), LifecycleError> {
        let map = self.map();
        room_to_run(&map, max_sandboxes)?;
        sandbox.enter(Phase::Resuming);
        Ok(())
    }
}

fn room_to_run(
    map: &HashMap<SandboxId, Arc<Sandbox>>,
    max_sandboxes: usize,
) -> Result<(), LifecycleError> {
    if map.values().filter(|s| s.phase().occupies()).count() >= max_sandboxes {
        return Err(LifecycleError::Capacity(max_sandboxes));
    }
    Ok(())
}
