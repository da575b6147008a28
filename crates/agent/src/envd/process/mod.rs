//! process.Process: start commands, stream their output, feed their input, signal them.
//!
//! Each process runs in its own process group (or session, with a terminal), so a signal reaches
//! everything it started. Output fans out to every attached stream; a stream that goes away never
//! affects the process. Only a `Connect-Timeout-Ms` deadline on Start or a SendSignal ends it.
//!
//! `table` keeps the processes the service started; `start`, `stream`, `input` and `signal` are
//! its RPCs.

mod input;
mod signal;
mod start;
mod stream;
mod table;

use crate::config::Config;
use crate::envd::log::SandboxLog;
use axum::routing::post;
use axum::Router;
use std::sync::Arc;
use table::{ProcessTable, Processes};

pub fn routes(config: Arc<Config>, log: Arc<SandboxLog>) -> Router {
    let processes = Arc::new(Processes {
        config,
        log,
        table: ProcessTable::default(),
    });
    Router::new()
        .route("/process.Process/Start", post(start::start))
        .route("/process.Process/Connect", post(stream::connect))
        .route("/process.Process/List", post(table::list))
        .route("/process.Process/SendInput", post(input::send_input))
        .route("/process.Process/StreamInput", post(input::stream_input))
        .route("/process.Process/SendSignal", post(signal::send_signal))
        .route("/process.Process/CloseStdin", post(input::close_stdin))
        .route("/process.Process/Update", post(signal::update))
        .with_state(processes)
}
