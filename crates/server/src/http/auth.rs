//! Who a request of the REST API comes from: the API key it carries, checked once by
//! [`require_api_key`] in front of every control-plane route, and the [`Caller`] and [`Owned`]
//! sandbox that handlers take from it.

use crate::cluster::node_api::ForwardedCaller;
use crate::http::error::ApiError;
use crate::AppState;
use airlock_core::keys::hash_key;
use airlock_core::lifecycle::LifecycleError;
use airlock_core::store::{LiveKey, SandboxRecord, Store};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

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
        let record = state.lifecycle.record_or_adopt(&id).await?;
        if !caller.sees(&record.owner) {
            return Err(LifecycleError::SandboxNotFound(id).into());
        }
        Ok(Owned { id, record })
    }
}

/// A caller whose key is an operator's (`airlock key create --operator`): the nodes' admin
/// routes show every tenant's load, so any other key gets 403. [`require_api_key`] sets it
/// beside the [`Caller`], from the same lookup of the key.
#[derive(Debug, Clone, Copy)]
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        if let Some(operator) = parts.extensions.get::<Operator>() {
            return Ok(*operator);
        }
        Err(not_operator())
    }
}

/// 403 for a key that is not an operator's on an operator's route.
pub(crate) fn not_operator() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "this route is the operator's: it needs a key made with \
         `airlock key create --operator`",
    )
}

pub(crate) async fn require_api_key(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    // On a node, the gateway that forwarded the request checked the key already.
    if let Some(forwarded) = req.extensions().get::<ForwardedCaller>().cloned() {
        if forwarded.operator {
            req.extensions_mut().insert(Operator);
        }
        req.extensions_mut().insert(Caller(forwarded.id));
        return next.run(req).await;
    }
    match live_key_of(&state.store, req.headers()).await {
        Ok(live) => {
            if live.operator {
                req.extensions_mut().insert(Operator);
            }
            req.extensions_mut().insert(Caller(live.id));
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// The caller an API key stands for; 401 for an unknown or revoked one.
pub(crate) async fn caller_of_key(store: &Store, key: &str) -> Result<Caller, ApiError> {
    Ok(Caller(live_key(store, key).await?.id))
}

/// The live key a request's X-API-KEY header carries; 401 without one (see [`live_key`]).
pub(crate) async fn live_key_of(
    store: &Store,
    headers: &axum::http::HeaderMap,
) -> Result<LiveKey, ApiError> {
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if key.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing API key: send it in the X-API-KEY header",
        ));
    }
    live_key(store, key).await
}

/// The live key `key` is; 401 if it is unknown or revoked, 503 if the store cannot be reached.
async fn live_key(store: &Store, key: &str) -> Result<LiveKey, ApiError> {
    store.keys().live(&hash_key(key)).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid API key (unknown or revoked)",
        )
    })
}
