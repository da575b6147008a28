//! One Jupyter kernel process and our client side of its ZeroMQ channels.
//!
//! The kernel runs as its context's user in its own process group, from a connection
//! file we write (random loopback ports, HMAC-SHA256 key). Messages are signed and verified by
//! `jupyter-zmq-client`; their content is read as raw JSON so every MIME type and field a kernel
//! sends reaches the client as it was. A task per channel forwards decoded messages into bounded
//! queues, which the execution loop selects on together with the process's exit, the client's
//! disconnect and its timers.
//!
//! `launch` starts a kernel, `execute` runs code in it; `process` holds the pieces that clean up
//! after it, `run_state` what one run has seen.

mod execute;
mod launch;
mod process;
mod run_state;

use process::{exited, AbortOnDrop, ConnectionDir, GroupGuard, KernelMessage, PortLease};
pub use process::{KillReason, KillSwitch};

use super::envcode::{self, EnvState};
use super::kernelspec::{Dialect, Kernelspec};
use jupyter_protocol::{ExecuteRequest, InterruptRequest, JupyterMessage, ShutdownRequest};
use jupyter_zmq_client::DealerSendConnection;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

/// How long a kernel may take to answer its first `kernel_info_request`. Kernels under gVisor
/// are slow to import their libraries.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a hidden env snippet may take.
const HIDDEN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{0}")]
    Setup(String),
    #[error("cannot start kernel '{name}' ({program}): {source}")]
    Spawn {
        name: String,
        program: String,
        source: std::io::Error,
    },
    #[error("kernel '{name}' exited while starting ({status}){stderr}")]
    ExitedEarly {
        name: String,
        status: String,
        stderr: String,
    },
    #[error("kernel '{name}' did not become ready within {} s", READY_TIMEOUT.as_secs())]
    Timeout { name: String },
    #[error("kernel channel: {0}")]
    Channel(#[from] jupyter_zmq_client::RuntimeError),
    #[error("the kernel exited")]
    Died,
}

/// How one execution ended, for the context that owns the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// The kernel is idle again and keeps its state.
    Done,
    /// The kernel is gone (crash, restart, delete): the context needs a new one.
    KernelGone,
}

/// A running kernel.
pub struct Kernel {
    spec: Kernelspec,
    /// The agent's identity generation its random state belongs to (see [`reseed_snippet`]).
    identity: u64,
    switch: Arc<KillSwitch>,
    exit: watch::Receiver<Option<String>>,
    shell: DealerSendConnection,
    control: DealerSendConnection,
    shell_rx: mpsc::Receiver<KernelMessage>,
    iopub_rx: mpsc::Receiver<KernelMessage>,
    env: EnvState,
    _readers: Vec<AbortOnDrop>,
    // Declared last so the process group dies after the sockets close.
    _dir: ConnectionDir,
    _group: GroupGuard,
    _ports: PortLease,
}

impl Kernel {
    pub fn switch(&self) -> Arc<KillSwitch> {
        self.switch.clone()
    }

    pub fn is_alive(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// Interrupts the running execution, as the kernelspec asks.
    async fn interrupt(&mut self) {
        if self.spec.interrupt_by_message() {
            if let Err(e) = self.control.send(InterruptRequest {}.into()).await {
                tracing::warn!("sending interrupt_request: {e}");
            }
        } else if let Err(e) = killpg(Pid::from_raw(self.switch.pgid), Signal::SIGINT) {
            tracing::warn!("interrupting kernel {}: {e}", self.switch.pgid);
        }
    }

    /// Asks the kernel to exit, then kills what is left of its process group.
    pub async fn shutdown(mut self) {
        if self.is_alive() {
            let _ = self
                .control
                .send(ShutdownRequest { restart: false }.into())
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(2), exited(&mut self.exit)).await;
        }
    }

    /// Runs code silently (no output, no history, execution counter unchanged).
    async fn run_hidden(&mut self, code: String) -> Result<(), KernelError> {
        let request: JupyterMessage = ExecuteRequest {
            code,
            silent: true,
            store_history: false,
            user_expressions: None,
            allow_stdin: false,
            stop_on_error: false,
        }
        .into();
        let msg_id = request.header.msg_id.clone();
        tracing::trace!("shell -> hidden execute_request {msg_id}");
        self.shell.send(request).await?;
        let deadline = Instant::now() + HIDDEN_TIMEOUT;
        loop {
            tokio::select! {
                Some(m) = self.shell_rx.recv() => {
                    if m.is_child_of(&msg_id) && m.msg_type == "execute_reply" {
                        if m.str("status") != Some("ok") {
                            tracing::warn!(
                                "hidden snippet failed in kernel '{}': {} {}",
                                self.spec.name,
                                m.str("ename").unwrap_or_default(),
                                m.str("evalue").unwrap_or_default()
                            );
                        }
                        return Ok(());
                    }
                }
                _ = exited(&mut self.exit) => return Err(KernelError::Died),
                _ = sleep_until(deadline) => {
                    tracing::warn!("hidden snippet timed out in kernel '{}'", self.spec.name);
                    return Ok(());
                }
            }
        }
    }

    /// Applies `changes` with a hidden snippet; false if the kernel died meanwhile.
    async fn apply_env(&mut self, changes: &envcode::Changes) -> bool {
        let Some(code) = envcode::snippet(self.spec.dialect(), changes) else {
            return true;
        };
        match self.run_hidden(code).await {
            Ok(()) => true,
            Err(KernelError::Died) => false,
            Err(e) => {
                tracing::warn!("setting env vars in kernel '{}': {e}", self.spec.name);
                true
            }
        }
    }

    /// Renews the random state the kernel may share with copies of the same checkpoint, once per
    /// identity generation; false if the kernel died meanwhile.
    pub async fn reseed(&mut self, identity: u64) -> bool {
        if identity <= self.identity {
            return true;
        }
        if let Some(code) = reseed_snippet(self.spec.dialect()) {
            match self.run_hidden(code.to_owned()).await {
                Ok(()) => {}
                Err(KernelError::Died) => return false,
                Err(e) => tracing::warn!("reseeding kernel '{}': {e}", self.spec.name),
            }
        }
        self.identity = identity;
        true
    }

    /// Reverts a run's own env vars.
    pub async fn restore_env(&mut self, per_run: &BTreeMap<String, String>) {
        if !per_run.is_empty() {
            let changes = self.env.after(per_run);
            self.apply_env(&changes).await;
        }
    }
}

/// Code that reseeds a kernel's random generators from the OS, for a kernel that started before
/// the checkpoint its sandbox was restored from: every restored copy would otherwise produce the
/// same "random" numbers. Python's `random` and NumPy's legacy global generator are reseeded if
/// they are loaded (`numpy.random.default_rng()` and `secrets` draw fresh OS entropy anyway); the
/// lambda leaves no names behind in the user's namespace. Other dialects get nothing: only the
/// Python kernel starts before a checkpoint (see `contexts::PREWARMED`); Deno's `Math.random`
/// could not be reseeded anyway.
fn reseed_snippet(dialect: Dialect) -> Option<&'static str> {
    match dialect {
        Dialect::Python => Some(
            "(lambda m: [m[k].seed() for k in ('random', 'numpy.random') if k in m])\
             (__import__('sys').modules)",
        ),
        Dialect::Bash | Dialect::Deno | Dialect::Node | Dialect::R | Dialect::Other => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reseeds_python_only() {
        for other in [
            Dialect::Bash,
            Dialect::Deno,
            Dialect::Node,
            Dialect::R,
            Dialect::Other,
        ] {
            assert_eq!(reseed_snippet(other), None);
        }
        let code = reseed_snippet(Dialect::Python).unwrap();
        assert!(!code.contains('\n'));
        // The same seed twice gives the same number, unless the snippet reseeded in between; and
        // the namespace is unchanged.
        let script = format!(
            "import random\n\
             random.seed(1); first = random.random(); random.seed(1)\n\
             names = None; names = set(globals())\n\
             {code}\n\
             assert set(globals()) == names, set(globals()) ^ names\n\
             assert random.random() != first\n"
        );
        let Ok(out) = std::process::Command::new("python3")
            .args(["-c", &script])
            .output()
        else {
            return; // no Python on this machine
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
