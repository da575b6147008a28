//! Directory watchers: the streaming `WatchDir` RPC (async SDK) and the polling trio
//! `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (sync SDK).
//!
//! Both sit on one inotify instance per watcher. A recursive watcher also watches every
//! subdirectory, adding watches for directories that are created or moved in later and dropping
//! them for directories moved out. inotify events map to envd's (fsnotify's) event types; names
//! are relative to the watched directory (`sub/file.txt`, `.` for the directory itself).
//!
//! Consecutive identical events (same name and type) are merged, as the kernel does for unread
//! events, so one upload reads as CREATE, CHMOD, WRITE however many chunks it was written in.
//! A polling watcher buffers at most [`MAX_PENDING_EVENTS`](tree::MAX_PENDING_EVENTS); past
//! that the oldest are dropped.
//!
//! `tree` is the inotify side both kinds share; `stream` and `polling` are the RPCs.

mod polling;
mod stream;
mod tree;

pub use polling::WatcherTable;

use crate::config::Config;
use axum::routing::post;
use axum::Router;
use std::sync::Arc;

pub fn routes(config: Arc<Config>, watchers: Arc<WatcherTable>) -> Router {
    Router::new()
        .route("/filesystem.Filesystem/WatchDir", post(stream::watch_dir))
        .with_state(config.clone())
        .merge(
            Router::new()
                .route(
                    "/filesystem.Filesystem/CreateWatcher",
                    post(polling::create_watcher),
                )
                .route(
                    "/filesystem.Filesystem/GetWatcherEvents",
                    post(polling::get_watcher_events),
                )
                .route(
                    "/filesystem.Filesystem/RemoveWatcher",
                    post(polling::remove_watcher),
                )
                .with_state((config, watchers)),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_wire::connect::Decoder;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use futures::StreamExt;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use std::time::Duration;
    use tower::ServiceExt;

    async fn unary(app: &Router, method: &str, body: Value) -> (StatusCode, Value) {
        let req = Request::post(format!("/filesystem.Filesystem/{method}"))
            .header("content-type", "application/json")
            .header("authorization", "Basic cm9vdDo=")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// Polls until `done` holds for the events collected so far (inotify is asynchronous).
    async fn poll_until(app: &Router, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        for _ in 0..100 {
            let (status, body) = unary(app, "GetWatcherEvents", json!({"watcherId": id})).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            seen.extend(body["events"].as_array().cloned().unwrap_or_default());
            if done(&seen) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen
    }

    fn has(events: &[Value], name: &str, kind: &str) -> bool {
        events
            .iter()
            .any(|e| e["name"] == name && e["type"] == kind)
    }

    #[tokio::test]
    async fn polling_watcher_sees_nested_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let app = routes(Arc::default(), Arc::default());
        let path = tmp.path().to_string_lossy();

        let (status, _) = unary(
            &app,
            "CreateWatcher",
            json!({"path": format!("{path}/nope")}),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        let (status, _) = unary(
            &app,
            "CreateWatcher",
            json!({"path": format!("{path}/file")}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);

        let (status, body) = unary(
            &app,
            "CreateWatcher",
            json!({"path": path, "recursive": true, "includeEntry": true}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let id = body["watcherId"].as_str().unwrap().to_owned();

        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        let events = poll_until(&app, &id, |ev| has(ev, "sub", "EVENT_TYPE_CREATE")).await;
        let created = events.iter().find(|e| e["name"] == "sub").unwrap();
        assert_eq!(created["entry"]["type"], "FILE_TYPE_DIRECTORY");

        std::fs::write(tmp.path().join("sub/x.txt"), b"data").unwrap();
        let events = poll_until(&app, &id, |ev| has(ev, "sub/x.txt", "EVENT_TYPE_WRITE")).await;
        assert!(has(&events, "sub/x.txt", "EVENT_TYPE_CREATE"), "{events:?}");

        std::fs::rename(tmp.path().join("sub"), tmp.path().join("moved")).unwrap();
        std::fs::write(tmp.path().join("moved/y"), b"").unwrap();
        let events = poll_until(&app, &id, |ev| has(ev, "moved/y", "EVENT_TYPE_CREATE")).await;
        assert!(has(&events, "sub", "EVENT_TYPE_RENAME"), "{events:?}");

        let (status, _) = unary(&app, "RemoveWatcher", json!({"watcherId": id})).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = unary(&app, "GetWatcherEvents", json!({"watcherId": id})).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn watch_dir_streams_start_then_events() {
        let tmp = tempfile::tempdir().unwrap();
        let app = routes(Arc::default(), Arc::default());
        let request = airlock_wire::connect::encode_message(&json!({"path": tmp.path()}));
        let req = Request::post("/filesystem.Filesystem/WatchDir")
            .header("content-type", "application/connect+json")
            .header("authorization", "Basic cm9vdDo=")
            .body(Body::from(request))
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body().into_data_stream();
        let mut decoder = Decoder::default();
        let mut messages = Vec::new();
        let mut wrote = false;
        while messages.len() < 2 {
            let chunk = tokio::time::timeout(Duration::from_secs(5), body.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            decoder.push(&chunk);
            while let Some(env) = decoder.next_envelope().unwrap() {
                messages.push(serde_json::from_slice::<Value>(&env.payload).unwrap());
            }
            if !wrote {
                std::fs::write(tmp.path().join("new.txt"), b"x").unwrap();
                wrote = true;
            }
        }
        assert_eq!(messages[0], json!({"start": {}}));
        assert_eq!(
            messages[1],
            json!({"filesystem": {"name": "new.txt", "type": "EVENT_TYPE_CREATE"}})
        );
    }
}
