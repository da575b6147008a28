//! The code-interpreter server on port 49999: E2B's Jupyter protocol (`POST /execute` streaming
//! NDJSON, `/contexts` CRUD), served by driving real Jupyter kernels over ZeroMQ.
//!
//! * `kernelspec` finds the template's kernels and maps a request's language to one.
//! * `kernel` starts a kernel process as its context's user and runs code in it: output, results,
//!   errors, interrupts when the client leaves, crashes.
//! * `contexts` keeps the contexts (a kernel each, one run at a time, replaced when it dies).
//! * `envcode` keeps kernels' env vars in line with the sandbox's and a run's own.
//! * `events` is the NDJSON stream with its bounds; `api` the HTTP routes.
//!
//! A template without kernelspecs (e.g. `base`) gets no listener at all, so the sandbox proxy
//! answers that the port is not open.

mod api;
mod contexts;
mod envcode;
mod events;
mod kernel;
mod kernelspec;

use crate::config::Config;
use std::net::SocketAddr;
use std::sync::Arc;

/// The port E2B's SDK sends Jupyter traffic to.
pub const PORT: u16 = airlock_wire::CODE_INTERPRETER_PORT;
/// Overrides [`PORT`] (host runs next to another server).
pub const PORT_ENV: &str = "AIRLOCK_INTERPRETER_PORT";

/// Binds the code interpreter's port and serves it in the background when the template has
/// kernels. Returns once the port listens, so the agent answers its health check only when the
/// interpreter is reachable too (a `run_code` straight after create must not find the port
/// closed); returns at once when there are no kernels. Failing to listen is logged, not fatal:
/// envd goes on without it.
pub async fn start(config: Arc<Config>) {
    let specs = kernelspec::Kernelspecs::discover();
    if specs.is_empty() {
        tracing::info!("no Jupyter kernelspecs: the code interpreter is off");
        return;
    }
    tracing::info!("code interpreter kernels: {}", specs.names().join(", "));
    let port = std::env::var(PORT_ENV)
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(PORT);
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("code interpreter: cannot listen on {addr}: {e}");
            return;
        }
    };
    let mut identity = config.watch_identity();
    let mut reboots = config.watch_reboots();
    let interpreter = contexts::Interpreter::new(config, specs);
    interpreter.start_defaults();
    let reseeding = interpreter.clone();
    tokio::spawn(async move {
        while identity.changed().await.is_ok() {
            let generation = *identity.borrow_and_update();
            reseeding.reseed_all(generation).await;
        }
    });
    let rebooting = interpreter.clone();
    tokio::spawn(async move {
        while reboots.changed().await.is_ok() {
            rebooting.forget_contexts();
            rebooting.start_defaults();
        }
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, api::router(interpreter)).await {
            tracing::error!("code interpreter: server failed: {e}");
        }
    });
}
