//! Sandboxes' lifecycle events as E2B's events API answers them (`GET /events/sandboxes/{id}`).

use serde::{Deserialize, Serialize};

/// One event. E2B's team is Airlock's API key: `sandboxTeamId` is the key's id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxEventBody {
    /// The event format's version (E2B's `v1`).
    pub version: String,
    pub id: String,
    /// `sandbox.lifecycle.created`, `.paused`, `.resumed`, `.updated`, `.checkpointed` or
    /// `.killed`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Details, such as an update's new deadline (`set_timeout`); `null` when there are none.
    pub event_data: Option<serde_json::Value>,
    pub sandbox_id: String,
    pub sandbox_template_id: String,
    pub sandbox_build_id: String,
    pub sandbox_team_id: String,
    /// RFC 3339, with microseconds.
    pub timestamp: String,
}
