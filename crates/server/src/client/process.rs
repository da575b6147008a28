//! A sandbox's processes through its agent's `process.Process` service (Connect over HTTP, as
//! the SDK speaks it, through the server's proxy): unary calls, and a started process's stream
//! of events, read by [`ProcessEvents`], the one reader of such streams (the server reads its
//! own calls' with it too, see [`crate::agent_client`]).

use super::{Client, ClientError};
use airlock_wire::api::Sandbox;
use airlock_wire::connect::{self, Decoder};
use airlock_wire::envd::{
    ProcessEvent, ProcessEventMessage, ProcessSelector, SendSignalRequest, Signal, StartRequest,
};
use axum::body::Body;
use base64::Engine;
use http_body_util::BodyExt;

/// How Connect calls reach one sandbox's agent, as one user.
#[derive(Clone)]
pub(crate) struct Rpc {
    client: Client,
    id: String,
    user: String,
    token: Option<String>,
}

impl Rpc {
    /// Asks the server for the sandbox's access token, which every call then carries.
    pub(crate) async fn new(client: &Client, id: &str, user: &str) -> Result<Rpc, ClientError> {
        Ok(Rpc {
            token: client.access_token(id).await?,
            client: client.clone(),
            id: id.to_owned(),
            user: user.to_owned(),
        })
    }

    /// For a sandbox just created or connected, whose answer carried its access token.
    pub(crate) fn connected(client: &Client, sandbox: &Sandbox, user: &str) -> Rpc {
        Rpc {
            token: sandbox.envd_access_token.clone(),
            client: client.clone(),
            id: sandbox.sandbox_id.clone(),
            user: user.to_owned(),
        }
    }

    /// `path` is the service's and method's, e.g. `/process.Process/Start`.
    fn request(&self, path: &str, content_type: &str) -> http::request::Builder {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:", self.user));
        let mut req = self
            .client
            .request("POST", path)
            .header(airlock_wire::SANDBOX_ID_HEADER, &self.id)
            .header("content-type", content_type)
            .header("connect-protocol-version", "1")
            .header("authorization", format!("Basic {basic}"));
        if let Some(token) = &self.token {
            req = req.header(airlock_wire::ACCESS_TOKEN_HEADER, token);
        }
        req
    }

    /// A unary `process.Process` call.
    pub(crate) async fn call(
        &self,
        method: &str,
        message: &impl serde::Serialize,
    ) -> Result<(), ClientError> {
        self.unary(&format!("/process.Process/{method}"), message)
            .await
            .map(drop)
    }

    /// A unary call (JSON in, JSON out) to `path`; returns the answer's body.
    pub(crate) async fn unary(
        &self,
        path: &str,
        message: &impl serde::Serialize,
    ) -> Result<Vec<u8>, ClientError> {
        let body = serde_json::to_vec(message).map_err(|e| ClientError::Failed(e.to_string()))?;
        let req = self
            .request(path, "application/json")
            .body(Body::from(body))
            .map_err(|e| ClientError::Failed(e.to_string()))?;
        let resp = self.client.send(req).await?;
        let status = resp.status();
        if !status.is_success() {
            let body = super::capped::error_text(resp.into_body()).await;
            return Err(ClientError::Failed(super::error_message(&body, status)));
        }
        let what = format!("the answer of {path}");
        let body = super::capped::read(resp.into_body(), super::capped::MAX_JSON, &what).await;
        body.map(|b| b.to_vec())
            .map_err(|e| ClientError::Failed(e.to_string()))
    }
}

/// A started process: its pid and the stream of its events.
pub(crate) struct Process {
    rpc: Rpc,
    pid: u32,
    events: ProcessEvents,
}

impl Process {
    pub(crate) async fn start(rpc: Rpc, start: &StartRequest) -> Result<Process, ClientError> {
        let message =
            serde_json::to_value(start).map_err(|e| ClientError::Failed(e.to_string()))?;
        let req = rpc
            .request("/process.Process/Start", connect::STREAM_CONTENT_TYPE)
            .body(Body::from(connect::encode_message(&message)))
            .map_err(|e| ClientError::Failed(e.to_string()))?;
        let resp = rpc.client.send(req).await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = super::capped::error_text(resp.into_body()).await;
            return Err(ClientError::Failed(format!(
                "starting the command failed: {}",
                super::error_message(&body, status)
            )));
        }
        let mut process = Process {
            rpc,
            pid: 0,
            events: ProcessEvents::new(resp.into_body()),
        };
        match process.events.next().await {
            Ok(Some(ProcessEvent::Start(started))) => process.pid = started.pid,
            Err(EventsError::NotStarted { message }) => {
                return Err(ClientError::Failed(format!(
                    "starting the command failed: {message}"
                )))
            }
            Err(other) => return Err(ClientError::Failed(other.to_string())),
            Ok(other) => {
                return Err(ClientError::Failed(format!(
                    "the command did not start: {other:?}"
                )))
            }
        }
        Ok(process)
    }

    pub(crate) fn rpc(&self) -> &Rpc {
        &self.rpc
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The next event of the stream; `None` at its end. An error the stream ends with is
    /// returned as one.
    pub(crate) async fn next_event(&mut self) -> Result<Option<ProcessEvent>, ClientError> {
        let event = self.events.next().await;
        event.map_err(|e| ClientError::Failed(e.to_string()))
    }

    /// Kills the process (SIGKILL).
    pub(crate) async fn kill(&self) -> Result<(), ClientError> {
        let kill = SendSignalRequest {
            process: ProcessSelector::Pid(self.pid),
            signal: Signal::Kill,
        };
        self.rpc.call("SendSignal", &kill).await
    }
}

/// The events of a `process.Process` stream (the answer of `Start`), decoded from its Connect
/// envelopes as they arrive.
pub struct ProcessEvents {
    body: hyper::body::Incoming,
    decoder: Decoder,
    /// The `Start` event came: an error the stream ends with before it is why the agent did
    /// not start the command (no such directory or user), which it answers as envd does.
    started: bool,
}

/// Why a process's event stream failed (each reader may word it for its own readers).
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("the stream broke: {0}")]
    Broken(hyper::Error),
    #[error(transparent)]
    Envelope(#[from] connect::DecodeError),
    /// The stream ended with this error before the command started.
    #[error("the command did not start: {message}")]
    NotStarted { message: String },
    /// The stream's end message carried this error.
    #[error("{code:?}: {message}")]
    Ended {
        code: connect::Code,
        message: String,
    },
    #[error("unexpected message: {0}")]
    Unexpected(serde_json::Error),
}

impl ProcessEvents {
    pub fn new(body: hyper::body::Incoming) -> Self {
        ProcessEvents {
            body,
            decoder: Decoder::default(),
            started: false,
        }
    }

    /// The next event; `None` at the stream's end (its end message, or the body's). An error
    /// the stream ends with is returned as one.
    pub async fn next(&mut self) -> Result<Option<ProcessEvent>, EventsError> {
        loop {
            if let Some(env) = self.decoder.next_envelope()? {
                if env.is_end_stream() {
                    let end: connect::EndOfStream =
                        serde_json::from_slice(&env.payload).unwrap_or_default();
                    return match end.error {
                        Some(err) if !self.started => Err(EventsError::NotStarted {
                            message: err.message,
                        }),
                        Some(err) => Err(EventsError::Ended {
                            code: err.code,
                            message: err.message,
                        }),
                        None => Ok(None),
                    };
                }
                let msg: ProcessEventMessage =
                    serde_json::from_slice(&env.payload).map_err(EventsError::Unexpected)?;
                self.started |= matches!(msg.event, ProcessEvent::Start(_));
                return Ok(Some(msg.event));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    if let Some(chunk) = frame.map_err(EventsError::Broken)?.data_ref() {
                        self.decoder.push(chunk);
                    }
                }
            }
        }
    }
}
