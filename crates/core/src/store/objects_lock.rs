//! The lock between object storage's collection and the builds that put templates' layers
//! there: a build holds it shared from the moment it finds which layers object storage has
//! (and skips uploading those) until its template is recorded; a collection holds it alone. So
//! a collection never deletes a layer that a template about to be recorded stands on.
//!
//! On PostgreSQL it is an advisory lock, held by a connection of its own for as long as the
//! guard lives, so it holds across every node; on SQLite (one box) a lock in this process.

use super::db::Db;
use super::StoreError;
use std::sync::Arc;

/// Any number will do, as long as nothing else on the database takes the same lock.
const OBJECTS_LOCK: i64 = 0x0061_6972_6f62_6a73;

/// What a holder of the lock keeps until it is done.
pub struct ObjectsGuard {
    _shared: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
    _alone: Option<tokio::sync::OwnedRwLockWriteGuard<()>>,
    /// The connection that holds the advisory lock. Dropped, it is taken out of the pool and
    /// closed, which ends its session and with it the lock.
    postgres: Option<deadpool_postgres::Object>,
}

impl Drop for ObjectsGuard {
    fn drop(&mut self) {
        if let Some(client) = self.postgres.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

#[derive(Clone)]
pub struct ObjectsLock {
    db: Db,
    local: Arc<tokio::sync::RwLock<()>>,
}

impl ObjectsLock {
    pub fn new(db: Db) -> ObjectsLock {
        ObjectsLock {
            db,
            local: Arc::default(),
        }
    }

    /// Waits for the lock, shared with other builds.
    pub async fn shared(&self) -> Result<ObjectsGuard, StoreError> {
        match &self.db {
            Db::Sqlite(_) => Ok(ObjectsGuard {
                _shared: Some(self.local.clone().read_owned().await),
                _alone: None,
                postgres: None,
            }),
            Db::Postgres(pool) => {
                let guard = on_connection(pool).await?;
                let client = guard.postgres.as_ref().expect("a connection");
                client
                    .execute("SELECT pg_advisory_lock_shared($1)", &[&OBJECTS_LOCK])
                    .await?;
                Ok(guard)
            }
        }
    }

    /// The lock alone, if nobody holds it now.
    pub async fn try_alone(&self) -> Result<Option<ObjectsGuard>, StoreError> {
        match &self.db {
            Db::Sqlite(_) => {
                Ok(
                    (self.local.clone().try_write_owned().ok()).map(|alone| ObjectsGuard {
                        _shared: None,
                        _alone: Some(alone),
                        postgres: None,
                    }),
                )
            }
            Db::Postgres(pool) => {
                let guard = on_connection(pool).await?;
                let client = guard.postgres.as_ref().expect("a connection");
                let row = client
                    .query_one("SELECT pg_try_advisory_lock($1)", &[&OBJECTS_LOCK])
                    .await?;
                let taken: bool = row.try_get(0)?;
                Ok(taken.then_some(guard))
            }
        }
    }
}

/// A guard over a connection of its own, before it asks for the lock: if the asking is cut
/// short (its future dropped while PostgreSQL waits to grant it), the guard closes the
/// connection, so no pooled connection is left holding the lock.
async fn on_connection(pool: &deadpool_postgres::Pool) -> Result<ObjectsGuard, StoreError> {
    let client = pool.get().await.map_err(super::db::pool_error)?;
    Ok(ObjectsGuard {
        _shared: None,
        _alone: None,
        postgres: Some(client),
    })
}

/// What both databases must do (run on PostgreSQL by `postgres_tests.rs`).
#[cfg(test)]
pub(super) async fn behaves(lock: &ObjectsLock) {
    use std::time::Duration;
    let (a, b) = (lock.shared().await.unwrap(), lock.shared().await.unwrap());
    assert!(lock.try_alone().await.unwrap().is_none(), "builds hold it");
    drop((a, b));
    // On PostgreSQL, a dropped guard's session ends moments later.
    let mut alone = None;
    for _ in 0..50 {
        alone = lock.try_alone().await.unwrap();
        if alone.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let alone = alone.expect("free once the builds are done");
    assert!(
        lock.try_alone().await.unwrap().is_none(),
        "one collection at a time"
    );
    let waited = tokio::time::timeout(Duration::from_millis(300), lock.shared()).await;
    assert!(waited.is_err(), "a build waits for the collection");
    drop(alone);
    let shared = tokio::time::timeout(Duration::from_secs(2), lock.shared()).await;
    assert!(shared.unwrap().is_ok(), "and goes on once it is done");
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_objects_lock_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("db")).unwrap();
        super::behaves(store.objects_lock()).await;
    }
}
