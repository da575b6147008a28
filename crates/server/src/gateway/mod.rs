//! A gateway (`airlock serve --role gateway`): the E2B API in front of a cluster's nodes. It
//! checks API keys, places new sandboxes, and forwards every request to the node that serves
//! it; it keeps nothing in memory that another gateway would need (the catalog of sandboxes,
//! keys and templates are in the shared PostgreSQL), so any gateway serves any request and a
//! restarted one loses nothing.

mod dashboard;
pub mod forward;
pub mod lost;
pub mod nodes;
mod placement;
pub mod routes;
mod signed_files;

use airlock_core::store::{SandboxEvent, Store};
use std::sync::Arc;
use tokio::sync::mpsc;

pub struct Gateway {
    pub store: Arc<Store>,
    pub nodes: Arc<nodes::NodeTable>,
    pub forward: forward::Forwarder,
    /// Signed file URLs' signatures already matched to their sandbox.
    pub signers: crate::proxy::signed_urls::Signers,
    /// The events this gateway records (of sandboxes lost with their node, whose node cannot),
    /// for its webhook deliveries.
    pub webhook_feed: mpsc::Sender<SandboxEvent>,
}

pub type GatewayState = Arc<Gateway>;
