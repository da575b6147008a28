//! A template's start command: started in the background when a sandbox of the template boots,
//! then waited for by re-running its ready command until that exits 0 (E2B's `startCmd` and
//! `readyCmd`). Golden images are taken only after that, so a sandbox restored from one starts
//! with the command already running and answering.

use super::{AgentCommand, Lifecycle, LifecycleError, OutputLine, Program};
use crate::store::TemplateDefaults;
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// E2B's ready command for a start command that names none: give it 20 seconds.
const DEFAULT_READY_CMD: &str = "sleep 20";
/// Pause between two runs of a ready command that has not succeeded yet.
const READY_INTERVAL: Duration = Duration::from_millis(200);
/// Lines of the start command's output kept for the error when it fails.
const TAIL_LINES: usize = 20;

impl Lifecycle {
    /// Runs the template's start command in the freshly booted sandbox at `addr` (whose agent
    /// holds `access_token`, if any), as the template's user, and returns once its ready
    /// command succeeds. The command keeps running after that: the agent owns it, not this
    /// call.
    pub(super) async fn run_start_command(
        &self,
        addr: Ipv4Addr,
        access_token: Option<Arc<str>>,
        defaults: &TemplateDefaults,
    ) -> Result<(), LifecycleError> {
        let ready = match (&defaults.start_cmd, &defaults.ready_cmd) {
            (None, None) => return Ok(()),
            (_, Some(ready)) => ready.as_str(),
            (Some(_), None) => DEFAULT_READY_CMD,
        };
        let within = self.limits.ready_timeout;
        let deadline = Instant::now() + within;
        let command = |shell: &str, timeout: Duration, logged: bool| AgentCommand {
            program: Program::Shell(shell.to_owned()),
            user: defaults.user.clone(),
            cwd: defaults.workdir.clone(),
            envs: defaults.env.clone(),
            timeout,
            logged,
            access_token: access_token.clone(),
        };
        let mut tail = VecDeque::with_capacity(TAIL_LINES);
        let mut last_ready = None;
        let outcome = {
            let mut keep = |line: OutputLine| {
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line.text);
            };
            let start = async {
                match &defaults.start_cmd {
                    // Outlives the wait: the deadline below is what ends it.
                    Some(start) => {
                        let outlive = within * 2;
                        self.agent
                            .run(addr, &command(start, outlive, true), &mut keep)
                            .await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(start);
            let mut start_ended = false;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Err(format!("did not become ready within {within:?}"));
                }
                let probe = async {
                    let code = self
                        .agent
                        .run(addr, &command(ready, left, false), &mut |_| {})
                        .await;
                    if code != Ok(0) {
                        tokio::time::sleep(READY_INTERVAL).await;
                    }
                    code
                };
                tokio::select! {
                    ended = &mut start, if !start_ended => match ended {
                        // A start command may be done once it has set things up.
                        Ok(0) => start_ended = true,
                        Ok(code) => break Err(format!("exited with code {code}")),
                        Err(e) => break Err(e),
                    },
                    code = probe => match code {
                        Ok(0) => break Ok(()),
                        code => last_ready = Some(code),
                    },
                }
            }
        };
        outcome.map_err(|why| {
            let start = defaults.start_cmd.as_deref().unwrap_or("(none)");
            let last = match last_ready {
                Some(Ok(code)) => format!("; the ready command last exited with code {code}"),
                Some(Err(e)) => format!("; the ready command last failed: {e}"),
                None => String::new(),
            };
            let output: Vec<String> = tail.into_iter().collect();
            LifecycleError::StartCommand(format!(
                "the start command `{start}` {why} (ready command `{ready}`{last}); its last \
                 output:\n{}",
                output.join("\n")
            ))
        })
    }
}
