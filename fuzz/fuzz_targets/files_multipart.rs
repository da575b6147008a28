//! The agent's `POST /files` upload: the real route (`files::routes`), with its Content-Type and
//! Content-Encoding handling, the multipart parser (multer), gzip, path resolution and the
//! writes, on fuzzed requests.
//!
//! Input: `<mode><chunking><Content-Type>\n<body>`:
//! * mode `p`: `?path=` names the destination (a fixed path inside the scratch directory);
//! * mode `n`: no `?path=`: each part's own filename is the destination;
//! * mode `z`: like `p`, and the harness gzips the body (`Content-Encoding: gzip`);
//! * mode `Z`: like `p`, the body is sent as it is with `Content-Encoding: gzip`;
//! * chunking: a byte seeding how the body is split into chunks (`0` or `a`: one chunk).
//!
//! `$ROOT` in the body stands for the scratch directory (a fresh one per run, removed after), so
//! the seeds can name files in it.
//!
//! Nothing may be written outside the scratch directory, and the agent writes wherever a request
//! says (it runs as root here too). So before a request goes out without `?path=`, the harness
//! parses the body itself with multer, split the same way, and if any part's filename would
//! resolve outside the scratch directory, the request is sent with `?path=` instead (mode `p`).
//!
//! Checked: no panic; no 500 (an internal error) from anything a client can send; a 200 means
//! every `file` part was stored whole at the path it named, and the response lists exactly
//! those files; a body multer cannot parse is never a 200; a raw or gzip upload stores exactly
//! the bytes sent; no response names a file outside the scratch directory.
#![no_main]

use airlock_agent::config::Config;
use airlock_agent::envd::files;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use std::convert::Infallible;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tower::ServiceExt;

struct Env {
    runtime: tokio::runtime::Runtime,
    /// The agent's `/files` routes (uploads leave the agent's state as it was).
    app: axum::Router,
    /// The scratch directory: every write of the agent lands inside it.
    root: PathBuf,
    /// The passwd user the uploads run as (the one the fuzzer runs as, so `fchown` works).
    username: String,
    /// `AIRLOCK_FUZZ_VERBOSE` set: print each request's outcome (to check what seeds reach).
    verbose: bool,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // tmpfs if there is one: on ext4 the mkdirs and unlinks of each run cost most of it.
        let shm = Path::new("/dev/shm");
        let base = match shm.is_dir() {
            true => shm.to_path_buf(),
            false => std::env::temp_dir(),
        };
        let root = base.join(format!("airlock-fuzz-files.{}", std::process::id()));
        // A failed check aborts the process (libFuzzer's hook): take the scratch dir along.
        let abort = std::panic::take_hook();
        let scratch = root.clone();
        std::panic::set_hook(Box::new(move |info| {
            let _ = std::fs::remove_dir_all(&scratch);
            abort(info);
        }));
        let uid = std::fs::metadata("/proc/self").unwrap().uid();
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
        let username = passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() >= 7 && f[2] == uid.to_string())
            .map(|f| f[0].to_owned())
            .expect("the fuzzer's uid has no /etc/passwd entry");
        Env {
            runtime,
            app: files::routes(Arc::new(Config::default())),
            root,
            username,
            verbose: std::env::var_os("AIRLOCK_FUZZ_VERBOSE").is_some(),
        }
    })
}

/// Lexical `.`/`..` folding, as the agent's `users::normalize` documents it (written again here
/// so a bug there cannot make the safety check below agree with it).
fn fold(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for comp in path.components() {
        match comp {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            _ => {}
        }
    }
    out
}

/// Where the agent would write a part with this filename, if it is certainly inside `root`.
/// Only absolute names qualify (relative ones resolve against the user's home).
fn safe_destination(root: &Path, name: &str) -> Option<PathBuf> {
    if !name.starts_with('/') || name.contains('\0') {
        return None;
    }
    let dest = fold(Path::new(name));
    assert_eq!(dest, airlock_agent::users::normalize(Path::new(name)));
    (dest.starts_with(root) && dest != root).then_some(dest)
}

fn chunked(seed: u8, body: &[u8]) -> Vec<Bytes> {
    if seed == 0 || seed == b'a' {
        return vec![Bytes::copy_from_slice(body)];
    }
    let mut state = u32::from(seed) | 0x100;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < body.len() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let end = (pos + (state % 97) as usize).min(body.len());
        out.push(Bytes::copy_from_slice(&body[pos..end]));
        pos = end;
    }
    out
}

fn stream(chunks: Vec<Bytes>) -> impl futures::Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::iter(chunks.into_iter().map(Ok))
}

/// One part as multer reads it.
#[derive(Debug, PartialEq)]
struct Part {
    name: Option<String>,
    file_name: Option<String>,
    data: Vec<u8>,
}

/// The parts of a multipart body, and whether it parsed to its end without error.
async fn parse_parts(chunks: &[Bytes], boundary: &str) -> (Vec<Part>, bool) {
    let mut multipart = multer::Multipart::new(stream(chunks.to_vec()), boundary);
    let mut parts = Vec::new();
    loop {
        match multipart.next_field().await {
            Ok(None) => return (parts, true),
            Err(_) => return (parts, false),
            Ok(Some(mut field)) => {
                let mut part = Part {
                    name: field.name().map(str::to_owned),
                    file_name: field.file_name().map(str::to_owned),
                    data: Vec::new(),
                };
                loop {
                    match field.next().await {
                        None => break,
                        Some(Ok(chunk)) => part.data.extend_from_slice(&chunk),
                        Some(Err(_)) => {
                            parts.push(part);
                            return (parts, false);
                        }
                    }
                }
                parts.push(part);
            }
        }
    }
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

fn quote(s: &str) -> String {
    s.bytes()
        .map(
            |b| match b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
                true => char::from(b).to_string(),
                false => format!("%{b:02X}"),
            },
        )
        .collect()
}

async fn run(data: &[u8], env: &Env) {
    let [mode, seed, rest @ ..] = data else {
        return;
    };
    let (content_type, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let root = &env.root;
    let body = replace_all(body, b"$ROOT", root.to_string_lossy().as_bytes());
    let content_type_text = String::from_utf8_lossy(content_type).into_owned();
    let boundary = multer::parse_boundary(&content_type_text).ok();
    let chunks = chunked(*seed, &body);

    // What multer makes of the body, whole and split as the agent will get it: the same.
    let parsed = match &boundary {
        Some(b) => {
            let whole = parse_parts(&[Bytes::copy_from_slice(&body)], b).await;
            let split = parse_parts(&chunks, b).await;
            assert_eq!(whole, split, "multer depends on chunk boundaries");
            Some(whole)
        }
        None => None,
    };

    let forced = root.join("up/load.bin");
    let by_name = *mode == b'n'
        && parsed.as_ref().is_none_or(|(parts, _)| {
            parts.iter().all(|p| {
                p.file_name
                    .as_deref()
                    .is_none_or(|n| safe_destination(root, n).is_some())
            })
        });
    let mut uri = format!("/files?username={}", quote(&env.username));
    if !by_name {
        uri.push_str(&format!("&path={}", quote(&forced.to_string_lossy())));
    }

    let (sent, encoding): (Vec<Bytes>, Option<&str>) = match mode {
        b'z' => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&body).unwrap();
            (chunked(*seed, &gz.finish().unwrap()), Some("gzip"))
        }
        b'Z' => (chunks.clone(), Some("gzip")),
        _ => (chunks.clone(), None),
    };
    let sent_len: usize = sent.iter().map(Bytes::len).sum();
    let mut req = Request::post(&uri).header("content-length", sent_len);
    if let Some(e) = encoding {
        req = req.header("content-encoding", e);
    }
    if let Ok(ct) = axum::http::HeaderValue::from_bytes(content_type) {
        req = req.header("content-type", ct);
    }
    let req = req.body(Body::from_stream(stream(sent))).unwrap();

    let resp = env.app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let reply: serde_json::Value = serde_json::from_slice(&bytes).expect("reply is JSON");
    if env.verbose {
        eprintln!("{uri} by_name={by_name}: {status} {reply}");
    }
    assert_ne!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal error: {reply}"
    );
    if status != StatusCode::OK {
        assert_eq!(reply["code"].as_u64(), Some(u64::from(status.as_u16())));
        return;
    }

    // What the upload should have stored.
    let media_type = content_type_text
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let content = if *mode == b'Z' {
        let mut plain = Vec::new();
        match flate2::read::MultiGzDecoder::new(&body[..]).read_to_end(&mut plain) {
            Ok(_) => Some(plain),
            Err(_) => None,
        }
    } else {
        Some(body.clone())
    };
    let expected: Vec<(PathBuf, Option<Vec<u8>>)> = if media_type == "application/octet-stream" {
        vec![(forced.clone(), content)]
    } else {
        assert!(
            media_type.starts_with("multipart/"),
            "{media_type} accepted"
        );
        if *mode == b'Z' {
            // Multipart inside a raw gzip stream: no model of it here beyond safety.
            Vec::new()
        } else {
            let (parts, complete) = parsed.expect("multipart without a boundary accepted");
            assert!(complete, "a body multer rejects was accepted");
            parts
                .into_iter()
                .filter(|p| p.name.as_deref() == Some("file"))
                .map(|p| {
                    let dest = match by_name {
                        true => fold(Path::new(p.file_name.as_deref().unwrap())),
                        false => forced.clone(),
                    };
                    (dest, Some(p.data))
                })
                .collect()
        }
    };

    let entries = reply.as_array().expect("a 200 lists the files");
    for entry in entries {
        let path = Path::new(entry["path"].as_str().unwrap());
        assert!(
            path.starts_with(root),
            "wrote outside the scratch dir: {path:?}"
        );
        assert_eq!(entry["type"], "file");
        assert_eq!(
            entry["name"].as_str(),
            path.file_name().map(|n| n.to_str().unwrap())
        );
    }
    if *mode == b'Z' && media_type != "application/octet-stream" {
        return;
    }
    let listed: Vec<&str> = entries
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    let want: Vec<String> = expected
        .iter()
        .map(|(p, _)| p.to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, want, "files listed");
    for (path, content) in &expected {
        let stored = std::fs::read(path).expect("listed file missing");
        if let Some(content) = content {
            assert_eq!(&stored, content, "contents of {path:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let env = env();
    std::fs::create_dir_all(&env.root).unwrap();
    env.runtime.block_on(run(data, env));
    std::fs::remove_dir_all(&env.root).unwrap();
});
