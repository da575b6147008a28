//! One watcher's inotify instance and the directories it watches: opening it, reading its
//! events as envd's, and buffering them.

use crate::config::Config;
use crate::envd::filesystem::entry::{entry_info, IdNames};
use crate::rpc::RpcError;
use airlock_wire::connect::Code;
use airlock_wire::envd::{EventType, FilesystemEvent, WatchRequest};
use axum::http::HeaderMap;
use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Events a polling watcher keeps between polls; beyond this the oldest are dropped.
pub(super) const MAX_PENDING_EVENTS: usize = 10_000;
/// Directories one recursive watcher may watch.
const MAX_WATCHED_DIRS: usize = 100_000;
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

/// Validates the request's directory and starts watching it.
pub(super) async fn open_watch(
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

/// Appends `event`, merging it into the previous one when both have the same name and type,
/// and dropping the oldest event when the buffer is full.
pub(super) fn push_event(buffer: &mut VecDeque<FilesystemEvent>, event: FilesystemEvent) {
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

/// Lets tokio poll the inotify descriptor.
pub(super) struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

pub(super) struct DrainOutcome {
    /// The kernel queue was read until empty (otherwise more is pending).
    pub(super) emptied: bool,
    /// The watched directory itself was removed or unmounted.
    pub(super) root_gone: bool,
}

/// The watched directories of one watcher, by watch descriptor.
pub(super) struct Tree {
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
    pub(super) fn drain(
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
}
