//! Sandboxes' lifecycle events, recorded as verbs succeed. A verb only queues its event; one
//! task writes the queue in order ([`Lifecycle::run_events`]), so no verb waits for the
//! database or fails with it, and a read that flushes first sees every verb answered before.
//! Each event written is then offered to the webhooks' feed ([`Lifecycle::webhook_feed`]),
//! which drops what it has no room for rather than hold the writer up.

use super::Lifecycle;
use crate::ordered::OrderedQueue;
use crate::store::{EventType, SandboxEvent, SandboxRecord, Store, EVENT_RETENTION_US};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;

/// The longest a read waits for the events queued before it to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// How often events past their retention are forgotten.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// Tries at writing one event before it is given up (the database stayed unreachable).
const WRITE_ATTEMPTS: u32 = 5;

/// Events written but not yet taken by the webhooks' deliverer; more are not delivered.
const FEED_ROOM: usize = 1024;

/// The events not yet written, and where written ones go for webhooks.
#[derive(Default)]
pub(super) struct Journal {
    queue: OrderedQueue<SandboxEvent>,
    /// Set once someone delivers webhooks.
    feed: Arc<OnceLock<mpsc::Sender<SandboxEvent>>>,
}

/// E2B's `eventData` of an update that moved the deadline to `end_at` (Unix seconds).
pub(super) fn timeout_data(end_at: i64) -> serde_json::Value {
    let at = chrono::DateTime::from_timestamp(end_at, 0).unwrap_or_default();
    serde_json::json!({ "set_timeout": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true) })
}

/// The `eventData` of an update of the network settings: the new ones, as the API shows them.
pub(super) fn network_data(r: &SandboxRecord) -> serde_json::Value {
    serde_json::json!({ "set_network": {
        "allowOut": r.egress.allow_out(),
        "denyOut": r.egress.deny_out(),
        "allowPublicTraffic": !r.require_traffic_token,
    }})
}

impl Lifecycle {
    /// Records that `kind` happened to the sandbox `r` now (if it has an owner).
    pub(super) fn emit(&self, r: &SandboxRecord, kind: EventType, data: Option<serde_json::Value>) {
        let at_us = super::create::start_stamp();
        if let Some(event) = SandboxEvent::of(r, kind, at_us, data) {
            self.journal.queue.push(event);
        }
    }

    /// Waits (a while) until the events queued so far are written.
    pub async fn flush_events(&self) {
        self.journal.queue.flush(FLUSH_WAIT).await
    }

    /// The events written from now on, in order, for webhooks. Bounded: when the reader falls
    /// [`FEED_ROOM`] behind, later events are not delivered (they are still recorded). One
    /// reader only; a second call gets none.
    pub fn webhook_feed(&self) -> Option<mpsc::Receiver<SandboxEvent>> {
        let (feed, events) = mpsc::channel(FEED_ROOM);
        self.journal.feed.set(feed).ok().map(|()| events)
    }

    /// The writer: writes queued events in order, and hourly forgets those past retention.
    /// Runs for the process's life (the events of the last kills at a stop are written too).
    pub fn run_events(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let writer = self.journal.queue.writer();
        let (store, feed) = (self.store.clone(), self.journal.feed.clone());
        async move {
            let Some(mut writer) = writer else {
                return; // another writer runs
            };
            let mut next_purge = tokio::time::Instant::now();
            while let Some(event) = writer.next().await {
                let written = write(&store, &event).await;
                writer.written();
                if let (true, Some(feed)) = (written, feed.get()) {
                    if feed.try_send(event).is_err() {
                        tracing::warn!("webhook deliveries are behind: an event is not delivered");
                    }
                }
                if tokio::time::Instant::now() >= next_purge {
                    next_purge += PURGE_EVERY;
                    let cutoff = chrono::Utc::now().timestamp_micros() - EVENT_RETENTION_US;
                    if let Err(e) = store.events().forget_before(cutoff).await {
                        tracing::warn!(error = %e, "forgetting old sandbox events failed");
                    }
                }
            }
        }
    }
}

/// Writes one event, trying again while the database does not answer; whether it is written.
async fn write(store: &Store, event: &SandboxEvent) -> bool {
    for attempt in 1..=WRITE_ATTEMPTS {
        match store.events().put(event).await {
            Ok(()) => return true,
            Err(e) if attempt < WRITE_ATTEMPTS && e.is_unavailable() => {
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await
            }
            Err(e) => {
                tracing::error!(sandbox = %event.sandbox_id, kind = event.kind.as_str(), error = %e, "recording a lifecycle event failed");
                return false;
            }
        }
    }
    false
}
