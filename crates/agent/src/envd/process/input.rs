//! A process's input: SendInput, StreamInput and CloseStdin.

use super::table::{Input, ProcessHandle, ProcessTable, Processes};
use crate::rpc::{self, RpcError, RpcResult};
use airlock_wire::connect::Code;
use airlock_wire::envd::{
    CloseStdinRequest, Empty, ProcessInput, SendInputRequest, StreamInputRequest,
};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

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

pub(super) async fn send_input(
    State(processes): State<Arc<Processes>>,
    body: Bytes,
) -> RpcResult<Empty> {
    let req: SendInputRequest = rpc::parse_unary(&body)?;
    let handle = processes.table.find(&req.process)?;
    write_input(&handle, &req.input).await?;
    Ok(Json(Empty {}))
}

pub(super) async fn stream_input(State(processes): State<Arc<Processes>>, body: Body) -> Response {
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

pub(super) async fn close_stdin(
    State(processes): State<Arc<Processes>>,
    body: Bytes,
) -> RpcResult<Empty> {
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
