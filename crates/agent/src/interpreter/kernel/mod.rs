//! One Jupyter kernel process and our client side of its ZeroMQ channels.
//!
//! The kernel runs as the sandbox's default user in its own process group, from a connection
//! file we write (random loopback ports, HMAC-SHA256 key). Messages are signed and verified by
//! `jupyter-zmq-client`; their content is read as raw JSON so every MIME type and field a kernel
//! sends reaches the client as it was. A task per channel forwards decoded messages into bounded
//! queues, which the execution loop selects on together with the process's exit, the client's
//! disconnect and its timers.

mod process;
mod run_state;

pub use process::KillSwitch;
use process::{
    describe_exit, exited, lease_ports, pump, AbortOnDrop, ConnectionDir, GroupGuard,
    KernelMessage, PortLease,
};
use run_state::RunState;

use super::envcode::{self, EnvState};
use super::events::{self, Event, Output};
use super::kernelspec::{Dialect, Kernelspec};
use crate::users::User;
use jupyter_protocol::{
    ConnectionInfo, ExecuteRequest, InterruptRequest, JupyterMessage, KernelInfoRequest,
    ShutdownRequest, Transport,
};
use jupyter_zmq_client::DealerSendConnection;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

/// How long a kernel may take to answer its first `kernel_info_request`. Kernels under gVisor
/// are slow to import their libraries.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a hidden env snippet may take.
const HIDDEN_TIMEOUT: Duration = Duration::from_secs(30);
/// IOPub messages buffered before the channel's reader waits for the execution loop.
const IOPUB_DEPTH: usize = 1024;
const SHELL_DEPTH: usize = 64;
/// Bytes of the kernel's own stderr kept, to explain a kernel that fails to start.
const STDERR_TAIL: usize = 8 * 1024;
/// After a disconnect: interrupt again after this long without going idle...
const INTERRUPT_RETRY: Duration = Duration::from_secs(5);
/// ...and replace the kernel if it still is not idle this long after that.
const INTERRUPT_GIVE_UP: Duration = Duration::from_secs(10);
/// The kernel went idle for our request but its `execute_reply` has not come yet.
const REPLY_GRACE: Duration = Duration::from_secs(3);
/// The `execute_reply` came but no idle status (dropped by a full IOPub queue): give up after
/// this long without IOPub traffic.
const IDLE_GRACE: Duration = Duration::from_secs(5);
/// Deno's kernel may publish a run's output and result after its idle status: for such kernels,
/// IOPub is read on until it has been quiet this long...
const SETTLE_QUIET: Duration = Duration::from_millis(100);
/// ...but no longer than this.
const SETTLE_MAX: Duration = Duration::from_secs(1);
/// After the process exits, messages still in flight are read for this long.
const EXIT_DRAIN: Duration = Duration::from_millis(300);

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

/// Why we killed a kernel, so the run it interrupts can say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    Restarted,
    Deleted,
    /// It ignored interrupts after its client left.
    Unresponsive,
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
    /// The user it runs as.
    pub user: String,
    /// Executions of user code so far.
    pub runs: u64,
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
    /// Starts the kernel and waits until it answers on its shell and IOPub channels. `identity`
    /// is the agent's identity generation, read before the process starts.
    pub async fn launch(
        spec: &Kernelspec,
        user: &User,
        cwd: &Path,
        globals: &BTreeMap<String, String>,
        identity: u64,
    ) -> Result<Kernel, KernelError> {
        let name = spec.name.clone();
        if !cwd.is_dir() {
            return Err(KernelError::Setup(format!(
                "working directory '{}' does not exist",
                cwd.display()
            )));
        }
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        // The listeners hold the ports until the kernel is spawned (see `peek_ports_with_listeners`);
        // the lease keeps them from other kernels starting meanwhile, until this one has bound them.
        let (ports, listeners, ports_lease) = lease_ports(ip).await?;
        let info = ConnectionInfo {
            ip: ip.to_string(),
            transport: Transport::TCP,
            shell_port: ports[0],
            iopub_port: ports[1],
            stdin_port: ports[2],
            control_port: ports[3],
            hb_port: ports[4],
            key: uuid::Uuid::new_v4().to_string(),
            signature_scheme: "hmac-sha256".into(),
            kernel_name: Some(name.clone()),
        };
        let (dir, connection_file) = ConnectionDir::create(user, &info)
            .map_err(|e| KernelError::Setup(format!("writing the connection file: {e}")))?;

        let mut base: BTreeMap<String, String> = user
            .base_env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        if spec.dialect() == Dialect::Deno {
            // Deno colours its `text/plain` results and console output with ANSI codes otherwise.
            base.insert("NO_COLOR".into(), "1".into());
        }
        base.extend(spec.spec.env.clone().unwrap_or_default());
        let env = EnvState::new(spec.dialect(), base.clone(), globals);
        let launch_env = base.into_iter().chain(
            globals
                .iter()
                .filter(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'))
                .map(|(k, v)| (k.clone(), v.clone())),
        );

        let argv = spec.argv(&connection_file);
        let Some((program, args)) = argv.split_first() else {
            return Err(KernelError::Setup(format!(
                "kernelspec '{name}' has an empty argv"
            )));
        };
        let mut cmd = std::process::Command::new(program);
        cmd.args(args)
            .current_dir(cwd)
            .env_clear()
            .envs(launch_env)
            .uid(user.uid)
            .gid(user.gid)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        crate::pid1::rlimits::cap_processes(&mut cmd);
        let mut child = tokio::process::Command::from(cmd)
            .spawn()
            .map_err(|source| KernelError::Spawn {
                name: name.clone(),
                program: program.to_string_lossy().into_owned(),
                source,
            })?;
        drop(listeners);
        let pid = child.id().ok_or_else(|| KernelError::ExitedEarly {
            name: name.clone(),
            status: "already reaped".into(),
            stderr: String::new(),
        })? as i32;
        crate::pid1::reaper::track(pid as u32);
        crate::pid1::idle::quiet(pid);
        let group = GroupGuard(pid);

        let stderr_tail = Arc::new(Mutex::new(Vec::<u8>::new()));
        if let Some(mut stderr) = child.stderr.take() {
            let tail = stderr_tail.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                    tail.extend_from_slice(&buf[..n]);
                    let excess = tail.len().saturating_sub(STDERR_TAIL);
                    tail.drain(..excess);
                }
            });
        }
        let switch = Arc::new(KillSwitch {
            pgid: pid,
            exited: AtomicBool::new(false),
            reason: Mutex::new(None),
        });
        let (exit_tx, mut exit) = watch::channel(None);
        {
            let switch = switch.clone();
            tokio::spawn(async move {
                let status = describe_exit(child.wait().await);
                switch.exited.store(true, Ordering::SeqCst);
                let _ = exit_tx.send(Some(status));
            });
        }
        let exited_early = |status: String| KernelError::ExitedEarly {
            name: name.clone(),
            status,
            stderr: {
                let tail = stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
                let text = String::from_utf8_lossy(&tail);
                let text = text.trim();
                if text.is_empty() {
                    String::new()
                } else {
                    format!(": {text}")
                }
            },
        };

        let deadline = Instant::now() + READY_TIMEOUT;
        let session = uuid::Uuid::new_v4().to_string();
        let connect = async {
            let identity = jupyter_zmq_client::peer_identity_for_session(&session)?;
            let shell = jupyter_zmq_client::create_client_shell_connection_with_identity(
                &info, &session, identity,
            )
            .await?;
            let iopub =
                jupyter_zmq_client::create_client_iopub_connection(&info, "", &session).await?;
            let control =
                jupyter_zmq_client::create_client_control_connection(&info, &session).await?;
            Ok::<_, KernelError>((shell, iopub, control))
        };
        let (shell, iopub, control) = tokio::select! {
            r = connect => r?,
            _ = exited(&mut exit) => {
                let status = exit.borrow().clone().unwrap_or_default();
                return Err(exited_early(status));
            }
            _ = sleep_until(deadline) => return Err(KernelError::Timeout { name: name.clone() }),
        };

        let (shell, shell_recv) = shell.split();
        let (control, control_recv) = control.split();
        let (shell_tx, shell_rx) = mpsc::channel(SHELL_DEPTH);
        let (iopub_tx, iopub_rx) = mpsc::channel(IOPUB_DEPTH);
        // Control replies (interrupt, shutdown) are not needed; they are read and dropped.
        let (control_tx, mut control_rx) = mpsc::channel(SHELL_DEPTH);
        let readers = vec![
            AbortOnDrop(tokio::spawn(pump(shell_recv, shell_tx, "shell"))),
            AbortOnDrop(tokio::spawn(pump(iopub, iopub_tx, "iopub"))),
            AbortOnDrop(tokio::spawn(pump(control_recv, control_tx, "control"))),
            AbortOnDrop(tokio::spawn(async move {
                while control_rx.recv().await.is_some() {}
            })),
        ];

        let mut kernel = Kernel {
            spec: spec.clone(),
            user: user.name.clone(),
            runs: 0,
            identity,
            switch,
            exit,
            shell,
            control,
            shell_rx,
            iopub_rx,
            env,
            _readers: readers,
            _dir: dir,
            _group: group,
            _ports: ports_lease,
        };
        match kernel.wait_ready(deadline).await {
            Ok(()) => Ok(kernel),
            Err(KernelError::Died) => {
                let status = kernel.exit.borrow().clone().unwrap_or_default();
                Err(exited_early(status))
            }
            Err(e) => Err(e),
        }
    }

    /// Sends `kernel_info_request`s until the reply arrives on shell and the kernel's status
    /// shows up on IOPub (a SUB socket misses whatever is published before it has subscribed).
    async fn wait_ready(&mut self, deadline: Instant) -> Result<(), KernelError> {
        let mut shell_ok = false;
        let mut iopub_ok = false;
        self.shell.send(KernelInfoRequest {}.into()).await?;
        let mut resend = tokio::time::interval(Duration::from_millis(500));
        resend.tick().await;
        while !(shell_ok && iopub_ok) {
            tokio::select! {
                Some(m) = self.shell_rx.recv() => {
                    shell_ok |= m.msg_type == "kernel_info_reply";
                }
                Some(_) = self.iopub_rx.recv() => iopub_ok = true,
                _ = resend.tick() => {
                    if shell_ok && !iopub_ok {
                        self.shell.send(KernelInfoRequest {}.into()).await?;
                    }
                }
                _ = exited(&mut self.exit) => return Err(KernelError::Died),
                _ = sleep_until(deadline) => {
                    return Err(KernelError::Timeout { name: self.spec.name.clone() })
                }
            }
        }
        Ok(())
    }

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

    /// The error a run reports when the kernel process is gone.
    fn death_event(&self) -> Event {
        let status = self.exit.borrow().clone().unwrap_or_default();
        match self.switch.reason() {
            Some(KillReason::Restarted) => {
                Event::error("ContextRestarting", "Context was restarted")
            }
            Some(KillReason::Deleted) => Event::error("ContextDeleted", "Context was deleted"),
            Some(KillReason::Unresponsive) => Event::error(
                "KernelDied",
                "The kernel did not respond to interrupts and was stopped; its state is lost",
            ),
            None => Event::error(
                "KernelDied",
                format!(
                    "The kernel process exited unexpectedly ({status}). Its state is lost; the \
                     next run in this context starts a fresh kernel."
                ),
            ),
        }
    }

    /// Reads messages that come after the idle status, until IOPub goes quiet.
    async fn settle(&mut self, msg_id: &str, run: &mut RunState, out: &mut Output) {
        let cap = Instant::now() + SETTLE_MAX;
        loop {
            let until = (Instant::now() + SETTLE_QUIET).min(cap);
            match tokio::time::timeout_at(until, self.iopub_rx.recv()).await {
                Ok(Some(m)) if m.is_child_of(msg_id) => run.on_iopub(m, out).await,
                Ok(Some(_)) => {}
                _ => return,
            }
        }
    }

    /// Runs user code, streaming its events to `out` (everything but `end_of_execution`).
    /// `identity` is the agent's current identity generation.
    pub async fn execute(
        &mut self,
        code: String,
        globals: &BTreeMap<String, String>,
        per_run: &BTreeMap<String, String>,
        identity: u64,
        out: &mut Output,
    ) -> RunEnd {
        // Whatever arrived between runs (late output of background threads) belongs to no one.
        while self.iopub_rx.try_recv().is_ok() {}
        while self.shell_rx.try_recv().is_ok() {}

        if !self.reseed(identity).await {
            out.send(&self.death_event()).await;
            return RunEnd::KernelGone;
        }
        let changes = self.env.before(globals, per_run);
        if !self.apply_env(&changes).await {
            out.send(&self.death_event()).await;
            return RunEnd::KernelGone;
        }

        let request: JupyterMessage = ExecuteRequest {
            code,
            silent: false,
            store_history: true,
            user_expressions: None,
            allow_stdin: false,
            stop_on_error: true,
        }
        .into();
        let msg_id = request.header.msg_id.clone();
        tracing::trace!("shell -> execute_request {msg_id}");
        if let Err(e) = self.shell.send(request).await {
            // A shell socket that cannot send is broken for good: start afresh next time.
            out.send(&Event::error(
                "KernelError",
                format!("sending the code: {e}"),
            ))
            .await;
            return RunEnd::KernelGone;
        }
        self.runs += 1;

        let mut run = RunState::default();
        let mut last_iopub = Instant::now();
        // Set once the client left and the kernel was interrupted.
        let mut interrupted: Option<(Instant, u8)> = None;
        loop {
            if run.idle_at.is_some() && run.replied {
                if self.spec.dialect().late_output() {
                    self.settle(&msg_id, &mut run, out).await;
                }
                return RunEnd::Done;
            }
            let far = Instant::now() + Duration::from_secs(86400);
            let escalate_at = interrupted.map(|(at, n)| {
                at + if n < 2 {
                    INTERRUPT_RETRY
                } else {
                    INTERRUPT_GIVE_UP
                }
            });
            let reply_grace_at = run.idle_at.map(|at| at + REPLY_GRACE);
            let idle_grace_at = run.replied.then_some(last_iopub + IDLE_GRACE);
            tokio::select! {
                // Biased: a flood of output must not starve the disconnect check and the timers.
                biased;
                _ = out.closed(), if interrupted.is_none() => {
                    tracing::info!("client left mid-execution; interrupting kernel '{}'", self.spec.name);
                    self.interrupt().await;
                    interrupted = Some((Instant::now(), 1));
                }
                _ = sleep_until(escalate_at.unwrap_or(far)), if escalate_at.is_some() => {
                    match interrupted {
                        Some((_, 1)) => {
                            self.interrupt().await;
                            interrupted = Some((Instant::now(), 2));
                        }
                        _ => {
                            tracing::warn!("kernel '{}' ignores interrupts; stopping it", self.spec.name);
                            self.switch.kill(KillReason::Unresponsive);
                            return RunEnd::KernelGone;
                        }
                    }
                }
                // Before IOPub: while truncated output floods in, nothing else is written, and the
                // keepalive is what reveals a client that left.
                _ = sleep_until(out.keepalive_at()), if !out.is_gone() => {
                    out.send(&Event::Keepalive).await;
                }
                Some(m) = self.iopub_rx.recv() => {
                    last_iopub = Instant::now();
                    if m.is_child_of(&msg_id) {
                        run.on_iopub(m, out).await;
                    }
                }
                Some(m) = self.shell_rx.recv() => {
                    if m.is_child_of(&msg_id) && m.msg_type == "execute_reply" {
                        run.on_reply(m, out).await;
                    }
                }
                _ = exited(&mut self.exit) => {
                    // Output the kernel sent just before it died is still worth showing.
                    let drain_until = Instant::now() + EXIT_DRAIN;
                    while let Ok(Some(m)) = tokio::time::timeout_at(drain_until, self.iopub_rx.recv()).await {
                        if m.is_child_of(&msg_id) {
                            run.on_iopub(m, out).await;
                        }
                    }
                    out.send(&self.death_event()).await;
                    return RunEnd::KernelGone;
                }
                _ = sleep_until(reply_grace_at.unwrap_or(far)), if reply_grace_at.is_some() && !run.replied => {
                    return RunEnd::Done;
                }
                _ = sleep_until(idle_grace_at.unwrap_or(far)), if idle_grace_at.is_some() && run.idle_at.is_none() => {
                    tracing::warn!("kernel '{}' replied but never went idle", self.spec.name);
                    return RunEnd::Done;
                }
            }
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
    use axum::body::Bytes;
    use jupyter_zmq_client::RawMessage;
    use serde_json::Value;

    fn raw(header: Value, parent: Value, content: Value) -> RawMessage {
        RawMessage {
            zmq_identities: vec![],
            jparts: vec![
                Bytes::from(header.to_string()),
                Bytes::from(parent.to_string()),
                Bytes::from("{}"),
                Bytes::from(content.to_string()),
            ],
        }
    }

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

    #[test]
    fn decodes_messages() {
        let m = KernelMessage::decode(raw(
            serde_json::json!({"msg_type": "stream", "msg_id": "b", "date": "2025-01-01T00:00:00Z"}),
            serde_json::json!({"msg_id": "a"}),
            serde_json::json!({"name": "stdout", "text": "hi"}),
        ))
        .unwrap();
        assert_eq!(m.msg_type, "stream");
        assert!(m.is_child_of("a"));
        assert!(!m.is_child_of("b"));
        assert_eq!(m.str("text"), Some("hi"));
        assert_eq!(m.date.as_deref(), Some("2025-01-01T00:00:00Z"));

        let orphan = KernelMessage::decode(raw(
            serde_json::json!({"msg_type": "status"}),
            serde_json::json!({}),
            serde_json::json!({"execution_state": "starting"}),
        ))
        .unwrap();
        assert_eq!(orphan.parent_id, None);
        assert!(KernelMessage::decode(raw(
            serde_json::json!({}),
            serde_json::json!({}),
            serde_json::json!({})
        ))
        .is_err());
    }

    #[tokio::test]
    async fn run_state_maps_messages() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut out = Output::new(tx);
        let mut run = RunState::default();
        let msg = |t: &str, content: Value| KernelMessage {
            msg_type: t.into(),
            parent_id: Some("x".into()),
            date: None,
            content,
        };
        run.on_iopub(
            msg("execute_input", serde_json::json!({"execution_count": 2})),
            &mut out,
        )
        .await;
        run.on_iopub(
            msg(
                "error",
                serde_json::json!({"ename": "E", "evalue": "v", "traceback": ["a", "b"]}),
            ),
            &mut out,
        )
        .await;
        run.on_iopub(
            msg("status", serde_json::json!({"execution_state": "idle"})),
            &mut out,
        )
        .await;
        run.on_reply(
            msg(
                "execute_reply",
                serde_json::json!({"status": "error", "execution_count": 2, "ename": "E", "evalue": "v", "traceback": []}),
            ),
            &mut out,
        )
        .await;
        drop(out);
        let mut lines = Vec::new();
        while let Some(l) = rx.recv().await {
            lines.push(String::from_utf8(l.to_vec()).unwrap());
        }
        assert_eq!(
            lines,
            vec![
                "{\"type\":\"number_of_executions\",\"execution_count\":2}\n",
                "{\"type\":\"error\",\"name\":\"E\",\"value\":\"v\",\"traceback\":\"a\\nb\"}\n",
            ]
        );
        assert!(run.replied && run.idle_at.is_some());
    }
}
