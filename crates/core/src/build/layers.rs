//! Layers: each build step's writes, kept as an overlayfs upper directory under a key made of
//! everything that shaped them, and stacked read-only into a template's root filesystem.
//!
//! A step runs in a gVisor sandbox whose rootfs is a writable overlay mount: the layers below it
//! as lower directories, and a fresh directory as the upper one. Whatever the step writes,
//! deletes (a whiteout) or changes lands in that upper directory, which becomes the layer at
//! `{root}/{key}` by one rename once the step has succeeded: a layer is either whole or absent.
//! Templates built on the same layers share them on disk, so a kept layer never changes: a
//! forced step makes a layer under a new key, and a layer is removed only by the collection at
//! start, once nothing names it.

use super::copy::{ARCHIVE, INBOX};
use super::BuildError;
use std::path::{Path, PathBuf};
use tokio::process::Command;

pub struct Layers {
    root: PathBuf,
    mounts: PathBuf,
}

/// A step's writable overlay: `merged` is the step's rootfs, `upper` its future layer.
pub struct StepMount {
    dir: PathBuf,
    pub merged: PathBuf,
}

impl Layers {
    /// Layers live in `{templates_dir}/layers`, templates' stacked rootfs mounts in
    /// `{templates_dir}/mounts`.
    pub fn new(templates_dir: &Path) -> Self {
        Layers {
            root: templates_dir.join("layers"),
            mounts: templates_dir.join("mounts"),
        }
    }

    pub fn layers_dir(&self) -> &Path {
        &self.root
    }

    pub fn mounts_dir(&self) -> &Path {
        &self.mounts
    }

    pub fn layer(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    pub fn has(&self, key: &str) -> bool {
        self.layer(key).is_dir()
    }

    /// Where a template's stacked rootfs is mounted.
    pub fn rootfs_mount(&self, template: &str, key: &str) -> PathBuf {
        self.mounts
            .join(format!("{template}-{}", &key[..16.min(key.len())]))
    }

    /// Mounts a writable overlay of `chain` (bottom first) for build `build`'s next step. An
    /// `archive` (a `COPY`'s upload) is put into the fresh upper directory first, so that the
    /// step finds it at `/{INBOX}/{ARCHIVE}`: the host only copies it, never unpacks it.
    pub async fn mount_step(
        &self,
        chain: &[PathBuf],
        build: &str,
        archive: Option<&Path>,
    ) -> Result<StepMount, BuildError> {
        let dir = self.root.join(format!(".work-{build}"));
        self.discard_dir(&dir).await?;
        let (upper, work, merged) = (dir.join("upper"), dir.join("work"), dir.join("merged"));
        for d in [&upper, &work, &merged] {
            tokio::fs::create_dir_all(d)
                .await
                .map_err(BuildError::io(format!("creating {}", d.display())))?;
        }
        if let Some(archive) = archive {
            let inbox = upper.join(INBOX);
            tokio::fs::create_dir(&inbox)
                .await
                .map_err(BuildError::io(format!("creating {}", inbox.display())))?;
            tokio::fs::copy(archive, inbox.join(ARCHIVE))
                .await
                .map_err(BuildError::io("placing a COPY's files".into()))?;
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lowerdir(chain)?,
            option_path(&upper)?,
            option_path(&work)?
        );
        mount_overlay(&options, &merged).await?;
        Ok(StepMount { dir, merged })
    }

    /// The bottom layer of an image: the mount points a sandbox needs before the image's own
    /// layers are unpacked over it (the agent's is bind-mounted onto a file, which must exist).
    pub fn scratch(&self) -> Result<PathBuf, BuildError> {
        let layer = self.layer(SCRATCH);
        if !layer.is_dir() {
            let partial = self
                .root
                .join(format!(".work-{SCRATCH}-{:016x}", rand::random::<u64>()));
            let made = make_scratch(&partial).and_then(|()| rename_new(&partial, &layer));
            if let Err(e) = made {
                let _ = std::fs::remove_dir_all(&partial);
                // Another build may have made it at the same moment: theirs is the same.
                if !layer.is_dir() {
                    return Err(BuildError::io(format!("making {}", layer.display()))(e));
                }
            }
        }
        Ok(layer)
    }

    /// Makes layer `key` on the host with `make`, which fills the directory it is given: in a
    /// work directory of build `build`, renamed into place only once `make` has succeeded.
    pub async fn host_made<F, Fut>(&self, key: &str, build: &str, make: F) -> Result<(), String>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let dir = self.root.join(format!(".work-{build}"));
        let discard =
            |dir: PathBuf| async move { self.discard_dir(&dir).await.map_err(|e| e.to_string()) };
        discard(dir.clone()).await?;
        let root = dir.join("root");
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let made = make(root.clone()).await;
        let layer = self.layer(key);
        let kept = match made {
            Ok(()) => match rename_new(&root, &layer) {
                // Another build made it meanwhile: theirs stays.
                Err(_) if layer.is_dir() => Ok(()),
                kept => kept.map_err(|e| format!("keeping layer {key}: {e}")),
            },
            Err(e) => Err(e),
        };
        discard(dir).await?;
        kept
    }

    /// Unmounts the step and keeps what it wrote as layer `key`, without the files the host
    /// handed it (see [`Layers::mount_step`]). If another build made layer `key` meanwhile
    /// (from the same inputs), that one stays and this one goes.
    pub async fn keep(&self, step: StepMount, key: &str) -> Result<PathBuf, BuildError> {
        unmount(&step.merged).await?;
        let inbox = step.dir.join("upper").join(INBOX);
        // `symlink_metadata`: the step may have put anything there; only our directory goes
        // (and the removal never follows a link under it).
        if std::fs::symlink_metadata(&inbox).is_ok_and(|m| m.is_dir()) {
            remove_all(&inbox).await?;
        }
        let layer = self.layer(key);
        if let Err(e) = rename_new(&step.dir.join("upper"), &layer) {
            if !layer.is_dir() {
                return Err(BuildError::io(format!("keeping layer {key}"))(e));
            }
        }
        remove_all(&step.dir).await?;
        Ok(layer)
    }

    /// Keeps `dir`, a layer fetched from another node, as layer `key`, unless it is here
    /// already (fetched meanwhile: that one stays).
    pub fn keep_fetched(&self, dir: &Path, key: &str) -> std::io::Result<()> {
        match rename_new(dir, &self.layer(key)) {
            Err(_) if self.has(key) => Ok(()),
            kept => kept,
        }
    }

    /// Unmounts the step and throws away what it wrote.
    pub async fn discard(&self, step: StepMount) -> Result<(), BuildError> {
        self.discard_dir(&step.dir).await
    }

    async fn discard_dir(&self, dir: &Path) -> Result<(), BuildError> {
        let merged = dir.join("merged");
        if is_mount_point(&merged) {
            unmount(&merged).await?;
        }
        if dir.exists() {
            remove_all(dir).await?;
        }
        Ok(())
    }

    /// Takes `layer` out of the cache at once (a rename, so no build finds it after this),
    /// for [`Layers::remove_aside`] to remove. What is set aside and not removed (the server
    /// stopped) goes with the next start's sweep.
    pub fn set_aside(&self, layer: &Path) -> std::io::Result<PathBuf> {
        let aside = self
            .root
            .join(format!(".work-aside-{:016x}", rand::random::<u64>()));
        std::fs::rename(layer, &aside)?;
        Ok(aside)
    }

    pub async fn remove_aside(&self, aside: &Path) -> Result<(), BuildError> {
        remove_all(aside).await
    }

    /// Removes what builds that were under way when the server stopped left behind.
    pub async fn sweep_work(&self) -> Result<(), BuildError> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".work-") {
                self.discard_dir(&entry.path()).await?;
            }
        }
        Ok(())
    }

    /// Unmounts every template rootfs mounted by [`Layers::mount_rootfs`].
    pub async fn unmount_all(&self) -> Result<(), BuildError> {
        let Ok(entries) = std::fs::read_dir(&self.mounts) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            if is_mount_point(&entry.path()) {
                unmount(&entry.path()).await?;
            }
        }
        Ok(())
    }

    /// Mounts `chain` (bottom first, at least two directories) read-only at `target`, unless
    /// something is mounted there already (a restarted server's templates stay mounted). The
    /// chain is recorded beside the mount ([`Layers::chain_of`]), so that a sandbox's rootfs
    /// whose template has gone can be mounted again, and its layers are known to be in use.
    pub async fn mount_rootfs(&self, chain: &[PathBuf], target: &Path) -> Result<(), BuildError> {
        if is_mount_point(target) {
            return Ok(());
        }
        tokio::fs::create_dir_all(target)
            .await
            .map_err(BuildError::io(format!("creating {}", target.display())))?;
        let record = chain_record(target);
        let listed: String = chain.iter().map(|l| format!("{}\n", l.display())).collect();
        tokio::fs::write(&record, listed)
            .await
            .map_err(BuildError::io(format!("writing {}", record.display())))?;
        mount_overlay(&format!("ro,lowerdir={}", lowerdir(chain)?), target).await
    }

    /// The layers of the rootfs mount at `target`, bottom first, as [`Layers::mount_rootfs`]
    /// recorded them; `None` if it did not (a mount made before it recorded them).
    pub fn chain_of(&self, target: &Path) -> Option<Vec<PathBuf>> {
        let listed = std::fs::read_to_string(chain_record(target)).ok()?;
        Some(listed.lines().map(PathBuf::from).collect())
    }

    /// Unmounts the rootfs mount at `target` unless something has files open in it (then
    /// `false`, and it stays mounted). Its record stays, so that it can be mounted again.
    pub async fn unmount_if_idle(&self, target: &Path) -> Result<bool, BuildError> {
        let target = target.to_owned();
        let unmounted = tokio::task::spawn_blocking(move || {
            nix::mount::umount2(&target, nix::mount::MntFlags::empty())
        })
        .await
        .map_err(|e| BuildError::Host(format!("unmounting a template's rootfs: {e}")))?;
        match unmounted {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::EBUSY) => Ok(false),
            Err(e) => Err(BuildError::io("unmounting a template's rootfs".into())(
                e.into(),
            )),
        }
    }

    /// Unmounts (if mounted) and removes the rootfs mount at `target` and its record.
    pub async fn remove_rootfs(&self, target: &Path) -> Result<(), BuildError> {
        if is_mount_point(target) {
            unmount(target).await?;
        }
        let record = chain_record(target);
        if record.exists() {
            tokio::fs::remove_file(&record)
                .await
                .map_err(BuildError::io(format!("removing {}", record.display())))?;
        }
        if target.exists() {
            remove_all(target).await?;
        }
        Ok(())
    }
}

/// Where the chain of the rootfs mount at `target` is recorded: `{target}.layers`.
fn chain_record(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_owned();
    name.push(".layers");
    target.with_file_name(name)
}

/// The scratch layer's name; bump its version when [`make_scratch`] changes.
const SCRATCH: &str = "scratch-v2";

fn make_scratch(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for d in ["proc", "sys", "dev", "tmp", "etc", "opt/airlock"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    std::fs::write(dir.join("etc/hosts"), b"")?;
    let agent = dir.join("opt/airlock/airlock-agent");
    std::fs::write(&agent, b"")?;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))
}

/// overlayfs's `lowerdir`: the top layer first.
fn lowerdir(chain: &[PathBuf]) -> Result<String, BuildError> {
    let paths: Vec<&str> = chain
        .iter()
        .rev()
        .map(|p| option_path(p))
        .collect::<Result<_, _>>()?;
    Ok(paths.join(":"))
}

/// A path as a mount option: the characters that separate options or layers are refused.
fn option_path(path: &Path) -> Result<&str, BuildError> {
    path.to_str()
        .filter(|p| !p.contains([',', ':', '\\']))
        .ok_or_else(|| {
            BuildError::Host(format!(
                "{} cannot be part of an overlay mount (a comma, colon or backslash in it)",
                path.display()
            ))
        })
}

async fn mount_overlay(options: &str, target: &Path) -> Result<(), BuildError> {
    // Nothing on the host runs or opens devices from a template: its files are for sandboxes.
    let mut mount = Command::new("mount");
    mount
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!("nosuid,nodev,{options}"))
        .arg(target);
    run(mount, "mounting a template's layers").await
}

async fn unmount(target: &Path) -> Result<(), BuildError> {
    let mut umount = Command::new("umount");
    umount.arg(target);
    if run(umount, "unmounting a build step").await.is_ok() {
        return Ok(());
    }
    // Something (a sandbox's gofer going away) still holds it: detach it now.
    let mut lazy = Command::new("umount");
    lazy.arg("-l").arg(target);
    run(lazy, "unmounting a build step").await
}

async fn run(mut cmd: Command, what: &str) -> Result<(), BuildError> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(BuildError::io(what.to_owned()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BuildError::Host(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Renames `from` to `to` unless something is at `to` already (`RENAME_NOREPLACE`): a layer,
/// once there, is never replaced.
fn rename_new(from: &Path, to: &Path) -> std::io::Result<()> {
    use nix::fcntl::{renameat2, RenameFlags};
    renameat2(None, from, None, to, RenameFlags::RENAME_NOREPLACE).map_err(std::io::Error::from)
}

/// Removes a layer or a step's directory: what a build sandbox wrote, so any depth (see
/// `crate::walk`).
async fn remove_all(dir: &Path) -> Result<(), BuildError> {
    crate::walk::remove_path(dir)
        .await
        .map_err(BuildError::io(format!("removing {}", dir.display())))
}

/// Whether `path` is the root of a mount: its device differs from its parent's.
pub fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(this), Some(Ok(parent))) = (
        std::fs::symlink_metadata(path),
        path.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    this.dev() != parent.dev()
}
