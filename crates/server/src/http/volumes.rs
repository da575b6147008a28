//! Volumes as E2B's SDK drives them (`Volume.create/list/get_info/destroy`, and the volume's
//! file methods). Two APIs on one port:
//! - `/volumes`, behind the API key: a key sees and deletes only its own volumes;
//! - `/volumecontent/{id}/...`, behind the volume's own token (`Authorization: Bearer`), which
//!   the SDK reaches through `E2B_VOLUME_API_URL`.

use crate::http::auth::Caller;
use crate::http::error::ApiError;
use crate::AppState;
use airlock_core::store::VolumeRecord;
use airlock_core::volumes::{EntryKind, EntryStat, MetadataChange, VolumeError, VolumeTree};
use airlock_request::JsonBody;
use airlock_wire::volumes::{
    NewVolume, Volume, VolumeAndToken, VolumeEntryStat, VolumeMetadataPatch,
};
use axum::body::Body;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::SecondsFormat;
use futures::StreamExt;
use std::collections::HashMap;

fn with_token(v: VolumeRecord) -> VolumeAndToken {
    VolumeAndToken {
        volume_id: v.id,
        name: v.name,
        token: v.token,
    }
}

pub(crate) async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<NewVolume>,
) -> Result<(StatusCode, Json<VolumeAndToken>), ApiError> {
    let now = chrono::Utc::now().timestamp();
    let volume = state.volumes.create(&caller.0, &body.name, now).await?;
    tracing::info!(volume = %volume.id, name = %volume.name, "volume created");
    Ok((StatusCode::CREATED, Json(with_token(volume))))
}

pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<Volume>>, ApiError> {
    let volumes = state.volumes.list(&caller.0).await?;
    Ok(Json(
        volumes
            .into_iter()
            .map(|v| Volume {
                volume_id: v.id,
                name: v.name,
            })
            .collect(),
    ))
}

pub(crate) async fn info(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<VolumeAndToken>, ApiError> {
    Ok(Json(with_token(state.volumes.get(&caller.0, &id).await?)))
}

pub(crate) async fn destroy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.lifecycle.delete_volume(&caller.0, &id).await? {
        tracing::info!(volume = %id, "volume deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("volume '{id}' not found")))
    }
}

/// The volume named by the path, for a request that carries its token.
async fn tree(state: &AppState, id: &str, headers: &HeaderMap) -> Result<VolumeTree, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    Ok(state.volumes.open(id, token).await?)
}

/// Runs `work` on the files of the volume named by the path, for a request that carries its
/// token, off the async workers: a listing or a removal may walk a large tree.
async fn on_files<T: Send + 'static>(
    state: &AppState,
    id: &str,
    headers: &HeaderMap,
    work: impl FnOnce(VolumeTree) -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, ApiError> {
    let tree = tree(state, id, headers).await?;
    match tokio::task::spawn_blocking(move || work(tree)).await {
        Ok(done) => Ok(done?),
        Err(e) => {
            tracing::error!(error = %e, "a volume request's work failed");
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error; see the server log",
            ))
        }
    }
}

/// A content request's query: `path` is required; the rest are optional numbers and flags.
struct ContentQuery(HashMap<String, String>);

impl ContentQuery {
    fn path(&self) -> Result<String, ApiError> {
        self.0
            .get("path")
            .cloned()
            .ok_or_else(|| ApiError::bad_request("the query needs a path"))
    }

    fn number(&self, name: &str) -> Result<Option<u32>, ApiError> {
        self.0
            .get(name)
            .map(|v| {
                v.parse::<u32>().map_err(|_| {
                    ApiError::bad_request(format!("{name} must be a whole number, not {v:?}"))
                })
            })
            .transpose()
    }

    fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.0.get(name).map(String::as_str) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "{name} must be true or false, not {other:?}"
            ))),
        }
    }

    fn change(&self) -> Result<MetadataChange, ApiError> {
        Ok(MetadataChange {
            uid: self.number("uid")?,
            gid: self.number("gid")?,
            mode: self.number("mode")?,
        })
    }
}

fn shown(e: EntryStat) -> VolumeEntryStat {
    let time = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(SecondsFormat::Nanos, true);
    VolumeEntryStat {
        name: e.name,
        kind: match e.kind {
            EntryKind::File => "file",
            EntryKind::Directory => "directory",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "unknown",
        },
        path: e.path,
        size: e.size,
        mode: e.mode,
        uid: e.uid,
        gid: e.gid,
        atime: time(e.atime),
        mtime: time(e.mtime),
        ctime: time(e.ctime),
        target: e.target,
    }
}

pub(crate) async fn stat(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<VolumeEntryStat>, ApiError> {
    let path = ContentQuery(query).path()?;
    let entry = on_files(&state, &id, &headers, move |tree| tree.stat(&path)).await?;
    Ok(Json(shown(entry)))
}

pub(crate) async fn remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<StatusCode, ApiError> {
    let path = ContentQuery(query).path()?;
    on_files(&state, &id, &headers, move |tree| tree.remove(&path)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn update(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    JsonBody(patch): JsonBody<VolumeMetadataPatch>,
) -> Result<Json<VolumeEntryStat>, ApiError> {
    let path = ContentQuery(query).path()?;
    let change = MetadataChange {
        uid: patch.uid,
        gid: patch.gid,
        mode: patch.mode,
    };
    let entry = on_files(&state, &id, &headers, move |tree| {
        tree.update(&path, &change)
    })
    .await?;
    Ok(Json(shown(entry)))
}

pub(crate) async fn list_dir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Vec<VolumeEntryStat>>, ApiError> {
    let query = ContentQuery(query);
    let (path, depth) = (query.path()?, query.number("depth")?.unwrap_or(1));
    let entries = on_files(&state, &id, &headers, move |tree| tree.list(&path, depth)).await?;
    Ok(Json(entries.into_iter().map(shown).collect()))
}

pub(crate) async fn make_dir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<(StatusCode, Json<VolumeEntryStat>), ApiError> {
    let query = ContentQuery(query);
    let (path, change, parents) = (query.path()?, query.change()?, query.flag("force")?);
    let made = on_files(&state, &id, &headers, move |tree| {
        tree.make_dir(&path, &change, parents)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(shown(made))))
}

pub(crate) async fn read_file(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let query = ContentQuery(query);
    let file = tree(&state, &id, &headers).await?.read(&query.path()?)?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Writes the body to the file, whole or not at all: a body that breaks off or does not fit
/// the volume leaves what was there before.
pub(crate) async fn write_file(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: Body,
) -> Result<(StatusCode, Json<VolumeEntryStat>), ApiError> {
    let query = ContentQuery(query);
    let tree = tree(&state, &id, &headers).await?;
    let mut file = tree.new_file(&query.path()?, &query.change()?, query.flag("force")?)?;
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        if let Err(e) = file.write(&chunk) {
            // A client that sends its whole body before it reads the answer would otherwise
            // see the connection reset instead of why (a full volume).
            let mut unread = UNREAD_BODY_LIMIT;
            while let Some(Ok(chunk)) = chunks.next().await {
                unread = unread.saturating_sub(chunk.len());
                if unread == 0 {
                    break;
                }
            }
            return Err(e.into());
        }
    }
    Ok((StatusCode::CREATED, Json(shown(file.commit()?))))
}

/// How much of a refused upload's body is still read (and dropped) before the answer.
const UNREAD_BODY_LIMIT: usize = 256 << 20;
