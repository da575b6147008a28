//! Whether a request may reach the port of the sandbox it names (`airlock_request::classify`
//! says which), and the answer for a sandbox that is not there. What the proxy and auto-resume
//! both ask, so neither imports the other.

use airlock_core::ids::constant_time_eq;
use airlock_core::store::SandboxRecord;
use airlock_wire::api::SandboxNotFoundBody;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Header with which E2B's SDK proves itself on a sandbox's ports besides envd's.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Whether a request may reach a port of the sandbox other than envd's (which has its own
/// access token): with `allowPublicTraffic: false` it needs the traffic token.
pub(crate) fn port_allowed(record: &SandboxRecord, headers: &HeaderMap) -> bool {
    if !record.require_traffic_token {
        return true;
    }
    let (Some(expected), Some(given)) = (
        record.traffic_access_token.as_deref(),
        headers.get(TRAFFIC_TOKEN_HEADER),
    ) else {
        return false;
    };
    constant_time_eq(given.as_bytes(), expected.as_bytes())
}

/// The answer E2B's proxy gives for a sandbox that does not exist (any more); the SDK turns it
/// into "sandbox not running".
pub fn sandbox_not_found(id: &str) -> Response {
    bad_gateway(id, "The sandbox was not found")
}

pub(crate) fn bad_gateway(id: &str, message: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(SandboxNotFoundBody {
            sandbox_id: id.to_owned(),
            message: message.into(),
            code: 502,
        }),
    )
        .into_response()
}
