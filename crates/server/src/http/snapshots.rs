//! A sandbox's saved states, as E2B's SDK makes them: pause and resume, snapshots that new
//! sandboxes start from (and their list), and forks of a running sandbox.

use crate::http::auth::{Caller, Owned};
use crate::http::error::ApiError;
use crate::http::sandboxes::{resume_mode, sandbox_body};
use crate::AppState;
use airlock_core::store::{PauseMode, SnapshotRecord};
use airlock_request::JsonBody;
use airlock_wire::api::{
    ErrorBody, ForkRequest, ForkResult, PauseBody, SnapshotInfo, SnapshotRequest, TimeoutBody,
};
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::HashMap;
use std::time::Duration;

/// Most forks one call may ask for (E2B's limit).
const MAX_FORKS: usize = 20;

/// The body is optional: `{"memory": false}` keeps the files only; `requireHealthyGuest`
/// refuses to pause a sandbox whose agent does not answer.
pub(crate) async fn pause(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<PauseBody>,
) -> Result<StatusCode, ApiError> {
    let mode = match body.memory {
        Some(false) => PauseMode::Filesystem,
        _ => PauseMode::Full,
    };
    let healthy_guest = body.require_healthy_guest.unwrap_or(false);
    let paused = state.lifecycle.pause(&id, mode, healthy_guest);
    state.verbs.timed("pause", paused).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn resume(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<TimeoutBody>,
) -> Result<Response, ApiError> {
    let timeout = body.timeout.map(Duration::from_secs);
    let resumed = state.lifecycle.resume(&id, timeout, resume_mode(&body));
    let sandbox = state.verbs.timed("resume", resumed).await?;
    Ok((
        StatusCode::CREATED,
        Json(sandbox_body(&state, &sandbox.record()).await),
    )
        .into_response())
}

fn snapshot_info(s: &SnapshotRecord) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: s.id.to_string(),
        names: vec![s.id.to_string()],
    }
}

pub(crate) async fn create_snapshot(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<SnapshotRequest>,
) -> Result<Response, ApiError> {
    let saved = state.lifecycle.snapshot(&id, body.name.as_deref());
    let snapshot = state.verbs.timed("snapshot", saved).await?;
    Ok((StatusCode::CREATED, Json(snapshot_info(&snapshot))).into_response())
}

/// `?sandboxID=` narrows to one source sandbox, `?name=` to one snapshot.
pub(crate) async fn list_snapshots(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Vec<SnapshotInfo>>, ApiError> {
    let source = query.get("sandboxID");
    let name = query.get("name");
    Ok(Json(
        state
            .lifecycle
            .snapshots(&caller.0)
            .await?
            .iter()
            .filter(|s| source.is_none_or(|id| s.source_sandbox.as_str() == id))
            .filter(|s| name.is_none_or(|n| s.id.as_str() == n))
            .map(snapshot_info)
            .collect(),
    ))
}

pub(crate) async fn fork(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<ForkRequest>,
) -> Result<Response, ApiError> {
    let count = body.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(ApiError::bad_request(format!(
            "count must be 1..={MAX_FORKS}"
        )));
    }
    let forks = state
        .lifecycle
        .fork(&id, count, body.timeout.map(Duration::from_secs))
        .await?;
    let mut entries = Vec::with_capacity(forks.len());
    for fork in forks {
        entries.push(match fork {
            Ok(sandbox) => ForkResult::Sandbox(sandbox_body(&state, &sandbox.record()).await),
            Err(e) => {
                let e = ApiError::from(e);
                ForkResult::Error(ErrorBody {
                    code: e.status.as_u16(),
                    message: e.message,
                })
            }
        });
    }
    Ok((StatusCode::CREATED, Json(entries)).into_response())
}
