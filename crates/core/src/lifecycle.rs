//! Sandbox lifecycle: create, find, extend, kill, expire, adopt after a restart, shut down.
//!
//! The store is written before the driver acts, so after a crash every host resource a sandbox
//! may hold is named by a row (adopted or destroyed at the next start) or swept as an orphan.

use crate::driver::{Driver, DriverError, LaunchSpec, SlotAddrs};
use crate::ids::{random_token, SandboxId, TemplateName};
use crate::store::{SandboxRecord, Store, StoreError};
use airlock_wire::envd::InitRequest;
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How the lifecycle reaches a sandbox's agent. The server implements it over HTTP; keeping it a
/// trait keeps HTTP out of the core.
#[async_trait::async_trait]
pub trait AgentClient: Send + Sync + 'static {
    /// Waits until the agent at `addr` answers its health check, or `within` passes.
    async fn wait_ready(&self, addr: Ipv4Addr, within: Duration) -> Result<(), String>;
    /// Hands the agent its sandbox's settings (`POST /init`).
    async fn init(&self, addr: Ipv4Addr, init: &InitRequest) -> Result<(), String>;
}

/// Server-wide defaults and caps.
#[derive(Debug, Clone)]
pub struct Limits {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub max_sandboxes: usize,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_mb: u32,
    /// How long a new sandbox's agent may take to answer.
    pub agent_start_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            max_sandboxes: 256,
            cpu_count: 2,
            memory_mb: 1024,
            disk_mb: 5120,
            agent_start_timeout: Duration::from_secs(20),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("template '{0}' not found; build it with `airlock template build {0}`")]
    TemplateNotFound(String),
    #[error("sandbox '{0}' not found")]
    SandboxNotFound(String),
    #[error("the server already runs its maximum of {0} sandboxes")]
    Capacity(usize),
    #[error("timeout of {requested}s exceeds the maximum of {max}s")]
    TimeoutTooLong { requested: u64, max: u64 },
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
    pub template: String,
    pub timeout: Option<Duration>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// Whether the agent demands an access token (v2 sandboxes always do).
    pub secure: bool,
}

/// A running sandbox.
pub struct Sandbox {
    record: Mutex<SandboxRecord>,
    pub addrs: SlotAddrs,
    /// Fired when the sandbox is killed, so open proxied streams can be cut.
    killed: CancellationToken,
}

impl Sandbox {
    pub fn record(&self) -> SandboxRecord {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn id(&self) -> SandboxId {
        self.record().id
    }

    pub fn access_token(&self) -> Option<String> {
        self.record().access_token
    }

    /// Resolves when the sandbox is killed.
    pub fn killed(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.killed.clone().cancelled_owned()
    }
}

pub struct Lifecycle {
    store: Arc<Store>,
    driver: Arc<dyn Driver>,
    agent: Arc<dyn AgentClient>,
    limits: Limits,
    live: Mutex<HashMap<SandboxId, Arc<Sandbox>>>,
    /// Slots handed out, including those of sandboxes still starting or being destroyed.
    slots: Arc<Mutex<Slots>>,
    /// Destroys running in the background (a kill answers before the host cleanup is done).
    destroying: TaskTracker,
}

pub fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
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
            slots: Arc::new(Mutex::new(Slots::default())),
            destroying: TaskTracker::new(),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands out slots round-robin: an address comes back only after every other slot was used.
    /// A dead sandbox's netstack never closes the connections that were open to it, so clients
    /// (the proxy's pool among them) must not find a new sandbox at a recently used address.
    fn take_slot(&self) -> Result<u32, LifecycleError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let used = slots.used.iter().filter(|s| **s).count();
        if used >= self.limits.max_sandboxes {
            return Err(LifecycleError::Capacity(self.limits.max_sandboxes));
        }
        let total = SlotAddrs::MAX_SLOTS as usize;
        let start = slots.next;
        let slot = (0..total)
            .map(|i| (start + i) % total)
            .find(|&s| !slots.used.get(s).copied().unwrap_or(false))
            .ok_or(LifecycleError::Capacity(total))?;
        if slots.used.len() <= slot {
            slots.used.resize(slot + 1, false);
        }
        slots.used[slot] = true;
        slots.next = (slot + 1) % total;
        Ok(slot as u32)
    }

    fn mark_slot(&self, slot: u32, used: bool) {
        mark_slot(&self.slots, slot, used);
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

    pub async fn create(&self, params: CreateParams) -> Result<Arc<Sandbox>, LifecycleError> {
        let template = TemplateName::parse(&params.template)
            .ok()
            .and_then(|name| self.store.template(&name).transpose())
            .transpose()?
            .ok_or_else(|| LifecycleError::TemplateNotFound(params.template.clone()))?;
        let timeout = self.clamp_timeout(params.timeout)?;
        let slot = self.take_slot()?;
        let now = now_unix();
        let record = SandboxRecord {
            id: SandboxId::generate(),
            template: template.name.clone(),
            slot,
            access_token: params.secure.then(|| random_token(32)),
            metadata: params.metadata,
            env_vars: params.env_vars,
            started_at: now,
            end_at: now + timeout.as_secs() as i64,
            cpu_count: self.limits.cpu_count,
            memory_mb: self.limits.memory_mb,
            disk_mb: self.limits.disk_mb,
        };
        if let Err(e) = self.store.insert_sandbox(&record) {
            self.mark_slot(slot, false);
            return Err(e.into());
        }
        let spec = LaunchSpec {
            id: record.id.clone(),
            rootfs: template.rootfs.clone(),
            slot,
            cpu_count: record.cpu_count,
            memory_mb: record.memory_mb,
            disk_mb: record.disk_mb,
        };
        match self.boot(&spec, &record).await {
            Ok(()) => {
                let sandbox = Arc::new(Sandbox {
                    addrs: SlotAddrs::for_slot(slot),
                    record: Mutex::new(record.clone()),
                    killed: CancellationToken::new(),
                });
                self.live().insert(record.id, sandbox.clone());
                Ok(sandbox)
            }
            Err(e) => {
                self.discard(&record.id, slot).await;
                Err(e)
            }
        }
    }

    async fn boot(&self, spec: &LaunchSpec, record: &SandboxRecord) -> Result<(), LifecycleError> {
        self.driver
            .launch(spec)
            .await
            .map_err(LifecycleError::Driver)?;
        let addr = SlotAddrs::for_slot(spec.slot).sandbox;
        self.agent
            .wait_ready(addr, self.limits.agent_start_timeout)
            .await
            .map_err(LifecycleError::Agent)?;
        let init = InitRequest {
            env_vars: record.env_vars.clone(),
            access_token: record.access_token.clone(),
            default_user: Some("user".into()),
            default_workdir: None,
        };
        self.agent
            .init(addr, &init)
            .await
            .map_err(LifecycleError::Agent)
    }

    /// Destroys whatever a sandbox holds and forgets it; the slot is free again only after that.
    /// Failures are logged: the orphan sweep at the next start catches anything left.
    fn discard(
        &self,
        id: &SandboxId,
        slot: u32,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (driver, store, slots, id) = (
            self.driver.clone(),
            self.store.clone(),
            self.slots.clone(),
            id.clone(),
        );
        async move {
            if let Err(e) = driver.destroy(&id, slot).await {
                tracing::error!(sandbox = %id, error = %e, "destroying sandbox failed");
            }
            if let Err(e) = store.delete_sandbox(&id) {
                tracing::error!(sandbox = %id, error = %e, "forgetting sandbox failed");
            }
            mark_slot(&slots, slot, false);
        }
    }

    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>, LifecycleError> {
        SandboxId::parse(id)
            .ok()
            .and_then(|id| self.live().get(&id).cloned())
            .ok_or_else(|| LifecycleError::SandboxNotFound(id.to_owned()))
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

    /// Kills a sandbox: it is gone for every caller at once, and its open streams are cut. The
    /// host cleanup finishes in the background (`shutdown` waits for it).
    pub fn kill(&self, id: &str) -> Result<(), LifecycleError> {
        let sandbox = SandboxId::parse(id)
            .ok()
            .and_then(|id| self.live().remove(&id))
            .ok_or_else(|| LifecycleError::SandboxNotFound(id.to_owned()))?;
        sandbox.killed.cancel();
        let record = sandbox.record();
        self.destroying.spawn(self.discard(&record.id, record.slot));
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

    /// Kills every sandbox whose deadline has passed. Returns how many.
    pub fn reap_expired(&self) -> usize {
        let now = now_unix();
        let expired: Vec<SandboxId> = self
            .live()
            .values()
            .map(|s| s.record())
            .filter(|r| r.end_at <= now)
            .map(|r| r.id)
            .collect();
        for id in &expired {
            tracing::info!(sandbox = %id, "timeout reached; killing");
            let _ = self.kill(id.as_str());
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

    /// After a (re)start: adopts every recorded sandbox whose runtime and agent still answer,
    /// destroys the rest, then sweeps host resources that no record names.
    pub async fn recover(&self) -> Result<RecoveryReport, LifecycleError> {
        let mut report = RecoveryReport::default();
        for record in self.store.sandboxes()? {
            self.mark_slot(record.slot, true);
            let addr = SlotAddrs::for_slot(record.slot).sandbox;
            let alive = self.driver.is_running(&record.id).await
                && self
                    .agent
                    .wait_ready(addr, Duration::from_secs(2))
                    .await
                    .is_ok();
            if alive && record.end_at > now_unix() {
                let sandbox = Arc::new(Sandbox {
                    addrs: SlotAddrs::for_slot(record.slot),
                    record: Mutex::new(record.clone()),
                    killed: CancellationToken::new(),
                });
                self.live().insert(record.id.clone(), sandbox);
                report.adopted.push(record.id);
            } else {
                self.discard(&record.id, record.slot).await;
                report.removed.push(record.id);
            }
        }
        let keep: Vec<(SandboxId, u32)> = self
            .list()
            .iter()
            .map(|s| {
                let r = s.record();
                (r.id, r.slot)
            })
            .collect();
        self.driver
            .sweep_orphans(&keep)
            .await
            .map_err(LifecycleError::Driver)?;
        Ok(report)
    }

    /// Kills every sandbox and waits until the host holds nothing of them.
    pub async fn shutdown(&self) {
        let ids: Vec<SandboxId> = self.live().keys().cloned().collect();
        for id in ids {
            let _ = self.kill(id.as_str());
        }
        self.settle().await;
    }

    /// Waits for the background destroys started so far.
    pub async fn settle(&self) {
        self.destroying.close();
        self.destroying.wait().await;
        self.destroying.reopen();
    }
}

/// Which network slots are taken, and where the round-robin search goes on.
#[derive(Default)]
struct Slots {
    used: Vec<bool>,
    next: usize,
}

fn mark_slot(slots: &Mutex<Slots>, slot: u32, used: bool) {
    let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
    let i = slot as usize;
    if slots.used.len() <= i {
        slots.used.resize(i + 1, false);
    }
    slots.used[i] = used;
}

#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub adopted: Vec<SandboxId>,
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
        fail_launch: bool,
    }

    #[async_trait::async_trait]
    impl Driver for RecordingDriver {
        async fn launch(&self, spec: &LaunchSpec) -> Result<(), DriverError> {
            if self.fail_launch {
                return Err(DriverError::Command {
                    what: "runsc".into(),
                    detail: "boom".into(),
                });
            }
            self.running.lock().unwrap().push(spec.id.clone());
            Ok(())
        }
        async fn destroy(&self, id: &SandboxId, _slot: u32) -> Result<(), DriverError> {
            self.running.lock().unwrap().retain(|r| r != id);
            self.destroyed.lock().unwrap().push(id.clone());
            Ok(())
        }
        async fn is_running(&self, id: &SandboxId) -> bool {
            self.running.lock().unwrap().contains(id)
        }
        async fn sweep_orphans(&self, keep: &[(SandboxId, u32)]) -> Result<(), DriverError> {
            *self.swept_keep.lock().unwrap() = keep.iter().map(|(id, _)| id.clone()).collect();
            Ok(())
        }
    }

    struct ReadyAgent;

    #[async_trait::async_trait]
    impl AgentClient for ReadyAgent {
        async fn wait_ready(&self, _: Ipv4Addr, _: Duration) -> Result<(), String> {
            Ok(())
        }
        async fn init(&self, _: Ipv4Addr, _: &InitRequest) -> Result<(), String> {
            Ok(())
        }
    }

    fn setup(
        driver: Arc<RecordingDriver>,
        limits: Limits,
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
        let lc = Lifecycle::new(store.clone(), driver, Arc::new(ReadyAgent), limits);
        (dir, store, lc)
    }

    fn params() -> CreateParams {
        CreateParams {
            template: "base".into(),
            secure: true,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn create_kill_and_slot_reuse() {
        let driver = Arc::new(RecordingDriver::default());
        let (_dir, store, lc) = setup(driver.clone(), Limits::default());
        let a = lc.create(params()).await.unwrap();
        let b = lc.create(params()).await.unwrap();
        assert_eq!((a.record().slot, b.record().slot), (0, 1));
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
        assert_eq!(c.record().slot, 2, "a freed slot is not reused at once");
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
        assert_eq!(failing.destroyed.lock().unwrap().len(), 1, "and cleans up");
    }

    #[tokio::test]
    async fn expiry_and_timeouts() {
        let driver = Arc::new(RecordingDriver::default());
        let (_dir, _store, lc) = setup(driver, Limits::default());
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
}
