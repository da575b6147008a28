//! Template tags, as E2B's SDK manages them (`Template.assign_tags`, `remove_tags`,
//! `get_tags`): `name:tag` names one build of a template (see `airlock_core::store` for how
//! they are kept). Only a template's owner sees or moves its tags; another key gets the same
//! 404 as for a name that does not exist.

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::templates::owned;
use crate::AppState;
use airlock_core::store::{split_reference, valid_tag, DEFAULT_TAG};
use airlock_request::JsonBody;
use airlock_wire::templates::{AssignedTags, TagAssignment, TagRemoval, TemplateTagInfo};
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::Json;

/// Most tags one request may name.
const MAX_TAGS: usize = 100;

/// The tags a request names, checked, each once, in the order given; at least one.
pub(crate) fn checked_tags<'a>(
    tags: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<String>, ApiError> {
    let mut checked: Vec<String> = Vec::new();
    for tag in tags {
        if !valid_tag(tag) {
            return Err(ApiError::bad_request(format!(
                "'{tag}' is not a valid tag: 1-128 letters, digits, '_', '.' and '-', not \
                 starting with '.' or '-'"
            )));
        }
        if !checked.iter().any(|t| t == tag) {
            checked.push(tag.to_owned());
        }
    }
    if checked.is_empty() {
        return Err(ApiError::bad_request("name at least one tag"));
    }
    if checked.len() > MAX_TAGS {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_TAGS} tags at once"
        )));
    }
    Ok(checked)
}

/// `POST /templates/tags`: points tags at the build `target` names (its `default` without a
/// tag), moving them from the builds they named.
pub(crate) async fn assign(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<TagAssignment>,
) -> Result<(StatusCode, Json<AssignedTags>), ApiError> {
    let (name, tag) = split_reference(&body.target);
    let tag = tag.unwrap_or(DEFAULT_TAG);
    let template = owned(&state, &caller, name).await?;
    let build = state
        .store
        .templates()
        .build_tagged(&template.id, tag)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "template '{name}' has no ready build tagged '{tag}'"
            ))
        })?;
    let tags = checked_tags(body.tags.iter().map(String::as_str))?;
    let now = chrono::Utc::now().timestamp();
    state
        .store
        .templates()
        .assign_tags(&template.id, &build, &tags, now)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(AssignedTags {
            tags,
            build_id: build,
        }),
    ))
}

/// `DELETE /templates/tags`: takes tags off a template, all or none. Its builds stay, and
/// start by their ids.
pub(crate) async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<TagRemoval>,
) -> Result<StatusCode, ApiError> {
    if body.name.contains(':') {
        return Err(ApiError::bad_request(format!(
            "'{}': name the template without a tag, and the tags to remove in `tags`",
            body.name
        )));
    }
    let template = owned(&state, &caller, &body.name).await?;
    let tags = checked_tags(body.tags.iter().map(String::as_str))?;
    let missing = state
        .store
        .templates()
        .remove_tags(&template.id, &tags)
        .await?;
    if !missing.is_empty() {
        return Err(ApiError::not_found(format!(
            "template '{}' has no tag {}: no tag was removed",
            body.name,
            missing.join(", ")
        )));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/{id}/tags`: the template's tags and the builds they name.
pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Vec<TemplateTagInfo>>, ApiError> {
    let template = owned(&state, &caller, &id).await?;
    let tags = state.store.templates().tags_of(&template.id).await?;
    Ok(Json(
        tags.into_iter()
            .map(|t| TemplateTagInfo {
                tag: t.tag,
                build_id: t.build_id,
                created_at: chrono::DateTime::from_timestamp(t.created_at, 0)
                    .unwrap_or_default()
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            })
            .collect(),
    ))
}
