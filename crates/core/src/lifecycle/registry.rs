//! Every sandbox, by id, from its admission to its kill; and admission itself. A phase change
//! that takes a place among the running, or a paused place, is made here, under the one lock
//! that also counts the places: so 40 creates at once against room for 8 give exactly 8
//! sandboxes, and no key ever holds more than its quota.

use super::sandbox::{Phase, Sandbox};
use super::{KeyQuota, LifecycleError};
use crate::ids::SandboxId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub(super) struct Registry(Mutex<HashMap<SandboxId, Arc<Sandbox>>>);

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

    /// Sandboxes that hold a place among the running (see [`Phase::occupies`]).
    pub fn occupying(&self) -> usize {
        self.map().values().filter(|s| s.phase().occupies()).count()
    }

    /// Puts back a sandbox a restart found (running or paused), with no admission.
    pub fn adopt(&self, sandbox: Arc<Sandbox>) {
        self.map().insert(sandbox.id().clone(), sandbox);
    }

    /// Admits a new sandbox (in [`Phase::Starting`]) if the server and its owner have room.
    pub fn admit(
        &self,
        sandbox: Arc<Sandbox>,
        max_sandboxes: usize,
        quota: &KeyQuota,
    ) -> Result<(), LifecycleError> {
        let mut map = self.map();
        room_to_run(&map, sandbox.owner(), max_sandboxes, quota)?;
        map.insert(sandbox.id().clone(), sandbox);
        Ok(())
    }

    /// Moves a paused sandbox to [`Phase::Resuming`] if the server and its owner have room
    /// for it to run.
    pub fn admit_resume(
        &self,
        sandbox: &Sandbox,
        max_sandboxes: usize,
        quota: &KeyQuota,
    ) -> Result<(), LifecycleError> {
        let map = self.map();
        room_to_run(&map, sandbox.owner(), max_sandboxes, quota)?;
        sandbox.enter(Phase::Resuming);
        Ok(())
    }

    /// Moves a running sandbox to [`Phase::Pausing`] if its owner may have one more paused.
    pub fn begin_pause(&self, sandbox: &Sandbox, quota: &KeyQuota) -> Result<(), LifecycleError> {
        let map = self.map();
        let paused = owned_by(&map, sandbox.owner())
            .filter(|s| matches!(s.phase(), Phase::Pausing | Phase::Paused | Phase::Resuming))
            .count();
        if paused >= quota.paused {
            return Err(LifecycleError::Quota(format!(
                "this API key may keep at most {} sandboxes paused; kill or resume one first",
                quota.paused
            )));
        }
        sandbox.enter(Phase::Pausing);
        Ok(())
    }
}

fn owned_by<'a>(
    map: &'a HashMap<SandboxId, Arc<Sandbox>>,
    owner: Option<&'a str>,
) -> impl Iterator<Item = &'a Arc<Sandbox>> + 'a {
    map.values().filter(move |s| s.owner() == owner)
}

fn room_to_run(
    map: &HashMap<SandboxId, Arc<Sandbox>>,
    owner: Option<&str>,
    max_sandboxes: usize,
    quota: &KeyQuota,
) -> Result<(), LifecycleError> {
    if map.values().filter(|s| s.phase().occupies()).count() >= max_sandboxes {
        return Err(LifecycleError::Capacity(max_sandboxes));
    }
    let running = owned_by(map, owner)
        .filter(|s| s.phase().occupies())
        .count();
    if running >= quota.running {
        return Err(LifecycleError::Quota(format!(
            "this API key may run at most {} sandboxes at once; kill or pause one first",
            quota.running
        )));
    }
    Ok(())
}
