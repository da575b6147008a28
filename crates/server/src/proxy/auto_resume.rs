//! E2B's auto-resume: a request through the proxy for a paused sandbox that was created with
//! `lifecycle={"auto_resume": True}` resumes it, and is then served. Only a request that could
//! use the sandbox wakes it: envd's port takes the sandbox's access token, and a port of a
//! sandbox without public traffic its traffic token. A sandbox paused without its memory is not
//! woken, as on E2B: it starts afresh, which a request in flight cannot expect.

use super::target::{port_allowed, sandbox_not_found};
use crate::http::error::ApiError;
use crate::AppState;
use airlock_core::ids::constant_time_eq;
use airlock_core::lifecycle::{LifecycleError, Sandbox};
use airlock_core::store::{PauseMode, SandboxState};
use airlock_wire::{ACCESS_TOKEN_HEADER, ENVD_PORT};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The sandbox `id`, resumed for this request if it may be; else the answer to give.
pub async fn wake(
    state: &AppState,
    id: &str,
    port: u16,
    headers: &HeaderMap,
) -> Result<Arc<Sandbox>, Response> {
    let Ok(record) = state.lifecycle.record_or_adopt(id).await else {
        return Err(sandbox_not_found(id));
    };
    let may_wake = record.state == SandboxState::Paused
        && record.auto_resume
        && if port == ENVD_PORT {
            record.access_token.as_deref().is_none_or(|token| {
                headers
                    .get(ACCESS_TOKEN_HEADER)
                    .is_some_and(|given| constant_time_eq(given.as_bytes(), token.as_bytes()))
            })
        } else {
            port_allowed(&record, headers)
        };
    if !may_wake {
        return Err(sandbox_not_found(id));
    }
    if record.pause_mode == Some(PauseMode::Filesystem) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "sandbox {id} was paused without its memory, so traffic does not resume it; \
                 resume it with connect"
            ),
        )
        .into_response());
    }
    tracing::info!(
        sandbox = id,
        port,
        "traffic for a paused sandbox; resuming it"
    );
    match state.lifecycle.resume(id, None, PauseMode::Full).await {
        Ok(sandbox) => Ok(sandbox),
        // Another request woke it first.
        Err(LifecycleError::AlreadyRunning(_)) => state
            .lifecycle
            .running(id)
            .await
            .map_err(|_| sandbox_not_found(id)),
        Err(e) => Err(ApiError::from(e).into_response()),
    }
}
