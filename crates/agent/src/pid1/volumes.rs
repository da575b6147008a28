//! Volumes: the host hands a sandbox its volumes under [`VOLUMES_DIR`] (one directory per
//! volume, numbered in the order of the create's mounts), and the agent binds each at the path
//! the user asked for.
//!
//! The binds live in the sandbox's own mount table, so a checkpoint keeps them: a resumed
//! sandbox, or one started from a snapshot, has them again as soon as the host puts the same
//! volumes back under [`VOLUMES_DIR`].

use crate::rpc::RpcError;
use airlock_wire::{MAX_VOLUME_MOUNTS, VOLUMES_DIR};
use nix::mount::{mount, MsFlags};
use std::io::ErrorKind;
use std::path::Path;

/// Binds `VOLUMES_DIR/{i}` at `paths[i]`, skipping the paths in `bound` (a sandbox's agent
/// may be asked again after a restore); returns the paths it bound.
pub fn bind_all(paths: &[String], bound: &[String]) -> Result<Vec<String>, RpcError> {
    if paths.len() > MAX_VOLUME_MOUNTS {
        return Err(RpcError::invalid(format!(
            "at most {MAX_VOLUME_MOUNTS} volumes may be mounted"
        )));
    }
    let mut done = Vec::new();
    for (index, path) in paths.iter().enumerate() {
        if bound.contains(path) {
            continue;
        }
        if !path.starts_with('/') {
            return Err(RpcError::invalid(format!(
                "volume mount path '{path}' is not absolute"
            )));
        }
        let source = format!("{VOLUMES_DIR}/{index}");
        std::fs::create_dir_all(path).map_err(|e| match e.kind() {
            ErrorKind::AlreadyExists | ErrorKind::NotADirectory => RpcError::invalid(format!(
                "volume mount path '{path}' is not a directory in this sandbox"
            )),
            _ => RpcError::internal(format!("creating mount point {path}: {e}")),
        })?;
        // Non-recursive: the volume has no mounts of its own, and nothing under the mount
        // point is carried along.
        mount(
            Some(Path::new(&source)),
            Path::new(path),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| RpcError::internal(format!("mounting a volume at {path}: {e}")))?;
        done.push(path.clone());
    }
    Ok(done)
}
