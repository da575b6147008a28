//! One OCI bundle per sandbox, `bundles/{id}/`: its `config.json` (the spec runsc runs), its
//! overlay's disk, its hub and its log. A bundle exists from a launch's first step until its
//! teardown is done, so the bundles say what the host's sandboxes stand on.

use airlock_core::driver::DriverError;
use std::path::{Path, PathBuf};

pub(crate) struct Bundles {
    dir: PathBuf,
}

impl Bundles {
    pub fn new(dir: PathBuf) -> Self {
        Bundles { dir }
    }

    /// The bundle of sandbox `id`, whether it exists or not.
    pub fn of(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// The ids of every bundle on the host.
    pub fn ids(&self) -> Result<Vec<String>, DriverError> {
        let what = || format!("listing {}", self.dir.display());
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(DriverError::io(what()))? {
            let entry = entry.map_err(DriverError::io(what()))?;
            if let Some(name) = entry.file_name().to_str() {
                ids.push(name.to_owned());
            }
        }
        Ok(ids)
    }

    /// The root filesystems the bundles' specs name. A bundle whose spec is not written yet
    /// (the first moments of a launch) names none; the layer budget spares a rootfs made ready
    /// for a launch for minutes anyway.
    pub fn rootfs_in_use(&self) -> Vec<PathBuf> {
        let ids = self.ids().unwrap_or_default();
        ids.iter()
            .filter_map(|id| rootfs_of(&self.of(id).join("config.json")))
            .collect()
    }
}

fn rootfs_of(spec: &Path) -> Option<PathBuf> {
    let text = std::fs::read(spec).ok()?;
    let spec: serde_json::Value = serde_json::from_slice(&text).ok()?;
    spec["root"]["path"].as_str().map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rootfs_of_every_bundle_with_a_spec() {
        let tmp = tempfile::tempdir().unwrap();
        let bundles = Bundles::new(tmp.path().to_owned());
        for (id, spec) in [
            (
                "a",
                Some(r#"{"root": {"path": "/t/mounts/base-1", "readonly": false}}"#),
            ),
            ("b", Some(r#"{"root": {"path": "/t/layers/k"}}"#)),
            ("starting", None),
            ("garbled", Some("{not json")),
        ] {
            std::fs::create_dir(bundles.of(id)).unwrap();
            if let Some(spec) = spec {
                std::fs::write(bundles.of(id).join("config.json"), spec).unwrap();
            }
        }
        let mut found = bundles.rootfs_in_use();
        found.sort();
        assert_eq!(
            found,
            [
                PathBuf::from("/t/layers/k"),
                PathBuf::from("/t/mounts/base-1")
            ]
        );
    }
}
