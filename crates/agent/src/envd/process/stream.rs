//! A process's event stream, the response of Start and of Connect: its start, its output, its
//! end, and keepalives while it is quiet.

use super::table::Processes;
use crate::rpc::{self, StreamSender};
use airlock_wire::connect::{Code, ConnectError};
use airlock_wire::envd::{ConnectRequest, Empty, ProcessEvent, ProcessEventMessage, StartEvent};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Sends `start`, then the process's events, then the end of the stream. Returns early, leaving
/// the process alone, if the client goes away.
pub(super) async fn forward_events(
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

pub(super) async fn connect(
    State(processes): State<Arc<Processes>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let handle = async {
        let req: ConnectRequest = rpc::read_stream_request(body).await?;
        processes.table.find(&req.process)
    };
    let handle = match handle.await {
        Ok(h) => h,
        Err(e) => return e.into_stream_response(),
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
