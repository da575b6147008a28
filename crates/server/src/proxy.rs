//! Sandbox traffic: requests that name a sandbox (by `E2b-Sandbox-Id`, by a Host of the form
//! `{port}-{id}.{domain}`, or by a signed `/files` URL) are forwarded to that sandbox's agent.
//!
//! A sandbox's bytes served on the API's own origin (routed by header, or a signed URL) could
//! otherwise be a page of that origin, e.g. the dashboard's: they come with a sandboxing
//! Content Security Policy and `nosniff`, and a signed URL's as a download (see [`confine`]).
//! A sandbox's own host name is an origin of its own, so a web app there is served as it is.
//!
//! Bodies stream both ways unbuffered. When a sandbox is killed or paused its open responses are
//! cut, so the SDK sees the stream break (not a clean end), as it does against E2B.
//!
//! Connections to sandboxes are not pooled: a pause checkpoints the sandbox only once every
//! connection into it is closed (see the gVisor driver), and an idle pooled connection would
//! hold that up. A new connection over the veth costs well under a millisecond.

use crate::http::validate::percent_decode;
use crate::AppState;
use airlock_core::ids::{constant_time_eq, SandboxId};
use airlock_core::lifecycle::Sandbox;
use airlock_core::store::SandboxRecord;
use airlock_wire::api::SandboxNotFoundBody;
use airlock_wire::signed_url::{signature, FileOperation};
use airlock_wire::{ENVD_PORT, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body::Frame;
use hyper_util::client::legacy::connect::HttpConnector;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pub type HttpClient = hyper_util::client::legacy::Client<HttpConnector, Body>;

/// Agent routes only the server may call; the proxy never forwards them.
const INTERNAL_PATHS: &[&str] = &[
    "/init",
    airlock_wire::logs::LOGS_PATH,
    airlock_wire::REBOOT_PATH,
    airlock_wire::IDLE_PATH,
];

pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector)
}

/// Which sandbox and port a request is for, if it is sandbox traffic at all.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Sandbox {
        id: String,
        port: u16,
    },
    /// A signed `/files` URL: the sandbox is the one whose token made the signature.
    SignedFiles,
}

pub fn classify(headers: &HeaderMap, uri: &Uri) -> Option<Target> {
    if let Some(id) = headers.get(SANDBOX_ID_HEADER).and_then(|v| v.to_str().ok()) {
        let port = headers
            .get(SANDBOX_PORT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(ENVD_PORT);
        return Some(Target::Sandbox {
            id: id.trim().to_owned(),
            port,
        });
    }
    if let Some(target) = sandbox_host(headers) {
        return Some(target);
    }
    let signed = uri.path() == "/files"
        && uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("signature=")));
    signed.then_some(Target::SignedFiles)
}

/// The sandbox and port the request's Host names, if it names one.
fn sandbox_host(headers: &HeaderMap) -> Option<Target> {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_sandbox_host)
}

/// How a browser may show a sandbox's answer on the API's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// Routed by header: a browser cannot navigate to it, but a page of the origin can fetch it.
    AsIs,
    /// A signed URL, which anyone may be sent to open: saved as a file, never shown.
    AsDownload,
}

/// Makes a sandbox's answer harmless on the API's origin, whatever the sandbox said: its
/// content type is not second-guessed, and if a browser shows it anyway it is a sandboxed
/// document of no origin, whose scripts cannot run and which no request of the API's origin
/// (e.g. the dashboard's) can come from.
fn confine(mut answer: Response, shown: Shown) -> Response {
    let headers = answer.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static("sandbox"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    if shown == Shown::AsDownload {
        let disposition = attachment(headers.get(header::CONTENT_DISPOSITION));
        headers.insert(header::CONTENT_DISPOSITION, disposition);
    }
    answer
}

/// `attachment`, with the file name (the parameters) of the agent's `inline; filename=...`.
fn attachment(given: Option<&header::HeaderValue>) -> header::HeaderValue {
    let params = given
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(';'))
        .map(|(_, params)| params);
    params
        .and_then(|p| header::HeaderValue::from_str(&format!("attachment;{p}")).ok())
        .unwrap_or_else(|| header::HeaderValue::from_static("attachment"))
}

/// `49983-abc123.example.test[:port]` → sandbox `abc123`, port 49983.
fn parse_sandbox_host(host: &str) -> Option<Target> {
    let label = host.split('.').next()?;
    if label.len() == host.len() {
        return None; // a bare name like `localhost` is the API
    }
    let (port, id) = label.split_once('-')?;
    let port = port.parse().ok()?;
    let id_ok = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    id_ok.then(|| Target::Sandbox {
        id: id.to_owned(),
        port,
    })
}

/// Middleware in front of the API: sandbox traffic is forwarded, everything else passes on.
pub async fn route_sandbox_traffic(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    match classify(req.headers(), req.uri()) {
        None => next.run(req).await,
        Some(Target::Sandbox { id, port }) => {
            // Served as it is only on the sandbox's own origin (its port's host name).
            let own_origin = sandbox_host(req.headers()).is_some_and(|host| {
                host == Target::Sandbox {
                    id: id.clone(),
                    port,
                }
            });
            let sandbox = match state.lifecycle.running(&id).await {
                Ok(sandbox) => sandbox,
                Err(_) => match crate::auto_resume::wake(&state, &id, port, req.headers()).await {
                    Ok(sandbox) => sandbox,
                    Err(answer) => return answer,
                },
            };
            if port != ENVD_PORT && !port_allowed(&sandbox.record(), req.headers()) {
                return crate::http::error::ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "port {port} of sandbox {id} takes only requests that carry its traffic \
                         access token in the {TRAFFIC_TOKEN_HEADER} header (the sandbox was created \
                         with allowPublicTraffic: false)"
                    ),
                )
                .into_response();
            }
            let answer = forward(&state, sandbox, port, req).await;
            if own_origin {
                answer
            } else {
                confine(answer, Shown::AsIs)
            }
        }
        Some(Target::SignedFiles) => match signer_of(&state, req.method(), req.uri()).await {
            Some(sandbox) => confine(
                forward(&state, sandbox, ENVD_PORT, req).await,
                Shown::AsDownload,
            ),
            None => crate::http::error::ApiError::new(
                StatusCode::UNAUTHORIZED,
                "the signature matches no running sandbox",
            )
            .into_response(),
        },
    }
}

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

fn bad_gateway(id: &str, message: &str) -> Response {
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

/// The sandbox whose access token produced this URL's signature (protocol doc §3.6). The SDK
/// puts no sandbox id in such a URL, so the first request for a signature checks it against
/// each running sandbox's token, one hash each (the method fixes the operation), and remembers
/// the answer: requests for that URL after it are found in O(1).
async fn signer_of(state: &AppState, method: &Method, uri: &Uri) -> Option<Arc<Sandbox>> {
    let operation = match *method {
        Method::GET | Method::HEAD => FileOperation::Read,
        Method::POST => FileOperation::Write,
        _ => return None,
    };
    let query: Vec<(String, String)> = uri.query().map(url_pairs).unwrap_or_default();
    let get = |k: &str| {
        query
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let given = get("signature")?;
    let (path, username) = (get("path").unwrap_or(""), get("username").unwrap_or(""));
    let expiration = get("signature_expiration");
    let signed_by = |token: &str| {
        let expected = signature(path, operation, username, token, expiration);
        constant_time_eq(expected.as_bytes(), given.as_bytes())
    };
    if let Some(id) = state.signers.get(given) {
        if let Ok(sandbox) = state.lifecycle.running(id.as_str()).await {
            if sandbox.access_token().as_deref().is_some_and(signed_by) {
                return Some(sandbox);
            }
        }
    }
    let sandbox = state.lifecycle.find_by_access_token(signed_by)?;
    state.signers.remember(given, sandbox.id().clone());
    Some(sandbox)
}

/// Signatures already matched to their sandbox. Bounded: when full it starts over, which costs
/// only a new lookup per URL.
#[derive(Default)]
pub struct Signers(std::sync::Mutex<std::collections::HashMap<String, SandboxId>>);

impl Signers {
    const MAX: usize = 4096;

    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, SandboxId>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, signature: &str) -> Option<SandboxId> {
        self.map().get(signature).cloned()
    }

    fn remember(&self, signature: &str, sandbox: SandboxId) {
        let mut map = self.map();
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(signature.to_owned(), sandbox);
    }
}

pub fn url_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Some((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "host",
];

async fn forward(state: &AppState, sandbox: Arc<Sandbox>, port: u16, req: Request) -> Response {
    let id = sandbox.id().to_string();
    let Some(agent) = sandbox.agent() else {
        return sandbox_not_found(&id);
    };
    if INTERNAL_PATHS.contains(&req.uri().path()) {
        return crate::http::error::ApiError::not_found(format!(
            "{} is not a public route",
            req.uri().path()
        ))
        .into_response();
    }
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = match format!("http://{agent}:{port}{path}").parse() {
        Ok(uri) => uri,
        Err(_) => {
            return crate::http::error::ApiError::bad_request("malformed request path").into_response()
        }
    };
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    // Thawed if frozen, and kept awake until the response's last byte.
    let awake = state.lifecycle.wake(&sandbox);
    let upstream = hyper::Request::from_parts(parts, body);
    let result = tokio::select! {
        r = state.http.request(upstream) => r,
        _ = sandbox.stopped() => return sandbox_not_found(&id),
    };
    match result {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            let body = CutOnKill {
                inner: body,
                stopped: Box::pin(sandbox.stopped()),
                _awake: awake,
            };
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) if e.is_connect() => bad_gateway(&id, "The sandbox is running but port is not open"),
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "proxying to sandbox failed");
            bad_gateway(&id, "The sandbox did not answer")
        }
    }
}

/// A response body that fails as soon as its sandbox is killed or paused, so the client's stream
/// breaks.
struct CutOnKill {
    inner: hyper::body::Incoming,
    stopped: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    _awake: airlock_core::lifecycle::Awake,
}

impl http_body::Body for CutOnKill {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err("the sandbox was killed or paused".into())));
        }
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(|e| Box::new(e) as Self::Error)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn classifies_by_header_host_and_signature() {
        let uri: Uri = "/process.Process/Start".parse().unwrap();
        assert_eq!(
            classify(
                &headers(&[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "49999")]),
                &uri
            ),
            Some(Target::Sandbox {
                id: "abc".into(),
                port: 49999
            })
        );
        assert_eq!(
            classify(&headers(&[("host", "8080-abc1.airlock.test:3000")]), &uri),
            Some(Target::Sandbox {
                id: "abc1".into(),
                port: 8080
            })
        );
        assert_eq!(
            classify(&headers(&[("host", "127.0.0.1:3000")]), &uri),
            None
        );
        assert_eq!(
            classify(&headers(&[("host", "localhost:3000")]), &uri),
            None
        );
        let signed: Uri = "/files?path=%2Fa&signature=v1_x".parse().unwrap();
        assert_eq!(classify(&headers(&[]), &signed), Some(Target::SignedFiles));
        let health: Uri = "/health".parse().unwrap();
        assert_eq!(classify(&headers(&[]), &health), None);
    }

    #[test]
    fn downloads_keep_their_file_name() {
        let value = |s: &str| header::HeaderValue::from_str(s).unwrap();
        assert_eq!(
            attachment(Some(&value("inline; filename=report.html"))),
            "attachment; filename=report.html"
        );
        assert_eq!(
            attachment(Some(&value("inline; filename*=utf-8''%C3%A9.txt"))),
            "attachment; filename*=utf-8''%C3%A9.txt"
        );
        assert_eq!(attachment(Some(&value("inline"))), "attachment");
        assert_eq!(attachment(None), "attachment");
    }

    #[test]
    fn query_strings_decode() {
        assert_eq!(
            url_pairs("path=%2Fhome%2Fuser&x=a+b"),
            vec![
                ("path".to_string(), "/home/user".to_string()),
                ("x".to_string(), "a b".to_string())
            ]
        );
    }
}
