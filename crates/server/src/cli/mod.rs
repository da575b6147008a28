//! Client commands: `airlock sandbox …` and `airlock run` talk to a running server over its
//! API, as does `airlock template build -f`; `airlock key …` and `airlock template ls` work on
//! the local data dir.

mod process;
mod run;
mod sandbox;
mod template;

pub use run::{run, RunOptions};
pub use sandbox::{sandbox, SandboxCommand};
pub use template::{template_build, template_cancel, template_ls, TemplateCommand, TemplateJob};

use crate::client::ClientError;
use crate::data_dir::DataDir;
use crate::term;
use airlock_core::store::{KeyLimits, Store};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

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
