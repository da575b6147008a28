//! Creating a sandbox: admission, then a pooled copy of the template's golden image if one is
//! ready, else a restore of that image (or of the owner's snapshot), else a boot; then the
//! claim that makes it the caller's.

use super::launches::Turn;
use super::sandbox::{Phase, Sandbox};
use super::{CreateParams, Lifecycle, LifecycleError};
use crate::driver::{LaunchSpec, Placement, Resources, RootfsWrites};
use crate::egress::Egress;
use crate::ids::{random_token, SandboxId, TemplateName};
use crate::store::{
    EventType, SandboxRecord, SandboxState, SnapshotRecord, TemplateDefaults, TemplateRecord,
};
use airlock_wire::envd::InitRequest;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The smallest memory and disk a create may ask for: below them the agent and a shell do not
/// fit.
const MIN_MEMORY_MB: u32 = 128;
const MIN_DISK_MB: u32 = 64;

/// A sandbox that runs and whose agent answers, but that no user owns yet.
pub(super) struct Started {
    pub id: SandboxId,
    pub placement: Placement,
    pub rootfs: PathBuf,
    /// The access token its agent holds (restored from a snapshot: the source's).
    pub token: Option<String>,
    /// The policy it was started with.
    pub egress: Egress,
    /// The image it was restored from (`None`: booted).
    pub image: Option<String>,
}

/// How a sandbox is started: what it may use, may reach and mounts.
#[derive(Clone)]
pub(super) struct Launch {
    pub resources: Resources,
    pub egress: Egress,
    /// Its volumes' directories (see [`LaunchSpec::volumes`]).
    pub volumes: Vec<PathBuf>,
    /// Whose launch it is: a caller's goes before background work.
    pub turn: Turn,
}

impl Launch {
    /// What the driver needs to start sandbox `id` over `rootfs` this way.
    pub(super) fn spec(self, id: &SandboxId, rootfs: &Path) -> LaunchSpec {
        LaunchSpec {
            id: id.clone(),
            rootfs: rootfs.to_owned(),
            resources: self.resources,
            egress: self.egress,
            writes: RootfsWrites::Private,
            volumes: self.volumes,
        }
    }
}

/// What a create starts from.
enum Source {
    Template(TemplateRecord),
    Snapshot(SnapshotRecord),
}

impl Lifecycle {
    pub async fn create(&self, params: CreateParams) -> Result<Arc<Sandbox>, LifecycleError> {
        let timeout = self.clamp_timeout(params.timeout)?;
        let resources = self.resources_for(&params)?;
        let quota = self.quota(params.owner.as_deref()).await?;
        let owner = params.owner.as_deref();
        // One of the owner's snapshots, else a template (`name` or `name:tag`). A snapshot's
        // name is never one of its owner's templates' or a built-in's (both are refused when
        // it is taken), so looking at the owner's own names first lets no public template
        // stand in for them.
        let snapshot = match TemplateName::parse(&params.template) {
            Ok(name) => self.owned_snapshot(owner, &name).await?,
            Err(_) => None,
        };
        let source = match snapshot {
            Some(snapshot) => Source::Snapshot(snapshot),
            None => match self
                .store
                .templates()
                .visible_template(owner, &params.template)
                .await?
            {
                Some((template, _)) => Source::Template(template),
                None => return Err(LifecycleError::TemplateNotFound(params.template.clone())),
            },
        };
        let volume_mounts = match &source {
            Source::Template(_) => self.volumes.resolve(owner, &params.volume_mounts).await?,
            Source::Snapshot(s) if params.volume_mounts.is_empty() => {
                self.volumes
                    .check_still_there(owner, &s.volume_mounts)
                    .await?;
                s.volume_mounts.clone()
            }
            Source::Snapshot(s) => {
                return Err(LifecycleError::BadRequest(format!(
                    "a sandbox started from snapshot '{}' mounts the snapshot's volumes; leave \
                     out volumeMounts",
                    s.id
                )))
            }
        };
        // Pooled sandboxes have the default resources and no volumes; a policy is applied as
        // they are claimed.
        let pooled = match &source {
            Source::Template(t)
                if resources == self.limits.default_resources && volume_mounts.is_empty() =>
            {
                self.take_pooled(t)
            }
            _ => None,
        };
        let rootfs = match &source {
            Source::Template(t) => t.rootfs.clone(),
            Source::Snapshot(s) => s.rootfs.clone(),
        };
        let id = pooled
            .as_ref()
            .map_or_else(SandboxId::generate, |p| p.id.clone());
        let defaults = self.defaults_of(&source).await?;
        let name = match &source {
            Source::Template(t) => t.name.clone(),
            Source::Snapshot(s) => s.id.clone(),
        };
        let mut record = new_record(id.clone(), name, rootfs, resources, timeout, params);
        record.volume_mounts = volume_mounts;
        record.node = self.node.clone();
        // The template's env vars, under the create's own.
        let mut env = defaults.env.clone();
        env.append(&mut record.env_vars);
        record.env_vars = env;
        let sandbox = Sandbox::new(record, Phase::Starting, None);
        if let Err(e) = self.admit_create(&sandbox, &quota).await {
            if let (Some(pooled), Source::Template(t)) = (pooled, &source) {
                self.return_pooled(&t.name, pooled);
            }
            return Err(e);
        }
        self.pools_give_way();
        // Once admitted: volumes that wait in object storage (a drained node's) come here.
        let mounts = sandbox.record().volume_mounts.clone();
        let brought = self.volumes.bring_here(sandbox.owner(), &mounts).await;
        let started = match (brought, pooled, source) {
            (Err(e), _, _) => Err(e.into()),
            (Ok(()), Some(pooled), _) => Ok(pooled),
            (Ok(()), None, Source::Template(template)) => {
                self.boot_or_restore(&sandbox, &template).await
            }
            (Ok(()), None, Source::Snapshot(snapshot)) => {
                // The snapshot's processes run as soon as it is restored: the policy goes first.
                let launch = self.launch_of(&sandbox.record());
                let started = self.start_from_snapshot(&id, &snapshot, launch).await;
                started.map(|s| Started {
                    token: snapshot.access_token,
                    ..s
                })
            }
        };
        match started {
            Ok(started) => self.claim(&sandbox, started, &defaults).await,
            Err(e) => {
                self.forget_create(&id).await;
                Err(e)
            }
        }?;
        self.emit(&sandbox.record(), EventType::Created, None);
        Ok(sandbox)
    }

    /// What a sandbox of `source` starts with: its template's user, workdir and env vars.
    async fn defaults_of(&self, source: &Source) -> Result<TemplateDefaults, LifecycleError> {
        Ok(match source {
            Source::Template(t) => t.defaults.clone(),
            Source::Snapshot(s) => self
                .store
                .templates()
                .get(&s.template)
                .await?
                .map(|t| t.defaults)
                .unwrap_or_default(),
        })
    }

    /// Restores the template's golden image, or boots it when there is none (or it is bad).
    async fn boot_or_restore(
        &self,
        sandbox: &Sandbox,
        template: &TemplateRecord,
    ) -> Result<Started, LifecycleError> {
        let launch = self.launch_of(&sandbox.record());
        let golden = self.golden_image(template);
        if self.driver.has_image(&golden) {
            match self
                .restore_golden(sandbox.id(), template, &golden, launch.clone())
                .await
            {
                // The image is bad and being made again: boot this one instead.
                Err(LifecycleError::Agent(_)) => {}
                started => return started,
            }
        }
        let started = self
            .start(sandbox.id(), &template.rootfs, None, launch)
            .await?;
        // Booted: the start command is not running yet, as it would be in a golden image.
        let addr = started.placement.agent;
        if let Err(e) = self.run_start_command(addr, None, &template.defaults).await {
            self.release(started.id, started.placement.slot).await;
            return Err(e);
        }
        Ok(started)
    }

    /// The create's resources, each defaulted and checked against the server's maximum.
    fn resources_for(&self, params: &CreateParams) -> Result<Resources, LifecycleError> {
        let (default, max) = (self.limits.default_resources, self.limits.max_resources);
        let pick = |asked: Option<u32>, default: u32, min: u32, max: u32, what: &str| {
            // A server started with a maximum below the default hands out the maximum.
            let value = asked.unwrap_or(default.min(max));
            if (min..=max).contains(&value) {
                Ok(value)
            } else {
                Err(LifecycleError::BadRequest(format!(
                    "{what} must be between {min} and {max} on this server, not {value}"
                )))
            }
        };
        Ok(Resources {
            cpu_count: pick(
                params.cpu_count,
                default.cpu_count,
                1,
                max.cpu_count,
                "cpuCount",
            )?,
            memory_mb: pick(
                params.memory_mb,
                default.memory_mb,
                MIN_MEMORY_MB,
                max.memory_mb,
                "memoryMB",
            )?,
            disk_mb: pick(
                params.disk_mb,
                default.disk_mb,
                MIN_DISK_MB,
                max.disk_mb,
                "diskSizeMB",
            )?,
        })
    }

    /// How the sandbox of `record` starts (and resumes), for a caller who waits.
    pub(super) fn launch_of(&self, record: &SandboxRecord) -> Launch {
        Launch {
            turn: Turn::User,
            resources: record.resources,
            egress: record.egress.clone(),
            volumes: record
                .volume_mounts
                .iter()
                .map(|m| self.volumes.dir(&m.volume_id))
                .collect(),
        }
    }

    /// Boots a sandbox with this id, or restores it from `image`, and waits for its agent.
    pub(super) async fn start(
        &self,
        id: &SandboxId,
        rootfs: &Path,
        image: Option<&str>,
        launch: Launch,
    ) -> Result<Started, LifecycleError> {
        let turn = launch.turn;
        let spec = launch.spec(id, rootfs);
        let placement = self.bring_up(&spec, image, turn).await?;
        Ok(Started {
            id: spec.id,
            placement,
            rootfs: spec.rootfs,
            token: None,
            egress: spec.egress,
            image: image.map(str::to_owned),
        })
    }

    /// Boots the sandbox, or restores it from `image`, and waits for its agent; on failure
    /// whatever was started is destroyed (a failed launch cleans up after itself). This is
    /// where every launch takes its turn (`launches.rs`): it holds a place until the agent
    /// answers, since that wait is the restore's own CPU work.
    pub(super) async fn bring_up(
        &self,
        spec: &LaunchSpec,
        image: Option<&str>,
        turn: Turn,
    ) -> Result<Placement, LifecycleError> {
        // Before the turn: a download of the template is no launch's CPU.
        self.prepare_rootfs(&spec.rootfs).await?;
        let _place = self
            .launches
            .acquire(turn)
            .await
            .map_err(|o| LifecycleError::Overloaded {
                retry_after_secs: o.expected_wait.as_secs_f64().ceil().max(1.0) as u64,
            })?;
        let placement = match image {
            Some(image) => self.driver.restore(spec, image).await,
            None => self.driver.launch(spec).await,
        }
        .map_err(LifecycleError::Driver)?;
        let ready = self
            .agent
            .wait_ready(placement.agent, self.limits.agent_start_timeout)
            .await;
        if let Err(e) = ready {
            self.release(spec.id.clone(), placement.slot).await;
            return Err(LifecycleError::Agent(e));
        }
        Ok(placement)
    }

    /// Makes a started sandbox the caller's: its policy, its row, its identity (`/init`). On
    /// failure nothing of it is left.
    async fn claim(
        &self,
        sandbox: &Sandbox,
        started: Started,
        defaults: &TemplateDefaults,
    ) -> Result<(), LifecycleError> {
        let id = sandbox.id().clone();
        let slot = started.placement.slot;
        let egress = sandbox.record().egress.clone();
        if started.egress != egress {
            if let Err(e) = self.driver.set_egress(slot, &egress).await {
                self.release(started.id, slot).await;
                self.forget_create(&id).await;
                return Err(LifecycleError::Driver(e));
            }
        }
        sandbox.update_record(|r| {
            r.slot = Some(slot);
            r.rootfs = started.rootfs.clone();
        });
        let record = sandbox.record();
        let listed = self.store.sandboxes().started(&id, slot, &record.rootfs);
        if let Err(e) = listed.await {
            self.release(started.id, slot).await;
            self.forget_create(&id).await;
            return Err(e.into());
        }
        let init = InitRequest {
            env_vars: record.env_vars.clone(),
            access_token: record.access_token.clone(),
            traffic_access_token: record.traffic_access_token.clone(),
            default_user: Some(defaults.user.clone()),
            default_workdir: defaults.workdir.clone(),
            hostname: Some(record.id.to_string()),
            volume_mounts: record
                .volume_mounts
                .iter()
                .map(|m| m.path.clone())
                .collect(),
        };
        let addr = started.placement.agent;
        if let Err(e) = self.agent.init(addr, started.token.as_deref(), &init).await {
            self.release(started.id, slot).await;
            self.forget_create(&id).await;
            return Err(e.into());
        }
        sandbox.set_phase(Phase::Running, Some(started.placement));
        Ok(())
    }
}

/// Now in Unix microseconds, and always later than the last it gave: a sandbox's start orders
/// the lists, so two creates of one server never tie, and the later one is the newer.
pub(super) fn start_stamp() -> i64 {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = chrono::Utc::now().timestamp_micros();
    let last = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(now.max(last + 1))
        })
        .expect("the closure always gives a value");
    now.max(last + 1)
}

/// The record of a sandbox a create is making.
fn new_record(
    id: SandboxId,
    template: TemplateName,
    rootfs: PathBuf,
    resources: Resources,
    timeout: Duration,
    params: CreateParams,
) -> SandboxRecord {
    let started_at_us = start_stamp();
    SandboxRecord {
        id,
        template,
        rootfs,
        state: SandboxState::Running,
        slot: None,
        access_token: params.secure.then(|| random_token(32)),
        metadata: params.metadata,
        env_vars: params.env_vars,
        started_at_us,
        end_at: started_at_us / 1_000_000 + timeout.as_secs() as i64,
        resources,
        pause_on_timeout: params.pause_on_timeout,
        timeout_pause: params.timeout_pause,
        pause_mode: None,
        auto_resume: params.auto_resume,
        owner: params.owner,
        egress: params.egress,
        // Every sandbox has one: the SDK proves itself on the code interpreter's context routes
        // with it, whether or not the user ports demand it.
        traffic_access_token: Some(random_token(32)),
        require_traffic_token: params.require_traffic_token,
        volume_mounts: Vec::new(),
        node: String::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn start_stamps_never_tie() {
        let stamps: Vec<i64> = (0..1000).map(|_| super::start_stamp()).collect();
        assert!(
            stamps.windows(2).all(|w| w[0] < w[1]),
            "strictly later each time"
        );
        let now = chrono::Utc::now().timestamp_micros();
        assert!(
            (now - stamps[0]).abs() < 10_000_000,
            "and close to the clock"
        );
    }
}
