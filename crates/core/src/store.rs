//! State in one database: sandboxes, templates, snapshots, volumes and API keys, each table
//! with one owner ([`SandboxRecords`], [`Templates`], [`SnapshotRecords`], [`VolumeRecords`],
//! [`Keys`]) on [`db::Db`], which is a SQLite file under the data dir for one box
//! ([`Store::open`]) and PostgreSQL for many machines ([`Store::connect`]).
//!
//! Every write is one statement or one transaction, so a `kill -9` at any point leaves a
//! consistent file.

use rusqlite::Connection;
use std::path::Path;
use std::sync::{Arc, Mutex};

mod builds;
pub mod db;
mod events;
mod idempotency;
mod keys;
pub(crate) mod migrations;
mod objects_lock;
mod paused_images;
#[cfg(test)]
mod postgres_tests;
mod postgres_tls;
mod sandboxes;
#[cfg(test)]
mod sandboxes_tests;
mod settings;
mod snapshots;
mod tags;
mod templates;
#[cfg(test)]
mod templates_tests;
mod user_templates;
mod volumes;
mod webhooks;
pub use builds::{BuildRecord, BuildStatus, LogEntry, LogLevel};
pub use events::{EventQuery, EventRecords, EventType, SandboxEvent, EVENT_RETENTION_US};
pub use idempotency::{Claim, IdempotencyRecords};
pub use keys::{key_id, ApiKeyRecord, KeyLimits, Keys, LiveKey};
pub use objects_lock::{ObjectsGuard, ObjectsLock};
pub use paused_images::PausedImages;
pub use sandboxes::{PauseMode, SandboxRecord, SandboxRecords, SandboxState};
pub use settings::Settings;
pub use snapshots::{SnapshotRecord, SnapshotRecords};
pub use tags::{split_reference, valid_tag, TemplateTag, DEFAULT_TAG};
pub use templates::{TemplateDefaults, TemplateRecord, Templates};
pub use user_templates::UserTemplate;
pub use volumes::{
    valid_volume_name, VolumeMount, VolumeQuota, VolumeRecord, VolumeRecords, VolumeUsage,
};
pub use webhooks::{Webhook, WebhookChange, WebhookRecords};

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
    #[error("TLS to PostgreSQL: {0}")]
    Tls(String),
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

/// A PostgreSQL to keep the state in, for many machines (`--database`, `--database-ca`). No
/// `Debug`: its URL may hold the password.
#[derive(Clone)]
pub struct Database {
    /// `postgres://user:password@host/db`, or `host=... user=...` pairs.
    pub url: String,
    /// A PEM file of the CA that signs the server's certificate: TLS is required with one.
    pub ca: Option<std::path::PathBuf>,
}

pub struct Store {
    #[cfg(test)]
    db: db::Db,
    keys: Keys,
    sandboxes: SandboxRecords,
    snapshots: SnapshotRecords,
    templates: Templates,
    volumes: VolumeRecords,
    events: EventRecords,
    idempotency: IdempotencyRecords,
    webhooks: WebhookRecords,
    paused_images: PausedImages,
    settings: Settings,
    objects_lock: ObjectsLock,
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
        Ok(Store::on(db::Db::Sqlite(Arc::new(Mutex::new(conn)))))
    }

    /// Connects to `database` over verified TLS if its URL says `sslmode=require` or it names
    /// a CA ([`postgres_tls`]), and brings its schema up to date.
    pub async fn connect(database: &Database) -> Result<Self, StoreError> {
        let mut config = postgres_tls::parse_url(&database.url)?;
        let tls = postgres_tls::tls_for(&mut config, database.ca.as_deref())?;
        Ok(Store::on(db::Db::migrated_postgres(config, tls).await?))
    }

    fn on(db: db::Db) -> Store {
        Store {
            keys: Keys::new(db.clone()),
            sandboxes: SandboxRecords::new(db.clone()),
            snapshots: SnapshotRecords::new(db.clone()),
            templates: Templates::new(db.clone()),
            events: EventRecords::new(db.clone()),
            idempotency: IdempotencyRecords::new(db.clone()),
            webhooks: WebhookRecords::new(db.clone()),
            volumes: VolumeRecords::new(db.clone()),
            paused_images: PausedImages::new(db.clone()),
            settings: Settings::new(db.clone()),
            objects_lock: ObjectsLock::new(db.clone()),
            #[cfg(test)]
            db,
        }
    }

    /// The API keys, which gateways will read from PostgreSQL.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The sandboxes' records, which will be the cluster's catalog of sandboxes.
    pub fn sandboxes(&self) -> &SandboxRecords {
        &self.sandboxes
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

    /// The keys' webhooks.
    pub fn webhooks(&self) -> &WebhookRecords {
        &self.webhooks
    }

    /// Which paused sandboxes' images are in object storage.
    pub fn paused_images(&self) -> &PausedImages {
        &self.paused_images
    }

    /// Values the whole state shares.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The lock between object storage's collection and builds that put layers there.
    pub fn objects_lock(&self) -> &ObjectsLock {
        &self.objects_lock
    }

    /// The SQLite connection itself, for tests that write what older versions wrote.
    #[cfg(test)]
    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        match &self.db {
            db::Db::Sqlite(conn) => db::lock(conn),
            db::Db::Postgres(_) => unreachable!("a store opened from a file is SQLite"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test]
    async fn old_databases_are_migrated() {
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
        let all = store.sandboxes().all().await.unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].rootfs, std::path::PathBuf::from("/t/rootfs"));
        assert_eq!(all[0].state, SandboxState::Running);
        assert_eq!(all[0].slot, Some(3));
        assert_eq!(
            all[0].started_at_us, 1_000_000,
            "seconds became microseconds"
        );
    }
}
