//! Airlock as an MCP server, so that Claude Desktop, IDE agents and any other MCP client can
//! run code in sandboxes: `airlock mcp` speaks MCP on stdin and stdout, and `airlock serve`
//! answers streamable HTTP at `/mcp`, behind the API key.
//!
//! The MCP server is a client of the public API, with the caller's key: a tool can do only
//! what that key could do through the SDK. Over stdio that is the key `airlock mcp` was given;
//! over HTTP, the key each request carries (`X-API-Key`, or `Authorization: Bearer`), and a
//! session is only ever reached with the key that opened it (see [`owners`]).

mod calls;
mod local_files;
mod owners;
mod session;
mod tools;

use crate::client::{Client, ClientError};
use crate::http::error::ApiError;
use airlock_core::store::Store;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use local_files::FilesDir;
use owners::SessionOwners;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use session::{Scope, SessionSandboxes};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// How long a session's sandbox lives after its last call, unless `create_sandbox` says.
pub const DEFAULT_SANDBOX_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The largest MCP request over HTTP (an `upload`'s base64 content is in it).
const MAX_HTTP_REQUEST: usize = 16 * 1024 * 1024;

const INSTRUCTIONS: &str = "Airlock runs code in isolated Linux sandboxes. run_code keeps \
    variables between calls, like a notebook; charts come back as images. Calls without a \
    sandbox_id share this session's sandbox, started on first use.";

/// How a session reaches the API.
enum Api {
    /// stdio: one client, with the key `airlock mcp` was given; local files are the user's,
    /// in one directory.
    /// (Boxed: a client is large, and the other variant small.)
    Fixed(Box<Client>, FilesDir),
    /// HTTP: the server itself over loopback, with the key of each request.
    PerRequest { base: String },
}

/// One MCP session.
pub struct AirlockMcp {
    api: Api,
    sandboxes: Arc<SessionSandboxes>,
}

impl AirlockMcp {
    /// The client for this call, and how it finds its default sandbox.
    fn client(&self, ctx: &RequestContext<RoleServer>) -> Result<(Client, Scope), String> {
        match &self.api {
            Api::Fixed(client, _) => Ok((Client::clone(client), Scope::Session)),
            Api::PerRequest { base } => {
                let parts = ctx.extensions.get::<http::request::Parts>();
                let key = parts.and_then(|p| p.extensions.get::<CallerKey>());
                let Some(CallerKey(key)) = key else {
                    return Err("this request carried no API key".into());
                };
                // Requests of the 2026-07-28 protocol have no session.
                let in_session = parts.is_some_and(|p| p.headers.contains_key(HEADER_SESSION_ID));
                let scope = if in_session {
                    Scope::Session
                } else {
                    Scope::Shared
                };
                Ok((Client::with_key(base, Some(key.clone())), scope))
            }
        }
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Vec<ContentBlock>, String> {
        use tools::arguments;
        let (client, scope) = self.client(ctx)?;
        let local_files = match &self.api {
            Api::Fixed(_, files) => Some(files),
            Api::PerRequest { .. } => None,
        };
        let name = request.name.as_ref();
        let args = request.arguments;
        let sandboxes = &self.sandboxes;
        let target = |id: Option<String>| {
            let client = &client;
            async move { sandboxes.target(client, id.as_deref(), scope).await }
        };
        match name {
            "run_code" => {
                let args: tools::RunCode = arguments(name, args)?;
                let sandbox = target(args.sandbox_id.clone()).await?;
                calls::run_code(&client, &sandbox, args).await
            }
            "run_command" => {
                let args: tools::RunCommand = arguments(name, args)?;
                let sandbox = target(args.sandbox_id.clone()).await?;
                calls::run_command(&client, &sandbox, args).await
            }
            "read_file" => {
                let args: tools::ReadFile = arguments(name, args)?;
                let sandbox = target(args.sandbox_id.clone()).await?;
                calls::read_file(&client, &sandbox, args).await
            }
            "write_file" => {
                let args: tools::WriteFile = arguments(name, args)?;
                let sandbox = target(args.sandbox_id.clone()).await?;
                calls::write_file(&client, &sandbox, args).await
            }
            "list_files" => {
                let args: tools::ListFiles = arguments(name, args)?;
                let sandbox = target(args.sandbox_id.clone()).await?;
                calls::list_files(&client, &sandbox, args).await
            }
            "upload" => {
                let args: tools::Upload = arguments(name, args)?;
                let sandbox = target(args.sandbox_id.clone()).await?;
                calls::upload(&client, &sandbox, args, local_files).await
            }
            "download" => {
                let args: tools::Download = arguments(name, args)?;
                let sandbox = target(args.sandbox_id.clone()).await?;
                calls::download(&client, &sandbox, args, local_files).await
            }
            "create_sandbox" => {
                let args: tools::CreateSandbox = arguments(name, args)?;
                let sandbox = sandboxes
                    .create(&client, args.template, args.timeout, scope)
                    .await?;
                Ok(vec![ContentBlock::text(format!(
                    "started sandbox {} from template {}; calls without a sandbox_id now go to it",
                    sandbox.sandbox_id, sandbox.template_id
                ))])
            }
            "kill_sandbox" => {
                let args: tools::KillSandbox = arguments(name, args)?;
                let id = sandboxes
                    .kill(&client, args.sandbox_id.as_deref(), scope)
                    .await?;
                Ok(vec![ContentBlock::text(format!("killed sandbox {id}"))])
            }
            other => Err(format!(
                "there is no tool '{other}'; the tools are run_code, run_command, read_file, \
                 write_file, list_files, upload, download, create_sandbox and kill_sandbox"
            )),
        }
    }
}

impl ServerHandler for AirlockMcp {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions(INSTRUCTIONS);
        info.server_info = Implementation::new("airlock", env!("CARGO_PKG_VERSION"));
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Every failure is the tool's, for the model to read; the session goes on.
        let result = match self.call(request, &ctx).await {
            Ok(content) => CallToolResult::success(content),
            Err(message) => CallToolResult::error(vec![ContentBlock::text(message)]),
        };
        Ok(result.into())
    }
}

/// `airlock mcp`: serves one session on stdin and stdout until the client closes them, then
/// kills the sandboxes the session started. `local_path`s are kept to `files_dir` (by
/// default the current directory).
pub async fn stdio(
    client: Client,
    template: String,
    timeout: Duration,
    files_dir: Option<std::path::PathBuf>,
) -> Result<ExitCode, ClientError> {
    let files = FilesDir::new(files_dir).map_err(|e| ClientError::Failed(e.to_string()))?;
    let sandboxes = Arc::new(SessionSandboxes::new(template, timeout));
    let handler = AirlockMcp {
        api: Api::Fixed(Box::new(client), files),
        sandboxes: sandboxes.clone(),
    };
    let failed = |e: String| ClientError::Failed(format!("MCP over stdio: {e}"));
    let running = handler
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| failed(e.to_string()))?;
    let ended = running.waiting().await;
    sandboxes.close().await;
    ended.map_err(|e| failed(e.to_string()))?;
    Ok(ExitCode::SUCCESS)
}

/// `airlock mcp --print-tools`: the tools as `tools/list` gives them, as JSON.
pub fn print_tools() -> ExitCode {
    match serde_json::to_string_pretty(&tools::list()) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The API key an `/mcp` request came with, checked.
#[derive(Clone)]
struct CallerKey(String);

/// `/mcp`: streamable HTTP, each session a client of this server at `self_url` with the key
/// of its requests (checked in `store`). A gateway serves it too, as a client of itself.
pub fn routes<S: Clone + Send + Sync + 'static>(
    store: Arc<Store>,
    self_url: String,
) -> axum::Router<S> {
    use rmcp::transport::streamable_http_server::{
        session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
    };
    let sessions = Arc::new(LocalSessionManager::default());
    let config = StreamableHttpServerConfig::default()
        // The key guards every request, so a page that rebinds a name to this address gets
        // nowhere; and the server may be reached by any name the operator gives it.
        .disable_allowed_hosts()
        .with_max_request_body_bytes(MAX_HTTP_REQUEST);
    let service = StreamableHttpService::new(
        move || {
            Ok(AirlockMcp {
                api: Api::PerRequest {
                    base: self_url.clone(),
                },
                sandboxes: Arc::new(SessionSandboxes::new(
                    tools::DEFAULT_TEMPLATE.into(),
                    DEFAULT_SANDBOX_TIMEOUT,
                )),
            })
        },
        sessions.clone(),
        config,
    );
    let gate = Arc::new(Gate {
        store,
        owners: SessionOwners::new(sessions),
    });
    axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(gate, authenticate))
}

/// What `/mcp`'s requests pass before rmcp sees them.
struct Gate {
    store: Arc<Store>,
    owners: SessionOwners,
}

/// Lets through requests with a valid key, which the session then uses, and those that name a
/// session only with the key that opened it.
async fn authenticate(State(gate): State<Arc<Gate>>, mut req: Request, next: Next) -> Response {
    let headers = req.headers();
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or(bearer)
        .unwrap_or("")
        .to_owned();
    if key.is_empty() {
        return ApiError::new(
            http::StatusCode::UNAUTHORIZED,
            "missing API key: send it in the X-API-Key header, or as Authorization: Bearer",
        )
        .into_response();
    }
    let caller = match crate::http::auth::caller_of_key(&gate.store, &key).await {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    let session = req
        .headers()
        .get(HEADER_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(session) = &session {
        if !gate.owners.owned_by(session, &caller.0) {
            return ApiError::not_found(format!("no MCP session {session}")).into_response();
        }
    }
    let ending = req.method() == http::Method::DELETE;
    req.extensions_mut().insert(CallerKey(key));
    let answer = next.run(req).await;
    match session {
        None => {
            let opened = answer.headers().get(HEADER_SESSION_ID);
            if let Some(opened) = opened.and_then(|v| v.to_str().ok()) {
                if !gate.owners.opened(opened, &caller.0).await {
                    return ApiError::new(
                        http::StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "this API key has {} MCP sessions open, the most it may: end one \
                             (DELETE /mcp with its Mcp-Session-Id) or let one idle out",
                            owners::MAX_PER_KEY
                        ),
                    )
                    .into_response();
                }
            }
        }
        Some(session) if ending && answer.status().is_success() => gate.owners.closed(&session),
        Some(_) => {}
    }
    answer
}
