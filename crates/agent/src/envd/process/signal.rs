//! What reaches a running process besides its input: SendSignal, and Update's new terminal
//! size.

use super::start::winsize;
use super::table::Processes;
use crate::rpc::{self, RpcError, RpcResult};
use airlock_wire::envd::{Empty, PtySize, SendSignalRequest, Signal, UpdateRequest};
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use nix::sys::signal::Signal as NixSignal;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

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

pub(super) async fn send_signal(
    State(processes): State<Arc<Processes>>,
    body: Bytes,
) -> RpcResult<Empty> {
    let req: SendSignalRequest = rpc::parse_unary(&body)?;
    let handle = processes.table.find(&req.process)?;
    handle.signal(match req.signal {
        Signal::Kill => NixSignal::SIGKILL,
        Signal::Term => NixSignal::SIGTERM,
    })?;
    Ok(Json(Empty {}))
}

pub(super) async fn update(
    State(processes): State<Arc<Processes>>,
    body: Bytes,
) -> RpcResult<Empty> {
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
