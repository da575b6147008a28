//! Walks over trees a sandbox may have made (in a volume, or in a build step's layer): of any
//! depth (a loop of `mkdir d; cd d` goes far past the path caps), with names that are bytes
//! rather than UTF-8, with links anywhere, and changing while they are walked. So walks are loops, never
//! recursion; each holds a bounded number of directories open; names are passed on as the bytes
//! they are; a directory is entered through its parent's descriptor with `O_NOFOLLOW`, never
//! through a link and never through `..`; and what vanishes meanwhile is taken as gone.

use crate::ids::random_token;
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::ffi::{OsStr, OsString};
use std::fs::ReadDir;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most directories one removal holds open (two descriptors each: the directory, and its
/// reading); a deeper tree is cut into pieces.
const MAX_OPEN_DIRS: usize = 32;
/// Rereads of directories, beyond those its own moves call for, before a removal gives up on
/// a tree that something keeps filling.
const SPARE_REREADS: usize = 8;
/// The name a removal gives a subtree it moves aside (see [`remove_tree`]).
const ASIDE_PREFIX: &str = ".airlock-removing-";

/// Opens the directory `name` in `dir`, itself: a symlink is not followed (`ELOOP` or
/// `ENOTDIR`).
pub(crate) fn open_dir(dir: RawFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    let fd = openat(
        Some(dir),
        name,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: `fd` was just returned by a successful open and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn errno(e: std::io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

/// A fresh read of the directory `dir`, from its start (through its `/proc/self/fd` link,
/// which names this very directory wherever it is now).
fn entries(dir: &OwnedFd) -> Result<ReadDir, Errno> {
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())).map_err(errno)
}

/// The entries of `dir`; `None` if there are more than `most`, which are then not all read.
pub(crate) fn names(dir: &OwnedFd, most: usize) -> Result<Option<Vec<OsString>>, Errno> {
    let mut found = Vec::new();
    for entry in entries(dir)? {
        if found.len() == most {
            return Ok(None);
        }
        found.push(entry.map_err(errno)?.file_name());
    }
    Ok(Some(found))
}

/// A directory being removed, read as it is emptied.
struct Removing {
    dir: OwnedFd,
    entries: ReadDir,
    /// Its name in the directory below it on the stack.
    name: OsString,
}

impl Removing {
    fn open(parent: RawFd, name: &OsStr) -> Result<Self, Errno> {
        let dir = open_dir(parent, name)?;
        Ok(Removing {
            entries: entries(&dir)?,
            dir,
            name: name.to_owned(),
        })
    }

    fn fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }
}

/// Removes `path` (a file, a link, or a directory and everything in it, as [`remove_tree`]
/// does) on a blocking thread: what a sandbox made may be any depth, which `remove_dir_all`
/// would recurse through on a small stack.
pub(crate) async fn remove_path(path: &std::path::Path) -> std::io::Result<()> {
    let path = path.to_owned();
    let removed = tokio::task::spawn_blocking(move || {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(Errno::EINVAL);
        };
        let parent: OwnedFd = std::fs::File::open(parent).map_err(errno)?.into();
        match nix::sys::stat::fstatat(
            Some(parent.as_raw_fd()),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR => {
                remove_tree(parent.as_raw_fd(), name)
            }
            Ok(_) => unlinkat(Some(parent.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir),
            Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    });
    removed
        .await
        .map_err(std::io::Error::other)?
        .map_err(std::io::Error::from)
}

/// Removes the directory `name` in `parent` and everything in it, with at most
/// [`MAX_OPEN_DIRS`] directories open: a subdirectory deeper than that is renamed into the
/// top directory being removed, under a name of its own, which is read again before it is
/// removed. Links are removed, never followed.
pub(crate) fn remove_tree(parent: RawFd, name: &OsStr) -> Result<(), Errno> {
    let mut stack = vec![Removing::open(parent, name)?];
    let mut rereads_left = SPARE_REREADS;
    while let Some(top) = stack.last_mut() {
        let dir = top.fd();
        let Some(entry) = top.entries.next() else {
            // Read to its end: removed, unless something was moved into it or made meanwhile.
            let done = stack.pop().expect("the loop's top");
            let below = stack.last().map_or(parent, Removing::fd);
            match unlinkat(Some(below), done.name.as_os_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(Errno::ENOTEMPTY) if rereads_left > 0 => {
                    rereads_left -= 1;
                    stack.push(Removing {
                        entries: entries(&done.dir)?,
                        ..done
                    });
                }
                Err(e) => return Err(e),
            }
            continue;
        };
        let entry = entry.map_err(errno)?;
        let child = entry.file_name();
        let child = child.as_os_str();
        // The kind the directory records (or, if it records none, an lstat's).
        let is_dir = match entry.file_type() {
            Ok(kind) => kind.is_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(errno(e)),
        };
        // A child that changed kind since it was read (`EISDIR`, `ENOTDIR`, `ELOOP`) is met
        // again when its directory is reread.
        if !is_dir {
            match unlinkat(Some(dir), child, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT | Errno::EISDIR) => {}
                Err(e) => return Err(e),
            }
        } else if stack.len() < MAX_OPEN_DIRS {
            match Removing::open(dir, child) {
                Ok(frame) => stack.push(frame),
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => {}
                Err(e) => return Err(e),
            }
        } else {
            let aside = format!("{ASIDE_PREFIX}{}", random_token(16));
            match renameat(Some(dir), child, Some(stack[0].fd()), aside.as_str()) {
                Ok(()) => rereads_left += 1,
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::mkdirat;
    use std::os::unix::ffi::OsStringExt;
    use std::path::Path;

    fn open(path: &Path) -> OwnedFd {
        std::fs::File::open(path).unwrap().into()
    }

    /// Descriptors this process has open.
    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    #[test]
    fn a_tree_far_deeper_than_the_open_directories_is_removed() {
        let host = tempfile::tempdir().unwrap();
        let top = host.path().join("top");
        let outside = host.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("kept"), "kept").unwrap();
        // 3,000 levels, built through descriptors (the path is far past PATH_MAX), with a name
        // that is not UTF-8 and links out of the tree along the way.
        std::fs::create_dir(&top).unwrap();
        let mut at = open(&top);
        let odd = OsString::from_vec(vec![0xff, 0xfe]);
        for level in 0..3_000 {
            if level % 700 == 1 {
                nix::unistd::symlinkat(&outside, Some(at.as_raw_fd()), "out").unwrap();
                mkdirat(Some(at.as_raw_fd()), odd.as_os_str(), Mode::S_IRWXU).unwrap();
                mkdirat(Some(at.as_raw_fd()), "wide", Mode::S_IRWXU).unwrap();
                let wide = open_dir(at.as_raw_fd(), OsStr::new("wide")).unwrap();
                for i in 0..50 {
                    mkdirat(
                        Some(wide.as_raw_fd()),
                        i.to_string().as_str(),
                        Mode::S_IRWXU,
                    )
                    .unwrap();
                }
            }
            mkdirat(Some(at.as_raw_fd()), "d", Mode::S_IRWXU).unwrap();
            at = open_dir(at.as_raw_fd(), OsStr::new("d")).unwrap();
        }
        drop(at);

        let before = open_fds();
        let parent = open(host.path());
        remove_tree(parent.as_raw_fd(), OsStr::new("top")).unwrap();
        drop(parent);
        assert_eq!(open_fds(), before, "every directory opened was closed");
        assert!(!top.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("kept")).unwrap(),
            "kept"
        );
        let left: Vec<_> = std::fs::read_dir(host.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["outside"]);

        // A link or a missing name is not a directory to remove.
        std::os::unix::fs::symlink(&outside, host.path().join("link")).unwrap();
        let parent = open(host.path());
        let link = remove_tree(parent.as_raw_fd(), OsStr::new("link")).unwrap_err();
        assert!(matches!(link, Errno::ELOOP | Errno::ENOTDIR), "{link}");
        assert_eq!(
            remove_tree(parent.as_raw_fd(), OsStr::new("nope")).unwrap_err(),
            Errno::ENOENT
        );
        assert!(outside.join("kept").exists());
    }

    #[test]
    fn names_stop_past_the_most() {
        let host = tempfile::tempdir().unwrap();
        for name in ["a", "b", "c"] {
            std::fs::write(host.path().join(name), "").unwrap();
        }
        let dir = open(host.path());
        let mut all = names(&dir, 3).unwrap().unwrap();
        all.sort();
        assert_eq!(all, ["a", "b", "c"]);
        assert_eq!(names(&dir, 2).unwrap(), None);
    }
}
