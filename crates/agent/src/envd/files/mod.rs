//! `GET /files` (download) and `POST /files` (upload), envd's plain-HTTP file transfer.
//!
//! These routes sit outside the token middleware: with an access token set, a request needs
//! either the `X-Access-Token` header or a signed URL (see [`signature`]). Errors are JSON
//! `{"code": <status>, "message": ...}`, which the SDK turns into its exceptions.
//!
//! Files stream both ways; nothing is held in memory whole. Uploads truncate and rewrite the
//! destination in place, as envd does, so a directory watcher sees the same CREATE, CHMOD, WRITE
//! sequence the SDK's tests expect (a write-to-temp-and-rename scheme would show a rename
//! instead). A failed upload removes the partial file rather than leave it truncated.

use crate::auth;
use crate::config::Config;
use crate::envd::filesystem::ensure_dirs;
use crate::envd::filesystem::metadata::{self, Metadata};
use crate::rpc::RpcError;
use crate::users::User;
use airlock_wire::envd::UploadedEntry;
use airlock_wire::signed_url::{signature, FileOperation};
use async_compression::tokio::bufread::{GzipDecoder, GzipEncoder};
use async_compression::Level;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::TryStreamExt;
use serde::Deserialize;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};

/// Upload data is collected up to this much before each write.
const UPLOAD_BUFFER: usize = 1024 * 1024;
/// Download chunk size.
const DOWNLOAD_CHUNK: usize = 256 * 1024;
/// Bytes looked at to tell text from binary when the extension says nothing.
const SNIFF_LEN: u64 = 512;

pub fn routes(config: Arc<Config>) -> Router {
    Router::new()
        .route("/files", get(download).post(upload))
        .with_state(config)
}

#[derive(Debug, Default, Deserialize)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<String>,
}

/// A `/files` failure, answered as `{"code": <status>, "message": ...}`.
#[derive(Debug)]
struct FilesError {
    status: StatusCode,
    message: String,
}

impl FilesError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        FilesError {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn io(err: &io::Error, path: &Path) -> Self {
        let status = if is_no_space(err) {
            StatusCode::INSUFFICIENT_STORAGE
        } else if err.raw_os_error() == Some(libc::ENAMETOOLONG) {
            StatusCode::BAD_REQUEST
        } else {
            match err.kind() {
                io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
                io::ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
                io::ErrorKind::NotADirectory
                | io::ErrorKind::IsADirectory
                | io::ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            }
        };
        Self::new(status, format!("{}: {err}", path.display()))
    }

    fn unauthorized(message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
}

impl From<RpcError> for FilesError {
    fn from(err: RpcError) -> Self {
        let status = StatusCode::from_u16(err.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        FilesError::new(status, err.0.message)
    }
}

impl IntoResponse for FilesError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

fn is_no_space(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::StorageFull
        || matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

// ---------------------------------------------------------------- authorization

/// With a sandbox token, accepts a matching `X-Access-Token` header or else a valid, unexpired
/// signature (envd's order: a header that is present but wrong fails outright).
fn authorize(
    token: Option<&str>,
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: FileOperation,
    now: i64,
) -> Result<(), FilesError> {
    let Some(token) = token else {
        return Ok(());
    };
    if headers.contains_key(airlock_wire::ACCESS_TOKEN_HEADER) {
        return match auth::header_token_ok(headers, Some(token)) {
            true => Ok(()),
            false => Err(FilesError::unauthorized(auth::UNAUTHORIZED_MESSAGE)),
        };
    }
    let Some(given) = query.signature.as_deref() else {
        return Err(FilesError::unauthorized(auth::UNAUTHORIZED_MESSAGE));
    };
    let expiration = query
        .signature_expiration
        .as_deref()
        .map(|e| {
            e.trim()
                .parse::<i64>()
                .map_err(|_| FilesError::bad_request("signature_expiration must be a unix time"))
        })
        .transpose()?;
    let expected = signature(
        query.path.as_deref().unwrap_or_default(),
        operation,
        query.username.as_deref().unwrap_or_default(),
        token,
        query.signature_expiration.as_deref(),
    );
    if !auth::tokens_match(given.as_bytes(), expected.as_bytes()) {
        return Err(FilesError::unauthorized(auth::UNAUTHORIZED_MESSAGE));
    }
    if expiration.is_some_and(|e| e < now) {
        return Err(FilesError::unauthorized("signature is already expired"));
    }
    Ok(())
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Parses the query, authorizes the request and finds its user.
fn admit(
    config: &Config,
    uri: &Uri,
    headers: &HeaderMap,
    operation: FileOperation,
) -> Result<(FilesQuery, User), FilesError> {
    let Query(query) = Query::<FilesQuery>::try_from_uri(uri)
        .map_err(|e| FilesError::bad_request(format!("invalid query: {e}")))?;
    let token = config.current().access_token;
    authorize(token.as_deref(), headers, &query, operation, unix_now())?;
    // An unknown user is `unauthenticated`, hence 401.
    let user = config.named_user(query.username.as_deref())?;
    Ok((query, user))
}

// ---------------------------------------------------------------- download

async fn download(State(config): State<Arc<Config>>, uri: Uri, headers: HeaderMap) -> Response {
    serve_file(&config, &uri, &headers)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn serve_file(
    config: &Config,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, FilesError> {
    let (query, user) = admit(config, uri, headers, FileOperation::Read)?;
    let path = user.resolve(query.path.as_deref().unwrap_or_default())?;
    let shown = path.display();
    let md = match tokio::fs::metadata(&path).await {
        Ok(md) => md,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(FilesError::new(
                StatusCode::NOT_FOUND,
                format!("path '{shown}' does not exist"),
            ))
        }
        Err(e) => return Err(FilesError::io(&e, &path)),
    };
    if md.is_dir() {
        return Err(FilesError::bad_request(format!(
            "path '{shown}' is a directory"
        )));
    }
    if !md.is_file() {
        // Devices and FIFOs could stream forever or block.
        return Err(FilesError::bad_request(format!(
            "path '{shown}' is not a regular file"
        )));
    }
    let accept = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok());
    let gzip = negotiate_gzip(accept).ok_or_else(|| {
        FilesError::new(
            StatusCode::NOT_ACCEPTABLE,
            "no acceptable encoding found, supported: [gzip]",
        )
    })?;

    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| FilesError::io(&e, &path))?;
    let len = file
        .metadata()
        .await
        .map_err(|e| FilesError::io(&e, &path))?
        .len();
    let content_type = match content_type_for(&path) {
        Some(known) => known,
        None => sniff_content_type(&mut file)
            .await
            .map_err(|e| FilesError::io(&e, &path))?,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let response = Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_DISPOSITION, content_disposition(&name))
        .header(header::VARY, "Accept-Encoding");
    // `take`: a file that grows meanwhile must not overrun the announced length.
    let data = file.take(len);
    let response = if gzip {
        let encoder = GzipEncoder::with_quality(BufReader::new(data), Level::Fastest);
        response
            .header(header::CONTENT_ENCODING, "gzip")
            .body(Body::from_stream(ReaderStream::with_capacity(
                encoder,
                DOWNLOAD_CHUNK,
            )))
    } else {
        response
            .header(header::CONTENT_LENGTH, len)
            .body(Body::from_stream(ReaderStream::with_capacity(
                data,
                DOWNLOAD_CHUNK,
            )))
    };
    response.map_err(|e| {
        FilesError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("building response: {e}"),
        )
    })
}

/// Whether to gzip the response, per `Accept-Encoding`. `None` when nothing acceptable is left.
///
/// Identity is acceptable unless refused with `q=0`, and it is what a client gets unless it asks
/// for gzip alone (the SDKs' `gzip=True` sends `Accept-Encoding: gzip`). HTTP libraries list
/// every coding they can decode on every request (httpx: `gzip, deflate`), and decoding on the
/// client is the slow part: the Python SDK read a 100 MiB file at 25 MiB/s gzipped and at
/// 136 MiB/s as is (`bench/run.sh transfer`).
fn negotiate_gzip(accept: Option<&str>) -> Option<bool> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(false);
    };
    let offers: Vec<(String, f32)> = accept
        .split(',')
        .map(|offer| {
            let mut parts = offer.split(';');
            let coding = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            let quality = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            (coding, quality)
        })
        .collect();
    let quality_of = |name: &str| offers.iter().find(|(c, _)| c == name).map(|(_, q)| *q);
    let wanted: Vec<&str> = offers
        .iter()
        .filter(|(c, q)| *q > 0.0 && c != "identity")
        .map(|(c, _)| c.as_str())
        .collect();
    let gzip_acceptable = wanted.iter().any(|c| *c == "gzip" || *c == "*");
    if quality_of("identity") == Some(0.0) {
        return gzip_acceptable.then_some(true);
    }
    let gzip_alone = wanted == ["gzip"];
    let gzip_first = quality_of("gzip").unwrap_or(0.0) >= quality_of("identity").unwrap_or(0.0);
    Some(gzip_alone && gzip_first)
}

/// The Content-Type for the file's extension, if it has a known one.
fn content_type_for(path: &Path) -> Option<String> {
    let mime = mime_guess::from_path(path).first()?;
    Some(if mime.type_() == mime_guess::mime::TEXT {
        format!("{}; charset=utf-8", mime.essence_str())
    } else {
        mime.essence_str().to_owned()
    })
}

/// Text or binary, from the first bytes (Go's `http.ServeContent` sniffs the same way), then
/// rewinds the file.
async fn sniff_content_type(file: &mut tokio::fs::File) -> io::Result<String> {
    let mut head = Vec::with_capacity(SNIFF_LEN as usize);
    (&mut *file).take(SNIFF_LEN).read_to_end(&mut head).await?;
    file.rewind().await?;
    Ok(if looks_like_text(&head) {
        "text/plain; charset=utf-8".into()
    } else {
        "application/octet-stream".into()
    })
}

/// UTF-8 without the control bytes Go's sniffer treats as binary; a multi-byte character cut
/// off at the end of the sample doesn't count against it.
fn looks_like_text(head: &[u8]) -> bool {
    let binary = |b: &u8| matches!(b, 0x00..=0x08 | 0x0b | 0x0e..=0x1a | 0x1c..=0x1f);
    if head.iter().any(binary) {
        return false;
    }
    match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    }
}

/// `inline; filename=...` the way Go's `mime.FormatMediaType` writes it: bare when the name is
/// a token, quoted when it is other printable ASCII, RFC 2231-encoded otherwise.
fn content_disposition(name: &str) -> String {
    const SPECIALS: &[u8] = b"()<>@,;:\\\"/[]?= ";
    let is_token = |b: u8| b.is_ascii_graphic() && !SPECIALS.contains(&b);
    if !name.is_empty() && name.bytes().all(is_token) {
        return format!("inline; filename={name}");
    }
    if name.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
        return format!("inline; filename=\"{escaped}\"");
    }
    let encoded: String = name
        .bytes()
        .map(|b| {
            if is_token(b) && !matches!(b, b'*' | b'\'' | b'%') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("inline; filename*=utf-8''{encoded}")
}

// ---------------------------------------------------------------- upload

type UploadReader<'a> = Pin<Box<dyn AsyncRead + Send + 'a>>;

/// After a failed upload, how much more of the body is read (and dropped) so the client can
/// finish sending and read the error. A connection closed with unread bytes is reset, and the
/// reset would destroy the error response before the client sees it. An upload that was not
/// even admitted gets only [`REFUSED_DRAIN`]: nobody may make the agent read a gigabyte for
/// nothing.
const MAX_DRAIN: u64 = 1024 * 1024 * 1024;
const REFUSED_DRAIN: u64 = 64 * 1024;

async fn upload(
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
    use airlock_wire::envd::InitRequest;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use std::io::Write;
    use tower::ServiceExt;

    fn query(
        path: &str,
        username: Option<&str>,
        sig: Option<&str>,
        exp: Option<i64>,
    ) -> FilesQuery {
        FilesQuery {
            path: Some(path.into()),
            username: username.map(Into::into),
            signature: sig.map(Into::into),
            signature_expiration: exp.map(|e| e.to_string()),
        }
    }

    #[test]
    fn authorization_rules() {
        let none = HeaderMap::new();
        let unsigned = query("a.txt", None, None, None);
        assert!(authorize(None, &none, &unsigned, FileOperation::Read, 0).is_ok());
        let err = authorize(Some("tok"), &none, &unsigned, FileOperation::Read, 0).unwrap_err();
        assert_eq!(
            (err.status, err.message.as_str()),
            (StatusCode::UNAUTHORIZED, auth::UNAUTHORIZED_MESSAGE)
        );

        let mut good = HeaderMap::new();
        good.insert("x-access-token", "tok".parse().unwrap());
        assert!(authorize(Some("tok"), &good, &unsigned, FileOperation::Read, 0).is_ok());

        let sig = signature("a.txt", FileOperation::Write, "", "tok", None);
        let signed = query("a.txt", None, Some(&sig), None);
        assert!(authorize(Some("tok"), &none, &signed, FileOperation::Write, 0).is_ok());
        // Signed for writing, not reading; and a wrong header beats a good signature.
        assert!(authorize(Some("tok"), &none, &signed, FileOperation::Read, 0).is_err());
        let mut bad = HeaderMap::new();
        bad.insert("x-access-token", "nope".parse().unwrap());
        assert!(authorize(Some("tok"), &bad, &signed, FileOperation::Write, 0).is_err());

        let sig = signature("a.txt", FileOperation::Read, "root", "tok", Some("100"));
        let expiring = query("a.txt", Some("root"), Some(&sig), Some(100));
        assert!(authorize(Some("tok"), &none, &expiring, FileOperation::Read, 100).is_ok());
        let err = authorize(Some("tok"), &none, &expiring, FileOperation::Read, 101).unwrap_err();
        assert_eq!(err.message, "signature is already expired");
        let err = authorize(
            Some("tok"),
            &none,
            &query("b.txt", Some("root"), Some(&sig), Some(100)),
            FileOperation::Read,
            0,
        )
        .unwrap_err();
        assert_eq!(err.message, auth::UNAUTHORIZED_MESSAGE);
    }

    #[test]
    fn encoding_negotiation() {
        assert_eq!(negotiate_gzip(None), Some(false));
        assert_eq!(negotiate_gzip(Some("gzip")), Some(true));
        assert_eq!(negotiate_gzip(Some("gzip;q=1, identity;q=0.5")), Some(true));
        // A library's list of everything it can decode is not a request for gzip.
        assert_eq!(negotiate_gzip(Some("gzip, deflate")), Some(false));
        assert_eq!(negotiate_gzip(Some("gzip, deflate, br, zstd")), Some(false));
        assert_eq!(negotiate_gzip(Some("*")), Some(false));
        assert_eq!(negotiate_gzip(Some("br")), Some(false));
        assert_eq!(
            negotiate_gzip(Some("identity;q=1, gzip;q=0.5")),
            Some(false)
        );
        assert_eq!(negotiate_gzip(Some("gzip;q=0")), Some(false));
        assert_eq!(negotiate_gzip(Some("br, identity;q=0")), None);
        assert_eq!(negotiate_gzip(Some("*, identity;q=0")), Some(true));
        assert_eq!(
            negotiate_gzip(Some("gzip, deflate, identity;q=0")),
            Some(true)
        );
    }

    #[test]
    fn dispositions_and_types() {
        assert_eq!(content_disposition("a.txt"), "inline; filename=a.txt");
        assert_eq!(
            content_disposition("a b\"c.txt"),
            "inline; filename=\"a b\\\"c.txt\""
        );
        assert_eq!(
            content_disposition("é.txt"),
            "inline; filename*=utf-8''%C3%A9.txt"
        );
        assert_eq!(
            content_type_for(Path::new("/x/a.txt")).as_deref(),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(
            content_type_for(Path::new("/x/a.png")).as_deref(),
            Some("image/png")
        );
        assert_eq!(content_type_for(Path::new("/x/noext")), None);
        assert!(looks_like_text(b"hello\n"));
        assert!(looks_like_text(&"é".as_bytes()[..1]));
        assert!(!looks_like_text(b"\x00\x01binary"));
        assert!(!looks_like_text(b"\xff\xfe\xfd"));
    }

    #[test]
    fn duplicate_destinations_are_refused() {
        let first = uploaded_entry(Path::new("/tmp/a"));
        assert_eq!((first.name.as_str(), first.kind.as_str()), ("a", "file"));
        assert!(ensure_new_destination(std::slice::from_ref(&first), Path::new("/tmp/b")).is_ok());
        let err = ensure_new_destination(&[first], Path::new("/tmp/a")).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
    }

    async fn send(app: &Router, req: Request<Body>) -> (StatusCode, HeaderMap, Vec<u8>) {
        let resp = app.clone().oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        (
            parts.status,
            parts.headers,
            body.collect().await.unwrap().to_bytes().to_vec(),
        )
    }

    fn enc(s: &str) -> String {
        s.bytes()
            .map(
                |b| match b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    true => char::from(b).to_string(),
                    false => format!("%{b:02X}"),
                },
            )
            .collect()
    }

    #[tokio::test]
    async fn upload_and_download_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let app = routes(Arc::default());
        let a = tmp.path().join("new/dir/a.txt");
        let b = tmp.path().join("b.bin");

        // Multipart with two files (no ?path=), parents created on the way.
        let body = format!(
            "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\n\r\n\x00\x01\r\n--XX--\r\n",
            a.display(),
            b.display()
        );
        let req = Request::post("/files?username=root")
            .header("content-type", "multipart/form-data; boundary=XX")
            .body(Body::from(body.clone()))
            .unwrap();
        let (status, _, resp) = send(&app, req).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        let entries: Vec<UploadedEntry> = serde_json::from_slice(&resp).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].path, a.to_string_lossy());
        assert_eq!(std::fs::read(&a).unwrap(), b"hello");
        assert_eq!(std::fs::read(&b).unwrap(), b"\x00\x01");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
            0o644
        );

        // The same two parts forced onto one ?path= collide.
        let req = Request::post(format!(
            "/files?username=root&path={}",
            enc(&a.to_string_lossy())
        ))
        .header("content-type", "multipart/form-data; boundary=XX")
        .body(Body::from(body))
        .unwrap();
        let (status, _, _) = send(&app, req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);

        // Raw gzip body overwrites.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"compressed contents").unwrap();
        let req = Request::post(format!(
            "/files?username=root&path={}",
            enc(&a.to_string_lossy())
        ))
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(Body::from(gz.finish().unwrap()))
        .unwrap();
        let (status, _, _) = send(&app, req).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(std::fs::read(&a).unwrap(), b"compressed contents");

        // Download plain and gzipped.
        let uri = format!("/files?username=root&path={}", enc(&a.to_string_lossy()));
        let (status, headers, data) =
            send(&app, Request::get(&uri).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(data, b"compressed contents");
        assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
        assert_eq!(headers["content-length"], "19");
        assert_eq!(headers["content-disposition"], "inline; filename=a.txt");
        let req = Request::get(&uri)
            .header("accept-encoding", "gzip")
            .body(Body::empty())
            .unwrap();
        let (status, headers, data) = send(&app, req).await;
        assert_eq!(
            (status, &headers["content-encoding"]),
            (StatusCode::OK, &"gzip".parse().unwrap())
        );
        let mut plain = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&data[..]), &mut plain)
            .unwrap();
        assert_eq!(plain, "compressed contents");

        // Errors: missing, directory, bad content type, unknown user.
        let missing = format!(
            "/files?username=root&path={}",
            enc(&tmp.path().join("nope").to_string_lossy())
        );
        let (status, _, data) =
            send(&app, Request::get(&missing).body(Body::empty()).unwrap()).await;
        let body: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(
            (status, body["code"].as_u64()),
            (StatusCode::NOT_FOUND, Some(404))
        );
        let dir = format!(
            "/files?username=root&path={}",
            enc(&tmp.path().to_string_lossy())
        );
        let (status, _, _) = send(&app, Request::get(&dir).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let req = Request::post(&dir)
            .header("content-type", "application/octet-stream")
            .body(Body::from("x"))
            .unwrap();
        let (status, _, _) = send(&app, req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let req = Request::post(&uri)
            .header("content-type", "text/plain")
            .body(Body::from("x"))
            .unwrap();
        let (status, _, _) = send(&app, req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _, _) = send(
            &app,
            Request::get("/files?username=no-such-user&path=x")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn token_or_signature_required() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("s.txt");
        std::fs::write(&file, b"secret").unwrap();
        let config = Arc::new(Config::default());
        config
            .apply_init(InitRequest {
                access_token: Some("tok".into()),
                ..Default::default()
            })
            .unwrap();
        let app = routes(config);
        let path = file.to_string_lossy().into_owned();

        let plain = format!("/files?username=root&path={}", enc(&path));
        let (status, _, data) = send(&app, Request::get(&plain).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let body: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"code": 401, "message": auth::UNAUTHORIZED_MESSAGE})
        );

        let req = Request::get(&plain)
            .header("x-access-token", "tok")
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&app, req).await.0, StatusCode::OK);

        let sig = signature(&path, FileOperation::Read, "root", "tok", None);
        let signed = format!("{plain}&signature={}", enc(&sig));
        let (status, _, data) =
            send(&app, Request::get(&signed).body(Body::empty()).unwrap()).await;
        assert_eq!((status, data.as_slice()), (StatusCode::OK, &b"secret"[..]));

        let past = unix_now() - 120;
        let sig = signature(
            &path,
            FileOperation::Read,
            "root",
            "tok",
            Some(&past.to_string()),
        );
        let expired = format!(
            "{plain}&signature={}&signature_expiration={past}",
            enc(&sig)
        );
        let (status, _, data) =
            send(&app, Request::get(&expired).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            data,
            br#"{"code":401,"message":"signature is already expired"}"#
        );
    }
}
