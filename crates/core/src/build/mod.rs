//! Users' template builds: a base template plus steps (E2B's builder steps), each `RUN` executed
//! in a gVisor sandbox of the template as built so far, never on the host. Each `RUN`'s writes
//! become a layer cached by everything that shaped them (see [`layers`]), so a rebuild re-runs
//! only the steps that changed and what comes after them. The finished template is its base's
//! layers plus its own, stacked into one read-only rootfs, recorded in the store like a
//! built-in; golden images and pools then take it up.
//!
//! Builds take turns ([`BuildOptions::at_once`]), so that they never take the cores the
//! running sandboxes need, shared fairly between keys (see [`queue`]); each has a deadline and
//! can be cancelled (see [`stop`]). What one key's builds may keep on disk is bounded (see
//! [`Builder::storage_of`]). With an object store, layers are shared between nodes (see
//! [`shared_layers`]), what a node keeps of them has a budget (see [`layer_budget`]), and
//! object storage is collected (see [`object_collection`]).

mod bases;
mod collect;
pub mod copy;
pub mod debian;
pub mod image;
pub mod layer_budget;
pub mod layers;
pub mod object_collection;
pub(crate) mod pull_guard;
pub mod queue;
mod quota;
mod run;
pub mod shared_layers;
pub mod stop;
pub mod uploads;

use crate::driver::{Driver, DriverError, Resources};
use crate::ids::TemplateName;
use crate::lifecycle::{AgentClient, Lifecycle};
use crate::ordered::OrderedQueue;
use crate::store::{BuildStatus, LogEntry, LogLevel, Store, StoreError, TemplateRecord};
pub use collect::{Collected, BUILDS_KEPT};
use layers::Layers;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stop::Stop;

/// Log entries kept per build; the output past them is counted, and its tail kept for errors.
pub const MAX_LOG_ENTRIES: u64 = 20_000;
/// Bytes of log text kept per build (lines are cut at [`MAX_LOG_LINE`]).
pub const MAX_LOG_BYTES: u64 = 4 << 20;
/// The longest log line kept; a longer one is cut, with a note.
pub const MAX_LOG_LINE: usize = 4096;
/// The longest the end of a build waits for its log's lines to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(60);

/// What to build: a base and the steps on top of it.
#[derive(Debug, Clone)]
pub struct BuildDefinition {
    pub base: BuildBase,
    pub steps: Vec<Step>,
    /// Run every step, cached or not (E2B's top-level `force`, `skip_cache`).
    pub force: bool,
    /// Started as the finished template boots, and waited for with `ready_cmd` before its
    /// golden image is taken.
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

/// What a build starts from.
#[derive(Debug, Clone)]
pub enum BuildBase {
    /// A template, as built now.
    Template(TemplateRecord),
    /// An image in an OCI registry.
    Image(image::ImageSource),
    /// Debian's minimal root filesystem for a suite (`bookworm`), made with debootstrap from
    /// the host's apt mirror: only the built-in templates' definitions start here.
    Debian { suite: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub kind: StepKind,
    /// Run it even if its layer is cached (and so every step after it).
    pub force: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum StepKind {
    /// A shell command; `user` overrides the current user for this step only.
    Run {
        command: String,
        user: Option<String>,
    },
    /// Files the SDK uploaded, put in place inside the build sandbox.
    Copy(copy::CopyStep),
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Host(String),
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Booting the finished template (its start command) failed.
    #[error("{0}")]
    Publish(String),
}

impl BuildError {
    fn io(what: String) -> impl FnOnce(std::io::Error) -> Self {
        move |source| BuildError::Io { what, source }
    }
}

/// Runs builds, a few at a time, and owns the layers on disk.
pub struct Builder {
    store: Arc<Store>,
    driver: Arc<dyn Driver>,
    agent: Arc<dyn AgentClient>,
    /// Publishes finished templates (and makes their golden images).
    lifecycle: Arc<Lifecycle>,
    layers: Layers,
    /// The layers in object storage, shared with the lifecycle (see [`shared_layers`]).
    shared: Arc<shared_layers::SharedLayers>,
    /// `COPY` steps' archives, and the links they are uploaded to.
    pub uploads: uploads::Uploads,
    registries: image::Registries,
    queue: Arc<queue::Queue>,
    /// How to stop each build that is waiting or running, by build id.
    stops: Mutex<HashMap<String, Stop>>,
    /// The layers each running build stands on (see [`quota`]).
    claims: Mutex<HashMap<String, Vec<PathBuf>>>,
    /// Held shared by every build from its place in line to its end, so that the layer
    /// budget (see [`layer_budget`]) never runs beside one.
    builds_under_way: tokio::sync::RwLock<()>,
    limits: BuildLimits,
    /// Where layers are written, and how much of its disk a step must leave free.
    templates_dir: PathBuf,
    min_free_bytes: u64,
    step_timeout: Duration,
    agent_is_static: bool,
}

/// How builds run on this host (`airlock serve`'s flags).
pub struct BuildOptions {
    /// Builds at once; more wait with status `waiting`.
    pub at_once: usize,
    /// Registries `from_image` may reach over HTTP and at private addresses.
    pub insecure_registries: Vec<String>,
    /// A step is stopped, and its build fails, when the disk its layer is written to has less
    /// than this free: a build must never fill the host's disk.
    pub min_free_bytes: u64,
    /// How long one step (a `RUN`, a `COPY`, a layer of an image) may take.
    pub step_timeout: Duration,
    /// Whether the agent binary runs in any root filesystem. A dynamically linked one (a plain
    /// `cargo build`) needs the host's loader and libc, which an image need not have.
    pub agent_is_static: bool,
    pub limits: BuildLimits,
}

/// What one build, and one key's builds, may take.
#[derive(Debug, Clone, Copy)]
pub struct BuildLimits {
    /// How long a whole build may run, from its turn to its golden image.
    pub timeout: Duration,
    /// Builds one key may have waiting or running at once.
    pub per_key: usize,
    /// The disk one key's templates may take: the layers its builds made that a template
    /// still uses, and its `COPY` uploads.
    pub storage_bytes_per_key: u64,
    /// Templates one key may have.
    pub templates_per_key: usize,
}

/// One build to run: the store has its row (status `waiting`).
pub struct BuildJob {
    pub build_id: String,
    /// The key whose build it is; `None` for the server's own built-in templates. A key's
    /// `RUN` and `COPY` layers are its own (see `run.rs`), and its builds take its turns.
    pub owner: Option<String>,
    /// The template it builds: what its layers' mounts and COPY uploads are filed under.
    pub template_id: TemplateName,
    /// What the finished build is recorded as in the store's templates: a built-in's name, or
    /// the build's own id (a user template's tags then name it).
    pub published_as: TemplateName,
    /// What its owner calls it (the alias), for the log.
    pub name: String,
    pub definition: BuildDefinition,
    pub resources: Resources,
}

impl Builder {
    pub fn new(
        store: Arc<Store>,
        driver: Arc<dyn Driver>,
        agent: Arc<dyn AgentClient>,
        lifecycle: Arc<Lifecycle>,
        templates_dir: &std::path::Path,
        options: BuildOptions,
    ) -> Arc<Self> {
        let reach = pull_guard::Reach {
            insecure: options.insecure_registries,
            unreachable: driver.unreachable(),
        };
        Arc::new(Builder {
            store,
            driver,
            agent,
            lifecycle,
            layers: Layers::new(templates_dir),
            shared: Arc::new(shared_layers::SharedLayers::new(templates_dir)),
            uploads: uploads::Uploads::new(templates_dir, options.min_free_bytes),
            registries: image::Registries::new(templates_dir, reach),
            queue: queue::Queue::new(options.at_once, options.limits.per_key),
            stops: Mutex::default(),
            claims: Mutex::default(),
            builds_under_way: tokio::sync::RwLock::new(()),
            limits: options.limits,
            templates_dir: templates_dir.to_owned(),
            min_free_bytes: options.min_free_bytes,
            step_timeout: options.step_timeout,
            agent_is_static: options.agent_is_static,
        })
    }

    /// Shares templates' layers through `objects` from now on (set once, at boot).
    pub fn use_object_store(&self, objects: crate::objects::ImageObjects) -> bool {
        self.shared.use_object_store(objects)
    }

    /// What makes a template's rootfs present on this node, for the lifecycle.
    pub fn shared_layers(&self) -> Arc<shared_layers::SharedLayers> {
        self.shared.clone()
    }

    /// After a restart: builds that were under way failed, their half-made layers go, and
    /// every built user template's rootfs is mounted again (a reboot drops the mounts).
    pub async fn recover(&self) -> Result<(), BuildError> {
        for build in self.store.templates().unfinished_builds().await? {
            self.store
                .templates()
                .set_build_status(
                    &build,
                    BuildStatus::Error,
                    Some((
                        "the server restarted during the build; build it again",
                        None,
                    )),
                    now(),
                )
                .await?;
        }
        self.layers.sweep_work().await?;
        // What this node lacks (a template built on another node) is fetched and mounted at
        // its first use instead (see `shared_layers`).
        let here = |chain: &[PathBuf]| chain.iter().all(|layer| layer.is_dir());
        for template in self.store.templates().all().await? {
            if template.layers.len() >= 2 && here(&template.layers) {
                self.layers
                    .mount_rootfs(&template.layers, &template.rootfs)
                    .await?;
            }
        }
        // Sandboxes and snapshots of builds that are no longer a template's (a deleted
        // template's, an older build's) run on mounts that only they know.
        let rootfs = self
            .store
            .sandboxes()
            .all()
            .await?
            .into_iter()
            .map(|s| s.rootfs);
        let snapshots = self.store.snapshots().all().await?;
        for rootfs in rootfs.chain(snapshots.into_iter().map(|s| s.rootfs)) {
            match self.layers.chain_of(&rootfs) {
                Some(chain) if here(&chain) => self.layers.mount_rootfs(&chain, &rootfs).await?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Unmounts every user template's rootfs (at a clean shutdown, once no sandbox runs).
    pub async fn unmount_templates(&self) {
        if let Err(e) = self.layers.unmount_all().await {
            tracing::warn!(error = %e, "unmounting templates failed");
        }
    }

    /// Puts the build in its key's line and runs it in the background when its turn comes;
    /// refused when the key has its most builds waiting or running already.
    pub fn start(self: &Arc<Self>, job: BuildJob) -> Result<(), queue::TooManyBuilds> {
        let place = self.queue.join(owner_of(&job), &job.build_id)?;
        let stop = self.watch(&job.build_id);
        let builder = self.clone();
        tokio::spawn(async move {
            let _ = builder.build_in_line(&job, place, stop, None).await;
        });
        Ok(())
    }

    /// Runs the build when its turn comes, and records how it ended. With `echo`, every line
    /// of its log is also printed, after that prefix (the server's own built-in templates).
    pub async fn build(&self, job: &BuildJob, echo: Option<&str>) -> Result<(), Failure> {
        let place = self
            .queue
            .join(owner_of(job), &job.build_id)
            .map_err(|e| Failure {
                message: e.to_string(),
                step: Some("base".into()),
            })?;
        let stop = self.watch(&job.build_id);
        self.build_in_line(job, place, stop, echo).await
    }

    /// Stops build `build` if it is waiting or running: `false` if it is neither.
    pub fn cancel(&self, build: &str) -> bool {
        let stops = self.stops.lock().unwrap_or_else(|e| e.into_inner());
        stops.get(build).map(Stop::cancel).is_some()
    }

    /// Builds of `key` waiting or running.
    pub fn builds_of(&self, key: &str) -> usize {
        self.queue.of_key(key)
    }

    pub fn limits(&self) -> BuildLimits {
        self.limits
    }

    fn watch(&self, build: &str) -> Stop {
        let stop = Stop::new(self.limits.timeout);
        let mut stops = self.stops.lock().unwrap_or_else(|e| e.into_inner());
        stops.insert(build.to_owned(), stop.clone());
        stop
    }

    async fn build_in_line(
        &self,
        job: &BuildJob,
        place: queue::Place,
        mut stop: Stop,
        echo: Option<&str>,
    ) -> Result<(), Failure> {
        let _under_way = self.builds_under_way.read().await;
        let id = &job.build_id;
        let mut log = BuildLog::new(self.store.clone(), id.clone());
        log.echo = echo.map(|prefix| (prefix.to_owned(), std::time::Instant::now()));
        let waiting = stop.clone();
        let result = tokio::select! {
            turn = place.turn() => {
                stop.started();
                let result = self.run(job, &log, &stop).await;
                drop(turn);
                result
            }
            () = waiting.cancelled() => Err(Failure {
                message: stop::CANCELLED.into(),
                step: None,
            }),
        };
        self.stops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        self.release_claims(id);
        if let Some(owner) = &job.owner {
            // What a failed build made is unused now: it goes first if the key is over.
            if let Err(e) = self
                .make_room(owner, self.limits.storage_bytes_per_key)
                .await
            {
                tracing::warn!(build = %id, error = %e, "freeing a key's unused layers failed");
            }
        }
        if let Err(failure) = &result {
            log.write(LogLevel::Error, failure.step.clone(), &failure.message);
        }
        log.flushed().await;
        let (status, failure) = match &result {
            Ok(()) => (BuildStatus::Ready, None),
            Err(failure) => (
                BuildStatus::Error,
                Some((failure.message.as_str(), failure.step.as_deref())),
            ),
        };
        let templates = self.store.templates();
        let outcome = templates.set_build_status(id, status, failure, now()).await;
        if let Err(e) = outcome {
            tracing::error!(build = %id, error = %e, "recording the build's end failed");
        }
        result
    }
}

/// Whose turns a build takes: its key's, or the server's own for a built-in.
fn owner_of(job: &BuildJob) -> &str {
    job.owner.as_deref().unwrap_or("")
}

/// Why a build failed, as E2B's SDK shows it: a message and the step (`base`, 1-based, or
/// `finalize`).
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub step: Option<String>,
}

/// A build's log in the store, capped at [`MAX_LOG_ENTRIES`] lines and [`MAX_LOG_BYTES`].
/// Steps write to it from anywhere, without waiting: one task appends the lines in order, and
/// [`BuildLog::flushed`] waits for it before the build's end is recorded.
pub(crate) struct BuildLog {
    lines: OrderedQueue<LogEntry>,
    written: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
    /// The log is full, and says so.
    full: std::sync::atomic::AtomicBool,
    /// Also print each line, after this prefix and the time since this instant.
    echo: Option<(String, std::time::Instant)>,
}

impl BuildLog {
    fn new(store: Arc<Store>, build: String) -> Self {
        let lines = OrderedQueue::default();
        if let Some(mut appender) = lines.writer() {
            tokio::spawn(async move {
                while let Some(entry) = appender.next().await {
                    let append = store.templates().append_build_log(&build, &entry);
                    if let Err(e) = append.await {
                        tracing::warn!(build = %build, error = %e, "writing the build log failed");
                    }
                    appender.written();
                }
            });
        }
        BuildLog {
            lines,
            written: 0.into(),
            bytes: 0.into(),
            full: false.into(),
            echo: None,
        }
    }

    /// Waits until every line written is in the store.
    async fn flushed(self) {
        self.lines.flush(FLUSH_WAIT).await
    }

    pub fn write(&self, level: LogLevel, step: Option<String>, message: &str) {
        use std::sync::atomic::Ordering;
        let message = cut_line(message);
        let n = self.written.fetch_add(1, Ordering::Relaxed);
        let bytes = self
            .bytes
            .fetch_add(message.len() as u64, Ordering::Relaxed);
        let full = n >= MAX_LOG_ENTRIES || bytes >= MAX_LOG_BYTES;
        let message = match (full, level) {
            (false, _) => message,
            // Errors still get in: they say why the build ended.
            (true, LogLevel::Error) => message,
            (true, _) if self.note_full() => {
                "(the build's log is full: later output is not kept)".into()
            }
            (true, _) => return,
        };
        if let Some((prefix, since)) = &self.echo {
            let step = step.as_deref().unwrap_or("");
            let elapsed = since.elapsed().as_secs_f64();
            println!("{prefix} {elapsed:>7.1}s {step:>8} | {message}");
        }
        let entry = LogEntry {
            at_ms: chrono::Utc::now().timestamp_millis(),
            level,
            step,
            message,
        };
        self.lines.push(entry);
    }

    /// Whether this is the first line past a cap: that one says the log is full.
    fn note_full(&self) -> bool {
        !self.full.swap(true, std::sync::atomic::Ordering::Relaxed)
    }
}

/// A line no longer than [`MAX_LOG_LINE`] bytes, cut at a character boundary with a note.
fn cut_line(message: &str) -> String {
    if message.len() <= MAX_LOG_LINE {
        return message.to_owned();
    }
    let mut end = MAX_LOG_LINE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} … ({} bytes cut)", &message[..end], message.len() - end)
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}
