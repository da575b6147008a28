//! Control-plane REST bodies (E2B's OpenAPI `NewSandbox`, `Sandbox`, `SandboxDetail`, ...).
//!
//! Unknown request fields are accepted and ignored, so newer SDKs keep working.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /v2/sandboxes` and `POST /sandboxes` (v1 adds `secure`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox is killed; the server default applies when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// v1 only; `false` means the agent requires no access token. v2 sandboxes are always secured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    /// `lifecycle.onTimeout = "pause"`: pause instead of kill when the timeout passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    /// `false`: that pause keeps the files only (`lifecycle.onTimeout.mode = "filesystem"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_memory: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<AutoResume>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "allow_internet_access"
    )]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    /// Airlock's own: the sandbox's size, each within the server's maximum. E2B takes these
    /// from the template; the server's defaults apply when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "memoryMB")]
    pub memory_mb: Option<u32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "diskSizeMB"
    )]
    pub disk_size_mb: Option<u32>,
    /// The caller's volumes to mount, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMountBody>>,
}

/// `PUT /sandboxes/{id}/network` (E2B's `SandboxNetworkUpdateConfig`): replaces every rule;
/// what is left out is cleared.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NetworkUpdate {
    #[serde(flatten)]
    pub rules: NetworkConfig,
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
}

/// `NewSandbox.network` (E2B's `SandboxNetworkConfig`): outbound allow and deny lists.
/// `allowOut` takes addresses, CIDR blocks and domains; `denyOut` addresses and CIDR blocks.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    /// `false`: the sandbox's user ports demand the `E2B-Traffic-Access-Token` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AutoResume {
    #[serde(default)]
    pub enabled: bool,
}

/// `SandboxDetail.lifecycle`: both fields are required when present.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLifecycle {
    pub auto_resume: bool,
    /// `"kill"` or `"pause"`.
    pub on_timeout: String,
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SnapshotRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A snapshot as `create_snapshot` and `list_snapshots` return it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ForkRequest {
    #[serde(default)]
    pub count: Option<usize>,
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// One entry of the fork response: the new sandbox or why it failed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ForkResult {
    Sandbox(Sandbox),
    Error(ErrorBody),
}

/// `POST /v2/sandboxes/{id}/connect`, `POST /sandboxes/{id}/resume` and
/// `POST /sandboxes/{id}/timeout` bodies.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TimeoutBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// `false` (`on_resume="reboot"`): a paused sandbox starts afresh on its files instead of
    /// going on where it left off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/refreshes` (optional): how many seconds more to keep it alive.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RefreshBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<u64>,
}

/// `POST /sandboxes/{id}/pause` (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseBody {
    /// `false`: keep the files only; the sandbox's processes end first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    /// Refuse the pause (503) when the sandbox's agent does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_healthy_guest: Option<bool>,
}

/// Response of create and connect.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub alias: Option<String>,
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// What the SDK sends in `E2B-Traffic-Access-Token` to the sandbox's ports besides envd's.
    pub traffic_access_token: Option<String>,
    /// `airlock serve --domain`: what the SDK's `get_host(port)` names the sandbox's ports
    /// under (`{port}-{id}.{domain}`).
    pub domain: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
        }
    }
}

/// `GET /sandboxes/{id}` and the items of the list endpoints.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub alias: Option<String>,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339: when the timeout will kill the sandbox.
    pub end_at: String,
    pub envd_version: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    pub state: SandboxState,
    pub metadata: BTreeMap<String, String>,
    /// As in [`Sandbox::domain`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
    /// What a paused sandbox's pause saved: `full` or `filesystem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMountBody>,
}

/// A volume seen by a sandbox (E2B's `SandboxVolumeMount`): the volume's name, and where.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeMountBody {
    pub name: String,
    pub path: String,
}

/// E2B's error body. Both fields are required by the SDK's parser.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}

/// The body the sandbox proxy answers for a sandbox that does not exist (any more).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxNotFoundBody {
    pub sandbox_id: String,
    pub message: String,
    pub code: u16,
}

/// Template listing (Airlock extension used by the CLI).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateInfo {
    pub name: String,
    pub content_hash: String,
    pub built_at: String,
    pub size_bytes: u64,
}

/// One sample of a sandbox's use (`GET /sandboxes/{id}/metrics`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    /// RFC 3339.
    pub timestamp: String,
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// `GET /sandboxes/metrics`: the latest sample of each sandbox asked for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxesWithMetrics {
    pub sandboxes: BTreeMap<String, SandboxMetric>,
}

/// One entry of a sandbox's log, as E2B's API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxLogEntry {
    /// RFC 3339, in milliseconds.
    pub timestamp: String,
    pub level: crate::logs::LogLevel,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

/// `GET /v2/sandboxes/{id}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxLogsV2 {
    pub logs: Vec<SandboxLogEntry>,
}

/// A line of `GET /sandboxes/{id}/logs` (E2B's first version).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxLogLine {
    pub timestamp: String,
    pub line: String,
}

/// `GET /sandboxes/{id}/logs`: each entry both as a line and structured.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLogsV1 {
    pub logs: Vec<SandboxLogLine>,
    pub log_entries: Vec<SandboxLogEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn new_sandbox_accepts_sdk_bodies_with_unknown_fields() {
        let v2: NewSandbox = serde_json::from_value(json!({
            "templateID": "base", "timeout": 120, "metadata": {"user": "a b"}, "envVars": {"FOO": "bar"},
            "autoPause": true, "autoResume": {"enabled": true}, "allow_internet_access": false,
            "network": {"allowOut": ["example.com"]}
        }))
        .unwrap();
        assert_eq!(v2.template_id, "base");
        assert_eq!(v2.timeout, Some(120));
        assert_eq!(v2.env_vars.unwrap()["FOO"], "bar");
        assert_eq!(v2.allow_internet_access, Some(false));
        let network = v2.network.unwrap();
        assert_eq!(network.allow_out.unwrap(), ["example.com"]);
        assert_eq!(network.deny_out, None);
        let update: NetworkUpdate = serde_json::from_value(json!({
            "allowOut": ["1.1.1.1"], "denyOut": ["0.0.0.0/0"], "allow_internet_access": true, "rules": {}
        }))
        .unwrap();
        assert_eq!(update.rules.deny_out.unwrap(), ["0.0.0.0/0"]);
        assert_eq!(update.allow_internet_access, Some(true));
        assert!(serde_json::from_value::<NewSandbox>(json!({"timeout": 1})).is_err());
    }

    #[test]
    fn sandbox_uses_e2b_field_names() {
        let s = Sandbox {
            template_id: "base".into(),
            sandbox_id: "abc".into(),
            client_id: "airlock".into(),
            alias: Some("base".into()),
            envd_version: "0.5.7".into(),
            envd_access_token: Some("t".into()),
            traffic_access_token: Some("p".into()),
            domain: None,
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["sandboxID"], "abc");
        assert_eq!(v["templateID"], "base");
        assert_eq!(v["envdAccessToken"], "t");
        assert_eq!(v["trafficAccessToken"], "p");
        assert!(v["domain"].is_null());
        let network: NetworkConfig =
            serde_json::from_value(json!({"allowPublicTraffic": false})).unwrap();
        assert_eq!(network.allow_public_traffic, Some(false));
    }
}
