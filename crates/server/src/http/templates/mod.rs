//! Users' templates, as E2B's template builder and SDK call them (protocol doc §2.6): their
//! builds, what a key learns about them and their tags, and the uploads of COPY's files.
//!
//! A template belongs to the key that built it; another key gets the same 404 as for a name
//! that does not exist. Names are unique per key, and never a built-in's or the key's
//! snapshot's.

pub mod builds;
pub mod info;
pub mod tags;
pub mod uploads;

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::AppState;
use airlock_core::store::{BuildRecord, UserTemplate};

/// The caller's template `id` (its id or alias), if it has one.
pub(crate) async fn find_owned(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Option<UserTemplate>, ApiError> {
    Ok(state
        .store
        .templates()
        .user_template_named(Some(&caller.0), id)
        .await?
        .filter(|t| t.owner == caller.0))
}

/// The caller's template `id` (its id or alias), or 404.
pub(crate) async fn owned(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<UserTemplate, ApiError> {
    find_owned(state, caller, id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("template '{id}' not found")))
}

/// The build `build` of the caller's template `id`, or 404.
pub(crate) async fn owned_build(
    state: &AppState,
    caller: &Caller,
    id: &str,
    build: &str,
) -> Result<(UserTemplate, BuildRecord), ApiError> {
    let template = owned(state, caller, id).await?;
    match state.store.templates().build(build).await? {
        Some(b) if b.template_id == template.id => Ok((template, b)),
        _ => Err(ApiError::not_found(format!(
            "build '{build}' of template '{id}' not found"
        ))),
    }
}
