//! `airlock sandbox exec` and `shell`: a process in a sandbox, started and read through the
//! client's `process.Process` calls (see [`crate::client::process`]), its output streamed back.
//! A shell runs on a terminal in the sandbox that takes this one's keys and size.

use super::CliError;
use crate::client::process::{Process, Rpc};
use crate::client::Client;
use airlock_wire::envd::{
    ProcessConfig, ProcessEvent, ProcessInput, ProcessOutput, ProcessSelector, Pty, PtySize,
    SendInputRequest, StartRequest, UpdateRequest,
};
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
    relay(process).await
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
    let rpc = process.rpc().clone();
    let pid = process.pid();
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
    let exit = relay(process).await;
    forward.abort();
    exit
}

/// Copies the process's output to ours until it ends; its exit code is ours.
async fn relay(mut process: Process) -> Result<ExitCode, CliError> {
    let mut exit: Option<i32> = None;
    while let Some(event) = process.next_event().await? {
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
                    eprintln!("airlock: command ended: {}", crate::term::cell(&end.status));
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
