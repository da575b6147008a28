//! The agent's shared state: what `/init` configured, and the live processes and watchers.

use crate::process::ProcessTable;
use crate::rpc::RpcError;
use crate::users::{self, User};
use crate::watch::WatcherTable;
use airlock_wire::envd::InitRequest;
use axum::http::HeaderMap;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// Settings the server pushes with `POST /init`.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub env_vars: BTreeMap<String, String>,
    pub access_token: Option<String>,
    pub default_user: String,
    pub default_workdir: Option<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            env_vars: BTreeMap::new(),
            access_token: None,
            default_user: "user".into(),
            default_workdir: None,
        }
    }
}

pub struct Agent {
    config: RwLock<SandboxConfig>,
    pub processes: ProcessTable,
    pub watchers: WatcherTable,
}

pub type AgentState = Arc<Agent>;

impl Agent {
    pub fn new() -> AgentState {
        Arc::new(Agent {
            config: RwLock::new(SandboxConfig::default()),
            processes: ProcessTable::default(),
            watchers: WatcherTable::default(),
        })
    }

    pub fn config(&self) -> SandboxConfig {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn apply_init(&self, init: InitRequest) {
        let mut cfg = self.config.write().unwrap_or_else(|e| e.into_inner());
        cfg.env_vars = init.env_vars;
        if init.access_token.is_some() {
            cfg.access_token = init.access_token;
        }
        if let Some(user) = init.default_user.filter(|u| !u.is_empty()) {
            cfg.default_user = user;
        }
        if init.default_workdir.is_some() {
            cfg.default_workdir = init.default_workdir;
        }
    }

    /// The user an RPC runs as: from Basic auth, else the sandbox default.
    pub fn rpc_user(&self, headers: &HeaderMap) -> Result<User, RpcError> {
        match users::from_basic_auth(headers)? {
            Some(name) => User::lookup(&name),
            None => User::lookup(&self.config().default_user),
        }
    }

    /// The user a `/files` request runs as: from `?username=`, else the sandbox default.
    pub fn named_user(&self, name: Option<&str>) -> Result<User, RpcError> {
        match name.filter(|n| !n.is_empty()) {
            Some(name) => User::lookup(name),
            None => User::lookup(&self.config().default_user),
        }
    }
}
