//! `airlock run`: code in a fresh sandbox's code interpreter, its results printed and its
//! images saved.

use super::CliError;
use crate::client::interpreter::stream_execution;
use crate::client::Client;
use airlock_wire::api::NewSandbox;
use base64::Engine;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// What `airlock run` executes.
pub struct RunOptions {
    pub template: String,
    pub language: String,
    pub timeout_secs: u64,
    pub out_dir: PathBuf,
    /// A file path, or `-` for standard input.
    pub source: String,
}

/// Runs code in a fresh sandbox through its code interpreter, prints what comes back, saves
/// images to files, and kills the sandbox. Exits 1 if the code raised an error.
pub async fn run(client: Client, opts: RunOptions) -> Result<ExitCode, CliError> {
    let code = if opts.source == "-" {
        let mut code = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut code)
            .map_err(|e| CliError::Failed(format!("reading standard input: {e}")))?;
        code
    } else {
        std::fs::read_to_string(&opts.source)
            .map_err(|e| CliError::Failed(format!("reading {}: {e}", opts.source)))?
    };
    let body = NewSandbox {
        template_id: opts.template.clone(),
        timeout: Some(opts.timeout_secs + 60),
        ..NewSandbox::default()
    };
    let answer = client.call_json("POST", "/v2/sandboxes", &body).await?;
    let created: airlock_wire::api::Sandbox = crate::client::parse(&answer)?;
    let id = created.sandbox_id.clone();
    let outcome = execute(&client, &created, &code, &opts).await;
    if let Err(e) = client.call("DELETE", &format!("/sandboxes/{id}")).await {
        eprintln!("airlock: killing sandbox {id}: {}", e.describe());
    }
    outcome
}

async fn execute(
    client: &Client,
    sandbox: &airlock_wire::api::Sandbox,
    code: &str,
    opts: &RunOptions,
) -> Result<ExitCode, CliError> {
    let mut printer = ResultPrinter::new(&opts.out_dir);
    let timeout = std::time::Duration::from_secs(opts.timeout_secs);
    let streamed = stream_execution(client, sandbox, code, &opts.language, |event| {
        printer.handle(&event)
    });
    tokio::time::timeout(timeout, streamed)
        .await
        .map_err(|_| {
            CliError::Failed(format!(
                "the code did not finish within {}s",
                opts.timeout_secs
            ))
        })??;
    Ok(if printer.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Prints one `/execute` event at a time; images go to files.
struct ResultPrinter<'a> {
    out_dir: &'a Path,
    saved: usize,
    failed: bool,
}

impl<'a> ResultPrinter<'a> {
    fn new(out_dir: &'a Path) -> Self {
        ResultPrinter {
            out_dir,
            saved: 0,
            failed: false,
        }
    }

    fn handle(&mut self, event: &serde_json::Value) -> Result<(), CliError> {
        let text = |key: &str| {
            event
                .get(key)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        match event
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or_default()
        {
            "stdout" => {
                print!("{}", text("text"));
                let _ = std::io::stdout().flush();
            }
            "stderr" => eprint!("{}", text("text")),
            "error" => {
                self.failed = true;
                eprintln!("{}", text("traceback"));
                eprintln!("{}: {}", text("name"), text("value"));
            }
            "result" => self.result(event)?,
            _ => {}
        }
        Ok(())
    }

    fn result(&mut self, event: &serde_json::Value) -> Result<(), CliError> {
        let mut saved_any = false;
        for (key, ext, base64) in [
            ("png", "png", true),
            ("jpeg", "jpg", true),
            ("svg", "svg", false),
            ("pdf", "pdf", true),
        ] {
            let Some(data) = event.get(key).and_then(|v| v.as_str()) else {
                continue;
            };
            let bytes = if base64 {
                base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .map_err(|e| CliError::Failed(format!("undecodable {key} result: {e}")))?
            } else {
                data.as_bytes().to_vec()
            };
            self.saved += 1;
            let path = self.out_dir.join(format!("result-{}.{ext}", self.saved));
            std::fs::write(&path, bytes)
                .map_err(|e| CliError::Failed(format!("saving {}: {e}", path.display())))?;
            println!("[{key} saved to {}]", path.display());
            saved_any = true;
        }
        if !saved_any {
            if let Some(text) = event.get("text").and_then(|v| v.as_str()) {
                println!("{text}");
            }
        }
        Ok(())
    }
}
