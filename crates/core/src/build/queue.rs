//! Whose build runs next. Builds run a few at a time (they must not take the cores that
//! running sandboxes need), and the turns are shared fairly between API keys: when a turn
//! frees, it goes to a waiting build of the key with the fewest builds running, and among
//! those of the key whose last turn is longest ago (round robin), its oldest build first. So
//! one key that queues many builds delays another key's build by at most one build per turn,
//! never by its whole queue. Each key may have a bounded number of builds waiting or running.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

pub struct Queue {
    state: Mutex<State>,
    at_once: usize,
    per_key: usize,
}

#[derive(Default)]
struct State {
    /// Builds running, by key.
    running: HashMap<String, usize>,
    /// Builds waiting for a turn, oldest first.
    waiting: VecDeque<Waiter>,
    /// When each key with builds waiting or running last got a turn (a count of turns).
    last_turn: HashMap<String, u64>,
    turns: u64,
}

struct Waiter {
    key: String,
    build: String,
    go: oneshot::Sender<()>,
}

/// A build's place in the queue: [`Queue::join`] hands it out, and [`Place::turn`] waits for
/// the turn. Dropped before its turn came (the build was cancelled), it leaves the queue.
pub struct Place {
    queue: Arc<Queue>,
    key: String,
    build: String,
    /// Told when the turn is this build's; `None` once [`Place::turn`] took it.
    granted: Option<oneshot::Receiver<()>>,
}

/// A running build's turn; dropping it hands the turn on.
pub struct Turn {
    queue: Arc<Queue>,
    key: String,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "this API key already has {0} builds waiting or running, its most (`airlock serve \
     --key-max-builds`); wait for one to end, or cancel one"
)]
pub struct TooManyBuilds(pub usize);

impl Queue {
    pub fn new(at_once: usize, per_key: usize) -> Arc<Self> {
        Arc::new(Queue {
            state: Mutex::default(),
            at_once: at_once.max(1),
            per_key: per_key.max(1),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Builds of `key` waiting or running.
    pub fn of_key(&self, key: &str) -> usize {
        self.state().of_key(key)
    }

    /// Puts build `build` of `key` in line, unless the key has its most already.
    pub fn join(self: &Arc<Self>, key: &str, build: &str) -> Result<Place, TooManyBuilds> {
        let (go, granted) = oneshot::channel();
        {
            let mut state = self.state();
            if state.of_key(key) >= self.per_key {
                return Err(TooManyBuilds(self.per_key));
            }
            state.waiting.push_back(Waiter {
                key: key.to_owned(),
                build: build.to_owned(),
                go,
            });
        }
        self.dispatch();
        Ok(Place {
            queue: self.clone(),
            key: key.to_owned(),
            build: build.to_owned(),
            granted: Some(granted),
        })
    }

    /// Hands free turns to waiting builds, the fewest-running key first.
    fn dispatch(&self) {
        let mut state = self.state();
        while state.running.values().sum::<usize>() < self.at_once {
            let rank = |w: &Waiter| {
                let running = state.running.get(&w.key).copied().unwrap_or(0);
                (running, state.last_turn.get(&w.key).copied().unwrap_or(0))
            };
            let next = (0..state.waiting.len()).min_by_key(|&i| (rank(&state.waiting[i]), i));
            let Some(waiter) = next.and_then(|i| state.waiting.remove(i)) else {
                return;
            };
            if waiter.go.send(()).is_ok() {
                state.turns += 1;
                let turn = state.turns;
                state.last_turn.insert(waiter.key.clone(), turn);
                *state.running.entry(waiter.key).or_default() += 1;
            }
        }
    }

    fn release(&self, key: &str) {
        {
            let mut state = self.state();
            if let Some(n) = state.running.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    state.running.remove(key);
                }
            }
            if state.of_key(key) == 0 {
                state.last_turn.remove(key);
            }
        }
        self.dispatch();
    }
}

impl State {
    fn of_key(&self, key: &str) -> usize {
        let waiting = self.waiting.iter().filter(|w| w.key == key).count();
        waiting + self.running.get(key).copied().unwrap_or(0)
    }
}

impl Place {
    /// Waits for the build's turn.
    pub async fn turn(mut self) -> Turn {
        let granted = self.granted.as_mut().expect("a place is waited on once");
        granted
            .await
            .expect("a waiter leaves the queue only through its place");
        self.granted = None;
        Turn {
            queue: self.queue.clone(),
            key: self.key.clone(),
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.queue.state().waiting.retain(|w| w.build != self.build);
        // The turn may have come just as the build stopped waiting: it goes on at once.
        if self.granted.as_mut().is_some_and(|g| g.try_recv().is_ok()) {
            self.queue.release(&self.key);
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.queue.release(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_turn_goes_to_the_key_with_the_fewest_builds_running() {
        let queue = Queue::new(1, 10);
        let first = queue.join("flood", "f0").unwrap().turn().await;
        let floods: Vec<Place> = (1..5)
            .map(|i| queue.join("flood", &format!("f{i}")).unwrap())
            .collect();
        let other = queue.join("other", "o0").unwrap();
        assert_eq!(queue.of_key("flood"), 5);
        drop(first);
        // The other key's one build goes before the flood's four older ones.
        let turn = tokio::time::timeout(std::time::Duration::from_secs(1), other.turn())
            .await
            .expect("the other key's build got the next turn");
        drop(turn);
        assert_eq!(queue.of_key("other"), 0);
        drop(floods);
        assert_eq!(queue.of_key("flood"), 0);
    }

    #[tokio::test]
    async fn a_key_has_a_bounded_number_of_builds_and_a_left_place_frees_one() {
        let queue = Queue::new(1, 2);
        let running = queue.join("k", "a").unwrap().turn().await;
        let waiting = queue.join("k", "b").unwrap();
        assert!(matches!(queue.join("k", "c"), Err(TooManyBuilds(2))));
        assert!(
            queue.join("other", "x").is_ok(),
            "another key is not held up"
        );
        drop(waiting);
        let again = queue.join("k", "c").unwrap();
        drop(running);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), again.turn())
            .await
            .expect("the turn passed on");
    }
}
