//! Templates' records: the built root filesystems (built-ins by name, users' builds by build
//! id), the templates API keys own, their builds, logs and tags. One owner, [`Templates`], on
//! SQLite or PostgreSQL ([`Db`]); the builds' and tags' calls are in `builds.rs`, `tags.rs` and
//! `user_templates.rs`.

use super::db::{Db, Row};
use super::StoreError;
use crate::ids::TemplateName;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    /// A built-in's name, or the id of a user template's build (see `store::tags`).
    pub name: TemplateName,
    pub content_hash: String,
    pub rootfs: PathBuf,
    pub built_at: i64,
    pub size_bytes: u64,
    /// For a rootfs that is a read-only overlay mount of layers (a user template's): the
    /// directories it stacks, bottom first. Empty for a plain directory.
    pub layers: Vec<PathBuf>,
    pub defaults: TemplateDefaults,
}

/// What a template's sandboxes start with: its last `USER`, `WORKDIR` and `ENV`, and the
/// command that runs when one boots (already running in its golden image).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TemplateDefaults {
    pub user: String,
    /// `None`: the user's home.
    #[serde(default)]
    pub workdir: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Started in the background as the template boots (E2B's `startCmd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    /// Run until it exits 0 before the sandbox counts as started (E2B's `readyCmd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
}

impl Default for TemplateDefaults {
    /// E2B's: `user`, in its home.
    fn default() -> Self {
        TemplateDefaults {
            user: "user".into(),
            workdir: None,
            env: BTreeMap::new(),
            start_cmd: None,
            ready_cmd: None,
        }
    }
}

/// The templates' tables, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct Templates {
    pub(super) db: Db,
}

fn record(row: &Row) -> Result<TemplateRecord, StoreError> {
    let name: String = row.get(0)?;
    let corrupt = |_| StoreError::Corrupt(name.clone());
    Ok(TemplateRecord {
        content_hash: row.get(1)?,
        rootfs: PathBuf::from(row.get::<String>(2)?),
        built_at: row.get(3)?,
        size_bytes: row.get::<i64>(4)?.max(0) as u64,
        layers: serde_json::from_str(&row.get::<String>(5)?).map_err(corrupt)?,
        defaults: match row.get::<Option<String>>(6)? {
            Some(d) => serde_json::from_str(&d).map_err(corrupt)?,
            None => TemplateDefaults::default(),
        },
        name: TemplateName::parse(&name).map_err(|_| StoreError::Corrupt(name.clone()))?,
    })
}

const RECORD_COLUMNS: &str =
    "name, content_hash, rootfs, built_at, size_bytes, layers, defaults FROM templates";

/// A bare record for tests: no layers, the default user, built at 0.
#[cfg(test)]
impl TemplateRecord {
    pub(crate) fn bare(name: &str, content_hash: &str, rootfs: PathBuf) -> TemplateRecord {
        TemplateRecord {
            name: TemplateName::parse(name).unwrap(),
            content_hash: content_hash.into(),
            rootfs,
            built_at: 0,
            size_bytes: 0,
            layers: Vec::new(),
            defaults: TemplateDefaults::default(),
        }
    }
}

impl Templates {
    pub fn new(db: Db) -> Templates {
        Templates { db }
    }

    /// Records a built root filesystem, in place of one of the same name.
    pub async fn put(&self, t: &TemplateRecord) -> Result<(), StoreError> {
        let layers = serde_json::to_string(&t.layers).expect("paths serialize");
        let defaults = serde_json::to_string(&t.defaults).expect("defaults serialize");
        let rootfs = t.rootfs.to_string_lossy();
        self.db
            .execute(
                "INSERT INTO templates
                   (name, content_hash, rootfs, built_at, size_bytes, layers, defaults)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (name) DO UPDATE SET content_hash = excluded.content_hash,
                   rootfs = excluded.rootfs, built_at = excluded.built_at,
                   size_bytes = excluded.size_bytes, layers = excluded.layers,
                   defaults = excluded.defaults",
                &[
                    t.name.as_str().into(),
                    t.content_hash.as_str().into(),
                    rootfs.as_ref().into(),
                    t.built_at.into(),
                    (t.size_bytes as i64).into(),
                    layers.as_str().into(),
                    defaults.as_str().into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// The built root filesystem recorded under `name`.
    pub async fn get(&self, name: &TemplateName) -> Result<Option<TemplateRecord>, StoreError> {
        let sql = format!("SELECT {RECORD_COLUMNS} WHERE name = $1");
        self.db
            .query_opt(&sql, &[name.as_str().into()], record)
            .await
    }

    /// Every built root filesystem, by name.
    pub async fn all(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        let sql = format!("SELECT {RECORD_COLUMNS} ORDER BY name");
        self.db.query(&sql, &[], record).await
    }
}
