//! Users' template builds: a base template plus steps (E2B's builder steps), each `RUN` executed
//! in a gVisor sandbox of the template as built so far, never on the host. Each `RUN`'s writes
//! become a layer cached by everything that shaped them (see [`layers`]), so a rebuild re-runs
//! only the steps that changed and what comes after them. The finished template is its base's
//! layers plus its own, stacked into one read-only rootfs, recorded in the store like a
//! built-in; golden images and pools then take it up.
//!
//! Builds take turns ([`BuildOptions::at_once`]), so that they never take the cores the
//! running sandboxes need.

mod collect;
pub mod copy;
pub mod debian;
pub mod image;
pub mod layers;
mod pull_guard;
mod run;
pub mod uploads;

use crate::driver::{Driver, DriverError, Resources};
use crate::ids::TemplateName;
use crate::lifecycle::{AgentClient, Lifecycle};
use crate::store::{BuildStatus, LogEntry, LogLevel, Store, StoreError, TemplateRecord};
pub use collect::Collected;
use layers::Layers;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Log entries kept per build; the output past them is counted, and its tail kept for errors.
pub const MAX_LOG_ENTRIES: u64 = 20_000;

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
    /// `COPY` steps' archives, and the links they are uploaded to.
    pub uploads: uploads::Uploads,
    registries: image::Registries,
    turns: Semaphore,
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
}

/// One build to run: the store has its row (status `waiting`).
pub struct BuildJob {
    pub build_id: String,
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
            uploads: uploads::Uploads::new(templates_dir),
            registries: image::Registries::new(templates_dir, reach),
            turns: Semaphore::new(options.at_once.max(1)),
            templates_dir: templates_dir.to_owned(),
            min_free_bytes: options.min_free_bytes,
            step_timeout: options.step_timeout,
            agent_is_static: options.agent_is_static,
        })
    }

    /// After a restart: builds that were under way failed, their half-made layers go, and
    /// every built user template's rootfs is mounted again (a reboot drops the mounts).
    pub async fn recover(&self) -> Result<(), BuildError> {
        for build in self.store.unfinished_builds()? {
            self.store.set_build_status(
                &build,
                BuildStatus::Error,
                Some((
                    "the server restarted during the build; build it again",
                    None,
                )),
                now(),
            )?;
        }
        self.layers.sweep_work().await?;
        for template in self.store.templates()? {
            if template.layers.len() >= 2 {
                self.layers
                    .mount_rootfs(&template.layers, &template.rootfs)
                    .await?;
            }
        }
        // Sandboxes and snapshots of builds that are no longer a template's (a deleted
        // template's, an older build's) run on mounts that only they know.
        let rootfs = self.store.sandboxes()?.into_iter().map(|s| s.rootfs);
        for rootfs in rootfs.chain(self.store.snapshots()?.into_iter().map(|s| s.rootfs)) {
            if let Some(chain) = self.layers.chain_of(&rootfs) {
                self.layers.mount_rootfs(&chain, &rootfs).await?;
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

    /// Runs the build in the background, when its turn comes.
    pub fn start(self: &Arc<Self>, job: BuildJob) {
        let builder = self.clone();
        tokio::spawn(async move {
            let _ = builder.build(&job, None).await;
        });
    }

    /// Runs the build when its turn comes, and records how it ended. With `echo`, every line
    /// of its log is also printed, after that prefix (the server's own built-in templates).
    pub async fn build(&self, job: &BuildJob, echo: Option<&str>) -> Result<(), Failure> {
        let _turn = self.turns.acquire().await;
        let id = &job.build_id;
        let mut log = BuildLog::new(self.store.clone(), id.clone());
        log.echo = echo.map(|prefix| (prefix.to_owned(), std::time::Instant::now()));
        let result = self.run(job, &log).await;
        let outcome = match &result {
            Ok(()) => self
                .store
                .set_build_status(id, BuildStatus::Ready, None, now()),
            Err(failure) => {
                log.write(LogLevel::Error, failure.step.clone(), &failure.message);
                self.store.set_build_status(
                    id,
                    BuildStatus::Error,
                    Some((&failure.message, failure.step.as_deref())),
                    now(),
                )
            }
        };
        if let Err(e) = outcome {
            tracing::error!(build = %id, error = %e, "recording the build's end failed");
        }
        result
    }
}

/// Why a build failed, as E2B's SDK shows it: a message and the step (`base`, 1-based, or
/// `finalize`).
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub step: Option<String>,
}

/// A build's log in the store, capped at [`MAX_LOG_ENTRIES`].
pub(crate) struct BuildLog {
    store: Arc<Store>,
    build: String,
    written: std::sync::atomic::AtomicU64,
    /// Also print each line, after this prefix and the time since this instant.
    echo: Option<(String, std::time::Instant)>,
}

impl BuildLog {
    fn new(store: Arc<Store>, build: String) -> Self {
        BuildLog {
            store,
            build,
            written: 0.into(),
            echo: None,
        }
    }

    pub fn write(&self, level: LogLevel, step: Option<String>, message: &str) {
        use std::sync::atomic::Ordering;
        let n = self.written.fetch_add(1, Ordering::Relaxed);
        let message = match n.cmp(&MAX_LOG_ENTRIES) {
            std::cmp::Ordering::Less => message.to_owned(),
            std::cmp::Ordering::Equal => {
                "(the build's log is full: later output is not kept)".into()
            }
            // Errors still get in: they say why the build ended.
            std::cmp::Ordering::Greater if level == LogLevel::Error => message.to_owned(),
            std::cmp::Ordering::Greater => return,
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
        if let Err(e) = self.store.append_build_log(&self.build, &entry) {
            tracing::warn!(build = %self.build, error = %e, "writing the build log failed");
        }
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}
