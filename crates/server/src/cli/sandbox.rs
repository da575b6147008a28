//! `airlock sandbox …`: the sandbox verbs, each one call to the running server's API (the same
//! calls the SDK makes), so they see what the key sees.

use super::{parse_pair, print_table, CliError};
use crate::client::{parse, percent_encode, Client, ClientError};
use crate::term;
use airlock_wire::api::{
    NewSandbox, PauseBody, SandboxDetail, SandboxLogsV2, SnapshotInfo, SnapshotRequest, TimeoutBody,
};
use clap::Subcommand;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// Start a sandbox and print its id.
    Create {
        /// The template (or snapshot) to start it from.
        #[arg(long, short, default_value = "base")]
        template: String,
        /// Seconds it lives before it is killed [default: the server's].
        #[arg(long)]
        timeout: Option<u64>,
        /// A metadata entry, `KEY=VALUE` (repeatable); `ls --metadata` filters on it.
        #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_pair)]
        metadata: Vec<(String, String)>,
        /// Print the server's whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List sandboxes: the running ones, unless --state or --all says otherwise.
    Ls {
        /// Only sandboxes in this state (repeatable).
        #[arg(long, value_parser = ["running", "paused"])]
        state: Vec<String>,
        /// Running and paused sandboxes.
        #[arg(long, short)]
        all: bool,
        /// Only sandboxes with this metadata entry, `KEY=VALUE` (repeatable).
        #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_pair)]
        metadata: Vec<(String, String)>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one sandbox: state, template, resources, timeout, network rules, metadata.
    Info {
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Kill sandboxes. Exits 1 if any of them did not exist.
    Kill {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Pause a sandbox: its memory, processes and files go to disk until it is resumed.
    Pause { id: String },
    /// Resume a paused sandbox where it left off.
    Resume {
        id: String,
        /// Seconds it lives from now [default: the server's].
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Save a running sandbox as a snapshot that new sandboxes start from
    /// (`sandbox create --template SNAPSHOT`); it runs on.
    Snapshot {
        id: String,
        /// A name for the snapshot.
        #[arg(long)]
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a sandbox's log: what its agent did and what its start command wrote.
    Logs {
        id: String,
        /// Keep printing new entries as they come, until Ctrl-C or the sandbox ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Run a command inside a sandbox, streaming its output; exits with the command's exit code.
    #[command(trailing_var_arg = true)]
    Exec {
        /// Run as this user inside the sandbox.
        #[arg(long, default_value = "user")]
        user: String,
        /// Working directory inside the sandbox [default: the user's home].
        #[arg(long)]
        cwd: Option<String>,
        /// Extra environment variable, `KEY=VALUE` (repeatable).
        #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_pair)]
        envs: Vec<(String, String)>,
        id: String,
        /// The command and its arguments (after `--`).
        #[arg(required = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Open an interactive login shell in a sandbox, on a terminal that follows yours (its
    /// size too). Exits with the shell's exit code.
    Shell {
        id: String,
        /// Log in as this user inside the sandbox.
        #[arg(long, default_value = "user")]
        user: String,
    },
    /// Copy a file into or out of a sandbox: `cp ./data.csv ID:/home/user/data.csv` or
    /// `cp ID:/home/user/out.png ./out.png`. Relative sandbox paths are under the user's home.
    Cp {
        /// `LOCAL` or `ID:PATH`.
        src: String,
        /// `ID:PATH` or `LOCAL`.
        dst: String,
        /// Read and write as this user inside the sandbox.
        #[arg(long, default_value = "user")]
        user: String,
    },
}

pub async fn sandbox(cmd: SandboxCommand, client: Client) -> Result<ExitCode, CliError> {
    match cmd {
        SandboxCommand::Create {
            template,
            timeout,
            metadata,
            json,
        } => {
            let body = NewSandbox {
                template_id: template,
                timeout,
                metadata: Some(metadata.into_iter().collect()),
                ..NewSandbox::default()
            };
            let answer = client.call_json("POST", "/v2/sandboxes", &body).await?;
            let created: airlock_wire::api::Sandbox = parse(&answer)?;
            print_json_or(json, &answer, || println!("{}", created.sandbox_id));
        }
        SandboxCommand::Ls {
            state,
            all,
            metadata,
            json,
        } => {
            let states = match (all, state.is_empty()) {
                (true, _) => "running,paused".to_owned(),
                (false, true) => "running".to_owned(),
                (false, false) => state.join(","),
            };
            let mut query = vec![("state", states)];
            if !metadata.is_empty() {
                query.push(("metadata", url_encode_pairs(&metadata)));
            }
            let path = format!("/v2/sandboxes?{}", url_encode_pairs(&query));
            let answer = client.call("GET", &path).await?;
            let list: Vec<SandboxDetail> = parse(&answer)?;
            print_json_or(json, &answer, || print_sandboxes(&list));
        }
        SandboxCommand::Info { id, json } => {
            let answer = client.call("GET", &format!("/sandboxes/{id}")).await?;
            let detail: SandboxDetail = parse(&answer)?;
            print_json_or(json, &answer, || print_detail(&detail));
        }
        SandboxCommand::Kill { ids } => {
            let mut failed = false;
            for id in &ids {
                match client.call("DELETE", &format!("/sandboxes/{id}")).await {
                    Ok(_) => println!("killed {id}"),
                    Err(ClientError::Failed(msg)) => {
                        eprintln!("airlock: {}: {}", term::cell(id), term::escaped(&msg));
                        failed = true;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if failed {
                return Ok(ExitCode::FAILURE);
            }
        }
        SandboxCommand::Pause { id } => {
            let started = std::time::Instant::now();
            client
                .call_json(
                    "POST",
                    &format!("/sandboxes/{id}/pause"),
                    &PauseBody::default(),
                )
                .await?;
            println!("paused {id} in {:.1} s", started.elapsed().as_secs_f64());
        }
        SandboxCommand::Resume { id, timeout } => {
            client
                .call_json(
                    "POST",
                    &format!("/sandboxes/{id}/resume"),
                    &TimeoutBody {
                        timeout,
                        ..TimeoutBody::default()
                    },
                )
                .await?;
            println!("resumed {id}");
        }
        SandboxCommand::Snapshot { id, name, json } => {
            let answer = client
                .call_json(
                    "POST",
                    &format!("/sandboxes/{id}/snapshots"),
                    &SnapshotRequest { name },
                )
                .await?;
            let snapshot: SnapshotInfo = parse(&answer)?;
            print_json_or(json, &answer, || println!("{}", snapshot.snapshot_id));
        }
        SandboxCommand::Logs { id, follow } => logs(&client, &id, follow).await?,
        SandboxCommand::Exec {
            user,
            cwd,
            envs,
            id,
            command,
        } => {
            let envs = envs.into_iter().collect();
            return super::process::exec(&client, &id, &user, cwd, envs, &command).await;
        }
        SandboxCommand::Shell { id, user } => {
            return super::process::shell(&client, &id, &user).await
        }
        SandboxCommand::Cp { src, dst, user } => {
            crate::client::files::copy(&client, &src, &dst, &user)
                .await
                .map(|what| println!("{what}"))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The server's answer as it came (`--json`, see [`term::json`]), or what `human` prints.
fn print_json_or(json: bool, answer: &[u8], human: impl FnOnce()) {
    if json {
        println!("{}", term::json(&String::from_utf8_lossy(answer)));
    } else {
        human();
    }
}

/// `k1=v1&k2=v2`, each part percent-encoded (E2B's metadata filter is such a string itself).
fn url_encode_pairs<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            let (k, v) = (percent_encode(k.as_ref()), percent_encode(v.as_ref()));
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn print_sandboxes(list: &[SandboxDetail]) {
    let rows: Vec<[String; 6]> = list
        .iter()
        .map(|s| {
            [
                s.sandbox_id.clone(),
                s.state.as_str().to_owned(),
                s.alias.clone().unwrap_or_else(|| s.template_id.clone()),
                s.started_at.clone(),
                s.end_at.clone(),
                metadata_column(&s.metadata),
            ]
        })
        .collect();
    print_table(
        &["ID", "STATE", "TEMPLATE", "STARTED", "EXPIRES", "METADATA"],
        &rows,
    );
}

fn metadata_column(metadata: &BTreeMap<String, String>) -> String {
    metadata
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn print_detail(d: &SandboxDetail) {
    let network = d.network.as_ref().map(|n| {
        let list = |l: &Option<Vec<String>>| l.as_deref().unwrap_or_default().join(",");
        format!(
            "allow out [{}], deny out [{}]",
            list(&n.allow_out),
            list(&n.deny_out)
        )
    });
    let rows: Vec<[String; 2]> = [
        ("id", d.sandbox_id.clone()),
        ("state", d.state.as_str().to_owned()),
        (
            "template",
            d.alias.clone().unwrap_or_else(|| d.template_id.clone()),
        ),
        ("started", d.started_at.clone()),
        ("expires", d.end_at.clone()),
        ("cpus", d.cpu_count.to_string()),
        ("memory", format!("{} MiB", d.memory_mb)),
        ("disk", format!("{} MiB", d.disk_size_mb)),
        ("network", network.unwrap_or_else(|| "-".into())),
        ("metadata", metadata_column(&d.metadata)),
    ]
    .into_iter()
    .map(|(k, v)| [k.to_owned(), v])
    .collect();
    for [k, v] in rows {
        println!("{k:<9} {}", term::cell(&v));
    }
}

/// Prints the sandbox's log; with `follow`, polls for new entries until the sandbox is gone.
async fn logs(client: &Client, id: &str, follow: bool) -> Result<(), CliError> {
    // Entries come oldest first from the cursor on, the cursor's own millisecond included:
    // those already printed at that millisecond are skipped the next time.
    let mut cursor: Option<i64> = None;
    let mut seen_at_cursor = 0usize;
    loop {
        let path = match cursor {
            Some(ms) => format!("/v2/sandboxes/{id}/logs?cursor={ms}"),
            None => format!("/v2/sandboxes/{id}/logs"),
        };
        let answer = match client.call("GET", &path).await {
            // The sandbox ended while being followed.
            Err(ClientError::Failed(_)) if cursor.is_some() => return Ok(()),
            other => other?,
        };
        let page: SandboxLogsV2 = parse(&answer)?;
        let mut skip = seen_at_cursor;
        for entry in page.logs {
            let ms = chrono::DateTime::parse_from_rfc3339(&entry.timestamp)
                .map(|t| t.timestamp_millis())
                .unwrap_or(0);
            if Some(ms) == cursor && skip > 0 {
                skip -= 1;
                continue;
            }
            if Some(ms) != cursor {
                cursor = Some(ms);
                seen_at_cursor = 0;
            }
            seen_at_cursor += 1;
            let fields: Vec<String> = entry
                .fields
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let line = format!(
                "{} {:<5} {} {}",
                entry.timestamp,
                entry.level.as_str(),
                entry.message,
                fields.join(" ")
            );
            println!("{}", term::cell(&line));
        }
        if !follow {
            return Ok(());
        }
        cursor.get_or_insert(0);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
