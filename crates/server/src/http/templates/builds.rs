//! A user template's builds, as E2B's template builder runs them (protocol doc §2.6): request a
//! build (of `name`, or `name:tag`), start it with its steps, follow its status and logs,
//! cancel it.

use crate::dockerfile::steps::step;
use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::logs::{timestamp, Page};
use crate::http::templates::{find_owned, owned, owned_build};
use crate::AppState;
use airlock_core::build::image::ImageSource;
use airlock_core::build::{BuildBase, BuildDefinition, BuildJob, BUILDS_KEPT, MAX_LOG_ENTRIES};
use airlock_core::driver::Resources;
use airlock_core::ids::{SandboxId, TemplateName};
use airlock_core::store::{
    split_reference, BuildRecord, BuildStatus, LogEntry, TemplateRecord, UserTemplate, DEFAULT_TAG,
};
use airlock_core::template::KNOWN_TEMPLATES;
use airlock_request::JsonBody;
use airlock_wire::templates::{
    BuildFailureReason, BuildLogEntry, BuildLogsBody, BuildStatusBody, BuildStatusQuery,
    TemplateBuildCreated, TemplateBuildRequest, TemplateBuildStart,
};
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::HashMap;

/// Most log entries one status call returns.
const MAX_LOG_PAGE: u64 = 1000;
/// Most steps one build may have.
const MAX_STEPS: usize = 1000;
/// E2B's base image, which the SDK names when no `from_*` was called: here, the `base` template.
const E2B_BASE_IMAGE: &str = "e2bdev/base";

pub(crate) async fn request_build(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<TemplateBuildRequest>,
) -> Result<Response, ApiError> {
    let given = body
        .name
        .or(body.alias)
        .ok_or_else(|| ApiError::bad_request("name is required"))?;
    if given.contains('/') {
        return Err(ApiError::bad_request(format!(
            "'{given}': a template is named without a namespace; other keys reach it, once \
             it is public, as {{your key id}}/{{name}} (see its `names`)"
        )));
    }
    // `name:tag` and `tags` both tag the build; with neither it is the `default`.
    let (name, tag) = split_reference(&given);
    let asked: Vec<&str> = (tag.into_iter())
        .chain(body.tags.iter().flatten().map(String::as_str))
        .collect();
    let tags = if asked.is_empty() {
        vec![DEFAULT_TAG.to_owned()]
    } else {
        crate::http::templates::tags::checked_tags(asked)?
    };
    let alias = TemplateName::parse(name).map_err(|_| {
        ApiError::bad_request(format!(
            "'{name}' is not a valid template name: 1-64 of a-z, 0-9, '.', '_' and '-', \
             starting with a letter or digit"
        ))
    })?;
    if alias.as_str() == "tags" {
        return Err(ApiError::bad_request(
            "'tags' names the tags route (/templates/tags): choose another name",
        ));
    }
    if KNOWN_TEMPLATES.contains(&alias.as_str()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("'{alias}' is the name of a built-in template; choose another"),
        ));
    }
    if state
        .store
        .snapshots()
        .get(&caller.0, &alias)
        .await?
        .is_some()
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("you have a snapshot named '{alias}'; choose another name"),
        ));
    }
    let max = state.lifecycle.limits().max_resources;
    for (what, asked, max) in [
        ("cpuCount", body.cpu_count, max.cpu_count),
        ("memoryMB", body.memory_mb, max.memory_mb),
    ] {
        if asked.is_some_and(|n| n == 0 || n > max) {
            return Err(ApiError::bad_request(format!(
                "{what} must be between 1 and {max} on this server"
            )));
        }
    }
    let limits = state.builder.limits();
    let used = state
        .builder
        .make_room(&caller.0, limits.storage_bytes_per_key)
        .await?;
    if used >= limits.storage_bytes_per_key {
        return Err(ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!(
                "this API key's templates take {} MiB, all of the {} MiB a key may keep \
                 (`airlock serve --key-max-template-storage-mb`): delete templates it no \
                 longer needs",
                used >> 20,
                limits.storage_bytes_per_key >> 20
            ),
        ));
    }
    let now = chrono::Utc::now().timestamp();
    let fresh = UserTemplate {
        id: TemplateName::parse(SandboxId::generate().as_str()).expect("ids are valid names"),
        owner: caller.0.clone(),
        alias: alias.clone(),
        public: false,
        cpu_count: body.cpu_count,
        memory_mb: body.memory_mb,
        created_at: now,
    };
    // A name the key has already built gets a new build of the same template.
    let existing = find_owned(&state, &caller, alias.as_str()).await?;
    let owned_count = || async {
        let own = state.store.templates().user_templates_of(&caller.0).await;
        own.map(|own| own.len())
    };
    if existing.is_none() && owned_count().await? >= limits.templates_per_key {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this API key has {} templates, its most (`airlock serve \
                 --key-max-templates`): delete one, or build a new version of one it has",
                limits.templates_per_key
            ),
        ));
    }
    let template = if state.store.templates().insert_user_template(&fresh).await? {
        fresh
    } else {
        let existing = owned(&state, &caller, alias.as_str()).await?;
        let updated = UserTemplate {
            cpu_count: body.cpu_count,
            memory_mb: body.memory_mb,
            ..existing
        };
        state
            .store
            .templates()
            .update_user_template(&updated)
            .await?;
        updated
    };
    let build = BuildRecord {
        id: uuid::Uuid::new_v4().to_string(),
        template_id: template.id.clone(),
        status: BuildStatus::Waiting,
        failure: None,
        created_at: now,
        finished_at: None,
        tags: tags.clone(),
    };
    // A key that builds one name again and again keeps only its newest builds and logs.
    state
        .store
        .templates()
        .prune_builds_of(&template.id, BUILDS_KEPT)
        .await?;
    state.store.templates().insert_build(&build).await?;
    let created = TemplateBuildCreated {
        template_id: template.id.to_string(),
        build_id: build.id,
        public: template.public,
        names: crate::http::templates::info::names(&template),
        tags,
        aliases: vec![alias.to_string()],
    };
    Ok((StatusCode::ACCEPTED, Json(created)).into_response())
}

pub(crate) async fn start_build(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, build)): Path<(String, String)>,
    JsonBody(body): JsonBody<TemplateBuildStart>,
) -> Result<Response, ApiError> {
    let (template, record) = owned_build(&state, &caller, &id, &build).await?;
    if record.status != BuildStatus::Waiting {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("build '{build}' has already started"),
        ));
    }
    let definition = match definition(&state, &caller, body).await {
        Ok(d) => d,
        Err(e) => {
            // The SDK polls the status next only if this succeeds; a script polling anyway
            // sees why.
            let now = chrono::Utc::now().timestamp();
            let failure = Some((e.message.as_str(), Some("base")));
            state
                .store
                .templates()
                .set_build_status(&build, BuildStatus::Error, failure, now)
                .await?;
            return Err(e);
        }
    };
    let defaults = state.lifecycle.limits().default_resources;
    let started = state.builder.start(BuildJob {
        published_as: TemplateName::parse(&record.id).expect("build ids are UUIDs"),
        owner: Some(caller.0.clone()),
        build_id: record.id.clone(),
        name: template.alias.to_string(),
        template_id: template.id,
        definition,
        resources: Resources {
            cpu_count: template.cpu_count.unwrap_or(defaults.cpu_count),
            memory_mb: template.memory_mb.unwrap_or(defaults.memory_mb),
            disk_mb: 0,
        },
    });
    if let Err(refused) = started {
        let now = chrono::Utc::now().timestamp();
        let failure = Some((refused.to_string(), Some("base")));
        let failure = failure.as_ref().map(|(m, s)| (m.as_str(), *s));
        state
            .store
            .templates()
            .set_build_status(&record.id, BuildStatus::Error, failure, now)
            .await?;
        return Err(refused.into());
    }
    Ok((StatusCode::ACCEPTED, Json(serde_json::json!({}))).into_response())
}

/// `DELETE /templates/{id}/builds/{build}`: stops a build that waits for its turn or runs
/// (its step's sandbox is destroyed and the step's writes thrown away); it ends with status
/// `error`. A build that was requested but never started ends at once. E2B has no such call;
/// `airlock template cancel` makes it.
pub(crate) async fn cancel_build(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, build)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (_, record) = owned_build(&state, &caller, &id, &build).await?;
    if state.builder.cancel(&record.id) {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    if record.status == BuildStatus::Waiting {
        let now = chrono::Utc::now().timestamp();
        let failure = Some((airlock_core::build::stop::CANCELLED, None));
        state
            .store
            .templates()
            .set_build_status(&record.id, BuildStatus::Error, failure, now)
            .await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "build '{build}' has already ended ({})",
            record.status.as_str()
        ),
    ))
}

/// Checks the SDK's build body and turns it into what the builder runs.
async fn definition(
    state: &AppState,
    caller: &Caller,
    body: TemplateBuildStart,
) -> Result<BuildDefinition, ApiError> {
    for (what, command) in [("startCmd", &body.start_cmd), ("readyCmd", &body.ready_cmd)] {
        if command
            .as_ref()
            .is_some_and(|c| c.trim().is_empty() || c.contains('\0'))
        {
            return Err(ApiError::bad_request(format!(
                "{what} must be a non-empty shell command"
            )));
        }
    }
    let base = match (&body.from_template, &body.from_image) {
        (Some(t), _) => BuildBase::Template(visible_base(state, caller, t).await?),
        // E2B's own base image is what `base` is here.
        (None, Some(image)) if image.split(':').next() == Some(E2B_BASE_IMAGE) => {
            BuildBase::Template(visible_base(state, caller, "base").await?)
        }
        (None, Some(image)) => BuildBase::Image(ImageSource {
            reference: image_name(image)?,
            credentials: registry_credentials(body.from_image_registry.as_ref())?,
        }),
        (None, None) => BuildBase::Template(visible_base(state, caller, "base").await?),
    };
    if body.steps.len() > MAX_STEPS {
        return Err(ApiError::bad_request(format!(
            "a build may have at most {MAX_STEPS} steps"
        )));
    }
    let steps = body
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| step(s).map_err(|m| ApiError::bad_request(format!("step {}: {m}", i + 1))))
        .collect::<Result<_, _>>()?;
    Ok(BuildDefinition {
        base,
        steps,
        force: body.force,
        start_cmd: body.start_cmd,
        ready_cmd: body.ready_cmd,
    })
}

/// A template the caller may build on, built.
async fn visible_base(
    state: &AppState,
    caller: &Caller,
    name: &str,
) -> Result<TemplateRecord, ApiError> {
    let (base, _) = state
        .store
        .templates()
        .visible_template(Some(&caller.0), name)
        .await?
        .ok_or_else(|| {
            ApiError::bad_request(format!("template '{name}' not found (or not built yet)"))
        })?;
    Ok(base)
}

fn image_name(image: &str) -> Result<String, ApiError> {
    let bad = image.is_empty()
        || image.len() > 1024
        || image.chars().any(|c| c.is_whitespace() || c.is_control());
    if bad {
        return Err(ApiError::bad_request(format!(
            "'{image}' is not an image name (e.g. python:3.12-slim or registry.example.com/team/app:1)"
        )));
    }
    Ok(image.to_owned())
}

/// `fromImageRegistry`, as the SDK sends it: `registry` (username and password), `gcp` (a
/// service account key, which Google's registries take as the password of `_json_key`), or
/// `aws` (which needs a token from AWS first).
fn registry_credentials(
    config: Option<&serde_json::Value>,
) -> Result<Option<(String, String)>, ApiError> {
    let Some(config) = config else {
        return Ok(None);
    };
    let field = |name: &str| {
        config[name]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                ApiError::bad_request(format!("fromImageRegistry needs a non-empty '{name}'"))
            })
    };
    match config["type"].as_str() {
        Some("registry") => Ok(Some((field("username")?, field("password")?))),
        Some("gcp") => Ok(Some(("_json_key".into(), field("serviceAccountJson")?))),
        Some("aws") => Err(ApiError::bad_request(
            "AWS credentials are not supported: this server does not call AWS to turn them \
             into a registry token. Pass the token instead: \
             from_image(image, username=\"AWS\", password=<output of `aws ecr get-login-password`>)",
        )),
        other => Err(ApiError::bad_request(format!(
            "fromImageRegistry type {other:?} is not one of registry, gcp, aws"
        ))),
    }
}

pub(crate) async fn build_status(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, build)): Path<(String, String)>,
    Query(query): Query<BuildStatusQuery>,
) -> Result<Json<BuildStatusBody>, ApiError> {
    let (template, record) = owned_build(&state, &caller, &id, &build).await?;
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_LOG_PAGE);
    let entries = state
        .store
        .templates()
        .build_logs(&record.id, query.logs_offset.unwrap_or(0), limit)
        .await?;
    let log_entries = entries.iter().map(log_entry_body).collect();
    Ok(Json(BuildStatusBody {
        template_id: template.id.to_string(),
        build_id: record.id,
        status: record.status.as_str().into(),
        logs: Vec::new(),
        log_entries,
        reason: record
            .failure
            .map(|(message, step)| BuildFailureReason { message, step }),
    }))
}

/// E2B's log route of a build: the entries the status route pages by offset, paged by time
/// as a sandbox's log is (`cursor` in Unix ms, `direction`, `limit`, `level`). `source` (E2B's
/// live builder or its log store) is one store here, so it changes nothing.
pub(crate) async fn build_logs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, build)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<BuildLogsBody>, ApiError> {
    let (_, record) = owned_build(&state, &caller, &id, &build).await?;
    let page = Page::parse(&query, "cursor")?;
    let entries = state
        .store
        .templates()
        .build_logs(&record.id, 0, MAX_LOG_ENTRIES)
        .await?;
    let logs = page
        .select(&entries)
        .into_iter()
        .map(log_entry_body)
        .collect();
    Ok(Json(BuildLogsBody { logs }))
}

/// A build's log entry as both routes answer it.
fn log_entry_body(e: &LogEntry) -> BuildLogEntry {
    BuildLogEntry {
        timestamp: timestamp(e.at_ms),
        level: e.level.as_str().into(),
        message: e.message.clone(),
        step: e.step.clone(),
    }
}
