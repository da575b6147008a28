//! Images from OCI registries (`from_image`): the manifest and config fetched with
//! [`oci_client`], and every layer blob kept at `{templates_dir}/blobs/sha256/{hex}` once its
//! digest has been checked, so a rebuild, or another image sharing a layer, downloads nothing.
//!
//! Only the download happens on the host. The layers are applied inside build sandboxes (see
//! `run.rs`), so no byte of an image is interpreted here.
//!
//! The server fetches from registries itself, so a name must not make it reach what only it
//! can reach: a registry whose name resolves to an address no sandbox may reach either
//! ([`crate::egress::PLATFORM_DENY`]: loopback, private, link-local, …) is refused unless the server was started with `--insecure-registry` naming it (which also
//! allows plain HTTP, for a registry on loopback).

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

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
    /// `host[:port]`s allowed over plain HTTP and at private addresses.
    insecure: Vec<String>,
}

impl Registries {
    pub fn new(templates_dir: &Path, insecure: Vec<String>) -> Self {
        // The registry client's TLS needs a crypto provider chosen for the process; an error
        // means one is chosen already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Registries {
            blobs: templates_dir.join("blobs").join("sha256"),
            insecure,
        }
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
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
            connect_timeout: Some(std::time::Duration::from_secs(15)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            ..Default::default()
        });
        let auth = match &source.credentials {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        };
        let (manifest, digest, config) = client
            .pull_manifest_and_config(&reference, &auth)
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
            } else {
                progress(format!(
                    "layer {}: downloading {:.1} MB",
                    short(&layer.digest),
                    layer.size as f64 / 1e6
                ));
                self.download(&client, &reference, layer, &blob).await?;
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

    /// Refuses a registry that resolves to an address only this host should reach, unless
    /// the server's operator named it with `--insecure-registry`.
    async fn check_registry(&self, registry: &str) -> Result<(), String> {
        if self.insecure.iter().any(|r| r == registry) {
            return Ok(());
        }
        let target = if registry.contains(':') {
            registry.to_owned()
        } else {
            format!("{registry}:443")
        };
        let addrs = tokio::net::lookup_host(&target)
            .await
            .map_err(|e| format!("cannot resolve the registry {registry}: {e}"))?;
        for addr in addrs {
            if !is_public(addr.ip()) {
                return Err(format!(
                    "the registry {registry} is at {}, a private address: the server's \
                     operator can allow it with --insecure-registry {registry}",
                    addr.ip()
                ));
            }
        }
        Ok(())
    }
}

/// Whether an address is one a sandbox could reach too: not in the ranges no sandbox may reach
/// ([`crate::egress::PLATFORM_DENY`]), nor their IPv6 counterparts.
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !crate::egress::platform_deny().any(|net| net.contains(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public(IpAddr::V4(v4)),
            None => {
                let first = v6.segments()[0];
                !(v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || (first & 0xfe00) == 0xfc00
                    || (first & 0xffc0) == 0xfe80)
            }
        },
    }
}

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..12.min(hex.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["1.1.1.1", "151.101.0.223", "2606:4700::1111"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn a_registry_on_loopback_needs_the_operator() {
        let tmp = tempfile::tempdir().unwrap();
        let refused = Registries::new(tmp.path(), vec![]);
        let err = refused.check_registry("127.0.0.1:5000").await.unwrap_err();
        assert!(err.contains("--insecure-registry 127.0.0.1:5000"), "{err}");
        let allowed = Registries::new(tmp.path(), vec!["127.0.0.1:5000".into()]);
        allowed.check_registry("127.0.0.1:5000").await.unwrap();
    }

    #[test]
    fn blob_paths_are_sha256_only() {
        let r = Registries::new(Path::new("/t"), vec![]);
        let hex = "a".repeat(64);
        assert_eq!(
            r.blob_path(&format!("sha256:{hex}")).unwrap(),
            PathBuf::from(format!("/t/blobs/sha256/{hex}"))
        );
        assert!(r.blob_path("sha512:abc").is_err());
        assert!(r.blob_path("sha256:../../etc").is_err());
    }
}
