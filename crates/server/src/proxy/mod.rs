//! Sandbox traffic: requests that name a sandbox (by `E2b-Sandbox-Id`, by a Host of the form
//! `{port}-{id}.{domain}`, or by a signed `/files` URL) are forwarded to that sandbox's agent.
//!
//! A sandbox's bytes served on the API's own origin (routed by header, or a signed URL) could
//! otherwise be a page of that origin, e.g. the dashboard's: they come with a sandboxing
//! Content Security Policy and `nosniff`, and a signed URL's as a download (see [`confine`]).
//! A sandbox's own host name is an origin of its own, so a web app there is served as it is.
//!
//! Bodies stream both ways unbuffered. When a sandbox is killed or paused its open responses are
//! cut, so a client never takes a truncated body (a file, say) for a whole one; a Connect stream
//! instead ends as Connect ends one, with an error the SDKs read as "the sandbox is not running"
//! (see [`envelopes`]).
//!
//! Connections to sandboxes are not pooled: a pause checkpoints the sandbox only once every
//! connection into it is closed (see the gVisor driver), and an idle pooled connection would
//! hold that up. A new connection over the veth costs well under a millisecond.

mod auto_resume;
mod envelopes;
pub(crate) mod signed_urls;
pub mod target;

pub use signed_urls::Signers;

use crate::AppState;
use airlock_core::lifecycle::Sandbox;
use airlock_request::{classify, sandbox_host, Target};
use airlock_wire::ENVD_PORT;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use envelopes::{Cut, Envelopes};
use http_body::Frame;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use target::{bad_gateway, port_allowed, sandbox_not_found, TRAFFIC_TOKEN_HEADER};

/// Agent routes only the server may call; the proxy never forwards them.
const INTERNAL_PATHS: &[&str] = &[
    "/init",
    airlock_wire::logs::LOGS_PATH,
    airlock_wire::REBOOT_PATH,
    airlock_wire::IDLE_PATH,
];

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
                Err(_) => match auto_resume::wake(&state, &id, port, req.headers()).await {
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
        Some(Target::SignedFiles) => {
            match signed_urls::signer_of(&state, req.method(), req.uri()).await {
                Some(sandbox) => confine(
                    forward(&state, sandbox, ENVD_PORT, req).await,
                    Shown::AsDownload,
                ),
                None => crate::http::error::ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "the signature matches no running sandbox",
                )
                .into_response(),
            }
        }
    }
}

/// Connection headers of one hop, which a proxy does not pass on.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Points a request on to `http://{authority}`, with its path and query, and without the
/// headers of the hop it came by (the proxy into a sandbox, and a gateway to a node).
pub(crate) fn retarget(
    parts: &mut axum::http::request::Parts,
    authority: &str,
) -> Result<(), crate::http::error::ApiError> {
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = format!("http://{authority}{path}")
        .parse()
        .map_err(|_| crate::http::error::ApiError::bad_request("malformed request path"))?;
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    Ok(())
}

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
    if let Err(e) = retarget(&mut parts, &format!("{agent}:{port}")) {
        return e.into_response();
    }
    // The agent's own address is the Host it is asked at.
    parts.headers.remove(header::HOST);
    // Thawed if frozen, and kept awake until the response's last byte.
    let awake = state.lifecycle.wake(&sandbox);
    let upstream = hyper::Request::from_parts(parts, body);
    let result = tokio::select! {
        r = state.http.request(upstream) => r,
        _ = sandbox.stopped() => return sandbox_not_found(&id),
    };
    match result {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            let envelopes = envelopes::is_connect_stream(&parts.headers).then(|| {
                // It may end with our end-of-stream message, which no length counted.
                parts.headers.remove(header::CONTENT_LENGTH);
                Envelopes::default()
            });
            let body = CutOnKill {
                inner: body,
                envelopes,
                stopped: Box::pin(sandbox.stopped()),
                id,
                done: false,
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

/// A response body that ends as soon as its sandbox is killed or paused: a Connect stream
/// cleanly, with an end-of-stream error; anything else with a failure, so the client sees it break.
struct CutOnKill {
    inner: hyper::body::Incoming,
    /// Set for a Connect stream, which is forwarded whole envelopes at a time.
    envelopes: Option<Envelopes>,
    stopped: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    id: String,
    done: bool,
    _awake: airlock_core::lifecycle::Awake,
}

type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl http_body::Body for CutOnKill {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if this.stopped.as_mut().poll(cx).is_ready() {
                this.done = true;
                return Poll::Ready(match this.envelopes.as_mut().map(|e| e.cut(&this.id)) {
                    Some(Cut::End(last)) => Some(Ok(Frame::data(last))),
                    Some(Cut::Complete) => None,
                    Some(Cut::Break) | None => Some(Err("the sandbox was killed or paused".into())),
                });
            }
            let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
            let Some(envelopes) = this.envelopes.as_mut() else {
                return Poll::Ready(frame.map(|f| f.map_err(BodyError::from)));
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let whole = envelopes.push(data);
                        if !whole.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(whole))));
                        }
                    }
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    this.done = true;
                    let rest = envelopes.rest();
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not while an envelope is held back: it is still to be forwarded.
        self.done || (self.envelopes.is_none() && self.inner.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
