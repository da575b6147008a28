//! Running one build: step by step, each `RUN` from its cached layer or in a build sandbox.

use super::copy::CopyStep;
use super::layers::StepMount;
use super::{BuildJob, BuildLog, Builder, Failure, StepKind, STEP_TIMEOUT};
use crate::driver::{LaunchSpec, RootfsWrites};
use crate::egress::Egress;
use crate::ids::SandboxId;
use crate::lifecycle::{AgentCommand, OutputLine};
use crate::store::{BuildStatus, LogLevel, TemplateDefaults, TemplateRecord};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a build sandbox's agent may take to answer.
const AGENT_START: Duration = Duration::from_secs(30);
/// Output lines kept for a failed step's message.
const TAIL_LINES: usize = 15;

/// What one step that is not cached runs, and the layer it makes.
struct StepWork<'a> {
    /// The step as its failure names it.
    shown: &'a str,
    command: &'a AgentCommand,
    /// A `COPY`'s upload, put where the command finds it.
    archive: Option<&'a std::path::Path>,
    key: &'a str,
    label: &'a str,
}

/// Where a build is: the layers so far (bottom first), their key, and the context the next
/// step runs in.
struct Progress {
    chain: Vec<PathBuf>,
    key: String,
    context: TemplateDefaults,
    /// A step before was forced (or rebuilt): nothing after it comes from the cache.
    rebuilding: bool,
}

impl Builder {
    pub(super) async fn run(&self, job: &BuildJob, log: &BuildLog) -> Result<(), Failure> {
        let started = Instant::now();
        self.store
            .set_build_status(&job.build_id, BuildStatus::Building, None, super::now())
            .map_err(|e| failed_at("base")(e.into()))?;
        let base = &job.definition.base;
        log.write(
            LogLevel::Info,
            Some("base".into()),
            &format!("FROM template {}", base.name),
        );
        let mut progress = Progress {
            chain: chain_of(base),
            key: hash(&["base", &base.content_hash]),
            // The base's start command is its own: a template names its own.
            context: TemplateDefaults {
                start_cmd: None,
                ready_cmd: None,
                ..base.defaults.clone()
            },
            rebuilding: job.definition.force,
        };
        let total = job.definition.steps.len();
        for (i, step) in job.definition.steps.iter().enumerate() {
            let label = (i + 1).to_string();
            log.write(
                LogLevel::Info,
                Some(label.clone()),
                &format!("[{}/{total}] {}", i + 1, describe(&step.kind)),
            );
            let command = match &step.kind {
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
                StepKind::Run { command, user } => AgentCommand {
                    shell: command.clone(),
                    user: user
                        .clone()
                        .unwrap_or_else(|| progress.context.user.clone()),
                    cwd: progress.context.workdir.clone(),
                    envs: progress.context.env.clone(),
                    timeout: STEP_TIMEOUT,
                },
                StepKind::Copy(copy) => AgentCommand {
                    shell: copy.script(&progress.context),
                    user: "root".into(),
                    cwd: Some("/".into()),
                    envs: Default::default(),
                    timeout: STEP_TIMEOUT,
                },
            };
            let files = match &step.kind {
                StepKind::Copy(copy) => Some(copy),
                _ => None,
            };
            let key = hash(&[
                &progress.key,
                &serde_json::to_string(&command_key(&command)).unwrap_or_default(),
                files.map_or("", |c| c.files_hash.as_str()),
            ]);
            progress.rebuilding |= step.force;
            if !progress.rebuilding && self.layers.has(&key) {
                log.write(LogLevel::Info, Some(label.clone()), "CACHED");
            } else {
                let step_started = Instant::now();
                let archive = match files {
                    Some(copy) => Some(self.uploaded(job, copy, &label)?),
                    None => None,
                };
                let work = StepWork {
                    shown: &describe(&step.kind),
                    command: &command,
                    archive: archive.as_deref(),
                    key: &key,
                    label: &label,
                };
                self.run_step(job, &progress.chain, work, log).await?;
                progress.rebuilding = true;
                log.write(
                    LogLevel::Info,
                    Some(label.clone()),
                    &format!("done in {:.1} s", step_started.elapsed().as_secs_f64()),
                );
            }
            progress.chain.push(self.layers.layer(&key));
            progress.key = key;
        }
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
                job.template_id,
                started.elapsed().as_secs_f64(),
                record.size_bytes / 1_000_000
            ),
        );
        Ok(())
    }

    /// The archive a `COPY` step's files were uploaded in.
    fn uploaded(&self, job: &BuildJob, copy: &CopyStep, label: &str) -> Result<PathBuf, Failure> {
        let archive = self.uploads.archive(&job.template_id, &copy.files_hash);
        if archive.is_file() {
            return Ok(archive);
        }
        Err(Failure {
            message: format!(
                "step {label} (COPY {} {}): its files were never uploaded; build again",
                copy.src, copy.dest
            ),
            step: Some(label.to_owned()),
        })
    }

    /// Runs one step's command in a sandbox over the layers so far; its writes become a layer.
    async fn run_step(
        &self,
        job: &BuildJob,
        chain: &[PathBuf],
        work: StepWork<'_>,
        log: &BuildLog,
    ) -> Result<(), Failure> {
        let (key, label) = (work.key, work.label);
        let fail = |message: String| Failure {
            message,
            step: Some(label.to_owned()),
        };
        let mount = self
            .layers
            .mount_step(chain, &job.build_id, work.archive)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let outcome = self.run_in_sandbox(job, &mount, &work, log).await;
        match outcome {
            Ok(()) => self
                .layers
                .keep(mount, key)
                .await
                .map(drop)
                .map_err(|e| fail(e.to_string())),
            Err(message) => {
                if let Err(e) = self.layers.discard(mount).await {
                    tracing::warn!(build = %job.build_id, error = %e, "discarding a failed step");
                }
                Err(fail(message))
            }
        }
    }

    /// Boots a build sandbox on the step's mount, runs the command, and destroys the sandbox.
    async fn run_in_sandbox(
        &self,
        job: &BuildJob,
        mount: &StepMount,
        work: &StepWork<'_>,
        log: &BuildLog,
    ) -> Result<(), String> {
        let (command, label) = (work.command, work.label);
        let spec = LaunchSpec {
            id: SandboxId::generate(),
            rootfs: mount.merged.clone(),
            resources: job.resources,
            // A step reaches what the server's sandboxes reach by default.
            egress: Egress::default(),
            writes: RootfsWrites::Through,
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
        let result = match self.agent.wait_ready(placement.agent, AGENT_START).await {
            Ok(()) => self.agent.run(placement.agent, command, &mut output).await,
            Err(e) => Err(e),
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

    /// Stacks the layers into the template's rootfs and records it as built.
    async fn finish(
        &self,
        job: &BuildJob,
        progress: Progress,
    ) -> Result<TemplateRecord, super::BuildError> {
        let base = &job.definition.base;
        let own_layers = &progress.chain[chain_of(base).len()..];
        let rootfs = if own_layers.is_empty() {
            base.rootfs.clone()
        } else {
            let target = self
                .layers
                .rootfs_mount(job.template_id.as_str(), &progress.key);
            self.layers.mount_rootfs(&progress.chain, &target).await?;
            target
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
        let record = TemplateRecord {
            name: job.template_id.clone(),
            content_hash,
            rootfs,
            built_at: super::now(),
            size_bytes: size,
            layers: if own_layers.is_empty() {
                base.layers.clone()
            } else {
                progress.chain
            },
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
fn failed_at(step: &'static str) -> impl FnOnce(super::BuildError) -> Failure {
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
    serde_json::json!({
        "run": c.shell, "user": c.user, "cwd": c.cwd, "env": c.envs,
    })
}

fn hash(parts: &[&str]) -> String {
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
