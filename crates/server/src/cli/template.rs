//! `airlock template …`: build a Dockerfile on the running server through the same API the
//! SDK's template builder uses (`POST /v3/templates`, the COPY uploads, `POST
//! /v2/templates/{id}/builds/{build}`, then the build's status and logs), cancel a build, and
//! list the built templates of the local data dir.

use super::{open_store, parse_pair, print_rows, rfc3339, CliError};
use crate::client::{percent_encode, Client};
use crate::data_dir::DataDir;
use crate::dockerfile::context::{wire_steps, Packed};
use crate::term;
use airlock_core::store::Database;
use airlock_core::template::KNOWN_TEMPLATES;
use airlock_wire::templates::{
    BuildStatusBody, TemplateBuildCreated, TemplateBuildRequest, TemplateBuildStart,
    TemplateFileUpload,
};
use axum::body::Body;
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Cancel a build that waits for its turn or runs: its step stops at once and the build
    /// ends with an error. `template build` prints the template and build ids.
    Cancel {
        /// The template's name or id.
        template: String,
        /// The build's id.
        build: String,
    },
    /// List built templates (the built-ins, and every key's templates as NAME:TAG).
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Build a template.
    ///
    /// `airlock template build -f Dockerfile -n NAME [CONTEXT]` builds a Dockerfile on the
    /// running server, for your API key, as the SDK's `Template.build` does: FROM an image in
    /// any OCI registry, RUN, COPY/ADD of local files, ENV, ARG, WORKDIR, USER, and CMD or
    /// ENTRYPOINT as the start command that is already running when a sandbox starts. Steps
    /// whose inputs did not change come from the cache. Then `Sandbox.create("NAME")`.
    ///
    /// The built-in templates (base, code-interpreter-v1) are Dockerfiles too, in the
    /// repository's templates/ directory: `airlock serve` builds them the same way when it
    /// starts.
    Build {
        /// The build context, where COPY finds its sources [default: the Dockerfile's
        /// directory].
        context: Option<PathBuf>,
        /// The Dockerfile to build.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The template's name, which sandboxes are created from; `NAME:TAG` tags this build
        /// (without one it is `NAME:default`, which `NAME` alone starts).
        #[arg(short = 'n', long)]
        name: String,
        /// CPUs for the template's sandboxes [default: the server's].
        #[arg(long)]
        cpu_count: Option<u32>,
        /// Memory for the template's sandboxes, in MiB [default: the server's].
        #[arg(long)]
        memory_mb: Option<u32>,
        /// A shell command that must exit 0 before the start command counts as ready, e.g.
        /// `curl -fs localhost:8000` [default: wait 20 s, as E2B does].
        #[arg(long)]
        ready_cmd: Option<String>,
        /// Run every step again, even those in the cache.
        #[arg(long)]
        no_cache: bool,
        /// A value for one of the Dockerfile's ARGs (repeatable), as `docker build` takes it.
        #[arg(long = "build-arg", value_name = "NAME=VALUE", value_parser = parse_pair)]
        build_args: Vec<(String, String)>,
    },
}

/// What a `template` command does: a Dockerfile build goes to the server, a listing reads the
/// data dir.
pub enum TemplateJob {
    Build(DockerfileBuild),
    List { json: bool },
    Cancel { template: String, build: String },
}

impl TemplateCommand {
    pub fn into_job(self) -> TemplateJob {
        match self {
            TemplateCommand::Build {
                context,
                file: dockerfile,
                name,
                cpu_count,
                memory_mb,
                ready_cmd,
                no_cache,
                build_args,
            } => TemplateJob::Build(DockerfileBuild {
                build_args: build_args.into_iter().collect(),
                dockerfile,
                name,
                context,
                cpu_count,
                memory_mb,
                ready_cmd,
                no_cache,
            }),
            TemplateCommand::Ls { json } => TemplateJob::List { json },
            TemplateCommand::Cancel { template, build } => TemplateJob::Cancel { template, build },
        }
    }
}

/// `airlock template cancel`: stops a build of the caller's.
pub async fn template_cancel(client: Client, template: &str, build: &str) -> Result<(), CliError> {
    let path = format!(
        "/templates/{}/builds/{}",
        percent_encode(template),
        percent_encode(build)
    );
    client.call("DELETE", &path).await?;
    println!("cancelled build {build} of {template}");
    Ok(())
}

pub struct DockerfileBuild {
    pub dockerfile: PathBuf,
    pub name: String,
    /// Where COPY's sources are; the Dockerfile's directory by default.
    pub context: Option<PathBuf>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u32>,
    /// A command that must succeed before the start command counts as ready.
    pub ready_cmd: Option<String>,
    /// Run every step again, cached or not.
    pub no_cache: bool,
    /// `--build-arg NAME=VALUE`: values for the Dockerfile's `ARG`s.
    pub build_args: std::collections::BTreeMap<String, String>,
}

/// `airlock template build -f`: plans the Dockerfile, packs and uploads its COPYs' files,
/// starts the build and follows it.
pub async fn template_build(client: Client, opts: DockerfileBuild) -> Result<ExitCode, CliError> {
    let started = Instant::now();
    let text = std::fs::read_to_string(&opts.dockerfile)
        .map_err(|e| CliError::Failed(format!("reading {}: {e}", opts.dockerfile.display())))?;
    let plan = crate::dockerfile::plan(&text, &opts.build_args)
        .map_err(|e| CliError::Failed(format!("{}: {e}", opts.dockerfile.display())))?;
    for note in &plan.ignored {
        eprintln!("{}: ignored {note}", opts.dockerfile.display());
    }
    let context = match &opts.context {
        Some(dir) => dir.clone(),
        None => opts
            .dockerfile
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned(),
    };

    // Every COPY's files are packed (so a missing source fails) before anything is made.
    let (steps, packed) = wire_steps(&plan, &context, opts.no_cache, tar::HeaderMode::Complete)
        .map_err(|e| CliError::Failed(e.to_string()))?;

    let request = TemplateBuildRequest {
        name: Some(opts.name.clone()),
        cpu_count: opts.cpu_count,
        memory_mb: opts.memory_mb,
        ..TemplateBuildRequest::default()
    };
    let created: TemplateBuildCreated =
        parse(&client.call_json("POST", "/v3/templates", &request).await?)?;
    let (template, build) = (&created.template_id, &created.build_id);
    for files in &packed {
        upload(&client, template, files).await?;
    }
    // `FROM base` builds on the built-in, as `from_template("base")` does.
    let built_in = KNOWN_TEMPLATES.contains(&plan.from_image.as_str());
    let (from_template, from_image) = match built_in {
        true => (Some(plan.from_image), None),
        false => (None, Some(plan.from_image)),
    };
    let definition = TemplateBuildStart {
        from_template,
        from_image,
        steps,
        force: opts.no_cache,
        start_cmd: plan.start_cmd,
        ready_cmd: opts.ready_cmd,
        ..TemplateBuildStart::default()
    };
    let path = format!("/v2/templates/{template}/builds/{build}");
    client.call_json("POST", &path, &definition).await?;
    println!(
        "building {} (template {template}, build {build})",
        opts.name
    );
    follow(&client, template, build, started).await
}

/// Prints the build's log as it grows, each line with the seconds since the command began,
/// until the build is ready (exit 0) or failed (exit 1, with the server's reason). On a
/// terminal, a spinner below the log shows the step under way and how long it has taken.
async fn follow(
    client: &Client,
    template: &str,
    build: &str,
    started: Instant,
) -> Result<ExitCode, CliError> {
    let spinner = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        spinner.set_style(style);
    }
    spinner.enable_steady_tick(Duration::from_millis(120));
    let mut offset = 0;
    let mut current_step = None;
    let outcome = loop {
        let path = format!("/templates/{template}/builds/{build}/status?logsOffset={offset}");
        let answer = client.call("GET", &path).await.map_err(CliError::from);
        let status: BuildStatusBody = match answer.and_then(|b| parse(&b)) {
            Ok(status) => status,
            Err(e) => break Err(e),
        };
        offset += status.log_entries.len();
        for entry in &status.log_entries {
            let step = entry.step.as_deref().unwrap_or("");
            let line = format!(
                "{:>7.1}s {step:>8} | {}",
                started.elapsed().as_secs_f64(),
                entry.message
            );
            spinner.suspend(|| println!("{}", term::cell(&line)));
            if current_step.as_deref() != Some(step) {
                current_step = Some(step.to_owned());
                let what: String = entry
                    .message
                    .lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(70)
                    .collect();
                spinner.reset_elapsed();
                spinner.set_message(term::cell(&format!("step {step}: {what}")).into_owned());
            }
        }
        match status.status.as_str() {
            "ready" => break Ok(ExitCode::SUCCESS),
            "error" => {
                let reason = status.reason.map(|r| r.message).unwrap_or_default();
                break Err(CliError::Failed(format!("the build failed: {reason}")));
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    };
    spinner.finish_and_clear();
    outcome
}

/// Uploads packed files unless the server has them already (from an earlier build).
async fn upload(client: &Client, template: &str, files: &Packed) -> Result<(), CliError> {
    let src = &files.src;
    let path = format!("/templates/{template}/files/{}", files.hash);
    let link: TemplateFileUpload = parse(&client.call("GET", &path).await?)?;
    if link.present {
        println!("COPY {src}: the server has these files already");
        return Ok(());
    }
    let url = link
        .url
        .ok_or_else(|| CliError::Failed(format!("COPY {src}: the server gave no upload link")))?;
    let archive = files
        .reader()
        .map_err(|e| CliError::Failed(format!("COPY {src}: {e}")))?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(archive));
    let req = hyper::Request::put(&url)
        .body(Body::from_stream(stream))
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let resp = client.send(req).await?;
    if !resp.status().is_success() {
        return Err(CliError::Failed(format!(
            "COPY {src}: the upload was refused ({})",
            resp.status()
        )));
    }
    Ok(())
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, CliError> {
    serde_json::from_slice(body)
        .map_err(|e| CliError::Failed(format!("the server's answer was not understood: {e}")))
}

/// `airlock template ls`: the built templates in the data dir's database that a name reaches:
/// the built-ins, and each tagged build of a user template as `name:tag` (every key's).
pub async fn template_ls(
    data: &DataDir,
    database: Option<&Database>,
    json: bool,
) -> Result<ExitCode, CliError> {
    let store = open_store(data, database).await?;
    let failed = |e: airlock_core::store::StoreError| CliError::Other(e.into());
    let mut rows: Vec<[String; 4]> = Vec::new();
    for t in store.templates().named_templates().await.map_err(failed)? {
        let names = match store
            .templates()
            .template_of_record(&t.name)
            .await
            .map_err(failed)?
        {
            Some(owner) => {
                let tags = store
                    .templates()
                    .tags_of(&owner.id)
                    .await
                    .map_err(failed)?
                    .into_iter();
                let tags = tags.filter(|tag| tag.build_id == t.name.as_str());
                let names: Vec<String> = tags
                    .map(|tag| format!("{}:{}", owner.alias, tag.tag))
                    .collect();
                // A build being published has its tags once it is ready.
                if names.is_empty() {
                    t.name.to_string()
                } else {
                    names.join(",")
                }
            }
            None => t.name.to_string(),
        };
        rows.push([
            names,
            t.content_hash.chars().take(12).collect(),
            format!("{:.0} MiB", t.size_bytes as f64 / (1024.0 * 1024.0)),
            rfc3339(t.built_at),
        ]);
    }
    print_rows(json, &["NAME", "HASH", "SIZE", "BUILT"], &rows);
    Ok(ExitCode::SUCCESS)
}
