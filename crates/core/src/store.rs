//! State in one SQLite file under the data dir: sandboxes, templates, snapshots and API keys.
//! The API keys ([`Keys`]), the templates ([`Templates`]), the snapshots' and the volumes'
//! records ([`SnapshotRecords`], [`VolumeRecords`]) already run on [`db::Db`], which is SQLite
//! here and PostgreSQL for many machines; the sandboxes' records follow.
//!
//! Every write is one statement or one transaction, so a `kill -9` at any point leaves a
//! consistent file.

use crate::driver::Resources;
use crate::egress::Egress;
use crate::ids::{SandboxId, TemplateName};
use rusqlite::{params, Connection};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

mod builds;
pub mod db;
mod events;
mod idempotency;
mod keys;
pub(crate) mod migrations;
#[cfg(test)]
mod postgres_tests;
mod snapshots;
mod tags;
mod templates;
#[cfg(test)]
mod templates_tests;
mod user_templates;
mod volumes;
pub use builds::{BuildRecord, BuildStatus, LogEntry, LogLevel};
pub use events::{EventQuery, EventRecords, EventType, SandboxEvent, EVENT_RETENTION_US};
pub use idempotency::{Claim, IdempotencyRecords};
pub use keys::{key_id, ApiKeyRecord, KeyLimits, Keys, LiveKey};
pub use snapshots::{SnapshotRecord, SnapshotRecords};
pub use tags::{split_reference, valid_tag, TemplateTag, DEFAULT_TAG};
pub use templates::{TemplateDefaults, TemplateRecord, Templates};
pub use user_templates::UserTemplate;
pub use volumes::{
    valid_volume_name, VolumeMount, VolumeQuota, VolumeRecord, VolumeRecords, VolumeUsage,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored row for {0} is corrupt")]
    Corrupt(String),
    #[error("creating the database file")]
    Create(#[source] std::io::Error),
    #[error("bringing the database's schema up to date")]
    Migrate(#[source] refinery::Error),
    #[error("PostgreSQL error")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("setting up the PostgreSQL pool: {0}")]
    Pool(String),
    #[error("PostgreSQL cannot be reached: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// The database cannot be reached now (PostgreSQL down, or no connection to it): a retry
    /// may succeed, which the API says with 503.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            // A lost connection, or one that could not be made (refused, timed out); not a
            // refused statement or a password the server turned down.
            StoreError::Postgres(e) => {
                e.is_closed()
                    || std::iter::successors(std::error::Error::source(e), |s| s.source())
                        .any(|s| s.is::<std::io::Error>())
            }
            _ => false,
        }
    }
}

/// Whether a sandbox runs or sits on disk as a checkpoint image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Running,
    Paused,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(SandboxState::Running),
            "paused" => Some(SandboxState::Paused),
            _ => None,
        }
    }
}

/// What a pause saves (E2B's pause `memory` flag and `pauseMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PauseMode {
    /// Memory, processes and files: a resume goes on where it left off.
    #[default]
    Full,
    /// Files only: the sandbox's processes end first, and a resume starts it afresh on them.
    Filesystem,
}

impl PauseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseMode::Full => "full",
            PauseMode::Filesystem => "filesystem",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "full" => Some(PauseMode::Full),
            "filesystem" => Some(PauseMode::Filesystem),
            _ => None,
        }
    }
}

/// A sandbox as recorded; enough to adopt or resume it after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRecord {
    pub id: SandboxId,
    /// The template (or snapshot) it was created from.
    pub template: TemplateName,
    /// The read-only root filesystem under its writable layer; a resume needs the same one.
    pub rootfs: PathBuf,
    pub state: SandboxState,
    /// The network slot while running; a paused sandbox holds none.
    pub slot: Option<u32>,
    /// `None` when the sandbox was created with `secure: false`.
    pub access_token: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// Unix microseconds. A server gives each create a later one than the last, so it also
    /// orders creates: lists are by it, and two sandboxes never tie.
    pub started_at_us: i64,
    /// Unix seconds; the sandbox is killed when this passes.
    pub end_at: i64,
    pub resources: Resources,
    /// Pause instead of kill when the timeout passes (E2B's `lifecycle.onTimeout = "pause"`).
    pub pause_on_timeout: bool,
    /// How that pause pauses (E2B's `autoPauseMemory`).
    pub timeout_pause: PauseMode,
    /// What its latest pause saved, while it is paused.
    pub pause_mode: Option<PauseMode>,
    /// Resume when a request for it comes through the proxy (E2B's `autoResume`).
    pub auto_resume: bool,
    /// Id of the API key that created it; only that key sees it. `None` for sandboxes from
    /// before keys had owners, which no key sees.
    pub owner: Option<String>,
    /// Its outbound network policy.
    pub egress: Egress,
    /// Its volumes, in the order the driver hands them to it.
    pub volume_mounts: Vec<VolumeMount>,
    /// What the SDK must send in `E2B-Traffic-Access-Token` to reach the code interpreter's
    /// context routes, and every user port when `require_traffic_token` is set.
    pub traffic_access_token: Option<String>,
    /// E2B's `allowPublicTraffic: false`: its user ports demand the traffic token.
    pub require_traffic_token: bool,
}

pub struct Store {
    conn: Arc<Mutex<Connection>>,
    keys: Keys,
    snapshots: SnapshotRecords,
    templates: Templates,
    volumes: VolumeRecords,
    events: EventRecords,
    idempotency: IdempotencyRecords,
}

impl Store {
    /// Opens the database at `path`, creating it (mode 0600: it holds every sandbox's tokens)
    /// if missing. SQLite gives its `-wal` and `-shm` files the same mode.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(StoreError::Create)?;
        }
        let mut conn = Connection::open(path)?;
        // WAL lets the CLI read while the server writes; the busy timeout covers short overlaps.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        migrations::migrate(&mut conn)?;
        let conn = Arc::new(Mutex::new(conn));
        let db = db::Db::Sqlite(conn.clone());
        Ok(Store {
            keys: Keys::new(db.clone()),
            snapshots: SnapshotRecords::new(db.clone()),
            templates: Templates::new(db.clone()),
            events: EventRecords::new(db.clone()),
            idempotency: IdempotencyRecords::new(db.clone()),
            volumes: VolumeRecords::new(db),
            conn,
        })
    }

    /// The API keys, which gateways will read from PostgreSQL.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The snapshots' records, which gateways will read from PostgreSQL.
    pub fn snapshots(&self) -> &SnapshotRecords {
        &self.snapshots
    }

    /// The templates, their builds and tags, which gateways will read from PostgreSQL.
    pub fn templates(&self) -> &Templates {
        &self.templates
    }

    /// The volumes' records, which gateways will read from PostgreSQL.
    pub fn volumes(&self) -> &VolumeRecords {
        &self.volumes
    }

    /// Sandboxes' lifecycle events.
    pub fn events(&self) -> &EventRecords {
        &self.events
    }

    /// The claims of creates sent with an `Idempotency-Key`.
    pub fn idempotency(&self) -> &IdempotencyRecords {
        &self.idempotency
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        db::lock(&self.conn)
    }

    // ------------------------------------------------------------ sandboxes

    pub fn insert_sandbox(&self, r: &SandboxRecord) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO sandboxes (id, template, rootfs, state, slot, access_token, metadata,
             env_vars, started_at_us, end_at, cpu_count, memory_mb, disk_mb, pause_on_timeout,
             auto_resume, owner, egress, traffic_access_token, require_traffic_token,
             timeout_pause, pause_mode, volume_mounts)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
             ?18, ?19, ?20, ?21, ?22)",
            params![
                r.id.as_str(),
                r.template.as_str(),
                r.rootfs.to_string_lossy(),
                r.state.as_str(),
                r.slot,
                r.access_token,
                serde_json::to_string(&r.metadata).expect("map serializes"),
                serde_json::to_string(&r.env_vars).expect("map serializes"),
                r.started_at_us,
                r.end_at,
                r.resources.cpu_count,
                r.resources.memory_mb,
                r.resources.disk_mb,
                r.pause_on_timeout,
                r.auto_resume,
                r.owner,
                serde_json::to_string(&r.egress).expect("policy serializes"),
                r.traffic_access_token,
                r.require_traffic_token,
                r.timeout_pause.as_str(),
                r.pause_mode.map(PauseMode::as_str),
                serde_json::to_string(&r.volume_mounts).expect("mounts serialize"),
            ],
        )?;
        Ok(())
    }

    /// Records a pause (no slot, and what it saved) or a resume (a slot and a new deadline).
    pub fn set_state(
        &self,
        id: &SandboxId,
        state: SandboxState,
        slot: Option<u32>,
        end_at: i64,
        pause_mode: Option<PauseMode>,
    ) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE sandboxes SET state = ?2, slot = ?3, end_at = ?4, pause_mode = ?5
             WHERE id = ?1",
            params![
                id.as_str(),
                state.as_str(),
                slot,
                end_at,
                pause_mode.map(PauseMode::as_str)
            ],
        )?;
        Ok(())
    }

    /// Records a sandbox's network settings (`update_network`).
    pub fn set_network(
        &self,
        id: &SandboxId,
        egress: &Egress,
        require_traffic_token: bool,
    ) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE sandboxes SET egress = ?2, require_traffic_token = ?3 WHERE id = ?1",
            params![
                id.as_str(),
                serde_json::to_string(egress).expect("policy serializes"),
                require_traffic_token
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
            "SELECT id, template, rootfs, state, slot, access_token, metadata, env_vars,
             started_at_us, end_at, cpu_count, memory_mb, disk_mb, pause_on_timeout,
             auto_resume, owner, egress, traffic_access_token, require_traffic_token,
             timeout_pause, pause_mode, volume_mounts FROM sandboxes ORDER BY started_at_us, id",
        )?;
        let rows = stmt.query_map([], |row| {
            let id: String = row.get(0)?;
            let corrupt = |_| StoreError::Corrupt(id.clone());
            let text = |i| row.get::<_, String>(i);
            Ok((|| -> Result<SandboxRecord, StoreError> {
                Ok(SandboxRecord {
                    id: SandboxId::parse(&id).map_err(corrupt)?,
                    template: TemplateName::parse(&text(1)?).map_err(corrupt)?,
                    rootfs: PathBuf::from(text(2)?),
                    state: SandboxState::parse(&text(3)?)
                        .ok_or_else(|| StoreError::Corrupt(id.clone()))?,
                    slot: row.get(4)?,
                    access_token: row.get(5)?,
                    metadata: serde_json::from_str(&text(6)?)
                        .map_err(|_| StoreError::Corrupt(id.clone()))?,
                    env_vars: serde_json::from_str(&text(7)?)
                        .map_err(|_| StoreError::Corrupt(id.clone()))?,
                    started_at_us: row.get(8)?,
                    end_at: row.get(9)?,
                    resources: Resources {
                        cpu_count: row.get(10)?,
                        memory_mb: row.get(11)?,
                        disk_mb: row.get(12)?,
                    },
                    pause_on_timeout: row.get(13)?,
                    auto_resume: row.get(14)?,
                    owner: row.get(15)?,
                    egress: serde_json::from_str(&text(16)?)
                        .map_err(|_| StoreError::Corrupt(id.clone()))?,
                    traffic_access_token: row.get(17)?,
                    require_traffic_token: row.get(18)?,
                    timeout_pause: PauseMode::parse(&text(19)?)
                        .ok_or_else(|| StoreError::Corrupt(id.clone()))?,
                    pause_mode: match row.get::<_, Option<String>>(20)? {
                        Some(mode) => Some(
                            PauseMode::parse(&mode)
                                .ok_or_else(|| StoreError::Corrupt(id.clone()))?,
                        ),
                        None => None,
                    },
                    volume_mounts: serde_json::from_str(&text(21)?)
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

    pub fn sandbox(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        Ok(self.sandboxes()?.into_iter().find(|r| r.id == *id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, slot: u32) -> SandboxRecord {
        SandboxRecord {
            id: SandboxId::parse(id).unwrap(),
            template: TemplateName::parse("base").unwrap(),
            rootfs: "/t/rootfs".into(),
            state: SandboxState::Running,
            slot: Some(slot),
            access_token: Some("tok".into()),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            env_vars: BTreeMap::new(),
            started_at_us: 10,
            end_at: 20,
            resources: Resources {
                cpu_count: 2,
                memory_mb: 1024,
                disk_mb: 5120,
            },
            pause_on_timeout: true,
            timeout_pause: PauseMode::Filesystem,
            pause_mode: None,
            auto_resume: false,
            owner: Some("k1".into()),
            egress: Egress::from_request(Some(false), &["1.1.1.1".into()], &[]).unwrap(),
            traffic_access_token: Some("traffic".into()),
            require_traffic_token: true,
            volume_mounts: vec![VolumeMount {
                volume_id: "v1".into(),
                name: "data".into(),
                path: "/mnt/data".into(),
            }],
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

        // Paused sandboxes hold no slot, so several can coexist.
        store
            .set_state(
                &all[1].id,
                SandboxState::Paused,
                None,
                0,
                Some(PauseMode::Filesystem),
            )
            .unwrap();
        let mut c = record("c3", 0);
        c.state = SandboxState::Paused;
        c.slot = None;
        store.insert_sandbox(&c).unwrap();
        let paused = store.sandboxes().unwrap();
        assert!(paused
            .iter()
            .all(|r| r.state == SandboxState::Paused && r.slot.is_none()));
        let modes: Vec<_> = paused.iter().map(|r| r.pause_mode).collect();
        assert_eq!(modes, [Some(PauseMode::Filesystem), None]);
    }

    #[tokio::test]
    async fn a_new_database_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("airlock.db");
        let store = Store::open(&path).unwrap();
        let limits = KeyLimits::default();
        let write = store
            .keys()
            .add("00", "a write, so the WAL exists", 1, limits, false);
        write.await.unwrap();
        for file in ["airlock.db", "airlock.db-wal", "airlock.db-shm"] {
            let md = std::fs::metadata(dir.path().join(file)).unwrap();
            assert_eq!(md.permissions().mode() & 0o777, 0o600, "{file}");
        }
    }

    #[test]
    fn old_databases_are_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("airlock.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, template TEXT NOT NULL,
               slot INTEGER NOT NULL UNIQUE, access_token TEXT, metadata TEXT NOT NULL,
               env_vars TEXT NOT NULL, started_at INTEGER NOT NULL, end_at INTEGER NOT NULL,
               cpu_count INTEGER NOT NULL, memory_mb INTEGER NOT NULL, disk_mb INTEGER NOT NULL);
             CREATE TABLE templates (name TEXT PRIMARY KEY, content_hash TEXT NOT NULL,
               rootfs TEXT NOT NULL, built_at INTEGER NOT NULL, size_bytes INTEGER NOT NULL);
             INSERT INTO templates VALUES ('base', 'h', '/t/rootfs', 1, 1);
             INSERT INTO sandboxes VALUES ('a1', 'base', 3, 'tok', '{}', '{}', 1, 2, 2, 1024, 5120);",
        )
        .unwrap();
        drop(conn);
        let store = Store::open(&path).unwrap();
        let all = store.sandboxes().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].rootfs, PathBuf::from("/t/rootfs"));
        assert_eq!(all[0].state, SandboxState::Running);
        assert_eq!(all[0].slot, Some(3));
        assert_eq!(
            all[0].started_at_us, 1_000_000,
            "seconds became microseconds"
        );
    }
}
