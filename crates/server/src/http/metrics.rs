//! Sandbox metrics, as E2B's SDK asks for them: one sandbox's samples over a time range
//! (`sandbox.get_metrics(start, end)`, `GET /sandboxes/{id}/metrics`) and the latest sample of
//! several (`GET /sandboxes/metrics?sandbox_ids=…`). A key sees its own sandboxes' only.

use crate::http::auth::{Caller, Owned};
use crate::http::error::ApiError;
use crate::AppState;
use airlock_core::lifecycle::metrics::Sample;
use airlock_wire::api::{SandboxMetric, SandboxesWithMetrics};
use axum::extract::{Extension, Query, State};
use axum::Json;
use std::collections::{BTreeMap, HashMap};

/// Most sandboxes one `GET /sandboxes/metrics` may name.
const MAX_IDS: usize = 100;

/// The samples from `start` to `end` (Unix seconds, both inclusive; the sandbox's whole life
/// without them), oldest first.
pub(crate) async fn range(
    State(state): State<AppState>,
    Owned { record, .. }: Owned,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Vec<SandboxMetric>>, ApiError> {
    let seconds = |name: &str| -> Result<Option<i64>, ApiError> {
        query
            .get(name)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!("{name} must be a Unix time in seconds"))
                })
            })
            .transpose()
    };
    let from = seconds("start")?.map_or(i64::MIN, |s| s.saturating_mul(1000));
    let to = seconds("end")?.map_or(i64::MAX, |s| s.saturating_mul(1000).saturating_add(999));
    if from > to {
        return Err(ApiError::bad_request("start is after end"));
    }
    let samples = state.lifecycle.metrics(&record.id, from, to);
    Ok(Json(samples.iter().map(body).collect()))
}

/// The latest sample of each of the caller's sandboxes among `sandbox_ids`; others (unknown,
/// another key's, none sampled yet) are left out.
pub(crate) async fn latest(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<SandboxesWithMetrics>, ApiError> {
    let ids: Vec<&str> = query
        .get("sandbox_ids")
        .map(|ids| {
            ids.split(',')
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if ids.is_empty() || ids.len() > MAX_IDS {
        return Err(ApiError::bad_request(format!(
            "sandbox_ids must name 1 to {MAX_IDS} sandboxes, separated by commas"
        )));
    }
    let mut sandboxes = BTreeMap::new();
    for record in state.lifecycle.list_records() {
        if caller.sees(&record.owner) && ids.contains(&record.id.as_str()) {
            if let Some(sample) = state.lifecycle.latest_metrics(&record.id) {
                sandboxes.insert(record.id.to_string(), body(&sample));
            }
        }
    }
    Ok(Json(SandboxesWithMetrics { sandboxes }))
}

fn body(s: &Sample) -> SandboxMetric {
    SandboxMetric {
        timestamp: chrono::DateTime::from_timestamp_millis(s.at_ms)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        timestamp_unix: s.at_ms / 1000,
        cpu_count: s.cpu_count,
        cpu_used_pct: (s.cpu_used_pct * 100.0).round() / 100.0,
        mem_used: s.mem_used,
        mem_total: s.mem_total,
        mem_cache: s.mem_cache,
        disk_used: s.disk_used,
        disk_total: s.disk_total,
    }
}
