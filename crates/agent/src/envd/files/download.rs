//! `GET /files`: a download, streamed, gzipped when the client asks for gzip alone.

use super::admit::admit;
use super::error::FilesError;
use crate::config::Config;
use airlock_wire::signed_url::FileOperation;
use async_compression::tokio::bufread::GzipEncoder;
use async_compression::Level;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use std::io;
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncSeekExt, BufReader};
use tokio_util::io::ReaderStream;

/// Download chunk size.
const DOWNLOAD_CHUNK: usize = 256 * 1024;
/// Most of a file of no size (a pseudo-file) that a download reads.
const PSEUDO_FILE_CAP: u64 = 16 << 20;
/// Files up to this size are read whole before they are sent (see `download`).
const WHOLE_FILE_MAX: u64 = 1 << 20;
/// Bytes looked at to tell text from binary when the extension says nothing.
const SNIFF_LEN: u64 = 512;

pub(super) async fn download(
    State(config): State<Arc<Config>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
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
    // Pseudo-files (`/proc/sys/kernel/random/boot_id`, `/sys/...`) say they are empty and are
    // not: a file of no size is streamed to its end, up to a cap and with no length announced,
    // as E2B's envd reads it. A small file is read whole first and sent as read: one that a
    // process rewrites meanwhile (`echo n > f` empties it first) must not come out shorter
    // than the length announced. A bigger one is sent as long as it was when opened (`take`:
    // one that grows meanwhile must not overrun the announced length).
    let (data, length): (Box<dyn tokio::io::AsyncRead + Send + Unpin>, _) = if len == 0 {
        (Box::new(file.take(PSEUDO_FILE_CAP)), None)
    } else if len <= WHOLE_FILE_MAX {
        let mut whole = Vec::with_capacity(len as usize);
        file.take(len)
            .read_to_end(&mut whole)
            .await
            .map_err(|e| FilesError::io(&e, &path))?;
        let read = whole.len() as u64;
        (Box::new(io::Cursor::new(whole)), Some(read))
    } else {
        (Box::new(file.take(len)), Some(len))
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let response = Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_DISPOSITION, content_disposition(&name))
        .header(header::VARY, "Accept-Encoding");
    let response = if gzip {
        let encoder = GzipEncoder::with_quality(BufReader::new(data), Level::Fastest);
        response
            .header(header::CONTENT_ENCODING, "gzip")
            .body(Body::from_stream(ReaderStream::with_capacity(
                encoder,
                DOWNLOAD_CHUNK,
            )))
    } else {
        let response = match length {
            Some(len) => response.header(header::CONTENT_LENGTH, len),
            None => response,
        };
        response.body(Body::from_stream(ReaderStream::with_capacity(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
