//! Which paused sandboxes have their image in object storage, and under which prefix
//! (`objects.rs`): a sandbox without a row has its image on its node's disk only. The row is
//! written after the upload and before the sandbox is recorded paused, and goes with the image.

use super::db::{Db, Row};
use super::StoreError;
use crate::ids::SandboxId;

/// The table of paused images in object storage, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct PausedImages {
    db: Db,
}

impl PausedImages {
    pub fn new(db: Db) -> PausedImages {
        PausedImages { db }
    }

    /// Records that sandbox `id`'s paused image, `size_bytes` big, is under `object`, replacing
    /// what an earlier pause recorded.
    pub async fn put(
        &self,
        id: &SandboxId,
        object: &str,
        size_bytes: u64,
    ) -> Result<(), StoreError> {
        self.db
            .execute(
                "INSERT INTO paused_images (sandbox_id, object, size_bytes) VALUES ($1, $2, $3)
                 ON CONFLICT (sandbox_id) DO UPDATE SET object = excluded.object,
                 size_bytes = excluded.size_bytes",
                &[
                    id.as_str().into(),
                    object.into(),
                    (size_bytes.min(i64::MAX as u64) as i64).into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Where sandbox `id`'s paused image is in object storage, if it is there.
    pub async fn get(&self, id: &SandboxId) -> Result<Option<String>, StoreError> {
        let object = |row: &Row| row.get::<String>(0);
        self.db
            .query_opt(
                "SELECT object FROM paused_images WHERE sandbox_id = $1",
                &[id.as_str().into()],
                object,
            )
            .await
    }

    /// Where every paused image in object storage is.
    pub async fn all(&self) -> Result<Vec<String>, StoreError> {
        let object = |row: &Row| row.get::<String>(0);
        self.db
            .query("SELECT object FROM paused_images", &[], object)
            .await
    }

    /// Forgets sandbox `id`'s image in object storage; succeeds if there was none.
    pub async fn delete(&self, id: &SandboxId) -> Result<(), StoreError> {
        self.db
            .execute(
                "DELETE FROM paused_images WHERE sandbox_id = $1",
                &[id.as_str().into()],
            )
            .await?;
        Ok(())
    }
}

/// What both backends must do alike; run on SQLite below and on PostgreSQL by
/// `store::postgres_tests`.
#[cfg(test)]
pub(crate) async fn behaves(images: &PausedImages) {
    let (a, b) = (SandboxId::generate(), SandboxId::generate());
    assert_eq!(images.get(&a).await.unwrap(), None);
    images.put(&a, "paused/a/1", 10).await.unwrap();
    images.put(&b, "paused/b/1", 20).await.unwrap();
    images.put(&a, "paused/a/2", 30).await.unwrap();
    assert_eq!(images.get(&a).await.unwrap().as_deref(), Some("paused/a/2"));
    images.delete(&a).await.unwrap();
    images.delete(&a).await.unwrap();
    assert_eq!(images.get(&a).await.unwrap(), None);
    assert_eq!(images.get(&b).await.unwrap().as_deref(), Some("paused/b/1"));
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn sqlite_keeps_paused_images() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::Store::open(&dir.path().join("db")).unwrap();
        super::behaves(store.paused_images()).await;
    }
}
