//! Golden images: for each template, a checkpoint of a sandbox booted from it, its start
//! command ready and warmed up, which pools and creates restore instead of booting. A template
//! is recorded only once that sandbox booted (and, with pools on, became its image), so no
//! create sees a template whose start command was never seen to work. Made one at a time (the
//! golden turn), and deleted once no template as built now names them.

use super::checkpoint::checkpoint_error;
use super::create::{Launch, Started};
use super::{Lifecycle, LifecycleError, GOLDEN_PREFIX};
use crate::ids::SandboxId;
use crate::store::TemplateRecord;
use airlock_wire::envd::InitRequest;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

impl Lifecycle {
    /// The golden image of a template as it is built now (a rebuilt template gets a new one).
    pub(super) fn golden_image(&self, template: &TemplateRecord) -> String {
        let hash = template
            .content_hash
            .get(..16)
            .unwrap_or(&template.content_hash);
        let runtime = self.driver.fingerprint();
        format!("{GOLDEN_PREFIX}{}-{hash}-{runtime}", template.name)
    }

    /// The templates (their records' names) whose golden image, for this runtime, is here:
    /// placement prefers this node for them.
    pub fn warm_templates(&self) -> Vec<String> {
        let runtime = self.driver.fingerprint();
        let mut warm: Vec<String> = (self.driver.images().unwrap_or_default().iter())
            .filter_map(|image| {
                // `golden-{name}-{hash}-{runtime}`, as `golden_image` names them.
                let rest = image.strip_prefix(GOLDEN_PREFIX)?;
                let (rest, of_runtime) = rest.rsplit_once('-')?;
                let (name, _hash) = rest.rsplit_once('-')?;
                (of_runtime == runtime).then(|| name.to_owned())
            })
            .collect();
        warm.sort();
        warm.dedup();
        warm
    }

    /// Deletes golden images of templates as they were built before, of builds no tag names
    /// any more, or taken with another agent or runtime: nothing restores from them any more,
    /// and each can be hundreds of MiB.
    /// The caller holds the golden turn.
    pub(super) async fn delete_stale_goldens(&self) {
        let Ok(templates) = self.store.templates().named_templates().await else {
            return;
        };
        let current: HashSet<String> = templates.iter().map(|t| self.golden_image(t)).collect();
        for image in self.driver.images().unwrap_or_default() {
            if image.starts_with(GOLDEN_PREFIX) && !current.contains(&image) {
                tracing::info!(image, "deleting a stale golden image");
                if let Err(e) = self.driver.delete_image(&image).await {
                    tracing::warn!(image, error = %e, "deleting a stale golden image failed");
                }
            }
        }
    }

    /// Records a newly built template once a sandbox of it has booted and its start command
    /// is ready, and with pools on, once that sandbox is its golden image: no create sees a
    /// template whose start command was never seen to work.
    pub async fn publish_template(&self, template: &TemplateRecord) -> Result<(), LifecycleError> {
        let _turn = self.pools.golden_turn.lock().await;
        let golden = (self.limits.pool_size > 0).then(|| self.golden_image(template));
        // The same build again (everything cached) has its image already: same layers, same
        // start command, already seen ready.
        if !golden.as_ref().is_some_and(|g| self.driver.has_image(g)) {
            self.make_golden(template, golden.as_deref()).await?;
        }
        self.store.templates().put(template).await?;
        self.delete_stale_goldens().await;
        // Just built: it is about to be used.
        self.pools.wanted_now(&template.name);
        self.refill.notify_one();
        Ok(())
    }

    /// Boots a sandbox from the template, runs its start command, warms it up and
    /// checkpoints it as its golden image `image` (with no image, only shows that it boots).
    /// The caller holds the golden turn.
    pub(super) async fn make_golden(
        &self,
        template: &TemplateRecord,
        image: Option<&str>,
    ) -> Result<(), LifecycleError> {
        let result = self.boot_golden(template, image).await;
        if image.is_some() {
            let counter = match result {
                Ok(()) => &self.pools.goldens_made,
                Err(_) => &self.pools.goldens_failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Golden images made and attempts that failed, since the server started.
    pub(super) fn golden_counts(&self) -> (u64, u64) {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (
            read(&self.pools.goldens_made),
            read(&self.pools.goldens_failed),
        )
    }

    /// [`Lifecycle::make_golden`], uncounted.
    async fn boot_golden(
        &self,
        template: &TemplateRecord,
        image: Option<&str>,
    ) -> Result<(), LifecycleError> {
        let started_at = std::time::Instant::now();
        let id = SandboxId::generate();
        let started = self
            .start(&id, &template.rootfs, None, self.default_launch())
            .await?;
        let addr = started.placement.agent;
        let defaults = &template.defaults;
        let init = InitRequest {
            default_user: Some(defaults.user.clone()),
            default_workdir: defaults.workdir.clone(),
            ..Default::default()
        };
        let result = async {
            self.agent.init(addr, None, &init).await?;
            self.run_start_command(addr, None, defaults).await?;
            let Some(image) = image else {
                return Ok(());
            };
            self.agent
                .warm_up(addr)
                .await
                .map_err(LifecycleError::Agent)?;
            self.driver
                .checkpoint(&started.id, started.placement.slot, image)
                .await
                .map_err(checkpoint_error)
        }
        .await;
        self.release(started.id, started.placement.slot).await;
        if result.is_ok() {
            tracing::info!(template = %template.name, image, elapsed = ?started_at.elapsed(), "golden image ready");
        }
        result
    }

    /// Restores a copy of the template's golden image as sandbox `id`. A copy whose agent never
    /// answers means the image itself is bad (saved with a connection netstack could not
    /// restore): it is deleted, so that the pools make it again, and the error returned.
    pub(super) async fn restore_golden(
        &self,
        id: &SandboxId,
        template: &TemplateRecord,
        golden: &str,
        launch: Launch,
    ) -> Result<Started, LifecycleError> {
        let result = self.start(id, &template.rootfs, Some(golden), launch).await;
        if let Err(LifecycleError::Agent(e)) = &result {
            tracing::warn!(template = %template.name, image = golden, error = %e, "a copy of the golden image does not answer; making it again");
            if let Err(e) = self.driver.delete_image(golden).await {
                tracing::warn!(image = golden, error = %e, "deleting the golden image failed");
            }
        }
        result
    }
}
