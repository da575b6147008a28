//! The polling watchers of the sync SDK: CreateWatcher, GetWatcherEvents and RemoveWatcher, each
//! watcher fed by a task of its own between polls.

use super::tree::{open_watch, push_event, DrainOutcome, InotifyFd, Tree};
use crate::config::Config;
use crate::rpc::{self, RpcError, RpcResult};
use airlock_wire::connect::Code;
use airlock_wire::envd::{Empty, FilesystemEvent, WatchRequest, WatcherEvents, WatcherId};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio_util::task::AbortOnDropHandle;

/// Polling watchers alive at once (clients that never call RemoveWatcher would leak them).
const MAX_POLLING_WATCHERS: usize = 1024;

/// The polling RPCs' state: the settings (whom a request runs as) and the polling watchers.
type Watching = (Arc<Config>, Arc<WatcherTable>);

/// The polling watchers, by id.
#[derive(Default)]
pub struct WatcherTable {
    next_id: AtomicU64,
    watchers: Mutex<HashMap<String, Arc<PollingWatcher>>>,
}

impl WatcherTable {
    pub fn clear(&self) {
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn get(&self, id: &str) -> Result<Arc<PollingWatcher>, RpcError> {
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| watcher_not_found(id))
    }
}

fn watcher_not_found(id: &str) -> RpcError {
    RpcError::not_found(format!("watcher with id {id} not found"))
}

pub(super) async fn create_watcher(
    State((config, table)): State<Watching>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<WatcherId> {
    let req: WatchRequest = rpc::parse_unary(&body)?;
    let (fd, tree) = open_watch(&config, &headers, &req).await?;
    let shared = Arc::new(Shared {
        fd,
        state: Mutex::new(PollState {
            tree,
            events: VecDeque::new(),
            error: None,
        }),
    });
    let watcher = Arc::new(PollingWatcher {
        _task: AbortOnDropHandle::new(tokio::spawn(pump(shared.clone()))),
        shared,
    });
    let id = format!("w-{}", table.next_id.fetch_add(1, Ordering::Relaxed) + 1);
    let mut watchers = table.watchers.lock().unwrap_or_else(|e| e.into_inner());
    if watchers.len() >= MAX_POLLING_WATCHERS {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("too many watchers ({MAX_POLLING_WATCHERS}); remove some first"),
        ));
    }
    watchers.insert(id.clone(), watcher);
    Ok(Json(WatcherId { watcher_id: id }))
}

pub(super) async fn get_watcher_events(
    State((_, table)): State<Watching>,
    body: Bytes,
) -> RpcResult<WatcherEvents> {
    let req: WatcherId = rpc::parse_unary(&body)?;
    let watcher = table.get(&req.watcher_id)?;
    // Pick up what the kernel has queued right now, so a poll straight after a change sees it.
    let events = watcher.shared.take_events()?;
    Ok(Json(WatcherEvents { events }))
}

pub(super) async fn remove_watcher(
    State((_, table)): State<Watching>,
    body: Bytes,
) -> RpcResult<Empty> {
    let req: WatcherId = rpc::parse_unary(&body)?;
    let removed = table
        .watchers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&req.watcher_id);
    // Dropping the watcher stops its task and closes its inotify instance.
    removed
        .map(|_| Json(Empty {}))
        .ok_or_else(|| watcher_not_found(&req.watcher_id))
}

/// A watcher created by CreateWatcher. Dropping it stops the task feeding it.
struct PollingWatcher {
    shared: Arc<Shared>,
    _task: AbortOnDropHandle<()>,
}

struct Shared {
    fd: AsyncFd<InotifyFd>,
    /// The tree and the buffer share one lock: events are read and buffered in one step, so
    /// the background task and a poll never reorder them.
    state: Mutex<PollState>,
}

struct PollState {
    tree: Tree,
    events: VecDeque<FilesystemEvent>,
    error: Option<String>,
}

impl Shared {
    /// Reads queued inotify events into the buffer.
    fn drain(&self) -> io::Result<DrainOutcome> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let PollState { tree, events, .. } = &mut *state;
        tree.drain(self.fd.get_ref(), &mut |ev| push_event(events, ev))
    }

    fn take_events(&self) -> Result<Vec<FilesystemEvent>, RpcError> {
        let drained = self.drain();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = drained {
            state
                .error
                .get_or_insert_with(|| format!("watcher failed: {e}"));
        }
        if let Some(error) = &state.error {
            return Err(RpcError::internal(error.clone()));
        }
        Ok(state.events.drain(..).collect())
    }

    fn fail(&self, err: io::Error) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .error
            .get_or_insert_with(|| format!("watcher failed: {err}"));
    }
}

/// Moves events from the kernel into the buffer as they arrive, so subdirectories created
/// between polls get watched in time.
async fn pump(shared: Arc<Shared>) {
    loop {
        let mut guard = match shared.fd.readable().await {
            Ok(guard) => guard,
            Err(e) => return shared.fail(e),
        };
        match shared.drain() {
            Ok(outcome) if outcome.root_gone => return,
            Ok(outcome) if outcome.emptied => guard.clear_ready(),
            Ok(_) => tokio::task::yield_now().await,
            Err(e) => return shared.fail(e),
        }
    }
}
