//! Where a build starts when it is not another template: an OCI image, or Debian's minimal
//! root, each then provisioned with what a sandbox needs.

use super::copy::{ARCHIVE, INBOX};
use super::image::ImageSource;
use super::run::{failed_at, hash, LayerStep, Progress};
use super::stop::Stop;
use super::{BuildJob, BuildLog, Builder, Failure};
use crate::driver::AGENT_PATH;
use crate::store::{LogLevel, TemplateDefaults};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// Where the host's CA bundle is; a provisioned image gets a copy (see `airlock-agent
/// provision`), and its TLS clients are pointed at it.
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where [`HOST_CA_BUNDLE`]'s copy is in an image; the agent's `provision` puts it there.
const IMAGE_CA_BUNDLE: &str = "/etc/airlock/ca-certificates.crt";
/// Bump when how a Debian root is made changes: its layer is cached by this.
const DEBOOTSTRAP_FORMAT: &str = "debootstrap-minbase-v2";
/// Bump when what `provision` does changes: its layers are cached by this.
const PROVISION_FORMAT: &str = "provision-v2";
/// An image's environment, with TLS clients pointed at the host's CA bundle's copy.
fn with_host_ca(env: Vec<(String, String)>) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = env.into_iter().collect();
    for name in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "NODE_EXTRA_CA_CERTS",
    ] {
        env.insert(name.into(), IMAGE_CA_BUNDLE.into());
    }
    env
}

impl Builder {
    /// The base of a build `from_image`: the image pulled, each of its layers applied in a
    /// build sandbox (a layer each, cached by the layers below it), then provisioned.
    pub(super) async fn image_base(
        &self,
        job: &BuildJob,
        source: &ImageSource,
        log: &BuildLog,
        stop: &Stop,
    ) -> Result<Progress, Failure> {
        let at_base = |message: String| Failure {
            message,
            step: Some("base".into()),
        };
        if !self.agent_is_static {
            return Err(at_base(
                "this server's airlock-agent is dynamically linked (a plain `cargo build`), so \
                 it cannot run inside an image: rebuild it with scripts/prepare.sh, which links \
                 it statically, and restart the server"
                    .into(),
            ));
        }
        let note = |line: String| log.write(LogLevel::Info, Some("base".into()), &line);
        note(format!("FROM image {}", source.reference));
        // A pull may be dropped half-way: its partial download is never used, and the
        // collection at the next start removes it.
        let image = tokio::select! {
            image = self.registries.pull(source, &note) => image.map_err(at_base)?,
            reason = stop.stopped() => return Err(at_base(reason)),
        };
        let scratch = self.layers.scratch().map_err(failed_at("base"))?;
        let mut progress = Progress {
            chain: vec![scratch.clone()],
            // Every layer is this template's own, the scratch one included.
            own_from: 0,
            // The scratch layer's name has its version.
            key: hash(&[&scratch.file_name().unwrap_or_default().to_string_lossy()]),
            context: TemplateDefaults {
                env: with_host_ca(image.env),
                workdir: image.workdir,
                ..TemplateDefaults::default()
            },
            rebuilding: job.definition.force,
        };
        let inbox = format!("/{INBOX}/{ARCHIVE}");
        for (digest, blob) in image.layers {
            let shown = format!("layer {digest}");
            let work = LayerStep {
                owner: None,
                label: "base",
                shown: &shown,
                command: self.exec_as_root(&[AGENT_PATH, "unpack-layer", &inbox, "/"]),
                archive: Some(blob),
                inputs: &digest,
                force: false,
            };
            self.layer_step(job, &mut progress, work, log, stop).await?;
        }
        self.provision(job, &mut progress, log, stop).await?;
        Ok(progress)
    }

    /// The base of a built-in `FROM debian:SUITE`: Debian's minimal root, made on the host by
    /// debootstrap (see [`super::debian`]) and cached by suite and mirror, over the scratch
    /// layer, then provisioned as an image is.
    pub(super) async fn debian_base(
        &self,
        job: &BuildJob,
        suite: &str,
        log: &BuildLog,
        stop: &Stop,
    ) -> Result<Progress, Failure> {
        let note = |line: String| log.write(LogLevel::Info, Some("base".into()), &line);
        let mirror = super::debian::host_mirror(suite);
        note(format!(
            "FROM debian:{suite} (debootstrap --variant=minbase from {mirror})"
        ));
        let scratch = self.layers.scratch().map_err(failed_at("base"))?;
        let scratch_name = scratch.file_name().unwrap_or_default().to_string_lossy();
        let key = hash(&[&scratch_name, DEBOOTSTRAP_FORMAT, suite, &mirror]);
        self.fetch_shared(&key, "base", log).await;
        if self.layers.has(&key) {
            note("CACHED".into());
        } else {
            let started = Instant::now();
            let target = self
                .layers
                .host_made(&key, &job.build_id, |dir| async move {
                    super::debian::debootstrap(suite, &mirror, &dir, &note).await
                });
            target.await.map_err(|message| Failure {
                message,
                step: Some("base".into()),
            })?;
            note(format!("done in {:.1} s", started.elapsed().as_secs_f64()));
        }
        let mut progress = Progress {
            chain: vec![scratch, self.layers.layer(&key)],
            own_from: 0,
            key,
            context: TemplateDefaults {
                env: with_host_ca(Vec::new()),
                ..TemplateDefaults::default()
            },
            rebuilding: job.definition.force,
        };
        self.provision(job, &mut progress, log, stop).await?;
        Ok(progress)
    }

    /// Adds what a sandbox needs to an image or a Debian root: `airlock-agent provision`.
    async fn provision(
        &self,
        job: &BuildJob,
        progress: &mut Progress,
        log: &BuildLog,
        stop: &Stop,
    ) -> Result<(), Failure> {
        let inbox = format!("/{INBOX}/{ARCHIVE}");
        let ca = Path::new(HOST_CA_BUNDLE);
        let ca_hash = std::fs::read(ca).map(|b| hex::encode(Sha256::digest(b)));
        let work = LayerStep {
            owner: None,
            label: "base",
            shown: "adding the user account, sudo and the CA bundle",
            command: match ca_hash {
                Ok(_) => self.exec_as_root(&[AGENT_PATH, "provision", "/", &inbox]),
                Err(_) => self.exec_as_root(&[AGENT_PATH, "provision", "/"]),
            },
            archive: ca_hash.is_ok().then(|| ca.to_owned()),
            inputs: &format!("{PROVISION_FORMAT}:{}", ca_hash.unwrap_or_default()),
            force: false,
        };
        self.layer_step(job, progress, work, log, stop).await
    }
}
