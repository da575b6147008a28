//! Start: a command spawned as the request's user, its output pumped to the streams attached to
//! it (and, for a template's start command, to the sandbox's log), its end recorded.

use super::stream::forward_events;
use super::table::{Fanout, Input, ProcessHandle, Processes};
use crate::envd::log::SandboxLog;
use crate::pid1::{reaper, spawn};
use crate::rpc::{self, RpcError};
use crate::users::User;
use airlock_wire::connect::Code;
use airlock_wire::envd::{EndEvent, ProcessEvent, ProcessOutput, PtySize, StartRequest};
use airlock_wire::logs::{LineBuffer, LogLevel, MAX_LINE, START_CMD_TAG};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use nix::sys::signal::Signal as NixSignal;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

/// Output is read and forwarded in chunks of at most this size (as envd does).
const CHUNK: usize = 32 * 1024;

pub(super) async fn start(
    State(processes): State<Arc<Processes>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    start_stream(&processes, &headers, body)
        .await
        .unwrap_or_else(RpcError::into_stream_response)
}

async fn start_stream(
    processes: &Arc<Processes>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, RpcError> {
    let req: StartRequest = rpc::read_stream_request(body).await?;
    let user = processes.config.rpc_user(headers)?;
    let (handle, events) = spawn(processes, &user, req)?;
    let deadline = rpc::timeout(headers);
    if let Some(limit) = deadline {
        let handle = handle.clone();
        tokio::spawn(async move {
            tokio::time::sleep(limit).await;
            let _ = handle.signal(NixSignal::SIGKILL);
        });
    }
    let (tx, resp) = rpc::stream_response();
    let keepalive = rpc::keepalive_interval(headers);
    tokio::spawn(forward_events(tx, handle.pid, events, keepalive, deadline));
    Ok(resp)
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
    reaper::track(pid);
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
pub(super) fn winsize(size: PtySize) -> libc::winsize {
    libc::winsize {
        ws_row: size.rows.clamp(1, u16::MAX as u32) as u16,
        ws_col: size.cols.clamp(1, u16::MAX as u32) as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
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
