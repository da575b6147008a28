//! Images in object storage (`airlock serve --object-store URL`): paused sandboxes', so that
//! another node can resume them, and templates' layers, so that every node can start a template
//! built on one (`build/shared_layers.rs`). S3 or any S3-compatible server, or a local
//! directory, through the `object_store` crate.
//!
//! An image is a directory of plain files (the driver's checkpoint: its memory pages and its
//! kernel's state). It is stored under `{prefix}/` as one object per file plus a
//! `{prefix}/manifest.json` naming every file and its size, written last: an upload that died
//! half-way has no manifest, so it is never taken for an image. Files are streamed both ways in
//! parts of [`PART_BYTES`] (multipart uploads above that), so an image of any size costs a few
//! parts of memory, never its size.
//!
//! Keys are `paused/{sandbox id}/{generation}`, a new generation per pause (see
//! [`paused_prefix`] and docs/design.md for why not content addresses).

use crate::ids::SandboxId;
use futures::StreamExt;
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncWriteExt, BufReader};

/// The size of each part of an upload, and what one file's upload buffers.
const PART_BYTES: usize = 16 << 20;
/// Parts of one file uploaded at once.
const PARTS_AT_ONCE: usize = 4;
const MANIFEST: &str = "manifest.json";
/// How a request that failed is retried. The crate's default keeps trying for 3 minutes, which
/// a pause that waits for its upload must not when the store is down.
const RETRY: object_store::RetryConfig = object_store::RetryConfig {
    backoff: object_store::BackoffConfig {
        init_backoff: std::time::Duration::from_millis(100),
        max_backoff: std::time::Duration::from_secs(2),
        base: 2.0,
    },
    max_retries: 3,
    retry_timeout: std::time::Duration::from_secs(10),
};

#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    #[error("object store URL '{url}': {detail}")]
    BadUrl { url: String, detail: String },
    #[error("object storage: {0}")]
    Store(#[from] object_store::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the image at {0} in object storage is not whole: {1}")]
    Damaged(String, String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ObjectsError {
    let what = what.into();
    move |source| ObjectsError::Io { what, source }
}

/// What an image's manifest lists: each file by name, with its size.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Manifest {
    files: Vec<(String, u64)>,
}

/// The prefix of the image one pause of sandbox `id` writes: `generation` is new for each pause
/// (a time-ordered id), so an upload left by an earlier, failed pause is never mistaken for it.
pub fn paused_prefix(id: &SandboxId, generation: &str) -> String {
    format!("{}/{generation}", sandbox_prefix(id))
}

/// Where a snapshot's image is in object storage: its name is unique per owner already.
pub fn snapshot_prefix(image: &str) -> String {
    format!("{SNAPSHOTS}/{image}")
}

/// The folders of object storage: paused images, snapshots, templates' layers and the chains
/// of layers of templates' root filesystems.
pub const PAUSED: &str = "paused";
pub const SNAPSHOTS: &str = "snapshots";
pub const LAYERS: &str = "layers";
pub const CHAINS: &str = "rootfs";

/// Everything of sandbox `id`'s in object storage: every generation of its paused images.
fn sandbox_prefix(id: &SandboxId) -> String {
    format!("{PAUSED}/{id}")
}

/// An object found by [`ImageObjects::listing`].
#[derive(Debug, Clone)]
pub struct Listed {
    /// From the store's root, `/`-separated (`layers/{key}/manifest.json`).
    pub path: String,
    pub modified: chrono::DateTime<chrono::Utc>,
}

/// Images in one object store.
#[derive(Clone)]
pub struct ImageObjects {
    store: Arc<dyn ObjectStore>,
    /// What logs and errors call it: its URL without query (credentials may be there).
    name: String,
}

impl std::fmt::Debug for ImageObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl ImageObjects {
    /// Opens the store at `url`: `s3://bucket[/prefix]`, configured by the standard `AWS_*`
    /// variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, ...) and overridden by the URL's query (`?endpoint=http://host:port&
    /// allow_http=true&region=...`); or `file:///dir`, a local directory (created if missing).
    pub fn open(url: &str) -> Result<Self, ObjectsError> {
        let bad = |detail: String| ObjectsError::BadUrl {
            url: url.split('?').next().unwrap_or_default().to_owned(),
            detail,
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let prefix = parsed.path().trim_matches('/').to_owned();
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            "s3" => {
                // The S3 client's TLS uses the process's provider (ring, as the registry pulls).
                let _ = rustls::crypto::ring::default_provider().install_default();
                let bucket = parsed.host_str().unwrap_or_default();
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(format!("s3://{bucket}"))
                    .with_retry(RETRY);
                for (key, value) in parsed.query_pairs() {
                    let key = key
                        .parse()
                        .map_err(|_| bad(format!("unknown option '{key}'")))?;
                    builder = builder.with_config(key, value);
                }
                let s3 = builder.build().map_err(|e| bad(e.to_string()))?;
                match prefix.is_empty() {
                    true => Arc::new(s3),
                    false => Arc::new(object_store::prefix::PrefixStore::new(s3, prefix)),
                }
            }
            "file" => {
                let dir = PathBuf::from(parsed.path());
                std::fs::create_dir_all(&dir).map_err(|e| bad(e.to_string()))?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| bad(e.to_string()))?;
                Arc::new(local)
            }
            other => return Err(bad(format!("'{other}:' is neither s3: nor file:"))),
        };
        let name = url.split('?').next().unwrap_or_default().to_owned();
        Ok(ImageObjects { store, name })
    }

    /// Images in `store` (tests: an in-memory store).
    #[cfg(test)]
    pub(crate) fn with_store(store: Arc<dyn ObjectStore>) -> Self {
        ImageObjects {
            store,
            name: "test".into(),
        }
    }

    /// Uploads the image in directory `dir` under `prefix`; returns the bytes uploaded. On
    /// failure, what it uploaded is deleted (best effort: a manifest-less leftover is inert,
    /// and a kill of the sandbox deletes it).
    pub async fn upload(&self, prefix: &str, dir: &Path) -> Result<u64, ObjectsError> {
        let result = self.upload_files(prefix, dir).await;
        if result.is_err() {
            let _ = self.delete_prefix(prefix).await;
        }
        result
    }

    async fn upload_files(&self, prefix: &str, dir: &Path) -> Result<u64, ObjectsError> {
        let what = || format!("reading image {}", dir.display());
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(what()))? {
            let entry = entry.map_err(io(what()))?;
            let meta = entry.metadata().map_err(io(what()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Images are flat directories of plain files; anything else is not the driver's.
            if !meta.is_file() {
                return Err(io(what())(std::io::Error::other(format!(
                    "{name} is not a plain file"
                ))));
            }
            files.push((name, meta.len()));
        }
        files.sort();
        let mut total = 0;
        for (name, size) in &files {
            let path = dir.join(name);
            let file = tokio::fs::File::open(&path)
                .await
                .map_err(io(format!("opening {}", path.display())))?;
            let mut reader = BufReader::with_capacity(1 << 20, file);
            let mut writer = BufWriter::with_capacity(
                self.store.clone(),
                ObjectPath::from(format!("{prefix}/{name}")),
                PART_BYTES,
            )
            .with_max_concurrency(PARTS_AT_ONCE);
            let copied = tokio::io::copy(&mut reader, &mut writer).await;
            let copied = match copied {
                Ok(n) => writer.shutdown().await.map(|()| n),
                Err(e) => {
                    let _ = writer.abort().await;
                    Err(e)
                }
            };
            let copied = copied.map_err(io(format!("uploading {}", path.display())))?;
            if copied != *size {
                return Err(ObjectsError::Damaged(
                    prefix.to_owned(),
                    format!("{name} changed while it was uploaded"),
                ));
            }
            total += copied;
        }
        let manifest = serde_json::to_vec(&Manifest { files }).expect("a manifest serializes");
        self.store
            .put(&manifest_path(prefix), manifest.into())
            .await?;
        Ok(total)
    }

    /// Downloads the image under `prefix` into `dir`, which must not exist: it is written as
    /// `.{name}.partial` beside it and renamed, so `dir` is either whole or absent (a leftover
    /// partial directory is the driver's to sweep, as its own checkpoints' are).
    pub async fn download(&self, prefix: &str, dir: &Path) -> Result<u64, ObjectsError> {
        let bytes = self
            .store
            .get(&manifest_path(prefix))
            .await?
            .bytes()
            .await?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| ObjectsError::Damaged(prefix.to_owned(), e.to_string()))?;
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let partial = dir.with_file_name(format!(".{name}.partial"));
        let _ = tokio::fs::remove_dir_all(&partial).await;
        tokio::fs::create_dir(&partial)
            .await
            .map_err(io(format!("creating {}", partial.display())))?;
        let result = self.download_files(prefix, &manifest, &partial).await;
        let result = match result {
            Ok(total) => tokio::fs::rename(&partial, dir)
                .await
                .map(|()| total)
                .map_err(io(format!("storing image {}", dir.display()))),
            Err(e) => Err(e),
        };
        if result.is_err() {
            let _ = tokio::fs::remove_dir_all(&partial).await;
        }
        result
    }

    async fn download_files(
        &self,
        prefix: &str,
        manifest: &Manifest,
        into: &Path,
    ) -> Result<u64, ObjectsError> {
        let mut total = 0;
        for (name, size) in &manifest.files {
            if name.contains('/') || name.starts_with('.') {
                return Err(ObjectsError::Damaged(
                    prefix.to_owned(),
                    format!("bad file name '{name}'"),
                ));
            }
            let path = into.join(name);
            let what = || format!("writing {}", path.display());
            let mut file = tokio::fs::File::create(&path).await.map_err(io(what()))?;
            let object = ObjectPath::from(format!("{prefix}/{name}"));
            let mut stream = self.store.get(&object).await?.into_stream();
            let mut written = 0;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                file.write_all(&chunk).await.map_err(io(what()))?;
                written += chunk.len() as u64;
            }
            file.sync_all().await.map_err(io(what()))?;
            if written != *size {
                return Err(ObjectsError::Damaged(
                    prefix.to_owned(),
                    format!("{name} has {written} bytes, not {size}"),
                ));
            }
            total += written;
        }
        Ok(total)
    }

    /// Deletes every image of sandbox `id`, whole or not. Succeeds if there is none.
    pub async fn delete_sandbox(&self, id: &SandboxId) -> Result<(), ObjectsError> {
        self.delete_prefix(&sandbox_prefix(id)).await
    }

    /// Deletes the image under `prefix`, whole or not; succeeds if there is none.
    pub async fn delete(&self, prefix: &str) -> Result<(), ObjectsError> {
        self.delete_prefix(prefix).await
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<(), ObjectsError> {
        // The manifest first: a delete that stops half-way leaves no image that looks whole.
        let objects: Vec<_> = self
            .store
            .list(Some(&ObjectPath::from(prefix)))
            .collect()
            .await;
        let mut paths: Vec<ObjectPath> = Vec::with_capacity(objects.len());
        for object in objects {
            paths.push(object?.location);
        }
        paths.sort_by_key(|p| p.filename() != Some(MANIFEST));
        for path in paths {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether a whole image is under `prefix`.
    pub async fn has(&self, prefix: &str) -> Result<bool, ObjectsError> {
        match self.store.head(&manifest_path(prefix)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Every object under `prefix` (a folder: `layers`, `paused`), with when it was last
    /// written, by its path from the store's root.
    pub async fn listing(&self, prefix: &str) -> Result<Vec<Listed>, ObjectsError> {
        let objects: Vec<_> = self
            .store
            .list(Some(&ObjectPath::from(prefix)))
            .collect()
            .await;
        let mut listed = Vec::with_capacity(objects.len());
        for object in objects {
            let object = object?;
            listed.push(Listed {
                path: object.location.to_string(),
                modified: object.last_modified,
            });
        }
        Ok(listed)
    }

    /// Deletes the small object at `key`; succeeds if there is none.
    pub async fn delete_small(&self, key: &str) -> Result<(), ObjectsError> {
        match self.store.delete(&ObjectPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a small object (a record, not an image) at `key`, whole.
    pub async fn put_small(&self, key: &str, bytes: Vec<u8>) -> Result<(), ObjectsError> {
        self.store.put(&ObjectPath::from(key), bytes.into()).await?;
        Ok(())
    }

    /// Reads the small object at `key`; `None` if there is none.
    pub async fn get_small(&self, key: &str) -> Result<Option<Vec<u8>>, ObjectsError> {
        match self.store.get(&ObjectPath::from(key)).await {
            Ok(object) => Ok(Some(object.bytes().await?.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

impl std::fmt::Display for ImageObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

fn manifest_path(prefix: &str) -> ObjectPath {
    ObjectPath::from(format!("{prefix}/{MANIFEST}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn image(dir: &Path, files: &[(&str, usize)]) {
        std::fs::create_dir(dir).unwrap();
        for (name, size) in files {
            let data: Vec<u8> = (0..*size).map(|i| (i % 251) as u8).collect();
            std::fs::write(dir.join(name), data).unwrap();
        }
    }

    fn same(a: &Path, b: &Path) {
        let mut names: Vec<_> = std::fs::read_dir(a)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert!(!names.is_empty());
        for name in names {
            let (x, y) = (a.join(&name), b.join(&name));
            assert_eq!(
                std::fs::read(x).unwrap(),
                std::fs::read(y).unwrap(),
                "{name:?}"
            );
        }
        assert_eq!(
            std::fs::read_dir(a).unwrap().count(),
            std::fs::read_dir(b).unwrap().count()
        );
    }

    /// An image bigger than a part (so its upload is multipart), with an empty file too, goes
    /// up, comes back the same, and is gone after its sandbox's delete.
    async fn round_trip(objects: &ImageObjects) {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("paused-a");
        image(
            &src,
            &[("pages.img", PART_BYTES * 2 + 7), ("checkpoint.img", 4096)],
        );
        std::fs::write(src.join("empty.img"), b"").unwrap();
        let id = SandboxId::generate();
        let prefix = paused_prefix(&id, "1");
        let sent = objects.upload(&prefix, &src).await.unwrap();
        assert_eq!(sent, (PART_BYTES * 2 + 7 + 4096) as u64);
        assert!(objects.has(&prefix).await.unwrap());
        let dest = tmp.path().join("paused-b");
        assert_eq!(objects.download(&prefix, &dest).await.unwrap(), sent);
        same(&src, &dest);
        assert!(!tmp.path().join(".paused-b.partial").exists());

        objects.delete_sandbox(&id).await.unwrap();
        assert!(!objects.has(&prefix).await.unwrap());
        let left: Vec<_> = objects
            .store
            .list(Some(&ObjectPath::from(sandbox_prefix(&id))))
            .collect()
            .await;
        assert!(left.is_empty(), "{left:?}");
        let again = objects
            .download(&prefix, &tmp.path().join("paused-c"))
            .await;
        assert!(matches!(again, Err(ObjectsError::Store(_))), "{again:?}");
    }

    #[tokio::test]
    async fn an_image_goes_up_and_comes_back_whole() {
        round_trip(&ImageObjects::with_store(Arc::new(InMemory::new()))).await;
    }

    /// The same through a real S3 server (`scripts/s3.sh`, which ./test.sh starts).
    #[tokio::test]
    #[ignore = "needs an S3 server at AIRLOCK_TEST_S3_URL; ./test.sh starts one"]
    async fn s3_images_go_up_and_come_back_whole() {
        let url = std::env::var("AIRLOCK_TEST_S3_URL").unwrap();
        round_trip(&ImageObjects::open(&url).unwrap()).await;
    }

    #[tokio::test]
    async fn an_upload_without_its_manifest_is_no_image() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("paused-a");
        image(&src, &[("pages.img", 10)]);
        let objects = ImageObjects::with_store(Arc::new(InMemory::new()));
        let prefix = paused_prefix(&SandboxId::generate(), "1");
        objects.upload(&prefix, &src).await.unwrap();
        objects.store.delete(&manifest_path(&prefix)).await.unwrap();
        assert!(!objects.has(&prefix).await.unwrap());
        let dest = tmp.path().join("paused-b");
        assert!(objects.download(&prefix, &dest).await.is_err());
        assert!(!dest.exists() && !tmp.path().join(".paused-b.partial").exists());
    }

    #[tokio::test]
    async fn a_file_store_keeps_images_in_its_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("paused-a");
        image(&src, &[("pages.img", 1000)]);
        let root = tmp.path().join("bucket");
        let objects = ImageObjects::open(&format!("file://{}", root.display())).unwrap();
        let id = SandboxId::generate();
        let prefix = paused_prefix(&id, "7");
        objects.upload(&prefix, &src).await.unwrap();
        assert!(root.join(&prefix).join("pages.img").is_file());
        objects.delete_sandbox(&id).await.unwrap();
        assert!(!root.join(&prefix).join("pages.img").exists());
    }

    #[test]
    fn urls_other_than_s3_and_file_are_refused() {
        for url in ["http://x/y", "not a url", "gs://bucket"] {
            let err = ImageObjects::open(url).unwrap_err();
            assert!(matches!(err, ObjectsError::BadUrl { .. }), "{url}: {err}");
        }
        let err = ImageObjects::open("s3://b?endpoint=http://h&nonsense=1").unwrap_err();
        assert!(err.to_string().contains("nonsense"), "{err}");
    }
}
