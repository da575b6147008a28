//! Sandbox lifecycle: create, find, extend, pause, resume, snapshot, fork, kill, expire, adopt
//! after a restart, shut down. Each sandbox's state lives in one place, its [`Sandbox`] (a
//! phase, its record, where it runs); the verbs that change it live one per file:
//!
//! - `create`: admission, pools and golden images handing over, booting, claiming;
//! - `checkpoint`: pause, resume, snapshot, fork;
//! - `kill`: kill, and what destroying a sandbox's host resources takes;
//! - `expiry`: timeouts, connect, network settings;
//! - `recovery`: adopting what runs after a restart, sweeping what nothing names;
//! - `pools`: golden images and the pools of ready sandboxes.
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

mod checkpoint;
mod create;
mod drain;
mod events;
mod expiry;
mod freezer;
mod goldens;
mod kill;
mod launches;
mod load;
pub mod metrics;
mod parking;
mod pool_plan;
mod pools;
mod quotas;
mod recovery;
mod registry;
mod remote_images;
mod rootfs;
mod sandbox;
mod snapshot_copies;
mod start_cmd;
#[cfg(test)]
mod tests;
mod volume_use;

pub use load::{
    memory_sized_max_sandboxes, HostLoad, PoolChurn, PoolLoad, HOST_RESERVE_MB, IDLE_SANDBOX_MB,
};
pub use recovery::{adoptable_policies, RecoveryReport};
pub use remote_images::ImageTransfers;
pub use rootfs::RootfsSource;
pub use sandbox::{Awake, Phase, Sandbox};

use crate::driver::{Driver, DriverError, Resources};
use crate::egress::Egress;
use crate::ids::{SandboxId, TemplateName};
use crate::store::{PauseMode, SandboxRecord, Store, StoreError};
use crate::volumes::{MountRequest, VolumeError, Volumes};
use airlock_wire::envd::InitRequest;
use airlock_wire::logs::LogEntry;
use pools::Pools;
use registry::Registry;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

/// What a server's stop does to the sandboxes that run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExit {
    /// They run on, with their processes, files and network rules (which stay in the host's
    /// firewall), and the next start adopts them.
    KeepRunning,
    /// They are killed, as by `kill`.
    StopSandboxes,
}

/// Why a sandbox's agent did not take its settings (`/init`).
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// It refused them, saying why: they were the caller's, and wrong for this sandbox (a volume
    /// mount path that is a file in the template, say).
    #[error("{0}")]
    Refused(String),
    /// It did not answer, or failed.
    #[error("{0}")]
    Failed(String),
}

impl From<InitError> for LifecycleError {
    fn from(err: InitError) -> Self {
        match err {
            InitError::Refused(why) => LifecycleError::BadRequest(why),
            InitError::Failed(why) => LifecycleError::Agent(why),
        }
    }
}

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
    ) -> Result<(), InitError>;
    /// Loads what the template preloads (the code interpreter's kernel and its usual imports)
    /// before the template's golden image is taken. Templates without it succeed at once.
    async fn warm_up(&self, addr: Ipv4Addr) -> Result<(), String>;
    /// Runs `command` through the agent at `addr` and waits for it to end, handing each line of
    /// its output to `output` as it comes. Returns its exit code; an `Err` if it could not be
    /// run, or did not end within its timeout (it is then killed with the sandbox).
    async fn run(
        &self,
        addr: Ipv4Addr,
        command: &AgentCommand,
        output: &mut (dyn FnMut(OutputLine) + Send),
    ) -> Result<i32, String>;
    /// The sandbox's whole log as the agent at `addr` holds it, oldest first.
    async fn logs(&self, addr: Ipv4Addr, token: Option<&str>) -> Result<Vec<LogEntry>, String>;
    /// Ends every process of the sandbox but the agent, which forgets what it kept for them:
    /// what is left is its files, as after a boot.
    async fn reboot(&self, addr: Ipv4Addr, token: Option<&str>) -> Result<(), String>;
    /// A process that keeps the sandbox awake (`"1234 sleep"`), or `None` when nothing in it
    /// may be running or waiting for a time of its own: it may then be frozen.
    async fn busy(&self, addr: Ipv4Addr, token: Option<&str>) -> Result<Option<String>, String>;
}

/// A command for [`AgentClient::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    pub program: Program,
    pub user: String,
    /// `None`: the user's home.
    pub cwd: Option<String>,
    pub envs: BTreeMap<String, String>,
    pub timeout: Duration,
    /// The agent keeps its output in the sandbox's log (a template's start command).
    pub logged: bool,
    /// The sandbox's access token, once it has one (a golden image's agent has none yet).
    pub access_token: Option<Arc<str>>,
}

/// What an [`AgentCommand`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// A command line, run with `/bin/sh -c`.
    Shell(String),
    /// A program and its arguments, run as they are (an image may have no shell).
    Exec(Vec<String>),
}

/// One line a command wrote (without its newline), and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLine {
    pub text: String,
    pub stderr: bool,
}

/// Server-wide defaults and caps.
#[derive(Debug, Clone)]
pub struct Limits {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// Sandboxes running (or starting, or being resumed) at once, for all keys together.
    /// Pools fill only the room this leaves, and give way to creates at it.
    pub max_sandboxes: usize,
    /// What each API key may hold unless its own limits say otherwise.
    pub per_key: KeyQuota,
    /// What a sandbox gets when its create names no resources.
    pub default_resources: Resources,
    /// The most a create may ask for.
    pub max_resources: Resources,
    /// How long a new sandbox's agent may take to answer.
    pub agent_start_timeout: Duration,
    /// Sandboxes being launched (restored or booted, until their agent answers) at once; the
    /// rest wait their turn (see `launches.rs`).
    pub max_launches: usize,
    /// The longest a create or resume is expected to wait for its launch before it is refused
    /// with 429 instead.
    pub max_launch_wait: Duration,
    /// Ready sandboxes kept per template (0 turns pools and golden images off).
    pub pool_size: usize,
    /// The most ready sandboxes one template's pool grows to when creates find it empty.
    pub pool_max: usize,
    /// A grown pool halves what it keeps beyond `pool_size` after this long with no create
    /// finding it empty.
    pub pool_shrink_after: Duration,
    /// Pools are not refilled while the host has less memory available than this.
    pub pool_min_available_mb: u64,
    /// The most memory all pools' ready sandboxes may hold together (by their cgroups'
    /// charge), shared out by `pool_plan`.
    pub pool_memory_mb: u64,
    /// A template's pool is emptied once nobody has created a sandbox of it for this long;
    /// its next create restores the golden image itself, and the pool is filled again.
    pub pool_idle: Duration,
    /// How long a ready sandbox waits in its pool before it may be let go (its pool shrank, or
    /// another template's needs the room): no restore is thrown away before it could serve a
    /// create.
    pub pool_min_age: Duration,
    /// The pools' CPU budget: the most restores into pools per minute (half a minute's worth
    /// may come at once).
    pub pool_restores_per_min: u32,
    /// How long a template's ready command may take to succeed once its sandbox boots.
    pub ready_timeout: Duration,
    /// A running sandbox with no traffic for this long, in which nothing runs, is frozen until
    /// its next request (`None`: never).
    pub freeze_after: Option<Duration>,
    /// The most memory the runtimes of paused sandboxes may keep, frozen, so that their resume
    /// is a thaw rather than a restore (0: a pause always lets its runtime go).
    pub paused_memory_mb: u64,
    /// The most disk this node's copies of snapshot images that are also in object storage
    /// may take; past it, the least recently started from are deleted (and downloaded again
    /// at their next use). Copies on this node alone do not count.
    pub snapshot_cache_mb: u64,
}

/// What one API key may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyQuota {
    pub running: usize,
    pub paused: usize,
    pub snapshot_mb: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            max_sandboxes: 256,
            per_key: KeyQuota {
                running: 256,
                paused: 256,
                snapshot_mb: 100 * 1024,
            },
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
            max_launches: host_cores(),
            max_launch_wait: Duration::from_secs(10),
            pool_size: 2,
            pool_max: 32,
            pool_shrink_after: Duration::from_secs(60),
            pool_min_available_mb: 2048,
            pool_memory_mb: 2048,
            pool_idle: Duration::from_secs(30 * 60),
            pool_min_age: Duration::from_secs(60),
            pool_restores_per_min: default_pool_restores_per_min(),
            ready_timeout: Duration::from_secs(300),
            freeze_after: Some(Duration::from_secs(1)),
            paused_memory_mb: 1024,
            snapshot_cache_mb: 10 * 1024,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("template '{0}' not found; build it first (Template.build in the SDK, or `airlock template build -f Dockerfile -n {0}`)")]
    TemplateNotFound(String),
    #[error("sandbox '{0}' not found")]
    SandboxNotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("the server already runs its maximum of {0} sandboxes; try again when one ends")]
    Capacity(usize),
    /// Too many launches are queued ahead for this one to start within the server's
    /// `max_launch_wait`.
    #[error("the server is busy starting other sandboxes (about {retry_after_secs} s of launches are queued); try again in {retry_after_secs} s")]
    Overloaded { retry_after_secs: u64 },
    /// An API key's own limit (see [`KeyQuota`]).
    #[error("{0}")]
    Quota(String),
    #[error("timeout of {requested}s exceeds the maximum of {max}s")]
    TimeoutTooLong { requested: u64, max: u64 },
    #[error("sandbox '{0}' is already paused")]
    AlreadyPaused(String),
    #[error("sandbox '{0}' is already running")]
    AlreadyRunning(String),
    #[error("sandbox '{0}' is being paused, resumed or snapshotted; try again")]
    Busy(String),
    #[error("node '{0}' is draining for maintenance: it starts and resumes no sandbox")]
    Draining(String),
    #[error("'{0}' is not a valid snapshot name (a-z, 0-9, '.', '_', '-'; at most 64)")]
    BadSnapshotName(String),
    #[error("not enough disk space: {0}; the sandbox keeps running")]
    NoSpace(String),
    #[error("starting the sandbox failed")]
    Driver(#[source] DriverError),
    #[error("the sandbox's agent did not start: {0}")]
    Agent(String),
    /// A running sandbox's agent does not answer (or failed what it was asked); it keeps
    /// running as it was.
    #[error("the sandbox's agent does not answer: {0}")]
    GuestUnresponsive(String),
    /// The template's start command failed or never became ready (with its output).
    #[error("{0}")]
    StartCommand(String),
    #[error(
        "sandbox '{0}' cannot be resumed: its paused image is gone from the server's disk; kill it"
    )]
    ImageGone(String),
    /// Its image is in object storage only, and could not be fetched from there now.
    #[error("sandbox '{0}' cannot be resumed now: its paused image could not be fetched from object storage; try again")]
    ImageUnavailable(String),
    /// Taken on another node, and not in object storage now.
    #[error("snapshot '{0}' was taken on another node and could not be fetched from object storage now; try again")]
    SnapshotUnavailable(String),
    /// The template's files are not on this node, and could not be fetched (why is logged:
    /// it names the host's paths and the object store).
    #[error("this node does not have the sandbox's template files and could not fetch them from object storage now; try again")]
    TemplateFilesUnavailable,
    #[error("state store failed")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
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
    /// How that pause pauses.
    pub timeout_pause: PauseMode,
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
    /// The owner's volumes to mount, by name.
    pub volume_mounts: Vec<MountRequest>,
}

pub struct Lifecycle {
    /// This node's name in the sandbox catalog.
    node: String,
    store: Arc<Store>,
    driver: Arc<dyn Driver>,
    agent: Arc<dyn AgentClient>,
    limits: Limits,
    /// Every sandbox from its admission to its kill, running or paused.
    sandboxes: Registry,
    pools: Pools,
    /// The turns to launch a sandbox in (back-pressure).
    launches: launches::Launches,
    volumes: Arc<Volumes>,
    /// Wakes the pool filler (a pooled sandbox was taken).
    refill: Notify,
    /// Destroys and auto-pauses running in the background (a kill answers before the host
    /// cleanup is done).
    destroying: TaskTracker,
    metrics: metrics::Metrics,
    /// Lifecycle events not yet written.
    journal: events::Journal,
    /// Paused images in object storage, if the server keeps them there.
    remote: remote_images::RemoteImages,
    /// Set by a drain: no sandbox starts or resumes here.
    draining: std::sync::atomic::AtomicBool,
    /// Where templates' root filesystems come from (see `rootfs.rs`); none in unit tests.
    rootfs_source: std::sync::OnceLock<Arc<dyn RootfsSource>>,
}

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

/// A new image for `owner`'s snapshot `id`: owners may use the same names, and each take of a
/// name gets an image of its own, so that a node's copy of an earlier take, under the same
/// name, is never taken for the newer one.
fn snapshot_image(owner: &str, id: &TemplateName) -> String {
    format!(
        "{SNAPSHOT_PREFIX}{owner}-{id}-{:08x}",
        rand::random::<u32>()
    )
}

impl Lifecycle {
    /// The lifecycle of the sandboxes that the node called `node` runs.
    pub fn new(
        node: String,
        store: Arc<Store>,
        driver: Arc<dyn Driver>,
        agent: Arc<dyn AgentClient>,
        limits: Limits,
        volumes: Arc<Volumes>,
    ) -> Arc<Self> {
        Arc::new(Lifecycle {
            node,
            launches: launches::Launches::new(limits.max_launches, limits.max_launch_wait),
            store,
            driver,
            agent,
            limits,
            volumes,
            sandboxes: Registry::default(),
            pools: Pools::default(),
            refill: Notify::new(),
            destroying: TaskTracker::new(),
            metrics: metrics::Metrics::default(),
            journal: events::Journal::default(),
            remote: remote_images::RemoteImages::default(),
            rootfs_source: std::sync::OnceLock::new(),
            draining: Default::default(),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What the key `owner` may hold: its own limits, else the server's.
    async fn quota(&self, owner: Option<&str>) -> Result<KeyQuota, LifecycleError> {
        let defaults = self.limits.per_key;
        let Some(owner) = owner else {
            return Ok(defaults);
        };
        let set = self.store.keys().limits(owner).await?;
        Ok(KeyQuota {
            running: set.max_running.map_or(defaults.running, |n| n as usize),
            paused: set.max_paused.map_or(defaults.paused, |n| n as usize),
            snapshot_mb: set.max_snapshot_mb.unwrap_or(defaults.snapshot_mb),
        })
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

    /// The sandbox with this id, in whatever phase, if it exists for the API (not starting,
    /// not killed).
    fn find(&self, id: &str) -> Result<Arc<Sandbox>, LifecycleError> {
        SandboxId::parse(id)
            .ok()
            .and_then(|id| self.sandboxes.get(&id))
            .filter(|s| s.phase().shown().is_some())
            .ok_or_else(|| LifecycleError::SandboxNotFound(id.to_owned()))
    }

    /// A running sandbox, for its traffic. One being saved as a snapshot runs on afterwards,
    /// so its traffic waits (a while) for it; one that is not running is not found.
    pub async fn running(&self, id: &str) -> Result<Arc<Sandbox>, LifecycleError> {
        let sandbox = self.find(id)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match sandbox.phase() {
                Phase::Running => return Ok(sandbox),
                Phase::Snapshotting if tokio::time::Instant::now() < deadline => {
                    sandbox.changes(Duration::from_millis(500)).await
                }
                _ => return Err(LifecycleError::SandboxNotFound(id.to_owned())),
            }
        }
    }

    /// A sandbox's log, oldest first: from its agent while it runs, as it was at the pause
    /// while it is paused.
    pub async fn logs(&self, id: &str) -> Result<Arc<[LogEntry]>, LifecycleError> {
        let sandbox = self.find(id)?;
        let _awake = self.wake(&sandbox);
        match sandbox.agent() {
            Some(addr) => self
                .agent
                .logs(addr, sandbox.access_token().as_deref())
                .await
                .map(Into::into)
                .map_err(|e| LifecycleError::GuestUnresponsive(format!("reading its log: {e}"))),
            None => Ok(sandbox.paused_log()),
        }
    }

    /// A sandbox's record, running or paused.
    pub fn record(&self, id: &str) -> Result<Arc<SandboxRecord>, LifecycleError> {
        Ok(self.find(id)?.record())
    }

    /// The running sandbox whose access token `matches` accepts, if any: one call per running
    /// sandbox that has a token, nothing copied.
    pub fn find_by_access_token(&self, matches: impl Fn(&str) -> bool) -> Option<Arc<Sandbox>> {
        self.sandboxes.find(|s| {
            s.phase() == Phase::Running && s.access_token().as_deref().is_some_and(&matches)
        })
    }

    /// Running and paused sandboxes, oldest first (in the order they were created).
    pub fn list_records(&self) -> Vec<Arc<SandboxRecord>> {
        let mut all: Vec<Arc<SandboxRecord>> = self
            .sandboxes
            .all()
            .iter()
            .filter(|s| s.phase().shown().is_some())
            .map(|s| s.record())
            .collect();
        all.sort_by(|a, b| (a.started_at_us, &a.id).cmp(&(b.started_at_us, &b.id)));
        all
    }
}

/// The default `pool_restores_per_min`: 20 a minute per core. A restore and its `/init` take
/// about 0.1-0.2 s of CPU, so at most a few percent of the host's CPU goes to pools.
pub fn default_pool_restores_per_min() -> u32 {
    20 * host_cores() as u32
}

/// The host's cores (1 if unknown).
pub fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `MemAvailable` from `/proc/meminfo`, in MiB (unbounded if unreadable).
fn available_memory_mb() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    load::meminfo_bytes(&meminfo, "MemAvailable:").map_or(u64::MAX, |bytes| bytes >> 20)
}
