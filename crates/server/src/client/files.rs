//! A sandbox's files through its agent's `/files` (the SDK's `files.write` and `files.read`),
//! streamed both ways: `airlock sandbox cp`, and the MCP tools' reads and writes.

use super::{Client, ClientError};
use axum::body::Body;
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;

/// One side of a copy: a local path, or a path in a sandbox.
#[derive(Debug, PartialEq, Eq)]
enum Place<'a> {
    Local(&'a str),
    Sandbox { id: &'a str, path: &'a str },
}

/// `ID:PATH` names a path in a sandbox; anything else (`./a:b` too) is local. Sandbox ids are
/// letters and digits, so a local path with a colon can be written `./name:with:colons`.
fn place(arg: &str) -> Place<'_> {
    match arg.split_once(':') {
        Some((id, path)) if !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric()) => {
            Place::Sandbox { id, path }
        }
        _ => Place::Local(arg),
    }
}

/// Copies `src` to `dst`, one of them in a sandbox; returns what was done, to print.
pub(crate) async fn copy(
    client: &Client,
    src: &str,
    dst: &str,
    user: &str,
) -> Result<String, ClientError> {
    match (place(src), place(dst)) {
        (Place::Local(local), Place::Sandbox { id, path }) => {
            let file = tokio::fs::File::open(local)
                .await
                .map_err(|e| ClientError::Failed(format!("reading {local}: {e}")))?;
            if file.metadata().await.is_ok_and(|m| m.is_dir()) {
                return Err(ClientError::Failed(format!(
                    "{local} is a directory; cp copies one file"
                )));
            }
            let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
            let token = client.access_token(id).await?;
            let req = files_request(client, id, token.as_deref(), "POST", path, user)
                .header("content-type", "application/octet-stream")
                .body(body)
                .map_err(|e| ClientError::Failed(e.to_string()))?;
            checked(client.send(req).await?).await?;
            Ok(format!("copied {local} to {id}:{path}"))
        }
        (Place::Sandbox { id, path }, Place::Local(local)) => {
            let token = client.access_token(id).await?;
            let req = files_request(client, id, token.as_deref(), "GET", path, user)
                .body(Body::empty())
                .map_err(|e| ClientError::Failed(e.to_string()))?;
            let mut body = checked(client.send(req).await?).await?.into_body();
            // Into a new file beside the target, renamed over it once whole: a broken copy
            // leaves the target as it was.
            let partial = format!("{local}.airlock-partial");
            let mut out = tokio::fs::File::create(&partial)
                .await
                .map_err(|e| ClientError::Failed(format!("writing {local}: {e}")))?;
            let written = async {
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| format!("the download broke: {e}"))?;
                    if let Some(data) = frame.data_ref() {
                        out.write_all(data).await.map_err(|e| e.to_string())?;
                    }
                }
                out.flush().await.map_err(|e| e.to_string())?;
                tokio::fs::rename(&partial, local)
                    .await
                    .map_err(|e| e.to_string())
            }
            .await;
            if let Err(e) = written {
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(ClientError::Failed(format!("writing {local}: {e}")));
            }
            Ok(format!("copied {id}:{path} to {local}"))
        }
        (Place::Sandbox { .. }, Place::Sandbox { .. }) => Err(ClientError::Failed(
            "both sides are in sandboxes; copy through a local file".into(),
        )),
        (Place::Local(_), Place::Local(_)) => Err(ClientError::Failed(
            "neither side is in a sandbox: name one as ID:PATH".into(),
        )),
    }
}

/// A `/files` request to the sandbox's agent, as `user`, with its access token if it has one.
pub(crate) fn files_request(
    client: &Client,
    id: &str,
    token: Option<&str>,
    method: &str,
    path: &str,
    user: &str,
) -> http::request::Builder {
    let query = format!(
        "/files?path={}&username={}",
        super::percent_encode(path),
        super::percent_encode(user)
    );
    let mut req = client
        .request(method, &query)
        .header(airlock_wire::SANDBOX_ID_HEADER, id);
    if let Some(token) = token {
        req = req.header(airlock_wire::ACCESS_TOKEN_HEADER, token);
    }
    req
}

/// The response if it is a success, else its `{message}` as the error.
pub(crate) async fn checked(
    resp: hyper::Response<hyper::body::Incoming>,
) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status();
    let body = super::capped::error_text(resp.into_body()).await;
    Err(ClientError::Failed(super::error_message(&body, status)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths_are_told_from_local_ones() {
        assert_eq!(
            place("abc123:/home/user/a.csv"),
            Place::Sandbox {
                id: "abc123",
                path: "/home/user/a.csv"
            }
        );
        assert_eq!(place("./a:b"), Place::Local("./a:b"));
        assert_eq!(place("/tmp/x"), Place::Local("/tmp/x"));
        assert_eq!(place(":x"), Place::Local(":x"));
    }
}
