//! Sandbox lifecycle: create, find, extend, pause, resume, snapshot, fork, kill, expire, adopt
//! after a restart, shut down.
//!
//! The store is written before the driver acts on a user's sandbox, so after a crash every host
//! resource a sandbox may hold is named by a row (adopted or destroyed at the next start) or
//! swept as an orphan.
//!
//! Fast start: for every template the lifecycle keeps a *golden image*, a checkpoint of a
//! sandbox booted from it and warmed up (the code interpreter's kernel with its imports loaded),
//! and a small pool of sandboxes already restored from it. A create takes a pooled sandbox and
//! only hands it its identity (`/init`: env vars, token, hostname); with the pool empty it
//! restores the golden image itself, and with no golden image yet it boots. Restored sandboxes
//! share one memory image, so the agent reseeds what a restore copies (hostname, and the
//! interpreter's random generators) when `/init` gives it a new hostname.

use crate::driver::{Driver, DriverError, LaunchSpec, Placement, Resources};
use crate::egress::Egress;
use crate::ids::{random_token, SandboxId, TemplateName};
use crate::store::{SandboxRecord, SandboxState, SnapshotRecord, Store, StoreError};
use airlock_wire::envd::InitRequest;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How the lifecycle reaches a sandbox's agent. The server implements it over HTTP; keeping it a
/// trait keeps HTTP out of the core.
#[async_trait::async_trait]
pub trait AgentClient: Send + Sync + 'static {
    /// Waits until the agent at `addr` answers its health check, or `within` passes.
    async fn wait_ready(&self, addr: Ipv4Addr, within: Duration) -> Result<(), String>;
    /// Hands the agent its sandbox's settings (`POST /init`), authenticated with the token the
    /// agent holds now (a sandbox restored from a snapshot holds its source's).
    async fn init(
        &self,
        addr: Ipv4Addr,
        current_token: Option<&str>,
        init: &InitRequest,
    ) -> Result<(), String>;
    /// Loads what the template preloads (the code interpreter's kernel and its usual imports)
    /// before the template's golden image is taken. Templates without it succeed at once.
    async fn warm_up(&self, addr: Ipv4Addr) -> Result<(), String>;
}

/// Server-wide defaults and caps.
#[derive(Debug, Clone)]
pub struct Limits {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub max_sandboxes: usize,
    /// What a sandbox gets when its create names no resources.
    pub default_resources: Resources,
    /// The most a create may ask for.
    pub max_resources: Resources,
    /// How long a new sandbox's agent may take to answer.
    pub agent_start_timeout: Duration,
    /// Ready sandboxes kept per template (0 turns pools and golden images off).
    pub pool_size: usize,
    /// Pools are not refilled while the host has less memory available than this.
    pub pool_min_available_mb: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            max_sandboxes: 256,
            default_resources: Resources {
                cpu_count: 2,
                memory_mb: 1024,
                disk_mb: 5120,
            },
            max_resources: Resources {
                cpu_count: 8,
                memory_mb: 8192,
                disk_mb: 20480,
            },
            agent_start_timeout: Duration::from_secs(20),
            pool_size: 2,
            pool_min_available_mb: 2048,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("template '{0}' not found; build it with `airlock template build {0}`")]
    TemplateNotFound(String),
    #[error("sandbox '{0}' not found")]
    SandboxNotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("the server already runs its maximum of {0} sandboxes")]
    Capacity(usize),
    #[error("timeout of {requested}s exceeds the maximum of {max}s")]
    TimeoutTooLong { requested: u64, max: u64 },
    #[error("sandbox '{0}' is already paused")]
    AlreadyPaused(String),
    #[error("sandbox '{0}' is already running")]
    AlreadyRunning(String),
    #[error("sandbox '{0}' is being paused, resumed or snapshotted; try again")]
    Busy(String),
    #[error("'{0}' is not a valid snapshot name (a-z, 0-9, '.', '_', '-'; at most 64)")]
    BadSnapshotName(String),
    #[error("not enough disk space: {0}; the sandbox keeps running")]
    NoSpace(String),
    #[error("starting the sandbox failed")]
    Driver(#[source] DriverError),
    #[error("the sandbox's agent did not start: {0}")]
    Agent(String),
    #[error("state store failed")]
    Store(#[from] StoreError),
}

/// What a create asks for, already parsed.
#[derive(Debug, Clone, Default)]
pub struct CreateParams {
    /// A template's or a snapshot's name.
    pub template: String,
    pub timeout: Option<Duration>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// Whether the agent demands an access token (v2 sandboxes always do).
    pub secure: bool,
    pub pause_on_timeout: bool,
    pub auto_resume: bool,
    /// The API key that creates it.
    pub owner: Option<String>,
    /// CPU, memory and disk asked for; each one left out gets the server's default.
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u32>,
    pub disk_mb: Option<u32>,
    pub egress: Egress,
    /// E2B's `allowPublicTraffic: false`: its user ports demand the traffic token.
    pub require_traffic_token: bool,
}

/// A running sandbox.
pub struct Sandbox {
    record: Mutex<SandboxRecord>,
    /// The record's access token, which never changes while the sandbox runs.
    access_token: Option<Arc<str>>,
    placement: Placement,
    /// Fired when the sandbox stops running here (killed, paused, or paused for a snapshot), so
    /// open proxied streams are cut.
    stopped: CancellationToken,
}

impl Sandbox {
    fn new(record: SandboxRecord, placement: Placement) -> Arc<Self> {
        Arc::new(Sandbox {
            placement,
            access_token: record.access_token.as_deref().map(Arc::from),
            record: Mutex::new(record),
            stopped: CancellationToken::new(),
        })
    }

    pub fn record(&self) -> SandboxRecord {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Where its agent answers.
    pub fn agent(&self) -> Ipv4Addr {
        self.placement.agent
    }

    pub fn id(&self) -> SandboxId {
        self.record().id
    }

    pub fn access_token(&self) -> Option<Arc<str>> {
        self.access_token.clone()
    }

    /// Resolves when the sandbox stops running here (killed or paused).
    pub fn stopped(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.stopped.clone().cancelled_owned()
    }
}

/// A sandbox that runs and whose agent answers, but that no user owns yet.
struct Started {
    id: SandboxId,
    placement: Placement,
    rootfs: PathBuf,
    /// The access token its agent holds (restored from a snapshot: the source's).
    token: Option<String>,
    /// The policy it was started with.
    egress: Egress,
}

/// Ready sandboxes of one template, restored from its golden image.
#[derive(Default)]
struct Pool {
    ready: Vec<Started>,
    /// Restores under way.
    filling: usize,
}

pub struct Lifecycle {
    store: Arc<Store>,
    driver: Arc<dyn Driver>,
    agent: Arc<dyn AgentClient>,
    limits: Limits,
    live: Mutex<HashMap<SandboxId, Arc<Sandbox>>>,
    /// Sandboxes in the middle of a pause, resume, snapshot or fork.
    busy: Mutex<HashSet<SandboxId>>,
    pools: Mutex<HashMap<TemplateName, Pool>>,
    /// Wakes the pool filler (a pooled sandbox was taken).
    refill: Notify,
    /// Destroys and auto-pauses running in the background (a kill answers before the host
    /// cleanup is done).
    destroying: TaskTracker,
}

/// The smallest memory and disk a create may ask for: below them the agent and a shell do not
/// fit.
const MIN_MEMORY_MB: u32 = 128;
const MIN_DISK_MB: u32 = 64;

/// How long a pause, resume or snapshot waits for another one on the same sandbox.
const BUSY_WAIT: Duration = Duration::from_secs(60);

pub fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

const GOLDEN_PREFIX: &str = "golden-";
const PAUSED_PREFIX: &str = "paused-";
const SNAPSHOT_PREFIX: &str = "snapshot-";

/// The image a paused sandbox waits in.
fn paused_image(id: &SandboxId) -> String {
    format!("{PAUSED_PREFIX}{id}")
}

/// The image of `owner`'s snapshot `id`: owners may use the same names.
fn snapshot_image(owner: &str, id: &TemplateName) -> String {
    format!("{SNAPSHOT_PREFIX}{owner}-{id}")
}

/// Marks an id busy for as long as the guard lives.
struct BusyGuard<'a> {
    busy: &'a Mutex<HashSet<SandboxId>>,
    id: SandboxId,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl Lifecycle {
    pub fn new(
        store: Arc<Store>,
        driver: Arc<dyn Driver>,
        agent: Arc<dyn AgentClient>,
        limits: Limits,
    ) -> Arc<Self> {
        Arc::new(Lifecycle {
            store,
            driver,
            agent,
            limits,
            live: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
            pools: Mutex::new(HashMap::new()),
            refill: Notify::new(),
            destroying: TaskTracker::new(),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<TemplateName, Pool>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the sandbox busy, waiting (up to [`BUSY_WAIT`]) for a pause, resume or snapshot
    /// already under way to finish first.
    async fn mark_busy(&self, id: &str) -> Result<BusyGuard<'_>, LifecycleError> {
        let id = SandboxId::parse(id).map_err(|_| LifecycleError::SandboxNotFound(id.into()))?;
        let deadline = tokio::time::Instant::now() + BUSY_WAIT;
        loop {
            if self
                .busy
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.clone())
            {
                return Ok(BusyGuard {
                    busy: &self.busy,
                    id,
                });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(LifecycleError::Busy(id.to_string()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn is_busy(&self, id: &SandboxId) -> bool {
        self.busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
    }

    fn clamp_timeout(&self, timeout: Option<Duration>) -> Result<Duration, LifecycleError> {
        let t = timeout.unwrap_or(self.limits.default_timeout);
        if t > self.limits.max_timeout {
            return Err(LifecycleError::TimeoutTooLong {
                requested: t.as_secs(),
                max: self.limits.max_timeout.as_secs(),
            });
        }
        Ok(t)
    }

    /// The golden image of a template as it is built now (a rebuilt template gets a new one).
    fn golden_image(&self, template: &crate::store::TemplateRecord) -> String {
        let hash = template
            .content_hash
            .get(..16)
            .unwrap_or(&template.content_hash);
        let runtime = self.driver.fingerprint();
        format!("golden-{}-{hash}-{runtime}", template.name)
    }

    pub async fn create(&self, params: CreateParams) -> Result<Arc<Sandbox>, LifecycleError> {
        let name = TemplateName::parse(&params.template)
            .map_err(|_| LifecycleError::TemplateNotFound(params.template.clone()))?;
        let timeout = self.clamp_timeout(params.timeout)?;
        let resources = self.resources_for(&params)?;
        if self.live().len() >= self.limits.max_sandboxes {
            return Err(LifecycleError::Capacity(self.limits.max_sandboxes));
        }
        let started = if let Some(template) = self.store.template(&name)? {
            // Pooled sandboxes have the default resources; a policy is applied at claim time.
            let pooled = (resources == self.limits.default_resources)
                .then(|| self.take_pooled(&template))
                .flatten();
            match pooled {
                Some(pooled) => pooled,
                None => {
                    let golden = self.golden_image(&template);
                    let launch = (resources, params.egress.clone());
                    if !self.driver.has_image(&golden) {
                        self.start(&template.rootfs, None, launch).await?
                    } else {
                        match self
                            .restore_golden(&template, &golden, launch.clone())
                            .await
                        {
                            // The image is bad and being made again: boot this one instead.
                            Err(LifecycleError::Agent(_)) => {
                                self.start(&template.rootfs, None, launch).await?
                            }
                            started => started?,
                        }
                    }
                }
            }
        } else if let Some(snapshot) = self.owned_snapshot(params.owner.as_deref(), &name)? {
            // The snapshot's processes run as soon as it is restored: the policy goes first.
            let launch = (resources, params.egress.clone());
            let mut started = self
                .start(&snapshot.rootfs, Some(&snapshot.image), launch)
                .await?;
            started.token = snapshot.access_token;
            started
        } else {
            return Err(LifecycleError::TemplateNotFound(params.template));
        };
        self.claim(started, name, params, resources, timeout).await
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

    /// Takes a ready sandbox of the template from its pool, if one is there.
    fn take_pooled(&self, template: &crate::store::TemplateRecord) -> Option<Started> {
        let pooled = {
            let mut pools = self.pools();
            pools.get_mut(&template.name)?.ready.pop()?
        };
        self.refill.notify_one();
        if pooled.rootfs != template.rootfs {
            // Restored before the template was rebuilt.
            self.destroying
                .spawn(self.release(pooled.id, pooled.placement.slot));
            return None;
        }
        Some(pooled)
    }

    /// Boots a sandbox, or restores it from `image`, and waits for its agent.
    async fn start(
        &self,
        rootfs: &std::path::Path,
        image: Option<&str>,
        (resources, egress): (Resources, Egress),
    ) -> Result<Started, LifecycleError> {
        let spec = LaunchSpec {
            id: SandboxId::generate(),
            rootfs: rootfs.to_owned(),
            resources,
            egress,
        };
        let placement = self.bring_up(&spec, image).await?;
        Ok(Started {
            id: spec.id,
            placement,
            rootfs: spec.rootfs,
            token: None,
            egress: spec.egress,
        })
    }

    /// How pooled sandboxes and golden images are started.
    fn default_launch(&self) -> (Resources, Egress) {
        (self.limits.default_resources, Egress::default())
    }

    /// Boots the sandbox, or restores it from `image`, and waits for its agent; on failure
    /// whatever was started is destroyed (a failed launch cleans up after itself).
    async fn bring_up(
        &self,
        spec: &LaunchSpec,
        image: Option<&str>,
    ) -> Result<Placement, LifecycleError> {
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

    /// Makes a started sandbox the caller's: records it and hands its agent its identity.
    async fn claim(
        &self,
        started: Started,
        template: TemplateName,
        params: CreateParams,
        resources: Resources,
        timeout: Duration,
    ) -> Result<Arc<Sandbox>, LifecycleError> {
        if started.egress != params.egress {
            if let Err(e) = self
                .driver
                .set_egress(started.placement.slot, &params.egress)
                .await
            {
                self.release(started.id, started.placement.slot).await;
                return Err(LifecycleError::Driver(e));
            }
        }
        let now = now_unix();
        let record = SandboxRecord {
            id: started.id.clone(),
            template,
            rootfs: started.rootfs,
            state: SandboxState::Running,
            slot: Some(started.placement.slot),
            access_token: params.secure.then(|| random_token(32)),
            metadata: params.metadata,
            env_vars: params.env_vars,
            started_at: now,
            end_at: now + timeout.as_secs() as i64,
            resources,
            pause_on_timeout: params.pause_on_timeout,
            auto_resume: params.auto_resume,
            owner: params.owner,
            egress: params.egress,
            // Every sandbox has one: the SDK proves itself on the code interpreter's context
            // routes with it, whether or not the user ports demand it.
            traffic_access_token: Some(random_token(32)),
            require_traffic_token: params.require_traffic_token,
        };
        if let Err(e) = self.store.insert_sandbox(&record) {
            self.release(started.id, started.placement.slot).await;
            return Err(e.into());
        }
        let init = InitRequest {
            env_vars: record.env_vars.clone(),
            access_token: record.access_token.clone(),
            traffic_access_token: record.traffic_access_token.clone(),
            default_user: Some("user".into()),
            default_workdir: None,
            hostname: Some(record.id.to_string()),
        };
        let addr = started.placement.agent;
        if let Err(e) = self.agent.init(addr, started.token.as_deref(), &init).await {
            self.discard(&record.id, started.placement.slot).await;
            return Err(LifecycleError::Agent(e));
        }
        let sandbox = Sandbox::new(record.clone(), started.placement);
        self.live().insert(record.id, sandbox.clone());
        Ok(sandbox)
    }

    /// Destroys what a sandbox holds on the host (the driver frees its slot); its row (if any)
    /// stays.
    fn release(
        &self,
        id: SandboxId,
        slot: u32,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let driver = self.driver.clone();
        async move {
            if let Err(e) = driver.destroy(&id, slot).await {
                tracing::error!(sandbox = %id, error = %e, "destroying sandbox failed");
            }
        }
    }

    /// Destroys whatever a sandbox holds and forgets it; the slot is free again only after that.
    /// Failures are logged: the orphan sweep at the next start catches anything left.
    fn discard(
        &self,
        id: &SandboxId,
        slot: u32,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (store, id) = (self.store.clone(), id.clone());
        let release = self.release(id.clone(), slot);
        async move {
            release.await;
            if let Err(e) = store.delete_sandbox(&id) {
                tracing::error!(sandbox = %id, error = %e, "forgetting sandbox failed");
            }
        }
    }

    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>, LifecycleError> {
        SandboxId::parse(id)
            .ok()
            .and_then(|id| self.live().get(&id).cloned())
            .ok_or_else(|| LifecycleError::SandboxNotFound(id.to_owned()))
    }

    /// A sandbox's record, running or paused.
    pub fn record(&self, id: &str) -> Result<SandboxRecord, LifecycleError> {
        if let Ok(sandbox) = self.get(id) {
            return Ok(sandbox.record());
        }
        let not_found = || LifecycleError::SandboxNotFound(id.to_owned());
        let id = SandboxId::parse(id).map_err(|_| not_found())?;
        self.store.sandbox(&id)?.ok_or_else(not_found)
    }

    /// The running sandbox whose access token `matches` accepts, if any: one call per running
    /// sandbox that has a token, nothing copied.
    pub fn find_by_access_token(&self, matches: impl Fn(&str) -> bool) -> Option<Arc<Sandbox>> {
        self.live()
            .values()
            .find(|s| s.access_token.as_deref().is_some_and(&matches))
            .cloned()
    }

    /// Running sandboxes, oldest first.
    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        let mut all: Vec<Arc<Sandbox>> = self.live().values().cloned().collect();
        all.sort_by_key(|s| {
            let r = s.record();
            (r.started_at, r.id)
        });
        all
    }

    /// Running and paused sandboxes, oldest first.
    pub fn list_records(&self) -> Result<Vec<SandboxRecord>, LifecycleError> {
        let live = self.live();
        let mut all: Vec<SandboxRecord> = self
            .store
            .sandboxes()?
            .into_iter()
            .map(|r| live.get(&r.id).map(|s| s.record()).unwrap_or(r))
            .collect();
        all.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        Ok(all)
    }

    /// Kills a sandbox, running or paused: it is gone for every caller at once, and its open
    /// streams are cut. The host cleanup finishes in the background (`shutdown` waits for it).
    pub fn kill(&self, id: &str) -> Result<(), LifecycleError> {
        let parsed =
            SandboxId::parse(id).map_err(|_| LifecycleError::SandboxNotFound(id.into()))?;
        if self.is_busy(&parsed) {
            return Err(LifecycleError::Busy(id.to_owned()));
        }
        if let Some(sandbox) = self.live().remove(&parsed) {
            sandbox.stopped.cancel();
            self.destroying
                .spawn(self.discard(&parsed, sandbox.placement.slot));
            return Ok(());
        }
        match self.store.sandbox(&parsed)? {
            Some(record) if record.state == SandboxState::Paused => {
                self.store.delete_sandbox(&parsed)?;
                let driver = self.driver.clone();
                self.destroying.spawn(async move {
                    if let Err(e) = driver.delete_image(&paused_image(&parsed)).await {
                        tracing::error!(sandbox = %parsed, error = %e, "deleting image failed");
                    }
                });
                Ok(())
            }
            _ => Err(LifecycleError::SandboxNotFound(id.to_owned())),
        }
    }

    /// Replaces a sandbox's outbound rules (at once if it runs, at its resume if it is paused)
    /// and, if given, whether its user ports demand the traffic token.
    pub async fn set_network(
        &self,
        id: &str,
        egress: Egress,
        require_traffic_token: Option<bool>,
    ) -> Result<(), LifecycleError> {
        let _busy = self.mark_busy(id).await?;
        match self.get(id) {
            Ok(sandbox) => {
                self.driver
                    .set_egress(sandbox.placement.slot, &egress)
                    .await
                    .map_err(LifecycleError::Driver)?;
                let mut record = sandbox.record.lock().unwrap_or_else(|e| e.into_inner());
                let require = require_traffic_token.unwrap_or(record.require_traffic_token);
                self.store.set_network(&record.id, &egress, require)?;
                record.egress = egress;
                record.require_traffic_token = require;
            }
            Err(_) => {
                let record = self.record(id)?;
                let require = require_traffic_token.unwrap_or(record.require_traffic_token);
                self.store.set_network(&record.id, &egress, require)?;
            }
        }
        Ok(())
    }

    /// Sets the sandbox to expire `timeout` from now (replacing the old deadline).
    pub fn set_timeout(&self, id: &str, timeout: Duration) -> Result<(), LifecycleError> {
        let timeout = self.clamp_timeout(Some(timeout))?;
        let sandbox = self.get(id)?;
        let mut record = sandbox.record.lock().unwrap_or_else(|e| e.into_inner());
        let end_at = now_unix() + timeout.as_secs() as i64;
        self.store.set_end_at(&record.id, end_at)?;
        record.end_at = end_at;
        Ok(())
    }

    /// Takes a running sandbox out of service (no new traffic, open streams cut) while `f`
    /// works on its host resources; it is back in service afterwards unless `f` says it is gone.
    async fn out_of_service<F, Fut, T>(&self, id: &str, f: F) -> Result<T, LifecycleError>
    where
        F: FnOnce(Arc<Sandbox>) -> Fut,
        Fut: std::future::Future<Output = (Result<T, LifecycleError>, bool)>,
    {
        let _busy = self.mark_busy(id).await?;
        let parsed =
            SandboxId::parse(id).map_err(|_| LifecycleError::SandboxNotFound(id.into()))?;
        let Some(sandbox) = self.live().remove(&parsed) else {
            return Err(match self.store.sandbox(&parsed)? {
                Some(r) if r.state == SandboxState::Paused => {
                    LifecycleError::AlreadyPaused(id.to_owned())
                }
                _ => LifecycleError::SandboxNotFound(id.to_owned()),
            });
        };
        sandbox.stopped.cancel();
        let (result, gone) = f(sandbox.clone()).await;
        if !gone {
            let back = Sandbox::new(sandbox.record(), sandbox.placement);
            self.live().insert(parsed, back);
        }
        result
    }

    fn checkpoint_error(&self, e: DriverError) -> LifecycleError {
        match e {
            DriverError::NoSpace(what) => LifecycleError::NoSpace(what),
            other => LifecycleError::Driver(other),
        }
    }

    /// Pauses a running sandbox: its memory, processes and files go to disk, and it stops
    /// taking a slot. On failure (a full disk, say) it keeps running as it was.
    pub async fn pause(&self, id: &str) -> Result<(), LifecycleError> {
        self.out_of_service(id, |sandbox| async move {
            let record = sandbox.record();
            let image = paused_image(&record.id);
            if let Err(e) = self.driver.checkpoint(&record.id, sandbox.placement.slot, &image).await {
                tracing::warn!(sandbox = %record.id, error = %e, "pause failed; sandbox keeps running");
                return (Err(self.checkpoint_error(e)), false);
            }
            let stored =
                self.store
                    .set_state(&record.id, SandboxState::Paused, None, record.end_at);
            if let Err(e) = stored {
                let _ = self.driver.delete_image(&image).await;
                return (Err(e.into()), false);
            }
            // Waited for, not backgrounded: a resume right after must find the id free.
            self.release(record.id.clone(), sandbox.placement.slot).await;
            tracing::info!(sandbox = %record.id, "paused");
            (Ok(()), true)
        })
        .await
    }

    /// Resumes a paused sandbox where it left off, with a new deadline `timeout` from now.
    pub async fn resume(
        &self,
        id: &str,
        timeout: Option<Duration>,
    ) -> Result<Arc<Sandbox>, LifecycleError> {
        let timeout = self.clamp_timeout(timeout)?;
        let _busy = self.mark_busy(id).await?;
        if self.get(id).is_ok() {
            return Err(LifecycleError::AlreadyRunning(id.to_owned()));
        }
        let mut record = match self.record(id)? {
            r if r.state == SandboxState::Paused => r,
            _ => return Err(LifecycleError::SandboxNotFound(id.to_owned())),
        };
        if self.live().len() >= self.limits.max_sandboxes {
            return Err(LifecycleError::Capacity(self.limits.max_sandboxes));
        }
        let spec = LaunchSpec {
            id: record.id.clone(),
            rootfs: record.rootfs.clone(),
            resources: record.resources,
            egress: record.egress.clone(),
        };
        let image = paused_image(&record.id);
        let placement = match self.bring_up(&spec, Some(&image)).await {
            Ok(placement) => placement,
            Err(e) => {
                tracing::warn!(sandbox = %record.id, error = %e, "resume failed; sandbox stays paused");
                return Err(e);
            }
        };
        let slot = placement.slot;
        record.state = SandboxState::Running;
        record.slot = Some(slot);
        record.end_at = now_unix() + timeout.as_secs() as i64;
        if let Err(e) =
            self.store
                .set_state(&record.id, SandboxState::Running, Some(slot), record.end_at)
        {
            self.release(record.id.clone(), slot).await;
            return Err(e.into());
        }
        // The image is spent: the next pause writes a new one from the resumed state.
        if let Err(e) = self.driver.delete_image(&image).await {
            tracing::warn!(sandbox = %record.id, error = %e, "deleting the resumed image failed");
        }
        let sandbox = Sandbox::new(record.clone(), placement);
        self.live().insert(record.id.clone(), sandbox.clone());
        tracing::info!(sandbox = %record.id, "resumed");
        Ok(sandbox)
    }

    /// E2B's connect: a running sandbox's deadline is moved to `timeout` from now if that is
    /// later (connecting never shortens a sandbox's life); a paused one is resumed. Returns the
    /// sandbox and whether it was resumed.
    pub async fn connect(
        &self,
        id: &str,
        timeout: Option<Duration>,
    ) -> Result<(Arc<Sandbox>, bool), LifecycleError> {
        if let Ok(sandbox) = self.get(id) {
            if let Some(t) = timeout {
                if now_unix() + t.as_secs() as i64 > sandbox.record().end_at {
                    self.set_timeout(id, t)?;
                }
            }
            return Ok((sandbox, false));
        }
        Ok((self.resume(id, timeout).await?, true))
    }

    /// `owner`'s snapshot called `name`; another key's snapshot is not found, exactly as one that
    /// does not exist.
    fn owned_snapshot(
        &self,
        owner: Option<&str>,
        name: &TemplateName,
    ) -> Result<Option<SnapshotRecord>, LifecycleError> {
        match owner {
            Some(owner) => Ok(self.store.snapshot(owner, name)?),
            None => Ok(None),
        }
    }

    /// Saves a running sandbox's state as a snapshot that `create` accepts in place of a
    /// template, for the sandbox's owner only; the sandbox keeps running. The owner's snapshot
    /// of the same name is replaced. A name can never be a template's, built or not: templates
    /// are found first, so such a snapshot could never be started.
    pub async fn snapshot(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<SnapshotRecord, LifecycleError> {
        let snapshot_id = match name {
            Some(n) => {
                TemplateName::parse(n).map_err(|_| LifecycleError::BadSnapshotName(n.to_owned()))?
            }
            None => TemplateName::parse(&format!("snap-{}", SandboxId::generate()))
                .expect("generated names are valid"),
        };
        if crate::template::KNOWN_TEMPLATES.contains(&snapshot_id.as_str())
            || self.store.template(&snapshot_id)?.is_some()
        {
            return Err(LifecycleError::BadSnapshotName(format!(
                "{snapshot_id} (a template has that name)"
            )));
        }
        self.out_of_service(id, |sandbox| async move {
            let record = sandbox.record();
            let owner = record.owner.clone().unwrap_or_default();
            let image = snapshot_image(&owner, &snapshot_id);
            if let Err(e) = self
                .driver
                .checkpoint(&record.id, sandbox.placement.slot, &image)
                .await
            {
                return (Err(self.checkpoint_error(e)), false);
            }
            let snapshot = SnapshotRecord {
                id: snapshot_id,
                image,
                template: record.template.clone(),
                rootfs: record.rootfs.clone(),
                source_sandbox: record.id.clone(),
                access_token: record.access_token.clone(),
                created_at: now_unix(),
                owner,
            };
            (
                self.store
                    .insert_snapshot(&snapshot)
                    .map(|()| snapshot)
                    .map_err(Into::into),
                false,
            )
        })
        .await
    }

    /// `owner`'s snapshots, oldest first.
    pub fn snapshots(&self, owner: &str) -> Result<Vec<SnapshotRecord>, LifecycleError> {
        let mut all = self.store.snapshots()?;
        all.retain(|s| s.owner == owner);
        Ok(all)
    }

    /// Deletes `owner`'s snapshot and its image; returns whether it existed.
    pub async fn delete_snapshot(&self, owner: &str, id: &str) -> Result<bool, LifecycleError> {
        let Ok(name) = TemplateName::parse(id) else {
            return Ok(false);
        };
        let Some(snapshot) = self.store.snapshot(owner, &name)? else {
            return Ok(false);
        };
        self.store.delete_snapshot(owner, &name)?;
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
        let source = self.get(id)?.record();
        let snapshot = self.snapshot(id, None).await?;
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
                    auto_resume: source.auto_resume,
                    owner: source.owner.clone(),
                    cpu_count: Some(source.resources.cpu_count),
                    memory_mb: Some(source.resources.memory_mb),
                    disk_mb: Some(source.resources.disk_mb),
                    egress: source.egress.clone(),
                    require_traffic_token: source.require_traffic_token,
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

    /// Kills (or, when asked for, pauses) every sandbox whose deadline has passed. Returns how
    /// many.
    pub fn reap_expired(self: &Arc<Self>) -> usize {
        let now = now_unix();
        let expired: Vec<SandboxRecord> = self
            .live()
            .values()
            .map(|s| s.record())
            .filter(|r| r.end_at <= now && !self.is_busy(&r.id))
            .collect();
        for record in &expired {
            if record.pause_on_timeout {
                tracing::info!(sandbox = %record.id, "timeout reached; pausing");
                let this = self.clone();
                let id = record.id.to_string();
                self.destroying.spawn(async move {
                    if let Err(e) = this.pause(&id).await {
                        tracing::error!(sandbox = %id, error = %e, "pausing on timeout failed; killing");
                        let _ = this.kill(&id);
                    }
                });
            } else {
                tracing::info!(sandbox = %record.id, "timeout reached; killing");
                let _ = self.kill(record.id.as_str());
            }
        }
        expired.len()
    }

    /// Runs the expiry loop until `stop` fires.
    pub async fn run_reaper(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = tick.tick() => { self.reap_expired(); }
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Keeps every template's golden image made and its pool full, until `stop` fires.
    pub async fn run_pools(self: Arc<Self>, stop: CancellationToken) {
        if self.limits.pool_size == 0 {
            return;
        }
        let mut announced = HashSet::new();
        loop {
            let templates = self.store.templates().unwrap_or_default();
            for template in &templates {
                if stop.is_cancelled() {
                    return;
                }
                let golden = self.golden_image(template);
                if !self.driver.has_image(&golden) {
                    match self.make_golden(template, &golden).await {
                        Ok(()) => self.delete_stale_goldens(&templates).await,
                        Err(e) => {
                            tracing::warn!(template = %template.name, error = %e, "making the golden image failed")
                        }
                    }
                    continue;
                }
                if announced.insert(golden.clone()) {
                    tracing::info!(template = %template.name, image = %golden, "golden image reused");
                }
                self.fill_pool(template, &golden, &stop).await;
            }
            tokio::select! {
                _ = self.refill.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Deletes golden images of templates as they were built before, or taken with another
    /// agent or runtime: nothing restores from them any more, and each can be hundreds of MiB.
    async fn delete_stale_goldens(&self, templates: &[crate::store::TemplateRecord]) {
        let current: HashSet<String> = templates.iter().map(|t| self.golden_image(t)).collect();
        for image in self.driver.images().unwrap_or_default() {
            if image.starts_with(GOLDEN_PREFIX) && !current.contains(&image) {
                tracing::info!(image, "deleting a stale golden image");
                if let Err(e) = self.driver.delete_image(&image).await {
                    tracing::warn!(image, error = %e, "deleting a stale golden image failed");
                }
            }
        }
    }

    /// Boots a sandbox from the template, warms it up and checkpoints it as its golden image.
    async fn make_golden(
        &self,
        template: &crate::store::TemplateRecord,
        image: &str,
    ) -> Result<(), LifecycleError> {
        let started_at = std::time::Instant::now();
        let started = self
            .start(&template.rootfs, None, self.default_launch())
            .await?;
        let addr = started.placement.agent;
        let init = InitRequest {
            default_user: Some("user".into()),
            ..Default::default()
        };
        let result = async {
            self.agent
                .init(addr, None, &init)
                .await
                .map_err(LifecycleError::Agent)?;
            self.agent
                .warm_up(addr)
                .await
                .map_err(LifecycleError::Agent)?;
            self.driver
                .checkpoint(&started.id, started.placement.slot, image)
                .await
                .map_err(|e| self.checkpoint_error(e))
        }
        .await;
        self.release(started.id, started.placement.slot).await;
        if result.is_ok() {
            tracing::info!(template = %template.name, image, elapsed = ?started_at.elapsed(), "golden image ready");
        }
        result
    }

    /// Restores sandboxes from the golden image until the pool holds `pool_size` (while the
    /// host has memory to spare).
    async fn fill_pool(
        &self,
        template: &crate::store::TemplateRecord,
        golden: &str,
        stop: &CancellationToken,
    ) {
        loop {
            if stop.is_cancelled() || available_memory_mb() < self.limits.pool_min_available_mb {
                return;
            }
            {
                let mut pools = self.pools();
                let pool = pools.entry(template.name.clone()).or_default();
                if pool.ready.len() + pool.filling >= self.limits.pool_size {
                    return;
                }
                pool.filling += 1;
            }
            let result = self
                .restore_golden(template, golden, self.default_launch())
                .await;
            let result = match result {
                Ok(started) => {
                    // The hostname now: the restored copy becomes itself before anyone asks.
                    let init = InitRequest {
                        default_user: Some("user".into()),
                        hostname: Some(started.id.to_string()),
                        ..Default::default()
                    };
                    let addr = started.placement.agent;
                    match self.agent.init(addr, None, &init).await {
                        Ok(()) => Ok(started),
                        Err(e) => {
                            self.release(started.id, started.placement.slot).await;
                            Err(LifecycleError::Agent(e))
                        }
                    }
                }
                Err(e) => Err(e),
            };
            let mut pools = self.pools();
            let pool = pools.entry(template.name.clone()).or_default();
            pool.filling -= 1;
            match result {
                Ok(started) => pool.ready.push(started),
                Err(e) => {
                    tracing::warn!(template = %template.name, error = %e, "filling the pool failed");
                    return;
                }
            }
        }
    }

    /// Restores a copy of the template's golden image. A copy whose agent never answers means
    /// the image itself is bad (saved with a connection netstack could not restore): it is
    /// deleted, so that the pools make it again, and the error returned.
    async fn restore_golden(
        &self,
        template: &crate::store::TemplateRecord,
        golden: &str,
        launch: (Resources, Egress),
    ) -> Result<Started, LifecycleError> {
        let result = self.start(&template.rootfs, Some(golden), launch).await;
        if let Err(LifecycleError::Agent(e)) = &result {
            tracing::warn!(template = %template.name, image = golden, error = %e, "a copy of the golden image does not answer; making it again");
            if let Err(e) = self.driver.delete_image(golden).await {
                tracing::warn!(image = golden, error = %e, "deleting the golden image failed");
            }
        }
        result
    }

    /// After a (re)start: adopts every recorded running sandbox whose runtime and agent still
    /// answer, destroys the rest, keeps paused ones whose image is there, then sweeps host
    /// resources that no record names.
    pub async fn recover(&self) -> Result<RecoveryReport, LifecycleError> {
        let mut report = RecoveryReport::default();
        for record in self.store.sandboxes()? {
            let slot = match (record.state, record.slot) {
                (SandboxState::Paused, _) => {
                    if self.driver.has_image(&paused_image(&record.id)) {
                        report.paused.push(record.id);
                    } else {
                        tracing::warn!(sandbox = %record.id, "paused sandbox has no image; forgetting it");
                        self.store.delete_sandbox(&record.id)?;
                        report.removed.push(record.id);
                    }
                    continue;
                }
                (SandboxState::Running, Some(slot)) => slot,
                (SandboxState::Running, None) => {
                    self.store.delete_sandbox(&record.id)?;
                    report.removed.push(record.id);
                    continue;
                }
            };
            // Its policy has been in force since the driver started (`adoptable_policies`).
            let placement = match self.driver.adopt(&record.id, slot).await {
                Some(placement) => self
                    .agent
                    .wait_ready(placement.agent, Duration::from_secs(2))
                    .await
                    .ok()
                    .map(|()| placement),
                None => None,
            };
            if let Some(placement) = placement.filter(|_| record.end_at > now_unix()) {
                let sandbox = Sandbox::new(record.clone(), placement);
                self.live().insert(record.id.clone(), sandbox);
                report.adopted.push(record.id);
            } else {
                self.discard(&record.id, slot).await;
                report.removed.push(record.id);
            }
        }
        let keep: Vec<(SandboxId, u32)> = self
            .list()
            .iter()
            .map(|s| (s.id(), s.placement.slot))
            .collect();
        // Best effort: what cannot be removed now is tried again at the next start, and must not
        // keep the server from serving.
        if let Err(e) = self.driver.sweep_orphans(&keep).await {
            tracing::warn!(error = %e, "removing leftovers of earlier runs failed");
        }
        if let Err(e) = self.sweep_images().await {
            tracing::warn!(error = %e, "removing images no record names failed");
        }
        Ok(report)
    }

    /// Deletes paused and snapshot images that no record names (a crash between writing an
    /// image and recording it, or between forgetting a record and deleting its image).
    async fn sweep_images(&self) -> Result<(), LifecycleError> {
        let mut named: HashSet<String> = self
            .store
            .sandboxes()?
            .iter()
            .filter(|r| r.state == SandboxState::Paused)
            .map(|r| paused_image(&r.id))
            .collect();
        named.extend(self.store.snapshots()?.into_iter().map(|s| s.image));
        let images = self.driver.images().map_err(LifecycleError::Driver)?;
        for image in images {
            let ours = image.starts_with(PAUSED_PREFIX) || image.starts_with(SNAPSHOT_PREFIX);
            if ours && !named.contains(&image) {
                tracing::info!(image, "deleting an image no sandbox or snapshot names");
                self.driver
                    .delete_image(&image)
                    .await
                    .map_err(LifecycleError::Driver)?;
            }
        }
        Ok(())
    }

    /// Kills every running and pooled sandbox and waits until the host holds nothing of them.
    /// Paused sandboxes stay on disk for the next start.
    pub async fn shutdown(&self) {
        let ids: Vec<SandboxId> = self.live().keys().cloned().collect();
        for id in ids {
            let _ = self.kill(id.as_str());
        }
        let pooled: Vec<Started> = self
            .pools()
            .values_mut()
            .flat_map(|p| p.ready.drain(..))
            .collect();
        for p in pooled {
            self.destroying.spawn(self.release(p.id, p.placement.slot));
        }
        self.settle().await;
        self.driver.shutdown().await;
    }

    /// Waits for the background destroys started so far.
    pub async fn settle(&self) {
        self.destroying.close();
        self.destroying.wait().await;
        self.destroying.reopen();
    }
}

/// `MemAvailable` from `/proc/meminfo`, in MiB (unbounded if unreadable).
fn available_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(u64::MAX)
}

/// The slots and policies of the sandboxes a restart will try to adopt: the driver puts them
/// in force when it starts, before anything else runs, so no sandbox is ever unconfined.
pub fn adoptable_policies(store: &Store) -> Result<Vec<(u32, Egress)>, StoreError> {
    Ok(store
        .sandboxes()?
        .into_iter()
        .filter(|r| r.state == SandboxState::Running)
        .filter_map(|r| Some((r.slot?, r.egress)))
        .collect())
}

#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub adopted: Vec<SandboxId>,
    pub paused: Vec<SandboxId>,
    pub removed: Vec<SandboxId>,
}

#[cfg(test)]
mod tests {
    //! Lifecycle logic against a recording driver; real runsc is covered by the integration suite.

    use super::*;
    use crate::store::TemplateRecord;

    #[derive(Default)]
    struct RecordingDriver {
        running: Mutex<Vec<SandboxId>>,
        destroyed: Mutex<Vec<SandboxId>>,
        swept_keep: Mutex<Vec<SandboxId>>,
        images: Mutex<HashSet<String>>,
        /// The policy in force per slot, as launches, restores and `set_egress` left it.
        egress: Mutex<HashMap<u32, Egress>>,
        /// Slots are handed out in order and never reused.
        next_slot: std::sync::atomic::AtomicU32,
        fail_launch: bool,
        fail_checkpoint: bool,
    }

    impl RecordingDriver {
        fn place(&self, spec: &LaunchSpec) -> Placement {
            let slot = self
                .next_slot
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.running.lock().unwrap().push(spec.id.clone());
            self.egress
                .lock()
                .unwrap()
                .insert(slot, spec.egress.clone());
            Placement {
                slot,
                agent: Ipv4Addr::from(0x0a00_0000 + slot),
            }
        }
    }

    #[async_trait::async_trait]
    impl Driver for RecordingDriver {
        async fn launch(&self, spec: &LaunchSpec) -> Result<Placement, DriverError> {
            if self.fail_launch {
                return Err(DriverError::Command {
                    what: "runsc".into(),
                    detail: "boom".into(),
                });
            }
            Ok(self.place(spec))
        }
        async fn set_egress(&self, slot: u32, egress: &Egress) -> Result<(), DriverError> {
            self.egress.lock().unwrap().insert(slot, egress.clone());
            Ok(())
        }
        async fn destroy(&self, id: &SandboxId, _slot: u32) -> Result<(), DriverError> {
            self.running.lock().unwrap().retain(|r| r != id);
            self.destroyed.lock().unwrap().push(id.clone());
            Ok(())
        }
        async fn adopt(&self, id: &SandboxId, slot: u32) -> Option<Placement> {
            self.running
                .lock()
                .unwrap()
                .contains(id)
                .then(|| Placement {
                    slot,
                    agent: Ipv4Addr::from(0x0a00_0000 + slot),
                })
        }
        async fn sweep_orphans(&self, keep: &[(SandboxId, u32)]) -> Result<(), DriverError> {
            *self.swept_keep.lock().unwrap() = keep.iter().map(|(id, _)| id.clone()).collect();
            Ok(())
        }
        async fn checkpoint(&self, id: &SandboxId, _: u32, image: &str) -> Result<(), DriverError> {
            if self.fail_checkpoint {
                return Err(DriverError::NoSpace("disk full".into()));
            }
            assert!(self.running.lock().unwrap().contains(id));
            self.images.lock().unwrap().insert(image.to_owned());
            Ok(())
        }
        async fn restore(&self, spec: &LaunchSpec, image: &str) -> Result<Placement, DriverError> {
            assert!(
                self.images.lock().unwrap().contains(image),
                "no image {image}"
            );
            Ok(self.place(spec))
        }
        fn has_image(&self, image: &str) -> bool {
            self.images.lock().unwrap().contains(image)
        }
        async fn delete_image(&self, image: &str) -> Result<(), DriverError> {
            self.images.lock().unwrap().remove(image);
            Ok(())
        }
        fn fingerprint(&self) -> String {
            "test".into()
        }
        fn images(&self) -> Result<Vec<String>, DriverError> {
            Ok(self.images.lock().unwrap().iter().cloned().collect())
        }
        async fn shutdown(&self) {}
    }

    struct ReadyAgent;

    #[async_trait::async_trait]
    impl AgentClient for ReadyAgent {
        async fn wait_ready(&self, _: Ipv4Addr, _: Duration) -> Result<(), String> {
            Ok(())
        }
        async fn init(&self, _: Ipv4Addr, _: Option<&str>, _: &InitRequest) -> Result<(), String> {
            Ok(())
        }
        async fn warm_up(&self, _: Ipv4Addr) -> Result<(), String> {
            Ok(())
        }
    }

    /// An agent that never answers in the first sandbox it is asked about.
    struct FirstCopyDead(std::sync::atomic::AtomicBool);

    #[async_trait::async_trait]
    impl AgentClient for FirstCopyDead {
        async fn wait_ready(&self, _: Ipv4Addr, _: Duration) -> Result<(), String> {
            match self.0.swap(false, std::sync::atomic::Ordering::SeqCst) {
                true => Err("no answer in time".into()),
                false => Ok(()),
            }
        }
        async fn init(&self, _: Ipv4Addr, _: Option<&str>, _: &InitRequest) -> Result<(), String> {
            Ok(())
        }
        async fn warm_up(&self, _: Ipv4Addr) -> Result<(), String> {
            Ok(())
        }
    }

    fn setup(
        driver: Arc<RecordingDriver>,
        limits: Limits,
    ) -> (tempfile::TempDir, Arc<Store>, Arc<Lifecycle>) {
        setup_with_agent(driver, limits, Arc::new(ReadyAgent))
    }

    fn setup_with_agent(
        driver: Arc<RecordingDriver>,
        limits: Limits,
        agent: Arc<dyn AgentClient>,
    ) -> (tempfile::TempDir, Arc<Store>, Arc<Lifecycle>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
        store
            .put_template(&TemplateRecord {
                name: TemplateName::parse("base").unwrap(),
                content_hash: "h".into(),
                rootfs: dir.path().join("rootfs"),
                built_at: 0,
                size_bytes: 0,
            })
            .unwrap();
        let lc = Lifecycle::new(store.clone(), driver, agent, limits);
        (dir, store, lc)
    }

    #[tokio::test]
    async fn a_golden_image_whose_copy_never_answers_is_dropped_and_the_create_boots() {
        let driver = Arc::new(RecordingDriver::default());
        let golden = "golden-base-h-test";
        driver.images.lock().unwrap().insert(golden.into());
        let agent = Arc::new(FirstCopyDead(std::sync::atomic::AtomicBool::new(true)));
        let (_dir, _store, lc) = setup_with_agent(driver.clone(), Limits::default(), agent);
        let sbx = lc.create(params()).await.unwrap();
        assert!(
            !driver.has_image(golden),
            "the bad image is deleted, to be made again"
        );
        assert_eq!(
            driver.destroyed.lock().unwrap().len(),
            1,
            "its dead copy is gone"
        );
        assert_eq!(
            *driver.running.lock().unwrap(),
            [sbx.id()],
            "the create booted"
        );
    }

    fn params() -> CreateParams {
        CreateParams {
            template: "base".into(),
            secure: true,
            owner: Some("k1".into()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn create_kill_and_slot_reuse() {
        let driver = Arc::new(RecordingDriver::default());
        let (_dir, store, lc) = setup(driver.clone(), Limits::default());
        let a = lc.create(params()).await.unwrap();
        let b = lc.create(params()).await.unwrap();
        assert_eq!((a.record().slot, b.record().slot), (Some(0), Some(1)));
        assert!(a.access_token().is_some());
        assert_eq!(store.sandboxes().unwrap().len(), 2);

        lc.kill(a.id().as_str()).unwrap();
        assert!(matches!(
            lc.kill(a.id().as_str()),
            Err(LifecycleError::SandboxNotFound(_))
        ));
        lc.settle().await;
        assert_eq!(store.sandboxes().unwrap().len(), 1);
        let c = lc.create(params()).await.unwrap();
        assert_eq!(
            c.record().slot,
            Some(2),
            "a freed slot is not reused at once"
        );
    }

    #[tokio::test]
    async fn unknown_template_capacity_and_failed_launch() {
        let driver = Arc::new(RecordingDriver::default());
        let limits = Limits {
            max_sandboxes: 1,
            ..Limits::default()
        };
        let (_dir, _store, lc) = setup(driver, limits);
        let bad = CreateParams {
            template: "nope".into(),
            ..params()
        };
        assert!(matches!(
            lc.create(bad).await,
            Err(LifecycleError::TemplateNotFound(_))
        ));
        lc.create(params()).await.unwrap();
        assert!(matches!(
            lc.create(params()).await,
            Err(LifecycleError::Capacity(1))
        ));

        let failing = Arc::new(RecordingDriver {
            fail_launch: true,
            ..Default::default()
        });
        let (_dir2, store2, lc2) = setup(failing.clone(), Limits::default());
        assert!(matches!(
            lc2.create(params()).await,
            Err(LifecycleError::Driver(_))
        ));
        assert!(
            store2.sandboxes().unwrap().is_empty(),
            "a failed create leaves no row"
        );
        assert!(
            failing.running.lock().unwrap().is_empty(),
            "and runs nothing"
        );
    }

    #[tokio::test]
    async fn expiry_and_timeouts() {
        let driver = Arc::new(RecordingDriver::default());
        let (_dir, _store, lc) = setup(driver, Limits::default());
        let lc = &lc;
        let short = lc
            .create(CreateParams {
                timeout: Some(Duration::ZERO),
                ..params()
            })
            .await
            .unwrap();
        let long = lc.create(params()).await.unwrap();
        assert_eq!(lc.reap_expired(), 1);
        assert!(lc.get(short.id().as_str()).is_err());
        assert!(lc.get(long.id().as_str()).is_ok());
        let too_long = Duration::from_secs(lc.limits().max_timeout.as_secs() + 1);
        assert!(matches!(
            lc.set_timeout(long.id().as_str(), too_long),
            Err(LifecycleError::TimeoutTooLong { .. })
        ));
    }

    #[tokio::test]
    async fn recover_adopts_the_living_and_removes_the_dead() {
        let driver = Arc::new(RecordingDriver::default());
        let (_dir, store, lc) = setup(driver.clone(), Limits::default());
        let alive = lc.create(params()).await.unwrap().id();
        let dead = lc.create(params()).await.unwrap().id();
        driver.running.lock().unwrap().retain(|id| *id != dead);

        // A new server process on the same store and host.
        let lc2 = Lifecycle::new(
            store.clone(),
            driver.clone(),
            Arc::new(ReadyAgent),
            Limits::default(),
        );
        let report = lc2.recover().await.unwrap();
        assert_eq!(report.adopted, vec![alive.clone()]);
        assert_eq!(report.removed, vec![dead]);
        assert_eq!(*driver.swept_keep.lock().unwrap(), vec![alive.clone()]);
        assert_eq!(store.sandboxes().unwrap().len(), 1);
        let next = lc2.create(params()).await.unwrap();
        assert_ne!(
            next.record().slot,
            lc2.get(alive.as_str()).unwrap().record().slot
        );
    }

    #[tokio::test]
    async fn policies_and_resources_follow_the_sandbox() {
        let driver = Arc::new(RecordingDriver::default());
        let (_dir, store, lc) = setup(driver.clone(), Limits::default());
        let egress = Egress::from_request(Some(false), &["pypi.org".into()], &[]).unwrap();
        let a = lc
            .create(CreateParams {
                egress: egress.clone(),
                cpu_count: Some(1),
                memory_mb: Some(512),
                ..params()
            })
            .await
            .unwrap();
        let slot = a.record().slot.unwrap();
        assert_eq!(driver.egress.lock().unwrap()[&slot], egress);
        let record = store.sandbox(&a.id()).unwrap().unwrap();
        assert_eq!(record.egress, egress);
        assert_eq!(
            record.resources,
            Resources {
                cpu_count: 1,
                memory_mb: 512,
                disk_mb: Limits::default().default_resources.disk_mb
            }
        );

        // A resume lands in another slot, with the same policy before it runs.
        lc.create(params()).await.unwrap();
        lc.pause(a.id().as_str()).await.unwrap();
        lc.create(params()).await.unwrap();
        let resumed = lc.resume(a.id().as_str(), None).await.unwrap();
        let new_slot = resumed.record().slot.unwrap();
        assert_ne!(new_slot, slot);
        assert_eq!(driver.egress.lock().unwrap()[&new_slot], egress);

        // Rules replaced while it runs take effect at once; while it is paused, at its resume.
        let id = resumed.id();
        lc.set_network(id.as_str(), Egress::default(), None)
            .await
            .unwrap();
        assert!(driver.egress.lock().unwrap()[&new_slot].is_open());
        lc.pause(id.as_str()).await.unwrap();
        lc.set_network(id.as_str(), egress.clone(), None)
            .await
            .unwrap();
        let again = lc.resume(id.as_str(), None).await.unwrap();
        assert_eq!(
            driver.egress.lock().unwrap()[&again.record().slot.unwrap()],
            egress
        );
        assert!(matches!(
            lc.set_network("nosuch", Egress::default(), None).await,
            Err(LifecycleError::SandboxNotFound(_))
        ));

        for (cpu, mem, disk) in [
            (Some(0), None, None),
            (Some(9), None, None),
            (None, Some(64), None),
            (None, None, Some(1 << 20)),
        ] {
            let err = lc
                .create(CreateParams {
                    cpu_count: cpu,
                    memory_mb: mem,
                    disk_mb: disk,
                    ..params()
                })
                .await
                .err()
                .unwrap();
            assert!(matches!(err, LifecycleError::BadRequest(_)), "{err}");
        }
    }

    #[tokio::test]
    async fn pause_resume_and_their_conflicts() {
        let driver = Arc::new(RecordingDriver::default());
        let (_dir, store, lc) = setup(driver.clone(), Limits::default());
        let a = lc.create(params()).await.unwrap();
        let id = a.id().to_string();
        lc.pause(&id).await.unwrap();
        assert!(lc.get(&id).is_err(), "a paused sandbox takes no traffic");
        assert_eq!(lc.record(&id).unwrap().state, SandboxState::Paused);
        assert_eq!(store.sandboxes().unwrap()[0].slot, None);
        assert!(matches!(
            lc.pause(&id).await,
            Err(LifecycleError::AlreadyPaused(_))
        ));
        assert!(matches!(
            lc.set_timeout(&id, Duration::from_secs(5)),
            Err(LifecycleError::SandboxNotFound(_))
        ));

        let (resumed, was_paused) = lc.connect(&id, None).await.unwrap();
        assert!(was_paused);
        assert_eq!(resumed.record().state, SandboxState::Running);
        assert!(
            !driver.has_image(&paused_image(&resumed.id())),
            "the spent image is gone"
        );
        assert!(matches!(
            lc.resume(&id, None).await,
            Err(LifecycleError::AlreadyRunning(_))
        ));
        assert!(matches!(
            lc.pause("nosuchsandbox").await,
            Err(LifecycleError::SandboxNotFound(_))
        ));

        lc.pause(&id).await.unwrap();
        lc.kill(&id).unwrap();
        lc.settle().await;
        assert!(store.sandboxes().unwrap().is_empty());
        assert!(driver.images.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_failed_checkpoint_keeps_the_sandbox_running() {
        let driver = Arc::new(RecordingDriver {
            fail_checkpoint: true,
            ..Default::default()
        });
        let (_dir, _store, lc) = setup(driver, Limits::default());
        let id = lc.create(params()).await.unwrap().id().to_string();
        assert!(matches!(
            lc.pause(&id).await,
            Err(LifecycleError::NoSpace(_))
        ));
        let back = lc.get(&id).unwrap();
        assert_eq!(back.record().state, SandboxState::Running);
    }

    #[tokio::test]
    async fn snapshots_start_new_sandboxes_and_paused_ones_survive_recovery() {
        let driver = Arc::new(RecordingDriver::default());
        let (_dir, store, lc) = setup(driver.clone(), Limits::default());
        let source = lc.create(params()).await.unwrap();
        let snap = lc
            .snapshot(source.id().as_str(), Some("ready"))
            .await
            .unwrap();
        assert!(
            lc.get(source.id().as_str()).is_ok(),
            "the source keeps running"
        );
        let copy = lc
            .create(CreateParams {
                template: "ready".into(),
                ..params()
            })
            .await
            .unwrap();
        assert_ne!(copy.id(), source.id());
        assert_eq!(copy.record().template.as_str(), "ready");
        // Another key gets exactly what a name that does not exist gets.
        let stranger = |template: &str| CreateParams {
            template: template.into(),
            owner: Some("k2".into()),
            ..params()
        };
        for name in ["ready", "nosuchname"] {
            assert!(matches!(
                lc.create(stranger(name)).await,
                Err(LifecycleError::TemplateNotFound(_))
            ));
        }
        assert!(!lc.delete_snapshot("k2", "ready").await.unwrap());
        assert!(lc.snapshots("k2").unwrap().is_empty());
        // Its snapshot of the same name is its own, and replaces nothing of k1's.
        let theirs = lc
            .create(CreateParams {
                owner: Some("k2".into()),
                ..params()
            })
            .await
            .unwrap();
        let their_snap = lc
            .snapshot(theirs.id().as_str(), Some("ready"))
            .await
            .unwrap();
        assert_ne!(their_snap.image, snap.image);
        assert_eq!(lc.snapshots("k1").unwrap(), vec![snap.clone()]);
        for bad in ["Bad Name", "base", "code-interpreter-v1"] {
            assert!(
                matches!(
                    lc.snapshot(source.id().as_str(), Some(bad)).await,
                    Err(LifecycleError::BadSnapshotName(_))
                ),
                "{bad}"
            );
        }
        let forks = lc.fork(source.id().as_str(), 2, None).await.unwrap();
        assert_eq!(forks.iter().filter(|f| f.is_ok()).count(), 2);
        assert_eq!(
            lc.snapshots("k1").unwrap(),
            vec![snap.clone()],
            "the fork's snapshot is gone"
        );
        assert!(lc.delete_snapshot("k1", "ready").await.unwrap());
        assert!(!lc.delete_snapshot("k1", "ready").await.unwrap());
        assert!(driver.has_image(&their_snap.image), "k2's is untouched");

        lc.pause(copy.id().as_str()).await.unwrap();
        for leftover in ["paused-gone", "snapshot-gone", "golden-base-x-y"] {
            driver.images.lock().unwrap().insert(leftover.into());
        }
        let lc2 = Lifecycle::new(
            store.clone(),
            driver.clone(),
            Arc::new(ReadyAgent),
            Limits::default(),
        );
        let report = lc2.recover().await.unwrap();
        assert_eq!(report.paused, vec![copy.id()]);
        let images = driver.images().unwrap();
        assert!(images.contains(&paused_image(&copy.id())));
        assert!(
            images.contains(&"golden-base-x-y".to_string()),
            "goldens are the pool's business"
        );
        assert!(
            !images.iter().any(|i| i.ends_with("-gone")),
            "unnamed images are swept"
        );
        lc2.resume(copy.id().as_str(), None).await.unwrap();
    }
}
