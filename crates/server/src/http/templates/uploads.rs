//! COPY's files: the link a build's client asks for (`GET /templates/{id}/files/{hash}`), and
//! the upload to it (`PUT /uploads/{token}`), which carries no API key: the link is its own
//! authority.

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::http::templates::owned;
use crate::AppState;
use airlock_core::build::uploads::{valid_hash, UploadError, MAX_UPLOAD_BYTES};
use airlock_wire::templates::{TemplateFileUpload, UploadReceived};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;

/// COPY's upload link: whether the server has the files of `hash` for this template, and if
/// not, a one-time URL on this server to PUT them to (the SDK sends no API key with it).
pub(crate) async fn file_upload_link(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let template = owned(&state, &caller, &id).await?;
    if !valid_hash(&hash) {
        return Err(ApiError::bad_request(format!(
            "'{hash}' is not a files hash (64 hex digits)"
        )));
    }
    let uploads = &state.builder.uploads;
    let present = uploads.has(&template.id, &hash);
    // An upload may bring what is left of the key's template storage.
    let limit = state.builder.limits().storage_bytes_per_key;
    let room = limit.saturating_sub(state.builder.make_room(&caller.0, limit).await?);
    if room == 0 && !present {
        return Err(UploadError::OverQuota(0).into());
    }
    // The SDK uploads again when a step says `force_upload`, so a link comes either way.
    let token = uploads.ticket(&caller.0, &template.id, &hash, room)?;
    let url = format!("{}/uploads/{token}", base_url(&headers));
    let link = TemplateFileUpload {
        present,
        url: Some(url),
        headers: None,
    };
    Ok((StatusCode::CREATED, Json(link)).into_response())
}

/// The URL this server is reached at, as the client named it.
fn base_url(headers: &HeaderMap) -> String {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let host = header("x-forwarded-host")
        .or_else(|| header("host"))
        .unwrap_or("localhost");
    let scheme = match header("x-forwarded-proto") {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

/// `PUT /uploads/{token}`: a COPY's archive, to the link [`file_upload_link`] handed out. The
/// token is the authority; it works once.
pub(crate) async fn upload(
    State(state): State<AppState>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_UPLOAD_BYTES) {
        return Err(UploadError::TooLarge.into());
    }
    let stream = body
        .into_data_stream()
        .map(|chunk| chunk.map_err(std::io::Error::other));
    let size = state
        .builder
        .uploads
        .receive(&token, tokio_util::io::StreamReader::new(stream))
        .await?;
    Ok((StatusCode::OK, Json(UploadReceived { size })).into_response())
}
