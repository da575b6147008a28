//! `airlock sandbox exec` and `shell`: a process in a sandbox through its agent's
//! `process.Process` service (Connect over HTTP, as the SDK speaks it), its output streamed
//! back. A shell runs on a terminal in the sandbox that takes this one's keys and size.

use super::{CliError, Client};
use airlock_wire::api::Sandbox;
use airlock_wire::connect::{self, Decoder};
use airlock_wire::envd::{
    ProcessConfig, ProcessEvent, ProcessEventMessage, ProcessInput, ProcessOutput, ProcessSelector,
    Pty, PtySize, SendInputRequest, StartRequest, UpdateRequest,
};
use axum::body::Body;
use base64::Engine;
use http_body_util::BodyExt;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

/// Runs `command` and streams its output; exits with its exit code.
pub async fn exec(
    client: &Client,
    id: &str,
    user: &str,
    cwd: Option<String>,
    envs: BTreeMap<String, String>,
    command: &[String],
) -> Result<ExitCode, CliError> {
    let start = StartRequest {
        process: ProcessConfig {
            cmd: command[0].clone(),
            args: command[1..].to_vec(),
            envs,
            cwd,
        },
        pty: None,
        tag: None,
        stdin: Some(false),
    };
    let process = Process::start(Rpc::new(client, id, user).await?, &start).await?;
    process.relay().await
}

/// An interactive login shell on a terminal in the sandbox.
pub async fn shell(client: &Client, id: &str, user: &str) -> Result<ExitCode, CliError> {
    let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
    let start = StartRequest {
        process: ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-i".into(), "-l".into()],
            envs: BTreeMap::from([("TERM".to_owned(), term)]),
            cwd: None,
        },
        pty: Some(Pty {
            size: terminal_size(),
        }),
        tag: None,
        stdin: None,
    };
    let process = Process::start(Rpc::new(client, id, user).await?, &start).await?;
    // Keys go to the sandbox as they are typed, Ctrl-C and Ctrl-D included; put back at the end.
    let _raw = RawTerminal::enter();
    let (input_tx, mut input_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    // A thread of its own, not the runtime's blocking pool: a read of the terminal cannot be
    // cancelled, and the process must be able to exit while one waits.
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin().lock();
        while let Ok(n @ 1..) = std::io::Read::read(&mut stdin, &mut buf) {
            if input_tx.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let rpc = process.rpc.clone();
    let pid = process.pid;
    let forward = tokio::spawn(async move {
        let mut resized =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
        loop {
            let window_changed = async {
                match resized.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                input = input_rx.recv() => {
                    let Some(keys) = input else { return };
                    let send = SendInputRequest {
                        process: ProcessSelector::Pid(pid),
                        input: ProcessInput::Pty(keys),
                    };
                    if rpc.call("SendInput", &send).await.is_err() {
                        return;
                    }
                }
                _ = window_changed => {
                    let update = UpdateRequest {
                        process: ProcessSelector::Pid(pid),
                        pty: Some(Pty { size: terminal_size() }),
                    };
                    let _ = rpc.call("Update", &update).await;
                }
            }
        }
    });
    let exit = process.relay().await;
    forward.abort();
    exit
}

/// How Connect calls reach one sandbox's agent, as one user.
#[derive(Clone)]
pub(crate) struct Rpc {
    client: Client,
    id: String,
    user: String,
    token: Option<String>,
}

impl Rpc {
    /// Asks the server for the sandbox's access token, which every call then carries.
    pub(crate) async fn new(client: &Client, id: &str, user: &str) -> Result<Rpc, CliError> {
        Ok(Rpc {
            token: client.access_token(id).await?,
            client: client.clone(),
            id: id.to_owned(),
            user: user.to_owned(),
        })
    }

    /// For a sandbox just created or connected, whose answer carried its access token.
    pub(crate) fn connected(client: &Client, sandbox: &Sandbox, user: &str) -> Rpc {
        Rpc {
            token: sandbox.envd_access_token.clone(),
            client: client.clone(),
            id: sandbox.sandbox_id.clone(),
            user: user.to_owned(),
        }
    }

    /// `path` is the service's and method's, e.g. `/process.Process/Start`.
    fn request(&self, path: &str, content_type: &str) -> http::request::Builder {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:", self.user));
        let mut req = self
            .client
            .request("POST", path)
            .header(airlock_wire::SANDBOX_ID_HEADER, &self.id)
            .header("content-type", content_type)
            .header("connect-protocol-version", "1")
            .header("authorization", format!("Basic {basic}"));
        if let Some(token) = &self.token {
            req = req.header(airlock_wire::ACCESS_TOKEN_HEADER, token);
        }
        req
    }

    /// A unary `process.Process` call.
    async fn call(&self, method: &str, message: &impl serde::Serialize) -> Result<(), CliError> {
        self.unary(&format!("/process.Process/{method}"), message)
            .await
            .map(drop)
    }

    /// A unary call (JSON in, JSON out) to `path`; returns the answer's body.
    pub(crate) async fn unary(
        &self,
        path: &str,
        message: &impl serde::Serialize,
    ) -> Result<Vec<u8>, CliError> {
        let body = serde_json::to_vec(message).map_err(|e| CliError::Failed(e.to_string()))?;
        let req = self
            .request(path, "application/json")
            .body(Body::from(body))
            .map_err(|e| CliError::Failed(e.to_string()))?;
        let resp = self.client.send(req).await?;
        let status = resp.status();
        if !status.is_success() {
            let body = crate::capped::error_text(resp.into_body()).await;
            return Err(CliError::Failed(super::error_message(&body, status)));
        }
        let what = format!("the answer of {path}");
        let body = crate::capped::read(resp.into_body(), crate::capped::MAX_JSON, &what).await;
        body.map(|b| b.to_vec())
            .map_err(|e| CliError::Failed(e.to_string()))
    }
}

/// A started process: its pid and the stream of its events.
pub(crate) struct Process {
    rpc: Rpc,
    pid: u32,
    events: hyper::body::Incoming,
    decoder: Decoder,
}

impl Process {
    pub(crate) async fn start(rpc: Rpc, start: &StartRequest) -> Result<Process, CliError> {
        let message = serde_json::to_value(start).map_err(|e| CliError::Failed(e.to_string()))?;
        let req = rpc
            .request("/process.Process/Start", connect::STREAM_CONTENT_TYPE)
            .body(Body::from(connect::encode_message(&message)))
            .map_err(|e| CliError::Failed(e.to_string()))?;
        let resp = rpc.client.send(req).await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = crate::capped::error_text(resp.into_body()).await;
            return Err(CliError::Failed(format!(
                "starting the command failed: {}",
                super::error_message(&body, status)
            )));
        }
        let mut process = Process {
            rpc,
            pid: 0,
            events: resp.into_body(),
            decoder: Decoder::default(),
        };
        match process.next_event().await? {
            Some(ProcessEvent::Start(started)) => process.pid = started.pid,
            other => {
                return Err(CliError::Failed(format!(
                    "the command did not start: {other:?}"
                )))
            }
        }
        Ok(process)
    }

    /// The next event of the stream; `None` at its end. An error the stream ends with is
    /// returned as one.
    pub(crate) async fn next_event(&mut self) -> Result<Option<ProcessEvent>, CliError> {
        loop {
            if let Some(env) = self
                .decoder
                .next_envelope()
                .map_err(|e| CliError::Failed(e.to_string()))?
            {
                if env.is_end_stream() {
                    let end: connect::EndOfStream =
                        serde_json::from_slice(&env.payload).unwrap_or_default();
                    return match end.error {
                        Some(err) => {
                            Err(CliError::Failed(format!("{:?}: {}", err.code, err.message)))
                        }
                        None => Ok(None),
                    };
                }
                let msg: ProcessEventMessage = serde_json::from_slice(&env.payload)
                    .map_err(|e| CliError::Failed(format!("unexpected message: {e}")))?;
                return Ok(Some(msg.event));
            }
            match self.events.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    let frame =
                        frame.map_err(|e| CliError::Failed(format!("the stream broke: {e}")))?;
                    if let Some(chunk) = frame.data_ref() {
                        self.decoder.push(chunk);
                    }
                }
            }
        }
    }

    /// Kills the process (SIGKILL).
    pub(crate) async fn kill(&self) -> Result<(), CliError> {
        let kill = serde_json::json!({"process": {"pid": self.pid}, "signal": "SIGNAL_SIGKILL"});
        self.rpc.call("SendSignal", &kill).await
    }

    /// Copies the process's output to ours until it ends; its exit code is ours.
    async fn relay(mut self) -> Result<ExitCode, CliError> {
        let mut exit: Option<i32> = None;
        while let Some(event) = self.next_event().await? {
            match event {
                ProcessEvent::Data(ProcessOutput::Stdout(d) | ProcessOutput::Pty(d)) => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&d);
                    let _ = out.flush();
                }
                ProcessEvent::Data(ProcessOutput::Stderr(d)) => {
                    let _ = std::io::stderr().write_all(&d);
                }
                ProcessEvent::End(end) => {
                    if end.exit_code < 0 {
                        eprintln!("airlock: command ended: {}", super::term::cell(&end.status));
                    }
                    exit = Some(end.exit_code);
                }
                ProcessEvent::Start(_) | ProcessEvent::Keepalive(_) => {}
            }
        }
        match exit {
            Some(code) => Ok(ExitCode::from(u8::try_from(code).unwrap_or(1))),
            None => Err(CliError::Failed(
                "the command ended without an exit status".into(),
            )),
        }
    }
}

/// This terminal's size (80x24 when standard output is not one).
fn terminal_size() -> PtySize {
    nix::ioctl_read_bad!(window_size, nix::libc::TIOCGWINSZ, nix::pty::Winsize);
    let mut size = nix::pty::Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `struct winsize` into `size`, which lives across the call.
    let got = unsafe { window_size(nix::libc::STDOUT_FILENO, &mut size) };
    match got {
        Ok(_) if size.ws_col > 0 && size.ws_row > 0 => PtySize {
            cols: size.ws_col.into(),
            rows: size.ws_row.into(),
        },
        _ => PtySize { cols: 80, rows: 24 },
    }
}

/// Standard input in raw mode (keys as typed, no echo, no signals) while it lives, if it is a
/// terminal.
struct RawTerminal(Option<nix::sys::termios::Termios>);

impl RawTerminal {
    fn enter() -> RawTerminal {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else {
            return RawTerminal(None); // not a terminal
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        match tcsetattr(&stdin, SetArg::TCSANOW, &raw) {
            Ok(()) => RawTerminal(Some(saved)),
            Err(_) => RawTerminal(None),
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}
