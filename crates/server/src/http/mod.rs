//! The E2B REST surface, and this file its one route table. The modules below answer one kind
//! of resource each, over [`auth`], [`error`] and the core; only this table names their
//! handlers.

pub mod auth;
pub mod error;
mod events;
pub(crate) mod idempotency;
mod logs;
mod metrics;
pub(crate) mod nodes;
pub mod sandboxes;
mod snapshots;
pub mod templates;
pub mod verbs;
mod volumes;
pub mod webhooks;

use crate::AppState;
use axum::routing::{delete, get, patch, post, put};
use axum::Router;
use templates::{builds, info, tags, uploads};

/// Every REST route: the control plane's behind the API key (see [`auth::require_api_key`]),
/// then the two that carry their own authority.
pub fn routes(state: AppState) -> Router<AppState> {
    Router::new()
        .route(
            "/sandboxes",
            post(sandboxes::create_v1).get(sandboxes::list_v1),
        )
        .route(
            "/v2/sandboxes",
            post(sandboxes::create_v2).get(sandboxes::list_v2),
        )
        .route(
            "/sandboxes/{id}",
            get(sandboxes::detail).delete(sandboxes::kill),
        )
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(sandboxes::refresh))
        .route("/sandboxes/{id}/network", put(sandboxes::set_network))
        .route("/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/v2/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/sandboxes/{id}/pause", post(snapshots::pause))
        .route("/sandboxes/{id}/resume", post(snapshots::resume))
        .route(
            "/sandboxes/{id}/snapshots",
            post(snapshots::create_snapshot),
        )
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/snapshots", get(snapshots::list_snapshots))
        .route("/sandboxes/{id}/logs", get(logs::logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(logs::logs_v2))
        .route("/nodes", get(nodes::list))
        .route("/nodes/{node}", get(nodes::detail).post(nodes::set_status))
        .route("/sandboxes/metrics", get(metrics::latest))
        .route("/sandboxes/{id}/metrics", get(metrics::range))
        .route("/v3/templates", post(builds::request_build))
        .route(
            "/v2/templates/{id}/builds/{build}",
            post(builds::start_build),
        )
        .route(
            "/templates/{id}/builds/{build}",
            delete(builds::cancel_build),
        )
        .route(
            "/templates/{id}/builds/{build}/status",
            get(builds::build_status),
        )
        .route(
            "/templates/{id}/builds/{build}/logs",
            get(builds::build_logs),
        )
        .route(
            "/templates/{id}/files/{hash}",
            get(uploads::file_upload_link),
        )
        .route("/templates", get(info::list))
        .route("/v2/templates", get(info::list))
        .route(
            "/templates/{id}",
            get(info::detail).patch(info::update).delete(info::delete),
        )
        .route("/v2/templates/{id}", patch(info::update))
        .route("/templates/aliases/{alias}", get(info::alias))
        .route(
            "/templates/aliases/{namespace}/{alias}",
            get(info::namespaced_alias),
        )
        .route("/templates/tags", post(tags::assign).delete(tags::remove))
        .route("/templates/{id}/tags", get(tags::list))
        .route("/events/sandboxes", get(events::of_key))
        .route("/events/sandboxes/{id}", get(events::of_sandbox))
        .route(
            "/events/webhooks",
            post(webhooks::register).get(webhooks::list),
        )
        .route(
            "/events/webhooks/{id}",
            get(webhooks::get)
                .patch(webhooks::update)
                .delete(webhooks::delete),
        )
        .route("/volumes", post(volumes::create).get(volumes::list))
        .route("/volumes/{id}", get(volumes::info).delete(volumes::destroy))
        .route_layer(axum::middleware::from_fn_with_state(
            state,
            auth::require_api_key,
        ))
        // Outside the API key: the link is its own authority (see `uploads::upload`).
        .route("/uploads/{token}", put(uploads::upload))
        // Outside the API key too: each volume's token is checked instead.
        .route(
            "/volumecontent/{id}/path",
            get(volumes::stat)
                .delete(volumes::remove)
                .patch(volumes::update),
        )
        .route(
            "/volumecontent/{id}/dir",
            get(volumes::list_dir).post(volumes::make_dir),
        )
        .route(
            "/volumecontent/{id}/file",
            get(volumes::read_file).put(volumes::write_file),
        )
}
