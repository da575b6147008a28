//! Volume bodies (E2B's `/volumes` and the volume content API, `/volumecontent/{id}/...`).

use serde::{Deserialize, Serialize};

/// `POST /volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NewVolume {
    pub name: String,
}

/// A volume in `GET /volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Volume {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
}

/// A volume with the token its content API wants (`POST /volumes`, `GET /volumes/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
    pub token: String,
}

/// An entry of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeEntryStat {
    pub name: String,
    /// `file`, `directory`, `symlink` or `unknown`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub path: String,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// RFC 3339.
    pub atime: String,
    pub mtime: String,
    pub ctime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// `PATCH /volumecontent/{id}/path`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMetadataPatch {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}
