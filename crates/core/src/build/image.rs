//! Images from OCI registries (`from_image`): the manifest and config fetched with
//! [`oci_client`], and every layer blob kept at `{templates_dir}/blobs/sha256/{hex}` once its
//! digest has been checked, so a rebuild, or another image sharing a layer, downloads nothing.
//! A pull that finds a blob cached marks it used (its mtime); collection removes the blobs no
//! pull has used for a while.
//!
//! Only the download happens on the host. The layers are applied inside build sandboxes (see
//! `run.rs`), so no byte of an image is interpreted here.
//!
//! The server fetches from registries itself, so a pull connects only where a sandbox could
//! (see [`super::pull_guard`]): a registry at a private address, and plain HTTP, need the
//! operator's `--insecure-registry`.

use super::pull_guard::{split_authority, Guard, Reach};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
}

impl Registries {
    pub fn new(templates_dir: &Path, reach: Reach) -> Self {
        // The registry client's TLS needs a crypto provider chosen for the process; an error
        // means one is chosen already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Registries {
            blobs: templates_dir.join("blobs").join("sha256"),
            reach: Arc::new(reach),
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
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.reach.insecure.clone()),
            https_proxy: Some(guard.url()),
            http_proxy: Some(guard.url()),
            platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
            connect_timeout: Some(std::time::Duration::from_secs(15)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            ..Default::default()
        });
        self.pull_through(&client, &reference, source, progress)
            .await
            .map_err(|e| match guard.refused().as_slice() {
                [] => e,
                refused => format!("{e} (refused to connect: {})", refused.join("; ")),
            })
    }

    /// [`Registries::pull`]'s work, with a client that connects only through the guard.
    async fn pull_through(
        &self,
        client: &Client,
        reference: &Reference,
        source: &ImageSource,
        progress: &(dyn Fn(String) + Sync),
    ) -> Result<PulledImage, String> {
        let registry = reference.resolve_registry();
        let auth = match &source.credentials {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        };
        let (manifest, digest, config) = client
            .pull_manifest_and_config(reference, &auth)
            .await
            .map_err(|e| match (e, &source.credentials) {
                (OciDistributionError::UnauthorizedError { .. }, None) => format!(
                    "the registry {registry} wants credentials for {reference} (401): pass them \
                     with from_image(image, username=..., password=...)"
                ),
                (OciDistributionError::UnauthorizedError { .. }, Some((user, _))) => format!(
                    "the registry {registry} did not accept the credentials of '{user}' for \
                     {reference} (401)"
                ),
                (e, _) => format!("pulling {reference}: {e}"),
            })?;
        progress(format!("{reference}: {digest}"));
        let config: oci_client::config::ConfigFile = serde_json::from_str(&config)
            .map_err(|e| format!("the image's config is not valid: {e}"))?;
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
                self.download(client, reference, layer, &blob).await?;
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

    /// Downloads one blob; the client checks its digest, and only then is it renamed into the
    /// cache, so a cached blob is always a whole, verified one.
    async fn download(
        &self,
        client: &Client,
        reference: &Reference,
        layer: &oci_client::manifest::OciDescriptor,
        blob: &Path,
    ) -> Result<(), String> {
        tokio::fs::create_dir_all(&self.blobs)
            .await
            .map_err(|e| format!("creating {}: {e}", self.blobs.display()))?;
        let partial = blob.with_extension(format!("partial-{:016x}", rand::random::<u64>()));
        let result = async {
            let file = tokio::fs::File::create(&partial)
                .await
                .map_err(|e| format!("creating {}: {e}", partial.display()))?;
            client
                .pull_blob(reference, layer, file)
                .await
                .map_err(|e| format!("downloading layer {}: {e}", layer.digest))?;
            tokio::fs::rename(&partial, blob)
                .await
                .map_err(|e| format!("keeping layer {}: {e}", layer.digest))
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&partial).await;
        }
        result
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

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..12.min(hex.len())]
}

#[cfg(test)]
mod tests {
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
