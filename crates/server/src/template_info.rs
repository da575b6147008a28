//! What a key can learn about and change on its templates, as E2B's API has it: the list
//! (`GET /templates`, `GET /v2/templates`), one template with its builds (`GET /templates/{id}`),
//! and making one public or private again (`PATCH /templates/{id}`, `PATCH /v2/templates/{id}`).
//! Each key sees only its own; a public template is usable by every key, not listed for it.

use crate::api::Caller;
use crate::error::{ApiError, JsonBody};
use crate::templates_api::owned;
use crate::AppState;
use airlock_core::store::{BuildRecord, BuildStatus, UserTemplate};
use airlock_wire::templates::{
    TemplateBuildInfo, TemplateInfo, TemplateUpdate, TemplateWithBuilds,
};
use axum::extract::{Extension, Path, State};
use axum::routing::get;
use axum::{Json, Router};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/templates", get(list))
        .route("/v2/templates", get(list))
        .route("/templates/{id}", get(detail).patch(update))
        .route("/v2/templates/{id}", axum::routing::patch(update))
}

async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<TemplateInfo>>, ApiError> {
    let mut templates = Vec::new();
    for template in state.store.user_templates()? {
        if template.owner == caller.0 {
            let builds = state.store.builds_of(&template.id)?;
            templates.push(info(&state, &template, &builds));
        }
    }
    templates.sort_by(|a, b| b.created_at.cmp(&a.created_at));
    Ok(Json(templates))
}

/// One of the caller's templates with its builds (E2B's `TemplateWithBuilds`).
async fn detail(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<TemplateWithBuilds>, ApiError> {
    let template = owned(&state, &caller, &id)?;
    let builds = state.store.builds_of(&template.id)?;
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

async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TemplateUpdate>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let template = owned(&state, &caller, &id)?;
    let updated = UserTemplate {
        public: body.public.unwrap_or(template.public),
        ..template
    };
    state.store.update_user_template(&updated)?;
    Ok(Json(serde_json::json!({ "names": names(&updated) })))
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
