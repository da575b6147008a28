//! One volume's files, reached only through descriptors that cannot leave its directory.
//!
//! Sandboxes that mount a volume may plant symlinks in it (`ln -s /etc/shadow x`), and the
//! server runs as root on the host. So every path is resolved from the volume's directory with
//! `openat2(RESOLVE_IN_ROOT)`: a symlink is followed as if the volume were `/`, and `..` cannot
//! climb out. The last component of a path that is changed (created, removed, chmodded) is
//! handled relative to its parent's descriptor and never followed.

use super::path::{VolumePath, MAX_DEPTH};
use super::VolumeError;
use crate::ids::random_token;
use crate::walk;
use chrono::{DateTime, Utc};
use nix::errno::Errno;
use nix::fcntl::{openat, openat2, renameat, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fchmodat, fstat, fstatat, mkdirat, FchmodatFlags, FileStat, Mode, SFlag};
use nix::unistd::{fchownat, unlinkat, Gid, Uid, UnlinkatFlags};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Whom new entries belong to unless the request says: E2B's `user`, as whom sandboxes run.
pub(super) const DEFAULT_UID: u32 = 1000;
pub(super) const DEFAULT_GID: u32 = 1000;
/// Most entries one listing returns.
const MAX_LISTED: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// An entry as the volume content API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryStat {
    pub name: String,
    pub kind: EntryKind,
    /// From the volume's root, starting with `/`.
    pub path: String,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: DateTime<Utc>,
    pub mtime: DateTime<Utc>,
    pub ctime: DateTime<Utc>,
    /// A symlink's target, as written.
    pub target: Option<String>,
}

/// Owner and permission changes; `None` leaves that part as it is (or, for a new entry, as
/// the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetadataChange {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

pub struct VolumeTree {
    root: OwnedFd,
    limit_bytes: u64,
    /// While it lives, the volume does not move to another node.
    _held: Option<super::VolumeUse>,
}

fn owned(fd: i32) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open and is owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The error for `errno` met at `path`.
fn failed(path: &str, what: &str, limit_bytes: u64) -> impl FnOnce(Errno) -> VolumeError {
    let path = path.to_owned();
    let what = what.to_owned();
    move |errno| match errno {
        Errno::ENOENT => VolumeError::PathNotFound(path),
        Errno::ENOTDIR => {
            VolumeError::BadPath(format!("'{path}': a part of it is not a directory"))
        }
        Errno::ELOOP => VolumeError::BadPath(format!("'{path}' is a symlink")),
        Errno::EXDEV => VolumeError::BadPath(format!("'{path}' leads out of the volume")),
        Errno::EEXIST => VolumeError::Exists(path),
        Errno::EISDIR => VolumeError::BadPath(format!("'{path}' is a directory")),
        Errno::ENOTEMPTY => VolumeError::BadPath(format!("'{path}' is not empty")),
        Errno::ENAMETOOLONG => VolumeError::BadPath(format!("'{path}' leads to too long a path")),
        Errno::ENOSPC | Errno::EDQUOT => VolumeError::Full(limit_bytes >> 20),
        other => VolumeError::Io {
            what: format!("{what} '{path}'"),
            source: other.into(),
        },
    }
}

fn kind_of(st: &FileStat) -> EntryKind {
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => EntryKind::File,
        SFlag::S_IFDIR => EntryKind::Directory,
        SFlag::S_IFLNK => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

fn time(secs: i64, nanos: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, nanos.clamp(0, 999_999_999) as u32).unwrap_or_default()
}

fn entry(name: &OsStr, path: String, st: &FileStat, target: Option<String>) -> EntryStat {
    EntryStat {
        name: name.to_string_lossy().into_owned(),
        kind: kind_of(st),
        path,
        size: st.st_size.max(0) as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        target,
    }
}

/// Applies owner and mode to the entry `fd` (opened with `O_PATH | O_NOFOLLOW`): the owner
/// through the descriptor itself, the mode through its `/proc/self/fd` link, which names this
/// very inode and is refused for a symlink before it is used.
fn apply(fd: &OwnedFd, st: &FileStat, change: &MetadataChange) -> Result<(), Errno> {
    if change.uid.is_some() || change.gid.is_some() {
        fchownat(
            Some(fd.as_raw_fd()),
            "",
            change.uid.map(Uid::from_raw),
            change.gid.map(Gid::from_raw),
            nix::fcntl::AtFlags::AT_EMPTY_PATH,
        )?;
    }
    if let Some(mode) = change.mode {
        if kind_of(st) == EntryKind::Symlink {
            return Err(Errno::ELOOP);
        }
        let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
        fchmodat(
            None,
            link.as_str(),
            Mode::from_bits_truncate(mode & 0o7777),
            FchmodatFlags::FollowSymlink,
        )?;
    }
    Ok(())
}

impl VolumeTree {
    pub(super) fn open(dir: &Path, limit_mb: u64) -> Result<Self, VolumeError> {
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| VolumeError::io(format!("opening {}", dir.display()))(e.into()))?;
        Ok(VolumeTree {
            root: owned(fd),
            limit_bytes: limit_mb << 20,
            _held: None,
        })
    }

    /// The tree, holding the volume on this node for as long as it lives.
    pub(super) fn holding(self, held: super::VolumeUse) -> Self {
        VolumeTree {
            _held: Some(held),
            ..self
        }
    }

    /// Opens `relative` (from the volume's root) as the volume sees it.
    fn resolve(&self, relative: &str, flags: OFlag, shown: &str) -> Result<OwnedFd, VolumeError> {
        let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(
            ResolveFlag::RESOLVE_IN_ROOT
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
        openat2(self.root.as_raw_fd(), relative, how)
            .map(owned)
            .map_err(failed(shown, "opening", self.limit_bytes))
    }

    fn dir_fd(&self, relative: &str, shown: &str) -> Result<OwnedFd, VolumeError> {
        self.resolve(relative, OFlag::O_DIRECTORY | OFlag::O_RDONLY, shown)
    }

    /// The entry `name` in directory `parent`, itself (a symlink is not followed).
    fn entry_fd(&self, parent: &OwnedFd, name: &str, shown: &str) -> Result<OwnedFd, VolumeError> {
        openat(
            Some(parent.as_raw_fd()),
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map(owned)
        .map_err(failed(shown, "opening", self.limit_bytes))
    }

    /// What `name` in `parent` is (a name as the directory holds it: bytes, not always UTF-8).
    fn stat_at(
        &self,
        parent: &OwnedFd,
        name: &OsStr,
        shown: String,
    ) -> Result<EntryStat, VolumeError> {
        let st = fstatat(
            Some(parent.as_raw_fd()),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(failed(&shown, "reading", self.limit_bytes))?;
        let target = match kind_of(&st) {
            EntryKind::Symlink => nix::fcntl::readlinkat(Some(parent.as_raw_fd()), name)
                .ok()
                .map(|t| t.to_string_lossy().into_owned()),
            _ => None,
        };
        Ok(entry(name, shown, &st, target))
    }

    /// What `path` is (a symlink itself, not its target).
    pub fn stat(&self, path: &str) -> Result<EntryStat, VolumeError> {
        let parsed = VolumePath::parse(path)?;
        let shown = parsed.display();
        match parsed.split_last() {
            None => {
                let st = fstat(self.root.as_raw_fd()).map_err(failed(
                    &shown,
                    "reading",
                    self.limit_bytes,
                ))?;
                Ok(entry(OsStr::new(""), shown, &st, None))
            }
            Some((parent, name)) => {
                let parent = self.dir_fd(&parent, &shown)?;
                self.stat_at(&parent, OsStr::new(name), shown)
            }
        }
    }

    /// The entries under directory `path`, down to `depth` levels (1: its own entries), at
    /// most [`MAX_LISTED`] of them. Depth first, so that no more directories are open at once
    /// than `depth`; an entry that vanishes meanwhile is left out.
    pub fn list(&self, path: &str, depth: u32) -> Result<Vec<EntryStat>, VolumeError> {
        if depth == 0 || depth as usize > MAX_DEPTH {
            return Err(VolumeError::BadPath(format!(
                "depth must be from 1 to {MAX_DEPTH}"
            )));
        }
        let parsed = VolumePath::parse(path)?;
        let shown = parsed.display();
        let start = self.dir_fd(&parsed.relative(), &shown)?;
        let too_many = || {
            VolumeError::BadPath(format!(
                "'{shown}' holds more than {MAX_LISTED} entries at this depth; list less deep"
            ))
        };
        let read = |dir: &OwnedFd, at: &str, most: usize| {
            walk::names(dir, most)
                .map_err(failed(at, "listing", self.limit_bytes))?
                .ok_or_else(too_many)
        };
        let mut found = Vec::new();
        let mut names_read = 0;
        let top = shown.trim_end_matches('/').to_owned();
        let names = read(&start, &shown, MAX_LISTED)?;
        names_read += names.len();
        let mut stack = vec![(start, top, names)];
        loop {
            let level = stack.len();
            let Some((dir, at, names)) = stack.last_mut() else {
                break;
            };
            let Some(name) = names.pop() else {
                stack.pop();
                continue;
            };
            let stat = match self.stat_at(dir, &name, format!("{at}/{}", name.to_string_lossy())) {
                Err(VolumeError::PathNotFound(_)) => continue,
                other => other?,
            };
            if stat.kind == EntryKind::Directory && level < depth as usize {
                match walk::open_dir(dir.as_raw_fd(), &name) {
                    Ok(sub) => {
                        let names = read(&sub, &stat.path, MAX_LISTED - names_read)?;
                        names_read += names.len();
                        stack.push((sub, stat.path.clone(), names));
                    }
                    Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => {}
                    Err(e) => return Err(failed(&stat.path, "opening", self.limit_bytes)(e)),
                }
            }
            found.push(stat);
        }
        found.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(found)
    }

    /// The directory that will hold `path`'s last component, made first (with its own
    /// parents) when `parents` is set.
    fn parent_of(&self, parsed: &VolumePath<'_>, parents: bool) -> Result<OwnedFd, VolumeError> {
        let shown = parsed.display();
        let Some((relative, _)) = parsed.split_last() else {
            return Err(VolumeError::BadPath(
                "the volume's root cannot be changed".into(),
            ));
        };
        if !parents {
            return self.dir_fd(&relative, &shown);
        }
        let mut dir = self.dir_fd(".", &shown)?;
        let mut at = String::new();
        for part in &parsed.parts[..parsed.parts.len() - 1] {
            at = format!("{at}/{part}");
            match mkdirat(
                Some(dir.as_raw_fd()),
                *part,
                Mode::from_bits_truncate(0o755),
            ) {
                Ok(()) => {
                    let made = self.entry_fd(&dir, part, &at)?;
                    let st = fstat(made.as_raw_fd()).map_err(failed(
                        &at,
                        "reading",
                        self.limit_bytes,
                    ))?;
                    let owner = MetadataChange {
                        uid: Some(DEFAULT_UID),
                        gid: Some(DEFAULT_GID),
                        mode: None,
                    };
                    apply(&made, &st, &owner).map_err(failed(&at, "changing", self.limit_bytes))?;
                }
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(failed(&at, "making", self.limit_bytes)(e)),
            }
            dir = walk::open_dir(dir.as_raw_fd(), OsStr::new(part)).map_err(failed(
                &at,
                "opening",
                self.limit_bytes,
            ))?;
        }
        Ok(dir)
    }

    fn with_defaults(change: &MetadataChange) -> MetadataChange {
        MetadataChange {
            uid: Some(change.uid.unwrap_or(DEFAULT_UID)),
            gid: Some(change.gid.unwrap_or(DEFAULT_GID)),
            mode: change.mode,
        }
    }

    /// Makes directory `path` (and its parents, with `parents`). An existing directory is
    /// fine with `parents`, as `mkdir -p` has it; otherwise it is [`VolumeError::Exists`].
    pub fn make_dir(
        &self,
        path: &str,
        change: &MetadataChange,
        parents: bool,
    ) -> Result<EntryStat, VolumeError> {
        let parsed = VolumePath::parse(path)?;
        let shown = parsed.display();
        let parent = self.parent_of(&parsed, parents)?;
        let (_, name) = parsed.split_last().expect("parent_of refused the root");
        let mode = Mode::from_bits_truncate(change.mode.unwrap_or(0o755));
        match mkdirat(Some(parent.as_raw_fd()), name, mode) {
            Ok(()) => {
                let made = self.entry_fd(&parent, name, &shown)?;
                let st =
                    fstat(made.as_raw_fd()).map_err(failed(&shown, "reading", self.limit_bytes))?;
                // Set explicitly: `mkdirat` applies the server's umask.
                let change = MetadataChange {
                    mode: Some(mode.bits()),
                    ..Self::with_defaults(change)
                };
                apply(&made, &st, &change).map_err(failed(&shown, "changing", self.limit_bytes))?;
            }
            Err(Errno::EEXIST) if parents => {
                let existing = self.stat_at(&parent, OsStr::new(name), shown.clone())?;
                if existing.kind != EntryKind::Directory {
                    return Err(VolumeError::Exists(shown));
                }
            }
            Err(e) => return Err(failed(&shown, "making", self.limit_bytes)(e)),
        }
        self.stat_at(&parent, OsStr::new(name), shown)
    }

    /// Starts writing file `path` (its parents made first with `parents`); the file replaces
    /// what was there only once [`NewFile::commit`] is called, and only if it fits the volume.
    pub fn new_file(
        &self,
        path: &str,
        change: &MetadataChange,
        parents: bool,
    ) -> Result<NewFile, VolumeError> {
        let parsed = VolumePath::parse(path)?;
        let shown = parsed.display();
        let parent = self.parent_of(&parsed, parents)?;
        let (_, name) = parsed.split_last().expect("parent_of refused the root");
        let temp = format!(".airlock-upload-{}", random_token(12));
        let fd = openat(
            Some(parent.as_raw_fd()),
            temp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(failed(&shown, "creating", self.limit_bytes))?;
        Ok(NewFile {
            file: Some(File::from(owned(fd))),
            parent,
            temp,
            name: name.to_owned(),
            shown,
            change: Self::with_defaults(change),
            limit_bytes: self.limit_bytes,
        })
    }

    /// Opens file `path` for reading (following symlinks, inside the volume).
    pub fn read(&self, path: &str) -> Result<File, VolumeError> {
        let parsed = VolumePath::parse(path)?;
        let shown = parsed.display();
        if parsed.parts.is_empty() {
            return Err(VolumeError::BadPath(format!("'{shown}' is a directory")));
        }
        let fd = self.resolve(
            &parsed.relative(),
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            &shown,
        )?;
        let st = fstat(fd.as_raw_fd()).map_err(failed(&shown, "reading", self.limit_bytes))?;
        match kind_of(&st) {
            EntryKind::File => Ok(File::from(fd)),
            EntryKind::Directory => Err(VolumeError::BadPath(format!("'{shown}' is a directory"))),
            _ => Err(VolumeError::BadPath(format!(
                "'{shown}' is not a regular file"
            ))),
        }
    }

    /// Removes `path`: a file or symlink, or a directory with everything in it (however deep
    /// a sandbox made it; see [`walk::remove_tree`]).
    pub fn remove(&self, path: &str) -> Result<(), VolumeError> {
        let parsed = VolumePath::parse(path)?;
        let shown = parsed.display();
        let parent = self.parent_of(&parsed, false)?;
        let (_, name) = parsed.split_last().expect("parent_of refused the root");
        let name = OsStr::new(name);
        let removed = match self.stat_at(&parent, name, shown.clone())?.kind {
            EntryKind::Directory => walk::remove_tree(parent.as_raw_fd(), name),
            _ => unlinkat(Some(parent.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir),
        };
        removed.map_err(failed(&shown, "removing", self.limit_bytes))
    }

    /// Changes `path`'s owner or mode (a symlink's own owner; a symlink has no mode).
    pub fn update(&self, path: &str, change: &MetadataChange) -> Result<EntryStat, VolumeError> {
        let parsed = VolumePath::parse(path)?;
        let shown = parsed.display();
        let (fd, parent) = match parsed.split_last() {
            None => (self.dir_fd(".", &shown)?, None),
            Some((relative, name)) => {
                let parent = self.dir_fd(&relative, &shown)?;
                (self.entry_fd(&parent, name, &shown)?, Some((parent, name)))
            }
        };
        let st = fstat(fd.as_raw_fd()).map_err(failed(&shown, "reading", self.limit_bytes))?;
        if change.mode.is_some() && kind_of(&st) == EntryKind::Symlink {
            return Err(VolumeError::BadPath(format!(
                "'{shown}' is a symlink, which has no mode of its own"
            )));
        }
        apply(&fd, &st, change).map_err(failed(&shown, "changing", self.limit_bytes))?;
        match parent {
            None => self.stat("/"),
            Some((parent, name)) => self.stat_at(&parent, OsStr::new(name), shown),
        }
    }
}

/// A file being uploaded: written under a temporary name beside its destination, moved into
/// place by [`NewFile::commit`], and removed if dropped before that.
pub struct NewFile {
    file: Option<File>,
    parent: OwnedFd,
    temp: String,
    name: String,
    shown: String,
    change: MetadataChange,
    limit_bytes: u64,
}

impl NewFile {
    /// Writes the next part; a full volume (its filesystem's `ENOSPC`) is
    /// [`VolumeError::Full`].
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), VolumeError> {
        let file = self.file.as_mut().expect("written only before commit");
        file.write_all(chunk).map_err(|e| match e.raw_os_error() {
            Some(errno) => failed(&self.shown, "writing", self.limit_bytes)(Errno::from_raw(errno)),
            None => VolumeError::io(format!("writing '{}'", self.shown))(e),
        })
    }

    pub fn commit(mut self) -> Result<EntryStat, VolumeError> {
        let file = self.file.take().expect("committed once");
        let fd = OwnedFd::from(file);
        let st = fstat(fd.as_raw_fd()).map_err(failed(&self.shown, "reading", self.limit_bytes))?;
        apply(&fd, &st, &self.change).map_err(failed(&self.shown, "changing", self.limit_bytes))?;
        drop(fd);
        renameat(
            Some(self.parent.as_raw_fd()),
            self.temp.as_str(),
            Some(self.parent.as_raw_fd()),
            self.name.as_str(),
        )
        .map_err(failed(&self.shown, "replacing", self.limit_bytes))?;
        self.temp.clear();
        let tree_stat = fstatat(
            Some(self.parent.as_raw_fd()),
            self.name.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(failed(&self.shown, "reading", self.limit_bytes))?;
        Ok(entry(
            OsStr::new(&self.name),
            self.shown.clone(),
            &tree_stat,
            None,
        ))
    }
}

impl Drop for NewFile {
    fn drop(&mut self) {
        if !self.temp.is_empty() {
            let _ = unlinkat(
                Some(self.parent.as_raw_fd()),
                self.temp.as_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(tree: &VolumeTree, path: &str, data: &[u8]) -> Result<EntryStat, VolumeError> {
        let mut file = tree.new_file(path, &MetadataChange::default(), true)?;
        file.write(data)?;
        file.commit()
    }

    fn read(tree: &VolumeTree, path: &str) -> Result<String, VolumeError> {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut tree.read(path)?, &mut text).unwrap();
        Ok(text)
    }

    #[test]
    fn files_stay_inside_and_symlinks_resolve_in_the_volume() {
        let host = tempfile::tempdir().unwrap();
        let volume = host.path().join("vol");
        std::fs::create_dir(&volume).unwrap();
        std::fs::write(host.path().join("secret"), "host").unwrap();
        let tree = VolumeTree::open(&volume, 1).unwrap();

        assert_eq!(write(&tree, "a/b.txt", b"hi").unwrap().path, "/a/b.txt");
        assert_eq!(read(&tree, "/a/b.txt").unwrap(), "hi");
        std::os::unix::fs::symlink(host.path().join("secret"), volume.join("out")).unwrap();
        std::os::unix::fs::symlink("/a/b.txt", volume.join("in")).unwrap();
        assert!(matches!(
            read(&tree, "out"),
            Err(VolumeError::PathNotFound(_))
        ));
        assert_eq!(read(&tree, "in").unwrap(), "hi");
        assert_eq!(tree.stat("out").unwrap().kind, EntryKind::Symlink);

        write(&tree, "out", b"replaced").unwrap();
        assert_eq!(
            std::fs::read_to_string(host.path().join("secret")).unwrap(),
            "host"
        );
        let paths: Vec<String> = tree
            .list("/", 2)
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(paths, ["/a", "/a/b.txt", "/in", "/out"]);

        // A write that fails (here: to a directory) leaves no temporary file.
        assert!(write(&tree, "a", b"x").is_err());
        assert_eq!(tree.list("/", 1).unwrap().len(), 3);

        tree.remove("a").unwrap();
        assert!(matches!(tree.stat("a"), Err(VolumeError::PathNotFound(_))));
        assert!(matches!(tree.remove("/"), Err(VolumeError::BadPath(_))));
    }

    #[test]
    fn names_that_are_not_utf8_are_listed_and_removed() {
        use std::os::unix::ffi::OsStrExt;
        let host = tempfile::tempdir().unwrap();
        let volume = host.path().join("vol");
        let odd = volume.join("d").join(OsStr::from_bytes(b"\xff\xfe"));
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::write(odd.join("f"), "x").unwrap();
        let tree = VolumeTree::open(&volume, 1).unwrap();
        let paths: Vec<String> = tree
            .list("/", 3)
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(
            paths,
            ["/d", "/d/\u{fffd}\u{fffd}", "/d/\u{fffd}\u{fffd}/f"]
        );
        assert!(matches!(tree.list("/", 129), Err(VolumeError::BadPath(_))));
        tree.remove("d").unwrap();
        assert!(tree.list("/", 1).unwrap().is_empty());
    }
}
