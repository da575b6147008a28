//! The web dashboard at `/dashboard/`: one page (HTML, CSS and script in `index.html`, no
//! build step) over a small JSON API of its own under `/dashboard/api/`. It shows the key's
//! sandboxes (template, age, timeout, CPU, memory, metadata) with kill, pause and resume, its
//! templates and their builds with logs, and the host's headroom.
//!
//! The page itself holds nothing: it asks for the API key in a form, keeps it in a variable of
//! its script only, and sends it in `X-API-Key` with each call to its API. A browser adds that
//! header to no request by itself, as it would HTTP Basic credentials or a cookie, so no other
//! page can act with the key: not a page of this same origin (such as a sandbox's file behind
//! a signed link, which the proxy serves sandboxed anyway), and not another site's, which could
//! send the header only after a CORS preflight that this server never grants.

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::sandboxes::{detail_body, TemplateNames};
use crate::AppState;
use airlock_core::ids::TemplateName;
use airlock_core::store::SandboxState;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

const PAGE: &str = include_str!("index.html");
/// The most nodes an overview adds the paused sandboxes of (`pausedOn`): a cluster's silent
/// nodes, which a gateway names.
const MAX_SILENT_NODES: usize = 64;
/// Build log lines one view shows, newest last.
const LOG_LINES: u64 = 2000;

pub fn routes(state: AppState) -> Router<AppState> {
    let api = Router::new()
        .route("/dashboard/api/state", get(overview))
        .route(
            "/dashboard/api/sandboxes/{id}/{action}",
            post(sandbox_action),
        )
        .route(
            "/dashboard/api/templates/{id}/builds/{build}/logs",
            get(build_logs),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state,
            crate::http::auth::require_api_key,
        ))
        // What the key shows is for the page that asked, not for the browser's cache.
        .layer(axum::middleware::map_response(
            |mut answer: Response| async {
                answer
                    .headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                answer
            },
        ));
    Router::new()
        .route(
            "/dashboard",
            get(|| async { Redirect::permanent("/dashboard/") }),
        )
        .route("/dashboard/", get(page))
        .merge(api)
}

/// The page's Content Security Policy: its own inline script and style (by their hashes, so no
/// other inline code runs), requests to this server only, no framing, no form posts.
static POLICY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
         form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
        inline_hash(PAGE, "script"),
        inline_hash(PAGE, "style")
    )
});

/// `'sha256-...'` of the text of the page's one `<tag>` element, as CSP hashes it.
fn inline_hash(page: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let text = page
        .split_once(&open)
        .and_then(|(_, rest)| rest.split_once(&format!("</{tag}>")))
        .map_or("", |(text, _)| text);
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, POLICY.as_str()),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Overview {
    /// The key's id, as `airlock key ls` shows it.
    key: String,
    host: Headroom,
    sandboxes: Vec<SandboxRow>,
    templates: Vec<TemplateRow>,
}

/// How much room the host has left (a cluster's: its nodes' together).
#[derive(Serialize, Deserialize)]
struct Headroom {
    sandboxes_running: usize,
    sandboxes_max: usize,
    memory_available_bytes: Option<u64>,
    memory_total_bytes: Option<u64>,
    disk_available_bytes: Option<u64>,
    disk_total_bytes: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct SandboxRow {
    #[serde(flatten)]
    detail: airlock_wire::api::SandboxDetail,
    /// Share of its CPUs in use (0-100) and memory in use, at the last sample (every 5 s).
    cpu_used_pct: Option<f64>,
    mem_used_bytes: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct TemplateRow {
    /// What sandboxes are created from.
    name: String,
    /// The template's id for its builds' logs; `None` for a built-in.
    id: Option<String>,
    builds: Vec<BuildRow>,
}

#[derive(Serialize, Deserialize)]
struct BuildRow {
    id: String,
    status: String,
    created_at: i64,
    finished_at: Option<i64>,
    /// Why it failed, and at which step.
    failure: Option<String>,
}

/// The overview's query: in a cluster, the gateway asks one node to add the caller's paused
/// sandboxes of the nodes that do not answer (`pausedOn=node-1,node-2`), from the catalog.
/// Those are not lost: they resume on another node at their next request.
#[derive(Deserialize)]
struct OverviewQuery {
    #[serde(rename = "pausedOn")]
    paused_on: Option<String>,
}

async fn overview(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<OverviewQuery>,
) -> Result<Json<Overview>, ApiError> {
    let load = state.lifecycle.host_load();
    let mut records = state.lifecycle.list_records();
    let nodes = query.paused_on.iter().flat_map(|n| n.split(','));
    for node in nodes
        .filter(|n| *n != state.node_name)
        .take(MAX_SILENT_NODES)
    {
        let paused = state.store.sandboxes().of_node(node).await?;
        let paused = paused
            .into_iter()
            .filter(|r| r.state == SandboxState::Paused);
        records.extend(paused.map(std::sync::Arc::new));
    }
    records.retain(|r| caller.sees(&r.owner));
    let names = TemplateNames::of(&state.store, &records).await;
    let sandboxes: Vec<SandboxRow> = records
        .iter()
        .rev()
        .map(|r| {
            let sample = state.lifecycle.latest_metrics(&r.id);
            SandboxRow {
                detail: detail_body(&state, r, false, &names),
                cpu_used_pct: sample.as_ref().map(|s| s.cpu_used_pct),
                mem_used_bytes: sample.map(|s| s.mem_used),
            }
        })
        .collect();
    let disk = airlock_core::disk_usage::disk_space(&state.data_dir);
    let host = Headroom {
        sandboxes_running: load
            .phases
            .iter()
            .filter(|(phase, _)| phase.occupies())
            .map(|(_, n)| n)
            .sum(),
        sandboxes_max: load.max_sandboxes,
        memory_available_bytes: load.memory_available_bytes,
        memory_total_bytes: load.memory_total_bytes,
        disk_available_bytes: disk.map(|d| d.available),
        disk_total_bytes: disk.map(|d| d.total),
    };
    Ok(Json(Overview {
        key: caller.0.clone(),
        host,
        sandboxes,
        templates: templates(&state, &caller).await?,
    }))
}

impl Overview {
    /// A cluster's overview from its nodes' (a gateway's): every node's sandboxes, newest
    /// first, and their headroom added up. The key and the templates are the shared
    /// database's, the same on every node. `None` for no overview.
    pub(crate) fn of_nodes(nodes: Vec<Overview>) -> Option<Overview> {
        let mut nodes = nodes.into_iter();
        let mut all = nodes.next()?;
        for node in nodes {
            let (host, more) = (&mut all.host, node.host);
            host.sandboxes_running += more.sandboxes_running;
            host.sandboxes_max += more.sandboxes_max;
            let add = |a: &mut Option<u64>, b: Option<u64>| {
                *a = match (*a, b) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
                }
            };
            add(
                &mut host.memory_available_bytes,
                more.memory_available_bytes,
            );
            add(&mut host.memory_total_bytes, more.memory_total_bytes);
            add(&mut host.disk_available_bytes, more.disk_available_bytes);
            add(&mut host.disk_total_bytes, more.disk_total_bytes);
            all.sandboxes.extend(node.sandboxes);
        }
        // RFC 3339 in UTC, all of one format: newest first as text is newest first in time.
        all.sandboxes
            .sort_by(|a, b| b.detail.started_at.cmp(&a.detail.started_at));
        Some(all)
    }
}

/// The built-ins, then the key's own templates (newest first), each with its builds.
async fn templates(state: &AppState, caller: &Caller) -> Result<Vec<TemplateRow>, ApiError> {
    let mut rows = Vec::new();
    for name in airlock_core::template::KNOWN_TEMPLATES {
        let name = TemplateName::parse(name).expect("built-in names are valid");
        let built = state.store.templates().get(&name).await?;
        rows.push(TemplateRow {
            name: name.to_string(),
            id: None,
            builds: built
                .map(|t| BuildRow {
                    id: t.content_hash.chars().take(12).collect(),
                    status: "ready".into(),
                    created_at: t.built_at,
                    finished_at: Some(t.built_at),
                    failure: None,
                })
                .into_iter()
                .collect(),
        });
    }
    let mut own = state.store.templates().user_templates_of(&caller.0).await?;
    own.reverse();
    for t in own {
        let builds = state.store.templates().builds_of(&t.id).await?;
        rows.push(TemplateRow {
            name: t.alias.to_string(),
            id: Some(t.id.to_string()),
            builds: builds
                .into_iter()
                .map(|b| BuildRow {
                    status: b.status.as_str().into(),
                    created_at: b.created_at,
                    finished_at: b.finished_at,
                    failure: b.failure.map(|(why, step)| match step {
                        Some(step) => format!("step {step}: {why}"),
                        None => why,
                    }),
                    id: b.id,
                })
                .collect(),
        });
    }
    Ok(rows)
}

async fn sandbox_action(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, action)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    // A paused sandbox that a gateway sent here from its lost node is taken over.
    let record = state
        .lifecycle
        .record_or_adopt(&id)
        .await
        .ok()
        .filter(|r| caller.sees(&r.owner))
        .ok_or_else(|| ApiError::not_found(format!("sandbox {id} not found")))?;
    let (id, lifecycle, verbs) = (record.id.as_str(), &state.lifecycle, &state.verbs);
    let full = airlock_core::store::PauseMode::Full;
    match action.as_str() {
        "kill" => verbs.timed("kill", lifecycle.kill(id)).await?,
        "pause" => {
            verbs
                .timed("pause", lifecycle.pause(id, full, false))
                .await?
        }
        "resume" => drop(
            verbs
                .timed("resume", lifecycle.resume(id, None, full))
                .await?,
        ),
        other => {
            return Err(ApiError::not_found(format!(
                "no action '{other}': kill, pause or resume"
            )))
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Serialize)]
struct LogLine {
    at_ms: i64,
    level: &'static str,
    step: Option<String>,
    message: String,
}

async fn build_logs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, build)): Path<(String, String)>,
) -> Result<Json<Vec<LogLine>>, ApiError> {
    let (_, record) = crate::http::templates::owned_build(&state, &caller, &id, &build).await?;
    let lines = state
        .store
        .templates()
        .build_logs(&record.id, 0, LOG_LINES)
        .await?;
    Ok(Json(
        lines
            .into_iter()
            .map(|e| LogLine {
                at_ms: e.at_ms,
                level: e.level.as_str(),
                step: e.step,
                message: e.message,
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_the_pages_script_and_style() {
        let script = PAGE.split("<script>").nth(1).unwrap();
        let script = script.split("</script>").next().unwrap();
        let digest = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(script));
        assert!(
            POLICY.contains(&format!("script-src 'sha256-{digest}'")),
            "{}",
            *POLICY
        );
        assert_eq!(PAGE.matches("<script>").count(), 1, "one inline script");
        assert_eq!(PAGE.matches("<style>").count(), 1, "one inline style");
        assert!(!POLICY.contains("unsafe"), "{}", *POLICY);
    }
}
