//! `airlock serve --role gateway`: no sandboxes and no root, only the shared database, the
//! nodes to poll, and the one port.

use crate::cluster::ClusterSecret;
use crate::gateway::forward::Forwarder;
use crate::gateway::nodes::{node_client, NodeTable};
use crate::gateway::{routes, Gateway};
use crate::http::webhooks::deliver;
use airlock_core::store::{Database, Store};
use airlock_core::webhook::Deliverer;
use anyhow::Context;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::mpsc;

pub struct GatewayOptions {
    pub listen: SocketAddr,
    /// The PostgreSQL the nodes keep their state in.
    pub database: Database,
    /// `--nodes`: `host:port` entries, each a node or a name with a node at every address.
    pub nodes: Vec<String>,
    pub secret: ClusterSecret,
    /// `--webhooks-allow-private`: webhooks may be at private and loopback addresses.
    pub webhooks_allow_private: bool,
}

/// Events recorded here but not yet taken by the webhook deliveries; more are not delivered.
const WEBHOOK_FEED_ROOM: usize = 256;

pub async fn serve_gateway(opts: GatewayOptions) -> anyhow::Result<()> {
    let store = Arc::new(
        Store::connect(&opts.database)
            .await
            .context("opening the state database in the PostgreSQL that --database names")?,
    );
    // A gateway runs no sandboxes: no driver adds addresses to the private ranges refused.
    let webhooks = Deliverer::new(Vec::new(), opts.webhooks_allow_private)
        .context("setting up webhook deliveries")?;
    let (webhook_feed, feed) = mpsc::channel(WEBHOOK_FEED_ROOM);
    tokio::spawn(deliver(store.clone(), Arc::new(webhooks), feed));
    let client = node_client();
    let nodes = NodeTable::new(opts.nodes, opts.secret.clone(), client.clone());
    // The first round before serving, so that the first create finds the nodes.
    nodes.poll().await;
    tokio::spawn(nodes.clone().run());
    let state = Arc::new(Gateway {
        store,
        nodes,
        forward: Forwarder {
            client,
            secret: opts.secret,
        },
        signers: Default::default(),
        webhook_feed,
    });
    tokio::spawn(crate::gateway::lost::give_up_lost(state.clone()));
    // No body limit here: each node bounds what it takes, and sandbox traffic streams.
    // MCP is a client of the API: here, of this gateway, which forwards its calls.
    let mcp = crate::mcp::routes(state.store.clone(), super::loopback_url(opts.listen));
    let app = Router::new()
        .merge(mcp)
        .fallback(routes::handle)
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("listening on {}", opts.listen))?;
    let ready = state.nodes.list();
    println!(
        "Airlock gateway serving on http://{}, in front of {} node(s) ({} ready)",
        opts.listen,
        ready.len(),
        ready
            .iter()
            .filter(|n| n.status == airlock_wire::nodes::NodeStatus::Ready)
            .count()
    );
    super::listen::serve(listener, app, super::wait_for_signal(), async {}).await;
    Ok(())
}
