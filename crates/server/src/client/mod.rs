//! Airlock's client of its own surfaces: the REST API, and a sandbox's agent through the
//! server's proxy (its processes, its files, its code interpreter). The CLI, the MCP server and
//! Dockerfile builds all speak through it; it prints nothing and parses no arguments.

pub mod capped;
pub mod files;
pub mod interpreter;
pub mod process;

use crate::data_dir::DataDir;
use airlock_wire::api::{ErrorBody, SandboxDetail};
use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use std::path::Path;

/// The HTTP client of the server's own calls: to its API (the CLI, MCP) and to sandboxes'
/// agents (the proxy, [`crate::agent_client`]).
pub type HttpClient = hyper_util::client::legacy::Client<HttpConnector, Body>;

/// Not pooled: see why in the proxy's module doc.
pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector)
}

/// Why a call failed: the server could not be reached, or it (or a sandbox) said no.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the Airlock server at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("{0}")]
    Failed(String),
}

impl ClientError {
    /// The error to show: it may quote a server, a sandbox or a registry, so its control
    /// characters are escaped (see [`crate::term`]).
    pub fn describe(&self) -> String {
        crate::term::escaped(&self.to_string()).into_owned()
    }
}

/// A minimal client for the server's API and sandbox proxy.
#[derive(Clone)]
pub struct Client {
    base: String,
    api_key: Option<String>,
    http: HttpClient,
}

impl Client {
    pub fn new(url: &str, api_key: Option<String>, data_dir: &Path) -> Self {
        // Same host as the server: the key it generated is in its data dir.
        let api_key = api_key.or_else(|| {
            std::fs::read_to_string(DataDir::layout(data_dir, None).api_key_file())
                .ok()
                .map(|k| k.trim().to_owned())
        });
        Client::with_key(url, api_key)
    }

    /// A client of the server at `url` with `api_key` (no key: calls that need one get 401),
    /// as the MCP server makes one for each caller.
    pub(crate) fn with_key(url: &str, api_key: Option<String>) -> Self {
        Client {
            base: url.trim_end_matches('/').to_owned(),
            api_key,
            http: http_client(),
        }
    }

    pub(crate) fn request(&self, method: &str, path: &str) -> http::request::Builder {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(key) = &self.api_key {
            req = req.header("x-api-key", key);
        }
        req
    }

    pub(crate) async fn send(
        &self,
        req: hyper::Request<Body>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        self.http
            .request(req)
            .await
            .map_err(|e| ClientError::Unreachable {
                url: self.base.clone(),
                detail: e.to_string(),
            })
    }

    /// Sends a bodyless API call and returns the body of a 2xx answer.
    pub(crate) async fn call(&self, method: &str, path: &str) -> Result<Vec<u8>, ClientError> {
        self.call_with(method, path, Body::empty()).await
    }

    /// Sends an API call with a JSON body and returns the body of a 2xx answer.
    pub(crate) async fn call_json(
        &self,
        method: &str,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<Vec<u8>, ClientError> {
        let body = serde_json::to_vec(body).map_err(|e| ClientError::Failed(e.to_string()))?;
        self.call_with(method, path, Body::from(body)).await
    }

    async fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Body,
    ) -> Result<Vec<u8>, ClientError> {
        let req = self
            .request(method, path)
            .header("content-type", "application/json")
            .body(body)
            .map_err(|e| ClientError::Failed(e.to_string()))?;
        let resp = self.send(req).await?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Failed(format!("reading the answer: {e}")))?
            .to_bytes();
        if status.is_success() {
            return Ok(body.to_vec());
        }
        Err(ClientError::Failed(error_message(&body, status)))
    }

    /// The token the sandbox's agent asks for, if it asks for one.
    pub(crate) async fn access_token(&self, id: &str) -> Result<Option<String>, ClientError> {
        let answer = self.call("GET", &format!("/sandboxes/{id}")).await?;
        Ok(parse::<SandboxDetail>(&answer)?.envd_access_token)
    }
}

/// A server's JSON answer.
pub(crate) fn parse<'a, T: serde::Deserialize<'a>>(answer: &'a [u8]) -> Result<T, ClientError> {
    serde_json::from_slice(answer)
        .map_err(|e| ClientError::Failed(format!("unexpected answer: {e}")))
}

/// `text` percent-encoded for a URL's query.
pub(crate) fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What a failed call's answer says: its `{message}`, or its text.
pub(crate) fn error_message(body: &[u8], status: http::StatusCode) -> String {
    let message = serde_json::from_slice::<ErrorBody>(body)
        .map(|e| e.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).trim().to_owned());
    format!("{message} ({status})")
}
