//! What the HTTP edge reads from a tenant's request before anything acts on it. Every function
//! here is a pure parser of untrusted bytes: the fuzz target `rest_request` drives them all.

mod fields;
mod json;
mod target;

pub use fields::{check_map, parse_metadata_filter, percent_decode, url_pairs};
pub use json::{JsonBody, MAX_API_BODY};
pub use target::{classify, sandbox_host, Target};

use airlock_wire::api::ErrorBody;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// A request this crate refused: its status (400, or 413 for a body over `MAX_API_BODY`) and
/// why. It leaves as E2B's `{code, message}`; the server's own error takes it in with `?`.
#[derive(Debug)]
pub struct Rejection {
    pub status: StatusCode,
    pub message: String,
}

impl Rejection {
    fn bad_request(message: String) -> Self {
        Rejection {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.status.as_u16(),
            message: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}
