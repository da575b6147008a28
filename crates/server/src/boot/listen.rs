//! The one port's connections, held to bounds that no client, with a key or without, can stretch:
//! at most [`MAX_CONNECTIONS`] open at once, a request head in [`HEAD_TIMEOUT`] (which is also
//! how long a kept-alive connection may sit idle between requests), and heads of at most
//! [`MAX_HEAD`] bytes. API bodies are bounded by the router (`boot/mod.rs`); sandbox traffic
//! streams through.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once; one more is closed as soon as it is accepted.
pub const MAX_CONNECTIONS: usize = 4096;
/// How long a client has to send a whole request head, from the moment the connection (or the
/// previous response) leaves it waiting.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request head read.
pub const MAX_HEAD: usize = 64 * 1024;
/// How long open connections get to finish once the server stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `stop` resolves, then stops accepting, runs `drain` (which
/// cuts sandbox streams) and gives open connections [`DRAIN_TIMEOUT`] to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    stop: impl Future<Output = ()>,
    drain: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_header_size(MAX_HEAD);
    tokio::pin!(stop);
    let mut full_since: Option<tokio::time::Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: wait rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if full_since.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                tracing::warn!(%peer, "{MAX_CONNECTIONS} connections are open; refusing more");
                full_since = Some(tokio::time::Instant::now());
            }
            continue; // dropping the stream closes it
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    drain.await;
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections were still open {DRAIN_TIMEOUT:?} after shutdown began");
    }
}
