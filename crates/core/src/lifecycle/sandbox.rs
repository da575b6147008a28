//! One sandbox, and the one place its state lives: its phase, its record, where it runs, and
//! the token that cuts its open streams when it stops running here.
//!
//! ```text
//!            admit                 pause                 (kill)
//!  Starting ──────▶ Running ──────────▶ Pausing ──▶ Paused ──────▶ Stopping ──▶ gone
//!     │               ▲  │ ▲                │          │  ▲
//!     │ (failed)      │  │ └─ Snapshotting ◀┘(failed)  │  └──── (failed) ─┐
//!     ▼               │  └──────────────────────────────── resume ─▶ Resuming
//!    gone             └──────────────────────────────────────────────────────┘
//! ```
//!
//! Every verb that changes a sandbox holds its verb lock for as long as it works on it, so
//! verbs on one sandbox run one at a time, and a verb that finds another at work waits for it
//! (up to a limit) instead of polling. Phases are what everyone else reads: the proxy forwards
//! only to a `Running` sandbox, the API shows `Starting` and `Stopping` ones to nobody, and
//! admission counts the phases that hold a place among the running.

use crate::driver::{DriverError, Placement};
use crate::egress::Egress;
use crate::ids::SandboxId;
use crate::store::{SandboxRecord, SandboxState};
use airlock_wire::logs::LogEntry;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Admitted by a create, not yet handed to its owner.
    Starting,
    Running,
    /// Being saved to disk; its traffic is cut.
    Pausing,
    /// On disk, holding no runtime.
    Paused,
    /// Being restored from disk.
    Resuming,
    /// Being saved as a snapshot; it runs on afterwards, and traffic waits until then.
    Snapshotting,
    /// Killed: gone for every caller, its host resources going in the background.
    Stopping,
}

impl Phase {
    /// Whether it takes a place among the running (what admission counts).
    pub fn occupies(self) -> bool {
        matches!(
            self,
            Phase::Starting
                | Phase::Running
                | Phase::Pausing
                | Phase::Resuming
                | Phase::Snapshotting
        )
    }

    /// What the API shows it as; `None` for a sandbox it does not show at all.
    pub fn shown(self) -> Option<SandboxState> {
        match self {
            Phase::Running | Phase::Pausing | Phase::Snapshotting => Some(SandboxState::Running),
            Phase::Paused | Phase::Resuming => Some(SandboxState::Paused),
            Phase::Starting | Phase::Stopping => None,
        }
    }
}

/// A running or paused sandbox.
pub struct Sandbox {
    id: SandboxId,
    /// The API key that owns it; `None` for sandboxes from before keys had owners.
    owner: Option<String>,
    /// Its access token, which never changes (a copy of it gets its own id and token).
    access_token: Option<Arc<str>>,
    /// Held by the verb at work on it.
    verb: Arc<tokio::sync::Mutex<()>>,
    state: Mutex<State>,
    /// Woken at every phase change.
    changed: Notify,
}

struct State {
    phase: Phase,
    record: Arc<SandboxRecord>,
    /// Where it runs, while it does.
    placement: Option<Placement>,
    /// Fired when it stops running here (killed, paused, or saved for a snapshot), so open
    /// proxied streams are cut; replaced each time it runs again.
    stopped: CancellationToken,
    /// Its log as it was when it was paused (its agent, which holds it, is then on disk).
    paused_log: Arc<[LogEntry]>,
    activity: Activity,
    /// While paused: its runtime, frozen and kept so that its resume is a thaw (see
    /// `parking.rs`).
    parked: Option<Parked>,
}

/// A paused sandbox's runtime, kept frozen where it ran.
#[derive(Debug, Clone)]
pub(super) struct Parked {
    pub placement: Placement,
    /// The outbound rules its slot holds (the sandbox's may change while it is paused).
    pub egress: Egress,
    pub since: Instant,
}

/// What the freezer goes by: a running sandbox's traffic, and whether it is frozen.
struct Activity {
    /// Requests and proxied streams to it open now.
    in_flight: u32,
    /// Bumped at every start and end of traffic: a freeze decided before is dropped.
    generation: u64,
    /// Since when nothing has been in flight.
    quiet_since: Instant,
    /// Its agent said something runs: not asked again before this.
    next_check: Instant,
    frozen: bool,
}

impl Activity {
    fn new() -> Self {
        let now = Instant::now();
        Activity {
            in_flight: 0,
            generation: 0,
            quiet_since: now,
            next_check: now,
            frozen: false,
        }
    }
}

/// Traffic to a sandbox, counted from [`Sandbox::wake`] until it is dropped: the sandbox is
/// not frozen meanwhile.
pub struct Awake {
    sandbox: Arc<Sandbox>,
}

impl Drop for Awake {
    fn drop(&mut self) {
        let mut state = self.sandbox.state();
        let activity = &mut state.activity;
        activity.in_flight = activity.in_flight.saturating_sub(1);
        activity.generation += 1;
        activity.quiet_since = Instant::now();
    }
}

/// How long a verb waits for another one on the same sandbox.
const VERB_WAIT: Duration = Duration::from_secs(60);

impl Sandbox {
    pub(super) fn new(
        record: SandboxRecord,
        phase: Phase,
        placement: Option<Placement>,
    ) -> Arc<Self> {
        Arc::new(Sandbox {
            id: record.id.clone(),
            owner: record.owner.clone(),
            access_token: record.access_token.as_deref().map(Arc::from),
            verb: Arc::default(),
            state: Mutex::new(State {
                phase,
                record: Arc::new(record),
                placement,
                stopped: CancellationToken::new(),
                paused_log: Arc::new([]),
                activity: Activity::new(),
                parked: None,
            }),
            changed: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    pub fn access_token(&self) -> Option<Arc<str>> {
        self.access_token.clone()
    }

    pub fn phase(&self) -> Phase {
        self.state().phase
    }

    /// Its record as it stands (shared, not copied).
    pub fn record(&self) -> Arc<SandboxRecord> {
        self.state().record.clone()
    }

    /// Where it runs, if it does.
    pub fn placement(&self) -> Option<Placement> {
        self.state().placement
    }

    /// Where its agent answers, if it runs.
    pub fn agent(&self) -> Option<Ipv4Addr> {
        self.placement().map(|p| p.agent)
    }

    /// Its log as it was when it was paused; empty unless it is paused, or if the server has
    /// restarted since.
    pub fn paused_log(&self) -> Arc<[LogEntry]> {
        self.state().paused_log.clone()
    }

    pub(super) fn keep_paused_log(&self, log: Vec<LogEntry>) {
        self.state().paused_log = log.into();
    }

    /// Keeps a paused sandbox's frozen runtime.
    pub(super) fn park(&self, parked: Parked) {
        self.state().parked = Some(parked);
    }

    /// Takes its parked runtime, if it has one: the caller resumes or destroys it.
    pub(super) fn take_parked(&self) -> Option<Parked> {
        self.state().parked.take()
    }

    /// Since when its runtime has been parked, if it is.
    pub(super) fn parked_since(&self) -> Option<Instant> {
        self.state().parked.as_ref().map(|p| p.since)
    }

    /// Resolves when it stops running here (killed, paused or saved), as it runs now.
    pub fn stopped(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.state().stopped.clone().cancelled_owned()
    }

    /// Waits for the next phase change, at most `within`.
    pub async fn changes(&self, within: Duration) {
        let _ = tokio::time::timeout(within, self.changed.notified()).await;
    }

    /// Changes its record (under its state lock; the record is replaced, never edited in
    /// place, so readers keep a consistent copy).
    pub(super) fn update_record(&self, change: impl FnOnce(&mut SandboxRecord)) {
        let mut state = self.state();
        let mut record = (*state.record).clone();
        change(&mut record);
        state.record = Arc::new(record);
    }

    /// Moves it to `phase`; with `placement`, it runs there from now on (a fresh `stopped`
    /// token), without, it runs nowhere (its streams are cut).
    pub(super) fn set_phase(&self, phase: Phase, placement: Option<Placement>) {
        {
            let mut state = self.state();
            let running_before = state.placement.is_some();
            match placement {
                Some(_) if !running_before || state.stopped.is_cancelled() => {
                    state.stopped = CancellationToken::new();
                    state.paused_log = Arc::new([]);
                }
                Some(_) => {}
                None => state.stopped.cancel(),
            }
            if state.placement != placement {
                // Not running, or running anew (restored): awake either way. Traffic in flight
                // stays counted: its guards are dropped later.
                state.activity.frozen = false;
                state.activity.quiet_since = Instant::now();
            }
            state.phase = phase;
            state.placement = placement;
            let slot = placement.map(|p| p.slot);
            if state.record.slot != slot {
                let mut record = (*state.record).clone();
                record.slot = slot;
                record.state = if placement.is_some() {
                    SandboxState::Running
                } else {
                    SandboxState::Paused
                };
                state.record = Arc::new(record);
            }
        }
        self.changed.notify_waiters();
    }

    /// Moves it to `phase` where it is (a step that changes neither where it runs nor its
    /// streams).
    pub(super) fn enter(&self, phase: Phase) {
        self.state().phase = phase;
        self.changed.notify_waiters();
    }

    /// Cuts its open streams (it is about to be saved); it keeps running until told otherwise.
    pub(super) fn cut_streams(&self) {
        self.state().stopped.cancel();
    }

    /// Counts traffic to it until the guard is dropped, thawing it first with `thaw` if it is
    /// frozen. A failed thaw is logged: the traffic then fails as it would for any sandbox
    /// that does not answer.
    pub(super) fn wake(self: &Arc<Self>, thaw: impl FnOnce() -> Result<(), DriverError>) -> Awake {
        let mut state = self.state();
        let activity = &mut state.activity;
        if activity.frozen {
            match thaw() {
                Ok(()) => activity.frozen = false,
                Err(e) => tracing::warn!(id = %self.id, error = %e, "thawing failed"),
            }
        }
        activity.in_flight += 1;
        activity.generation += 1;
        Awake {
            sandbox: self.clone(),
        }
    }

    /// Whether it is frozen now.
    pub(super) fn is_frozen(&self) -> bool {
        self.state().activity.frozen
    }

    /// Its traffic generation, if it runs, is awake, has had nothing in flight for `quiet_for`
    /// and is due to be asked whether anything in it runs.
    pub(super) fn freeze_candidate(&self, quiet_for: Duration) -> Option<u64> {
        let state = self.state();
        let activity = &state.activity;
        let now = Instant::now();
        (state.phase == Phase::Running
            && !activity.frozen
            && activity.in_flight == 0
            && now >= activity.quiet_since + quiet_for
            && now >= activity.next_check)
            .then_some(activity.generation)
    }

    /// Freezes it with `freeze` if it still runs and no traffic came or went since
    /// `generation`. Whether it froze.
    pub(super) fn freeze_if_quiet(
        &self,
        generation: u64,
        freeze: impl FnOnce() -> Result<(), DriverError>,
    ) -> Result<bool, DriverError> {
        let mut state = self.state();
        if state.phase != Phase::Running || state.activity.generation != generation {
            return Ok(false);
        }
        freeze()?;
        state.activity.frozen = true;
        Ok(true)
    }

    /// Something in it runs: it is not asked again for `delay`.
    pub(super) fn check_again_in(&self, delay: Duration) {
        self.state().activity.next_check = Instant::now() + delay;
    }

    /// Takes the verb lock if no verb is at work.
    pub(super) fn try_lock_verb(&self) -> Option<OwnedMutexGuard<()>> {
        self.verb.clone().try_lock_owned().ok()
    }

    /// Takes the verb lock, waiting for the verb at work (up to a limit). `None`: another verb
    /// held it all that time.
    pub(super) async fn lock_verb(&self) -> Option<OwnedMutexGuard<()>> {
        tokio::time::timeout(VERB_WAIT, self.verb.clone().lock_owned())
            .await
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Resources;
    use crate::egress::Egress;
    use crate::ids::TemplateName;

    fn record() -> SandboxRecord {
        SandboxRecord {
            id: SandboxId::parse("abc").unwrap(),
            template: TemplateName::parse("base").unwrap(),
            rootfs: "/t".into(),
            state: SandboxState::Running,
            slot: Some(3),
            access_token: Some("tok".into()),
            metadata: Default::default(),
            env_vars: Default::default(),
            started_at_us: 0,
            end_at: 0,
            resources: Resources {
                cpu_count: 1,
                memory_mb: 1,
                disk_mb: 1,
            },
            pause_on_timeout: false,
            timeout_pause: Default::default(),
            pause_mode: None,
            auto_resume: false,
            owner: Some("k1".into()),
            egress: Egress::default(),
            traffic_access_token: None,
            require_traffic_token: false,
            volume_mounts: Vec::new(),
            node: "n1".into(),
        }
    }

    #[tokio::test]
    async fn stopping_cuts_streams_and_running_again_gives_a_fresh_token() {
        let placement = Placement {
            slot: 3,
            agent: Ipv4Addr::new(10, 77, 0, 14),
        };
        let sandbox = Sandbox::new(record(), Phase::Running, Some(placement));
        let streams = sandbox.stopped();
        sandbox.set_phase(Phase::Paused, None);
        streams.await;
        assert_eq!(sandbox.record().slot, None);
        assert_eq!(sandbox.record().state, SandboxState::Paused);
        assert_eq!(sandbox.phase().shown(), Some(SandboxState::Paused));

        let moved = Placement {
            slot: 9,
            ..placement
        };
        sandbox.set_phase(Phase::Running, Some(moved));
        assert_eq!(sandbox.record().slot, Some(9));
        let fresh = sandbox.stopped();
        let cut = tokio::time::timeout(Duration::from_millis(20), fresh).await;
        assert!(cut.is_err(), "the new incarnation's streams are not cut");
    }

    #[tokio::test]
    async fn verbs_take_turns() {
        let sandbox = Sandbox::new(record(), Phase::Running, None);
        let first = sandbox.lock_verb().await.unwrap();
        let waiting = {
            let sandbox = sandbox.clone();
            tokio::spawn(async move { sandbox.lock_verb().await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "the second verb waits");
        drop(first);
        assert!(waiting.await.unwrap());
    }
}
