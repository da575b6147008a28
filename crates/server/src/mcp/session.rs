//! Which sandbox a tool call goes to. A call may name one; without that, an MCP session keeps
//! one sandbox of its own, started on first use, so that state carries over between calls. It
//! is connected again on every call, which resumes it if it was paused and keeps its timeout
//! running from the last call, and killed when the session ends.
//!
//! The 2026-07-28 protocol over HTTP has no sessions: each request stands alone. There, calls
//! without a sandbox id share one sandbox per API key, found again by its metadata.

use crate::client::{Client, ClientError};
use airlock_wire::api::{NewSandbox, Sandbox, SandboxDetail, TimeoutBody};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::Mutex;

/// The metadata key that marks a sandbox started by the MCP server; its value says whose.
pub const MCP_METADATA_KEY: &str = "airlock-mcp";
/// The value for the sandbox that calls without a session share (see the module doc).
const SHARED: &str = "shared";

/// How a session's calls find their default sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The session lives as long as this value (stdio, or an HTTP session).
    Session,
    /// A lone request: the key's shared sandbox.
    Shared,
}

impl Scope {
    /// The [`MCP_METADATA_KEY`] value of the sandboxes started in this scope.
    fn tag(self) -> &'static str {
        match self {
            Scope::Session => "session",
            Scope::Shared => SHARED,
        }
    }
}

/// A session's sandboxes: the current one, and those it started (killed when it ends).
pub struct SessionSandboxes {
    template: String,
    timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    current: Option<String>,
    started: Vec<(Client, String)>,
}

impl SessionSandboxes {
    pub fn new(template: String, timeout: Duration) -> Self {
        SessionSandboxes {
            template,
            timeout,
            state: Mutex::default(),
        }
    }

    /// The sandbox a call goes to, connected: `explicit` if given, else the session's own
    /// (started if it has none).
    pub async fn target(
        &self,
        client: &Client,
        explicit: Option<&str>,
        scope: Scope,
    ) -> Result<Sandbox, String> {
        if let Some(id) = explicit {
            return connect(client, id, None).await.map_err(|e| gone(id, e));
        }
        let mut state = self.state.lock().await;
        let current = match (&state.current, scope) {
            (Some(id), _) => Some(id.clone()),
            (None, Scope::Shared) => shared_sandbox(client).await?,
            (None, Scope::Session) => None,
        };
        if let Some(id) = current {
            return match connect(client, &id, Some(self.timeout)).await {
                Ok(sandbox) => {
                    state.current = Some(id);
                    Ok(sandbox)
                }
                Err(e) => {
                    // The next call starts a fresh one; this one says what was lost.
                    state.current = None;
                    Err(format!(
                        "{} The next call without a sandbox_id starts a fresh sandbox; \
                         variables and files of the old one are gone.",
                        gone(&id, e)
                    ))
                }
            };
        }
        self.start_current(&mut state, client, None, None, scope)
            .await
    }

    /// `create_sandbox`: a new sandbox that becomes the session's current one.
    pub async fn create(
        &self,
        client: &Client,
        template: Option<String>,
        timeout: Option<u64>,
        scope: Scope,
    ) -> Result<Sandbox, String> {
        let mut state = self.state.lock().await;
        self.start_current(&mut state, client, template, timeout, scope)
            .await
    }

    /// `kill_sandbox`: kills `explicit`, or the current one; returns which.
    pub async fn kill(
        &self,
        client: &Client,
        explicit: Option<&str>,
        scope: Scope,
    ) -> Result<String, String> {
        let mut state = self.state.lock().await;
        let id = match (explicit, &state.current, scope) {
            (Some(id), _, _) => id.to_owned(),
            (None, Some(id), _) => id.clone(),
            (None, None, Scope::Shared) => shared_sandbox(client)
                .await?
                .ok_or("this API key has no shared MCP sandbox to kill")?,
            (None, None, Scope::Session) => {
                return Err("this session has no sandbox to kill".into())
            }
        };
        client
            .call("DELETE", &format!("/sandboxes/{id}"))
            .await
            .map_err(|e| gone(&id, e))?;
        if state.current.as_deref() == Some(id.as_str()) {
            state.current = None;
        }
        state.started.retain(|(_, started)| *started != id);
        Ok(id)
    }

    /// Kills the sandboxes this session started (it is over).
    pub async fn close(&self) {
        kill_all(std::mem::take(&mut self.state.lock().await.started)).await;
    }

    /// Starts a sandbox and makes it the current one. A session's own is also recorded, to be
    /// killed when the session ends; a shared one outlives the request that made it.
    async fn start_current(
        &self,
        state: &mut State,
        client: &Client,
        template: Option<String>,
        timeout: Option<u64>,
        scope: Scope,
    ) -> Result<Sandbox, String> {
        let body = NewSandbox {
            template_id: template.unwrap_or_else(|| self.template.clone()),
            timeout: Some(timeout.unwrap_or(self.timeout.as_secs())),
            metadata: Some(BTreeMap::from([(
                MCP_METADATA_KEY.to_owned(),
                scope.tag().to_owned(),
            )])),
            ..NewSandbox::default()
        };
        let answer = client
            .call_json("POST", "/v2/sandboxes", &body)
            .await
            .map_err(|e| format!("starting a sandbox failed: {}", e.describe()))?;
        let sandbox: Sandbox = crate::client::parse(&answer).map_err(|e| e.describe())?;
        state.current = Some(sandbox.sandbox_id.clone());
        if scope == Scope::Session {
            state
                .started
                .push((client.clone(), sandbox.sandbox_id.clone()));
        }
        Ok(sandbox)
    }
}

impl Drop for SessionSandboxes {
    /// An HTTP session ends by being dropped; its sandboxes go with it.
    fn drop(&mut self) {
        let started = std::mem::take(&mut self.state.get_mut().started);
        if started.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(kill_all(started));
        }
    }
}

async fn kill_all(started: Vec<(Client, String)>) {
    for (client, id) in started {
        // One that is already gone is fine.
        let _ = client.call("DELETE", &format!("/sandboxes/{id}")).await;
    }
}

/// Connects to a sandbox (resuming it if paused); `timeout` extends its life from now.
async fn connect(
    client: &Client,
    id: &str,
    timeout: Option<Duration>,
) -> Result<Sandbox, ClientError> {
    let body = TimeoutBody {
        timeout: timeout.map(|t| t.as_secs()),
        ..TimeoutBody::default()
    };
    let answer = client
        .call_json("POST", &format!("/sandboxes/{id}/connect"), &body)
        .await?;
    crate::client::parse(&answer)
}

/// The key's shared MCP sandbox, if it has one running or paused (the newest).
async fn shared_sandbox(client: &Client) -> Result<Option<String>, String> {
    let query = crate::client::percent_encode(&format!("{MCP_METADATA_KEY}={SHARED}"));
    let answer = client
        .call("GET", &format!("/v2/sandboxes?metadata={query}&limit=1"))
        .await
        .map_err(|e| format!("listing sandboxes failed: {}", e.describe()))?;
    let found: Vec<SandboxDetail> = crate::client::parse(&answer).map_err(|e| e.describe())?;
    Ok(found.into_iter().next().map(|s| s.sandbox_id))
}

/// What a model reads when a sandbox cannot be reached.
fn gone(id: &str, e: ClientError) -> String {
    format!("sandbox {id} cannot be used: {}", e.describe())
}
