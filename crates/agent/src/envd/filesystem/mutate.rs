//! The RPCs that change the tree: MakeDir, Move and Remove.

use super::blocking::{blocking, io_error};
use super::entry::{ensure_dirs, entry_info, IdNames};
use crate::config::Config;
use crate::rpc::{self, RpcError, RpcResult};
use airlock_wire::connect::Code;
use airlock_wire::envd::{EntryResponse, MakeDirRequest, MoveRequest, RemoveRequest};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;

pub(super) async fn make_dir(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<EntryResponse> {
    let req: MakeDirRequest = rpc::parse_unary(&body)?;
    let user = config.rpc_user(&headers)?;
    let path = user.resolve(&req.path)?;
    let entry = blocking(move || {
        match fs::metadata(&path) {
            Ok(md) if md.is_dir() => {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!("directory already exists: {}", path.display()),
                ))
            }
            Ok(_) => {
                return Err(RpcError::invalid(format!(
                    "path already exists but it is not a directory: {}",
                    path.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(&e, &path)),
        }
        ensure_dirs(&path, user.uid, user.gid).map_err(|e| io_error(&e, &path))?;
        entry_info(&path, &IdNames::load()).map_err(|e| io_error(&e, &path))
    })
    .await?;
    Ok(Json(EntryResponse { entry }))
}

pub(super) async fn move_entry(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<EntryResponse> {
    let req: MoveRequest = rpc::parse_unary(&body)?;
    let user = config.rpc_user(&headers)?;
    let source = user.resolve(&req.source)?;
    let destination = user.resolve(&req.destination)?;
    let entry = blocking(move || {
        // Check the source first so a missing one doesn't leave new destination dirs behind.
        fs::symlink_metadata(&source).map_err(|e| io_error(&e, &source))?;
        if let Some(parent) = destination.parent() {
            ensure_dirs(parent, user.uid, user.gid).map_err(|e| io_error(&e, parent))?;
        }
        fs::rename(&source, &destination).map_err(|e| io_error(&e, &source))?;
        entry_info(&destination, &IdNames::load()).map_err(|e| io_error(&e, &destination))
    })
    .await?;
    Ok(Json(EntryResponse { entry }))
}

pub(super) async fn remove(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<airlock_wire::envd::Empty> {
    let req: RemoveRequest = rpc::parse_unary(&body)?;
    let path = config.rpc_user(&headers)?.resolve(&req.path)?;
    if path == Path::new("/") {
        return Err(RpcError::invalid("refusing to remove /"));
    }
    blocking(move || {
        let result = match fs::symlink_metadata(&path) {
            Ok(md) if md.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(e) => Err(e),
        };
        match result {
            // Like envd's os.RemoveAll, removing nothing succeeds (the SDK's tests rely on it).
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error(&e, &path)),
            _ => Ok(()),
        }
    })
    .await?;
    Ok(Json(airlock_wire::envd::Empty {}))
}
