//! What a key can learn about and change on its templates, as E2B's API has it: the list
//! (`GET /templates`, `GET /v2/templates`), one template with its builds (`GET /templates/{id}`),
//! making one public or private again (`PATCH /templates/{id}`, `PATCH /v2/templates/{id}`),
//! looking a name up (`Template.exists`) and deleting one (`DELETE /templates/{id}`).
//! Each key sees only its own; a public template is usable by every key, not listed for it.

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::templates::{find_owned, owned};
use crate::AppState;
use airlock_core::store::{BuildRecord, BuildStatus, UserTemplate};
use airlock_request::JsonBody;
use airlock_wire::templates::{
    TemplateAlias, TemplateBuildInfo, TemplateInfo, TemplateUpdate, TemplateUpdated,
    TemplateWithBuilds,
};
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::Json;

pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<TemplateInfo>>, ApiError> {
    let mut templates = Vec::new();
    for template in state.store.templates().user_templates_of(&caller.0).await? {
        let builds = state.store.templates().builds_of(&template.id).await?;
        templates.push(info(&state, &template, &builds));
    }
    templates.sort_by(|a, b| b.created_at.cmp(&a.created_at));
    Ok(Json(templates))
}

/// One of the caller's templates with its builds (E2B's `TemplateWithBuilds`).
pub(crate) async fn detail(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<TemplateWithBuilds>, ApiError> {
    let template = owned(&state, &caller, &id).await?;
    let builds = state.store.templates().builds_of(&template.id).await?;
    let (cpu_count, memory_mb) = resources(&state, &template);
    Ok(Json(TemplateWithBuilds {
        template: info(&state, &template, &builds),
        builds: builds
            .iter()
            .map(|b| TemplateBuildInfo {
                build_id: b.id.clone(),
                status: b.status.as_str().into(),
                created_at: iso(b.created_at),
                updated_at: iso(b.finished_at.unwrap_or(b.created_at)),
                finished_at: b.finished_at.map(iso),
                cpu_count,
                memory_mb,
            })
            .collect(),
    }))
}

pub(crate) async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TemplateUpdate>,
) -> Result<Json<TemplateUpdated>, ApiError> {
    let template = owned(&state, &caller, &id).await?;
    let updated = UserTemplate {
        public: body.public.unwrap_or(template.public),
        ..template
    };
    state
        .store
        .templates()
        .update_user_template(&updated)
        .await?;
    Ok(Json(TemplateUpdated {
        names: names(&updated),
    }))
}

/// `Template.exists`: 200 for a name (or `name:tag`) the caller can start, 404 otherwise
/// (another key's private template included, and one whose builds all failed: there is
/// nothing to start).
pub(crate) async fn alias(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(alias): Path<String>,
) -> Result<Json<TemplateAlias>, ApiError> {
    let (record, template) = state
        .store
        .templates()
        .visible_template(Some(&caller.0), &alias)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("template '{alias}' not found")))?;
    Ok(Json(match template {
        Some(t) => TemplateAlias {
            template_id: t.id.to_string(),
            public: t.public,
        },
        None => TemplateAlias {
            template_id: record.name.to_string(),
            public: true,
        },
    }))
}

/// `Template.exists("{key id}/name")`: the SDK puts the slash into the path as it is.
pub(crate) async fn namespaced_alias(
    state: State<AppState>,
    caller: Extension<Caller>,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<Json<TemplateAlias>, ApiError> {
    alias(state, caller, Path(format!("{namespace}/{name}"))).await
}

/// Deletes the caller's template or snapshot of that name (E2B's SDK deletes both here).
pub(crate) async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if delete_owned(&state, &caller, &id).await?
        || state.lifecycle.delete_snapshot(&caller.0, &id).await?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("snapshot '{id}' not found")))
    }
}

/// `DELETE /templates/{id}` for a user template (snapshots share the route; see [`delete`]).
/// Sandboxes running from it keep its files, which stay on disk.
async fn delete_owned(state: &AppState, caller: &Caller, id: &str) -> Result<bool, ApiError> {
    let Some(template) = find_owned(state, caller, id).await? else {
        return Ok(false);
    };
    state
        .store
        .templates()
        .delete_user_template(&template.id)
        .await?;
    Ok(true)
}

fn resources(state: &AppState, t: &UserTemplate) -> (u32, u32) {
    let defaults = state.lifecycle.limits().default_resources;
    (
        t.cpu_count.unwrap_or(defaults.cpu_count),
        t.memory_mb.unwrap_or(defaults.memory_mb),
    )
}

fn info(state: &AppState, t: &UserTemplate, builds: &[BuildRecord]) -> TemplateInfo {
    let latest = builds.first();
    let ready = builds.iter().filter(|b| b.status == BuildStatus::Ready);
    let (cpu_count, memory_mb) = resources(state, t);
    TemplateInfo {
        template_id: t.id.to_string(),
        build_id: latest.map(|b| b.id.clone()).unwrap_or_default(),
        cpu_count,
        memory_mb,
        disk_size_mb: state.lifecycle.limits().default_resources.disk_mb,
        public: t.public,
        aliases: vec![t.alias.to_string()],
        names: names(t),
        created_at: iso(t.created_at),
        updated_at: iso(ready
            .filter_map(|b| b.finished_at)
            .max()
            .unwrap_or(t.created_at)),
        created_by: None,
        last_spawned_at: None,
        spawn_count: 0,
        build_count: builds.len() as u64,
        envd_version: airlock_wire::ENVD_VERSION.into(),
        build_status: latest
            .map_or(BuildStatus::Waiting, |b| b.status)
            .as_str()
            .into(),
    }
}

/// A template's names, as E2B lists them: its alias, which only its owner's key starts it by,
/// and `{owner's key id}/{alias}`, by which any key starts it once it is public.
pub(crate) fn names(t: &UserTemplate) -> Vec<String> {
    vec![t.alias.to_string(), format!("{}/{}", t.owner, t.alias)]
}

fn iso(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
