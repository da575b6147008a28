//! `airlock node …`: the machines that run sandboxes, for the operator's key.

use super::{print_rows, CliError};
use crate::client::{parse, Client};
use airlock_wire::nodes::{Node, NodeStatus, NodeStatusChange};
use clap::Subcommand;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum NodeCommand {
    /// List nodes: name (sandboxes' clientID), status, running sandboxes, and the CPUs and
    /// memory they were given. Needs an operator's key (`airlock key create --operator`).
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Drain a node for maintenance: it takes no new sandboxes, and its running ones are
    /// paused into object storage, to resume on another node at their next request. Needs an
    /// operator's key.
    Drain {
        /// The node, as `airlock node ls` names it.
        node: String,
    },
    /// Let a drained node take sandboxes again.
    Undrain { node: String },
}

pub async fn node(cmd: NodeCommand, client: Client) -> Result<ExitCode, CliError> {
    match cmd {
        NodeCommand::Ls { json } => {
            let nodes: Vec<Node> = parse(&client.call("GET", "/nodes").await?)?;
            let rows: Vec<[String; 5]> = nodes
                .into_iter()
                .map(|n| {
                    [
                        n.node_id,
                        status_name(n.status).into(),
                        n.sandbox_count.to_string(),
                        n.allocated_cpu.to_string(),
                        n.allocated_memory_mib.to_string(),
                    ]
                })
                .collect();
            print_rows(
                json,
                &["NODE", "STATUS", "SANDBOXES", "CPUS", "MEMORY_MIB"],
                &rows,
            );
        }
        NodeCommand::Drain { node } => set_status(&client, &node, NodeStatus::Draining).await?,
        NodeCommand::Undrain { node } => set_status(&client, &node, NodeStatus::Ready).await?,
    }
    Ok(ExitCode::SUCCESS)
}

fn status_name(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Ready => "ready",
        NodeStatus::Draining => "draining",
        NodeStatus::Unhealthy => "unhealthy",
    }
}

/// E2B's `POST /nodes/{nodeID}` with the status it is to have.
async fn set_status(client: &Client, node: &str, status: NodeStatus) -> Result<(), CliError> {
    let path = format!("/nodes/{}", crate::client::percent_encode(node));
    let body = NodeStatusChange { status };
    client.call_json("POST", &path, &body).await?;
    println!("{node}: {}", status_name(status));
    Ok(())
}
