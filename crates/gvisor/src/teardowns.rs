//! The sandboxes whose teardown is under way, so that a launch under the same id waits for it
//! instead of failing on its leftovers ("the id is still in use"). That happens when a node
//! takes back a paused sandbox it had let go moments before: the runtime it kept of it (frozen,
//! for a fast resume) is still being destroyed in the background when the restore comes.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Teardowns {
    ids: Mutex<HashSet<String>>,
    ended: Notify,
}

/// A teardown under way; it ends when this is dropped (however the teardown ended).
pub(crate) struct Teardown<'a> {
    teardowns: &'a Teardowns,
    id: String,
}

impl Teardowns {
    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn begin(&self, id: &str) -> Teardown<'_> {
        self.ids().insert(id.to_owned());
        Teardown {
            teardowns: self,
            id: id.to_owned(),
        }
    }

    /// Waits until no teardown of `id` is under way, or `patience` has passed (the launch
    /// then finds the leftovers and fails, as it would have).
    pub(crate) async fn wait_for(&self, id: &str, patience: Duration) {
        let wait = async {
            loop {
                // Made before the check: a teardown that ends between the two still wakes it.
                let ended = self.ended.notified();
                if !self.ids().contains(id) {
                    return;
                }
                ended.await;
            }
        };
        let _ = tokio::time::timeout(patience, wait).await;
    }
}

impl Drop for Teardown<'_> {
    fn drop(&mut self) {
        self.teardowns.ids().remove(&self.id);
        self.teardowns.ended.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[tokio::test]
    async fn a_launch_waits_for_the_teardown_of_its_id_only() {
        let teardowns = Arc::new(Teardowns::default());
        let ending = teardowns.begin("abc");
        let started = Instant::now();
        // Another id does not wait.
        teardowns.wait_for("other", Duration::from_secs(5)).await;
        assert!(started.elapsed() < Duration::from_secs(1));

        let waiter = {
            let teardowns = teardowns.clone();
            tokio::spawn(async move {
                teardowns.wait_for("abc", Duration::from_secs(5)).await;
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !waiter.is_finished(),
            "it waits while the teardown is under way"
        );
        let ended_at = Instant::now();
        drop(ending);
        let woke_at = waiter.await.unwrap();
        assert!(woke_at >= ended_at && woke_at - ended_at < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_teardown_that_never_ends_holds_a_launch_up_only_so_long() {
        let teardowns = Teardowns::default();
        let _stuck = teardowns.begin("abc");
        let started = Instant::now();
        teardowns.wait_for("abc", Duration::from_millis(300)).await;
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}
