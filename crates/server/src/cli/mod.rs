//! Client commands: `airlock sandbox …` and `airlock run` talk to a running server over its
//! API, as does `airlock template build -f`; `airlock key …` and `airlock template ls` work on
//! the local data dir.

mod key;
mod node;
mod process;
mod run;
mod sandbox;
mod template;

pub use key::{key, KeyCommand};
pub use node::{node, NodeCommand};
pub use run::{run, RunOptions};
pub use sandbox::{sandbox, SandboxCommand};
pub use template::{template_build, template_cancel, template_ls, TemplateCommand, TemplateJob};

use crate::client::ClientError;
use crate::data_dir::DataDir;
use crate::term;
use airlock_core::store::{Database, Store};
use std::process::ExitCode;

/// `NAME=VALUE`, as `--build-arg`, `--env` and `--metadata` take it.
fn parse_pair(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("'{arg}' is not NAME=VALUE")),
    }
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

/// The data dir's state, or the PostgreSQL that `database` names (`--database`).
async fn open_store(data: &DataDir, database: Option<&Database>) -> Result<Store, CliError> {
    data.store(database).await.map_err(CliError::Other)
}
