//! `POST /files`: an upload, raw or multipart, plain or gzipped, streamed to disk.
//!
//! Uploads truncate and rewrite the destination in place, as envd does, so a directory watcher
//! sees the same CREATE, CHMOD, WRITE sequence the SDK's tests expect (a write-to-temp-and-rename
//! scheme would show a rename instead). A failed upload removes the partial file rather than
//! leave it truncated.

use super::admit::{admit, FilesQuery};
use super::error::{is_no_space, FilesError};
use crate::config::Config;
use crate::envd::filesystem::entry::ensure_dirs;
use crate::envd::filesystem::metadata::{self, Metadata};
use crate::users::User;
use airlock_wire::envd::UploadedEntry;
use airlock_wire::signed_url::FileOperation;
use async_compression::tokio::bufread::GzipDecoder;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::TryStreamExt;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::io::{ReaderStream, StreamReader};

/// Upload data is collected up to this much before each write.
const UPLOAD_BUFFER: usize = 1024 * 1024;

type UploadReader<'a> = Pin<Box<dyn AsyncRead + Send + 'a>>;

/// After a failed upload, how much more of the body is read (and dropped) so the client can
/// finish sending and read the error. A connection closed with unread bytes is reset, and the
/// reset would destroy the error response before the client sees it. An upload that was not
/// even admitted gets only [`REFUSED_DRAIN`]: nobody may make the agent read a gigabyte for
/// nothing.
const MAX_DRAIN: u64 = 1024 * 1024 * 1024;
const REFUSED_DRAIN: u64 = 64 * 1024;

pub(super) async fn upload(
    State(config): State<Arc<Config>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut data = body.into_data_stream();
    let (result, drain) = match admit(&config, &uri, &headers, FileOperation::Write) {
        Ok((query, user)) => (receive(&query, &user, &headers, &mut data).await, MAX_DRAIN),
        Err(refused) => (Err(refused), REFUSED_DRAIN),
    };
    match result {
        Ok(uploaded) => uploaded.into_response(),
        Err(e) => {
            let mut drained = 0u64;
            while drained < drain {
                match futures::StreamExt::next(&mut data).await {
                    Some(Ok(chunk)) => drained += chunk.len() as u64,
                    _ => break,
                }
            }
            let mut response = e.into_response();
            if drained >= drain {
                // The rest stays unread: say so, rather than leave the client guessing.
                response.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            response
        }
    }
}

async fn receive(
    query: &FilesQuery,
    user: &User,
    headers: &HeaderMap,
    data: &mut axum::body::BodyDataStream,
) -> Result<Json<Vec<UploadedEntry>>, FilesError> {
    let gzip = match headers.get(header::CONTENT_ENCODING).map(|v| v.to_str()) {
        None => false,
        Some(Ok(v)) => match v
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "" | "identity" => false,
            "gzip" => true,
            other => {
                return Err(FilesError::bad_request(format!(
                    "unsupported Content-Encoding: {other}, supported: [gzip]"
                )))
            }
        },
        Some(Err(_)) => return Err(FilesError::bad_request("malformed Content-Encoding")),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let media_type = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    // Bounds each file's size for the disk-space pre-check: multipart framing only adds to it.
    // (A gzip body is smaller than what it unpacks to; then the check only catches the worst.)
    let size_hint = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());

    let metadata = metadata::from_headers(headers).map_err(FilesError::bad_request)?;

    let raw = StreamReader::new(data.map_err(io::Error::other));
    let reader: UploadReader<'_> = if gzip {
        let mut decoder = GzipDecoder::new(raw);
        decoder.multiple_members(true);
        Box::pin(decoder)
    } else {
        Box::pin(raw)
    };

    let uploaded = if media_type == "application/octet-stream" {
        let Some(path) = query.path.as_deref() else {
            return Err(FilesError::bad_request(
                "path query parameter is required for raw body upload",
            ));
        };
        let dest = user.resolve(path)?;
        write_file(&dest, reader, user, size_hint, &metadata).await?;
        vec![uploaded_entry(&dest)]
    } else if media_type.starts_with("multipart/") {
        let boundary = multer::parse_boundary(content_type)
            .map_err(|e| FilesError::bad_request(format!("invalid multipart request: {e}")))?;
        receive_parts(reader, boundary, query, user, size_hint, &metadata).await?
    } else {
        return Err(FilesError::bad_request(format!(
            "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
        )));
    };
    Ok(Json(uploaded))
}

/// Writes each `file` part to its destination: the query's `path` if given, else the part's
/// filename. Other parts are skipped.
async fn receive_parts(
    reader: UploadReader<'_>,
    boundary: String,
    query: &FilesQuery,
    user: &User,
    size_hint: Option<u64>,
    metadata: &Metadata,
) -> Result<Vec<UploadedEntry>, FilesError> {
    let mut multipart = multer::Multipart::new(ReaderStream::new(reader), boundary);
    let mut uploaded = Vec::new();
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| FilesError::bad_request(format!("malformed multipart body: {e}")))?
    {
        if field.name() != Some("file") {
            continue;
        }
        let target = match query.path.as_deref().or(field.file_name()) {
            Some(target) => target.to_owned(),
            None => return Err(FilesError::bad_request("file part has no filename")),
        };
        let dest = user.resolve(&target)?;
        ensure_new_destination(&uploaded, &dest)?;
        let data = StreamReader::new(field.map_err(io::Error::other));
        write_file(&dest, data, user, size_hint, metadata).await?;
        uploaded.push(uploaded_entry(&dest));
    }
    Ok(uploaded)
}

/// One request may not write the same file twice.
fn ensure_new_destination(uploaded: &[UploadedEntry], dest: &Path) -> Result<(), FilesError> {
    let dest = dest.to_string_lossy();
    if uploaded.iter().any(|u| u.path == dest) {
        return Err(FilesError::bad_request(format!(
            "you cannot upload multiple files to the same path '{dest}' in one upload request"
        )));
    }
    Ok(())
}

fn uploaded_entry(dest: &Path) -> UploadedEntry {
    UploadedEntry {
        name: dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        kind: "file".into(),
        path: dest.to_string_lossy().into_owned(),
        // Read back, so the answer never claims what the filesystem did not keep.
        metadata: metadata::read(dest),
    }
}

/// Streams `data` into `dest`, creating it (0644) or truncating it, owned by `user`, with
/// `metadata` as its whole metadata; parent directories are created for the user. Removes the
/// file again if the upload fails.
async fn write_file<R: AsyncRead + Unpin>(
    dest: &Path,
    mut data: R,
    user: &User,
    size_hint: Option<u64>,
    metadata: &Metadata,
) -> Result<(), FilesError> {
    let (uid, gid) = (user.uid, user.gid);
    let target = dest.to_path_buf();
    tokio::task::spawn_blocking(move || prepare_destination(&target, uid, gid, size_hint))
        .await
        .map_err(|e| {
            FilesError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("upload task failed: {e}"),
            )
        })??;

    // Creating and truncating separately: O_TRUNC on a brand-new file can read as an extra
    // WRITE to watchers on some kernels.
    let opened = match tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(dest)
        .await
    {
        // Also reached for a dangling symlink, whose target O_CREAT then creates (as envd's).
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            tokio::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(dest)
                .await
        }
        other => other,
    };
    let mut file = opened.map_err(|e| match is_no_space(&e) {
        true => FilesError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("not enough inodes available: {}: {e}", dest.display()),
        ),
        false => FilesError::io(&e, dest),
    })?;

    let written = match std::os::unix::fs::fchown(&file, Some(uid), Some(gid)) {
        Ok(()) => copy_into(&mut data, &mut file).await,
        Err(e) => Err(CopyError::Write(e)),
    };
    let file = file.into_std().await;
    let written =
        written.and_then(|()| metadata::replace(&file, metadata).map_err(CopyError::Write));
    drop(file);
    let failure = match written {
        Ok(()) => return Ok(()),
        Err(CopyError::Read(e)) => {
            FilesError::bad_request(format!("error reading upload for {}: {e}", dest.display()))
        }
        Err(CopyError::Write(e)) if is_no_space(&e) => FilesError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!(
                "not enough disk space available: writing {}: {e}",
                dest.display()
            ),
        ),
        Err(CopyError::Write(e)) => FilesError::io(&e, dest),
    };
    if let Err(e) = tokio::fs::remove_file(dest).await {
        tracing::warn!(path = %dest.display(), "cannot remove partial upload: {e}");
    }
    Err(failure)
}

/// Creates the parent directories, refuses directories as targets and, when the size is known
/// up front, refuses uploads that cannot fit.
fn prepare_destination(
    dest: &Path,
    uid: u32,
    gid: u32,
    size_hint: Option<u64>,
) -> Result<(), FilesError> {
    let shown = dest.display();
    let Some(parent) = dest.parent() else {
        return Err(FilesError::bad_request(format!(
            "path '{shown}' is a directory"
        )));
    };
    ensure_dirs(parent, uid, gid).map_err(|e| FilesError::io(&e, parent))?;
    let existing = match std::fs::metadata(dest) {
        Ok(md) if md.is_dir() => {
            return Err(FilesError::bad_request(format!(
                "path '{shown}' is a directory"
            )))
        }
        Ok(md) => md.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(FilesError::io(&e, dest)),
    };
    if let (Some(needed), Some(free)) = (size_hint, available_bytes(parent)) {
        // Overwriting frees the old contents first.
        if needed > free.saturating_add(existing) {
            return Err(FilesError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                format!(
                    "not enough disk space available: attempted to write {needed} bytes to {shown}, {free} bytes free"
                ),
            ));
        }
    }
    Ok(())
}

/// Bytes an unprivileged writer could still use on `dir`'s filesystem, if it can be told.
fn available_bytes(dir: &Path) -> Option<u64> {
    let stats = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(
        stats
            .blocks_available()
            .saturating_mul(stats.fragment_size()),
    )
}

enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

/// Copies `data` into `file`, gathering up to [`UPLOAD_BUFFER`] bytes per write.
async fn copy_into<R: AsyncRead + Unpin>(
    data: &mut R,
    file: &mut tokio::fs::File,
) -> Result<(), CopyError> {
    let mut buf = vec![0u8; UPLOAD_BUFFER];
    loop {
        let mut filled = 0;
        let mut at_end = false;
        while filled < buf.len() {
            match data.read(&mut buf[filled..]).await {
                Ok(0) => {
                    at_end = true;
                    break;
                }
                Ok(n) => filled += n,
                Err(e) => return Err(CopyError::Read(e)),
            }
        }
        if filled > 0 {
            file.write_all(&buf[..filled])
                .await
                .map_err(CopyError::Write)?;
        }
        if at_end {
            // tokio writes in the background: flushing surfaces the last write's error.
            return file.flush().await.map_err(CopyError::Write);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_destinations_are_refused() {
        let first = uploaded_entry(Path::new("/tmp/a"));
        assert_eq!((first.name.as_str(), first.kind.as_str()), ("a", "file"));
        assert!(ensure_new_destination(std::slice::from_ref(&first), Path::new("/tmp/b")).is_ok());
        let err = ensure_new_destination(&[first], Path::new("/tmp/a")).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
    }
}
