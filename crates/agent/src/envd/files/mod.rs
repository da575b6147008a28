//! `GET /files` (download) and `POST /files` (upload), envd's plain-HTTP file transfer.
//!
//! These routes sit outside the token middleware: with an access token set, a request needs
//! either the `X-Access-Token` header or a signed URL (see `admit`). Errors are JSON
//! `{"code": <status>, "message": ...}`, which the SDK turns into its exceptions.
//!
//! Files stream both ways; nothing is held in memory whole (see `download` and `upload`).

mod admit;
mod download;
mod error;
mod upload;

use crate::config::Config;
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

pub fn routes(config: Arc<Config>) -> Router {
    Router::new()
        .route("/files", get(download::download).post(upload::upload))
        .with_state(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth;
    use admit::unix_now;
    use airlock_wire::envd::{InitRequest, UploadedEntry};
    use airlock_wire::signed_url::{signature, FileOperation};
    use axum::body::Body;
    use axum::http::{HeaderMap, Request, StatusCode};
    use http_body_util::BodyExt;
    use std::io::Write;
    use tower::ServiceExt;

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
