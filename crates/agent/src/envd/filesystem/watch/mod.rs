//! Directory watchers: the streaming `WatchDir` RPC (async SDK) and the polling trio
//! `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (sync SDK).
//!
//! Both sit on one inotify instance per watcher. A recursive watcher also watches every
//! subdirectory, adding watches for directories that are created or moved in later and dropping
//! them for directories moved out. inotify events map to envd's (fsnotify's) event types; names
//! are relative to the watched directory (`sub/file.txt`, `.` for the directory itself).
//!
//! Consecutive identical events (same name and type) are merged, as the kernel does for unread
//! events, so one upload reads as CREATE, CHMOD, WRITE however many chunks it was written in.
//! A polling watcher buffers at most [`MAX_PENDING_EVENTS`]; past that the oldest are dropped.

use crate::config::Config;
use crate::envd::filesystem::entry::{entry_info, IdNames};
use crate::rpc::{self, RpcError, RpcResult, StreamSender};
use airlock_wire::connect::{Code, ConnectError};
use airlock_wire::envd::{
    Empty, EventType, FilesystemEvent, WatchDirResponse, WatchRequest, WatcherEvents, WatcherId,
};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio_util::task::AbortOnDropHandle;

/// Events a polling watcher keeps between polls; beyond this the oldest are dropped.
const MAX_PENDING_EVENTS: usize = 10_000;
/// Directories one recursive watcher may watch.
const MAX_WATCHED_DIRS: usize = 100_000;
/// Polling watchers alive at once (clients that never call RemoveWatcher would leak them).
const MAX_POLLING_WATCHERS: usize = 1024;
/// inotify reads per drain, so one busy watcher can't hold its lock indefinitely.
const MAX_READS_PER_DRAIN: usize = 64;

const WATCH_MASK: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

/// The watch RPCs' state: the settings (whom a request runs as) and the polling watchers.
type Watching = (Arc<Config>, Arc<WatcherTable>);

pub fn routes(config: Arc<Config>, watchers: Arc<WatcherTable>) -> Router {
    Router::new()
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(create_watcher))
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(get_watcher_events),
        )
        .route("/filesystem.Filesystem/RemoveWatcher", post(remove_watcher))
        .with_state((config, watchers))
}

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

// ---------------------------------------------------------------- handlers

async fn watch_dir(
    State((config, _)): State<Watching>,
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
    start.await.unwrap_or_else(IntoResponse::into_response)
}

async fn create_watcher(
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

async fn get_watcher_events(
    State((_, table)): State<Watching>,
    body: Bytes,
) -> RpcResult<WatcherEvents> {
    let req: WatcherId = rpc::parse_unary(&body)?;
    let watcher = table.get(&req.watcher_id)?;
    // Pick up what the kernel has queued right now, so a poll straight after a change sees it.
    let events = watcher.shared.take_events()?;
    Ok(Json(WatcherEvents { events }))
}

async fn remove_watcher(State((_, table)): State<Watching>, body: Bytes) -> RpcResult<Empty> {
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

/// Validates the request's directory and starts watching it.
async fn open_watch(
    config: &Config,
    headers: &HeaderMap,
    req: &WatchRequest,
) -> Result<(AsyncFd<InotifyFd>, Tree), RpcError> {
    let root = config.rpc_user(headers)?.resolve(&req.path)?;
    let shown = root.display().to_string();
    match tokio::fs::metadata(&root).await {
        Ok(md) if md.is_dir() => {}
        Ok(_) => return Err(RpcError::invalid(format!("path {shown} not a directory"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(RpcError::not_found(format!("path {shown} not found")))
        }
        Err(e) => return Err(RpcError::from_io(&e, &shown)),
    }
    let (recursive, include_entry) = (req.recursive, req.include_entry);
    // A recursive watch walks the whole tree: keep that off the async threads.
    let (inotify, tree) = tokio::task::spawn_blocking(move || {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let tree = Tree::new(&inotify, root, recursive, include_entry)?;
        Ok::<_, io::Error>((inotify, tree))
    })
    .await
    .map_err(|e| RpcError::internal(format!("watch setup failed: {e}")))?
    .map_err(|e| watch_error(&e, &shown))?;
    // SAFETY: `InotifyFd` owns the descriptor, keeps it open for as long as the `AsyncFd`
    // holds it, and always reports that same descriptor.
    let fd = unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE) }
        .map_err(|e| watch_error(&e.into(), &shown))?;
    Ok((fd, tree))
}

fn watch_error(err: &io::Error, path: &str) -> RpcError {
    if err.raw_os_error() == Some(libc::ENOSPC) {
        // inotify_add_watch's ENOSPC means the watch limit, not a full disk.
        return RpcError::new(
            Code::ResourceExhausted,
            format!("{path}: too many directories to watch"),
        );
    }
    RpcError::from_io(err, path)
}

// ---------------------------------------------------------------- streaming

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

// ---------------------------------------------------------------- polling

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

/// Appends `event`, merging it into the previous one when both have the same name and type,
/// and dropping the oldest event when the buffer is full.
fn push_event(buffer: &mut VecDeque<FilesystemEvent>, event: FilesystemEvent) {
    if let Some(last) = buffer.back_mut() {
        if last.name == event.name && last.event_type == event.event_type {
            last.entry = event.entry;
            return;
        }
    }
    if buffer.len() >= MAX_PENDING_EVENTS {
        buffer.pop_front();
        tracing::warn!("watcher buffer full; dropping the oldest event");
    }
    buffer.push_back(event);
}

// ---------------------------------------------------------------- inotify

/// Lets tokio poll the inotify descriptor.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

struct DrainOutcome {
    /// The kernel queue was read until empty (otherwise more is pending).
    emptied: bool,
    /// The watched directory itself was removed or unmounted.
    root_gone: bool,
}

/// The watched directories of one watcher, by watch descriptor.
struct Tree {
    root: PathBuf,
    recursive: bool,
    include_entry: bool,
    root_wd: WatchDescriptor,
    /// Each watched directory's path relative to `root` (empty for `root`).
    dirs: HashMap<WatchDescriptor, PathBuf>,
    /// Directories seen leaving (IN_MOVED_FROM, by cookie) whose IN_MOVED_TO hasn't shown up
    /// yet. The kernel queues both halves of a rename together, so whatever is still unmatched
    /// once the queue is empty has left the tree.
    moved_out: Vec<(u32, PathBuf)>,
}

impl Tree {
    fn new(
        inotify: &Inotify,
        root: PathBuf,
        recursive: bool,
        include_entry: bool,
    ) -> io::Result<Tree> {
        // The root may be a symlink to a directory (like envd, which stats through it).
        let root_wd = inotify.add_watch(&root, WATCH_MASK)?;
        let mut tree = Tree {
            root,
            recursive,
            include_entry,
            root_wd,
            dirs: HashMap::from([(root_wd, PathBuf::new())]),
            moved_out: Vec::new(),
        };
        if recursive {
            tree.watch_subtree(inotify, Path::new(""))?;
        }
        Ok(tree)
    }

    /// Watches every directory below `rel` (not following symlinks).
    fn watch_subtree(&mut self, inotify: &Inotify, rel: &Path) -> io::Result<()> {
        let mut pending = vec![rel.to_path_buf()];
        while let Some(dir) = pending.pop() {
            let entries = match std::fs::read_dir(self.root.join(&dir)) {
                Ok(entries) => entries,
                // Gone or replaced meanwhile: nothing to watch there.
                Err(e) if is_vanished(&e) => continue,
                Err(e) => return Err(e),
            };
            for entry in entries {
                let entry = entry?;
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let child = dir.join(entry.file_name());
                if self.watch_dir(inotify, &child)? {
                    pending.push(child);
                }
            }
        }
        Ok(())
    }

    /// Adds a watch on `rel`; false if it vanished before we got to it.
    fn watch_dir(&mut self, inotify: &Inotify, rel: &Path) -> io::Result<bool> {
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let mask = WATCH_MASK | AddWatchFlags::IN_DONT_FOLLOW;
        match inotify.add_watch(&self.root.join(rel), mask) {
            // Re-adding a directory that moved within the tree returns its old descriptor:
            // this updates its path.
            Ok(wd) => {
                self.dirs.insert(wd, rel.to_path_buf());
                Ok(true)
            }
            Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Stops watching `rel` and everything below it (it moved out of the tree).
    fn unwatch_subtree(&mut self, inotify: &Inotify, rel: &Path) {
        self.dirs.retain(|wd, path| {
            let keep = !path.starts_with(rel);
            if !keep {
                // It may be gone already; then the kernel has dropped the watch itself.
                let _ = inotify.rm_watch(*wd);
            }
            keep
        });
    }

    /// Reads what the kernel has queued (a bounded amount) and hands out the events.
    fn drain(
        &mut self,
        inotify: &InotifyFd,
        sink: &mut dyn FnMut(FilesystemEvent),
    ) -> io::Result<DrainOutcome> {
        let mut outcome = DrainOutcome {
            emptied: false,
            root_gone: false,
        };
        // Owner names for `include_entry`, read at most once per drain.
        let mut names = None;
        for _ in 0..MAX_READS_PER_DRAIN {
            let raw = match inotify.0.read_events() {
                Ok(raw) => raw,
                Err(Errno::EAGAIN) => {
                    outcome.emptied = true;
                    for (_, rel) in std::mem::take(&mut self.moved_out) {
                        self.unwatch_subtree(&inotify.0, &rel);
                    }
                    break;
                }
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            for event in raw {
                if event.mask.contains(AddWatchFlags::IN_IGNORED) && event.wd == self.root_wd {
                    outcome.root_gone = true;
                }
                for (rel, event_type) in self.translate(&inotify.0, event) {
                    let entry = if self.include_entry && event_type != EventType::Remove {
                        let names = names.get_or_insert_with(IdNames::load);
                        entry_info(&self.root.join(&rel), names).ok()
                    } else {
                        None
                    };
                    sink(FilesystemEvent {
                        name: event_name(&rel),
                        event_type,
                        entry,
                    });
                }
            }
        }
        Ok(outcome)
    }

    /// Turns one inotify event into envd events (path relative to the root, type), keeping the
    /// set of watched directories up to date on the way.
    fn translate(&mut self, inotify: &Inotify, event: InotifyEvent) -> Vec<(PathBuf, EventType)> {
        let mask = event.mask;
        if mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            tracing::warn!(root = %self.root.display(), "inotify queue overflowed; events were lost");
            return Vec::new();
        }
        let Some(dir) = self.dirs.get(&event.wd).cloned() else {
            return Vec::new();
        };
        if mask.contains(AddWatchFlags::IN_IGNORED) {
            self.dirs.remove(&event.wd);
            return Vec::new();
        }
        let rel = match &event.name {
            Some(name) => dir.join(name),
            // Events about a watched directory itself: the parent's watch reports those for
            // subdirectories, so only the root's own count.
            None if event.wd == self.root_wd => PathBuf::new(),
            None => return Vec::new(),
        };
        if self.recursive && event.name.is_some() && mask.contains(AddWatchFlags::IN_ISDIR) {
            if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
                self.moved_out.retain(|(cookie, _)| *cookie != event.cookie);
                // For a directory moved within the tree this re-adds the same descriptors,
                // which updates their paths.
                let added = self
                    .watch_dir(inotify, &rel)
                    .and_then(|exists| match exists {
                        true => self.watch_subtree(inotify, &rel),
                        false => Ok(()),
                    });
                if let Err(e) = added {
                    tracing::warn!(dir = %self.root.join(&rel).display(), "cannot watch new directory: {e}");
                }
            } else if mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                self.moved_out.push((event.cookie, rel.clone()));
            }
        }
        event_types(mask)
            .into_iter()
            .map(|event_type| (rel.clone(), event_type))
            .collect()
    }
}

fn is_vanished(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// envd's (fsnotify's) event types for an inotify mask, in envd's order.
fn event_types(mask: AddWatchFlags) -> Vec<EventType> {
    let has = |flags: AddWatchFlags| mask.intersects(flags);
    [
        (
            has(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO),
            EventType::Create,
        ),
        (
            has(AddWatchFlags::IN_MOVED_FROM | AddWatchFlags::IN_MOVE_SELF),
            EventType::Rename,
        ),
        (has(AddWatchFlags::IN_ATTRIB), EventType::Chmod),
        (has(AddWatchFlags::IN_MODIFY), EventType::Write),
        (
            has(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_DELETE_SELF),
            EventType::Remove,
        ),
    ]
    .into_iter()
    .filter_map(|(set, event_type)| set.then_some(event_type))
    .collect()
}

/// An event's name: its path relative to the watched directory, `.` for the directory itself.
fn event_name(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".into()
    } else {
        rel.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_wire::connect::Decoder;
    use axum::http::{Request, StatusCode};
    use futures::StreamExt;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    fn ev(name: &str, event_type: EventType) -> FilesystemEvent {
        FilesystemEvent {
            name: name.into(),
            event_type,
            entry: None,
        }
    }

    #[test]
    fn masks_map_to_envd_types() {
        use AddWatchFlags as F;
        assert_eq!(event_types(F::IN_CREATE | F::IN_ISDIR), [EventType::Create]);
        assert_eq!(event_types(F::IN_MOVED_TO), [EventType::Create]);
        assert_eq!(event_types(F::IN_MOVED_FROM), [EventType::Rename]);
        assert_eq!(event_types(F::IN_MOVE_SELF), [EventType::Rename]);
        assert_eq!(event_types(F::IN_ATTRIB), [EventType::Chmod]);
        assert_eq!(event_types(F::IN_MODIFY), [EventType::Write]);
        assert_eq!(event_types(F::IN_DELETE_SELF), [EventType::Remove]);
        assert!(event_types(F::IN_IGNORED).is_empty());
    }

    #[test]
    fn names_are_relative() {
        assert_eq!(event_name(Path::new("")), ".");
        assert_eq!(
            event_name(&Path::new("sub").join("file.txt")),
            "sub/file.txt"
        );
    }

    #[test]
    fn buffer_merges_repeats_and_drops_oldest() {
        let mut buf = VecDeque::new();
        push_event(&mut buf, ev("a", EventType::Create));
        push_event(&mut buf, ev("a", EventType::Write));
        push_event(&mut buf, ev("a", EventType::Write));
        push_event(&mut buf, ev("b", EventType::Write));
        assert_eq!(buf.len(), 3);
        for i in 0..MAX_PENDING_EVENTS {
            push_event(&mut buf, ev(&i.to_string(), EventType::Create));
        }
        assert_eq!(buf.len(), MAX_PENDING_EVENTS);
        assert_eq!(buf.front().map(|e| e.name.as_str()), Some("0"));
    }

    async fn unary(app: &Router, method: &str, body: Value) -> (StatusCode, Value) {
        let req = Request::post(format!("/filesystem.Filesystem/{method}"))
            .header("content-type", "application/json")
            .header("authorization", "Basic cm9vdDo=")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// Polls until `done` holds for the events collected so far (inotify is asynchronous).
    async fn poll_until(app: &Router, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        for _ in 0..100 {
            let (status, body) = unary(app, "GetWatcherEvents", json!({"watcherId": id})).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            seen.extend(body["events"].as_array().cloned().unwrap_or_default());
            if done(&seen) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen
    }

    fn has(events: &[Value], name: &str, kind: &str) -> bool {
        events
            .iter()
            .any(|e| e["name"] == name && e["type"] == kind)
    }

    #[tokio::test]
    async fn polling_watcher_sees_nested_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let app = routes(Arc::default(), Arc::default());
        let path = tmp.path().to_string_lossy();

        let (status, _) = unary(
            &app,
            "CreateWatcher",
            json!({"path": format!("{path}/nope")}),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        let (status, _) = unary(
            &app,
            "CreateWatcher",
            json!({"path": format!("{path}/file")}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);

        let (status, body) = unary(
            &app,
            "CreateWatcher",
            json!({"path": path, "recursive": true, "includeEntry": true}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let id = body["watcherId"].as_str().unwrap().to_owned();

        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        let events = poll_until(&app, &id, |ev| has(ev, "sub", "EVENT_TYPE_CREATE")).await;
        let created = events.iter().find(|e| e["name"] == "sub").unwrap();
        assert_eq!(created["entry"]["type"], "FILE_TYPE_DIRECTORY");

        std::fs::write(tmp.path().join("sub/x.txt"), b"data").unwrap();
        let events = poll_until(&app, &id, |ev| has(ev, "sub/x.txt", "EVENT_TYPE_WRITE")).await;
        assert!(has(&events, "sub/x.txt", "EVENT_TYPE_CREATE"), "{events:?}");

        std::fs::rename(tmp.path().join("sub"), tmp.path().join("moved")).unwrap();
        std::fs::write(tmp.path().join("moved/y"), b"").unwrap();
        let events = poll_until(&app, &id, |ev| has(ev, "moved/y", "EVENT_TYPE_CREATE")).await;
        assert!(has(&events, "sub", "EVENT_TYPE_RENAME"), "{events:?}");

        let (status, _) = unary(&app, "RemoveWatcher", json!({"watcherId": id})).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = unary(&app, "GetWatcherEvents", json!({"watcherId": id})).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn watch_dir_streams_start_then_events() {
        let tmp = tempfile::tempdir().unwrap();
        let app = routes(Arc::default(), Arc::default());
        let request = airlock_wire::connect::encode_message(&json!({"path": tmp.path()}));
        let req = Request::post("/filesystem.Filesystem/WatchDir")
            .header("content-type", "application/connect+json")
            .header("authorization", "Basic cm9vdDo=")
            .body(Body::from(request))
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body().into_data_stream();
        let mut decoder = Decoder::default();
        let mut messages = Vec::new();
        let mut wrote = false;
        while messages.len() < 2 {
            let chunk = tokio::time::timeout(Duration::from_secs(5), body.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            decoder.push(&chunk);
            while let Some(env) = decoder.next_envelope().unwrap() {
                messages.push(serde_json::from_slice::<Value>(&env.payload).unwrap());
            }
            if !wrote {
                std::fs::write(tmp.path().join("new.txt"), b"x").unwrap();
                wrote = true;
            }
        }
        assert_eq!(messages[0], json!({"start": {}}));
        assert_eq!(
            messages[1],
            json!({"filesystem": {"name": "new.txt", "type": "EVENT_TYPE_CREATE"}})
        );
    }
}
