//! Running sandboxes lost with their node. Nobody runs them, so nobody ends them when their
//! timeout passes: they would stay listed and hold their key's quota for good. Each gateway
//! gives them up a while after their timeout, as their node would have ended them (a kill
//! through any gateway does the same at once: `routes::kill_lost`).

use super::GatewayState;
use airlock_core::lifecycle::now_unix;
use std::time::Duration;

/// How often each gateway looks.
const EVERY: Duration = Duration::from_secs(10);

/// How long past its timeout a running sandbox must be. A node that answers ends or pauses
/// its own sandboxes when their timeout passes, so by then only a lost one still runs, even
/// if this gateway's view of the nodes is behind.
const GRACE_SECS: i64 = 60;

/// Gives up, every [`EVERY`], the running sandboxes past their timeout on nodes that do not
/// answer this gateway's polls (or that it no longer finds at all).
pub async fn give_up_lost(gw: GatewayState) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let answering: Vec<String> = gw.nodes.all_healthy().into_iter().map(|n| n.name).collect();
        let before = now_unix() - GRACE_SECS;
        match (gw.store.sandboxes())
            .stop_lost_past_timeout(&answering, before)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                sandboxes = n,
                "gave up running sandboxes of nodes that do not answer: their timeouts passed"
            ),
            Err(e) => tracing::warn!(error = %e, "giving up lost sandboxes failed"),
        }
    }
}
