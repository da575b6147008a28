//! State in one SQLite file under the data dir: sandboxes, templates and API keys.
//!
//! Every write is a single statement, so a `kill -9` at any point leaves a consistent file.

use crate::ids::{SandboxId, TemplateName};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored row for {0} is corrupt")]
    Corrupt(String),
}

/// A sandbox as recorded; enough to adopt it after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRecord {
    pub id: SandboxId,
    pub template: TemplateName,
    pub slot: u32,
    /// `None` when the sandbox was created with `secure: false`.
    pub access_token: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// Unix seconds.
    pub started_at: i64,
    /// Unix seconds; the sandbox is killed when this passes.
    pub end_at: i64,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_mb: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    pub name: TemplateName,
    pub content_hash: String,
    pub rootfs: PathBuf,
    pub built_at: i64,
    pub size_bytes: u64,
}

pub struct Store {
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    template TEXT NOT NULL,
    slot INTEGER NOT NULL UNIQUE,
    access_token TEXT,
    metadata TEXT NOT NULL,
    env_vars TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    end_at INTEGER NOT NULL,
    cpu_count INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    disk_mb INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS templates (
    name TEXT PRIMARY KEY,
    content_hash TEXT NOT NULL,
    rootfs TEXT NOT NULL,
    built_at INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    sha256 TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);
";

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        // WAL lets the CLI read while the server writes; the busy timeout covers short overlaps.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ------------------------------------------------------------ sandboxes

    pub fn insert_sandbox(&self, r: &SandboxRecord) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO sandboxes (id, template, slot, access_token, metadata, env_vars, started_at,
             end_at, cpu_count, memory_mb, disk_mb) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                r.id.as_str(),
                r.template.as_str(),
                r.slot,
                r.access_token,
                serde_json::to_string(&r.metadata).expect("map serializes"),
                serde_json::to_string(&r.env_vars).expect("map serializes"),
                r.started_at,
                r.end_at,
                r.cpu_count,
                r.memory_mb,
                r.disk_mb
            ],
        )?;
        Ok(())
    }

    pub fn set_end_at(&self, id: &SandboxId, end_at: i64) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "UPDATE sandboxes SET end_at = ?2 WHERE id = ?1",
            params![id.as_str(), end_at],
        )?;
        Ok(n == 1)
    }

    pub fn delete_sandbox(&self, id: &SandboxId) -> Result<(), StoreError> {
        self.conn()
            .execute("DELETE FROM sandboxes WHERE id = ?1", params![id.as_str()])?;
        Ok(())
    }

    pub fn sandboxes(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, template, slot, access_token, metadata, env_vars, started_at, end_at,
             cpu_count, memory_mb, disk_mb FROM sandboxes ORDER BY started_at, id",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, u32>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, String>(4)?,
                row.get::<_, String>(5)?,
                row.get::<_, i64>(6)?,
                row.get::<_, i64>(7)?,
                row.get::<_, u32>(8)?,
                row.get::<_, u32>(9)?,
                row.get::<_, u32>(10)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, template, slot, token, metadata, env_vars, started, end, cpu, mem, disk) =
                row?;
            let corrupt = || StoreError::Corrupt(id.clone());
            out.push(SandboxRecord {
                id: SandboxId::parse(&id).map_err(|_| corrupt())?,
                template: TemplateName::parse(&template).map_err(|_| corrupt())?,
                slot,
                access_token: token,
                metadata: serde_json::from_str(&metadata).map_err(|_| corrupt())?,
                env_vars: serde_json::from_str(&env_vars).map_err(|_| corrupt())?,
                started_at: started,
                end_at: end,
                cpu_count: cpu,
                memory_mb: mem,
                disk_mb: disk,
            });
        }
        Ok(out)
    }

    // ------------------------------------------------------------ templates

    pub fn put_template(&self, t: &TemplateRecord) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT OR REPLACE INTO templates (name, content_hash, rootfs, built_at, size_bytes)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                t.name.as_str(),
                t.content_hash,
                t.rootfs.to_string_lossy(),
                t.built_at,
                t.size_bytes as i64
            ],
        )?;
        Ok(())
    }

    pub fn template(&self, name: &TemplateName) -> Result<Option<TemplateRecord>, StoreError> {
        Ok(self.templates()?.into_iter().find(|t| t.name == *name))
    }

    pub fn templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT name, content_hash, rootfs, built_at, size_bytes FROM templates ORDER BY name",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, i64>(3)?,
                row.get::<_, i64>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (name, hash, rootfs, built_at, size) = row?;
            out.push(TemplateRecord {
                name: TemplateName::parse(&name).map_err(|_| StoreError::Corrupt(name.clone()))?,
                content_hash: hash,
                rootfs: PathBuf::from(rootfs),
                built_at,
                size_bytes: size.max(0) as u64,
            });
        }
        Ok(out)
    }

    // ------------------------------------------------------------ API keys

    pub fn add_api_key_hash(&self, sha256_hex: &str, created_at: i64) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT OR IGNORE INTO api_keys (sha256, created_at) VALUES (?1, ?2)",
            params![sha256_hex, created_at],
        )?;
        Ok(())
    }

    pub fn has_api_key_hash(&self, sha256_hex: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM api_keys WHERE sha256 = ?1",
                params![sha256_hex],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    pub fn api_key_count(&self) -> Result<u64, StoreError> {
        Ok(self
            .conn()
            .query_row("SELECT COUNT(*) FROM api_keys", [], |r| r.get::<_, i64>(0))?
            .max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, slot: u32) -> SandboxRecord {
        SandboxRecord {
            id: SandboxId::parse(id).unwrap(),
            template: TemplateName::parse("base").unwrap(),
            slot,
            access_token: Some("tok".into()),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            env_vars: BTreeMap::new(),
            started_at: 10,
            end_at: 20,
            cpu_count: 2,
            memory_mb: 1024,
            disk_mb: 5120,
        }
    }

    #[test]
    fn sandboxes_round_trip_and_slots_stay_unique() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("airlock.db");
        let store = Store::open(&path).unwrap();
        store.insert_sandbox(&record("a1", 0)).unwrap();
        assert!(
            store.insert_sandbox(&record("b2", 0)).is_err(),
            "slot reuse must fail"
        );
        store.insert_sandbox(&record("b2", 1)).unwrap();
        assert!(store
            .set_end_at(&SandboxId::parse("a1").unwrap(), 99)
            .unwrap());
        drop(store);

        let store = Store::open(&path).unwrap();
        let all = store.sandboxes().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].end_at, 99);
        assert_eq!(all[1], record("b2", 1));
        store.delete_sandbox(&all[0].id).unwrap();
        assert_eq!(store.sandboxes().unwrap().len(), 1);
    }

    #[test]
    fn templates_and_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let t = TemplateRecord {
            name: TemplateName::parse("base").unwrap(),
            content_hash: "abc".into(),
            rootfs: "/x/rootfs".into(),
            built_at: 5,
            size_bytes: 7,
        };
        store.put_template(&t).unwrap();
        assert_eq!(store.template(&t.name).unwrap(), Some(t));
        assert_eq!(store.api_key_count().unwrap(), 0);
        store.add_api_key_hash("h", 1).unwrap();
        assert!(store.has_api_key_hash("h").unwrap());
        assert!(!store.has_api_key_hash("g").unwrap());
    }
}
