//! How much disk a tree takes (what `du` says, each hard-linked file counted once), and how
//! much a disk has free.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The bytes of disk blocks the files and directories under `root` take (symlinks are not
/// followed). Blocking: walks the whole tree.
pub fn bytes_on_disk(root: &Path) -> std::io::Result<u64> {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack: Vec<PathBuf> = vec![root.to_owned()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(total)
}

/// Space on the disk a directory is on, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct DiskSpace {
    pub available: u64,
    pub total: u64,
}

/// The disk space of `dir`'s file system; `None` if it cannot be read.
pub fn disk_space(dir: &Path) -> Option<DiskSpace> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(DiskSpace {
        available: stat.blocks_available() * stat.fragment_size(),
        total: stat.blocks() * stat.fragment_size(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_hard_links_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![1u8; 64 * 1024]).unwrap();
        let before = bytes_on_disk(dir.path()).unwrap();
        assert!(before >= 64 * 1024);
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        assert_eq!(bytes_on_disk(dir.path()).unwrap(), before);
        assert!(bytes_on_disk(&dir.path().join("missing")).is_err());
    }
}
