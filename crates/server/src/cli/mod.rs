//! Client commands: `airlock sandbox …` and `airlock run` talk to a running server over its
//! API, as does `airlock template build -f`; `airlock key …` and `airlock template ls` work on
//! the local data dir.

mod process;
mod run;
mod sandbox;

pub use run::{run, RunOptions};
pub use sandbox::{sandbox, SandboxCommand};

use crate::client::{percent_encode, Client, ClientError};
use crate::data_dir::DataDir;
use crate::dockerfile_build::DockerfileBuild;
use crate::term;
use airlock_core::store::{KeyLimits, Store};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

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

/// `NAME=VALUE`, as `--build-arg`, `--env` and `--metadata` take it.
fn parse_pair(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("'{arg}' is not NAME=VALUE")),
    }
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Make a new API key and print it (only once: the server keeps just its SHA-256). Each key
    /// sees and controls only the sandboxes and snapshots made with it.
    Create {
        /// What the key is for, shown by `airlock key ls`.
        #[arg(long, default_value = "")]
        name: String,
        /// Most sandboxes it may run at once [default: the server's --key-max-running].
        #[arg(long)]
        max_running: Option<u32>,
        /// Most sandboxes it may keep paused [default: the server's --key-max-paused].
        #[arg(long)]
        max_paused: Option<u32>,
        /// Most disk its snapshots may take, in MiB [default: the server's
        /// --key-max-snapshot-mb].
        #[arg(long)]
        max_snapshot_mb: Option<u64>,
    },
    /// List API keys: id (the first 12 hex digits of the key's SHA-256), name, dates.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by its id: requests made with it get 401 from then on. Its sandboxes keep
    /// running until their timeout.
    Revoke { id: String },
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Other(anyhow::Error),
}

impl CliError {
    /// The error to print: it may quote a server, a sandbox or a registry, so its control
    /// characters are escaped (see [`term`]).
    pub fn describe(&self) -> String {
        let text = match self {
            CliError::Other(e) => format!("{e:#}"),
            other => other.to_string(),
        };
        term::escaped(&text).into_owned()
    }

    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Client(ClientError::Unreachable { .. }) => ExitCode::from(3),
            _ => ExitCode::FAILURE,
        }
    }
}

/// Prints rows as a table, or with `json` as a JSON array of objects keyed by the header's
/// names in lower case.
fn print_rows<const N: usize>(json: bool, header: &[&str; N], rows: &[[String; N]]) {
    if !json {
        return print_table(header, rows);
    }
    let objects: Vec<serde_json::Map<String, serde_json::Value>> = rows
        .iter()
        .map(|row| {
            header
                .iter()
                .zip(row)
                .map(|(name, cell)| (name.to_ascii_lowercase(), cell.as_str().into()))
                .collect()
        })
        .collect();
    println!(
        "{}",
        term::json(&serde_json::Value::from(objects).to_string())
    );
}

/// Prints rows under a header, in columns as wide as their widest cell; each cell escaped
/// (see [`term::cell`]).
fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|row| row.clone().map(|cell| term::cell(&cell).into_owned()))
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", text.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// `airlock template ls`: the built templates in the data dir's database that a name reaches:
/// the built-ins, and each tagged build of a user template as `name:tag` (every key's).
pub fn template_ls(data: &DataDir, json: bool) -> Result<ExitCode, CliError> {
    let store = open_store(data)?;
    let failed = |e: airlock_core::store::StoreError| CliError::Other(e.into());
    let mut rows: Vec<[String; 4]> = Vec::new();
    for t in store.named_templates().map_err(failed)? {
        let names = match store.template_of_record(&t.name).map_err(failed)? {
            Some(owner) => {
                let tags = store.tags_of(&owner.id).map_err(failed)?.into_iter();
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

fn rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// `airlock key …`: works on the data dir's database directly, so it needs the server's
/// data dir (and its permissions), not a running server.
pub fn key(cmd: KeyCommand, data: &DataDir) -> Result<ExitCode, CliError> {
    let store = open_store(data)?;
    let now = airlock_core::lifecycle::now_unix();
    let failed = |e: airlock_core::store::StoreError| CliError::Other(e.into());
    match cmd {
        KeyCommand::Create {
            name,
            max_running,
            max_paused,
            max_snapshot_mb,
        } => {
            let key = crate::serve::new_api_key();
            let hash = crate::http::auth::hash_key(&key);
            let limits = KeyLimits {
                max_running,
                max_paused,
                max_snapshot_mb,
            };
            store
                .add_api_key_hash(&hash, &name, now, limits)
                .map_err(failed)?;
            println!("{key}");
            eprintln!(
                "key id {} (store the key now: it is not shown again)",
                airlock_core::store::key_id(&hash)
            );
        }
        KeyCommand::Ls { json } => {
            let rows: Vec<[String; 5]> = store
                .api_keys()
                .map_err(failed)?
                .into_iter()
                .map(|k| {
                    [
                        k.id,
                        k.name,
                        rfc3339(k.created_at),
                        limits_column(&k.limits),
                        k.revoked_at.map(rfc3339).unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            print_rows(json, &["ID", "NAME", "CREATED", "LIMITS", "REVOKED"], &rows);
        }
        KeyCommand::Revoke { id } => {
            if !store.revoke_api_key(&id, now).map_err(failed)? {
                return Err(CliError::Failed(format!(
                    "no live key has the id '{id}' (see `airlock key ls`)"
                )));
            }
            println!("revoked {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A key's own limits, `-` when it has none (the server's defaults apply).
fn limits_column(limits: &KeyLimits) -> String {
    let set: Vec<String> = [
        limits.max_running.map(|n| format!("running={n}")),
        limits.max_paused.map(|n| format!("paused={n}")),
        limits.max_snapshot_mb.map(|n| format!("snapshot_mb={n}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if set.is_empty() {
        "-".into()
    } else {
        set.join(",")
    }
}

fn open_store(data: &DataDir) -> Result<Store, CliError> {
    let path: PathBuf = data.db();
    Store::open(&path).map_err(|e| {
        CliError::Other(anyhow::Error::new(e).context(format!("opening {}", path.display())))
    })
}
