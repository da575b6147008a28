//! How the server talks to a sandbox's agent itself (health and `/init`), over the sandbox's link.
//! What the agent answers is the sandbox's to choose, so each answer is read to a cap (see
//! [`crate::client::capped`]).

use crate::client::capped::{self, MAX_JSON};
use crate::client::process::{EventsError, ProcessEvents};
use crate::client::HttpClient;
use airlock_core::lifecycle::{AgentClient, AgentCommand, InitError, OutputLine, Program};
use airlock_wire::connect;
use airlock_wire::envd::{InitRequest, ProcessConfig, ProcessEvent, ProcessOutput, StartRequest};
use airlock_wire::logs::{LineBuffer, LogEntry, LOGS_PATH, START_CMD_TAG};
use airlock_wire::{
    IdleReport, ACCESS_TOKEN_HEADER, CODE_INTERPRETER_PORT, ENVD_PORT, IDLE_PATH, REBOOT_PATH,
};
use axum::body::Body;
use axum::body::Bytes;
use axum::http::Method;
use base64::Engine;
use std::net::Ipv4Addr;
use std::time::Duration;

/// Imported by the golden image's Python kernel; what `import pandas` would cost a first run.
/// Then the kernel's history starts a new session and its counter goes back, so that a user's
/// first run is `In [1]` with no trace of this cell, as in a fresh kernel (IPython has already
/// counted this cell when it runs).
const WARM_UP_CODE: &str = "import numpy, pandas, matplotlib, matplotlib.pyplot\n\
    get_ipython().history_manager.reset(new_session=True)\n\
    get_ipython().execution_count = 1";
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(120);

pub struct HttpAgentClient {
    pub http: HttpClient,
}

#[async_trait::async_trait]
impl AgentClient for HttpAgentClient {
    async fn wait_ready(&self, addr: Ipv4Addr, within: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + within;
        let mut last = String::from("never answered");
        while tokio::time::Instant::now() < deadline {
            let per_try = Duration::from_millis(500);
            match self
                .request(Method::GET, addr, "/health", None, None, per_try)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(format!(
            "agent at {addr} not ready after {within:?}: {last}"
        ))
    }

    /// Runs the imports most analyses start with in the code interpreter's default Python
    /// context (protocol doc §4), so a golden image holds a kernel that has them loaded.
    async fn warm_up(&self, addr: Ipv4Addr) -> Result<(), String> {
        let body = serde_json::json!({ "code": WARM_UP_CODE, "language": "python" });
        let req = hyper::Request::post(format!("http://{addr}:{CODE_INTERPRETER_PORT}/execute"))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .map_err(|e| e.to_string())?;
        let resp = match tokio::time::timeout(WARM_UP_TIMEOUT, self.http.request(req)).await {
            Err(_) => return Err("the code interpreter did not answer in time".into()),
            // No code interpreter in this template: nothing to warm.
            Ok(Err(e)) if e.is_connect() => return Ok(()),
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(resp)) => resp,
        };
        let status = resp.status();
        let answer = capped::read(resp.into_body(), MAX_JSON, "the warm-up run's answer");
        let body = tokio::time::timeout(WARM_UP_TIMEOUT, answer)
            .await
            .map_err(|_| "the warm-up run did not finish in time".to_string())?
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() || text.contains("\"type\":\"error\"") {
            return Err(format!("the warm-up run failed ({status}): {text}"));
        }
        Ok(())
    }

    async fn init(
        &self,
        addr: Ipv4Addr,
        current_token: Option<&str>,
        init: &InitRequest,
    ) -> Result<(), InitError> {
        let body = serde_json::to_vec(init).map_err(|e| InitError::Failed(e.to_string()))?;
        let within = Duration::from_secs(5);
        let sent = self.request(
            Method::POST,
            addr,
            "/init",
            current_token,
            Some(body),
            within,
        );
        match sent.await {
            Ok(_) => Ok(()),
            Err(CallError {
                status: Some(status),
                body,
                ..
            }) if status.is_client_error() => {
                // The agent's connect-style error says why; the rest of it is for the log.
                let why = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
                Err(InitError::Refused(why))
            }
            Err(e) => Err(InitError::Failed(e.to_string())),
        }
    }

    async fn run(
        &self,
        addr: Ipv4Addr,
        command: &AgentCommand,
        output: &mut (dyn FnMut(OutputLine) + Send),
    ) -> Result<i32, String> {
        tokio::time::timeout(command.timeout, self.stream(addr, command, output))
            .await
            .map_err(|_| format!("did not finish within {:?}", command.timeout))?
    }

    async fn logs(&self, addr: Ipv4Addr, token: Option<&str>) -> Result<Vec<LogEntry>, String> {
        self.get_json(addr, LOGS_PATH, token).await
    }

    async fn reboot(&self, addr: Ipv4Addr, token: Option<&str>) -> Result<(), String> {
        // The agent gives stuck processes 10 s to end.
        let within = Duration::from_secs(15);
        self.request(Method::POST, addr, REBOOT_PATH, token, None, within)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    async fn busy(&self, addr: Ipv4Addr, token: Option<&str>) -> Result<Option<String>, String> {
        let report: IdleReport = self.get_json(addr, IDLE_PATH, token).await?;
        Ok(report.busy)
    }
}

impl HttpAgentClient {
    /// The JSON answer of a `GET` of the agent's `path`, within 5 s.
    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        addr: Ipv4Addr,
        path: &str,
        token: Option<&str>,
    ) -> Result<T, String> {
        let within = Duration::from_secs(5);
        let body = self
            .request(Method::GET, addr, path, token, None, within)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&body).map_err(|e| format!("reading its answer: {e}"))
    }

    /// A request to the agent's `path`, with the sandbox's access token if it has one and a
    /// JSON body if given; the answer's body, if it was a success within `within`.
    async fn request(
        &self,
        method: Method,
        addr: Ipv4Addr,
        path: &str,
        token: Option<&str>,
        json: Option<Vec<u8>>,
        within: Duration,
    ) -> Result<Bytes, CallError> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{addr}:{ENVD_PORT}{path}"));
        if let Some(token) = token {
            req = req.header(ACCESS_TOKEN_HEADER, token);
        }
        let body = match json {
            Some(json) => {
                req = req.header("content-type", "application/json");
                Body::from(json)
            }
            None => Body::empty(),
        };
        let req = req.body(body).map_err(CallError::failed)?;
        let answer = async {
            let resp = self.http.request(req).await.map_err(CallError::failed)?;
            let status = resp.status();
            if !status.is_success() {
                return Err(CallError {
                    status: Some(status),
                    body: capped::error_text(resp.into_body()).await,
                    detail: String::new(),
                });
            }
            capped::read(resp.into_body(), MAX_JSON, "the agent's answer")
                .await
                .map_err(CallError::failed)
        };
        tokio::time::timeout(within, answer)
            .await
            .map_err(|_| CallError::failed("no answer in time"))?
    }

    /// `process.Process/Start`, as the SDK calls it, read to its end event.
    async fn stream(
        &self,
        addr: Ipv4Addr,
        command: &AgentCommand,
        output: &mut (dyn FnMut(OutputLine) + Send),
    ) -> Result<i32, String> {
        let (cmd, args) = match &command.program {
            Program::Shell(line) => ("/bin/sh", vec![String::from("-c"), line.clone()]),
            Program::Exec(argv) => match argv.split_first() {
                Some((cmd, args)) => (cmd.as_str(), args.to_vec()),
                None => return Err("an empty command".into()),
            },
        };
        let message = StartRequest {
            process: ProcessConfig {
                cmd: cmd.to_owned(),
                args,
                envs: command.envs.clone(),
                cwd: command.cwd.clone(),
            },
            pty: None,
            tag: command.logged.then(|| START_CMD_TAG.to_owned()),
            stdin: Some(false),
        };
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:", command.user));
        let mut req =
            hyper::Request::post(format!("http://{addr}:{ENVD_PORT}/process.Process/Start"))
                .header("content-type", connect::STREAM_CONTENT_TYPE)
                .header("connect-protocol-version", "1")
                .header("authorization", format!("Basic {basic}"));
        if let Some(token) = &command.access_token {
            req = req.header(ACCESS_TOKEN_HEADER, token.as_ref());
        }
        let req = req
            .body(Body::from(connect::encode_message(&message)))
            .map_err(|e| e.to_string())?;
        let resp = self.http.request(req).await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = capped::error_text(resp.into_body()).await;
            return Err(format!(
                "the agent answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let mut events = ProcessEvents::new(resp.into_body());
        let (mut stdout, mut stderr) = (LineBuffer::default(), LineBuffer::default());
        while let Some(event) = events.next().await.map_err(worded)? {
            match event {
                ProcessEvent::Data(ProcessOutput::Stdout(d) | ProcessOutput::Pty(d)) => stdout
                    .push(&d, &mut |text| {
                        output(OutputLine {
                            text,
                            stderr: false,
                        })
                    }),
                ProcessEvent::Data(ProcessOutput::Stderr(d)) => {
                    stderr.push(&d, &mut |text| output(OutputLine { text, stderr: true }))
                }
                ProcessEvent::End(end) => {
                    stdout.flush(&mut |text| {
                        output(OutputLine {
                            text,
                            stderr: false,
                        })
                    });
                    stderr.flush(&mut |text| output(OutputLine { text, stderr: true }));
                    return match end.error {
                        Some(error) if !end.exited => Err(error),
                        _ => Ok(end.exit_code),
                    };
                }
                ProcessEvent::Start(_) | ProcessEvent::Keepalive(_) => {}
            }
        }
        Err("the output stream ended before the command did".into())
    }
}

/// A failed event stream, worded for the server's own calls (a build step's, say): the agent is
/// the other side.
fn worded(e: EventsError) -> String {
    match e {
        EventsError::Broken(e) => format!("the output stream broke: {e}"),
        EventsError::Unexpected(e) => format!("unexpected message from the agent: {e}"),
        other => other.to_string(),
    }
}

/// Why a call to an agent failed: it answered with an error `status`, or (`None`) it did not
/// answer.
#[derive(Debug)]
struct CallError {
    status: Option<axum::http::StatusCode>,
    body: Bytes,
    detail: String,
}

impl CallError {
    fn failed(detail: impl std::fmt::Display) -> Self {
        CallError {
            status: None,
            body: Bytes::new(),
            detail: detail.to_string(),
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => write!(
                f,
                "the agent answered {status}: {}",
                String::from_utf8_lossy(&self.body)
            ),
            None => f.write_str(&self.detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A hostile agent on a loopback address of its own (the agent's port is fixed): it answers
    /// every request with `status` and a body with no end.
    async fn endless_agent(status: u16) -> Ipv4Addr {
        let addr = Ipv4Addr::new(127, 200, rand::random(), rand::random::<u8>().max(1));
        let listener = tokio::net::TcpListener::bind((addr, ENVD_PORT))
            .await
            .unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = [0u8; 8192];
                    let _ = conn.read(&mut head).await;
                    let start =
                        format!("HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\r\n");
                    let _ = conn.write_all(start.as_bytes()).await;
                    let chunk = vec![b' '; 64 << 10];
                    while conn.write_all(&chunk).await.is_ok() {}
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn answers_without_end_are_cut_off_at_their_caps() {
        let agent = HttpAgentClient {
            http: crate::client::http_client(),
        };
        let ok = endless_agent(200).await;
        let err = agent.logs(ok, None).await.unwrap_err();
        assert!(err.contains("larger than 4 MiB"), "{err}");
        let refused = endless_agent(400).await;
        match agent.init(refused, None, &InitRequest::default()).await {
            Err(InitError::Refused(why)) => assert_eq!(why.len(), capped::MAX_ERROR),
            other => panic!("{other:?}"),
        }
    }
}
