//! The sandbox's disk limit: its writable layer lives on a filesystem of exactly that size.
//!
//! runsc's `--overlay2=root:dir=…` keeps a sandbox's writes in a filestore file in that
//! directory, and this runsc sets no bound on it (`df /` inside says 8 EiB). So the directory is a
//! mount of its own: a sparse file in the bundle, formatted ext4 and loop-mounted. Writes past
//! the size fail inside the sandbox with `ENOSPC`; the host disk only ever holds what was
//! written; and the file goes with the bundle. It costs about 20 ms per start (mkfs and mount).
//! No journal: the layer never outlives its sandbox, so there is nothing to recover.
//!
//! A volume is held the same way, with a journal: it outlives sandboxes and servers.

use crate::{host_cmd, loop_device};
use airlock_core::driver::DriverError;
use nix::mount::MsFlags;
use std::io;
use std::path::Path;
use tokio::process::Command;

/// Whether a filesystem made by [`mount_limited`] outlives what uses it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifetime {
    /// Gone with its sandbox: no journal.
    Sandbox,
    /// Kept across crashes: journalled.
    Kept,
}

/// Makes `dir` a fresh filesystem of `size_mb`, backed by the sparse file `image`.
pub(crate) async fn mount_limited(
    image: &Path,
    dir: &Path,
    size_mb: u64,
    lifetime: Lifetime,
) -> Result<(), DriverError> {
    let file = std::fs::File::create(image)
        .map_err(DriverError::io(format!("creating {}", image.display())))?;
    file.set_len(size_mb << 20)
        .map_err(DriverError::io(format!("sizing {}", image.display())))?;
    drop(file);
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.args(["-q", "-F", "-m", "0"]);
    if lifetime == Lifetime::Sandbox {
        mkfs.args(["-O", "^has_journal"]);
    }
    mkfs.args(["-E", "lazy_itable_init=1,nodiscard"]).arg(image);
    host_cmd::run("mkfs.ext4", mkfs, None).await?;
    mount_existing(image, dir).await
}

/// Mounts the filesystem in `image` (made by [`mount_limited`]) at `dir`, through a loop
/// device of its own.
pub(crate) async fn mount_existing(image: &Path, dir: &Path) -> Result<(), DriverError> {
    let (image, dir) = (image.to_owned(), dir.to_owned());
    let what = format!("mounting {} at {}", image.display(), dir.display());
    tokio::task::spawn_blocking(move || {
        loop_device::mount_attached(&image, |device| {
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
            nix::mount::mount(Some(device), &dir, Some("ext4"), flags, None::<&str>)
                .map_err(io::Error::from)
        })
    })
    .await
    .unwrap_or_else(|panicked| Err(io::Error::other(panicked)))
    .map_err(DriverError::io(what))
}

/// Unmounts `dir` if it is mounted; the loop device goes with it. Lazy, so a runsc that has not
/// quite let go yet does not make teardown fail.
pub(crate) fn unmount(dir: &Path) -> Result<(), DriverError> {
    match nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(DriverError::io(format!("unmounting {}", dir.display()))(
            e.into(),
        )),
    }
}

/// Whether `dir` is the root of a filesystem other than its parent's.
pub(crate) fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    match (dev(dir), dir.parent().and_then(dev)) {
        (Some(own), Some(parent)) => own != parent,
        _ => false,
    }
}

/// Bytes in use on `dir`'s own filesystem, or `None` if `dir` is not a mount point.
pub(crate) fn used(dir: &Path) -> Option<u64> {
    if !is_mount_point(dir) {
        return None;
    }
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((stat.blocks() - stat.blocks_free()) * stat.fragment_size())
}
