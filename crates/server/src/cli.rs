//! Client commands: `airlock sandbox …` talks to a running server over its API, as does
//! `airlock template build -f`; the other `airlock template …` commands work on the local data
//! dir.

use crate::data_dir::DataDir;
use crate::dockerfile_build::DockerfileBuild;
use airlock_core::store::{KeyLimits, Store};
use airlock_wire::api::{ErrorBody, SandboxDetail};
use airlock_wire::connect::{self, Decoder};
use airlock_wire::envd::{ProcessEvent, ProcessEventMessage, ProcessOutput};
use axum::body::Body;
use base64::Engine;
use clap::Subcommand;
use http_body_util::BodyExt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// List running sandboxes.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Kill sandboxes. Exits 1 if any of them did not exist.
    Kill {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Run a command inside a sandbox, streaming its output; exits with the command's exit code.
    #[command(trailing_var_arg = true)]
    Exec {
        /// Run as this user inside the sandbox.
        #[arg(long, default_value = "user")]
        user: String,
        /// Working directory inside the sandbox [default: the user's home].
        #[arg(long)]
        cwd: Option<String>,
        /// Extra environment variable, `KEY=VALUE` (repeatable).
        #[arg(long = "env", value_name = "KEY=VALUE")]
        envs: Vec<String>,
        id: String,
        /// The command and its arguments (after `--`).
        #[arg(required = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// List built templates (the built-ins, and every key's templates as NAME:TAG).
    Ls,
    /// Build a template.
    ///
    /// `airlock template build -f Dockerfile -n NAME [CONTEXT]` builds a Dockerfile on the
    /// running server, for your API key, as the SDK's `Template.build` does: FROM an image in
    /// any OCI registry, RUN, COPY/ADD of local files, ENV, ARG, WORKDIR, USER, and CMD or
    /// ENTRYPOINT as the start command that is already running when a sandbox starts. Steps
    /// whose inputs did not change come from the cache. Then `Sandbox.create("NAME")`.
    ///
    /// The built-in templates (base, code-interpreter-v1) are Dockerfiles too, in the
    /// repository's templates/ directory: `airlock serve` builds them the same way when it
    /// starts.
    Build {
        /// The build context, where COPY finds its sources [default: the Dockerfile's
        /// directory].
        context: Option<PathBuf>,
        /// The Dockerfile to build.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The template's name, which sandboxes are created from; `NAME:TAG` tags this build
        /// (without one it is `NAME:default`, which `NAME` alone starts).
        #[arg(short = 'n', long)]
        name: String,
        /// CPUs for the template's sandboxes [default: the server's].
        #[arg(long)]
        cpu_count: Option<u32>,
        /// Memory for the template's sandboxes, in MiB [default: the server's].
        #[arg(long)]
        memory_mb: Option<u32>,
        /// A shell command that must exit 0 before the start command counts as ready, e.g.
        /// `curl -fs localhost:8000` [default: wait 20 s, as E2B does].
        #[arg(long)]
        ready_cmd: Option<String>,
        /// Run every step again, even those in the cache.
        #[arg(long)]
        no_cache: bool,
        /// A value for one of the Dockerfile's ARGs (repeatable), as `docker build` takes it.
        #[arg(long = "build-arg", value_name = "NAME=VALUE", value_parser = parse_build_arg)]
        build_args: Vec<(String, String)>,
    },
}

impl TemplateCommand {
    /// A Dockerfile build (which goes to the server); `None` for `ls` (which reads the data
    /// dir).
    pub fn into_dockerfile_build(self) -> Option<DockerfileBuild> {
        match self {
            TemplateCommand::Build {
                context,
                file: dockerfile,
                name,
                cpu_count,
                memory_mb,
                ready_cmd,
                no_cache,
                build_args,
            } => Some(DockerfileBuild {
                build_args: build_args.into_iter().collect(),
                dockerfile,
                name,
                context,
                cpu_count,
                memory_mb,
                ready_cmd,
                no_cache,
            }),
            TemplateCommand::Ls => None,
        }
    }
}

/// `NAME=VALUE`, as `--build-arg` takes it.
fn parse_build_arg(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("'{arg}' is not NAME=VALUE")),
    }
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Make a new API key and print it (only once: the server keeps just its SHA-256). Each key
    /// sees and controls only the sandboxes and snapshots made with it.
    Create {
        /// What the key is for, shown by `airlock key ls`.
        #[arg(long, default_value = "")]
        name: String,
        /// Most sandboxes it may run at once [default: the server's --key-max-running].
        #[arg(long)]
        max_running: Option<u32>,
        /// Most sandboxes it may keep paused [default: the server's --key-max-paused].
        #[arg(long)]
        max_paused: Option<u32>,
        /// Most disk its snapshots may take, in MiB [default: the server's
        /// --key-max-snapshot-mb].
        #[arg(long)]
        max_snapshot_mb: Option<u64>,
    },
    /// List API keys: id (the first 12 hex digits of the key's SHA-256), name, dates.
    Ls,
    /// Revoke a key by its id: requests made with it get 401 from then on. Its sandboxes keep
    /// running until their timeout.
    Revoke { id: String },
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach the Airlock server at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Other(anyhow::Error),
}

impl CliError {
    pub fn describe(&self) -> String {
        match self {
            CliError::Other(e) => format!("{e:#}"),
            other => other.to_string(),
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Unreachable { .. } => ExitCode::from(3),
            _ => ExitCode::FAILURE,
        }
    }
}

/// A minimal client for the server's API and sandbox proxy.
pub struct Client {
    base: String,
    api_key: Option<String>,
    http: crate::proxy::HttpClient,
}

impl Client {
    pub fn new(url: &str, api_key: Option<String>, data_dir: &Path) -> Self {
        // Same host as the server: the key it generated is in its data dir.
        let api_key = api_key.or_else(|| {
            std::fs::read_to_string(DataDir::layout(data_dir, None).api_key_file())
                .ok()
                .map(|k| k.trim().to_owned())
        });
        Client {
            base: url.trim_end_matches('/').to_owned(),
            api_key,
            http: crate::proxy::http_client(),
        }
    }

    fn request(&self, method: &str, path: &str) -> http::request::Builder {
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
    ) -> Result<hyper::Response<hyper::body::Incoming>, CliError> {
        self.http
            .request(req)
            .await
            .map_err(|e| CliError::Unreachable {
                url: self.base.clone(),
                detail: e.to_string(),
            })
    }

    /// Sends a bodyless API call and returns the body of a 2xx answer.
    pub(crate) async fn call(&self, method: &str, path: &str) -> Result<Vec<u8>, CliError> {
        self.call_with(method, path, Body::empty()).await
    }

    /// Sends an API call with a JSON body and returns the body of a 2xx answer.
    pub(crate) async fn call_json(
        &self,
        method: &str,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<Vec<u8>, CliError> {
        let body = serde_json::to_vec(body).map_err(|e| CliError::Failed(e.to_string()))?;
        self.call_with(method, path, Body::from(body)).await
    }

    async fn call_with(&self, method: &str, path: &str, body: Body) -> Result<Vec<u8>, CliError> {
        let req = self
            .request(method, path)
            .header("content-type", "application/json")
            .body(body)
            .map_err(|e| CliError::Failed(e.to_string()))?;
        let resp = self.send(req).await?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| CliError::Failed(format!("reading the answer: {e}")))?
            .to_bytes();
        if status.is_success() {
            return Ok(body.to_vec());
        }
        let message = serde_json::from_slice::<ErrorBody>(&body)
            .map(|e| e.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
        Err(CliError::Failed(format!("{} ({status})", message)))
    }
}

pub async fn sandbox(cmd: SandboxCommand, client: Client) -> Result<ExitCode, CliError> {
    match cmd {
        SandboxCommand::Ls { json } => {
            let body = client.call("GET", "/v2/sandboxes").await?;
            let list: Vec<SandboxDetail> = serde_json::from_slice(&body)
                .map_err(|e| CliError::Failed(format!("unexpected answer: {e}")))?;
            if json {
                println!("{}", String::from_utf8_lossy(&body));
            } else {
                print_sandboxes(&list);
            }
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Kill { ids } => {
            let mut failed = false;
            for id in &ids {
                match client.call("DELETE", &format!("/sandboxes/{id}")).await {
                    Ok(_) => println!("killed {id}"),
                    Err(CliError::Failed(msg)) => {
                        eprintln!("airlock: {id}: {msg}");
                        failed = true;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        SandboxCommand::Exec {
            user,
            cwd,
            envs,
            id,
            command,
        } => exec(&client, &id, &user, cwd, &envs, &command).await,
    }
}

fn print_sandboxes(list: &[SandboxDetail]) {
    let rows: Vec<[String; 5]> = list
        .iter()
        .map(|s| {
            let metadata = s
                .metadata
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            [
                s.sandbox_id.clone(),
                s.template_id.clone(),
                s.started_at.clone(),
                s.end_at.clone(),
                metadata,
            ]
        })
        .collect();
    print_table(&["ID", "TEMPLATE", "STARTED", "EXPIRES", "METADATA"], &rows);
}

fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", text.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Runs `command` through the sandbox's agent (process.Process/Start, as the SDK does).
async fn exec(
    client: &Client,
    id: &str,
    user: &str,
    cwd: Option<String>,
    envs: &[String],
    command: &[String],
) -> Result<ExitCode, CliError> {
    let detail: SandboxDetail =
        serde_json::from_slice(&client.call("GET", &format!("/sandboxes/{id}")).await?)
            .map_err(|e| CliError::Failed(format!("unexpected answer: {e}")))?;
    let mut env_map = serde_json::Map::new();
    for pair in envs {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| CliError::Failed(format!("--env {pair:?} is not KEY=VALUE")))?;
        env_map.insert(k.to_owned(), v.into());
    }
    let mut process = serde_json::json!({
        "cmd": command[0],
        "args": &command[1..],
        "envs": env_map,
    });
    if let Some(cwd) = cwd {
        process["cwd"] = cwd.into();
    }
    let message = serde_json::json!({"process": process, "stdin": false});
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
    let mut req = client
        .request("POST", "/process.Process/Start")
        .header(airlock_wire::SANDBOX_ID_HEADER, id)
        .header("content-type", connect::STREAM_CONTENT_TYPE)
        .header("connect-protocol-version", "1")
        .header("authorization", format!("Basic {basic}"));
    if let Some(token) = &detail.envd_access_token {
        req = req.header(airlock_wire::ACCESS_TOKEN_HEADER, token);
    }
    let req = req
        .body(Body::from(connect::encode_message(&message)))
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let resp = client.send(req).await?;
    if !resp.status().is_success() {
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(CliError::Failed(format!(
            "starting the command failed: {}",
            String::from_utf8_lossy(&body)
        )));
    }

    let mut body = resp.into_body();
    let mut decoder = Decoder::default();
    let mut exit: Option<i32> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| CliError::Failed(format!("the stream broke: {e}")))?;
        let Some(chunk) = frame.data_ref() else {
            continue;
        };
        decoder.push(chunk);
        while let Some(env) = decoder
            .next_envelope()
            .map_err(|e| CliError::Failed(e.to_string()))?
        {
            if env.is_end_stream() {
                let end: connect::EndOfStream =
                    serde_json::from_slice(&env.payload).unwrap_or_default();
                if let Some(err) = end.error {
                    return Err(CliError::Failed(format!("{:?}: {}", err.code, err.message)));
                }
                continue;
            }
            let msg: ProcessEventMessage = serde_json::from_slice(&env.payload)
                .map_err(|e| CliError::Failed(format!("unexpected message: {e}")))?;
            match msg.event {
                ProcessEvent::Data(ProcessOutput::Stdout(d) | ProcessOutput::Pty(d)) => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&d);
                    let _ = out.flush();
                }
                ProcessEvent::Data(ProcessOutput::Stderr(d)) => {
                    let _ = std::io::stderr().write_all(&d);
                }
                ProcessEvent::End(end) => {
                    if end.exit_code < 0 {
                        eprintln!("airlock: command ended: {}", end.status);
                    }
                    exit = Some(end.exit_code);
                }
                ProcessEvent::Start(_) | ProcessEvent::Keepalive(_) => {}
            }
        }
    }
    match exit {
        Some(code) => Ok(ExitCode::from(u8::try_from(code).unwrap_or(1))),
        None => Err(CliError::Failed(
            "the command ended without an exit status".into(),
        )),
    }
}

/// `airlock template ls`: the built templates in the data dir's database that a name reaches:
/// the built-ins, and each tagged build of a user template as `name:tag` (every key's).
pub fn template_ls(data: &DataDir) -> Result<ExitCode, CliError> {
    let store = open_store(data)?;
    let failed = |e: airlock_core::store::StoreError| CliError::Other(e.into());
    let mut rows: Vec<[String; 4]> = Vec::new();
    for t in store.named_templates().map_err(failed)? {
        let names = match store.template_of_record(&t.name).map_err(failed)? {
            Some(owner) => {
                let tags = store.tags_of(&owner.id).map_err(failed)?.into_iter();
                let tags = tags.filter(|tag| tag.build_id == t.name.as_str());
                let names: Vec<String> = tags
                    .map(|tag| format!("{}:{}", owner.alias, tag.tag))
                    .collect();
                // A build being published has its tags once it is ready.
                if names.is_empty() {
                    t.name.to_string()
                } else {
                    names.join(",")
                }
            }
            None => t.name.to_string(),
        };
        rows.push([
            names,
            t.content_hash.chars().take(12).collect(),
            format!("{:.0} MiB", t.size_bytes as f64 / (1024.0 * 1024.0)),
            rfc3339(t.built_at),
        ]);
    }
    print_table(&["NAME", "HASH", "SIZE", "BUILT"], &rows);
    Ok(ExitCode::SUCCESS)
}

fn rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// `airlock key …`: works on the data dir's database directly, so it needs the server's
/// data dir (and its permissions), not a running server.
pub fn key(cmd: KeyCommand, data: &DataDir) -> Result<ExitCode, CliError> {
    let store = open_store(data)?;
    let now = airlock_core::lifecycle::now_unix();
    let failed = |e: airlock_core::store::StoreError| CliError::Other(e.into());
    match cmd {
        KeyCommand::Create {
            name,
            max_running,
            max_paused,
            max_snapshot_mb,
        } => {
            let key = crate::serve::new_api_key();
            let hash = crate::api::hash_key(&key);
            let limits = KeyLimits {
                max_running,
                max_paused,
                max_snapshot_mb,
            };
            store
                .add_api_key_hash(&hash, &name, now, limits)
                .map_err(failed)?;
            println!("{key}");
            eprintln!(
                "key id {} (store the key now: it is not shown again)",
                airlock_core::store::key_id(&hash)
            );
        }
        KeyCommand::Ls => {
            let rows: Vec<[String; 5]> = store
                .api_keys()
                .map_err(failed)?
                .into_iter()
                .map(|k| {
                    [
                        k.id,
                        k.name,
                        rfc3339(k.created_at),
                        limits_column(&k.limits),
                        k.revoked_at.map(rfc3339).unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            print_table(&["ID", "NAME", "CREATED", "LIMITS", "REVOKED"], &rows);
        }
        KeyCommand::Revoke { id } => {
            if !store.revoke_api_key(&id, now).map_err(failed)? {
                return Err(CliError::Failed(format!(
                    "no live key has the id '{id}' (see `airlock key ls`)"
                )));
            }
            println!("revoked {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A key's own limits, `-` when it has none (the server's defaults apply).
fn limits_column(limits: &KeyLimits) -> String {
    let set: Vec<String> = [
        limits.max_running.map(|n| format!("running={n}")),
        limits.max_paused.map(|n| format!("paused={n}")),
        limits.max_snapshot_mb.map(|n| format!("snapshot_mb={n}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if set.is_empty() {
        "-".into()
    } else {
        set.join(",")
    }
}

fn open_store(data: &DataDir) -> Result<Store, CliError> {
    let path: PathBuf = data.db();
    Store::open(&path).map_err(|e| {
        CliError::Other(anyhow::Error::new(e).context(format!("opening {}", path.display())))
    })
}

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
    let created: airlock_wire::api::Sandbox = serde_json::from_slice(
        &client
            .call_json(
                "POST",
                "/v2/sandboxes",
                &serde_json::json!({"templateID": opts.template, "timeout": opts.timeout_secs + 60}),
            )
            .await?,
    )
    .map_err(|e| CliError::Failed(format!("unexpected answer: {e}")))?;
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
    let body = serde_json::json!({"code": code, "context_id": null, "language": opts.language, "env_vars": null});
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
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let code_failed =
        tokio::time::timeout(std::time::Duration::from_secs(opts.timeout_secs), async {
            let resp = client.send(req).await?;
            let status = resp.status();
            let mut body = resp.into_body();
            if !status.is_success() {
                let text = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                return Err(CliError::Failed(format!(
                    "the code interpreter answered {status}: {}",
                    String::from_utf8_lossy(&text).trim()
                )));
            }
            let mut printer = ResultPrinter::new(&opts.out_dir);
            let mut pending = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame =
                    frame.map_err(|e| CliError::Failed(format!("the stream broke: {e}")))?;
                let Some(chunk) = frame.data_ref() else {
                    continue;
                };
                pending.extend_from_slice(chunk);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    printer.handle(&line)?;
                }
            }
            Ok(printer.failed)
        })
        .await
        .map_err(|_| {
            CliError::Failed(format!(
                "the code did not finish within {}s",
                opts.timeout_secs
            ))
        })??;
    Ok(if code_failed {
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

    fn handle(&mut self, line: &[u8]) -> Result<(), CliError> {
        let event: serde_json::Value = serde_json::from_slice(line)
            .map_err(|e| CliError::Failed(format!("unexpected output line: {e}")))?;
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
            "result" => self.result(&event)?,
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
