//! Back-pressure on launches: at most `slots` sandboxes are being restored or booted at once
//! (a `runsc restore` or `runsc run`, until the agent answers), and the rest wait their turn.
//!
//! Why: a launch is CPU-bound (a restore is ~0.3 s of CPU), and 100 launches at once on 2 cores
//! each got 1/50 of a core, so every one of them ran past its agent's 20 s and runsc's 60 s and
//! failed. Taking turns keeps each launch at full speed, so the machine's rate holds under any
//! overload, and the server's own API (which the launches no longer starve) keeps answering.
//!
//! Two turns: a user's launch (a create or a resume) waits in arrival order, and is refused at
//! once (429, with a `Retry-After`) when the launches queued ahead of it would take longer than
//! `max_wait`: `ceil(ahead / slots) × mean launch time`, `ahead` counting itself. A background
//! launch (a pool refill, a golden image) never goes before a user's: it waits until no user's
//! launch does, and is never refused.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Whose launch it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// A create or a resume that a caller waits for.
    User,
    /// Work nobody waits for: a pool refill, a golden image.
    Background,
}

/// What a launch is assumed to take before one has been measured.
const FIRST_GUESS: Duration = Duration::from_secs(1);

/// Refused: the launches queued ahead would take longer than the create may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Overloaded {
    /// What the queue ahead is expected to take: when to try again.
    pub expected_wait: Duration,
}

pub(super) struct Launches {
    slots: usize,
    max_wait: Duration,
    state: Mutex<State>,
}

struct State {
    /// Launches under way.
    running: usize,
    /// Waiting users, oldest first, then waiting background work, oldest first.
    users: VecDeque<Waiter>,
    background: VecDeque<Waiter>,
    next_ticket: u64,
    /// A moving mean of how long a launch holds its place (`None` until one has ended).
    mean: Option<Duration>,
}

struct Waiter {
    ticket: u64,
    /// Told when the place is its own (already counted in `running`).
    granted: oneshot::Sender<()>,
}

/// A place among the launches under way; given back when dropped.
pub(super) struct LaunchPermit<'a> {
    launches: &'a Launches,
    since: Instant,
}

impl Drop for LaunchPermit<'_> {
    fn drop(&mut self) {
        let mut state = self.launches.lock();
        let took = self.since.elapsed();
        // A mean over the last few launches: it follows the host's load within a few seconds.
        state.mean = Some(match state.mean {
            None => took,
            Some(mean) => (mean * 4 + took) / 5,
        });
        state.running -= 1;
        self.launches.hand_on(&mut state);
    }
}

/// A waiter's place in its queue, while it waits. Dropped unanswered (its caller went away),
/// it leaves the queue, or gives back the place it was granted meanwhile.
struct InQueue<'a> {
    launches: &'a Launches,
    ticket: u64,
    /// Owned here, so that it outlives the check in `drop`: a grant is either seen there or
    /// never sent.
    granted: oneshot::Receiver<()>,
    done: bool,
}

impl Drop for InQueue<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.launches.lock();
        let before = state.users.len() + state.background.len();
        state.users.retain(|w| w.ticket != self.ticket);
        state.background.retain(|w| w.ticket != self.ticket);
        if state.users.len() + state.background.len() == before {
            // It was no longer queued: the place had been granted to it.
            state.running -= 1;
            self.launches.hand_on(&mut state);
        }
    }
}

impl Launches {
    pub fn new(slots: usize, max_wait: Duration) -> Self {
        Launches {
            slots: slots.max(1),
            max_wait,
            state: Mutex::new(State {
                running: 0,
                users: VecDeque::new(),
                background: VecDeque::new(),
                next_ticket: 0,
                mean: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Grants free places to the waiters, users first.
    fn hand_on(&self, state: &mut State) {
        while state.running < self.slots {
            let Some(next) = state
                .users
                .pop_front()
                .or_else(|| state.background.pop_front())
            else {
                return;
            };
            state.running += 1;
            if next.granted.send(()).is_err() {
                // Its waiter is gone without leaving the queue (it cannot: it leaves under
                // this lock); the place goes to the next.
                state.running -= 1;
            }
        }
    }

    /// Waits for a place to launch in, in `turn`'s queue; a user's launch is refused at once
    /// when the wait would pass `max_wait`.
    pub async fn acquire(&self, turn: Turn) -> Result<LaunchPermit<'_>, Overloaded> {
        let (ticket, granted) = {
            let mut state = self.lock();
            let ahead_of_background = turn == Turn::User || state.background.is_empty();
            if state.running < self.slots && state.users.is_empty() && ahead_of_background {
                state.running += 1;
                return Ok(self.permit());
            }
            if turn == Turn::User {
                let expected_wait = self.expected_wait(&state, state.users.len() + 1);
                if expected_wait > self.max_wait {
                    return Err(Overloaded { expected_wait });
                }
            }
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            let (tx, rx) = oneshot::channel();
            let waiter = Waiter {
                ticket,
                granted: tx,
            };
            match turn {
                Turn::User => state.users.push_back(waiter),
                Turn::Background => state.background.push_back(waiter),
            }
            (ticket, rx)
        };
        let mut in_queue = InQueue {
            launches: self,
            ticket,
            granted,
            done: false,
        };
        // The sender lives in the queue until it is granted, so this only fails if the
        // queue was dropped, which the borrow of `self` rules out.
        let _ = (&mut in_queue.granted).await;
        in_queue.done = true;
        Ok(self.permit())
    }

    fn permit(&self) -> LaunchPermit<'_> {
        LaunchPermit {
            launches: self,
            since: Instant::now(),
        }
    }

    /// What `ahead` launches queued before one (itself included) are expected to take.
    fn expected_wait(&self, state: &State, ahead: usize) -> Duration {
        let rounds = ahead.div_ceil(self.slots) as u32;
        state.mean.unwrap_or(FIRST_GUESS) * rounds
    }

    /// Whether a launch now would take a place no user's launch waits for: pools fill only
    /// then, so that a burst of creates has the cores.
    pub fn idle(&self) -> bool {
        let state = self.lock();
        state.running < self.slots && state.users.is_empty()
    }

    /// Launches under way, and users' launches waiting.
    pub fn load(&self) -> (usize, usize) {
        let state = self.lock();
        (state.running, state.users.len())
    }
}
