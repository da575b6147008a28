//! `airlock key …`: API keys, made, listed and revoked.

use super::{open_store, print_rows, rfc3339, CliError};
use crate::data_dir::DataDir;
use airlock_core::keys::{hash_key, new_api_key};
use airlock_core::store::{Database, KeyLimits};
use clap::Subcommand;
use std::process::ExitCode;

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
        /// The operator's key: it may also read the nodes (`GET /nodes`, `airlock node ls`),
        /// which show every tenant's load. Tenants' keys never should be.
        #[arg(long)]
        operator: bool,
    },
    /// List API keys: id (the first 12 hex digits of the key's SHA-256), name, dates, role
    /// (operator or tenant) and limits.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by its id: requests made with it get 401 from then on. Its sandboxes keep
    /// running until their timeout.
    Revoke { id: String },
}

/// `airlock key …`: works on the state database directly (the data dir's, or the PostgreSQL
/// of `--database`), so it needs the server's data dir (and its permissions) or the
/// database's address, not a running server.
pub async fn key(
    cmd: KeyCommand,
    data: &DataDir,
    database: Option<&Database>,
) -> Result<ExitCode, CliError> {
    let store = open_store(data, database).await?;
    let keys = store.keys();
    let now = airlock_core::lifecycle::now_unix();
    let failed = |e: airlock_core::store::StoreError| CliError::Other(e.into());
    match cmd {
        KeyCommand::Create {
            name,
            max_running,
            max_paused,
            max_snapshot_mb,
            operator,
        } => {
            let key = new_api_key();
            let hash = hash_key(&key);
            let limits = KeyLimits {
                max_running,
                max_paused,
                max_snapshot_mb,
            };
            keys.add(&hash, &name, now, limits, operator)
                .await
                .map_err(failed)?;
            println!("{key}");
            eprintln!(
                "key id {} (store the key now: it is not shown again)",
                airlock_core::store::key_id(&hash)
            );
        }
        KeyCommand::Ls { json } => {
            let rows: Vec<[String; 6]> = keys
                .all()
                .await
                .map_err(failed)?
                .into_iter()
                .map(|k| {
                    [
                        k.id,
                        k.name,
                        rfc3339(k.created_at),
                        if k.operator { "operator" } else { "tenant" }.into(),
                        limits_column(&k.limits),
                        k.revoked_at.map(rfc3339).unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            print_rows(
                json,
                &["ID", "NAME", "CREATED", "ROLE", "LIMITS", "REVOKED"],
                &rows,
            );
        }
        KeyCommand::Revoke { id } => {
            if !keys.revoke(&id, now).await.map_err(failed)? {
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
