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

/// `POST /events/webhooks` (E2B's): where to send which events, signed with what.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NewWebhook {
    /// Free text; empty if none is given.
    #[serde(default)]
    pub name: String,
    pub url: String,
    /// Whether events are sent (true if not given).
    pub enabled: Option<bool>,
    /// Event types (`sandbox.lifecycle.*`); at least one.
    pub events: Vec<String>,
    /// What every delivery's `e2b-signature` is made with. Never shown again.
    pub signature_secret: String,
}

/// `PATCH /events/webhooks/{id}`: the fields given replace the webhook's.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WebhookPatch {
    pub name: Option<String>,
    pub url: Option<String>,
    pub enabled: Option<bool>,
    pub events: Option<Vec<String>>,
    pub signature_secret: Option<String>,
}

/// A webhook as the API shows it: everything but its secret.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WebhookBody {
    pub id: String,
    /// The id of the API key that registered it (E2B's team).
    pub team_id: String,
    pub name: String,
    /// RFC 3339.
    pub created_at: String,
    pub enabled: bool,
    pub url: String,
    pub events: Vec<String>,
}
