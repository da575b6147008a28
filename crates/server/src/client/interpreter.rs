//! A sandbox's code interpreter (`POST /execute` on its port 49999, through the server's
//! proxy): code run, its events streamed back as they come. `airlock run` prints them, the MCP
//! tool `run_code` gathers them.

use super::{Client, ClientError};
use axum::body::Body;
use http_body_util::BodyExt;

/// The most one event of an execution (a line of its answer) may take: a result's images
/// are in it.
const MAX_EVENT: usize = 16 << 20;

/// Runs `code` in the sandbox's code interpreter (`POST /execute` on its port 49999, as the
/// SDK's `run_code`) and hands each event of the answer to `on_event` as it arrives: `stdout`,
/// `stderr`, `result`, `error`, ... (see the protocol notes); an error it returns ends the
/// stream. Dropping the future closes the connection, which interrupts the code.
pub(crate) async fn stream_execution<E: From<ClientError>>(
    client: &Client,
    sandbox: &airlock_wire::api::Sandbox,
    code: &str,
    language: &str,
    mut on_event: impl FnMut(serde_json::Value) -> Result<(), E>,
) -> Result<(), E> {
    let body = serde_json::json!({"code": code, "context_id": null, "language": language, "env_vars": null});
    let mut req = client
        .request("POST", "/execute")
        .header(airlock_wire::SANDBOX_ID_HEADER, &sandbox.sandbox_id)
        .header(
            airlock_wire::SANDBOX_PORT_HEADER,
            airlock_wire::CODE_INTERPRETER_PORT.to_string(),
        )
        .header("content-type", "application/json");
    if let Some(token) = &sandbox.envd_access_token {
        req = req.header(airlock_wire::ACCESS_TOKEN_HEADER, token);
    }
    let req = req
        .body(Body::from(body.to_string()))
        .map_err(|e| ClientError::Failed(e.to_string()))?;
    let resp = client.send(req).await?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let text = super::capped::error_text(body).await;
        let message = format!(
            "the code interpreter answered {status}: {}",
            String::from_utf8_lossy(&text).trim()
        );
        return Err(ClientError::Failed(message).into());
    }
    let mut pending = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ClientError::Failed(format!("the stream broke: {e}")))?;
        let Some(chunk) = frame.data_ref() else {
            continue;
        };
        pending.extend_from_slice(chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let event = serde_json::from_slice(&line)
                .map_err(|e| ClientError::Failed(format!("unexpected output line: {e}")))?;
            on_event(event)?;
        }
        if pending.len() > MAX_EVENT {
            let message = format!(
                "the code interpreter sent an event larger than {} MiB, more than is read of one",
                MAX_EVENT >> 20
            );
            return Err(ClientError::Failed(message).into());
        }
    }
    Ok(())
}
