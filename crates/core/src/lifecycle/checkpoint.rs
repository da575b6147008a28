//! The verbs built on checkpoints: pause, resume, snapshot and fork. Each holds the sandbox's
//! verb lock from start to end, moves it through its own phase, and leaves it as it was if it
//! fails: a pause or snapshot that cannot be written (a full disk, say) leaves it running, a
//! resume that cannot start leaves it paused.

use super::sandbox::{Phase, Sandbox};
use super::{now_unix, paused_image, snapshot_image, CreateParams, Lifecycle, LifecycleError};
use crate::driver::DriverError;
use crate::ids::{SandboxId, TemplateName};
use crate::store::{EventType, PauseMode, SandboxState, SnapshotRecord};
use std::sync::Arc;
use std::time::Duration;

/// How long a pause that needs the sandbox's agent waits for it to answer.
const GUEST_CHECK: Duration = Duration::from_secs(2);

/// A failed checkpoint as the API reports it: a full disk is the caller's to hear about.
pub(super) fn checkpoint_error(e: DriverError) -> LifecycleError {
    match e {
        DriverError::NoSpace(what) => LifecycleError::NoSpace(what),
        other => LifecycleError::Driver(other),
    }
}

impl Lifecycle {
    /// Pauses a running sandbox, and it stops taking a slot. A full pause puts its memory,
    /// processes and files on disk; a filesystem-only one ends its processes first (so little
    /// but its files goes to disk), and its resume starts it afresh. With `healthy_guest`, or
    /// for a filesystem-only pause, a sandbox whose agent does not answer is refused. On
    /// failure (a full disk, say) it keeps running as it was, except that the processes a
    /// filesystem-only pause ended stay ended.
    pub async fn pause(
        &self,
        id: &str,
        mode: PauseMode,
        healthy_guest: bool,
    ) -> Result<(), LifecycleError> {
        let sandbox = self.find(id)?;
        let Some(_verb) = sandbox.lock_verb().await else {
            return Err(LifecycleError::Busy(id.to_owned()));
        };
        self.pause_locked(&sandbox, mode, healthy_guest).await
    }

    /// [`Lifecycle::pause`] of a sandbox whose verb lock the caller holds.
    pub(super) async fn pause_locked(
        &self,
        sandbox: &Arc<Sandbox>,
        mode: PauseMode,
        healthy_guest: bool,
    ) -> Result<(), LifecycleError> {
        let id = sandbox.id().as_str();
        let placement = match (sandbox.phase(), sandbox.placement()) {
            (Phase::Running, Some(placement)) => placement,
            (Phase::Paused, _) => return Err(LifecycleError::AlreadyPaused(id.to_owned())),
            _ => return Err(LifecycleError::SandboxNotFound(id.to_owned())),
        };
        let _awake = self.wake(sandbox);
        if healthy_guest || mode == PauseMode::Filesystem {
            self.agent
                .wait_ready(placement.agent, GUEST_CHECK)
                .await
                .map_err(|e| LifecycleError::GuestUnresponsive(format!("{e}; not paused")))?;
        }
        let quota = self.quota(sandbox.owner()).await?;
        self.admit_pause(sandbox, &quota).await?;
        let paused = self.save_paused(sandbox, placement, mode).await;
        if paused.is_err() {
            self.end_transition(sandbox.id()).await;
        }
        paused
    }

    /// The rest of a pause once admitted: on failure the sandbox runs on as it was.
    async fn save_paused(
        &self,
        sandbox: &Arc<Sandbox>,
        placement: crate::driver::Placement,
        mode: PauseMode,
    ) -> Result<(), LifecycleError> {
        sandbox.cut_streams();
        let record = sandbox.record();
        let image = paused_image(&record.id);
        let back = |e: LifecycleError| {
            sandbox.set_phase(Phase::Running, Some(placement));
            Err(e)
        };
        let token = sandbox.access_token();
        if mode == PauseMode::Filesystem {
            if let Err(e) = self.agent.reboot(placement.agent, token.as_deref()).await {
                return back(LifecycleError::GuestUnresponsive(format!(
                    "ending its processes failed: {e}; not paused"
                )));
            }
        }
        if let Err(e) = self
            .driver
            .checkpoint(&record.id, placement.slot, &image)
            .await
        {
            tracing::warn!(sandbox = %record.id, error = %e, "pause failed; sandbox keeps running");
            return back(checkpoint_error(e));
        }
        // Read from the sandbox that still runs after its checkpoint, and not before it: with
        // runsc 20240729, a checkpoint taken right after this read left an image whose agent
        // crashed on restore in about 1 resume in 25 (docs/design.md).
        let log = self
            .agent
            .logs(placement.agent, token.as_deref())
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(sandbox = %record.id, error = %e, "reading its log after its checkpoint failed");
                Vec::new()
            });
        // Before the catalog says paused, so that another node can resume it from there.
        self.upload_paused(&record.id, &image).await;
        let stored = self
            .store
            .sandboxes()
            .set_state(
                &record.id,
                SandboxState::Paused,
                None,
                record.end_at,
                Some(mode),
            )
            .await;
        if let Err(e) = stored {
            let _ = self.driver.delete_image(&image).await;
            self.forget_paused(&record.id, false).await;
            return back(e.into());
        }
        let parked = self.park(&record.id, placement, &record.egress);
        if parked.is_none() {
            // Waited for, not backgrounded: a resume right after must find the id free.
            self.release(record.id.clone(), placement.slot).await;
        }
        sandbox.update_record(|r| r.pause_mode = Some(mode));
        sandbox.set_phase(Phase::Paused, None);
        sandbox.keep_paused_log(log);
        if let Some(parked) = parked {
            sandbox.park(parked);
            self.evict_parked();
        }
        self.emit(&sandbox.record(), EventType::Paused, None);
        tracing::info!(sandbox = %record.id, mode = mode.as_str(), "paused");
        Ok(())
    }

    /// Resumes a paused sandbox with a new deadline `timeout` from now: where it left off, or,
    /// when its pause kept its files only or `how` asks for a reboot (E2B's
    /// `on_resume="reboot"`), afresh on its files, with its template's start command run again.
    /// On failure it stays paused as it was.
    pub async fn resume(
        &self,
        id: &str,
        timeout: Option<Duration>,
        how: PauseMode,
    ) -> Result<Arc<Sandbox>, LifecycleError> {
        let timeout = self.clamp_timeout(timeout)?;
        let sandbox = self.find(id)?;
        let Some(_verb) = sandbox.lock_verb().await else {
            return Err(LifecycleError::Busy(id.to_owned()));
        };
        match sandbox.phase() {
            Phase::Paused => {}
            Phase::Running => return Err(LifecycleError::AlreadyRunning(id.to_owned())),
            _ => return Err(LifecycleError::SandboxNotFound(id.to_owned())),
        }
        let quota = self.quota(sandbox.owner()).await?;
        self.admit_resume(&sandbox, &quota).await?;
        // Once admitted: its volumes may wait in object storage (its node was drained).
        let mounts = sandbox.record().volume_mounts.clone();
        let resumed = match self.volumes.bring_here(sandbox.owner(), &mounts).await {
            Ok(()) => self.restore_paused(&sandbox, timeout, how).await,
            Err(e) => Err(e.into()),
        };
        if resumed.is_err() {
            self.end_transition(sandbox.id()).await;
        }
        resumed
    }

    /// The rest of a resume once admitted: on failure the sandbox stays paused as it was.
    async fn restore_paused(
        &self,
        sandbox: &Arc<Sandbox>,
        timeout: Duration,
        how: PauseMode,
    ) -> Result<Arc<Sandbox>, LifecycleError> {
        let id = sandbox.id().as_str();
        self.pools_give_way();
        let record = sandbox.record();
        let launch = self.launch_of(&record);
        let turn = launch.turn;
        let spec = launch.spec(&record.id, &record.rootfs);
        let image = paused_image(&record.id);
        let here = match self.driver.has_image(&image) {
            true => Ok(true),
            // Paused on another node, or this disk lost it: object storage may have it.
            false => self.fetch_paused(&record.id, &image).await,
        };
        let gone = match here {
            Ok(true) => None,
            Ok(false) => {
                tracing::error!(sandbox = %record.id, image, "the paused image is gone; cannot resume");
                Some(LifecycleError::ImageGone(id.to_owned()))
            }
            Err(e) => Some(e),
        };
        if let Some(e) = gone {
            sandbox.set_phase(Phase::Paused, None);
            return Err(e);
        }
        let thawed = match sandbox.take_parked() {
            Some(parked) => self.unpark(sandbox, parked).await,
            None => None,
        };
        let brought_up = match thawed {
            Some(placement) => Ok(placement),
            None => self.bring_up(&spec, Some(&image), turn).await,
        };
        let placement = match brought_up {
            Ok(placement) => placement,
            Err(e) => {
                tracing::warn!(sandbox = %record.id, error = %e, "resume failed; sandbox stays paused");
                sandbox.set_phase(Phase::Paused, None);
                return Err(e);
            }
        };
        let saved = record.pause_mode.unwrap_or_default();
        let rebooted = if saved == PauseMode::Filesystem || how == PauseMode::Filesystem {
            self.reboot(sandbox, placement.agent, saved).await
        } else {
            Ok(())
        };
        let end_at = now_unix() + timeout.as_secs() as i64;
        let stored = match rebooted {
            Ok(()) => {
                let running = SandboxState::Running;
                let slot = Some(placement.slot);
                let records = self.store.sandboxes();
                let stored = records.set_state(&record.id, running, slot, end_at, None);
                stored.await.map_err(LifecycleError::from)
            }
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            tracing::warn!(sandbox = %record.id, error = %e, "resume failed; sandbox stays paused");
            self.release(record.id.clone(), placement.slot).await;
            sandbox.set_phase(Phase::Paused, None);
            return Err(e);
        }
        // The image is spent: the next pause writes a new one from the resumed state.
        if let Err(e) = self.driver.delete_image(&image).await {
            tracing::warn!(sandbox = %record.id, error = %e, "deleting the resumed image failed");
        }
        self.forget_paused(&record.id, false).await;
        sandbox.update_record(|r| {
            r.end_at = end_at;
            r.pause_mode = None;
        });
        sandbox.set_phase(Phase::Running, Some(placement));
        self.emit(&sandbox.record(), EventType::Resumed, None);
        tracing::info!(sandbox = %record.id, "resumed");
        Ok(sandbox.clone())
    }

    /// Starts a restored sandbox afresh on its files: its processes end (a filesystem-only
    /// pause `saved` has ended them already) and its template's start command runs again.
    async fn reboot(
        &self,
        sandbox: &Sandbox,
        addr: std::net::Ipv4Addr,
        saved: PauseMode,
    ) -> Result<(), LifecycleError> {
        if saved == PauseMode::Full {
            self.agent
                .reboot(addr, sandbox.access_token().as_deref())
                .await
                .map_err(|e| {
                    LifecycleError::GuestUnresponsive(format!("ending its processes: {e}"))
                })?;
        }
        let record = sandbox.record();
        let defaults = self
            .store
            .templates()
            .get(&record.template)
            .await?
            .map(|t| t.defaults)
            .unwrap_or_default();
        self.run_start_command(addr, sandbox.access_token(), &defaults)
            .await
    }

    /// `owner`'s snapshot called `name`; another key's snapshot is not found, exactly as one that
    /// does not exist.
    pub(super) async fn owned_snapshot(
        &self,
        owner: Option<&str>,
        name: &TemplateName,
    ) -> Result<Option<SnapshotRecord>, LifecycleError> {
        match owner {
            Some(owner) => Ok(self.store.snapshots().get(owner, name).await?),
            None => Ok(None),
        }
    }

    /// Saves a running sandbox's state as a snapshot that `create` accepts in place of a
    /// template, for the sandbox's owner only; the sandbox keeps running (its traffic waits
    /// meanwhile). The owner's snapshot of the same name is replaced. A name can never be a
    /// template's, built or not: templates are found first, so such a snapshot could never be
    /// started.
    pub async fn snapshot(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<SnapshotRecord, LifecycleError> {
        self.snapshot_as(id, name, true).await
    }

    /// [`Lifecycle::snapshot`]; with `share`, its image goes to object storage too, for the
    /// other nodes (not a fork's, which lives only as long as the fork).
    async fn snapshot_as(
        &self,
        id: &str,
        name: Option<&str>,
        share: bool,
    ) -> Result<SnapshotRecord, LifecycleError> {
        let snapshot_id = match name {
            Some(n) => {
                TemplateName::parse(n).map_err(|_| LifecycleError::BadSnapshotName(n.to_owned()))?
            }
            None => TemplateName::parse(&format!("snap-{}", SandboxId::generate()))
                .expect("generated names are valid"),
        };
        let sandbox = self.find(id)?;
        let owners_template = match sandbox.owner() {
            Some(owner) => self
                .store
                .templates()
                .user_template_by_alias(owner, snapshot_id.as_str())
                .await?
                .is_some(),
            None => false,
        };
        if crate::template::KNOWN_TEMPLATES.contains(&snapshot_id.as_str())
            || self.store.templates().get(&snapshot_id).await?.is_some()
            || owners_template
        {
            return Err(LifecycleError::BadSnapshotName(format!(
                "{snapshot_id} (a template has that name)"
            )));
        }
        // Until it is recorded, its image is one no record names (`snapshot_copies.rs`).
        let _made = self.remote.snapshot_images_in_use.read().await;
        let Some(_verb) = sandbox.lock_verb().await else {
            return Err(LifecycleError::Busy(id.to_owned()));
        };
        let placement = match (sandbox.phase(), sandbox.placement()) {
            (Phase::Running, Some(placement)) => placement,
            (Phase::Paused, _) => return Err(LifecycleError::AlreadyPaused(id.to_owned())),
            _ => return Err(LifecycleError::SandboxNotFound(id.to_owned())),
        };
        let owner = sandbox.owner().unwrap_or_default().to_owned();
        self.check_snapshot_room(&owner).await?;
        let _awake = self.wake(&sandbox);
        sandbox.enter(Phase::Snapshotting);
        sandbox.cut_streams();
        let record = sandbox.record();
        let image = snapshot_image(&owner, &snapshot_id);
        let checkpointed = self
            .driver
            .checkpoint(&record.id, placement.slot, &image)
            .await
            .map_err(checkpoint_error);
        // The sandbox runs on while its image goes to object storage.
        sandbox.set_phase(Phase::Running, Some(placement));
        checkpointed?;
        if share {
            self.upload_snapshot(&image).await;
        }
        let snapshot = SnapshotRecord {
            id: snapshot_id,
            size_bytes: self.driver.image_size(&image),
            image,
            template: record.template.clone(),
            rootfs: record.rootfs.clone(),
            source_sandbox: record.id.clone(),
            access_token: record.access_token.clone(),
            created_at: now_unix(),
            owner,
            volume_mounts: record.volume_mounts.clone(),
        };
        let replaced = (self.store.snapshots())
            .get(&snapshot.owner, &snapshot.id)
            .await?;
        self.store.snapshots().put(&snapshot).await?;
        if let Some(replaced) = replaced.filter(|r| r.image != snapshot.image) {
            self.forget_snapshot(&replaced.image).await;
            self.driver
                .delete_image(&replaced.image)
                .await
                .map_err(LifecycleError::Driver)?;
        }
        self.emit(&record, EventType::Checkpointed, None);
        Ok(snapshot)
    }

    /// Refuses a snapshot once `owner`'s snapshots take its quota of disk.
    async fn check_snapshot_room(&self, owner: &str) -> Result<(), LifecycleError> {
        let quota = self.quota(Some(owner)).await?;
        let used = self.store.snapshots().bytes_of(owner).await?;
        if used >= quota.snapshot_mb << 20 {
            return Err(LifecycleError::Quota(format!(
                "this API key's snapshots take {} MiB of the {} MiB it may use; delete some first",
                used >> 20,
                quota.snapshot_mb
            )));
        }
        Ok(())
    }

    /// `owner`'s snapshots, oldest first.
    pub async fn snapshots(&self, owner: &str) -> Result<Vec<SnapshotRecord>, LifecycleError> {
        Ok(self.store.snapshots().of(owner).await?)
    }

    /// Deletes `owner`'s snapshot and its image; returns whether it existed.
    pub async fn delete_snapshot(&self, owner: &str, id: &str) -> Result<bool, LifecycleError> {
        let Ok(name) = TemplateName::parse(id) else {
            return Ok(false);
        };
        let Some(snapshot) = self.store.snapshots().get(owner, &name).await? else {
            return Ok(false);
        };
        self.store.snapshots().delete(owner, &name).await?;
        self.forget_snapshot(&snapshot.image).await;
        self.driver
            .delete_image(&snapshot.image)
            .await
            .map_err(LifecycleError::Driver)?;
        Ok(true)
    }

    /// Copies a running sandbox `count` times: one checkpoint, then a restore per copy. Each
    /// copy gets its own id, token and hostname, and the source's metadata and env vars.
    pub async fn fork(
        &self,
        id: &str,
        count: usize,
        timeout: Option<Duration>,
    ) -> Result<Vec<Result<Arc<Sandbox>, LifecycleError>>, LifecycleError> {
        let source = self.running(id).await?.record();
        let snapshot = self.snapshot_as(id, None, false).await?;
        let mut forks = Vec::with_capacity(count);
        for _ in 0..count {
            forks.push(
                self.create(CreateParams {
                    template: snapshot.id.to_string(),
                    timeout,
                    metadata: source.metadata.clone(),
                    env_vars: source.env_vars.clone(),
                    secure: source.access_token.is_some(),
                    pause_on_timeout: source.pause_on_timeout,
                    timeout_pause: source.timeout_pause,
                    auto_resume: source.auto_resume,
                    owner: source.owner.clone(),
                    cpu_count: Some(source.resources.cpu_count),
                    memory_mb: Some(source.resources.memory_mb),
                    disk_mb: Some(source.resources.disk_mb),
                    egress: source.egress.clone(),
                    require_traffic_token: source.require_traffic_token,
                    // The snapshot's.
                    volume_mounts: Vec::new(),
                })
                .await,
            );
        }
        if let Err(e) = self
            .delete_snapshot(&snapshot.owner, snapshot.id.as_str())
            .await
        {
            tracing::warn!(snapshot = %snapshot.id, error = %e, "removing the fork's snapshot failed");
        }
        Ok(forks)
    }
}
