//! Running sandboxes lost with their node. Nobody runs them, so nobody ends them when their
//! timeout passes: they would stay listed and hold their key's quota for good. Each gateway
//! gives them up a while after their timeout, as their node would have ended them (a kill
//! through any gateway does the same at once: `routes::kill_lost`). Either way the gateway
//! records their `killed` event and delivers it to webhooks, as their node would have.

use super::{Gateway, GatewayState};
use airlock_core::lifecycle::now_unix;
use airlock_core::store::{EventType, SandboxEvent, SandboxRecord};
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
            Ok(given_up) => {
                for record in &given_up {
                    tracing::info!(sandbox = %record.id, node = %record.node, "gave up a running sandbox of a node that does not answer: its timeout passed");
                    record_killed(&gw, record).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "giving up lost sandboxes failed"),
        }
    }
}

/// Records that the lost sandbox `record` is killed, and hands the event to this gateway's
/// webhook deliveries. A failure is logged: the kill stands.
pub async fn record_killed(gw: &Gateway, record: &SandboxRecord) {
    let at_us = chrono::Utc::now().timestamp_micros();
    let Some(event) = SandboxEvent::of(record, EventType::Killed, at_us, None) else {
        return;
    };
    if let Err(e) = gw.store.events().put(&event).await {
        tracing::warn!(sandbox = %record.id, error = %e, "recording a lost sandbox's killed event failed");
        return;
    }
    if gw.webhook_feed.try_send(event).is_err() {
        tracing::warn!("webhook deliveries are behind: an event is not delivered");
    }
}
