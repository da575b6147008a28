//! The sandbox access token: every route but `/health` and `/files` requires it once `/init` set
//! one (`/files` also accepts a signed URL instead, see `files.rs`).

use crate::state::AgentState;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

pub const UNAUTHORIZED_MESSAGE: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

/// Constant-time comparison, so a wrong token reveals nothing about the right one by timing.
pub fn tokens_match(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Whether the request's `X-Access-Token` satisfies the sandbox's token (if any).
pub fn header_token_ok(headers: &HeaderMap, expected: Option<&str>) -> bool {
    let Some(expected) = expected else {
        return true;
    };
    headers
        .get(airlock_wire::ACCESS_TOKEN_HEADER)
        .is_some_and(|v| tokens_match(v.as_bytes(), expected.as_bytes()))
}

pub fn unauthorized(message: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({"code": 401, "message": message})),
    )
        .into_response()
}

pub async fn require_token(State(agent): State<AgentState>, req: Request, next: Next) -> Response {
    if header_token_ok(req.headers(), agent.config().access_token.as_deref()) {
        next.run(req).await
    } else {
        unauthorized(UNAUTHORIZED_MESSAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_checks() {
        let mut h = HeaderMap::new();
        assert!(header_token_ok(&h, None));
        assert!(!header_token_ok(&h, Some("abc")));
        h.insert("x-access-token", "abd".parse().unwrap());
        assert!(!header_token_ok(&h, Some("abc")));
        h.insert("x-access-token", "abc".parse().unwrap());
        assert!(header_token_ok(&h, Some("abc")));
        assert!(!tokens_match(b"ab", b"abc"));
    }
}
