//! Sandboxes, as E2B's SDKs call the control-plane REST API for them (protocol doc §2):
//! create, look up, list, connect, set the timeout and the network rules, kill.

use crate::cluster::Role;
use crate::http::auth::{Caller, Owned};
use crate::http::error::ApiError;
use crate::http::idempotency;
use crate::AppState;
use airlock_core::egress::Egress;
use airlock_core::ids::TemplateName;
use airlock_core::lifecycle::CreateParams;
use airlock_core::store::{PauseMode, SandboxRecord, SandboxState as StoredState, Store};
use airlock_core::volumes::MountRequest;
use airlock_request::{check_map, parse_metadata_filter, JsonBody};
use airlock_wire::api::{
    NetworkConfig, NetworkUpdate, NewSandbox, RefreshBody, Sandbox, SandboxDetail,
    SandboxLifecycle, SandboxState, TimeoutBody, VolumeMountBody,
};
use airlock_wire::ENVD_VERSION;
use axum::extract::{Extension, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Largest `limit` a list call may ask for.
const MAX_PAGE: usize = 1000;

/// Which create route was called: v1 takes `secure`, v2 secures every sandbox.
#[derive(Clone, Copy)]
enum Route {
    V1,
    V2,
}

/// A create, once per `Idempotency-Key` if the request has one.
async fn create(
    state: AppState,
    caller: Caller,
    headers: &HeaderMap,
    route: Route,
    body: serde_json::Value,
) -> Result<Response, ApiError> {
    let Some(key) = idempotency::key(headers)? else {
        let sandbox = timed_create(state, caller, route, body).await?;
        return Ok((StatusCode::CREATED, Json(sandbox)).into_response());
    };
    let name = match route {
        Route::V1 => "v1",
        Route::V2 => "v2",
    };
    let fingerprint = idempotency::fingerprint(name, &body);
    let claims = state.store.idempotency().clone();
    let owner = caller.0.clone();
    let create = async move {
        let sandbox = timed_create(state, caller, route, body).await?;
        Ok(serde_json::to_string(&sandbox).expect("a sandbox serializes"))
    };
    let answer = idempotency::once(&claims, &owner, &key, &fingerprint, create).await?;
    let json = [(header::CONTENT_TYPE, "application/json")];
    Ok((StatusCode::CREATED, json, answer).into_response())
}

/// A create, counted and timed for the operator's metrics.
async fn timed_create(
    state: AppState,
    caller: Caller,
    route: Route,
    body: serde_json::Value,
) -> Result<Sandbox, ApiError> {
    let body: NewSandbox = serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    let secure = match route {
        Route::V1 => body.secure.unwrap_or(false),
        Route::V2 => true,
    };
    let created = start_sandbox(&state, caller, body, secure);
    state.verbs.timed("create", created).await
}

async fn start_sandbox(
    state: &AppState,
    caller: Caller,
    body: NewSandbox,
    secure: bool,
) -> Result<Sandbox, ApiError> {
    if body.template_id.is_empty() {
        return Err(ApiError::bad_request("templateID is required"));
    }
    let metadata = body.metadata.unwrap_or_default();
    let env_vars = body.env_vars.unwrap_or_default();
    check_map("metadata", &metadata)?;
    check_map("envVars", &env_vars)?;
    // `name`, `name:tag`, or another key's public template as `{key id}/name[:tag]`.
    let template = body.template_id;
    let network = body.network.unwrap_or_default();
    let egress = egress(body.allow_internet_access, &network)?;
    let allow_public_traffic = network.allow_public_traffic.unwrap_or(true);
    let auto_resume = body.auto_resume.is_some_and(|a| a.enabled);
    let timeout_pause = match body.auto_pause_memory {
        Some(false) => PauseMode::Filesystem,
        _ => PauseMode::Full,
    };
    if auto_resume && timeout_pause == PauseMode::Filesystem {
        return Err(ApiError::bad_request(
            "autoResume cannot be combined with autoPauseMemory: false: a sandbox paused \
             without its memory starts afresh, so traffic cannot wake it where it left off; \
             resume it with connect",
        ));
    }
    let sandbox = state
        .lifecycle
        .create(CreateParams {
            template,
            timeout: body.timeout.map(Duration::from_secs),
            metadata,
            env_vars,
            secure,
            pause_on_timeout: body.auto_pause.unwrap_or(false),
            timeout_pause,
            auto_resume,
            owner: Some(caller.0),
            cpu_count: body.cpu_count,
            memory_mb: body.memory_mb,
            disk_mb: body.disk_size_mb,
            egress,
            require_traffic_token: !allow_public_traffic,
            volume_mounts: body
                .volume_mounts
                .unwrap_or_default()
                .into_iter()
                .map(|m| MountRequest {
                    name: m.name,
                    path: m.path,
                })
                .collect(),
        })
        .await?;
    Ok(sandbox_body(state, &sandbox.record()).await)
}

pub(crate) async fn create_v2(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    create(state, caller, &headers, Route::V2, body).await
}

pub(crate) async fn create_v1(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    create(state, caller, &headers, Route::V1, body).await
}

/// Sandboxes' templates as answers name them: the id and name of the user template whose
/// build one runs, or a built-in's or snapshot's own name. Looked up once per template, however
/// many sandboxes an answer has.
#[derive(Default)]
pub(crate) struct TemplateNames(HashMap<TemplateName, (String, String)>);

impl TemplateNames {
    pub(crate) async fn of(
        store: &Store,
        records: &[impl std::borrow::Borrow<SandboxRecord>],
    ) -> TemplateNames {
        Self::of_builds(store, records.iter().map(|r| &r.borrow().template)).await
    }

    /// The names of the templates of `builds`, as sandboxes' records name them.
    pub(crate) async fn of_builds(
        store: &Store,
        builds: impl Iterator<Item = &TemplateName>,
    ) -> TemplateNames {
        let mut names = TemplateNames::default();
        for build in builds {
            if names.0.contains_key(build) {
                continue;
            }
            let owner = store.templates().template_of_record(build).await;
            if let Ok(Some(t)) = owner {
                let named = (t.id.to_string(), t.alias.to_string());
                names.0.insert(build.clone(), named);
            }
        }
        names
    }

    /// The template's id and name.
    fn get(&self, r: &SandboxRecord) -> (String, String) {
        self.of_build(&r.template)
    }

    /// The id and name of the template of `build`.
    pub(crate) fn of_build(&self, build: &TemplateName) -> (String, String) {
        match self.0.get(build) {
            Some(named) => named.clone(),
            None => (build.to_string(), build.to_string()),
        }
    }
}

pub(crate) async fn sandbox_body(state: &AppState, r: &SandboxRecord) -> Sandbox {
    let (template_id, alias) = TemplateNames::of(&state.store, std::slice::from_ref(r))
        .await
        .get(r);
    Sandbox {
        template_id,
        sandbox_id: r.id.to_string(),
        client_id: r.node.clone(),
        alias: Some(alias),
        envd_version: ENVD_VERSION.into(),
        envd_access_token: r.access_token.clone(),
        traffic_access_token: r.traffic_access_token.clone(),
        domain: state.domain.clone(),
    }
}

fn rfc3339(at: Option<chrono::DateTime<chrono::Utc>>, precision: chrono::SecondsFormat) -> String {
    at.unwrap_or_default().to_rfc3339_opts(precision, true)
}

pub(crate) fn detail_body(
    state: &AppState,
    r: &SandboxRecord,
    with_token: bool,
    names: &TemplateNames,
) -> SandboxDetail {
    let (template_id, alias) = names.get(r);
    SandboxDetail {
        template_id,
        sandbox_id: r.id.to_string(),
        client_id: r.node.clone(),
        alias: Some(alias),
        // With its fractions, as E2B's: a list's order is by it.
        started_at: rfc3339(
            chrono::DateTime::from_timestamp_micros(r.started_at_us),
            chrono::SecondsFormat::Micros,
        ),
        end_at: rfc3339(
            chrono::DateTime::from_timestamp(r.end_at, 0),
            chrono::SecondsFormat::Secs,
        ),
        envd_version: ENVD_VERSION.into(),
        cpu_count: r.resources.cpu_count,
        memory_mb: r.resources.memory_mb,
        disk_size_mb: r.resources.disk_mb,
        state: match r.state {
            StoredState::Running => SandboxState::Running,
            StoredState::Paused => SandboxState::Paused,
        },
        metadata: r.metadata.clone(),
        domain: state.domain.clone(),
        envd_access_token: if with_token {
            r.access_token.clone()
        } else {
            None
        },
        lifecycle: Some(SandboxLifecycle {
            auto_resume: r.auto_resume,
            on_timeout: if r.pause_on_timeout { "pause" } else { "kill" }.into(),
        }),
        network: Some(network_body(r)),
        pause_mode: r.pause_mode.map(|m| m.as_str().to_owned()),
        volume_mounts: r
            .volume_mounts
            .iter()
            .map(|m| VolumeMountBody {
                name: m.name.clone(),
                path: m.path.clone(),
            })
            .collect(),
    }
}

/// A sandbox's network settings as E2B reports them (`allowOut` and `denyOut` as normalised).
fn network_body(r: &SandboxRecord) -> NetworkConfig {
    let (allow_out, deny_out) = (r.egress.allow_out(), r.egress.deny_out());
    NetworkConfig {
        allow_out: (!allow_out.is_empty()).then_some(allow_out),
        deny_out: (!deny_out.is_empty()).then_some(deny_out),
        allow_public_traffic: Some(!r.require_traffic_token),
    }
}

pub(crate) async fn detail(
    State(state): State<AppState>,
    Owned { record, .. }: Owned,
) -> Json<SandboxDetail> {
    let names = TemplateNames::of(&state.store, std::slice::from_ref(&record)).await;
    Json(detail_body(&state, &record, true, &names))
}

pub(crate) async fn kill(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
) -> Result<StatusCode, ApiError> {
    state.verbs.timed("kill", state.lifecycle.kill(&id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The outbound policy that a create's or an update's network settings ask for.
fn egress(allow_internet_access: Option<bool>, rules: &NetworkConfig) -> Result<Egress, ApiError> {
    Egress::from_request(
        allow_internet_access,
        rules.allow_out.as_deref().unwrap_or_default(),
        rules.deny_out.as_deref().unwrap_or_default(),
    )
    .map_err(ApiError::bad_request)
}

/// E2B's `update_network`: replaces the sandbox's outbound rules, at once if it runs, at its
/// resume if it is paused. `allowPublicTraffic`, when sent, is changed too (left out, it stays).
pub(crate) async fn set_network(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<NetworkUpdate>,
) -> Result<StatusCode, ApiError> {
    let egress = egress(body.allow_internet_access, &body.rules)?;
    let require_traffic_token = body.rules.allow_public_traffic.map(|public| !public);
    state
        .lifecycle
        .set_network(&id, egress, require_traffic_token)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn set_timeout(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<TimeoutBody>,
) -> Result<StatusCode, ApiError> {
    let secs = body
        .timeout
        .ok_or_else(|| ApiError::bad_request("timeout (seconds) is required"))?;
    state
        .lifecycle
        .set_timeout(&id, Duration::from_secs(secs))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// E2B's refresh: a running sandbox lives at least `duration` seconds more (15 without one);
/// its life is never shortened.
pub(crate) async fn refresh(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<RefreshBody>,
) -> Result<StatusCode, ApiError> {
    state
        .lifecycle
        .refresh(&id, body.duration.map(Duration::from_secs))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How a resume brings a paused sandbox back: `memory: false` asks for a reboot.
pub(crate) fn resume_mode(body: &TimeoutBody) -> PauseMode {
    match body.memory {
        Some(false) => PauseMode::Filesystem,
        _ => PauseMode::Full,
    }
}

/// Connect: a running sandbox gets its timeout extended if one is given (200); a paused one is
/// resumed (201).
pub(crate) async fn connect(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<TimeoutBody>,
) -> Result<Response, ApiError> {
    let timeout = body.timeout.map(Duration::from_secs);
    let connected = state.lifecycle.connect(&id, timeout, resume_mode(&body));
    let (sandbox, resumed) = state.verbs.timed("connect", connected).await?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let body = sandbox_body(&state, &sandbox.record()).await;
    Ok((status, Json(body)).into_response())
}

/// The caller's sandboxes that the list query's filters let through, oldest (the first
/// created) first:
/// `metadata`, `state` (`by_default` without one), `template` (id or name, a tag aside) and
/// `startedAfter` / `startedBefore` (RFC 3339, both inclusive).
async fn matching<'a>(
    state: &AppState,
    caller: &Caller,
    query: &'a HashMap<String, String>,
    by_default: &[&'a str],
) -> Result<(Vec<Arc<SandboxRecord>>, TemplateNames), ApiError> {
    let filter = match query.get("metadata") {
        Some(raw) => parse_metadata_filter(raw)?,
        None => BTreeMap::new(),
    };
    let states: Vec<&str> = match query.get("state") {
        Some(states) => states.split(',').map(str::trim).collect(),
        None => by_default.to_vec(),
    };
    if let Some(bad) = states.iter().find(|s| !["running", "paused"].contains(s)) {
        return Err(ApiError::bad_request(format!(
            "state '{bad}' is not one of running, paused"
        )));
    }
    let time = |name: &str| -> Result<Option<i64>, ApiError> {
        query
            .get(name)
            .map(|t| {
                chrono::DateTime::parse_from_rfc3339(t)
                    .map(|t| t.timestamp_micros())
                    .map_err(|_| {
                        ApiError::bad_request(format!("{name} '{t}' is not an RFC 3339 time"))
                    })
            })
            .transpose()
    };
    let (after, before) = (time("startedAfter")?, time("startedBefore")?);
    let template = query
        .get("template")
        .map(|t| airlock_core::store::split_reference(t).0);
    let mut records: Vec<_> = listed(state, caller)
        .await?
        .into_iter()
        .filter(|r| caller.sees(&r.owner))
        .filter(|r| states.contains(&r.state.as_str()))
        .filter(|r| filter.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
        .filter(|r| after.is_none_or(|t| r.started_at_us >= t))
        .filter(|r| before.is_none_or(|t| r.started_at_us <= t))
        .collect();
    let names = TemplateNames::of(&state.store, &records).await;
    if let Some(t) = template {
        records.retain(|r| {
            let (id, name) = names.get(r);
            t == id || t == name
        });
    }
    Ok((records, names))
}

/// The sandboxes a list may show: this server's own, or on a node, the caller's in the whole
/// cluster, from the catalog (a gateway sends a list to any one node).
async fn listed(state: &AppState, caller: &Caller) -> Result<Vec<Arc<SandboxRecord>>, ApiError> {
    if state.role != Role::Node {
        return Ok(state.lifecycle.list_records());
    }
    let all = state.store.sandboxes().of_owner(&caller.0).await?;
    Ok(all.into_iter().map(Arc::new).collect())
}

pub(crate) async fn list_v1(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Vec<SandboxDetail>>, ApiError> {
    // E2B's first list shows running sandboxes only.
    let (all, names) = matching(&state, &caller, &query, &["running"]).await?;
    Ok(Json(
        all.iter()
            .map(|r| detail_body(&state, r, false, &names))
            .collect(),
    ))
}

/// Paginated list, newest first unless `order=asc`. `nextToken` names the place after the
/// last sandbox of the page (its start time and id), so pages stay right when sandboxes
/// come and go between them.
pub(crate) async fn list_v2(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (mut all, names) = matching(&state, &caller, &query, &["running", "paused"]).await?;
    let newest_first = match query.get("order").map(String::as_str) {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "order '{other}' is not one of asc, desc"
            )))
        }
    };
    if newest_first {
        all.reverse();
    }
    let limit = match query.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=MAX_PAGE).contains(l))
            .ok_or_else(|| ApiError::bad_request(format!("limit must be 1..={MAX_PAGE}")))?,
        None => MAX_PAGE,
    };
    let place = |r: &SandboxRecord| format!("{}.{}", r.started_at_us, r.id);
    let start = match query.get("nextToken").filter(|t| !t.is_empty()) {
        Some(token) => {
            let (at, id) = token
                .split_once('.')
                .and_then(|(at, id)| Some((at.parse::<i64>().ok()?, id)))
                .ok_or_else(|| ApiError::bad_request("nextToken is not one this server gave"))?;
            let after = |r: &&Arc<SandboxRecord>| {
                let here = (r.started_at_us, r.id.as_str());
                if newest_first {
                    here < (at, id)
                } else {
                    here > (at, id)
                }
            };
            all.iter().position(|r| after(&r)).unwrap_or(all.len())
        }
        None => 0,
    };
    let page: Vec<&Arc<SandboxRecord>> = all.iter().skip(start).take(limit).collect();
    let body: Vec<SandboxDetail> = page
        .iter()
        .map(|r| detail_body(&state, r, false, &names))
        .collect();
    let mut resp = Json(body).into_response();
    if let (Some(last), true) = (page.last(), all.len() > start + limit) {
        if let Ok(v) = HeaderValue::from_str(&place(last)) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}
