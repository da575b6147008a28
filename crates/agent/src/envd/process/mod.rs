//! process.Process: start commands, stream their output, feed their input, signal them.
//!
//! Each process runs in its own process group (or session, with a terminal), so a signal reaches
//! everything it started. Output fans out to every attached stream; a stream that goes away never
//! affects the process. Only a `Connect-Timeout-Ms` deadline on Start or a SendSignal ends it.

use crate::config::Config;
use crate::envd::log::SandboxLog;
use crate::pid1::spawn;
use crate::rpc::{self, RpcError, RpcResult, StreamSender};
use crate::users::User;
use airlock_wire::connect::{Code, ConnectError};
use airlock_wire::envd::{
    CloseStdinRequest, ConnectRequest, Empty, EndEvent, ListResponse, ProcessConfig, ProcessEvent,
    ProcessEventMessage, ProcessInfo, ProcessInput, ProcessOutput, ProcessSelector, PtySize,
    SendInputRequest, SendSignalRequest, Signal, StartEvent, StartRequest, StreamInputRequest,
    UpdateRequest,
};
use airlock_wire::logs::{LineBuffer, LogLevel, MAX_LINE, START_CMD_TAG};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use nix::sys::signal::{killpg, Signal as NixSignal};
use nix::unistd::Pid;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

/// Output is read and forwarded in chunks of at most this size (as envd does).
const CHUNK: usize = 32 * 1024;
/// Events buffered per attached stream before the process's output waits for it.
const STREAM_BUFFER: usize = 64;

/// The process service: the processes it started, the settings they start with, and the log
/// that records them.
struct Processes {
    config: Arc<Config>,
    log: Arc<SandboxLog>,
    table: ProcessTable,
}

pub fn routes(config: Arc<Config>, log: Arc<SandboxLog>) -> Router {
    let processes = Arc::new(Processes {
        config,
        log,
        table: ProcessTable::default(),
    });
    Router::new()
        .route("/process.Process/Start", post(start))
        .route("/process.Process/Connect", post(connect))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/StreamInput", post(stream_input))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/Update", post(update))
        .with_state(processes)
}

/// Where a process's input goes.
enum Input {
    Pipe(pipe::Sender),
    Pty(tokio::fs::File),
}

/// Who gets a process's events, and how it ended once it has.
struct Fanout {
    subscribers: Vec<mpsc::Sender<ProcessEvent>>,
    ended: Option<EndEvent>,
}

struct ProcessHandle {
    pid: u32,
    config: ProcessConfig,
    tag: Option<String>,
    input: tokio::sync::Mutex<Option<Input>>,
    /// The terminal's master side, kept for resizing.
    pty_master: Option<OwnedFd>,
    fanout: Mutex<Fanout>,
}

impl ProcessHandle {
    fn info(&self) -> ProcessInfo {
        ProcessInfo {
            config: self.config.clone(),
            pid: self.pid,
            tag: self.tag.clone(),
        }
    }

    /// Attaches a new stream. After the end it still gets the end event, alone.
    fn subscribe(&self) -> mpsc::Receiver<ProcessEvent> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let mut fanout = self.fanout.lock().unwrap_or_else(|e| e.into_inner());
        match &fanout.ended {
            Some(end) => {
                let _ = tx.try_send(ProcessEvent::End(end.clone()));
            }
            None => fanout.subscribers.push(tx),
        }
        rx
    }

    async fn publish(&self, event: ProcessEvent) {
        let subscribers = self
            .fanout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribers
            .clone();
        for tx in &subscribers {
            // A closed receiver is a client that went away: the process goes on regardless.
            let _ = tx.send(event.clone()).await;
        }
        self.fanout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribers
            .retain(|tx| !tx.is_closed());
    }

    async fn finish(&self, end: EndEvent) {
        let subscribers = {
            let mut fanout = self.fanout.lock().unwrap_or_else(|e| e.into_inner());
            fanout.ended = Some(end.clone());
            std::mem::take(&mut fanout.subscribers)
        };
        for tx in subscribers {
            let _ = tx.send(ProcessEvent::End(end.clone())).await;
        }
    }

    fn signal(&self, signal: NixSignal) -> Result<(), RpcError> {
        // Every process leads its own group, so this reaches its children too.
        killpg(Pid::from_raw(self.pid as i32), signal)
            .map_err(|e| RpcError::internal(format!("signalling process {}: {e}", self.pid)))
    }
}

#[derive(Default)]
struct ProcessTable {
    live: Mutex<HashMap<u32, Arc<ProcessHandle>>>,
}

impl ProcessTable {
    fn insert(&self, handle: Arc<ProcessHandle>) {
        self.lock().insert(handle.pid, handle);
    }

    fn remove(&self, pid: u32) {
        self.lock().remove(&pid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<ProcessHandle>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn find(&self, selector: &ProcessSelector) -> Result<Arc<ProcessHandle>, RpcError> {
        let live = self.lock();
        let found = match selector {
            ProcessSelector::Pid(pid) => live.get(pid).cloned(),
            ProcessSelector::Tag(tag) => live
                .values()
                .find(|p| p.tag.as_deref() == Some(tag.as_str()))
                .cloned(),
        };
        found.ok_or_else(|| match selector {
            ProcessSelector::Pid(pid) => {
                RpcError::not_found(format!("process with pid {pid} not found"))
            }
            ProcessSelector::Tag(tag) => {
                RpcError::not_found(format!("process with tag {tag} not found"))
            }
        })
    }

    fn list(&self) -> Vec<ProcessInfo> {
        let mut out: Vec<ProcessInfo> = self.lock().values().map(|p| p.info()).collect();
        out.sort_by_key(|p| p.pid);
        out
    }
}

// ---------------------------------------------------------------- Start

async fn start(
    State(processes): State<Arc<Processes>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let req: StartRequest = match rpc::read_stream_request(body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let user = match processes.config.rpc_user(&headers) {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let (handle, events) = match spawn(&processes, &user, req) {
        Ok(spawned) => spawned,
        Err(e) => return e.into_response(),
    };
    let deadline = rpc::timeout(&headers);
    if let Some(limit) = deadline {
        let handle = handle.clone();
        tokio::spawn(async move {
            tokio::time::sleep(limit).await;
            let _ = handle.signal(NixSignal::SIGKILL);
        });
    }
    let (tx, resp) = rpc::stream_response();
    let keepalive = rpc::keepalive_interval(&headers);
    tokio::spawn(forward_events(tx, handle.pid, events, keepalive, deadline));
    resp
}

/// The program to run for `cmd`. The SDK runs every command with `/bin/bash -l -c`; an image
/// without bash (Alpine, BusyBox) runs it with `/bin/sh`, which takes the same arguments.
fn program(cmd: &str) -> &str {
    if cmd == "/bin/bash" && !Path::new(cmd).exists() {
        "/bin/sh"
    } else {
        cmd
    }
}

/// Starts the process and its output pumps; the returned receiver sees all of its output.
fn spawn(
    processes: &Arc<Processes>,
    user: &User,
    req: StartRequest,
) -> Result<(Arc<ProcessHandle>, mpsc::Receiver<ProcessEvent>), RpcError> {
    let config = req.process;
    if config.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd is empty"));
    }
    let sandbox = processes.config.current();
    let cwd = match config.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(cwd) => user.resolve(cwd)?,
        None => sandbox
            .default_workdir
            .as_deref()
            .map(|w| user.resolve(w))
            .transpose()?
            .unwrap_or_else(|| user.home.clone()),
    };
    if !cwd.is_dir() {
        return Err(RpcError::invalid(format!(
            "cwd '{}' does not exist or is not a directory",
            cwd.display()
        )));
    }

    let env: BTreeMap<String, String> = user
        .base_env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(sandbox.env_vars)
        .chain(config.envs.clone())
        .collect();
    let stdio = match req.pty {
        Some(pty) => spawn::Stdio::Terminal(winsize(pty.size)),
        // A missing `stdin` field means true (the pre-0.3 default).
        None => spawn::Stdio::Pipes {
            stdin: req.stdin.unwrap_or(true),
        },
    };
    let spec = spawn::Spec {
        program: program(&config.cmd).to_owned(),
        args: config.args.clone(),
        env,
        cwd,
        uid: user.uid,
        gid: user.gid,
        stdio,
    };
    let child = spawn::spawn(&spec).map_err(|e| spawn_error(&config.cmd, &e))?;
    let pid = child.pid;
    crate::pid1::reaper::track(pid);
    let (input, pty_master, pumps) = match child.terminal {
        Some(master) => {
            let reader = tokio::fs::File::from_std(std::fs::File::from(
                master
                    .try_clone()
                    .map_err(|e| RpcError::internal(e.to_string()))?,
            ));
            let writer = tokio::fs::File::from_std(std::fs::File::from(
                master
                    .try_clone()
                    .map_err(|e| RpcError::internal(e.to_string()))?,
            ));
            (
                Some(Input::Pty(writer)),
                Some(master),
                vec![(Box::new(reader) as BoxedReader, OutputKind::Pty)],
            )
        }
        None => {
            let receiver = |fd: Option<OwnedFd>| -> Result<Option<BoxedReader>, RpcError> {
                fd.map(|fd| {
                    pipe::Receiver::from_owned_fd(fd)
                        .map(|r| Box::new(r) as BoxedReader)
                        .map_err(|e| RpcError::internal(format!("reading output: {e}")))
                })
                .transpose()
            };
            let mut pumps: Vec<(BoxedReader, OutputKind)> = Vec::new();
            if let Some(out) = receiver(child.stdout)? {
                pumps.push((out, OutputKind::Stdout));
            }
            if let Some(err) = receiver(child.stderr)? {
                pumps.push((err, OutputKind::Stderr));
            }
            let stdin = child
                .stdin
                .map(pipe::Sender::from_owned_fd)
                .transpose()
                .map_err(|e| RpcError::internal(format!("opening input: {e}")))?;
            (stdin.map(Input::Pipe), None, pumps)
        }
    };

    let handle = Arc::new(ProcessHandle {
        pid,
        config,
        tag: req.tag,
        input: tokio::sync::Mutex::new(input),
        pty_master,
        fanout: Mutex::new(Fanout {
            subscribers: Vec::new(),
            ended: None,
        }),
    });
    let events = handle.subscribe();
    processes.table.insert(handle.clone());
    log_start(&processes.log, &handle, user);

    let logged = handle.tag.as_deref() == Some(START_CMD_TAG);
    let pump_tasks: Vec<_> = pumps
        .into_iter()
        .map(|(reader, kind)| {
            let log = logged.then(|| processes.log.clone());
            tokio::spawn(pump(handle.clone(), reader, kind, log))
        })
        .collect();
    let processes = processes.clone();
    let waiter = handle.clone();
    tokio::spawn(async move {
        let status = spawn::wait(pid).await;
        for task in pump_tasks {
            let _ = task.await;
        }
        let end = match status {
            Ok(status) => end_event(status),
            Err(e) => EndEvent {
                exit_code: -1,
                exited: false,
                status: "unknown".into(),
                error: Some(format!("waiting for process: {e}")),
            },
        };
        processes.table.remove(waiter.pid);
        let level = match end.exit_code {
            0 => LogLevel::Info,
            _ => LogLevel::Warn,
        };
        let message = format!("process {} ended: {}", waiter.pid, end.status);
        let fields = [
            ("event", "process_end".to_owned()),
            ("pid", waiter.pid.to_string()),
            ("exit_code", end.exit_code.to_string()),
        ];
        processes.log.write(level, message, fields);
        waiter.finish(end).await;
    });
    Ok((handle, events))
}

type BoxedReader = Box<dyn AsyncRead + Send + Unpin>;

#[derive(Clone, Copy)]
enum OutputKind {
    Stdout,
    Stderr,
    Pty,
}

/// Records a process's start in the sandbox's log.
fn log_start(log: &SandboxLog, handle: &ProcessHandle, user: &User) {
    // Cut so that the message stays within a log line.
    let mut command = std::iter::once(&handle.config.cmd)
        .chain(&handle.config.args)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(" ");
    if command.len() > MAX_LINE {
        let cut = (0..=MAX_LINE).rev().find(|i| command.is_char_boundary(*i));
        command.truncate(cut.unwrap_or(0));
    }
    let message = format!("process {} started as {}: {command}", handle.pid, user.name);
    let mut fields = vec![
        ("event", "process_start".to_owned()),
        ("pid", handle.pid.to_string()),
        ("user", user.name.clone()),
    ];
    if let Some(tag) = &handle.tag {
        fields.push(("tag", tag.clone()));
    }
    log.write(LogLevel::Info, message, fields);
}

/// Hands a process's output to its subscribers and, with `log`, to the sandbox's log, line by
/// line.
async fn pump(
    handle: Arc<ProcessHandle>,
    mut reader: BoxedReader,
    kind: OutputKind,
    log: Option<Arc<SandboxLog>>,
) {
    let stream = match kind {
        OutputKind::Stdout => "stdout",
        OutputKind::Stderr => "stderr",
        OutputKind::Pty => "pty",
    };
    let mut to_log = |text: String| {
        if let Some(log) = &log {
            let fields = [("pid", handle.pid.to_string()), ("stream", stream.into())];
            log.write(LogLevel::Info, text, fields);
        }
    };
    let mut lines = LineBuffer::default();
    let mut buf = vec![0u8; CHUNK];
    loop {
        // A terminal's master reports EIO once the last holder of the slave side is gone.
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => {
                lines.flush(&mut to_log);
                return;
            }
            Ok(n) => n,
        };
        if log.is_some() {
            lines.push(&buf[..n], &mut to_log);
        }
        let data = buf[..n].to_vec();
        let output = match kind {
            OutputKind::Stdout => ProcessOutput::Stdout(data),
            OutputKind::Stderr => ProcessOutput::Stderr(data),
            OutputKind::Pty => ProcessOutput::Pty(data),
        };
        handle.publish(ProcessEvent::Data(output)).await;
    }
}

fn spawn_error(cmd: &str, err: &std::io::Error) -> RpcError {
    match err.kind() {
        std::io::ErrorKind::NotFound => RpcError::invalid(format!("command '{cmd}' not found")),
        std::io::ErrorKind::PermissionDenied => RpcError::new(
            Code::PermissionDenied,
            format!("cannot execute '{cmd}': {err}"),
        ),
        _ => RpcError::internal(format!("starting '{cmd}': {err}")),
    }
}

/// The end event as envd reports it, with Go's `ProcessState.String()` wording.
fn end_event(status: ExitStatus) -> EndEvent {
    if let Some(code) = status.code() {
        let text = format!("exit status {code}");
        EndEvent {
            exit_code: code,
            exited: true,
            status: text.clone(),
            error: (code != 0).then_some(text),
        }
    } else {
        let text = format!("signal: {}", signal_name(status.signal().unwrap_or(0)));
        EndEvent {
            exit_code: -1,
            exited: false,
            status: text.clone(),
            error: Some(text),
        }
    }
}

/// Go's names for signals (`syscall.Signal.String()`).
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "hangup",
        libc::SIGINT => "interrupt",
        libc::SIGQUIT => "quit",
        libc::SIGILL => "illegal instruction",
        libc::SIGTRAP => "trace/breakpoint trap",
        libc::SIGABRT => "aborted",
        libc::SIGBUS => "bus error",
        libc::SIGFPE => "floating point exception",
        libc::SIGKILL => "killed",
        libc::SIGUSR1 => "user defined signal 1",
        libc::SIGSEGV => "segmentation fault",
        libc::SIGUSR2 => "user defined signal 2",
        libc::SIGPIPE => "broken pipe",
        libc::SIGALRM => "alarm clock",
        libc::SIGTERM => "terminated",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

/// A terminal size as the kernel takes it, at least 1 by 1.
fn winsize(size: PtySize) -> libc::winsize {
    libc::winsize {
        ws_row: size.rows.clamp(1, u16::MAX as u32) as u16,
        ws_col: size.cols.clamp(1, u16::MAX as u32) as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

fn resize_pty(master: &OwnedFd, size: PtySize) -> Result<(), RpcError> {
    let winsize = winsize(size);
    // SAFETY: TIOCSWINSZ reads a `winsize` from the pointer, which is valid for the call; the fd
    // is a terminal master we own.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &winsize) } < 0 {
        return Err(RpcError::internal(format!(
            "resizing terminal: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Sends `start`, then the process's events, then the end of the stream. Returns early, leaving
/// the process alone, if the client goes away.
async fn forward_events(
    tx: StreamSender,
    pid: u32,
    mut events: mpsc::Receiver<ProcessEvent>,
    keepalive: Duration,
    deadline: Option<Duration>,
) {
    let started = tokio::time::Instant::now();
    let msg = |event| ProcessEventMessage { event };
    if tx
        .send(&msg(ProcessEvent::Start(StartEvent { pid })))
        .await
        .is_err()
    {
        return;
    }
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout(keepalive, events.recv()) => next,
            _ = tx.closed() => return,
        };
        match next {
            Ok(Some(event)) => {
                let is_end = matches!(event, ProcessEvent::End(_));
                if tx.send(&msg(event)).await.is_err() {
                    return;
                }
                if is_end {
                    break;
                }
            }
            Ok(None) => break,
            Err(_idle) => {
                if tx
                    .send(&msg(ProcessEvent::Keepalive(Empty {})))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
    let timed_out = deadline.is_some_and(|d| started.elapsed() >= d);
    let error = timed_out.then(|| ConnectError::new(Code::DeadlineExceeded, "process timed out"));
    tx.finish(error).await;
}

// ---------------------------------------------------------------- the other RPCs

async fn connect(
    State(processes): State<Arc<Processes>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let req: ConnectRequest = match rpc::read_stream_request(body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let handle = match processes.table.find(&req.process) {
        Ok(h) => h,
        Err(e) => return e.into_response(),
    };
    let events = handle.subscribe();
    let (tx, resp) = rpc::stream_response();
    tokio::spawn(forward_events(
        tx,
        handle.pid,
        events,
        rpc::keepalive_interval(&headers),
        None,
    ));
    resp
}

async fn list(State(processes): State<Arc<Processes>>) -> Json<ListResponse> {
    Json(ListResponse {
        processes: processes.table.list(),
    })
}

async fn write_input(handle: &ProcessHandle, input: &ProcessInput) -> Result<(), RpcError> {
    let mut slot = handle.input.lock().await;
    let result = match (slot.as_mut(), input) {
        (Some(Input::Pipe(stdin)), ProcessInput::Stdin(data)) => stdin.write_all(data).await,
        (Some(Input::Pty(master)), ProcessInput::Pty(data) | ProcessInput::Stdin(data)) => {
            master.write_all(data).await
        }
        (Some(Input::Pipe(_)), ProcessInput::Pty(_)) => {
            return Err(RpcError::invalid("process has no terminal"))
        }
        (None, _) => {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                format!("stdin of process {} is closed", handle.pid),
            ))
        }
    };
    result.map_err(|e| RpcError::new(Code::FailedPrecondition, format!("writing input: {e}")))
}

async fn send_input(State(processes): State<Arc<Processes>>, body: Bytes) -> RpcResult<Empty> {
    let req: SendInputRequest = rpc::parse_unary(&body)?;
    let handle = processes.table.find(&req.process)?;
    write_input(&handle, &req.input).await?;
    Ok(Json(Empty {}))
}

async fn stream_input(State(processes): State<Arc<Processes>>, body: Body) -> Response {
    let result = feed_stream_input(&processes.table, rpc::MessageReader::new(body)).await;
    let (tx, resp) = rpc::stream_response();
    tokio::spawn(async move {
        match result {
            Ok(()) => {
                let _ = tx.send(&Empty {}).await;
                tx.finish(None).await;
            }
            Err(e) => tx.finish(Some(e.0)).await,
        }
    });
    resp
}

/// Applies each StreamInput message in order: a `start` naming the process, then its input.
async fn feed_stream_input(
    table: &ProcessTable,
    mut messages: rpc::MessageReader,
) -> Result<(), RpcError> {
    let mut target: Option<Arc<ProcessHandle>> = None;
    while let Some(msg) = messages.next::<StreamInputRequest>().await? {
        match msg {
            StreamInputRequest::Start { process } => {
                target = Some(table.find(&process)?);
            }
            StreamInputRequest::Data { input } => {
                let handle = target
                    .as_ref()
                    .ok_or_else(|| RpcError::invalid("input sent before the start message"))?;
                write_input(handle, &input).await?;
            }
            StreamInputRequest::Keepalive {} => {}
        }
    }
    Ok(())
}

async fn send_signal(State(processes): State<Arc<Processes>>, body: Bytes) -> RpcResult<Empty> {
    let req: SendSignalRequest = rpc::parse_unary(&body)?;
    let handle = processes.table.find(&req.process)?;
    handle.signal(match req.signal {
        Signal::Kill => NixSignal::SIGKILL,
        Signal::Term => NixSignal::SIGTERM,
    })?;
    Ok(Json(Empty {}))
}

async fn close_stdin(State(processes): State<Arc<Processes>>, body: Bytes) -> RpcResult<Empty> {
    let req: CloseStdinRequest = rpc::parse_unary(&body)?;
    let handle = processes.table.find(&req.process)?;
    let mut input = handle.input.lock().await;
    if matches!(*input, Some(Input::Pty(_))) {
        return Err(RpcError::invalid(
            "cannot close the stdin of a terminal process",
        ));
    }
    // Dropping the pipe's write end is what delivers EOF.
    *input = None;
    Ok(Json(Empty {}))
}

async fn update(State(processes): State<Arc<Processes>>, body: Bytes) -> RpcResult<Empty> {
    let req: UpdateRequest = rpc::parse_unary(&body)?;
    let handle = processes.table.find(&req.process)?;
    if let Some(pty) = req.pty {
        let master = handle
            .pty_master
            .as_ref()
            .ok_or_else(|| RpcError::invalid("process has no terminal"))?;
        resize_pty(master, pty.size)?;
    }
    Ok(Json(Empty {}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_use_go_wording() {
        let ok = end_event(ExitStatus::from_raw(0));
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str()),
            (0, true, "exit status 0")
        );
        assert_eq!(ok.error, None);
        let failed = end_event(ExitStatus::from_raw(3 << 8));
        assert_eq!(failed.exit_code, 3);
        assert_eq!(failed.error.as_deref(), Some("exit status 3"));
        let killed = end_event(ExitStatus::from_raw(libc::SIGKILL));
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.status, "signal: killed");
        assert_eq!(signal_name(64), "signal 64");
    }
}
