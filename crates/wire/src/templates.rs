//! E2B's template-build API (protocol doc §2.6), as the SDK's template builder calls it.

use serde::{Deserialize, Serialize};

/// `POST /v3/templates`. Older JS SDKs send `alias` where newer ones send `name`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildRequest {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub alias: Option<String>,
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    #[serde(default)]
    pub cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB")]
    pub memory_mb: Option<u32>,
}

/// The answer to [`TemplateBuildRequest`] (status 202; every field is required by the SDK).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildCreated {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub public: bool,
    pub names: Vec<String>,
    pub tags: Vec<String>,
    pub aliases: Vec<String>,
}

/// `POST /v2/templates/{id}/builds/{buildID}`: what to build.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildStart {
    #[serde(default)]
    pub from_image: Option<String>,
    #[serde(default)]
    pub from_template: Option<String>,
    #[serde(default)]
    pub from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    pub steps: Vec<TemplateStep>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub start_cmd: Option<String>,
    #[serde(default)]
    pub ready_cmd: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateStep {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub files_hash: Option<String>,
}

/// `GET /templates/{id}/builds/{buildID}/status`'s query.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatusQuery {
    #[serde(default)]
    pub logs_offset: Option<u64>,
    #[serde(default)]
    pub limit: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatusBody {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// `waiting`, `building`, `ready` or `error`.
    pub status: String,
    /// Deprecated by E2B, still required by the SDK: always empty.
    pub logs: Vec<String>,
    pub log_entries: Vec<BuildLogEntry>,
    /// Absent unless the build failed (the SDK cannot read `null` here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildFailureReason>,
}

/// `GET /templates/{id}/builds/{build}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildLogsBody {
    pub logs: Vec<BuildLogEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildLogEntry {
    /// ISO 8601.
    pub timestamp: String,
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildFailureReason {
    pub message: String,
    /// `base`, a 1-based step index, or `finalize`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// `GET /templates/aliases/{alias}`.
#[derive(Debug, Clone, Serialize)]
pub struct TemplateAlias {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub public: bool,
}

/// `GET /templates/{id}/files/{hash}` (status 201): whether the server has a `COPY`'s files,
/// and where to `PUT` them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateFileUpload {
    pub present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Sent with the upload as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<std::collections::BTreeMap<String, String>>,
}

/// A template in E2B's list and get answers (`Template`; every field is required by the SDK,
/// the nullable ones as `null`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateInfo {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The latest build's.
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    pub public: bool,
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
    pub created_by: Option<serde_json::Value>,
    pub last_spawned_at: Option<String>,
    pub spawn_count: u64,
    pub build_count: u64,
    pub envd_version: String,
    /// The latest build's status.
    pub build_status: String,
}

/// One build in `GET /templates/{id}`'s `builds`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildInfo {
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: String,
    pub created_at: String,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
}

/// `PATCH /templates/{id}` and `PATCH /v2/templates/{id}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TemplateUpdate {
    #[serde(default)]
    pub public: Option<bool>,
}

/// The answer of `PATCH /templates/{id}`: the names the template is reached by now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateUpdated {
    pub names: Vec<String>,
}

/// The answer of `PUT /uploads/{token}`: the bytes received.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadReceived {
    pub size: u64,
}

/// `GET /templates/{id}`: the template and its builds, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct TemplateWithBuilds {
    #[serde(flatten)]
    pub template: TemplateInfo,
    pub builds: Vec<TemplateBuildInfo>,
}

/// `POST /templates/tags`: point `tags` at the build that `target` (`name:tag`, or `name` for
/// its `default` tag) names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TagAssignment {
    pub target: String,
    pub tags: Vec<String>,
}

/// The answer to [`TagAssignment`] (status 201).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssignedTags {
    pub tags: Vec<String>,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// `DELETE /templates/tags`: take `tags` off the template `name`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TagRemoval {
    pub name: String,
    pub tags: Vec<String>,
}

/// One entry of `GET /templates/{id}/tags`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateTagInfo {
    pub tag: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub created_at: String,
}
