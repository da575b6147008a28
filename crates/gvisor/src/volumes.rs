//! Volumes on the host, and how a sandbox gets them.
//!
//! Each volume is a journalled ext4 filesystem in a sparse file next to its directory
//! (`<dir>.ext4`), loop-mounted on it: its size limit holds for a sandbox's writes as for the
//! server's, and the host disk holds only what was written.
//!
//! A sandbox that can be checkpointed has one more bind mount, the *hub*, at `/opt/airlock`
//! (every template has that directory): a small host tmpfs in its bundle, read-only once made,
//! holding the agent's mount point (the spec's agent mount is nested in it) and
//! `volumes/{i}`, on which the driver binds the sandbox's volumes before runsc starts; the
//! agent then binds each at its mount path. Because every sandbox has the hub, golden images
//! and pauses have the same mounts whatever volumes a sandbox has: this runsc silently drops a
//! mount that a restored image did not have, and newer ones refuse it.
//! - The hub is bound recursively (`rbind`): the gofer runs in a user namespace, where a plain
//!   bind of a directory with mounts under it fails (`EINVAL`).
//! - It is read-only so that a sandbox cannot write to the host's disk outside its volumes and
//!   its own disk limit; the volumes are mounts of their own, writable.

use crate::disk::{self, Lifetime};
use airlock_core::driver::DriverError;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::SFlag;
use std::path::{Path, PathBuf};

fn image(dir: &Path) -> PathBuf {
    dir.with_extension("ext4")
}

pub(crate) async fn create(dir: &Path, size_mb: u64) -> Result<(), DriverError> {
    disk::mount_limited(&image(dir), dir, size_mb, Lifetime::Kept).await
}

pub(crate) async fn open(dir: &Path) -> Result<(), DriverError> {
    if disk::is_mount_point(dir) {
        return Ok(());
    }
    disk::mount_existing(&image(dir), dir).await
}

/// Unmounts the volume for a move, unless anything uses it: a process with a file open in it
/// (`umount` refuses) or a mount of it elsewhere, such as in a sandbox's own mount namespace
/// (its loop device is still attached after the unmount: then it is mounted back here through
/// that device, as it was). Returns its image, which then holds all of it.
pub(crate) fn seal(dir: &Path) -> Result<PathBuf, DriverError> {
    let in_use = || DriverError::Command {
        what: format!("moving the volume at {}", dir.display()),
        detail: "something on the host still uses it".into(),
    };
    match umount2(dir, MntFlags::empty()) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) => {}
        Err(nix::errno::Errno::EBUSY) => return Err(in_use()),
        Err(e) => {
            return Err(DriverError::io(format!("unmounting {}", dir.display()))(
                e.into(),
            ))
        }
    }
    let image = image(dir);
    if let Some(device) = crate::loop_device::backing(&image) {
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount(Some(&device), dir, Some("ext4"), flags, None::<&str>)
            .map_err(|e| DriverError::io(format!("mounting {} back", dir.display()))(e.into()))?;
        return Err(in_use());
    }
    Ok(image)
}

/// Unmounts the volume and removes it. A directory that still holds files after the unmount
/// is left (`rmdir`, not a recursive delete): whatever is still in it is not ours to remove.
pub(crate) fn delete(dir: &Path) -> Result<(), DriverError> {
    disk::unmount(dir)?;
    let image = image(dir);
    removed(&image, std::fs::remove_file(&image))?;
    removed(dir, std::fs::remove_dir(dir))
}

/// The outcome of removing `path`, where its being gone already is success.
fn removed(path: &Path, outcome: std::io::Result<()>) -> Result<(), DriverError> {
    match outcome {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(DriverError::io(format!("removing {}", path.display()))(e))
        }
        _ => Ok(()),
    }
}

/// The agent's mount point in the hub: the last part of `AGENT_PATH`.
const AGENT_FILE: &str = "airlock-agent";

/// Makes `hub` a read-only tmpfs holding the agent's mount point and `volumes[i]` bound at
/// `volumes/{i}`.
pub(crate) fn attach(hub: &Path, volumes: &[PathBuf]) -> Result<(), DriverError> {
    let failed = |what: String| move |e: nix::errno::Errno| DriverError::io(what)(e.into());
    std::fs::create_dir(hub).map_err(DriverError::io(format!("creating {}", hub.display())))?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(
        Some("tmpfs"),
        hub,
        Some("tmpfs"),
        flags,
        Some("size=64k,mode=0755"),
    )
    .map_err(failed(format!("mounting a tmpfs at {}", hub.display())))?;
    let inside = |name: &str| hub.join(name);
    // Made with mknod, not opened: a descriptor open for writing, even one that a fork in
    // another thread holds for a moment before its exec, makes the read-only remount fail.
    let file_mode = nix::sys::stat::Mode::from_bits_truncate(0o644);
    nix::sys::stat::mknod(&inside(AGENT_FILE), SFlag::S_IFREG, file_mode, 0)
        .map_err(std::io::Error::from)
        .and_then(|_| std::fs::create_dir(inside("volumes")))
        .map_err(DriverError::io(format!("filling {}", hub.display())))?;
    for (index, volume) in volumes.iter().enumerate() {
        let target = inside("volumes").join(index.to_string());
        std::fs::create_dir(&target)
            .map_err(DriverError::io(format!("creating {}", target.display())))?;
        mount(
            Some(volume),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(failed(format!(
            "binding {} at {}",
            volume.display(),
            target.display()
        )))?;
    }
    mount(
        None::<&str>,
        hub,
        None::<&str>,
        flags | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(failed(format!("making {} read-only", hub.display())))
}

/// Undoes [`attach`] (or what a failed one did). Fails if the hub stays mounted: the caller
/// must then not delete the bundle, or it would delete the volumes' files.
pub(crate) fn detach(hub: &Path) -> Result<(), DriverError> {
    // Detaching the tmpfs detaches the volumes' binds under it too.
    match umount2(hub, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => {
            return Err(DriverError::io(format!("unmounting {}", hub.display()))(
                e.into(),
            ))
        }
    }
    removed(hub, std::fs::remove_dir(hub))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A volume is sealed (its image whole and still) only when nothing uses it: not while a
    /// file in it is open, nor while it is mounted somewhere else too (as in a sandbox's
    /// namespace), and then it stays as it was; sealed, it opens again with its files.
    #[tokio::test]
    #[ignore = "needs root (loop devices and mounts); ./test.sh runs it"]
    async fn root_a_volume_is_sealed_only_when_nothing_uses_it() {
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let dir = tmp.path().join("vol");
        std::fs::create_dir(&dir).unwrap();
        create(&dir, 16).await.unwrap();
        std::fs::write(dir.join("kept.txt"), b"on the volume").unwrap();

        let open_file = std::fs::File::open(dir.join("kept.txt")).unwrap();
        assert!(seal(&dir).is_err(), "a file in it is open");
        assert!(disk::is_mount_point(&dir));
        drop(open_file);

        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let bind = MsFlags::MS_BIND;
        mount(Some(&dir), &elsewhere, None::<&str>, bind, None::<&str>).unwrap();
        assert!(seal(&dir).is_err(), "mounted elsewhere too");
        assert!(disk::is_mount_point(&dir), "mounted back where it was");
        assert_eq!(
            std::fs::read(dir.join("kept.txt")).unwrap(),
            b"on the volume"
        );
        umount2(&elsewhere, MntFlags::empty()).unwrap();

        let image = seal(&dir).unwrap();
        assert_eq!(image, dir.with_extension("ext4"));
        assert!(!disk::is_mount_point(&dir));
        assert!(
            crate::loop_device::backing(&image).is_none(),
            "its device went with it"
        );
        open(&dir).await.unwrap();
        assert_eq!(
            std::fs::read(dir.join("kept.txt")).unwrap(),
            b"on the volume"
        );
        delete(&dir).unwrap();
    }
}
