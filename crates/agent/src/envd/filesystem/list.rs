//! ListDir: a directory's entries down to a depth, as Go's `filepath.WalkDir` lists them.

use super::blocking::{blocking, io_error};
use super::entry::{build_entry, IdNames};
use crate::config::Config;
use crate::rpc::{self, RpcError, RpcResult};
use airlock_wire::connect::Code;
use airlock_wire::envd::{EntryInfo, ListDirRequest, ListDirResponse};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// ListDir depths beyond this are clamped: deeper trees are listed only this far.
const MAX_LIST_DEPTH: u32 = 256;
/// ListDir refuses to answer with more entries than this (the response is held in memory).
const MAX_LIST_ENTRIES: usize = 100_000;

pub(super) async fn list_dir(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<ListDirResponse> {
    let req: ListDirRequest = rpc::parse_unary(&body)?;
    let path = config.rpc_user(&headers)?.resolve(&req.path)?;
    let depth = req.depth.clamp(1, MAX_LIST_DEPTH);
    let entries = blocking(move || {
        // The listed directory itself may be a symlink (envd resolves it); entries below it are
        // reported under the path the client asked for and are never followed.
        match fs::metadata(&path) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(RpcError::invalid(format!(
                    "path is not a directory: {}",
                    path.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(RpcError::not_found(format!(
                    "directory not found: {}",
                    path.display()
                )))
            }
            Err(e) => return Err(io_error(&e, &path)),
        }
        walk(&path, depth, &IdNames::load())
    })
    .await?;
    Ok(Json(ListDirResponse { entries }))
}

/// Lists `root`'s entries down to `depth` levels in Go's `filepath.WalkDir` order: depth-first,
/// each directory's entries sorted by name. Symlinks are listed, never followed.
fn walk(root: &Path, depth: u32, names: &IdNames) -> Result<Vec<EntryInfo>, RpcError> {
    let mut entries = Vec::new();
    let mut stack = vec![(sorted_children(root).map_err(|e| io_error(&e, root))?, 1)];
    while let Some((children, level)) = stack.last_mut() {
        let level = *level;
        let Some(child) = children.next() else {
            stack.pop();
            continue;
        };
        let md = match fs::symlink_metadata(&child) {
            Ok(md) => md,
            // Removed while we were listing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(&e, &child)),
        };
        if entries.len() >= MAX_LIST_ENTRIES {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                format!(
                    "{} has more than {MAX_LIST_ENTRIES} entries within depth {depth}; list a smaller depth or a subdirectory",
                    root.display()
                ),
            ));
        }
        entries.push(build_entry(&child, &md, names));
        if md.is_dir() && level < depth {
            match sorted_children(&child) {
                Ok(grandchildren) => stack.push((grandchildren, level + 1)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&e, &child)),
            }
        }
    }
    Ok(entries)
}

fn sorted_children(dir: &Path) -> io::Result<std::vec::IntoIter<PathBuf>> {
    let mut names = fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<io::Result<Vec<_>>>()?;
    names.sort();
    Ok(names
        .into_iter()
        .map(|name| dir.join(name))
        .collect::<Vec<_>>()
        .into_iter())
}
