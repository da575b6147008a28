//! Snapshots: saved states of sandboxes that new sandboxes start from, each its key's own.

use super::{Store, StoreError, VolumeMount};
use crate::ids::{SandboxId, TemplateName};
use rusqlite::params;
use std::path::PathBuf;

/// A saved state of a sandbox that new sandboxes can start from (E2B's snapshots). Each belongs
/// to one API key, and its name is unique among that key's snapshots only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    /// Also the name `Sandbox.create()` takes in place of a template (its owner's only).
    pub id: TemplateName,
    /// The driver's checkpoint image.
    pub image: String,
    /// The template the source sandbox was created from, and its rootfs.
    pub template: TemplateName,
    pub rootfs: PathBuf,
    pub source_sandbox: SandboxId,
    /// The source's access token, which the agents restored from it hold until `/init`.
    pub access_token: Option<String>,
    pub created_at: i64,
    /// Id of the API key that took it. Empty for snapshots from before keys had owners, which
    /// no key sees.
    pub owner: String,
    /// The disk its image takes.
    pub size_bytes: u64,
    /// The source's volumes: the image holds where they are bound, not their files.
    pub volume_mounts: Vec<VolumeMount>,
}

impl Store {
    /// Records a snapshot, replacing its owner's snapshot of the same name (never another
    /// owner's).
    pub fn insert_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT OR REPLACE INTO snapshots (id, image, template, rootfs, source_sandbox,
             access_token, created_at, owner, size_bytes, volume_mounts)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                s.id.as_str(),
                s.image,
                s.template.as_str(),
                s.rootfs.to_string_lossy(),
                s.source_sandbox.as_str(),
                s.access_token,
                s.created_at,
                s.owner,
                s.size_bytes as i64,
                serde_json::to_string(&s.volume_mounts).expect("mounts serialize"),
            ],
        )?;
        Ok(())
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, image, template, rootfs, source_sandbox, access_token, created_at, owner,
             size_bytes, volume_mounts FROM snapshots ORDER BY created_at, id",
        )?;
        let rows = stmt.query_map([], |row| {
            let id: String = row.get(0)?;
            let corrupt = |_| StoreError::Corrupt(id.clone());
            Ok((|| -> Result<SnapshotRecord, StoreError> {
                Ok(SnapshotRecord {
                    id: TemplateName::parse(&id).map_err(corrupt)?,
                    image: row.get(1)?,
                    template: TemplateName::parse(&row.get::<_, String>(2)?).map_err(corrupt)?,
                    rootfs: PathBuf::from(row.get::<_, String>(3)?),
                    source_sandbox: SandboxId::parse(&row.get::<_, String>(4)?).map_err(corrupt)?,
                    access_token: row.get(5)?,
                    created_at: row.get(6)?,
                    owner: row.get(7)?,
                    size_bytes: row.get::<_, i64>(8)?.max(0) as u64,
                    volume_mounts: serde_json::from_str(&row.get::<_, String>(9)?)
                        .map_err(|_| StoreError::Corrupt(id.clone()))?,
                })
            })())
        })?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row??);
        }
        Ok(out)
    }

    /// `owner`'s snapshot called `id`; another owner's is not found.
    pub fn snapshot(
        &self,
        owner: &str,
        id: &TemplateName,
    ) -> Result<Option<SnapshotRecord>, StoreError> {
        Ok(self
            .snapshots()?
            .into_iter()
            .find(|s| s.owner == owner && s.id == *id))
    }

    /// Deletes `owner`'s snapshot called `id`; returns whether it existed.
    pub fn delete_snapshot(&self, owner: &str, id: &TemplateName) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "DELETE FROM snapshots WHERE owner = ?1 AND id = ?2",
            params![owner, id.as_str()],
        )?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    #[test]
    fn snapshots_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let snap = SnapshotRecord {
            id: TemplateName::parse("snap1").unwrap(),
            image: "snapshot-snap1".into(),
            template: TemplateName::parse("base").unwrap(),
            rootfs: "/t/rootfs".into(),
            source_sandbox: SandboxId::parse("a1").unwrap(),
            access_token: Some("tok".into()),
            created_at: 3,
            owner: "k1".into(),
            size_bytes: 4096,
            volume_mounts: Vec::new(),
        };
        store.insert_snapshot(&snap).unwrap();
        // Another key's snapshot of the same name lives beside it, and neither sees the other.
        let theirs = SnapshotRecord {
            owner: "k2".into(),
            image: "snapshot-k2-snap1".into(),
            ..snap.clone()
        };
        store.insert_snapshot(&theirs).unwrap();
        assert_eq!(store.snapshot("k1", &snap.id).unwrap(), Some(snap.clone()));
        assert_eq!(store.snapshot("k2", &snap.id).unwrap(), Some(theirs));
        assert_eq!(store.snapshot("k3", &snap.id).unwrap(), None);
        assert!(!store.delete_snapshot("k3", &snap.id).unwrap());
        assert!(store.delete_snapshot("k1", &snap.id).unwrap());
        assert!(!store.delete_snapshot("k1", &snap.id).unwrap());
        assert!(store.snapshot("k2", &snap.id).unwrap().is_some());
    }

    #[test]
    fn snapshots_from_before_owners_are_migrated_to_no_owner() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("airlock.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE snapshots (id TEXT PRIMARY KEY, image TEXT NOT NULL,
               template TEXT NOT NULL, rootfs TEXT NOT NULL, source_sandbox TEXT NOT NULL,
               access_token TEXT, created_at INTEGER NOT NULL, owner TEXT);
             INSERT INTO snapshots VALUES ('old', 'snapshot-old', 'base', '/t', 'a1', NULL, 1, NULL);
             INSERT INTO snapshots VALUES ('mine', 'snapshot-mine', 'base', '/t', 'a1', NULL, 2, 'k1');",
        )
        .unwrap();
        drop(conn);
        let store = Store::open(&path).unwrap();
        let name = |n: &str| TemplateName::parse(n).unwrap();
        assert_eq!(
            store.snapshot("", &name("old")).unwrap().unwrap().image,
            "snapshot-old"
        );
        assert!(store.snapshot("k1", &name("mine")).unwrap().is_some());
        assert_eq!(store.snapshots().unwrap().len(), 2);
    }
}
