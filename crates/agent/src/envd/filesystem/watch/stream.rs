//! WatchDir, the async SDK's watcher: one streaming response, its events as they come and a
//! keepalive while there are none.

use super::tree::{open_watch, push_event, InotifyFd, Tree};
use crate::config::Config;
use crate::rpc::{self, RpcError, StreamSender};
use airlock_wire::connect::{Code, ConnectError};
use airlock_wire::envd::{Empty, WatchDirResponse, WatchRequest};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

pub(super) async fn watch_dir(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = async {
        let req: WatchRequest = rpc::read_stream_request(body).await?;
        let (fd, tree) = open_watch(&config, &headers, &req).await?;
        let (tx, response) = rpc::stream_response();
        tokio::spawn(stream_events(
            fd,
            tree,
            tx,
            rpc::keepalive_interval(&headers),
        ));
        Ok::<_, RpcError>(response)
    };
    start.await.unwrap_or_else(RpcError::into_stream_response)
}

async fn stream_events(
    fd: AsyncFd<InotifyFd>,
    mut tree: Tree,
    tx: StreamSender,
    keepalive: Duration,
) {
    if tx.send(&WatchDirResponse::Start(Empty {})).await.is_err() {
        return;
    }
    let idle = tokio::time::sleep(keepalive);
    tokio::pin!(idle);
    loop {
        let mut batch = VecDeque::new();
        let outcome = tokio::select! {
            _ = tx.closed() => return,
            _ = &mut idle => {
                if tx.send(&WatchDirResponse::Keepalive(Empty {})).await.is_err() {
                    return;
                }
                idle.as_mut().reset(tokio::time::Instant::now() + keepalive);
                continue;
            }
            ready = fd.readable() => ready.and_then(|mut guard| {
                let outcome = tree.drain(guard.get_inner(), &mut |ev| push_event(&mut batch, ev))?;
                if outcome.emptied {
                    guard.clear_ready();
                }
                Ok(outcome)
            }),
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                let error = ConnectError::new(Code::Internal, format!("watcher failed: {e}"));
                tx.finish(Some(error)).await;
                return;
            }
        };
        for event in batch {
            if tx
                .send(&WatchDirResponse::Filesystem(Box::new(event)))
                .await
                .is_err()
            {
                return;
            }
        }
        if outcome.root_gone {
            // The watched directory is gone: nothing more can happen.
            tx.finish(None).await;
            return;
        }
        idle.as_mut().reset(tokio::time::Instant::now() + keepalive);
    }
}
