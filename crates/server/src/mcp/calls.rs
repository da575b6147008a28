//! What each MCP tool does, through the same API and agent calls the SDKs make. A result is
//! the content a model reads; a failure is a message it can act on (the handler makes it a
//! tool error, so the session carries on).

use super::local_files::FilesDir;
use super::tools::{Download, ListFiles, ReadFile, RunCode, RunCommand, Upload, WriteFile};
use crate::client::interpreter::stream_execution;
use crate::client::process::{Process, Rpc};
use crate::client::{Client, ClientError};
use airlock_wire::api::Sandbox;
use airlock_wire::envd::{
    ListDirRequest, ProcessConfig, ProcessEvent, ProcessOutput, StartRequest,
};
use base64::Engine;
use http_body_util::BodyExt;
use rmcp::model::{ContentBlock, ResourceContents};
use std::collections::BTreeMap;
use std::time::Duration;

/// Text kept of each output stream; the rest is cut, with a note saying how much.
pub const MAX_TEXT: usize = 32 * 1024;
/// The largest file `read_file` returns.
const MAX_READ: usize = 1024 * 1024;
/// The largest file `download` returns in its result.
const MAX_DOWNLOAD: usize = 10 * 1024 * 1024;
/// Images one `run_code` returns; more are counted, not sent.
const MAX_IMAGES: usize = 8;
const DEFAULT_RUN_SECS: u64 = 60;
/// The sandbox user tools act as, as the SDKs' default.
const USER: &str = "user";

type Outcome = Result<Vec<ContentBlock>, String>;

/// Text that keeps at most [`MAX_TEXT`] bytes and says what it dropped.
#[derive(Default)]
struct Capped {
    text: String,
    dropped: usize,
}

impl Capped {
    fn push(&mut self, more: &str) {
        let room = MAX_TEXT.saturating_sub(self.text.len());
        if more.len() <= room {
            self.text.push_str(more);
            return;
        }
        let mut cut = room;
        while !more.is_char_boundary(cut) {
            cut -= 1;
        }
        self.text.push_str(&more[..cut]);
        self.dropped += more.len() - cut;
    }

    fn finish(self) -> String {
        if self.dropped == 0 {
            return self.text;
        }
        format!(
            "{}\n[{} more bytes cut: output is capped at {} KiB per stream; write large output \
             to a file and read it in parts]",
            self.text,
            self.dropped,
            MAX_TEXT / 1024
        )
    }
}

pub async fn run_code(client: &Client, sandbox: &Sandbox, args: RunCode) -> Outcome {
    let secs = args.timeout.unwrap_or(DEFAULT_RUN_SECS);
    let language = args.language.unwrap_or_else(|| "python".into());
    let mut out = Execution::default();
    let run = stream_execution(client, sandbox, &args.code, &language, |e| {
        out.take(&e);
        Ok::<(), ClientError>(())
    });
    match tokio::time::timeout(Duration::from_secs(secs), run).await {
        Err(_) => Err(format!(
            "the code ran past its timeout of {secs} s and was interrupted. Variables defined \
             before are kept. Give a larger timeout, or make the work smaller."
        )),
        Ok(Err(e)) => Err(format!("running the code failed: {}", e.describe())),
        Ok(Ok(())) => out.finish(),
    }
}

/// What one `run_code` produced, gathered from its events.
#[derive(Default)]
struct Execution {
    stdout: Capped,
    stderr: Capped,
    results: Capped,
    images: Vec<ContentBlock>,
    images_dropped: usize,
    error: Option<String>,
}

impl Execution {
    fn take(&mut self, event: &serde_json::Value) {
        let field = |key: &str| event.get(key).and_then(|v| v.as_str()).unwrap_or_default();
        match field("type") {
            "stdout" => self.stdout.push(field("text")),
            "stderr" => self.stderr.push(field("text")),
            "error" => {
                self.error = Some(format!(
                    "{}: {}\n{}",
                    field("name"),
                    field("value"),
                    strip_ansi(field("traceback"))
                ))
            }
            "result" => {
                let mut imaged = false;
                for (key, mime) in [("png", "image/png"), ("jpeg", "image/jpeg")] {
                    if let Some(data) = event.get(key).and_then(|v| v.as_str()) {
                        imaged = true;
                        if self.images.len() < MAX_IMAGES {
                            self.images.push(ContentBlock::image(data.trim(), mime));
                        } else {
                            self.images_dropped += 1;
                        }
                    }
                }
                // A chart's text is `<Figure size ...>`; the image says it better.
                if !imaged {
                    if let Some(text) = event.get("text").and_then(|v| v.as_str()) {
                        self.results.push(text);
                        self.results.push("\n");
                    }
                }
            }
            _ => {}
        }
    }

    fn finish(self) -> Outcome {
        let mut text = String::new();
        for (name, part) in [
            ("stdout", self.stdout.finish()),
            ("stderr", self.stderr.finish()),
            ("result", self.results.finish()),
        ] {
            if !part.is_empty() {
                text.push_str(&format!("[{name}]\n{}\n", part.trim_end()));
            }
        }
        if self.images_dropped > 0 {
            text.push_str(&format!(
                "[{} more images not shown; save them to files instead]\n",
                self.images_dropped
            ));
        }
        if let Some(error) = self.error {
            text.push_str(&format!("[error]\n{error}"));
            return Err(text);
        }
        if text.is_empty() && self.images.is_empty() {
            text = "(no output)".into();
        }
        let mut content = Vec::new();
        if !text.is_empty() {
            content.push(ContentBlock::text(text));
        }
        content.extend(self.images);
        Ok(content)
    }
}

/// Jupyter's tracebacks are coloured for a terminal; a model reads them without.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // CSI: ESC [ parameters, then one final byte in @..~.
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

pub async fn run_command(client: &Client, sandbox: &Sandbox, args: RunCommand) -> Outcome {
    let secs = args.timeout.unwrap_or(DEFAULT_RUN_SECS);
    let start = StartRequest {
        process: ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), args.command],
            envs: BTreeMap::new(),
            cwd: args.cwd,
        },
        pty: None,
        tag: None,
        stdin: Some(false),
    };
    let rpc = Rpc::connected(client, sandbox, USER);
    let mut process = Process::start(rpc, &start)
        .await
        .map_err(|e| format!("starting the command failed: {}", e.describe()))?;
    let (mut stdout, mut stderr) = (Capped::default(), Capped::default());
    let collected = tokio::time::timeout(Duration::from_secs(secs), async {
        let mut exit = None;
        while let Some(event) = process.next_event().await? {
            match event {
                ProcessEvent::Data(ProcessOutput::Stdout(d) | ProcessOutput::Pty(d)) => {
                    stdout.push(&String::from_utf8_lossy(&d))
                }
                ProcessEvent::Data(ProcessOutput::Stderr(d)) => {
                    stderr.push(&String::from_utf8_lossy(&d))
                }
                ProcessEvent::End(end) => exit = Some((end.exit_code, end.status)),
                ProcessEvent::Start(_) | ProcessEvent::Keepalive(_) => {}
            }
        }
        Ok::<_, ClientError>(exit)
    })
    .await;
    let exit = match collected {
        Err(_) => {
            let _ = process.kill().await;
            return Err(format!(
                "the command ran past its timeout of {secs} s and was killed. Output so \
                 far:\n[stdout]\n{}\n[stderr]\n{}",
                stdout.finish(),
                stderr.finish()
            ));
        }
        Ok(Err(e)) => return Err(format!("the command failed: {}", e.describe())),
        Ok(Ok(None)) => return Err("the command ended without an exit status".into()),
        Ok(Ok(Some(exit))) => exit,
    };
    let text = format!(
        "[exit code] {}{}\n[stdout]\n{}\n[stderr]\n{}",
        exit.0,
        if exit.0 < 0 {
            format!(" ({})", exit.1)
        } else {
            String::new()
        },
        stdout.finish(),
        stderr.finish()
    );
    if exit.0 == 0 {
        Ok(vec![ContentBlock::text(text)])
    } else {
        Err(text)
    }
}

pub async fn read_file(client: &Client, sandbox: &Sandbox, args: ReadFile) -> Outcome {
    let bytes = fetch(
        client,
        sandbox,
        &args.path,
        MAX_READ,
        "use download instead",
    )
    .await?;
    match String::from_utf8(bytes) {
        Ok(text) => Ok(vec![ContentBlock::text(text)]),
        Err(_) => Err(format!(
            "{} is not UTF-8 text; use download to get its bytes",
            args.path
        )),
    }
}

pub async fn write_file(client: &Client, sandbox: &Sandbox, args: WriteFile) -> Outcome {
    let size = args.content.len();
    put(client, sandbox, &args.path, args.content.into_bytes()).await?;
    Ok(vec![ContentBlock::text(format!(
        "wrote {size} bytes to {}",
        args.path
    ))])
}

pub async fn list_files(client: &Client, sandbox: &Sandbox, args: ListFiles) -> Outcome {
    let path = args.path.unwrap_or_else(|| "/home/user".into());
    let rpc = Rpc::connected(client, sandbox, USER);
    let request = ListDirRequest {
        path: path.clone(),
        depth: args.depth.unwrap_or(1),
    };
    let answer = rpc
        .unary("/filesystem.Filesystem/ListDir", &request)
        .await
        .map_err(|e| format!("listing {path} failed: {}", e.describe()))?;
    let listing: airlock_wire::envd::ListDirResponse =
        crate::client::parse(&answer).map_err(|e| e.describe())?;
    use airlock_wire::envd::FileType;
    let lines: Vec<String> = listing
        .entries
        .iter()
        .map(|e| {
            let kind = match e.file_type {
                FileType::Directory => "dir ",
                _ if e.is_symlink => "link",
                _ => "file",
            };
            format!("{kind} {:>10}  {}", e.size, e.path)
        })
        .collect();
    let text = if lines.is_empty() {
        format!("{path} is empty")
    } else {
        lines.join("\n")
    };
    Ok(vec![ContentBlock::text(text)])
}

pub async fn upload(
    client: &Client,
    sandbox: &Sandbox,
    args: Upload,
    local_files: Option<&FilesDir>,
) -> Outcome {
    match (args.content_base64, args.local_path) {
        (Some(content), None) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(content.trim())
                .map_err(|e| format!("content_base64 is not base64: {e}"))?;
            let size = bytes.len();
            put(client, sandbox, &args.path, bytes).await?;
            Ok(vec![ContentBlock::text(format!(
                "uploaded {size} bytes to {}",
                args.path
            ))])
        }
        (None, Some(local)) => {
            let local = local_path(over_stdio(local_files)?.source(&local))?;
            let target = format!("{}:{}", sandbox.sandbox_id, args.path);
            let done = crate::client::files::copy(client, &local, &target, USER)
                .await
                .map_err(|e| e.describe())?;
            Ok(vec![ContentBlock::text(done)])
        }
        _ => Err("give exactly one of content_base64 and local_path".into()),
    }
}

pub async fn download(
    client: &Client,
    sandbox: &Sandbox,
    args: Download,
    local_files: Option<&FilesDir>,
) -> Outcome {
    if let Some(local) = args.local_path {
        let local = local_path(over_stdio(local_files)?.target(&local))?;
        let source = format!("{}:{}", sandbox.sandbox_id, args.path);
        let done = crate::client::files::copy(client, &source, &local, USER)
            .await
            .map_err(|e| e.describe())?;
        return Ok(vec![ContentBlock::text(done)]);
    }
    let bytes = fetch(
        client,
        sandbox,
        &args.path,
        MAX_DOWNLOAD,
        "read parts of it with run_command",
    )
    .await?;
    let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let lower = args.path.to_ascii_lowercase();
    let image = [
        (".png", "image/png"),
        (".jpg", "image/jpeg"),
        (".jpeg", "image/jpeg"),
    ]
    .into_iter()
    .find(|(ext, _)| lower.ends_with(ext));
    let summary = ContentBlock::text(format!("{} ({} bytes)", args.path, bytes.len()));
    let file = match image {
        Some((_, mime)) => ContentBlock::image(encoded, mime),
        None => ContentBlock::resource(
            ResourceContents::blob(encoded, format!("file://{}", args.path))
                .with_mime_type("application/octet-stream"),
        ),
    };
    Ok(vec![summary, file])
}

/// Over HTTP, the MCP server is not on the caller's machine: its files are not the caller's.
fn over_stdio(local_files: Option<&FilesDir>) -> Result<&FilesDir, String> {
    local_files.ok_or_else(|| {
        "local_path works only with `airlock mcp` running on your own machine (stdio); over \
         HTTP, send content_base64, or download without local_path to get the file in the \
         result"
            .into()
    })
}

/// A local path as `client::files::copy` takes it.
fn local_path(
    checked: Result<std::path::PathBuf, super::local_files::LocalPathError>,
) -> Result<String, String> {
    let path = checked.map_err(|e| e.to_string())?;
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}

/// A file's bytes, refused past `cap` with `instead` as advice.
async fn fetch(
    client: &Client,
    sandbox: &Sandbox,
    path: &str,
    cap: usize,
    instead: &str,
) -> Result<Vec<u8>, String> {
    let failed = |e: ClientError| format!("reading {path} failed: {}", e.describe());
    let token = sandbox.envd_access_token.as_deref();
    let req =
        crate::client::files::files_request(client, &sandbox.sandbox_id, token, "GET", path, USER)
            .body(axum::body::Body::empty())
            .map_err(|e| e.to_string())?;
    let resp = client.send(req).await.map_err(failed)?;
    let mut body = crate::client::files::checked(resp)
        .await
        .map_err(failed)?
        .into_body();
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading {path} broke off: {e}"))?;
        if let Some(data) = frame.data_ref() {
            bytes.extend_from_slice(data);
            if bytes.len() > cap {
                return Err(format!(
                    "{path} is larger than {} MiB; {instead}",
                    cap / (1024 * 1024)
                ));
            }
        }
    }
    Ok(bytes)
}

async fn put(client: &Client, sandbox: &Sandbox, path: &str, bytes: Vec<u8>) -> Result<(), String> {
    let failed = |e: ClientError| format!("writing {path} failed: {}", e.describe());
    let token = sandbox.envd_access_token.as_deref();
    let req =
        crate::client::files::files_request(client, &sandbox.sandbox_id, token, "POST", path, USER)
            .header("content-type", "application/octet-stream")
            .body(axum::body::Body::from(bytes))
            .map_err(|e| e.to_string())?;
    let resp = client.send(req).await.map_err(failed)?;
    crate::client::files::checked(resp).await.map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_on_a_char_boundary_and_says_so() {
        let mut out = Capped::default();
        out.push(&"é".repeat(MAX_TEXT)); // two bytes each
        let text = out.finish();
        assert!(text.starts_with("éé"));
        assert!(
            text.contains(&format!("[{} more bytes cut", MAX_TEXT)),
            "{}",
            &text[text.len() - 200..]
        );
    }

    #[test]
    fn tracebacks_lose_their_colours() {
        let tb = "\u{1b}[0;31mNameError\u{1b}[0m: name 'x' is not defined";
        assert_eq!(strip_ansi(tb), "NameError: name 'x' is not defined");
    }
}
