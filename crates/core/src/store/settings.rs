//! Values the whole state shares, one row each by name (migration V11): what object storage's
//! collection (`build/object_collection.rs`) needs to agree on across nodes.

use super::db::{Db, Row};
use super::StoreError;

const IDENTITY: &str = "identity";
const OBJECTS_COLLECTED_AT: &str = "objects_collected_at";

/// The settings' table, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct Settings {
    db: Db,
}

impl Settings {
    pub fn new(db: Db) -> Settings {
        Settings { db }
    }

    /// This state's name for itself: random, made by whoever asks first, the same for every
    /// node on one database. Object storage is marked with it, so that a bucket two
    /// databases share is seen to be shared.
    pub async fn identity(&self) -> Result<String, StoreError> {
        let made = format!(
            "{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        self.db
            .execute(
                "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[IDENTITY.into(), made.as_str().into()],
            )
            .await?;
        let value = |row: &Row| row.get::<String>(0);
        let sql = "SELECT value FROM settings WHERE name = $1";
        let found = self.db.query_opt(sql, &[IDENTITY.into()], value).await?;
        found.ok_or_else(|| StoreError::Corrupt("the store's identity".into()))
    }

    /// Takes the turn to collect object storage if no node has since `due_before` (unix
    /// seconds), marking it taken `now`: of nodes that ask at once, one gets it.
    pub async fn take_collection_turn(
        &self,
        due_before: i64,
        now: i64,
    ) -> Result<bool, StoreError> {
        self.db
            .execute(
                "INSERT INTO settings (name, value) VALUES ($1, '0') ON CONFLICT (name) DO NOTHING",
                &[OBJECTS_COLLECTED_AT.into()],
            )
            .await?;
        let changed = self
            .db
            .execute(
                "UPDATE settings SET value = $2 WHERE name = $1 AND CAST(value AS BIGINT) < $3",
                &[
                    OBJECTS_COLLECTED_AT.into(),
                    now.to_string().as_str().into(),
                    due_before.into(),
                ],
            )
            .await?;
        Ok(changed == 1)
    }
}

/// What both databases must do (run on PostgreSQL by `postgres_tests.rs`).
#[cfg(test)]
pub(super) async fn behaves(settings: &Settings) {
    let identity = settings.identity().await.unwrap();
    assert_eq!(identity.len(), 32);
    assert_eq!(settings.identity().await.unwrap(), identity, "made once");

    // Of eight nodes asking at once, one takes the turn; then none until it is due again.
    let asks = (0..8).map(|_| settings.take_collection_turn(100, 100));
    let taken = futures::future::join_all(asks).await;
    assert_eq!(taken.iter().filter(|t| *t.as_ref().unwrap()).count(), 1);
    assert!(!settings.take_collection_turn(100, 150).await.unwrap());
    assert!(settings.take_collection_turn(101, 200).await.unwrap());
    assert!(!settings.take_collection_turn(200, 300).await.unwrap());
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn settings_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("db")).unwrap();
        super::behaves(store.settings()).await;
    }
}
