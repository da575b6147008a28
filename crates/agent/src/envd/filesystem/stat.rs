//! Stat: one entry, described as envd describes it (see `entry`).

use super::blocking::{blocking, io_error};
use super::entry::{entry_info, IdNames};
use crate::config::Config;
use crate::rpc::{self, RpcResult};
use airlock_wire::envd::{EntryResponse, StatRequest};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use std::sync::Arc;

pub(super) async fn stat(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<EntryResponse> {
    let req: StatRequest = rpc::parse_unary(&body)?;
    let path = config.rpc_user(&headers)?.resolve(&req.path)?;
    let entry =
        blocking(move || entry_info(&path, &IdNames::load()).map_err(|e| io_error(&e, &path)))
            .await?;
    Ok(Json(EntryResponse { entry }))
}
