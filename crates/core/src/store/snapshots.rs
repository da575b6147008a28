//! Snapshots: saved states of sandboxes that new sandboxes start from, each its key's own.

use super::db::{Db, Row};
use super::{StoreError, VolumeMount};
use crate::ids::{SandboxId, TemplateName};
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

const COLUMNS: &str = "id, image, template, rootfs, source_sandbox, access_token, created_at, \
                       owner, size_bytes, volume_mounts";

fn record(row: &Row) -> Result<SnapshotRecord, StoreError> {
    let id: String = row.get(0)?;
    let corrupt = |_| StoreError::Corrupt(id.clone());
    Ok(SnapshotRecord {
        id: TemplateName::parse(&id).map_err(corrupt)?,
        image: row.get(1)?,
        template: TemplateName::parse(&row.get::<String>(2)?).map_err(corrupt)?,
        rootfs: PathBuf::from(row.get::<String>(3)?),
        source_sandbox: SandboxId::parse(&row.get::<String>(4)?).map_err(corrupt)?,
        access_token: row.get(5)?,
        created_at: row.get(6)?,
        owner: row.get(7)?,
        size_bytes: row.get::<i64>(8)?.max(0) as u64,
        volume_mounts: serde_json::from_str(&row.get::<String>(9)?)
            .map_err(|_| StoreError::Corrupt(id.clone()))?,
    })
}

/// The snapshots' table, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct SnapshotRecords {
    db: Db,
}

impl SnapshotRecords {
    pub fn new(db: Db) -> SnapshotRecords {
        SnapshotRecords { db }
    }

    /// Records a snapshot, replacing its owner's snapshot of the same name (never another
    /// owner's).
    pub async fn put(&self, s: &SnapshotRecord) -> Result<(), StoreError> {
        let rootfs = s.rootfs.to_string_lossy();
        let mounts = serde_json::to_string(&s.volume_mounts).expect("mounts serialize");
        self.db
            .execute(
                &format!(
                    "INSERT INTO snapshots ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                     ON CONFLICT (owner, id) DO UPDATE SET image = excluded.image,
                     template = excluded.template, rootfs = excluded.rootfs,
                     source_sandbox = excluded.source_sandbox,
                     access_token = excluded.access_token, created_at = excluded.created_at,
                     size_bytes = excluded.size_bytes, volume_mounts = excluded.volume_mounts"
                ),
                &[
                    s.id.as_str().into(),
                    s.image.as_str().into(),
                    s.template.as_str().into(),
                    rootfs.as_ref().into(),
                    s.source_sandbox.as_str().into(),
                    s.access_token.as_deref().into(),
                    s.created_at.into(),
                    s.owner.as_str().into(),
                    (s.size_bytes.min(i64::MAX as u64) as i64).into(),
                    mounts.as_str().into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Every snapshot, oldest first.
    pub async fn all(&self) -> Result<Vec<SnapshotRecord>, StoreError> {
        self.db
            .query(
                &format!("SELECT {COLUMNS} FROM snapshots ORDER BY created_at, id"),
                &[],
                record,
            )
            .await
    }

    /// `owner`'s snapshots, oldest first.
    pub async fn of(&self, owner: &str) -> Result<Vec<SnapshotRecord>, StoreError> {
        self.db
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM snapshots WHERE owner = $1 ORDER BY created_at, id"
                ),
                &[owner.into()],
                record,
            )
            .await
    }

    /// `owner`'s snapshot called `id`; another owner's is not found.
    pub async fn get(
        &self,
        owner: &str,
        id: &TemplateName,
    ) -> Result<Option<SnapshotRecord>, StoreError> {
        self.db
            .query_opt(
                &format!("SELECT {COLUMNS} FROM snapshots WHERE owner = $1 AND id = $2"),
                &[owner.into(), id.as_str().into()],
                record,
            )
            .await
    }

    /// The disk `owner`'s snapshots take, in bytes.
    pub async fn bytes_of(&self, owner: &str) -> Result<u64, StoreError> {
        let bytes = self
            .db
            .query_opt(
                "SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) FROM snapshots
                 WHERE owner = $1",
                &[owner.into()],
                |row| row.get::<i64>(0),
            )
            .await?;
        Ok(bytes.unwrap_or(0).max(0) as u64)
    }

    /// Deletes `owner`'s snapshot called `id`; returns whether it existed.
    pub async fn delete(&self, owner: &str, id: &TemplateName) -> Result<bool, StoreError> {
        let n = self
            .db
            .execute(
                "DELETE FROM snapshots WHERE owner = $1 AND id = $2",
                &[owner.into(), id.as_str().into()],
            )
            .await?;
        Ok(n == 1)
    }
}

/// What both backends must do alike; run on SQLite below and on PostgreSQL by
/// `store::postgres_tests`.
#[cfg(test)]
pub(crate) async fn behaves(snapshots: &SnapshotRecords) {
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
        volume_mounts: vec![VolumeMount {
            volume_id: "v1".into(),
            name: "data".into(),
            path: "/mnt/data".into(),
        }],
    };
    snapshots.put(&snap).await.unwrap();
    // Another key's snapshot of the same name lives beside it, and neither sees the other.
    let theirs = SnapshotRecord {
        owner: "k2".into(),
        image: "snapshot-k2-snap1".into(),
        access_token: None,
        ..snap.clone()
    };
    snapshots.put(&theirs).await.unwrap();
    assert_eq!(
        snapshots.get("k1", &snap.id).await.unwrap(),
        Some(snap.clone())
    );
    assert_eq!(
        snapshots.get("k2", &snap.id).await.unwrap(),
        Some(theirs.clone())
    );
    assert_eq!(snapshots.get("k3", &snap.id).await.unwrap(), None);
    assert_eq!(snapshots.all().await.unwrap().len(), 2);
    assert_eq!(snapshots.of("k2").await.unwrap(), [theirs]);

    // The same name again replaces the owner's own.
    let again = SnapshotRecord {
        size_bytes: 1 << 40,
        created_at: 4,
        ..snap.clone()
    };
    snapshots.put(&again).await.unwrap();
    assert_eq!(snapshots.of("k1").await.unwrap(), [again]);
    assert_eq!(snapshots.bytes_of("k1").await.unwrap(), 1 << 40);
    assert_eq!(snapshots.bytes_of("k3").await.unwrap(), 0);

    assert!(!snapshots.delete("k3", &snap.id).await.unwrap());
    assert!(snapshots.delete("k1", &snap.id).await.unwrap());
    assert!(!snapshots.delete("k1", &snap.id).await.unwrap());
    assert!(snapshots.get("k2", &snap.id).await.unwrap().is_some());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use rusqlite::Connection;

    #[tokio::test]
    async fn snapshots_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        behaves(store.snapshots()).await;
    }

    #[tokio::test]
    async fn snapshots_from_before_owners_are_migrated_to_no_owner() {
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
        let snapshots = store.snapshots();
        let name = |n: &str| TemplateName::parse(n).unwrap();
        assert_eq!(
            snapshots
                .get("", &name("old"))
                .await
                .unwrap()
                .unwrap()
                .image,
            "snapshot-old"
        );
        assert!(snapshots.get("k1", &name("mine")).await.unwrap().is_some());
        assert_eq!(snapshots.all().await.unwrap().len(), 2);
    }
}
