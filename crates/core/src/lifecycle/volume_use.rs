//! Which sandboxes hold a volume, so that a volume is never deleted under one.

use super::{Lifecycle, LifecycleError};
use crate::store::SandboxRecord;
use crate::volumes::VolumeError;
use std::time::{Duration, Instant};

/// How long a delete waits for killed sandboxes that mounted the volume to be torn down.
const RELEASE_WAIT: Duration = Duration::from_secs(30);

fn mounts(record: &SandboxRecord, volume_id: &str) -> bool {
    record
        .volume_mounts
        .iter()
        .any(|m| m.volume_id == volume_id)
}

impl Lifecycle {
    /// Deletes `owner`'s volume `id` and its files; `false` if it has none such. Refused while
    /// a sandbox that mounts it is starting, running or paused; a killed one is waited for
    /// (its host cleanup runs after the kill has answered). Snapshots do not hold a volume: a
    /// sandbox started from one whose volume is gone is refused instead.
    pub async fn delete_volume(&self, owner: &str, id: &str) -> Result<bool, LifecycleError> {
        let volume = match self.volumes.get(owner, id).await {
            Ok(volume) => volume,
            Err(VolumeError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let in_use = |sandbox: String| {
            Err(LifecycleError::Volume(VolumeError::InUse {
                name: volume.name.clone(),
                sandbox,
            }))
        };
        if let Some(user) = self.sandboxes.find(|s| mounts(&s.record(), id)) {
            return in_use(user.id().to_string());
        }
        let deadline = Instant::now() + RELEASE_WAIT;
        while let Some(user) = self
            .store
            .sandboxes()
            .all()
            .await?
            .into_iter()
            .find(|s| mounts(s, id))
        {
            if Instant::now() > deadline {
                return in_use(user.id.to_string());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(self.volumes.delete(&volume).await?)
    }
}
