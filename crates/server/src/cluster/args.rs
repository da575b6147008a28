//! `airlock serve`'s flags for running as part of a cluster.

use super::{ClusterSecret, Role};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ClusterArgs {
    /// What this server does. `all` (the default) is Airlock on one machine: the API and the
    /// sandboxes. In a cluster, `gateway`s serve the API (stateless: run as many as you like
    /// behind one address) and forward to the `node`s, which run the sandboxes; all of them
    /// share one PostgreSQL (--database) and nodes one object store (--object-store). A
    /// gateway needs no root and no runsc. See README, "Many machines".
    #[arg(long, value_enum, default_value_t = Role::All, env = "AIRLOCK_ROLE")]
    pub role: Role,
    /// A file holding the secret (32 characters or more, e.g. `openssl rand -hex 32`) that
    /// gateways send to nodes: a node answers nothing else but /health. Same file on every
    /// gateway and node of a cluster.
    #[arg(long, value_name = "FILE", env = "AIRLOCK_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Gateways: the nodes, as HOST:PORT (or http://HOST:PORT), comma-separated. A name that
    /// resolves to several addresses (a Kubernetes headless Service) is a node at each; it is
    /// resolved again every second, so nodes may come and go.
    #[arg(
        long,
        value_name = "HOST:PORT,...",
        value_delimiter = ',',
        env = "AIRLOCK_NODES"
    )]
    pub nodes: Vec<String>,
}

impl ClusterArgs {
    /// The cluster secret, if a file is named.
    pub fn secret(&self) -> anyhow::Result<Option<ClusterSecret>> {
        Ok(self
            .cluster_secret_file
            .as_deref()
            .map(ClusterSecret::read)
            .transpose()?)
    }

    /// `--nodes` as `host:port` entries.
    pub fn node_endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.trim().trim_start_matches("http://").trim_end_matches('/'))
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect()
    }
}
