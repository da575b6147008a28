//! `filesystem.Filesystem` unary RPCs: Stat, MakeDir, Move, ListDir and Remove.
//!
//! Everything runs as the agent (root inside the sandbox); the request's user only decides how
//! paths resolve and who owns what gets created. Entries are described the way envd describes
//! them (Go `FileMode` strings, permission bits only in `mode`), because the SDK's tests assert
//! those exact values. The entry builder and [`ensure_dirs`] are shared with `watch` and
//! `envd::files`.

pub mod metadata;
pub mod watch;

use crate::config::Config;
use crate::rpc::{self, RpcError, RpcResult};
use airlock_wire::connect::Code;
use airlock_wire::envd::{
    EntryInfo, EntryResponse, FileType, ListDirRequest, ListDirResponse, MakeDirRequest,
    MoveRequest, RemoveRequest, StatRequest,
};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use chrono::{DateTime, SecondsFormat};
use std::collections::HashMap;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// ListDir depths beyond this are clamped: deeper trees are listed only this far.
const MAX_LIST_DEPTH: u32 = 256;
/// ListDir refuses to answer with more entries than this (the response is held in memory).
const MAX_LIST_ENTRIES: usize = 100_000;

pub fn routes(config: Arc<Config>) -> Router {
    Router::new()
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Move", post(move_entry))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/Remove", post(remove))
        .with_state(config)
}

async fn stat(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<EntryResponse> {
    let req: StatRequest = rpc::parse_unary(&body)?;
    let path = config.rpc_user(&headers)?.resolve(&req.path)?;
    let entry =
        blocking(move || entry_info(&path, &IdNames::load()).map_err(|e| io_error(&e, &path)))
            .await?;
    Ok(Json(EntryResponse { entry }))
}

async fn make_dir(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<EntryResponse> {
    let req: MakeDirRequest = rpc::parse_unary(&body)?;
    let user = config.rpc_user(&headers)?;
    let path = user.resolve(&req.path)?;
    let entry = blocking(move || {
        match fs::metadata(&path) {
            Ok(md) if md.is_dir() => {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!("directory already exists: {}", path.display()),
                ))
            }
            Ok(_) => {
                return Err(RpcError::invalid(format!(
                    "path already exists but it is not a directory: {}",
                    path.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(&e, &path)),
        }
        ensure_dirs(&path, user.uid, user.gid).map_err(|e| io_error(&e, &path))?;
        entry_info(&path, &IdNames::load()).map_err(|e| io_error(&e, &path))
    })
    .await?;
    Ok(Json(EntryResponse { entry }))
}

async fn move_entry(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<EntryResponse> {
    let req: MoveRequest = rpc::parse_unary(&body)?;
    let user = config.rpc_user(&headers)?;
    let source = user.resolve(&req.source)?;
    let destination = user.resolve(&req.destination)?;
    let entry = blocking(move || {
        // Check the source first so a missing one doesn't leave new destination dirs behind.
        fs::symlink_metadata(&source).map_err(|e| io_error(&e, &source))?;
        if let Some(parent) = destination.parent() {
            ensure_dirs(parent, user.uid, user.gid).map_err(|e| io_error(&e, parent))?;
        }
        fs::rename(&source, &destination).map_err(|e| io_error(&e, &source))?;
        entry_info(&destination, &IdNames::load()).map_err(|e| io_error(&e, &destination))
    })
    .await?;
    Ok(Json(EntryResponse { entry }))
}

async fn list_dir(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<ListDirResponse> {
    let req: ListDirRequest = rpc::parse_unary(&body)?;
    let path = config.rpc_user(&headers)?.resolve(&req.path)?;
    let depth = req.depth.clamp(1, MAX_LIST_DEPTH);
    let entries = blocking(move || {
        // The listed directory itself may be a symlink (envd resolves it); entries below it are
        // reported under the path the client asked for and are never followed.
        match fs::metadata(&path) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(RpcError::invalid(format!(
                    "path is not a directory: {}",
                    path.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(RpcError::not_found(format!(
                    "directory not found: {}",
                    path.display()
                )))
            }
            Err(e) => return Err(io_error(&e, &path)),
        }
        walk(&path, depth, &IdNames::load())
    })
    .await?;
    Ok(Json(ListDirResponse { entries }))
}

async fn remove(
    State(config): State<Arc<Config>>,
    headers: HeaderMap,
    body: Bytes,
) -> RpcResult<airlock_wire::envd::Empty> {
    let req: RemoveRequest = rpc::parse_unary(&body)?;
    let path = config.rpc_user(&headers)?.resolve(&req.path)?;
    if path == Path::new("/") {
        return Err(RpcError::invalid("refusing to remove /"));
    }
    blocking(move || {
        let result = match fs::symlink_metadata(&path) {
            Ok(md) if md.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(e) => Err(e),
        };
        match result {
            // Like envd's os.RemoveAll, removing nothing succeeds (the SDK's tests rely on it).
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error(&e, &path)),
            _ => Ok(()),
        }
    })
    .await?;
    Ok(Json(airlock_wire::envd::Empty {}))
}

/// Runs blocking filesystem work off the async runtime.
async fn blocking<T, F>(work: F) -> Result<T, RpcError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, RpcError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RpcError::internal(format!("filesystem task failed: {e}")))?
}

fn io_error(err: &io::Error, path: &Path) -> RpcError {
    RpcError::from_io(err, &path.to_string_lossy())
}

/// Describes `path` itself (symlinks are not followed), as Stat reports it.
pub(crate) fn entry_info(path: &Path, names: &IdNames) -> io::Result<EntryInfo> {
    let md = fs::symlink_metadata(path)?;
    Ok(build_entry(path, &md, names))
}

/// Creates `dir` and any missing parents (mode 0755), each new one owned by `uid:gid`.
/// Existing directories are left alone; an existing non-directory on the way is an error.
pub(crate) fn ensure_dirs(dir: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut current = Some(dir);
    while let Some(path) = current {
        match fs::metadata(path) {
            Ok(md) if md.is_dir() => break,
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(path),
            Err(e) => return Err(e),
        }
        current = path.parent();
    }
    for path in missing.into_iter().rev() {
        match fs::DirBuilder::new().mode(0o755).create(path) {
            Ok(()) => std::os::unix::fs::chown(path, Some(uid), Some(gid))?,
            // Someone else created it meanwhile; fine as long as it is a directory.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Lists `root`'s entries down to `depth` levels in Go's `filepath.WalkDir` order: depth-first,
/// each directory's entries sorted by name. Symlinks are listed, never followed.
fn walk(root: &Path, depth: u32, names: &IdNames) -> Result<Vec<EntryInfo>, RpcError> {
    let mut entries = Vec::new();
    let mut stack = vec![(sorted_children(root).map_err(|e| io_error(&e, root))?, 1)];
    while let Some((children, level)) = stack.last_mut() {
        let level = *level;
        let Some(child) = children.next() else {
            stack.pop();
            continue;
        };
        let md = match fs::symlink_metadata(&child) {
            Ok(md) => md,
            // Removed while we were listing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(&e, &child)),
        };
        if entries.len() >= MAX_LIST_ENTRIES {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                format!(
                    "{} has more than {MAX_LIST_ENTRIES} entries within depth {depth}; list a smaller depth or a subdirectory",
                    root.display()
                ),
            ));
        }
        entries.push(build_entry(&child, &md, names));
        if md.is_dir() && level < depth {
            match sorted_children(&child) {
                Ok(grandchildren) => stack.push((grandchildren, level + 1)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&e, &child)),
            }
        }
    }
    Ok(entries)
}

fn sorted_children(dir: &Path) -> io::Result<std::vec::IntoIter<PathBuf>> {
    let mut names = fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<io::Result<Vec<_>>>()?;
    names.sort();
    Ok(names
        .into_iter()
        .map(|name| dir.join(name))
        .collect::<Vec<_>>()
        .into_iter())
}

/// What envd 0.6 reports: for a symlink, its target's type and permission bits (unspecified
/// when it dangles) with `is_symlink` set; the link's own permission string, size and owner.
fn build_entry(path: &Path, md: &Metadata, names: &IdNames) -> EntryInfo {
    let ft = md.file_type();
    let kind = |ft: fs::FileType| {
        if ft.is_dir() {
            FileType::Directory
        } else if ft.is_file() {
            FileType::File
        } else {
            FileType::Unspecified
        }
    };
    let (file_type, mode) = if ft.is_symlink() {
        match fs::metadata(path) {
            Ok(target) => (kind(target.file_type()), target.mode()),
            Err(_) => (FileType::Unspecified, md.mode()),
        }
    } else {
        (kind(ft), md.mode())
    };
    let symlink_target = ft.is_symlink().then(|| {
        // envd reports the fully resolved target; a dangling link falls back to its raw text.
        fs::canonicalize(path)
            .or_else(|_| fs::read_link(path))
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    EntryInfo {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        file_type,
        path: path.to_string_lossy().into_owned(),
        size: i64::try_from(md.len()).unwrap_or(i64::MAX),
        mode: mode & 0o777,
        permissions: go_mode_string(md.mode()),
        owner: names.user(md.uid()),
        group: names.group(md.gid()),
        modified_time: DateTime::from_timestamp(
            md.mtime(),
            md.mtime_nsec().try_into().unwrap_or(0),
        )
        .map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
        symlink_target,
        metadata: crate::envd::filesystem::metadata::read(path),
        is_symlink: ft.is_symlink(),
    }
}

/// Go's `os.FileMode.String()` for a Unix `st_mode`: the type and flag letters Go sets for it
/// (in Go's order `dalTLDpSugct?`; `a`, `l`, `T` and `?` never come from a Linux stat), or `-`
/// when there are none, then the nine `rwx` permission characters.
pub(crate) fn go_mode_string(st_mode: u32) -> String {
    let kind = st_mode & libc::S_IFMT;
    let letters = [
        (kind == libc::S_IFDIR, 'd'),
        (kind == libc::S_IFLNK, 'L'),
        (kind == libc::S_IFBLK || kind == libc::S_IFCHR, 'D'),
        (kind == libc::S_IFIFO, 'p'),
        (kind == libc::S_IFSOCK, 'S'),
        (st_mode & libc::S_ISUID != 0, 'u'),
        (st_mode & libc::S_ISGID != 0, 'g'),
        (kind == libc::S_IFCHR, 'c'),
        (st_mode & libc::S_ISVTX != 0, 't'),
    ];
    let mut out: String = letters
        .iter()
        .filter(|(set, _)| *set)
        .map(|(_, c)| *c)
        .collect();
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if st_mode & (1 << (8 - i)) != 0 {
            c
        } else {
            '-'
        });
    }
    out
}

/// uid and gid names from `/etc/passwd` and `/etc/group`, read once per request.
pub(crate) struct IdNames {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl IdNames {
    pub(crate) fn load() -> IdNames {
        let read = |path: &str| parse_id_names(&fs::read_to_string(path).unwrap_or_default());
        IdNames {
            users: read("/etc/passwd"),
            groups: read("/etc/group"),
        }
    }

    /// The user's name, or the number as text when it has none (as envd does).
    fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// Maps ids to names from passwd- or group-style lines (`name:x:id:...`); the first line wins.
fn parse_id_names(text: &str) -> HashMap<u32, String> {
    let mut names = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(id)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if let Ok(id) = id.parse() {
            names.entry(id).or_insert_with(|| name.to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    #[test]
    fn go_mode_strings() {
        assert_eq!(go_mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(go_mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            go_mode_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(go_mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(go_mode_string(libc::S_IFBLK | 0o660), "Drw-rw----");
        assert_eq!(go_mode_string(libc::S_IFIFO | 0o600), "prw-------");
        assert_eq!(go_mode_string(libc::S_IFSOCK | 0o755), "Srwxr-xr-x");
        assert_eq!(
            go_mode_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
        assert_eq!(
            go_mode_string(libc::S_IFREG | libc::S_ISGID | 0o755),
            "grwxr-xr-x"
        );
        assert_eq!(go_mode_string(libc::S_IFREG), "----------");
    }

    #[test]
    fn id_names_parse_and_fall_back_to_numbers() {
        let users = parse_id_names("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nbad\ndup:x:0:0::/:/bin/sh\n");
        assert_eq!(users.get(&0).map(String::as_str), Some("root"));
        assert_eq!(users.get(&1000).map(String::as_str), Some("user"));
        let names = IdNames {
            users,
            groups: parse_id_names("wheel:x:10:root\n"),
        };
        assert_eq!(names.group(10), "wheel");
        assert_eq!(names.user(4242), "4242");
    }

    #[test]
    fn ensure_dirs_creates_parents_and_rejects_files() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/c");
        ensure_dirs(&deep, 0, 0).unwrap();
        assert!(deep.is_dir());
        ensure_dirs(&deep, 0, 0).unwrap();
        fs::write(tmp.path().join("f"), b"x").unwrap();
        let err = ensure_dirs(&tmp.path().join("f/g"), 0, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory);
    }

    async fn call(method: &str, body: Value) -> (StatusCode, Value) {
        let app = routes(Arc::default());
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
