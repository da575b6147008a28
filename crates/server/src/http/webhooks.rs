//! Webhooks as E2B serves them: `POST /events/webhooks` (201), `GET /events/webhooks`,
//! `GET`, `PATCH` and `DELETE /events/webhooks/{id}`. Each is its API key's own: told of that
//! key's sandboxes' events only, and another key's id is not found. The secret is never
//! shown again.
//!
//! [`deliver`] reads the events journal's feed (events already recorded) and hands each event
//! to the webhooks that want it, as the events API shows it, signed; a verb never waits for
//! any of this.

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::events::{bodies, parse_types};
use crate::AppState;
use airlock_core::store::{EventType, SandboxEvent, Store, Webhook, WebhookChange};
use airlock_core::webhook::{Deliverer, Delivery, WebhookError};
use airlock_request::JsonBody;
use airlock_wire::events::{NewWebhook, WebhookBody, WebhookPatch};
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::Json;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Webhooks one key may have.
const MAX_PER_KEY: u32 = 10;
const MAX_NAME_LEN: usize = 256;
const MAX_SECRET_LEN: usize = 1024;

impl From<WebhookError> for ApiError {
    fn from(err: WebhookError) -> Self {
        match err {
            WebhookError::BadUrl(why) => ApiError::bad_request(why),
            WebhookError::Client(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
            }
        }
    }
}

pub(crate) async fn register(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<NewWebhook>,
) -> Result<(StatusCode, Json<WebhookBody>), ApiError> {
    check_name(&body.name)?;
    state.webhooks.check_url(&body.url)?;
    check_secret(&body.signature_secret)?;
    let hook = Webhook {
        id: uuid::Uuid::new_v4().to_string(),
        owner: caller.0.clone(),
        name: body.name,
        url: body.url,
        enabled: body.enabled.unwrap_or(true),
        events: events(&body.events)?,
        secret: body.signature_secret,
        created_at_us: chrono::Utc::now().timestamp_micros(),
    };
    if !state.store.webhooks().put(&hook, MAX_PER_KEY).await? {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("an API key may have at most {MAX_PER_KEY} webhooks; delete one first"),
        ));
    }
    tracing::info!(webhook = %hook.id, "webhook registered");
    Ok((StatusCode::CREATED, Json(body_of(hook))))
}

pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<WebhookBody>>, ApiError> {
    let hooks = state.store.webhooks().list(&caller.0).await?;
    Ok(Json(hooks.into_iter().map(body_of).collect()))
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<WebhookBody>, ApiError> {
    match state.store.webhooks().get(&caller.0, &id).await? {
        Some(hook) => Ok(Json(body_of(hook))),
        None => Err(not_found(&id)),
    }
}

pub(crate) async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(patch): JsonBody<WebhookPatch>,
) -> Result<Json<WebhookBody>, ApiError> {
    if let Some(name) = &patch.name {
        check_name(name)?;
    }
    if let Some(url) = &patch.url {
        state.webhooks.check_url(url)?;
    }
    if let Some(secret) = &patch.signature_secret {
        check_secret(secret)?;
    }
    let change = WebhookChange {
        events: patch.events.as_deref().map(events).transpose()?,
        name: patch.name,
        url: patch.url,
        enabled: patch.enabled,
        secret: patch.signature_secret,
    };
    match state
        .store
        .webhooks()
        .update(&caller.0, &id, &change)
        .await?
    {
        Some(hook) => Ok(Json(body_of(hook))),
        None => Err(not_found(&id)),
    }
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.store.webhooks().delete(&caller.0, &id).await? {
        tracing::info!(webhook = %id, "webhook deleted");
        Ok(StatusCode::OK)
    } else {
        Err(not_found(&id))
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("webhook '{id}' not found"))
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if name.chars().count() > MAX_NAME_LEN {
        return Err(ApiError::bad_request(format!(
            "name is longer than {MAX_NAME_LEN} characters"
        )));
    }
    Ok(())
}

fn check_secret(secret: &str) -> Result<(), ApiError> {
    if secret.is_empty() || secret.len() > MAX_SECRET_LEN {
        return Err(ApiError::bad_request(format!(
            "signatureSecret must be 1-{MAX_SECRET_LEN} bytes: every delivery is signed with it"
        )));
    }
    Ok(())
}

/// The event types named, each once; at least one.
fn events(names: &[String]) -> Result<Vec<EventType>, ApiError> {
    let mut types = parse_types("events", names.iter().map(String::as_str))?;
    types.sort_by_key(|t| EventType::ALL.iter().position(|a| a == t));
    types.dedup();
    if types.is_empty() {
        return Err(ApiError::bad_request(
            "events must name at least one event type",
        ));
    }
    Ok(types)
}

fn body_of(hook: Webhook) -> WebhookBody {
    let created = chrono::DateTime::from_timestamp_micros(hook.created_at_us).unwrap_or_default();
    WebhookBody {
        id: hook.id,
        team_id: hook.owner,
        name: hook.name,
        created_at: created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        enabled: hook.enabled,
        url: hook.url,
        events: hook.events.iter().map(|t| t.as_str().to_owned()).collect(),
    }
}

/// Hands each recorded event to its key's webhooks that want it, in the order recorded, for
/// the process's life. It never waits for an endpoint ([`Deliverer::send`]).
pub async fn deliver(
    store: Arc<Store>,
    deliverer: Arc<Deliverer>,
    mut feed: mpsc::Receiver<SandboxEvent>,
) {
    while let Some(event) = feed.recv().await {
        let hooks = match store.webhooks().wanting(&event.owner, event.kind).await {
            Ok(hooks) => hooks,
            Err(e) => {
                tracing::warn!(error = %e, "reading webhooks failed: an event is not delivered");
                continue;
            }
        };
        if hooks.is_empty() {
            continue;
        }
        let Some(body) = bodies(&store, vec![event]).await.pop() else {
            continue;
        };
        let body = match serde_json::to_string(&body) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(error = %e, "an event's JSON failed");
                continue;
            }
        };
        for hook in hooks {
            let delivery = Delivery {
                webhook_id: hook.id,
                url: hook.url,
                secret: hook.secret,
                body: body.clone(),
            };
            deliverer.send(delivery);
        }
    }
}
