//! Sandboxes' lifecycle events, as E2B's events API serves them: `GET /events/sandboxes/{id}`
//! (one sandbox's, after its kill too) and `GET /events/sandboxes` (all of the key's). Query:
//! `offset` (0), `limit` (10, at most 100), `orderAsc` (false: newest first) and `types`
//! (repeated; any of them).

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::sandboxes::TemplateNames;
use crate::AppState;
use airlock_core::ids::TemplateName;
use airlock_core::store::{EventQuery, EventType, SandboxEvent, Store, EVENT_RETENTION_US};
use airlock_wire::events::SandboxEventBody;
use axum::extract::{Extension, Path, Query, State};
use axum::Json;

const DEFAULT_LIMIT: u64 = 10;
const MAX_LIMIT: u64 = 100;

/// The query's parameters, in order (`types` may repeat).
type Params = Vec<(String, String)>;

/// One sandbox's events. A sandbox the key never had (or another key's) is not found, as on
/// every other route.
pub(crate) async fn of_sandbox(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> Result<Json<Vec<SandboxEventBody>>, ApiError> {
    state.lifecycle.flush_events().await;
    let types = types(&params)?;
    let query = EventQuery {
        sandbox_id: Some(&id),
        ..query(&params, &types)?
    };
    let events = state.store.events().list(&caller.0, &query).await?;
    if events.is_empty() && !had(&state, &caller, &id).await? {
        return Err(ApiError::not_found(format!("sandbox '{id}' not found")));
    }
    Ok(Json(bodies(&state.store, events).await))
}

/// All of the key's events.
pub(crate) async fn of_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(params): Query<Params>,
) -> Result<Json<Vec<SandboxEventBody>>, ApiError> {
    state.lifecycle.flush_events().await;
    let types = types(&params)?;
    let events = state
        .store
        .events()
        .list(&caller.0, &query(&params, &types)?)
        .await?;
    Ok(Json(bodies(&state.store, events).await))
}

/// Whether the caller has sandbox `id` now, or had it within the events' retention.
async fn had(state: &AppState, caller: &Caller, id: &str) -> Result<bool, ApiError> {
    if let Ok(r) = state.lifecycle.record(id) {
        return Ok(caller.sees(&r.owner));
    }
    let any = EventQuery {
        sandbox_id: Some(id),
        since_us: retention_start(),
        limit: 1,
        ..EventQuery::default()
    };
    Ok(!state.store.events().list(&caller.0, &any).await?.is_empty())
}

fn retention_start() -> i64 {
    chrono::Utc::now().timestamp_micros() - EVENT_RETENTION_US
}

fn types(params: &Params) -> Result<Vec<EventType>, ApiError> {
    let named = params.iter().filter(|(name, _)| name == "types");
    parse_types("types", named.map(|(_, t)| t.as_str()))
}

/// Event types by E2B's names; `what` names the field in the error.
pub(crate) fn parse_types<'a>(
    what: &str,
    names: impl Iterator<Item = &'a str>,
) -> Result<Vec<EventType>, ApiError> {
    names
        .map(|t| {
            EventType::parse(t).ok_or_else(|| {
                let known: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
                ApiError::bad_request(format!("{what}: '{t}' is not one of {}", known.join(", ")))
            })
        })
        .collect()
}

fn query<'a>(params: &Params, types: &'a [EventType]) -> Result<EventQuery<'a>, ApiError> {
    let get = |name: &str| {
        params
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let number = |name: &str, default: u64, range: std::ops::RangeInclusive<u64>| {
        let Some(raw) = get(name) else {
            return Ok(default);
        };
        raw.parse::<u64>()
            .ok()
            .filter(|n| range.contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{name} must be a whole number in {}..={}, not '{raw}'",
                    range.start(),
                    range.end()
                ))
            })
    };
    let oldest_first = match get("orderAsc") {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "orderAsc must be true or false, not '{other}'"
            )))
        }
    };
    Ok(EventQuery {
        sandbox_id: None,
        types,
        since_us: retention_start(),
        oldest_first,
        offset: number("offset", 0, 0..=u64::from(u32::MAX))?,
        limit: number("limit", DEFAULT_LIMIT, 1..=MAX_LIMIT)?,
    })
}

/// The events as the API shows them (and webhooks are sent them).
pub(crate) async fn bodies(store: &Store, events: Vec<SandboxEvent>) -> Vec<SandboxEventBody> {
    let builds: Vec<TemplateName> = events
        .iter()
        .filter_map(|e| TemplateName::parse(&e.build_id).ok())
        .collect();
    let names = TemplateNames::of_builds(store, builds.iter()).await;
    events.into_iter().map(|e| body(&names, e)).collect()
}

fn body(names: &TemplateNames, e: SandboxEvent) -> SandboxEventBody {
    let template_id = match TemplateName::parse(&e.build_id) {
        Ok(build) => names.of_build(&build).0,
        Err(_) => e.build_id.clone(),
    };
    let at = chrono::DateTime::from_timestamp_micros(e.at_us).unwrap_or_default();
    SandboxEventBody {
        version: "v1".into(),
        id: e.id,
        kind: e.kind.as_str().into(),
        event_data: e.data,
        sandbox_id: e.sandbox_id,
        sandbox_template_id: template_id,
        sandbox_build_id: e.build_id,
        sandbox_team_id: e.owner,
        timestamp: at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    }
}
