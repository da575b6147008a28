//! The nodes' admin routes (`GET /nodes`, `GET /nodes/{nodeID}`), in E2B's shapes. A node is one
//! machine that runs sandboxes; one `airlock serve` is one node.

use serde::{Deserialize, Serialize};

/// Whether placement may put new sandboxes on a node.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    /// Takes new sandboxes.
    Ready,
    /// Takes none; its sandboxes leave (`airlock node drain`).
    Draining,
    /// Does not answer its health checks.
    Unhealthy,
}

/// An item of `GET /nodes`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// What sandboxes show as their `clientID`.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    pub status: NodeStatus,
    /// Sandboxes running there (paused ones run nowhere).
    pub sandbox_count: u32,
    /// CPUs and memory those sandboxes were given.
    #[serde(rename = "allocatedCPU")]
    pub allocated_cpu: u32,
    #[serde(rename = "allocatedMemoryMiB")]
    pub allocated_memory_mib: u64,
}

/// `GET /nodes/{nodeID}`: the node and the sandboxes running there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeDetail {
    #[serde(flatten)]
    pub node: Node,
    /// Their ids, oldest first.
    pub sandboxes: Vec<String>,
}

/// `POST /nodes/{nodeID}`: E2B's change of a node's status (`ready` or `draining`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeStatusChange {
    pub status: NodeStatus,
}

/// Where a gateway asks a node how it is (the cluster secret only).
pub const NODE_REPORT_PATH: &str = "/cluster/node";

/// A node's answer to its gateways' health polls: what `GET /nodes` shows of it, and what
/// placement weighs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    #[serde(flatten)]
    pub node: Node,
    /// The host's cores, and its memory available now.
    pub cpus: u32,
    pub memory_available_mib: u64,
    /// The most sandboxes it runs at once (`--max-sandboxes`).
    pub max_sandboxes: u32,
    /// Starts waiting for their turn there now.
    pub launches_queued: u32,
    /// The templates (their records' names: a built-in's name or a build's id) whose golden
    /// image it holds: a create of one restores it there instead of booting it.
    #[serde(default)]
    pub warm_templates: Vec<String>,
}
