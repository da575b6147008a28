//! Wire types shared by the Airlock server, agent and CLI.
//!
//! Everything here mirrors what the stock E2B SDKs send and expect (see `docs/protocol.md`):
//! the control-plane REST bodies ([`api`]), envd's Connect-JSON messages ([`envd`]) and the
//! Connect streaming envelope ([`connect`]). This crate holds no I/O, so every binary can share it.

pub mod api;
pub mod connect;
pub mod egress;
pub mod envd;
pub mod events;
pub mod json;
pub mod logs;
pub mod nodes;
pub mod signed_url;
pub mod templates;
pub mod volumes;

/// The envd version the agent reports. The SDK gates features on it (protocol doc §3.8); this is
/// the highest version whose features the agent implements.
pub const ENVD_VERSION: &str = "0.6.4";

/// Port of the in-sandbox agent (envd protocol).
pub const ENVD_PORT: u16 = 49983;

/// Where every driver puts the agent inside a sandbox: a build step can run it as a tool too,
/// and templates link `/usr/bin/sudo` to it.
pub const AGENT_PATH: &str = "/opt/airlock/airlock-agent";

/// Where a sandbox sees the volumes it was created with, before the agent binds each at its
/// mount path: the `i`-th of [`envd::InitRequest::volume_mounts`] is `{VOLUMES_DIR}/{i}`.
pub const VOLUMES_DIR: &str = "/opt/airlock/volumes";

/// The most volumes one sandbox may mount.
pub const MAX_VOLUME_MOUNTS: usize = 8;
/// Port of the code interpreter (E2B's Jupyter server) inside a sandbox.
pub const CODE_INTERPRETER_PORT: u16 = 49999;

/// Most processes one user may have in a sandbox (the agent sets `RLIMIT_NPROC` on everything
/// it starts); the host's task limit per sandbox is set well above what that allows.
pub const MAX_PROCESSES: u64 = 1024;

/// Header that routes a request to a sandbox in single-host mode.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// Header naming the sandbox port a routed request is for.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// Header carrying the sandbox's envd access token.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// The agent's route that ends every process of its sandbox but itself (a reboot that keeps the
/// files); for the server only (the proxy refuses it).
pub const REBOOT_PATH: &str = "/airlock/reboot";
/// The agent's route that says whether anything in its sandbox may be running or waiting for a
/// time ([`IdleReport`]), so the server may freeze it; for the server only.
pub const IDLE_PATH: &str = "/airlock/idle";

/// The answer of [`IDLE_PATH`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IdleReport {
    /// A process that keeps the sandbox awake (`"1234 sleep"`), if there is one.
    pub busy: Option<String>,
}
