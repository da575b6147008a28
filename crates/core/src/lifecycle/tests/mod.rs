//! Lifecycle logic against a recording driver; real runsc is covered by the integration suite.

use super::*;
use crate::driver::{LaunchSpec, Placement};
use crate::store::{PauseMode, SandboxState, TemplateRecord};
use crate::volumes::VolumeLimits;
use airlock_wire::logs::LogLevel;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

mod admission;
mod events;
mod freezer;
mod launches;
mod parking;
mod pool_plan;
mod remote_images;
mod shutdown;
mod volume_caps;
mod volume_moves;

/// What every image of the recording driver takes on disk.
const IMAGE_SIZE: u64 = 3 << 20;

#[derive(Default)]
struct RecordingDriver {
    running: Mutex<Vec<SandboxId>>,
    destroyed: Mutex<Vec<SandboxId>>,
    swept_keep: Mutex<Vec<SandboxId>>,
    images: Mutex<HashSet<String>>,
    frozen: Mutex<HashSet<SandboxId>>,
    /// The policy in force per slot, as launches, restores and `set_egress` left it.
    egress: Mutex<HashMap<u32, Egress>>,
    /// Slots are handed out in order and never reused.
    next_slot: std::sync::atomic::AtomicU32,
    fail_launch: bool,
    fail_checkpoint: bool,
    /// How long launches and checkpoints take.
    delay: Duration,
    /// What `memory_used` says of every sandbox (0: unknown).
    memory_each: u64,
    /// How far, up or down at random, each `memory_used` answer strays from `memory_each`, as
    /// a cgroup's charge does.
    memory_jitter: u64,
    /// Whether any sandbox was frozen at the last `set_egress`.
    egress_set_while_frozen: std::sync::atomic::AtomicBool,
    /// Whether a shutdown gave the host back what the driver changed.
    host_given_back: std::sync::atomic::AtomicBool,
}

impl RecordingDriver {
    fn is_frozen(&self, id: &SandboxId) -> bool {
        self.frozen.lock().unwrap().contains(id)
    }

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
        tokio::time::sleep(self.delay).await;
        if self.fail_launch {
            return Err(DriverError::Command {
                what: "runsc".into(),
                detail: "boom".into(),
            });
        }
        Ok(self.place(spec))
    }
    async fn set_egress(&self, slot: u32, egress: &Egress) -> Result<(), DriverError> {
        let frozen = !self.frozen.lock().unwrap().is_empty();
        self.egress_set_while_frozen
            .store(frozen, std::sync::atomic::Ordering::SeqCst);
        self.egress.lock().unwrap().insert(slot, egress.clone());
        Ok(())
    }
    async fn destroy(&self, id: &SandboxId, _slot: u32) -> Result<(), DriverError> {
        // As the real driver's: a destroy thaws it, and its id may come back thawed.
        self.frozen.lock().unwrap().remove(id);
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
        tokio::time::sleep(self.delay).await;
        if self.fail_checkpoint {
            return Err(DriverError::NoSpace("disk full".into()));
        }
        assert!(self.running.lock().unwrap().contains(id));
        assert!(!self.is_frozen(id), "a verb wakes the sandbox it works on");
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
    fn image_path(&self, image: &str) -> Result<std::path::PathBuf, DriverError> {
        Ok(std::path::Path::new("/nonexistent").join(image))
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
    fn set_frozen(&self, id: &SandboxId, frozen: bool) -> Result<(), DriverError> {
        let mut set = self.frozen.lock().unwrap();
        match frozen {
            true => set.insert(id.clone()),
            false => set.remove(id),
        };
        Ok(())
    }
    fn memory_used(&self, _id: &SandboxId) -> Option<u64> {
        let jitter = self.memory_jitter * u64::from(rand::random::<bool>()) * 2;
        (self.memory_each > 0).then(|| self.memory_each + jitter - self.memory_jitter)
    }
    fn usage(&self, _id: &SandboxId) -> Option<crate::driver::Usage> {
        None
    }
    fn unreachable(&self) -> Vec<crate::egress::Ipv4Net> {
        crate::egress::platform_deny().collect()
    }
    fn images(&self) -> Result<Vec<String>, DriverError> {
        Ok(self.images.lock().unwrap().iter().cloned().collect())
    }
    fn rootfs_in_use(&self) -> Vec<std::path::PathBuf> {
        Vec::new() // the lifecycle never asks; the layer budget has tests of its own
    }
    async fn create_volume(&self, _: &std::path::Path, _: u64) -> Result<(), DriverError> {
        Ok(())
    }
    async fn open_volume(&self, _: &std::path::Path) -> Result<(), DriverError> {
        Ok(())
    }
    async fn close_volume(&self, _: &std::path::Path) -> Result<(), DriverError> {
        Ok(())
    }
    async fn seal_volume(&self, dir: &std::path::Path) -> Result<std::path::PathBuf, DriverError> {
        Ok(dir.to_owned()) // a plain directory: its files are the volume
    }
    async fn delete_volume(&self, dir: &std::path::Path) -> Result<(), DriverError> {
        std::fs::remove_dir_all(dir).map_err(DriverError::io("removing a volume"))
    }
    fn image_size(&self, image: &str) -> u64 {
        if self.has_image(image) {
            IMAGE_SIZE
        } else {
            0
        }
    }
    async fn shutdown(&self) {
        self.host_given_back
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// An agent that answers at once, except (with `first_copy_dead`) in the first sandbox it is
/// asked about, which never answers.
#[derive(Default)]
struct TestAgent {
    first_copy_dead: std::sync::atomic::AtomicBool,
    reboots: std::sync::atomic::AtomicUsize,
    /// What it says keeps its sandboxes awake.
    busy: Mutex<Option<String>>,
}

impl TestAgent {
    fn ready() -> Arc<Self> {
        Arc::default()
    }

    fn first_copy_dead() -> Arc<Self> {
        Arc::new(TestAgent {
            first_copy_dead: true.into(),
            ..Default::default()
        })
    }

    fn reboots(&self) -> usize {
        self.reboots.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl AgentClient for TestAgent {
    async fn wait_ready(&self, _: Ipv4Addr, _: Duration) -> Result<(), String> {
        match self
            .first_copy_dead
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            true => Err("no answer in time".into()),
            false => Ok(()),
        }
    }
    async fn init(&self, _: Ipv4Addr, _: Option<&str>, _: &InitRequest) -> Result<(), InitError> {
        Ok(())
    }
    async fn warm_up(&self, _: Ipv4Addr) -> Result<(), String> {
        Ok(())
    }
    async fn run(
        &self,
        _: Ipv4Addr,
        _: &AgentCommand,
        _: &mut (dyn FnMut(OutputLine) + Send),
    ) -> Result<i32, String> {
        Ok(0)
    }
    async fn reboot(&self, _: Ipv4Addr, _: Option<&str>) -> Result<(), String> {
        self.reboots
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    async fn busy(&self, _: Ipv4Addr, _: Option<&str>) -> Result<Option<String>, String> {
        Ok(self.busy.lock().unwrap().clone())
    }
    async fn logs(&self, _: Ipv4Addr, _: Option<&str>) -> Result<Vec<LogEntry>, String> {
        Ok(vec![LogEntry {
            at_ms: 1,
            level: LogLevel::Info,
            message: "agent started".into(),
            fields: Default::default(),
        }])
    }
}

async fn setup(
    driver: Arc<RecordingDriver>,
    limits: Limits,
) -> (tempfile::TempDir, Arc<Store>, Arc<Lifecycle>) {
    setup_with_agent(driver, limits, TestAgent::ready()).await
}

/// The node the tests' lifecycles are.
const NODE: &str = "test-node";

async fn setup_with_agent(
    driver: Arc<RecordingDriver>,
    limits: Limits,
    agent: Arc<dyn AgentClient>,
) -> (tempfile::TempDir, Arc<Store>, Arc<Lifecycle>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
    store
        .templates()
        .put(&TemplateRecord::bare(
            "base",
            "h",
            dir.path().join("rootfs"),
        ))
        .await
        .unwrap();
    let volumes = test_volumes(&store, driver.clone(), dir.path());
    let lc = Lifecycle::new(NODE.into(), store.clone(), driver, agent, limits, volumes);
    (dir, store, lc)
}

#[tokio::test]
async fn a_golden_image_whose_copy_never_answers_is_dropped_and_the_create_boots() {
    let driver = Arc::new(RecordingDriver::default());
    let golden = "golden-base-h-test";
    driver.images.lock().unwrap().insert(golden.into());
    let agent = TestAgent::first_copy_dead();
    let (_dir, _store, lc) = setup_with_agent(driver.clone(), Limits::default(), agent).await;
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
        [sbx.id().clone()],
        "the create booted"
    );
}

fn test_volumes(
    store: &Arc<Store>,
    driver: Arc<RecordingDriver>,
    data: &std::path::Path,
) -> Arc<Volumes> {
    let limits = VolumeLimits {
        size_mb: 16,
        per_key: 4,
        per_key_mb: 64,
    };
    Arc::new(Volumes::new(NODE, store.clone(), driver, &data.join("volumes"), limits).unwrap())
}

/// A new server process on the same store and host (and data dir).
fn restarted(
    data: &tempfile::TempDir,
    store: &Arc<Store>,
    driver: &Arc<RecordingDriver>,
) -> Arc<Lifecycle> {
    Lifecycle::new(
        NODE.into(),
        store.clone(),
        driver.clone(),
        TestAgent::ready(),
        Limits::default(),
        test_volumes(store, driver.clone(), data.path()),
    )
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
    let (_dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let a = lc.create(params()).await.unwrap();
    let b = lc.create(params()).await.unwrap();
    assert_eq!((a.record().slot, b.record().slot), (Some(0), Some(1)));
    assert!(a.access_token().is_some());
    assert_eq!(store.sandboxes().all().await.unwrap().len(), 2);

    lc.kill(a.id().as_str()).await.unwrap();
    assert!(matches!(
        lc.kill(a.id().as_str()).await,
        Err(LifecycleError::SandboxNotFound(_))
    ));
    lc.settle().await;
    assert_eq!(store.sandboxes().all().await.unwrap().len(), 1);
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
    let (_dir, _store, lc) = setup(driver, limits).await;
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
    let (_dir2, store2, lc2) = setup(failing.clone(), Limits::default()).await;
    assert!(matches!(
        lc2.create(params()).await,
        Err(LifecycleError::Driver(_))
    ));
    assert!(
        store2.sandboxes().all().await.unwrap().is_empty(),
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
    let (_dir, _store, lc) = setup(driver, Limits::default()).await;
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
    lc.settle().await;
    assert!(lc.record(short.id().as_str()).is_err());
    assert!(lc.record(long.id().as_str()).is_ok());
    let too_long = Duration::from_secs(lc.limits().max_timeout.as_secs() + 1);
    assert!(matches!(
        lc.set_timeout(long.id().as_str(), too_long).await,
        Err(LifecycleError::TimeoutTooLong { .. })
    ));

    // A refresh lengthens a life, never shortens it, and gives at least 15 s.
    let id = long.id().as_str();
    let end_at = || lc.record(id).unwrap().end_at;
    lc.set_timeout(id, Duration::from_secs(5)).await.unwrap();
    lc.refresh(id, None).await.unwrap();
    let floor = end_at() - now_unix();
    assert!((14..=15).contains(&floor), "{floor}");
    lc.refresh(id, Some(Duration::from_secs(600)))
        .await
        .unwrap();
    let extended = end_at();
    lc.refresh(id, Some(Duration::from_secs(60))).await.unwrap();
    assert_eq!(end_at(), extended, "a shorter refresh leaves the deadline");
    assert!(matches!(
        lc.refresh(id, Some(too_long)).await,
        Err(LifecycleError::TimeoutTooLong { .. })
    ));
}

#[tokio::test]
async fn recover_adopts_the_living_and_removes_the_dead() {
    let driver = Arc::new(RecordingDriver::default());
    let (dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let alive = lc.create(params()).await.unwrap().id().clone();
    let dead = lc.create(params()).await.unwrap().id().clone();
    driver.running.lock().unwrap().retain(|id| *id != dead);

    let lc2 = restarted(&dir, &store, &driver);
    let report = lc2.recover().await.unwrap();
    assert_eq!(report.adopted, vec![alive.clone()]);
    assert_eq!(report.removed, vec![dead]);
    assert_eq!(*driver.swept_keep.lock().unwrap(), vec![alive.clone()]);
    assert_eq!(store.sandboxes().all().await.unwrap().len(), 1);
    let next = lc2.create(params()).await.unwrap();
    assert_ne!(next.record().slot, lc2.record(alive.as_str()).unwrap().slot);
}

#[tokio::test]
async fn policies_and_resources_follow_the_sandbox() {
    let driver = Arc::new(RecordingDriver::default());
    // Paused runtimes let go at once: resumes restore (parking.rs has the thawing kind).
    let limits = Limits {
        paused_memory_mb: 0,
        ..Limits::default()
    };
    let (_dir, store, lc) = setup(driver.clone(), limits).await;
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
    let record = store.sandboxes().get(a.id()).await.unwrap().unwrap();
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
    lc.pause(a.id().as_str(), PauseMode::Full, false)
        .await
        .unwrap();
    lc.create(params()).await.unwrap();
    let resumed = lc
        .resume(a.id().as_str(), None, PauseMode::Full)
        .await
        .unwrap();
    let new_slot = resumed.record().slot.unwrap();
    assert_ne!(new_slot, slot);
    assert_eq!(driver.egress.lock().unwrap()[&new_slot], egress);

    // Rules replaced while it runs take effect at once; while it is paused, at its resume.
    let id = resumed.id();
    lc.set_network(id.as_str(), Egress::default(), None)
        .await
        .unwrap();
    assert!(driver.egress.lock().unwrap()[&new_slot].is_open());
    lc.pause(id.as_str(), PauseMode::Full, false).await.unwrap();
    lc.set_network(id.as_str(), egress.clone(), None)
        .await
        .unwrap();
    let again = lc.resume(id.as_str(), None, PauseMode::Full).await.unwrap();
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
    let (_dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let a = lc.create(params()).await.unwrap();
    let id = a.id().to_string();
    lc.pause(&id, PauseMode::Full, false).await.unwrap();
    assert!(
        lc.running(&id).await.is_err(),
        "a paused sandbox takes no traffic"
    );
    assert_eq!(lc.record(&id).unwrap().state, SandboxState::Paused);
    assert_eq!(store.sandboxes().all().await.unwrap()[0].slot, None);
    assert!(matches!(
        lc.pause(&id, PauseMode::Full, false).await,
        Err(LifecycleError::AlreadyPaused(_))
    ));
    assert!(matches!(
        lc.set_timeout(&id, Duration::from_secs(5)).await,
        Err(LifecycleError::SandboxNotFound(_))
    ));

    let (resumed, was_paused) = lc.connect(&id, None, PauseMode::Full).await.unwrap();
    assert!(was_paused);
    assert_eq!(resumed.record().state, SandboxState::Running);
    assert!(
        !driver.has_image(&paused_image(resumed.id())),
        "the spent image is gone"
    );
    assert!(matches!(
        lc.resume(&id, None, PauseMode::Full).await,
        Err(LifecycleError::AlreadyRunning(_))
    ));
    assert!(matches!(
        lc.pause("nosuchsandbox", PauseMode::Full, false).await,
        Err(LifecycleError::SandboxNotFound(_))
    ));

    lc.pause(&id, PauseMode::Full, false).await.unwrap();
    lc.kill(&id).await.unwrap();
    lc.settle().await;
    assert!(store.sandboxes().all().await.unwrap().is_empty());
    assert!(driver.images.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_checkpoint_keeps_the_sandbox_running() {
    let driver = Arc::new(RecordingDriver {
        fail_checkpoint: true,
        ..Default::default()
    });
    let (_dir, _store, lc) = setup(driver, Limits::default()).await;
    let id = lc.create(params()).await.unwrap().id().to_string();
    assert!(matches!(
        lc.pause(&id, PauseMode::Full, false).await,
        Err(LifecycleError::NoSpace(_))
    ));
    let back = lc.running(&id).await.unwrap();
    assert_eq!(back.record().state, SandboxState::Running);
}

#[tokio::test]
async fn snapshots_start_new_sandboxes_and_paused_ones_survive_recovery() {
    let driver = Arc::new(RecordingDriver::default());
    let (dir, store, lc) = setup(driver.clone(), Limits::default()).await;
    let source = lc.create(params()).await.unwrap();
    let snap = lc
        .snapshot(source.id().as_str(), Some("ready"))
        .await
        .unwrap();
    assert!(
        lc.running(source.id().as_str()).await.is_ok(),
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
    assert!(lc.snapshots("k2").await.unwrap().is_empty());
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
    assert_eq!(lc.snapshots("k1").await.unwrap(), vec![snap.clone()]);
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
        lc.snapshots("k1").await.unwrap(),
        vec![snap.clone()],
        "the fork's snapshot is gone"
    );
    assert!(lc.delete_snapshot("k1", "ready").await.unwrap());
    assert!(!lc.delete_snapshot("k1", "ready").await.unwrap());
    assert!(driver.has_image(&their_snap.image), "k2's is untouched");

    lc.pause(copy.id().as_str(), PauseMode::Full, false)
        .await
        .unwrap();
    for leftover in ["paused-gone", "snapshot-gone", "golden-base-x-y"] {
        driver.images.lock().unwrap().insert(leftover.into());
    }
    let lc2 = restarted(&dir, &store, &driver);
    let report = lc2.recover().await.unwrap();
    assert_eq!(report.paused, vec![copy.id().clone()]);
    let images = driver.images().unwrap();
    assert!(images.contains(&paused_image(copy.id())));
    assert!(
        images.contains(&"golden-base-x-y".to_string()),
        "goldens are the pool's business"
    );
    assert!(
        !images.iter().any(|i| i.ends_with("-gone")),
        "unnamed images are swept"
    );
    lc2.resume(copy.id().as_str(), None, PauseMode::Full)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_filesystem_pause_ends_the_processes_and_its_resume_starts_afresh() {
    let driver = Arc::new(RecordingDriver::default());
    let agent = TestAgent::ready();
    let (_dir, store, lc) = setup_with_agent(driver, Limits::default(), agent.clone()).await;
    let id = lc.create(params()).await.unwrap().id().to_string();

    // The processes end before the checkpoint, and the record says what was saved.
    lc.pause(&id, PauseMode::Filesystem, false).await.unwrap();
    assert_eq!(agent.reboots(), 1);
    let stored = || async { store.sandboxes().all().await.unwrap()[0].pause_mode };
    assert_eq!(stored().await, Some(PauseMode::Filesystem));
    assert_eq!(
        lc.record(&id).unwrap().pause_mode,
        Some(PauseMode::Filesystem)
    );
    // Its resume has nothing left to end, whatever it asks.
    lc.resume(&id, None, PauseMode::Full).await.unwrap();
    assert_eq!(agent.reboots(), 1);
    assert_eq!(stored().await, None);
    assert_eq!(lc.record(&id).unwrap().pause_mode, None);

    // A full pause resumed with a reboot ends the restored processes.
    lc.pause(&id, PauseMode::Full, false).await.unwrap();
    assert_eq!(
        (agent.reboots(), stored().await),
        (1, Some(PauseMode::Full))
    );
    lc.connect(&id, None, PauseMode::Filesystem).await.unwrap();
    assert_eq!(agent.reboots(), 2);
}
