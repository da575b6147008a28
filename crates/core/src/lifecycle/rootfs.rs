//! A sandbox's root filesystem is a template's, made present on this node before the sandbox
//! starts over it. On one box it always is; in a cluster, a template built on another node is
//! fetched from object storage the first time this node starts it (the builder's
//! `SharedLayers`, handed over at boot: the builder owns templates' files, the lifecycle only
//! asks for them).

use super::{Lifecycle, LifecycleError};
use std::path::Path;
use std::sync::Arc;

/// Makes a template's root filesystem present on this node.
#[async_trait::async_trait]
pub trait RootfsSource: Send + Sync + 'static {
    /// Returns once `rootfs` can be started over; an error says why it cannot.
    async fn prepare(&self, rootfs: &Path) -> Result<(), String>;
}

impl Lifecycle {
    /// Asks `source` for every root filesystem from now on (set once, at boot); false if a
    /// source was set already.
    pub fn use_rootfs_source(&self, source: Arc<dyn RootfsSource>) -> bool {
        self.rootfs_source.set(source).is_ok()
    }

    /// Makes `rootfs` present before a launch over it.
    pub(super) async fn prepare_rootfs(&self, rootfs: &Path) -> Result<(), LifecycleError> {
        let Some(source) = self.rootfs_source.get() else {
            return Ok(());
        };
        source.prepare(rootfs).await.map_err(|e| {
            tracing::warn!(rootfs = %rootfs.display(), error = %e, "a template's files are missing here");
            LifecycleError::TemplateFilesUnavailable
        })
    }
}
