//! `filesystem.Filesystem`: the unary RPCs Stat, MakeDir, Move, ListDir and Remove, and the
//! directory watchers (`watch`).
//!
//! Everything runs as the agent (root inside the sandbox); the request's user only decides how
//! paths resolve and who owns what gets created. Entries are described the way envd describes
//! them (Go `FileMode` strings, permission bits only in `mode`), because the SDK's tests assert
//! those exact values. The entry builder and [`ensure_dirs`](entry::ensure_dirs) (`entry`) are
//! shared with `watch` and `envd::files`.

mod blocking;
pub mod entry;
mod list;
pub mod metadata;
mod mutate;
mod stat;
pub mod watch;

use crate::config::Config;
use axum::routing::post;
use axum::Router;
use std::sync::Arc;
use watch::WatcherTable;

pub fn routes(config: Arc<Config>, watchers: Arc<WatcherTable>) -> Router {
    Router::new()
        .route("/filesystem.Filesystem/Stat", post(stat::stat))
        .route("/filesystem.Filesystem/MakeDir", post(mutate::make_dir))
        .route("/filesystem.Filesystem/Move", post(mutate::move_entry))
        .route("/filesystem.Filesystem/ListDir", post(list::list_dir))
        .route("/filesystem.Filesystem/Remove", post(mutate::remove))
        .with_state(config.clone())
        .merge(watch::routes(config, watchers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use std::fs;
    use tower::ServiceExt;

    async fn call(method: &str, body: Value) -> (StatusCode, Value) {
        let app = routes(Arc::default(), Arc::default());
        let req = Request::post(format!("/filesystem.Filesystem/{method}"))
            .header("content-type", "application/json")
            .header("authorization", "Basic cm9vdDo=")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn stat_make_dir_list_move_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().to_string_lossy().into_owned();

        let (status, body) = call("MakeDir", json!({"path": format!("{base}/d/sub")})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["entry"]["type"], "FILE_TYPE_DIRECTORY");
        let (status, body) = call("MakeDir", json!({"path": format!("{base}/d/sub")})).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::CONFLICT, Some("already_exists"))
        );

        fs::write(tmp.path().join("d/b.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("b.txt", tmp.path().join("d/link")).unwrap();
        fs::write(tmp.path().join("d/sub/deep.txt"), b"").unwrap();

        let (status, body) = call("Stat", json!({"path": format!("{base}/d/b.txt")})).await;
        assert_eq!(status, StatusCode::OK);
        let entry = &body["entry"];
        assert_eq!(entry["name"], "b.txt");
        assert_eq!(entry["type"], "FILE_TYPE_FILE");
        assert_eq!(entry["size"], "5");
        assert_eq!(entry["owner"], "root");
        assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));
        assert!(entry.get("symlinkTarget").is_none());

        let (_, body) = call("Stat", json!({"path": format!("{base}/d/link")})).await;
        assert_eq!(body["entry"]["type"], "FILE_TYPE_FILE");
        assert_eq!(body["entry"]["isSymlink"], true);
        assert_eq!(body["entry"]["permissions"], "Lrwxrwxrwx");
        assert_eq!(
            body["entry"]["symlinkTarget"],
            format!("{}/d/b.txt", fs::canonicalize(&base).unwrap().display())
        );

        let (status, body) = call("Stat", json!({"path": format!("{base}/nope")})).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found"))
        );

        let names = |body: &Value| -> Vec<String> {
            body["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    e["path"]
                        .as_str()
                        .unwrap()
                        .trim_start_matches(&base)
                        .to_owned()
                })
                .collect()
        };
        let (_, body) = call("ListDir", json!({"path": format!("{base}/d")})).await;
        assert_eq!(names(&body), ["/d/b.txt", "/d/link", "/d/sub"]);
        let (_, body) = call("ListDir", json!({"path": format!("{base}/d"), "depth": 5})).await;
        assert_eq!(
            names(&body),
            ["/d/b.txt", "/d/link", "/d/sub", "/d/sub/deep.txt"]
        );
        let (status, _) = call("ListDir", json!({"path": format!("{base}/d/b.txt")})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = call("ListDir", json!({"path": format!("{base}/missing")})).await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        let (status, body) = call("Move", json!({"source": format!("{base}/d/b.txt"), "destination": format!("{base}/e/f/c.txt")})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["entry"]["path"], format!("{base}/e/f/c.txt"));
        let (status, _) = call(
            "Move",
            json!({"source": format!("{base}/d/b.txt"), "destination": format!("{base}/x")}),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(!tmp.path().join("x").exists());

        let (status, _) = call("Remove", json!({"path": format!("{base}/d")})).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!tmp.path().join("d").exists());
        let (status, _) = call("Remove", json!({"path": format!("{base}/d")})).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = call("Stat", json!({"path": "/etc/\u{0}x"})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
}
