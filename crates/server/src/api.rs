//! The control-plane REST API, as E2B's SDKs call it (protocol doc §2).

use crate::error::{ApiError, JsonBody};
use crate::AppState;
use airlock_core::egress::Egress;
use airlock_core::lifecycle::{CreateParams, LifecycleError};
use airlock_core::store::{
    PauseMode, SandboxRecord, SandboxState as StoredState, SnapshotRecord, Store,
};
use airlock_core::volumes::MountRequest;
use airlock_wire::api::{
    ErrorBody, ForkRequest, ForkResult, NetworkConfig, NetworkUpdate, NewSandbox, PauseBody,
    Sandbox, SandboxDetail, SandboxLifecycle, SandboxState, SnapshotInfo, SnapshotRequest,
    TimeoutBody, VolumeMountBody,
};
use airlock_wire::ENVD_VERSION;
use axum::extract::{Extension, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Most forks one call may ask for (E2B's limit).
const MAX_FORKS: usize = 20;
/// Largest `limit` a list call may ask for.
const MAX_PAGE: usize = 1000;
/// Caps on what a create may attach, so one client cannot bloat the store.
const MAX_MAP_ENTRIES: usize = 256;
const MAX_MAP_BYTES: usize = 64 * 1024;

pub fn routes(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/sandboxes", post(create_v1).get(list_v1))
        .route("/v2/sandboxes", post(create_v2).get(list_v2))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/network", put(set_network))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/snapshots", post(create_snapshot))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/snapshots", get(list_snapshots))
        .route("/templates/{id}", delete(delete_template))
        .merge(crate::templates_api::routes())
        .merge(crate::metrics_api::routes())
        .merge(crate::logs_api::routes())
        .merge(crate::volumes_api::routes())
        .route_layer(axum::middleware::from_fn_with_state(state, require_api_key))
}

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The API key a request came with (its public id). Each key sees only the sandboxes and
/// snapshots it made.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

impl Caller {
    /// Whether this caller may see something owned by `owner` (records from before keys had
    /// owners belong to no key).
    pub(crate) fn sees(&self, owner: &Option<String>) -> bool {
        owner.as_deref() == Some(self.0.as_str())
    }
}

/// A sandbox named by the request path (`{id}`) that the calling key may use. Another key's
/// sandbox is rejected with 404, as one that does not exist: its existence is not confirmed.
pub struct Owned {
    pub id: String,
    pub record: Arc<SandboxRecord>,
}

impl FromRequestParts<AppState> for Owned {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        // `require_api_key` runs first on every API route and always sets the caller.
        let caller = parts
            .extensions
            .get::<Caller>()
            .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "missing API key"))?;
        let record = state.lifecycle.record(&id)?;
        if !caller.sees(&record.owner) {
            return Err(LifecycleError::SandboxNotFound(id).into());
        }
        Ok(Owned { id, record })
    }
}

pub(crate) async fn require_api_key(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if key.is_empty() {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing API key: send it in the X-API-KEY header",
        )
        .into_response();
    }
    match caller_of_key(&state, key) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// The caller an API key stands for; 401 for an unknown or revoked one.
pub(crate) fn caller_of_key(state: &AppState, key: &str) -> Result<Caller, ApiError> {
    match state.store.api_key_id(&hash_key(key)) {
        Ok(Some(id)) => Ok(Caller(id)),
        Ok(None) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid API key (unknown or revoked)",
        )),
        Err(e) => {
            tracing::error!(error = %e, "API key lookup failed");
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error; see the server log",
            ))
        }
    }
}

pub fn check_map(what: &str, map: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if map.len() > MAX_MAP_ENTRIES || bytes > MAX_MAP_BYTES {
        return Err(ApiError::bad_request(format!(
            "{what} is too large (at most {MAX_MAP_ENTRIES} entries and {MAX_MAP_BYTES} bytes)"
        )));
    }
    if what == "envVars" {
        if let Some(bad) = map.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
            return Err(ApiError::bad_request(format!(
                "invalid env var name {bad:?}"
            )));
        }
    }
    Ok(())
}

/// A create, counted and timed for the operator's metrics.
async fn create(
    state: &AppState,
    caller: Caller,
    body: NewSandbox,
    secure: bool,
) -> Result<Response, ApiError> {
    let created = start_sandbox(state, caller, body, secure);
    state.verbs.timed("create", created).await
}

async fn start_sandbox(
    state: &AppState,
    caller: Caller,
    body: NewSandbox,
    secure: bool,
) -> Result<Response, ApiError> {
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
    Ok((
        StatusCode::CREATED,
        Json(sandbox_body(state, &sandbox.record())),
    )
        .into_response())
}

async fn create_v2(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<NewSandbox>,
) -> Result<Response, ApiError> {
    // v2 has no `secure` field: every sandbox is secured.
    create(&state, caller, body, true).await
}

async fn create_v1(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<NewSandbox>,
) -> Result<Response, ApiError> {
    let secure = body.secure.unwrap_or(false);
    create(&state, caller, body, secure).await
}

/// A sandbox's template as answers name it: the id and name of the user template whose build
/// it runs, or a built-in's or snapshot's own name.
fn template_names(store: &Store, r: &SandboxRecord) -> (String, String) {
    match store.template_of_record(&r.template) {
        Ok(Some(t)) => (t.id.to_string(), t.alias.to_string()),
        _ => (r.template.to_string(), r.template.to_string()),
    }
}

fn sandbox_body(state: &AppState, r: &SandboxRecord) -> Sandbox {
    let (template_id, alias) = template_names(&state.store, r);
    Sandbox {
        template_id,
        sandbox_id: r.id.to_string(),
        client_id: "airlock".into(),
        alias: Some(alias),
        envd_version: ENVD_VERSION.into(),
        envd_access_token: r.access_token.clone(),
        traffic_access_token: r.traffic_access_token.clone(),
        domain: state.domain.clone(),
    }
}

fn rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(crate) fn detail_body(state: &AppState, r: &SandboxRecord, with_token: bool) -> SandboxDetail {
    let (template_id, alias) = template_names(&state.store, r);
    SandboxDetail {
        template_id,
        sandbox_id: r.id.to_string(),
        client_id: "airlock".into(),
        alias: Some(alias),
        started_at: rfc3339(r.started_at),
        end_at: rfc3339(r.end_at),
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
    let egress = &r.egress;
    let allow_out: Vec<String> = egress
        .allow_nets
        .iter()
        .map(ToString::to_string)
        .chain(egress.allow_domains.iter().map(ToString::to_string))
        .collect();
    NetworkConfig {
        allow_out: (!allow_out.is_empty()).then_some(allow_out),
        deny_out: (!egress.deny_nets.is_empty())
            .then(|| egress.deny_nets.iter().map(ToString::to_string).collect()),
        allow_public_traffic: Some(!r.require_traffic_token),
    }
}

async fn detail(State(state): State<AppState>, Owned { record, .. }: Owned) -> Json<SandboxDetail> {
    Json(detail_body(&state, &record, true))
}

async fn kill(
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
async fn set_network(
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

async fn set_timeout(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<TimeoutBody>,
) -> Result<StatusCode, ApiError> {
    let secs = body
        .timeout
        .ok_or_else(|| ApiError::bad_request("timeout (seconds) is required"))?;
    state
        .lifecycle
        .set_timeout(&id, Duration::from_secs(secs))?;
    Ok(StatusCode::NO_CONTENT)
}

/// How a resume brings a paused sandbox back: `memory: false` asks for a reboot.
fn resume_mode(body: &TimeoutBody) -> PauseMode {
    match body.memory {
        Some(false) => PauseMode::Filesystem,
        _ => PauseMode::Full,
    }
}

/// Connect: a running sandbox gets its timeout extended if one is given (200); a paused one is
/// resumed (201).
async fn connect(
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
    Ok((status, Json(sandbox_body(&state, &sandbox.record()))).into_response())
}

/// The body is optional: `{"memory": false}` keeps the files only; `requireHealthyGuest`
/// refuses to pause a sandbox whose agent does not answer.
async fn pause(
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

async fn resume(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<TimeoutBody>,
) -> Result<Response, ApiError> {
    let timeout = body.timeout.map(Duration::from_secs);
    let resumed = state.lifecycle.resume(&id, timeout, resume_mode(&body));
    let sandbox = state.verbs.timed("resume", resumed).await?;
    Ok((
        StatusCode::CREATED,
        Json(sandbox_body(&state, &sandbox.record())),
    )
        .into_response())
}

fn snapshot_info(s: &SnapshotRecord) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: s.id.to_string(),
        names: vec![s.id.to_string()],
    }
}

async fn create_snapshot(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    JsonBody(body): JsonBody<SnapshotRequest>,
) -> Result<Response, ApiError> {
    let saved = state.lifecycle.snapshot(&id, body.name.as_deref());
    let snapshot = state.verbs.timed("snapshot", saved).await?;
    Ok((StatusCode::CREATED, Json(snapshot_info(&snapshot))).into_response())
}

/// `?sandboxID=` narrows to one source sandbox, `?name=` to one snapshot.
async fn list_snapshots(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Vec<SnapshotInfo>>, ApiError> {
    let source = query.get("sandboxID");
    let name = query.get("name");
    Ok(Json(
        state
            .lifecycle
            .snapshots(&caller.0)?
            .iter()
            .filter(|s| source.is_none_or(|id| s.source_sandbox.as_str() == id))
            .filter(|s| name.is_none_or(|n| s.id.as_str() == n))
            .map(snapshot_info)
            .collect(),
    ))
}

/// Deletes the caller's template or snapshot of that name (E2B's SDK deletes both here).
async fn delete_template(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if crate::templates_api::delete_owned(&state, &caller, &id)?
        || state.lifecycle.delete_snapshot(&caller.0, &id).await?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("snapshot '{id}' not found")))
    }
}

async fn fork(
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
    let entries: Vec<ForkResult> = forks
        .into_iter()
        .map(|f| match f {
            Ok(sandbox) => ForkResult::Sandbox(sandbox_body(&state, &sandbox.record())),
            Err(e) => {
                let e = ApiError::from(e);
                ForkResult::Error(ErrorBody {
                    code: e.status.as_u16(),
                    message: e.message,
                })
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(entries)).into_response())
}

/// `metadata` as the SDK sends it: quoted three times (protocol doc §2.2).
pub fn parse_metadata_filter(raw: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let once = percent_decode(raw)?;
    let mut out = BTreeMap::new();
    for pair in once.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            ApiError::bad_request(format!("metadata filter {pair:?} is not key=value"))
        })?;
        out.insert(percent_decode(k)?, percent_decode(v)?);
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Result<String, ApiError> {
    crate::proxy::percent_decode(s)
        .ok_or_else(|| ApiError::bad_request(format!("malformed percent-encoding in {s:?}")))
}

/// The caller's sandboxes that the list query's filters let through, oldest first:
/// `metadata`, `state` (`by_default` without one), `template` (id or name, a tag aside) and
/// `startedAfter` / `startedBefore` (RFC 3339, both inclusive).
fn matching<'a>(
    state: &AppState,
    caller: &Caller,
    query: &'a HashMap<String, String>,
    by_default: &[&'a str],
) -> Result<Vec<Arc<SandboxRecord>>, ApiError> {
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
                    .map(|t| t.timestamp())
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
    Ok(state
        .lifecycle
        .list_records()
        .into_iter()
        .filter(|r| caller.sees(&r.owner))
        .filter(|r| states.contains(&r.state.as_str()))
        .filter(|r| filter.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
        .filter(|r| after.is_none_or(|t| r.started_at >= t))
        .filter(|r| before.is_none_or(|t| r.started_at <= t))
        .filter(|r| {
            template.is_none_or(|t| {
                let (id, name) = template_names(&state.store, r);
                t == id || t == name
            })
        })
        .collect())
}

async fn list_v1(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Vec<SandboxDetail>>, ApiError> {
    // E2B's first list shows running sandboxes only.
    let all = matching(&state, &caller, &query, &["running"])?;
    Ok(Json(
        all.iter().map(|r| detail_body(&state, r, false)).collect(),
    ))
}

/// Paginated list, newest first unless `order=asc`. `nextToken` names the place after the
/// last sandbox of the page (its start time and id), so pages stay right when sandboxes
/// come and go between them.
async fn list_v2(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let mut all = matching(&state, &caller, &query, &["running", "paused"])?;
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
    let place = |r: &SandboxRecord| format!("{}.{}", r.started_at, r.id);
    let start = match query.get("nextToken").filter(|t| !t.is_empty()) {
        Some(token) => {
            let (at, id) = token
                .split_once('.')
                .and_then(|(at, id)| Some((at.parse::<i64>().ok()?, id)))
                .ok_or_else(|| ApiError::bad_request("nextToken is not one this server gave"))?;
            let after = |r: &&Arc<SandboxRecord>| {
                let here = (r.started_at, r.id.as_str());
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
    let body: Vec<SandboxDetail> = page.iter().map(|r| detail_body(&state, r, false)).collect();
    let mut resp = Json(body).into_response();
    if let (Some(last), true) = (page.last(), all.len() > start + limit) {
        if let Ok(v) = HeaderValue::from_str(&place(last)) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_is_decoded_three_times() {
        // What the SDK sends for {"user": "a b"} after the HTTP layer's own decoding.
        let parsed = parse_metadata_filter("user=a%2520b").unwrap();
        assert_eq!(parsed.get("user").map(String::as_str), Some("a b"));
        let two = parse_metadata_filter("a%3D1%26b%3D2").unwrap();
        assert_eq!(two.len(), 2);
        assert!(parse_metadata_filter("novalue").is_err());
        assert!(parse_metadata_filter("a=%zz").is_err());
    }

    #[test]
    fn env_var_names_are_checked() {
        let ok = BTreeMap::from([("A".to_string(), "1".to_string())]);
        assert!(check_map("envVars", &ok).is_ok());
        let bad = BTreeMap::from([("A=B".to_string(), "1".to_string())]);
        assert!(check_map("envVars", &bad).is_err());
    }
}
