//! Who may talk to the agent: one layer in front of both of its servers (envd and the code
//! interpreter), on every path, known or not. Once `/init` set an access token:
//!
//! - `/health` (on both ports) needs nothing;
//! - `/files` is let through to its handler, which takes the access token or a signed URL
//!   (see `envd::files`);
//! - the code interpreter's `/contexts` routes take the access token or the sandbox's traffic
//!   token: the stock SDK sends only the latter there (and the access token only on
//!   `/execute`), so it is what proves a caller on them. Running code needs the access token.
//! - everything else needs the access token.

use crate::config::{Config, SandboxConfig};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use std::sync::Arc;

pub const UNAUTHORIZED_MESSAGE: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

/// Header carrying the sandbox's traffic token (E2B's `E2B-Traffic-Access-Token`).
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Which of the agent's servers a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Envd,
    Interpreter,
}

/// Constant-time comparison, so a wrong token reveals nothing about the right one by timing.
pub fn tokens_match(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Whether `headers` carry `expected` in `header`.
fn carries(headers: &HeaderMap, header: &str, expected: &str) -> bool {
    headers
        .get(header)
        .is_some_and(|v| tokens_match(v.as_bytes(), expected.as_bytes()))
}

/// Whether the request's `X-Access-Token` satisfies the sandbox's token (if any).
pub fn header_token_ok(headers: &HeaderMap, expected: Option<&str>) -> bool {
    expected.is_none_or(|token| carries(headers, airlock_wire::ACCESS_TOKEN_HEADER, token))
}

/// The rules at the top of this file.
fn authorized(port: Port, path: &str, headers: &HeaderMap, config: &SandboxConfig) -> bool {
    let Some(access) = config.access_token.as_deref() else {
        return true; // an unsecured sandbox (`secure: false`)
    };
    if path == "/health" || (port == Port::Envd && path == "/files") {
        return true;
    }
    if carries(headers, airlock_wire::ACCESS_TOKEN_HEADER, access) {
        return true;
    }
    let manages_contexts = port == Port::Interpreter && path.starts_with("/contexts");
    manages_contexts
        && config
            .traffic_access_token
            .as_deref()
            .is_some_and(|traffic| carries(headers, TRAFFIC_TOKEN_HEADER, traffic))
}

pub fn unauthorized(message: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({"code": 401, "message": message})),
    )
        .into_response()
}

/// Puts the layer in front of every path of `router` (its fallback included), so no route can
/// be added that skips it.
pub fn guard(router: Router, config: Arc<Config>, port: Port) -> Router {
    router.layer(axum::middleware::from_fn_with_state((config, port), check))
}

async fn check(
    State((config, port)): State<(Arc<Config>, Port)>,
    req: Request,
    next: Next,
) -> Response {
    if authorized(port, req.uri().path(), req.headers(), &config.current()) {
        next.run(req).await
    } else {
        unauthorized(UNAUTHORIZED_MESSAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

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

    #[test]
    fn each_port_takes_its_tokens() {
        let config = SandboxConfig {
            access_token: Some("acc".into()),
            traffic_access_token: Some("traf".into()),
            ..Default::default()
        };
        let none = headers(&[]);
        let access = headers(&[("x-access-token", "acc")]);
        let traffic = headers(&[("e2b-traffic-access-token", "traf")]);
        let wrong = headers(&[
            ("x-access-token", "traf"),
            ("e2b-traffic-access-token", "acc"),
        ]);
        use Port::*;
        for (port, path) in [
            (Envd, "/health"),
            (Interpreter, "/health"),
            (Envd, "/files"),
        ] {
            assert!(authorized(port, path, &none, &config), "{path} is open");
        }
        for (port, path) in [
            (Envd, "/process.Process/Start"),
            (Envd, "/nosuchroute"),
            (Interpreter, "/execute"),
            (Interpreter, "/contexts"),
            (Interpreter, "/files"),
        ] {
            assert!(!authorized(port, path, &none, &config), "{path}");
            assert!(!authorized(port, path, &wrong, &config), "{path}");
            assert!(authorized(port, path, &access, &config), "{path}");
        }
        assert!(authorized(
            Interpreter,
            "/contexts/x/restart",
            &traffic,
            &config
        ));
        assert!(
            !authorized(Interpreter, "/execute", &traffic, &config),
            "running code needs the access token"
        );
        assert!(!authorized(
            Envd,
            "/process.Process/Start",
            &traffic,
            &config
        ));
        let unsecured = SandboxConfig::default();
        assert!(authorized(Interpreter, "/execute", &none, &unsecured));
    }
}
