//! Time and settings of a sandbox that exists: its deadline, connect, its network settings,
//! and what happens when the deadline passes.

use super::sandbox::{Phase, Sandbox};
use super::{events, now_unix, Lifecycle, LifecycleError};
use crate::egress::Egress;
use crate::store::{EventType, PauseMode};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long an automatic pause that found no disk space waits before it tries again; the
/// sandbox keeps running meanwhile.
const AUTO_PAUSE_RETRY: Duration = Duration::from_secs(60);

/// The least a refresh keeps a sandbox alive for (E2B's `SandboxTimeoutDefault`).
const MIN_REFRESH: Duration = Duration::from_secs(15);

impl Lifecycle {
    /// Sets a running sandbox to expire `timeout` from now (replacing the old deadline).
    pub async fn set_timeout(&self, id: &str, timeout: Duration) -> Result<(), LifecycleError> {
        let timeout = self.clamp_timeout(Some(timeout))?;
        let sandbox = self.find(id)?;
        if sandbox.phase().shown() != Some(crate::store::SandboxState::Running) {
            return Err(LifecycleError::SandboxNotFound(id.to_owned()));
        }
        self.extend(&sandbox, timeout).await
    }

    /// E2B's refresh: a running sandbox lives at least `duration` more (15 s when none or
    /// less is asked, as E2B's), and never less than it already had.
    pub async fn refresh(
        &self,
        id: &str,
        duration: Option<Duration>,
    ) -> Result<(), LifecycleError> {
        let duration = self.clamp_timeout(Some(duration.unwrap_or_default().max(MIN_REFRESH)))?;
        let sandbox = self.find(id)?;
        if sandbox.phase().shown() != Some(crate::store::SandboxState::Running) {
            return Err(LifecycleError::SandboxNotFound(id.to_owned()));
        }
        self.extend_only(&sandbox, duration).await
    }

    /// Moves the deadline to `timeout` from now.
    async fn extend(&self, sandbox: &Sandbox, timeout: Duration) -> Result<(), LifecycleError> {
        let end_at = now_unix() + timeout.as_secs() as i64;
        self.store
            .sandboxes()
            .set_end_at(sandbox.id(), end_at)
            .await?;
        sandbox.update_record(|r| r.end_at = end_at);
        let data = events::timeout_data(end_at);
        self.emit(&sandbox.record(), EventType::Updated, Some(data));
        Ok(())
    }

    /// Moves the deadline to `timeout` from now if that is later.
    async fn extend_only(
        &self,
        sandbox: &Sandbox,
        timeout: Duration,
    ) -> Result<(), LifecycleError> {
        if now_unix() + timeout.as_secs() as i64 > sandbox.record().end_at {
            self.extend(sandbox, timeout).await?;
        }
        Ok(())
    }

    /// E2B's connect: a running sandbox's deadline is moved to `timeout` from now if that is
    /// later (connecting never shortens a sandbox's life); a paused one (or one being paused)
    /// is resumed. Returns the sandbox and whether it was resumed.
    pub async fn connect(
        &self,
        id: &str,
        timeout: Option<Duration>,
        how: PauseMode,
    ) -> Result<(Arc<Sandbox>, bool), LifecycleError> {
        let sandbox = self.find(id)?;
        if matches!(sandbox.phase(), Phase::Running | Phase::Snapshotting) {
            if let Some(t) = timeout {
                self.extend_only(&sandbox, self.clamp_timeout(Some(t))?)
                    .await?;
            }
            return Ok((sandbox, false));
        }
        Ok((self.resume(id, timeout, how).await?, true))
    }

    /// Replaces a sandbox's outbound rules (at once if it runs, at its resume if it is paused)
    /// and, if given, whether its user ports demand the traffic token.
    pub async fn set_network(
        &self,
        id: &str,
        egress: Egress,
        require_traffic_token: Option<bool>,
    ) -> Result<(), LifecycleError> {
        let sandbox = self.find(id)?;
        let Some(_verb) = sandbox.lock_verb().await else {
            return Err(LifecycleError::Busy(id.to_owned()));
        };
        match (sandbox.phase(), sandbox.placement()) {
            (Phase::Running, Some(placement)) => self
                .driver
                .set_egress(placement.slot, &egress)
                .await
                .map_err(LifecycleError::Driver)?,
            (Phase::Paused, _) => {}
            _ => return Err(LifecycleError::SandboxNotFound(id.to_owned())),
        }
        let require = require_traffic_token.unwrap_or(sandbox.record().require_traffic_token);
        self.store
            .sandboxes()
            .set_network(sandbox.id(), &egress, require)
            .await?;
        sandbox.update_record(|r| {
            r.egress = egress;
            r.require_traffic_token = require;
        });
        let record = sandbox.record();
        self.emit(
            &record,
            EventType::Updated,
            Some(events::network_data(&record)),
        );
        Ok(())
    }

    /// Kills (or, when asked for, pauses) every running sandbox whose deadline has passed and
    /// that no verb is working on. Returns how many it started on.
    pub fn reap_expired(self: &Arc<Self>) -> usize {
        let now = now_unix();
        let mut reaped = 0;
        for sandbox in self.sandboxes.all() {
            if sandbox.phase() != Phase::Running || sandbox.record().end_at > now {
                continue;
            }
            let Some(verb) = sandbox.try_lock_verb() else {
                continue; // a verb is at work on it; the next round looks again
            };
            reaped += 1;
            let this = self.clone();
            self.destroying.spawn(async move {
                this.expire(&sandbox).await;
                drop(verb);
            });
        }
        reaped
    }

    /// What the deadline does to a sandbox whose verb lock the caller holds: a pause, if it
    /// asked for one, else a kill. A pause that finds no disk space leaves it running and
    /// tries again later; one refused for any other reason kills it.
    async fn expire(&self, sandbox: &Arc<Sandbox>) {
        let record = sandbox.record();
        if sandbox.phase() != Phase::Running || record.end_at > now_unix() {
            return; // extended or changed while the lock was being taken
        }
        if record.pause_on_timeout {
            tracing::info!(sandbox = %record.id, "timeout reached; pausing");
            match self
                .pause_locked(sandbox, record.timeout_pause, false)
                .await
            {
                Ok(()) => return,
                Err(LifecycleError::NoSpace(why)) => {
                    tracing::warn!(sandbox = %record.id, why, retry_in = ?AUTO_PAUSE_RETRY, "no disk space to pause; the sandbox keeps running");
                    if let Err(e) = self.extend(sandbox, AUTO_PAUSE_RETRY).await {
                        tracing::error!(sandbox = %record.id, error = %e, "moving the deadline failed");
                    }
                    return;
                }
                Err(e) => {
                    tracing::error!(sandbox = %record.id, error = %e, "pausing on timeout failed; killing")
                }
            }
        } else {
            tracing::info!(sandbox = %record.id, "timeout reached; killing");
        }
        let _ = self.stop(sandbox).await;
    }

    /// Runs the expiry loop until `stop` fires; each round also keeps the parked runtimes of
    /// paused sandboxes within their budget, every 40th (10 s) forgets the paused sandboxes
    /// other nodes took over, and every 240th (a minute) tends this node's copies of snapshots
    /// (`snapshot_copies.rs`).
    pub async fn run_reaper(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut rounds = 0u32;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.reap_expired();
                    self.evict_parked();
                    rounds = rounds.wrapping_add(1);
                    if rounds.is_multiple_of(40) {
                        self.forget_taken_over().await;
                    }
                    if rounds.is_multiple_of(240) {
                        // Deleting images takes a while; expiry goes on meanwhile.
                        let lifecycle = self.clone();
                        tokio::spawn(async move { lifecycle.tend_snapshot_copies().await });
                    }
                }
                _ = stop.cancelled() => return,
            }
        }
    }
}
