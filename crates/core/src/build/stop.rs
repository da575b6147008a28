//! Why a build stops before its end: its owner cancelled it, or it ran past the server's
//! deadline for a whole build (pulls, steps and the golden image together). A build looks at
//! its [`Stop`] where stopping leaves nothing behind: while it waits for its turn, between
//! steps, during a pull, and while a step's sandbox runs (the sandbox is then destroyed and the
//! step's writes thrown away).

use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct Stop {
    cancelled: CancellationToken,
    deadline: Instant,
    timeout: Duration,
}

impl Stop {
    /// A stop that comes `timeout` after the build's turn comes (see [`Stop::started`]) or at
    /// a cancel.
    pub fn new(timeout: Duration) -> Self {
        Stop {
            cancelled: CancellationToken::new(),
            deadline: Instant::now() + timeout,
            timeout,
        }
    }

    /// The build got its turn: the deadline counts from now.
    pub fn started(&mut self) {
        self.deadline = Instant::now() + self.timeout;
    }

    pub fn cancel(&self) {
        self.cancelled.cancel();
    }

    /// Why the build must stop now, if it must.
    pub fn reason(&self) -> Option<String> {
        if self.cancelled.is_cancelled() {
            Some(CANCELLED.into())
        } else if Instant::now() >= self.deadline {
            Some(self.past_deadline())
        } else {
            None
        }
    }

    /// Waits until the build must stop; says why.
    pub async fn stopped(&self) -> String {
        tokio::select! {
            () = self.cancelled.cancelled() => CANCELLED.into(),
            () = tokio::time::sleep_until(self.deadline) => self.past_deadline(),
        }
    }

    /// Waits for a cancel only (before its turn a build has no deadline running).
    pub async fn cancelled(&self) {
        self.cancelled.cancelled().await
    }

    fn past_deadline(&self) -> String {
        format!(
            "the build took longer than the {} s a build may take (`airlock serve \
             --build-timeout-secs`), so it was stopped",
            self.timeout.as_secs()
        )
    }
}

pub const CANCELLED: &str = "the build was cancelled";

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stop_comes_at_a_cancel_or_at_the_deadline() {
        let mut stop = Stop::new(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.started();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(stop.reason(), None, "the deadline counts from the turn");
        let reason = stop.stopped().await;
        assert!(reason.contains("longer than the 0 s"), "{reason}");
        let stop = Stop::new(Duration::from_secs(60));
        stop.clone().cancel();
        assert_eq!(stop.stopped().await, CANCELLED);
        assert_eq!(stop.reason().as_deref(), Some(CANCELLED));
    }
}
