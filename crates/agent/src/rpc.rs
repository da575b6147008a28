//! Connect-protocol plumbing shared by the agent's services: errors, unary JSON bodies, streaming
//! request and response bodies.

use airlock_wire::connect::{self, Code, ConnectError, Decoder};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Largest unary request body we read.
const MAX_UNARY_BODY: usize = 16 * 1024 * 1024;

/// An RPC failure, answered as a Connect error.
#[derive(Debug)]
pub struct RpcError(pub ConnectError);

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcError(ConnectError::new(code, message))
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// Maps a filesystem error on `path` to the Connect code the SDK expects.
    pub fn from_io(err: &std::io::Error, path: &str) -> Self {
        use std::io::ErrorKind as K;
        let code = match err.kind() {
            K::NotFound => Code::NotFound,
            K::AlreadyExists => Code::AlreadyExists,
            K::PermissionDenied => Code::PermissionDenied,
            K::InvalidInput | K::NotADirectory | K::IsADirectory | K::DirectoryNotEmpty => {
                Code::InvalidArgument
            }
            K::StorageFull => Code::ResourceExhausted,
            _ => Code::Internal,
        };
        Self::new(code, format!("{path}: {err}"))
    }

    /// A server-streaming call's failure before its first message, as connect-go (E2B's envd)
    /// answers it: HTTP 200 and the error in the end-of-stream message. Clients read a stream's
    /// HTTP error status by the status alone (404 becomes `unimplemented`, not `not_found`).
    pub fn into_stream_response(self) -> Response {
        let mut resp = Body::from(connect::encode_end(Some(self.0))).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(connect::STREAM_CONTENT_TYPE),
        );
        resp
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.0)).into_response()
    }
}

pub type RpcResult<T> = Result<axum::Json<T>, RpcError>;

/// Parses a unary request body (bare JSON; any whitespace, unknown fields ignored).
pub fn parse_unary<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    if body.len() > MAX_UNARY_BODY {
        return Err(RpcError::invalid("request body too large"));
    }
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| RpcError::invalid(format!("malformed request: {e}")))
}

/// Reads the single message of a server-streaming request (Start, Connect, WatchDir).
///
/// The body is read to its end, not just to the first envelope: a connection closed with unread
/// request bytes is reset by the kernel, and the reset destroys the response still in flight.
pub async fn read_stream_request<T: DeserializeOwned>(body: Body) -> Result<T, RpcError> {
    let mut messages = MessageReader::new(body);
    let first = messages
        .next()
        .await?
        .ok_or_else(|| RpcError::invalid("request stream carried no message"))?;
    if messages.next::<serde::de::IgnoredAny>().await?.is_some() {
        return Err(RpcError::invalid(
            "server-streaming request carried more than one message",
        ));
    }
    Ok(first)
}

/// Reads the messages of a client-streaming request (StreamInput) one by one, as they arrive.
pub struct MessageReader {
    decoder: Decoder,
    data: axum::body::BodyDataStream,
}

impl MessageReader {
    pub fn new(body: Body) -> Self {
        MessageReader {
            decoder: Decoder::default(),
            data: body.into_data_stream(),
        }
    }

    /// The next message, or `None` at the end of the stream.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, RpcError> {
        loop {
            if let Some(env) = self
                .decoder
                .next_envelope()
                .map_err(|e| RpcError::invalid(e.to_string()))?
            {
                if env.is_end_stream() {
                    return Ok(None);
                }
                return parse_unary(&env.payload).map(Some);
            }
            match self.data.next().await {
                Some(chunk) => {
                    let chunk =
                        chunk.map_err(|e| RpcError::invalid(format!("reading request: {e}")))?;
                    self.decoder.push(&chunk);
                }
                None => {
                    self.decoder
                        .finish()
                        .map_err(|e| RpcError::invalid(e.to_string()))?;
                    return Ok(None);
                }
            }
        }
    }
}

/// The sending half of a streaming response. Dropping it without `finish` still ends the stream
/// cleanly; a send fails once the client has gone away.
pub struct StreamSender {
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
}

#[derive(Debug)]
pub struct ClientGone;

impl StreamSender {
    pub async fn send<T: Serialize>(&self, msg: &T) -> Result<(), ClientGone> {
        self.tx
            .send(Ok(connect::encode_message(msg)))
            .await
            .map_err(|_| ClientGone)
    }

    pub async fn finish(self, error: Option<ConnectError>) {
        let _ = self.tx.send(Ok(connect::encode_end(error))).await;
    }

    /// Resolves when the client has disconnected.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// A streaming response and the sender that feeds it.
pub fn stream_response() -> (StreamSender, Response) {
    let (tx, rx) = mpsc::channel(16);
    let mut resp = Body::from_stream(ReceiverStream::new(rx)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(connect::STREAM_CONTENT_TYPE),
    );
    (StreamSender { tx }, resp)
}

/// `Connect-Timeout-Ms`, if the client set one.
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// How long a stream may be silent before a keepalive goes out (`Keepalive-Ping-Interval`).
pub fn keepalive_interval(headers: &HeaderMap) -> Duration {
    let secs = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(90);
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unary_accepts_empty_and_pretty_bodies() {
        #[derive(Debug, serde::Deserialize)]
        struct M {
            #[serde(default)]
            path: String,
        }
        assert_eq!(parse_unary::<M>(b"").unwrap().path, "");
        assert_eq!(
            parse_unary::<M>(b"{\n  \"path\": \"/a\"\n}").unwrap().path,
            "/a"
        );
        let err = parse_unary::<M>(b"{nope").unwrap_err();
        assert_eq!(err.0.code, Code::InvalidArgument);
    }

    #[test]
    fn io_errors_map_to_connect_codes() {
        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(RpcError::from_io(&e, "/x").0.code, Code::NotFound);
        let e = std::io::Error::from(std::io::ErrorKind::AlreadyExists);
        assert_eq!(RpcError::from_io(&e, "/x").0.code, Code::AlreadyExists);
    }
}
