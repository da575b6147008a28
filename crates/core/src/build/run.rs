//! Running one build: step by step, each `RUN` from its cached layer or in a build sandbox.

use super::layers::StepMount;
use super::stop::Stop;
use super::{BuildBase, BuildJob, BuildLog, Builder, Failure, StepKind};
use crate::driver::{LaunchSpec, RootfsWrites};
use crate::egress::Egress;
use crate::ids::SandboxId;
use crate::lifecycle::{AgentCommand, OutputLine, Program};
use crate::store::{BuildStatus, LogLevel, TemplateDefaults, TemplateRecord};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a build sandbox's agent may take to answer.
const AGENT_START: Duration = Duration::from_secs(30);
/// Output lines kept for a failed step's message.
const TAIL_LINES: usize = 15;

/// One step that makes a layer: what it runs, and the key its layer is cached under.
pub(super) struct LayerStep<'a> {
    /// Whose layer it is: a key's `RUN` and `COPY` steps make layers only that key's builds
    /// reuse (what a command wrote may hold secrets it made, and whether a layer is cached
    /// would tell one key what another built). `None`: a layer any build may share, made by
    /// the server's own tools from inputs named by their digests (an image's layers, the
    /// provisioning), or a built-in template's step.
    pub(super) owner: Option<&'a str>,
    /// The step's label in the log (`1`, `2`, … or `base`).
    pub(super) label: &'a str,
    /// The step as its failure names it.
    pub(super) shown: &'a str,
    pub(super) command: AgentCommand,
    /// Files the host hands the step, found at `/{INBOX}/{ARCHIVE}` (a `COPY`'s upload, an
    /// image layer).
    pub(super) archive: Option<PathBuf>,
    /// What, besides the layers below and the command, its result depends on.
    pub(super) inputs: &'a str,
    pub(super) force: bool,
}

/// Bump when what a step's layer keeps changes (v2: what it leaves in `/tmp`): every layer is
/// cached by this, so layers made the old way are made again.
const STEP_FORMAT: &str = "step-v2";

/// Where a build is: the layers so far (bottom first), their key, and the context the next
/// step runs in.
pub(super) struct Progress {
    pub(super) chain: Vec<PathBuf>,
    /// Where this template's own layers start in `chain`.
    pub(super) own_from: usize,
    pub(super) key: String,
    pub(super) context: TemplateDefaults,
    /// A step before was forced (or rebuilt): nothing after it comes from the cache.
    pub(super) rebuilding: bool,
}

impl Builder {
    pub(super) async fn run(
        &self,
        job: &BuildJob,
        log: &BuildLog,
        stop: &Stop,
    ) -> Result<(), Failure> {
        let started = Instant::now();
        self.store
            .templates()
            .set_build_status(&job.build_id, BuildStatus::Building, None, super::now())
            .await
            .map_err(|e| failed_at("base")(e.into()))?;
        let mut progress = match &job.definition.base {
            BuildBase::Template(base) => {
                log.write(
                    LogLevel::Info,
                    Some("base".into()),
                    &format!("FROM template {}", base.name),
                );
                let chain = chain_of(base);
                self.fetch_base(&chain, log).await?;
                Progress {
                    own_from: chain.len(),
                    chain,
                    key: hash(&["base", &base.content_hash]),
                    // The base's start command is its own: a template names its own.
                    context: TemplateDefaults {
                        start_cmd: None,
                        ready_cmd: None,
                        ..base.defaults.clone()
                    },
                    rebuilding: job.definition.force,
                }
            }
            BuildBase::Image(source) => self.image_base(job, source, log, stop).await?,
            BuildBase::Debian { suite } => self.debian_base(job, suite, log, stop).await?,
        };
        let total = job.definition.steps.len();
        for (i, step) in job.definition.steps.iter().enumerate() {
            let label = (i + 1).to_string();
            log.write(
                LogLevel::Info,
                Some(label.clone()),
                &format!("[{}/{total}] {}", i + 1, describe(&step.kind)),
            );
            if let Some(reason) = stop.reason() {
                return Err(Failure {
                    message: reason,
                    step: Some(label),
                });
            }
            let (command, archive, inputs) = match &step.kind {
                StepKind::Env(pairs) => {
                    progress.context.env.extend(pairs.iter().cloned());
                    continue;
                }
                StepKind::Workdir(dir) => {
                    progress.context.workdir = Some(dir.clone());
                    continue;
                }
                StepKind::User(user) => {
                    progress.context.user = user.clone();
                    continue;
                }
                StepKind::Run { command, user } => {
                    let run = AgentCommand {
                        program: Program::Shell(command.clone()),
                        user: user
                            .clone()
                            .unwrap_or_else(|| progress.context.user.clone()),
                        cwd: progress.context.workdir.clone(),
                        envs: progress.context.env.clone(),
                        timeout: self.step_timeout,
                        logged: false,
                        access_token: None,
                    };
                    (run, None, String::new())
                }
                StepKind::Copy(copy) => {
                    // Checked even when the layer is cached: a COPY's archive is kept per
                    // template, so a build that names files it never uploaded gets nothing.
                    let archive = self
                        .uploads
                        .archive(&job.template_id, &copy.files_hash)
                        .ok_or_else(|| Failure {
                            message: format!(
                                "step {label} ({}): its files were never uploaded; build again",
                                describe(&step.kind)
                            ),
                            step: Some(label.clone()),
                        })?;
                    // The layer is keyed by the digest of the bytes the server received,
                    // never by the hash the client claimed for them.
                    (
                        self.as_root(Program::Shell(copy.script(&progress.context))),
                        Some(archive.path),
                        archive.digest,
                    )
                }
            };
            let shown = describe(&step.kind);
            let work = LayerStep {
                owner: job.owner.as_deref(),
                label: &label,
                shown: &shown,
                command,
                archive,
                inputs: &inputs,
                force: step.force,
            };
            self.layer_step(job, &mut progress, work, log, stop).await?;
        }
        log.write(
            LogLevel::Info,
            Some("finalize".into()),
            "starting a sandbox of the template, to keep it ready as its golden image",
        );
        if let Some(start) = &job.definition.start_cmd {
            log.write(
                LogLevel::Info,
                Some("finalize".into()),
                &format!("START {start}"),
            );
        }
        if let Some(ready) = &job.definition.ready_cmd {
            log.write(
                LogLevel::Info,
                Some("finalize".into()),
                &format!("waiting for READY {ready}"),
            );
        }
        let record = self
            .finish(job, progress)
            .await
            .map_err(failed_at("finalize"))?;
        log.write(
            LogLevel::Info,
            Some("finalize".into()),
            &format!(
                "template {} built in {:.1} s ({} MB of its own layers)",
                job.name,
                started.elapsed().as_secs_f64(),
                record.size_bytes / 1_000_000
            ),
        );
        Ok(())
    }

    /// A tool of ours, run as root in `/` with no environment of the template's.
    pub(super) fn exec_as_root(&self, argv: &[&str]) -> AgentCommand {
        self.as_root(Program::Exec(argv.iter().map(|a| a.to_string()).collect()))
    }

    /// A step's tool, run as root in `/` with no environment of the template's.
    fn as_root(&self, program: Program) -> AgentCommand {
        AgentCommand {
            program,
            user: "root".into(),
            cwd: Some("/".into()),
            envs: Default::default(),
            timeout: self.step_timeout,
            logged: false,
            access_token: None,
        }
    }

    /// Takes the step's layer from the cache, or makes it, and moves the build on to it.
    pub(super) async fn layer_step(
        &self,
        job: &BuildJob,
        progress: &mut Progress,
        work: LayerStep<'_>,
        log: &BuildLog,
        stop: &Stop,
    ) -> Result<(), Failure> {
        let command = serde_json::to_string(&command_key(&work.command)).unwrap_or_default();
        let mut parts = vec![STEP_FORMAT, &progress.key, &command, work.inputs];
        let scope;
        if let Some(owner) = work.owner {
            scope = format!("owner:{owner}");
            parts.push(&scope);
        }
        let mut key = hash(&parts);
        progress.rebuilding |= work.force;
        if !progress.rebuilding {
            self.fetch_shared(&key, work.label, log).await;
        }
        if !progress.rebuilding && self.claim_cached(&job.build_id, &key) {
            log.write(LogLevel::Info, Some(work.label.into()), "CACHED");
        } else {
            if self.layers.has(&key) {
                // A forced step makes a new layer beside the cached one, which stays as it
                // is for the templates and sandboxes built on it: layers never change.
                key = hash(&[&key, "rebuilt", &job.build_id, work.label]);
            }
            let started = Instant::now();
            let made = self
                .run_step(job, &progress.chain, &work, &key, log, stop)
                .await?;
            progress.rebuilding = true;
            log.write(
                LogLevel::Info,
                Some(work.label.into()),
                &format!("done in {:.1} s", started.elapsed().as_secs_f64()),
            );
            self.account(job, &made, work.label).await?;
        }
        progress.chain.push(self.layers.layer(&key));
        progress.key = key;
        Ok(())
    }

    /// Takes layer `key` from object storage when this node lacks it (another node made it),
    /// instead of running its step again. A failed fetch runs the step.
    pub(super) async fn fetch_shared(&self, key: &str, label: &str, log: &BuildLog) {
        if self.layers.has(key) {
            return;
        }
        let started = Instant::now();
        match self.shared.fetch_layer(key).await {
            Ok(true) => log.write(
                LogLevel::Info,
                Some(label.into()),
                &format!(
                    "fetched from object storage in {:.1} s",
                    started.elapsed().as_secs_f64()
                ),
            ),
            Ok(false) => {}
            Err(e) => log.write(
                LogLevel::Warn,
                Some(label.into()),
                &format!("fetching the layer from object storage failed ({e}); running the step"),
            ),
        }
    }

    /// Makes the layers of a base template present here: it may have been built on another
    /// node, or its layers let go of here for the layer budget.
    async fn fetch_base(&self, chain: &[PathBuf], log: &BuildLog) -> Result<(), Failure> {
        for layer in chain.iter().filter(|layer| !layer.is_dir()) {
            let fail = |message: String| Failure {
                message,
                step: Some("base".into()),
            };
            // The error names the host's paths: the log gets it, the build's owner not.
            let key = self.shared.key_of(layer).map_err(|e| {
                tracing::warn!(
                    error = e,
                    "a base template's layer is not in this node's templates dir"
                );
                fail("the base template's files are not where this node keeps templates".into())
            })?;
            self.fetch_shared(&key, "base", log).await;
            if !layer.is_dir() {
                return Err(fail(format!(
                    "layer {key} of the base template is neither on this node nor in object \
                     storage; build the base template again"
                )));
            }
        }
        Ok(())
    }

    /// Puts a layer the build made on its key's account (see [`super::quota`]), and fails the
    /// build once the key's templates would take more than its share of the disk, after
    /// letting go of what the key no longer uses.
    async fn account(&self, job: &BuildJob, layer: &Path, label: &str) -> Result<(), Failure> {
        self.claim(&job.build_id, layer);
        let Some(owner) = &job.owner else {
            return Ok(());
        };
        let bytes = crate::disk_usage::bytes_on_disk(layer).unwrap_or(0);
        let fail = failed_at(label);
        self.store
            .templates()
            .record_layer(layer, owner, bytes)
            .await
            .map_err(|e| fail(e.into()))?;
        let limit = self.limits.storage_bytes_per_key;
        let used = self.make_room(owner, limit).await.map_err(&fail)?;
        if used <= limit {
            return Ok(());
        }
        Err(Failure {
            message: format!(
                "this API key's templates would take {} MiB, more than the {} MiB a key may \
                 keep (`airlock serve --key-max-template-storage-mb`): delete templates it no \
                 longer needs",
                used >> 20,
                limit >> 20
            ),
            step: Some(label.into()),
        })
    }

    /// Runs one step's command in a sandbox over the layers so far; its writes become a layer.
    async fn run_step(
        &self,
        job: &BuildJob,
        chain: &[PathBuf],
        work: &LayerStep<'_>,
        key: &str,
        log: &BuildLog,
        stop: &Stop,
    ) -> Result<PathBuf, Failure> {
        let label = work.label;
        let fail = |message: String| Failure {
            message,
            step: Some(label.to_owned()),
        };
        let mount = self
            .layers
            .mount_step(chain, &job.build_id, work.archive.as_deref())
            .await
            .map_err(|e| fail(e.to_string()))?;
        let outcome = self.run_in_sandbox(job, &mount, work, log, stop).await;
        match outcome {
            Ok(()) => self
                .layers
                .keep(mount, key)
                .await
                .map_err(|e| fail(e.to_string())),
            Err(message) => {
                if let Err(e) = self.layers.discard(mount).await {
                    tracing::warn!(build = %job.build_id, error = %e, "discarding a failed step");
                }
                // A cancel or the deadline says so plainly; the step is in the failure.
                Err(fail(stop.reason().unwrap_or(message)))
            }
        }
    }

    /// Boots a build sandbox on the step's mount, runs the command, and destroys the sandbox.
    async fn run_in_sandbox(
        &self,
        job: &BuildJob,
        mount: &StepMount,
        work: &LayerStep<'_>,
        log: &BuildLog,
        stop: &Stop,
    ) -> Result<(), String> {
        let (command, label) = (&work.command, work.label);
        let spec = LaunchSpec {
            id: SandboxId::generate(),
            rootfs: mount.merged.clone(),
            resources: job.resources,
            // A step reaches what the server's sandboxes reach by default.
            egress: Egress::default(),
            writes: RootfsWrites::Through,
            volumes: Vec::new(),
        };
        let placement = self
            .driver
            .launch(&spec)
            .await
            .map_err(|e| format!("starting the build sandbox failed: {e}"))?;
        let mut tail = VecDeque::with_capacity(TAIL_LINES);
        let mut output = |line: OutputLine| {
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line.text.clone());
            let level = if line.stderr {
                LogLevel::Warn
            } else {
                LogLevel::Info
            };
            log.write(level, Some(label.to_owned()), &line.text);
        };
        let run = async {
            self.agent.wait_ready(placement.agent, AGENT_START).await?;
            self.agent.run(placement.agent, command, &mut output).await
        };
        let result = tokio::select! {
            result = run => result.map_err(|e| e.to_string()),
            low = self.disk_runs_low() => Err(low),
            reason = stop.stopped() => Err(reason),
        };
        if let Err(e) = self.driver.destroy(&spec.id, placement.slot).await {
            tracing::warn!(build = %job.build_id, error = %e, "removing a build sandbox failed");
        }
        let tail: Vec<String> = tail.into_iter().collect();
        match result {
            Ok(0) => Ok(()),
            Ok(code) => Err(format!(
                "step {label} (`{}`) failed with exit code {code}; last output:\n{}",
                work.shown,
                tail.join("\n")
            )),
            Err(e) => Err(format!(
                "step {label} (`{}`) failed: {e}; last output:\n{}",
                work.shown,
                tail.join("\n")
            )),
        }
    }

    /// Returns (with why) once the disk that layers are written to has less than
    /// `min_free_bytes` free; checked every 250 ms while a step runs.
    async fn disk_runs_low(&self) -> String {
        loop {
            if let Some(space) = crate::disk_usage::disk_space(&self.templates_dir) {
                let free = space.available;
                if free < self.min_free_bytes {
                    return format!(
                        "the server's disk is nearly full ({} MiB free; builds leave {} MiB \
                         free, see `airlock serve --build-min-free-mb`), so the step was stopped",
                        free >> 20,
                        self.min_free_bytes >> 20
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Stacks the layers into the template's rootfs and records it as built.
    async fn finish(
        &self,
        job: &BuildJob,
        progress: Progress,
    ) -> Result<TemplateRecord, super::BuildError> {
        let own_layers = &progress.chain[progress.own_from..];
        // A template with no layers of its own is its base's rootfs under another name.
        let (rootfs, layers) = match &job.definition.base {
            BuildBase::Template(base) if own_layers.is_empty() => {
                (base.rootfs.clone(), base.layers.clone())
            }
            _ => {
                let target = self
                    .layers
                    .rootfs_mount(job.template_id.as_str(), &progress.key);
                self.layers.mount_rootfs(&progress.chain, &target).await?;
                (target, progress.chain.clone())
            }
        };
        let mut size = 0;
        for layer in own_layers {
            size += crate::disk_usage::bytes_on_disk(layer).unwrap_or(0);
        }
        let defaults = TemplateDefaults {
            start_cmd: job.definition.start_cmd.clone(),
            ready_cmd: job.definition.ready_cmd.clone(),
            ..progress.context
        };
        // What its sandboxes start with is part of what a golden image holds.
        let content_hash = hash(&[
            &progress.key,
            &serde_json::to_string(&defaults).unwrap_or_default(),
        ]);
        // Other nodes start it from object storage: there before it is recorded. From the
        // look at which layers are there until the record, object storage's collection waits
        // (see `object_collection.rs`): no layer this template stands on goes meanwhile.
        let _no_collection = match self.shared.objects.get() {
            Some(_) => Some(self.store.objects_lock().shared().await?),
            None => None,
        };
        if let Err(e) = self.shared.publish(&layers, &rootfs).await {
            if job.owner.is_some() {
                return Err(super::BuildError::Publish(format!(
                    "putting the template's layers in object storage failed, so other nodes \
                     could not start it: {e}"
                )));
            }
            // A built-in is built anywhere: a node that cannot fetch it builds it itself.
            tracing::warn!(template = %job.published_as, error = %e, "the built-in template's layers are not in object storage");
        }
        let record = TemplateRecord {
            name: job.published_as.clone(),
            content_hash,
            rootfs,
            built_at: super::now(),
            size_bytes: size,
            layers,
            defaults,
        };
        self.lifecycle
            .publish_template(&record)
            .await
            .map_err(|e| super::BuildError::Publish(e.to_string()))?;
        Ok(record)
    }
}

/// Turns a host-side error into the build's failure at `step` (`base` or `finalize`).
pub(super) fn failed_at(step: &str) -> impl Fn(super::BuildError) -> Failure + '_ {
    move |e| Failure {
        message: e.to_string(),
        step: Some(step.to_owned()),
    }
}

/// The layers a template's rootfs is made of, bottom first.
fn chain_of(template: &TemplateRecord) -> Vec<PathBuf> {
    if template.layers.is_empty() {
        vec![template.rootfs.clone()]
    } else {
        template.layers.clone()
    }
}

/// What makes a `RUN`'s result: the command and everything it runs with.
fn command_key(c: &AgentCommand) -> serde_json::Value {
    let mut key = serde_json::json!({ "user": c.user, "cwd": c.cwd, "env": c.envs });
    match &c.program {
        Program::Shell(line) => key["run"] = line.as_str().into(),
        Program::Exec(argv) => key["exec"] = argv.clone().into(),
    }
    key
}

pub(super) fn hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

fn describe(kind: &StepKind) -> String {
    match kind {
        StepKind::Run {
            command,
            user: Some(user),
        } => format!("RUN (as {user}) {command}"),
        StepKind::Run { command, .. } => format!("RUN {command}"),
        StepKind::Copy(copy) => format!("COPY {} {}", copy.src, copy.dest),
        StepKind::Env(pairs) => {
            let pairs: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("ENV {}", pairs.join(" "))
        }
        StepKind::Workdir(dir) => format!("WORKDIR {dir}"),
        StepKind::User(user) => format!("USER {user}"),
    }
}
