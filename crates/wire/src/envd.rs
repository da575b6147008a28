//! envd's Connect-JSON messages (`process.Process` and `filesystem.Filesystem`), in proto3 JSON.
//!
//! Inputs accept both lowerCamelCase and snake_case names and treat missing fields as defaults;
//! outputs are lowerCamelCase and omit defaults, as the SDK's generated clients expect.

use crate::json::{b64, i64_string, is_default};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

// ---------------------------------------------------------------- process.Process

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessConfig {
    #[serde(default)]
    pub cmd: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtySize {
    #[serde(default)]
    pub cols: u32,
    #[serde(default)]
    pub rows: u32,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pty {
    #[serde(default)]
    pub size: PtySize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StartRequest {
    #[serde(default)]
    pub process: ProcessConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Missing means `true` (the legacy default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// Which process an RPC is about (a oneof: `{"pid": 1}` or `{"tag": "t"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessSelector {
    Pid(u32),
    Tag(String),
}

#[derive(Debug, Clone, Deserialize)]
pub struct SelectRequest {
    pub process: ProcessSelector,
}

pub type ConnectRequest = SelectRequest;
pub type CloseStdinRequest = SelectRequest;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListResponse {
    #[serde(default)]
    pub processes: Vec<ProcessInfo>,
}

/// Input for a process: stdin bytes or terminal bytes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ProcessInput {
    Stdin(#[serde(with = "b64")] Vec<u8>),
    Pty(#[serde(with = "b64")] Vec<u8>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendInputRequest {
    pub process: ProcessSelector,
    pub input: ProcessInput,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Debug, Deserialize)]
        #[serde(untagged)]
        enum NameOrNumber {
            Name(String),
            Number(i64),
        }
        match NameOrNumber::deserialize(d)? {
            NameOrNumber::Name(n) if n == "SIGNAL_SIGKILL" => Ok(Signal::Kill),
            NameOrNumber::Name(n) if n == "SIGNAL_SIGTERM" => Ok(Signal::Term),
            NameOrNumber::Number(9) => Ok(Signal::Kill),
            NameOrNumber::Number(15) => Ok(Signal::Term),
            other => Err(serde::de::Error::custom(format!(
                "unsupported signal {other:?}: only SIGNAL_SIGKILL and SIGNAL_SIGTERM exist"
            ))),
        }
    }
}

impl Serialize for Signal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            Signal::Kill => "SIGNAL_SIGKILL",
            Signal::Term => "SIGNAL_SIGTERM",
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendSignalRequest {
    pub process: ProcessSelector,
    pub signal: Signal,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateRequest {
    pub process: ProcessSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

/// One message of the StreamInput client stream.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamInputRequest {
    Start { process: ProcessSelector },
    Data { input: ProcessInput },
    Keepalive {},
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ProcessOutput {
    Stdout(#[serde(with = "b64")] Vec<u8>),
    Stderr(#[serde(with = "b64")] Vec<u8>),
    Pty(#[serde(with = "b64")] Vec<u8>),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    #[serde(default, skip_serializing_if = "is_default", alias = "exit_code")]
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub exited: bool,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StartEvent {
    pub pid: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Empty {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ProcessEvent {
    Start(StartEvent),
    Data(ProcessOutput),
    End(EndEvent),
    Keepalive(Empty),
}

/// `StartResponse` and `ConnectResponse` share this shape: `{"event": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessEventMessage {
    pub event: ProcessEvent,
}

// ---------------------------------------------------------------- filesystem.Filesystem

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileType {
    #[default]
    #[serde(rename = "FILE_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "FILE_TYPE_FILE")]
    File,
    #[serde(rename = "FILE_TYPE_DIRECTORY")]
    Directory,
    #[serde(rename = "FILE_TYPE_SYMLINK")]
    Symlink,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub path: String,
    #[serde(with = "i64_string")]
    pub size: i64,
    /// Permission bits only.
    pub mode: u32,
    /// Go's `FileMode.String()`, e.g. `-rw-r--r--`.
    pub permissions: String,
    pub owner: String,
    pub group: String,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// The file's `user.e2b.*` extended attributes, without the prefix.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The entry is a symlink; `file_type` is then its target's.
    #[serde(default, skip_serializing_if = "is_default")]
    pub is_symlink: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PathRequest {
    #[serde(default)]
    pub path: String,
}

pub type StatRequest = PathRequest;
pub type MakeDirRequest = PathRequest;
pub type RemoveRequest = PathRequest;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EntryResponse {
    pub entry: EntryInfo,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MoveRequest {
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub destination: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListDirRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub depth: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default, alias = "include_entry")]
    pub include_entry: bool,
    #[serde(default, alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    #[serde(rename = "EVENT_TYPE_CREATE")]
    Create,
    #[serde(rename = "EVENT_TYPE_WRITE")]
    Write,
    #[serde(rename = "EVENT_TYPE_REMOVE")]
    Remove,
    #[serde(rename = "EVENT_TYPE_RENAME")]
    Rename,
    #[serde(rename = "EVENT_TYPE_CHMOD")]
    Chmod,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FilesystemEvent {
    /// Relative to the watched directory.
    pub name: String,
    #[serde(rename = "type")]
    pub event_type: EventType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum WatchDirResponse {
    Start(Empty),
    Filesystem(Box<FilesystemEvent>),
    Keepalive(Empty),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatcherId {
    #[serde(alias = "watcher_id")]
    pub watcher_id: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WatcherEvents {
    pub events: Vec<FilesystemEvent>,
}

// ---------------------------------------------------------------- plain HTTP

/// `POST /init`: what the server tells a freshly started agent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitRequest {
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    /// The token E2B's SDK sends to the sandbox's ports besides envd (`trafficAccessToken`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_workdir: Option<String>,
    /// The sandbox's own hostname. A sandbox restored from a checkpoint starts with the name of
    /// the one that was checkpointed; the agent renames it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Where to bind each of the sandbox's volumes (see [`crate::VOLUMES_DIR`]); only a create
    /// sends them, and a path bound already is left as it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<String>,
}

/// One entry of the `POST /files` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UploadedEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn start_request_as_the_sdk_sends_it() {
        let req: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"X": "1"}, "cwd": "/tmp"},
            "stdin": false
        }))
        .unwrap();
        assert_eq!(req.process.args[2], "echo hi");
        assert_eq!(req.stdin, Some(false));
        assert!(req.pty.is_none());
    }

    #[test]
    fn events_serialize_like_envd() {
        let start = ProcessEventMessage {
            event: ProcessEvent::Start(StartEvent { pid: 7 }),
        };
        assert_eq!(
            serde_json::to_value(&start).unwrap(),
            json!({"event": {"start": {"pid": 7}}})
        );
        let data = ProcessEventMessage {
            event: ProcessEvent::Data(ProcessOutput::Stdout(b"hi\n".to_vec())),
        };
        assert_eq!(
            serde_json::to_value(&data).unwrap(),
            json!({"event": {"data": {"stdout": "aGkK"}}})
        );
        let end = ProcessEventMessage {
            event: ProcessEvent::End(EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            }),
        };
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        let ka = WatchDirResponse::Keepalive(Empty {});
        assert_eq!(serde_json::to_value(&ka).unwrap(), json!({"keepalive": {}}));
    }

    #[test]
    fn selectors_signals_and_inputs() {
        let r: SendSignalRequest =
            serde_json::from_value(json!({"process": {"pid": 4}, "signal": "SIGNAL_SIGKILL"}))
                .unwrap();
        assert_eq!(r.process, ProcessSelector::Pid(4));
        assert_eq!(r.signal, Signal::Kill);
        assert!(serde_json::from_value::<SendSignalRequest>(
            json!({"process": {"pid": 4}, "signal": "SIGNAL_SIGHUP"})
        )
        .is_err());
        let r: SendInputRequest = serde_json::from_value(
            json!({"process": {"tag": "t"}, "input": {"stdin": "ZGF0YQo="}}),
        )
        .unwrap();
        assert_eq!(r.input, ProcessInput::Stdin(b"data\n".to_vec()));
        let s: StreamInputRequest = serde_json::from_value(json!({"keepalive": {}})).unwrap();
        assert!(matches!(s, StreamInputRequest::Keepalive {}));
    }

    #[test]
    fn entry_size_is_a_string() {
        let e = EntryInfo {
            size: 18,
            ..Default::default()
        };
        assert_eq!(serde_json::to_value(&e).unwrap()["size"], "18");
        let back: EntryInfo = serde_json::from_value(json!({"name":"a","type":"FILE_TYPE_FILE","path":"/a","size":18,"mode":420,"permissions":"","owner":"","group":""})).unwrap();
        assert_eq!(back.size, 18);
    }
}
