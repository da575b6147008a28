//! Signed file URLs (the SDK's `download_url()` and `upload_url()`) through a gateway. Such a
//! URL names no sandbox, only a signature made with its access token: the gateway finds the
//! running sandbox whose token made it among the catalog's, remembers it, and sends the
//! request to that sandbox's node, whose proxy checks the signature again as one machine does.

use super::forward::Kind;
use super::routes::lost;
use super::GatewayState;
use crate::http::error::ApiError;
use crate::proxy::signed_urls::SignedUrl;
use crate::proxy::target::bad_gateway;
use airlock_core::store::{SandboxRecord, SandboxState, StoreError};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub async fn signed_files(gw: &GatewayState, req: Request) -> Response {
    let Some(url) = SignedUrl::of(req.method(), req.uri()) else {
        return no_signer();
    };
    let record = match signer(gw, &url).await {
        Ok(Some(record)) => record,
        Ok(None) => return no_signer(),
        Err(e) => return ApiError::from(e).into_response(),
    };
    match gw.nodes.healthy(&record.node) {
        Ok(node) => {
            gw.forward
                .send(&node, req, None, Kind::SandboxTraffic)
                .await
        }
        Err(e) => bad_gateway(record.id.as_str(), &lost(&record, &e)),
    }
}

/// The running sandbox whose access token made `url`'s signature: the one remembered for it,
/// else the first of the catalog's that matches (one hash each).
async fn signer(gw: &GatewayState, url: &SignedUrl) -> Result<Option<SandboxRecord>, StoreError> {
    let made_it = |r: &SandboxRecord| {
        r.state == SandboxState::Running
            && r.access_token.as_deref().is_some_and(|t| url.signed_by(t))
    };
    if let Some(id) = gw.signers.get(url.signature()) {
        if let Some(record) = gw.store.sandboxes().alive(&id).await? {
            if made_it(&record) {
                return Ok(Some(record));
            }
        }
    }
    let found = gw.store.sandboxes().all().await?.into_iter().find(made_it);
    if let Some(record) = &found {
        gw.signers.remember(url.signature(), record.id.clone());
    }
    Ok(found)
}

/// As one machine answers it.
fn no_signer() -> Response {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "the signature matches no running sandbox",
    )
    .into_response()
}
