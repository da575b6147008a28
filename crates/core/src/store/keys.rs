//! API keys, the first part of the store that runs on SQLite or PostgreSQL alike ([`Db`]).
//! Only a key's SHA-256 is kept; its first 12 hex digits are its public id.

use super::db::{Db, Row, Value};
use super::StoreError;

/// An API key as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// The first 12 hex digits of the key's SHA-256: shown, never secret.
    pub id: String,
    pub name: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    pub limits: KeyLimits,
    /// Also reads the nodes' admin routes (`airlock key create --operator`).
    pub operator: bool,
}

/// What one API key may hold; each limit left out is the server's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// Sandboxes running (or starting, or being resumed) at once.
    pub max_running: Option<u32>,
    /// Sandboxes paused at once.
    pub max_paused: Option<u32>,
    /// The disk its snapshots take, in MiB.
    pub max_snapshot_mb: Option<u64>,
}

const KEY_ID_LEN: usize = 12;

/// A key's public id: the first 12 hex digits of its SHA-256.
pub fn key_id(sha256_hex: &str) -> String {
    sha256_hex.chars().take(KEY_ID_LEN).collect()
}

/// A key that may be used: its public id, and whether it is an operator's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveKey {
    pub id: String,
    pub operator: bool,
}

/// The API keys' table.
#[derive(Clone)]
pub struct Keys {
    db: Db,
}

impl Keys {
    pub fn new(db: Db) -> Keys {
        Keys { db }
    }

    /// Records a key by its SHA-256 (hex); a key already recorded keeps its name and limits.
    pub async fn add(
        &self,
        sha256_hex: &str,
        name: &str,
        created_at: i64,
        limits: KeyLimits,
        operator: bool,
    ) -> Result<(), StoreError> {
        self.db
            .execute(
                "INSERT INTO api_keys (sha256, created_at, name, max_running, max_paused,
                 max_snapshot_mb, operator) VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (sha256) DO NOTHING",
                &[
                    sha256_hex.into(),
                    created_at.into(),
                    name.into(),
                    limits.max_running.map(i64::from).into(),
                    limits.max_paused.map(i64::from).into(),
                    limits.max_snapshot_mb.map(|mb| mb as i64).into(),
                    i64::from(operator).into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// The limits set on the key with this id (none set: all `None`).
    pub async fn limits(&self, id: &str) -> Result<KeyLimits, StoreError> {
        Ok(self
            .db
            .query_opt(
                "SELECT max_running, max_paused, max_snapshot_mb FROM api_keys
                 WHERE substr(sha256, 1, 12) = $1",
                &[id.into()],
                read_limits(0),
            )
            .await?
            .unwrap_or_default())
    }

    /// The live (not revoked) key with this SHA-256, if any: what a request's key stands for.
    pub async fn live(&self, sha256_hex: &str) -> Result<Option<LiveKey>, StoreError> {
        self.db
            .query_opt(
                "SELECT operator FROM api_keys WHERE sha256 = $1 AND revoked_at IS NULL",
                &[sha256_hex.into()],
                |row| {
                    Ok(LiveKey {
                        id: key_id(sha256_hex),
                        operator: row.get::<i64>(0)? != 0,
                    })
                },
            )
            .await
    }

    /// Every key, revoked ones included, oldest first.
    pub async fn all(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        self.db
            .query(
                "SELECT sha256, name, created_at, revoked_at, operator, max_running, max_paused,
                 max_snapshot_mb FROM api_keys ORDER BY created_at, sha256",
                &[],
                |row| {
                    Ok(ApiKeyRecord {
                        id: key_id(&row.get::<String>(0)?),
                        name: row.get(1)?,
                        created_at: row.get(2)?,
                        revoked_at: row.get(3)?,
                        operator: row.get::<i64>(4)? != 0,
                        limits: read_limits(5)(row)?,
                    })
                },
            )
            .await
    }

    /// Revokes the key with this id; returns whether a live key had it.
    pub async fn revoke(&self, id: &str, now: i64) -> Result<bool, StoreError> {
        if id.len() != KEY_ID_LEN || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(false);
        }
        let changed = self
            .db
            .execute(
                "UPDATE api_keys SET revoked_at = $2 WHERE substr(sha256, 1, 12) = $1
                 AND revoked_at IS NULL",
                &[Value::Text(&id.to_ascii_lowercase()), now.into()],
            )
            .await?;
        Ok(changed > 0)
    }

    /// How many keys are live.
    pub async fn live_count(&self) -> Result<u64, StoreError> {
        let count = self
            .db
            .query_opt(
                "SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL",
                &[],
                |row| row.get::<i64>(0),
            )
            .await?;
        Ok(count.unwrap_or(0).max(0) as u64)
    }
}

/// Reads a key's three limits from the row's columns `first..first + 3`.
fn read_limits(first: usize) -> impl Fn(&Row) -> Result<KeyLimits, StoreError> {
    move |row| {
        let limit = |i| -> Result<Option<u32>, StoreError> {
            Ok(row
                .get::<Option<i64>>(first + i)?
                .map(|n| n.clamp(0, u32::MAX.into()) as u32))
        };
        Ok(KeyLimits {
            max_running: limit(0)?,
            max_paused: limit(1)?,
            max_snapshot_mb: row
                .get::<Option<i64>>(first + 2)?
                .map(|mb| mb.max(0) as u64),
        })
    }
}

/// What both backends must do alike; run on SQLite below and on PostgreSQL by
/// `store::postgres_tests`.
#[cfg(test)]
pub(crate) async fn behaves(keys: &Keys) {
    assert_eq!(keys.live_count().await.unwrap(), 0);
    let h = "0123456789abcdef0123";
    let limits = KeyLimits {
        max_running: Some(3),
        max_paused: None,
        max_snapshot_mb: Some(100),
    };
    keys.add(h, "ci", 1, limits, false).await.unwrap();
    keys.add(h, "again", 9, KeyLimits::default(), true)
        .await
        .unwrap();
    assert_eq!(keys.limits("0123456789ab").await.unwrap(), limits);
    assert_eq!(
        keys.limits("ffffffffffff").await.unwrap(),
        KeyLimits::default()
    );
    let live = |id: &str, operator| {
        Some(LiveKey {
            id: id.into(),
            operator,
        })
    };
    assert_eq!(keys.live(h).await.unwrap(), live("0123456789ab", false));
    assert_eq!(keys.live("ffff").await.unwrap(), None);
    assert_eq!(
        keys.live("0123456789ab").await.unwrap(),
        None,
        "by the whole hash"
    );
    let all = keys.all().await.unwrap();
    assert_eq!((all[0].name.as_str(), all[0].operator), ("ci", false));

    let ops = "fedcba9876543210fedc";
    keys.add(ops, "ops", 2, KeyLimits::default(), true)
        .await
        .unwrap();
    assert_eq!(keys.live(ops).await.unwrap(), live("fedcba987654", true));
    assert_eq!(keys.live_count().await.unwrap(), 2);

    assert!(!keys.revoke("nothex", 2).await.unwrap());
    assert!(keys.revoke("0123456789AB", 2).await.unwrap());
    assert!(
        !keys.revoke("0123456789ab", 3).await.unwrap(),
        "already revoked"
    );
    assert_eq!(
        keys.live(h).await.unwrap(),
        None,
        "a revoked key no longer works"
    );
    assert_eq!(keys.live_count().await.unwrap(), 1);
    assert_eq!(keys.all().await.unwrap()[0].revoked_at, Some(2));
    keys.revoke("fedcba987654", 4).await.unwrap();
    assert_eq!(
        keys.live(ops).await.unwrap(),
        None,
        "a revoked operator key reads no node"
    );
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn keys_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        super::behaves(store.keys()).await;
    }
}
