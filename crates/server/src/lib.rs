//! The server's modules as a library: `main.rs` is the `airlock` binary built from them, and the
//! fuzz targets under `fuzz/` drive the same request parsing and validation.

pub mod agent_client;
pub mod boot;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod dashboard;
pub mod data_dir;
pub mod dockerfile;
pub mod gateway;
pub mod http;
pub mod mcp;
pub mod operator_metrics;
pub mod proxy;
pub mod term;

use airlock_core::lifecycle::Lifecycle;
use airlock_core::store::Store;
use std::sync::Arc;

/// Shared by every request handler.
pub struct AppStateInner {
    pub lifecycle: Arc<Lifecycle>,
    pub builder: Arc<airlock_core::build::Builder>,
    pub store: Arc<Store>,
    pub volumes: Arc<airlock_core::volumes::Volumes>,
    pub http: client::HttpClient,
    pub signers: proxy::Signers,
    /// `--domain`: what sandboxes' ports are named under (`{port}-{id}.{domain}`).
    pub domain: Option<String>,
    /// The API's sandbox verbs, counted and timed for the operator's `/metrics`.
    pub verbs: Arc<http::verbs::Verbs>,
    /// The data dir, whose disk's headroom the dashboard shows.
    pub data_dir: std::path::PathBuf,
    /// `--node-name`: this machine as `GET /nodes` and sandboxes' `clientID` name it.
    pub node_name: String,
    /// Whether this server is the whole of Airlock or a node of a cluster (`--role`).
    pub role: cluster::Role,
    /// Sends webhooks, and checks where they may go.
    pub webhooks: Arc<airlock_core::webhook::Deliverer>,
}

pub type AppState = Arc<AppStateInner>;
