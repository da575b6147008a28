//! Images from OCI registries (`from_image`): the manifest and config fetched (see
//! [`registry`], which caps what each answer may take), and every layer blob kept at
//! `{templates_dir}/blobs/sha256/{hex}` once its size and digest have been checked, so a
//! rebuild, or another image sharing a layer, downloads nothing. A pull that finds a blob
//! cached marks it used (its mtime); collection removes the blobs no pull has used for a while.
//! A pull fetches at most [`MAX_PULL_BYTES`] of layers and takes at most [`PULL_DEADLINE`].
//!
//! Only the download happens on the host. The layers are applied inside build sandboxes (see
//! `run.rs`), so no byte of an image is interpreted here.
//!
//! The server fetches from registries itself, so a pull connects only where a sandbox could
//! (see [`super::pull_guard`]): a registry at a private address, and plain HTTP, need the
//! operator's `--insecure-registry`.

#[cfg(test)]
mod fake_registry;
mod registry;

use super::pull_guard::{split_authority, Guard, Reach};
use oci_client::Reference;
use registry::{size_text, Session, MAX_MANIFEST};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The most the layers of one image may add up to.
pub const MAX_PULL_BYTES: u64 = 8 << 30;
/// The longest one pull may take, however slowly the registry answers.
pub const PULL_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// What `from_image` names: the image, and credentials for its registry.
#[derive(Debug, Clone)]
pub struct ImageSource {
    pub reference: String,
    pub credentials: Option<(String, String)>,
}

/// An image ready to be applied: its layers' blobs (bottom first) and what its config says a
/// process starts with.
#[derive(Debug)]
pub struct PulledImage {
    /// `(digest, blob file)`, bottom layer first.
    pub layers: Vec<(String, PathBuf)>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
}

/// Pulls images and keeps their blobs.
pub struct Registries {
    blobs: PathBuf,
    reach: Arc<Reach>,
    deadline: Duration,
}

impl Registries {
    pub fn new(templates_dir: &Path, reach: Reach) -> Self {
        // The registry client's TLS needs a crypto provider chosen for the process; an error
        // means one is chosen already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Registries {
            blobs: templates_dir.join("blobs").join("sha256"),
            reach: Arc::new(reach),
            deadline: PULL_DEADLINE,
        }
    }

    /// Where the layer blobs are kept.
    pub fn blobs_dir(&self) -> &Path {
        &self.blobs
    }

    /// Fetches the image's manifest (the linux/amd64 one of an index) and config, and every
    /// layer not in the blob cache. `progress` hears what is happening, a line at a time.
    pub async fn pull(
        &self,
        source: &ImageSource,
        progress: &(dyn Fn(String) + Sync),
    ) -> Result<PulledImage, String> {
        let reference: Reference = source
            .reference
            .parse()
            .map_err(|e| format!("'{}' is not an image name: {e}", source.reference))?;
        let registry = reference.resolve_registry().to_owned();
        self.check_registry(&registry).await?;
        let guard = Guard::start(self.reach.clone())
            .await
            .map_err(|e| format!("starting the pull's proxy: {e}"))?;
        let proxy = reqwest::Proxy::all(guard.url()).map_err(|e| e.to_string())?;
        let http = reqwest::Client::builder()
            .proxy(proxy)
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("making the pull's HTTP client: {e}"))?;
        let scheme = match self.reach.insecure.contains(&registry) {
            true => "http",
            false => "https",
        };
        let pulled = self.pull_through(http, scheme, &reference, source, progress);
        let outcome = match tokio::time::timeout(self.deadline, pulled).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "the pull of {reference} took longer than {}, the most a pull may take",
                duration_text(self.deadline)
            )),
        };
        outcome.map_err(|e| match guard.refused().as_slice() {
            [] => e,
            refused => format!("{e} (refused to connect: {})", refused.join("; ")),
        })
    }

    /// [`Registries::pull`]'s work, with a client that connects only through the guard.
    async fn pull_through(
        &self,
        http: reqwest::Client,
        scheme: &str,
        reference: &Reference,
        source: &ImageSource,
        progress: &(dyn Fn(String) + Sync),
    ) -> Result<PulledImage, String> {
        let session = Session::open(http, scheme, reference, source.credentials.clone())
            .await
            .map_err(|e| e.to_string())?;
        let (manifest, digest) = session.image_manifest().await.map_err(|e| e.to_string())?;
        progress(format!("{reference}: {digest}"));
        let mut config = Vec::new();
        session
            .blob(
                &manifest.config,
                MAX_MANIFEST,
                "the image's config",
                &mut config,
            )
            .await
            .map_err(|e| e.to_string())?;
        let config: oci_client::config::ConfigFile = serde_json::from_slice(&config)
            .map_err(|e| format!("the image's config is not valid: {e}"))?;
        let total = manifest
            .layers
            .iter()
            .fold(0u64, |sum, l| sum.saturating_add(l.size.max(0) as u64));
        if total > MAX_PULL_BYTES {
            return Err(format!(
                "the layers of {reference} add up to {:.1} GiB, more than the {} a pull may fetch",
                total as f64 / (1u64 << 30) as f64,
                size_text(MAX_PULL_BYTES)
            ));
        }
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for layer in &manifest.layers {
            let blob = self.blob_path(&layer.digest)?;
            if blob.is_file() {
                progress(format!("layer {} cached", short(&layer.digest)));
                let used = std::fs::File::open(&blob)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                if let Err(e) = used {
                    tracing::warn!(blob = %blob.display(), error = %e, "marking a blob used failed");
                }
            } else {
                progress(format!(
                    "layer {}: downloading {:.1} MB",
                    short(&layer.digest),
                    layer.size as f64 / 1e6
                ));
                self.download(&session, layer, &blob).await?;
            }
            layers.push((layer.digest.clone(), blob));
        }
        let settings = config.config.unwrap_or_default();
        let env = settings
            .env
            .unwrap_or_default()
            .iter()
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(PulledImage {
            layers,
            env,
            workdir: settings.working_dir.filter(|w| w.starts_with('/')),
        })
    }

    /// The blob's file in the cache; only sha256 digests are accepted.
    fn blob_path(&self, digest: &str) -> Result<PathBuf, String> {
        match digest.strip_prefix("sha256:") {
            Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(self.blobs.join(hex.to_ascii_lowercase()))
            }
            _ => Err(format!("unsupported layer digest '{digest}' (sha256 only)")),
        }
    }

    /// Downloads one blob; only once its size and digest are checked is it renamed into the
    /// cache, so a cached blob is always a whole, verified one.
    async fn download(
        &self,
        session: &Session<'_>,
        layer: &oci_client::manifest::OciDescriptor,
        blob: &Path,
    ) -> Result<(), String> {
        tokio::fs::create_dir_all(&self.blobs)
            .await
            .map_err(|e| format!("creating {}: {e}", self.blobs.display()))?;
        let partial =
            Partial(blob.with_extension(format!("partial-{:016x}", rand::random::<u64>())));
        let mut file = tokio::fs::File::create(&partial.0)
            .await
            .map_err(|e| format!("creating {}: {e}", partial.0.display()))?;
        let what = format!("layer {}", short(&layer.digest));
        session
            .blob(layer, MAX_PULL_BYTES, &what, &mut file)
            .await
            .map_err(|e| e.to_string())?;
        tokio::fs::rename(&partial.0, blob)
            .await
            .map_err(|e| format!("keeping {what}: {e}"))
    }

    /// Refuses a registry at an address only this host should reach, or over plain HTTP,
    /// unless the server's operator named it with `--insecure-registry`. The guard would too,
    /// but this says so in the registry's words.
    async fn check_registry(&self, registry: &str) -> Result<(), String> {
        let (host, port) = split_authority(registry, 443)
            .ok_or_else(|| format!("'{registry}' is not a registry's host and port"))?;
        self.reach
            .resolve(&host, port, false)
            .await
            .map(drop)
            .map_err(|why| format!("the registry {registry} cannot be reached: {why}"))
    }
}

/// A download's file, removed unless it was renamed into the cache: also when the pull is
/// dropped midway (its deadline, or the build's cancel).
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `30 min`, or as Rust prints a duration.
fn duration_text(d: Duration) -> String {
    match d.as_secs() {
        s if s >= 60 && s % 60 == 0 && d.subsec_nanos() == 0 => format!("{} min", s / 60),
        _ => format!("{d:?}"),
    }
}

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..12.min(hex.len())]
}

#[cfg(test)]
mod tests {
    use super::fake_registry::{challenge, json, Answer, FakeRegistry};
    use super::*;

    fn reach(insecure: &[&str]) -> Reach {
        Reach {
            insecure: insecure.iter().map(|s| s.to_string()).collect(),
            unreachable: crate::egress::platform_deny().collect(),
        }
    }

    #[tokio::test]
    async fn a_registry_on_loopback_needs_the_operator() {
        let tmp = tempfile::tempdir().unwrap();
        let refused = Registries::new(tmp.path(), reach(&[]));
        let err = refused.check_registry("127.0.0.1:5000").await.unwrap_err();
        assert!(err.contains("--insecure-registry 127.0.0.1:5000"), "{err}");
        let allowed = Registries::new(tmp.path(), reach(&["127.0.0.1:5000"]));
        allowed.check_registry("127.0.0.1:5000").await.unwrap();
    }

    fn digest(data: &[u8]) -> String {
        use sha2::Digest;
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
    }

    /// An image of one layer (`layer`, declared `declared` bytes long) whose config sets `A=1`,
    /// as `test/img:1`; `blob` answers the layer's download.
    async fn registry_of(
        layer: &'static [u8],
        declared: i64,
        blob: fn() -> Answer,
    ) -> FakeRegistry {
        let config = br#"{"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]},
            "rootfs": {"type": "layers", "diff_ids": []}}"#;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": digest(config), "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": digest(layer), "size": declared}],
        })
        .to_string();
        FakeRegistry::start(move |path, _| match path {
            "/v2/" => json(200, b"{}"),
            "/v2/test/img/manifests/1" => json(200, manifest.as_bytes()),
            p if p.ends_with(&digest(config)) => json(200, config),
            p if p.ends_with(&digest(layer)) => blob(),
            _ => json(404, br#"{"errors": [{"message": "not here"}]}"#),
        })
        .await
    }

    async fn pull(registry: &FakeRegistry, dir: &Path, name: &str) -> Result<PulledImage, String> {
        let registries = Registries::new(dir, reach(&[&registry.address]));
        let source = ImageSource {
            reference: format!("{}/{name}", registry.address),
            credentials: None,
        };
        registries.pull(&source, &|_| {}).await
    }

    fn kept(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir.join("blobs/sha256"))
            .into_iter()
            .flatten()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_pull_keeps_each_layer_once_its_size_and_digest_match() {
        let tmp = tempfile::tempdir().unwrap();
        let registry = registry_of(b"layer", 5, || json(200, b"layer")).await;
        let image = pull(&registry, tmp.path(), "test/img:1").await.unwrap();
        assert_eq!(image.env, [("A".to_string(), "1".to_string())]);
        assert_eq!(std::fs::read(&image.layers[0].1).unwrap(), b"layer");
        assert_eq!(kept(tmp.path()).len(), 1);

        let missing = pull(&registry, tmp.path(), "test/none:1")
            .await
            .unwrap_err();
        assert!(
            missing.contains("404") && missing.contains("not here"),
            "{missing}"
        );
        let wrong = registry_of(b"layer", 5, || json(200, b"LAYER")).await;
        let tmp = tempfile::tempdir().unwrap();
        let err = pull(&wrong, tmp.path(), "test/img:1").await.unwrap_err();
        assert!(err.contains("does not match its digest"), "{err}");
        assert!(
            kept(tmp.path()).is_empty(),
            "nothing is kept of a wrong blob"
        );
    }

    #[tokio::test]
    async fn a_layer_longer_than_its_descriptor_is_cut_off_and_not_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let registry = registry_of(b"layer", 5, || Answer::Endless(vec![b'x'; 1 << 16])).await;
        let err = pull(&registry, tmp.path(), "test/img:1").await.unwrap_err();
        assert!(
            err.contains("more than the 5 bytes its manifest gives"),
            "{err}"
        );
        assert!(kept(tmp.path()).is_empty(), "no partial file is left");
    }

    #[tokio::test]
    async fn layers_past_the_pull_cap_are_not_fetched() {
        let tmp = tempfile::tempdir().unwrap();
        let registry = registry_of(b"layer", 9 << 30, || json(200, b"layer")).await;
        let err = pull(&registry, tmp.path(), "test/img:1").await.unwrap_err();
        assert!(
            err.contains("more than the 8 GiB a pull may fetch"),
            "{err}"
        );
        let asked = registry.asked.lock().unwrap().clone();
        assert!(
            !asked.iter().any(|p| p.ends_with(&digest(b"layer"))),
            "{asked:?}"
        );
    }

    #[tokio::test]
    async fn answers_without_end_are_cut_off_at_their_caps() {
        let tmp = tempfile::tempdir().unwrap();
        let registry = FakeRegistry::start(|path, _| match path {
            "/v2/" => json(200, b"{}"),
            _ => Answer::Endless(br#"{"schemaVersion": 2, "#.repeat(1000)),
        })
        .await;
        let err = pull(&registry, tmp.path(), "test/img:1").await.unwrap_err();
        assert!(
            err.contains("the manifest of") && err.contains("larger than 4 MiB"),
            "{err}"
        );

        let token = FakeRegistry::start(|path, head| match path {
            "/v2/" => challenge(head),
            _ => Answer::Endless(vec![b'a'; 1 << 16]),
        })
        .await;
        let err = pull(&token, tmp.path(), "test/img:1").await.unwrap_err();
        assert!(err.contains("token answer is larger than 64 KiB"), "{err}");
    }

    #[tokio::test]
    async fn a_token_is_fetched_as_the_registry_asks_and_sent_with_each_request() {
        let tmp = tempfile::tempdir().unwrap();
        let registry = FakeRegistry::start(|path, head| {
            let signed = head.contains("\r\nauthorization: Bearer t0k\r\n");
            match path {
                "/token?scope=repository%3Atest%2Fimg%3Apull&service=s" => {
                    json(200, br#"{"access_token": "t0k"}"#)
                }
                _ if !signed => challenge(head),
                _ => json(404, br#"{"errors": [{"code": "MANIFEST_UNKNOWN"}]}"#),
            }
        })
        .await;
        let err = pull(&registry, tmp.path(), "test/img:1").await.unwrap_err();
        assert!(
            err.contains("404") && err.contains("MANIFEST_UNKNOWN"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_pull_that_outlasts_its_deadline_fails_saying_so() {
        let tmp = tempfile::tempdir().unwrap();
        let registry = FakeRegistry::start(|path, _| match path {
            "/v2/" => json(200, b"{}"),
            _ => Answer::Trickle,
        })
        .await;
        let mut registries = Registries::new(tmp.path(), reach(&[&registry.address]));
        registries.deadline = Duration::from_millis(1500);
        let source = ImageSource {
            reference: format!("{}/test/img:1", registry.address),
            credentials: None,
        };
        let started = std::time::Instant::now();
        let err = registries.pull(&source, &|_| {}).await.unwrap_err();
        assert!(err.contains("took longer than 1.5s"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn blob_paths_are_sha256_only() {
        let r = Registries::new(Path::new("/t"), reach(&[]));
        let hex = "a".repeat(64);
        assert_eq!(
            r.blob_path(&format!("sha256:{hex}")).unwrap(),
            PathBuf::from(format!("/t/blobs/sha256/{hex}"))
        );
        assert!(r.blob_path("sha512:abc").is_err());
        assert!(r.blob_path("sha256:../../etc").is_err());
    }
}
