//! JSON request bodies, read the way every REST handler reads them.

use crate::Rejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;

/// Largest request body the API reads (sandbox traffic is streamed and not capped here).
pub const MAX_API_BODY: usize = 1024 * 1024;

/// Axum's JSON extractor, but its rejections leave as `{code, message}` too, and a blank body
/// is `{}` (the SDKs send none where every field is optional).
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Rejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| Rejection {
                status: e.status(),
                message: match e.status() {
                    StatusCode::PAYLOAD_TOO_LARGE => format!(
                        "request body too large: the API reads at most {MAX_API_BODY} bytes"
                    ),
                    _ => format!("cannot read request body: {e}"),
                },
            })?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(JsonBody)
            .map_err(|e| Rejection::bad_request(format!("malformed JSON body: {e}")))
    }
}
