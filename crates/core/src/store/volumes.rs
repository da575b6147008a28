//! Volumes (E2B's `Volume`): named directories on the host that outlive sandboxes and belong to
//! the API key that made them. A volume's name is unique among its key's volumes; its id is what
//! the API and the SDK use. Each volume has its own token, which E2B's SDK sends to the volume
//! content API, and a size limit.

use super::{Store, StoreError};
use rusqlite::{params, OptionalExtension, Row};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: String,
    /// Id of the API key that made it.
    pub owner: String,
    pub name: String,
    /// What the content API wants as the bearer token (E2B's SDK gets it with the volume).
    pub token: String,
    pub size_limit_mb: u64,
    pub created_at: i64,
}

/// A volume bound in a sandbox. By id: a deleted volume's name may be given to another.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeMount {
    pub volume_id: String,
    pub name: String,
    /// Where the sandbox sees it.
    pub path: String,
}

/// A volume name: 1-64 of lowercase letters, digits, `.`, `_` and `-`, starting with a letter
/// or digit (so it is also a safe file name).
pub fn valid_volume_name(name: &str) -> bool {
    crate::ids::TemplateName::parse(name).is_ok()
}

const COLUMNS: &str = "id, owner, name, token, size_limit_mb, created_at";

fn record(row: &Row<'_>) -> rusqlite::Result<VolumeRecord> {
    Ok(VolumeRecord {
        id: row.get(0)?,
        owner: row.get(1)?,
        name: row.get(2)?,
        token: row.get(3)?,
        size_limit_mb: row.get(4)?,
        created_at: row.get(5)?,
    })
}

impl Store {
    /// Records a new volume; `false` if its owner has one of that name already.
    pub fn insert_volume(&self, v: &VolumeRecord) -> Result<bool, StoreError> {
        let inserted = self.conn().execute(
            "INSERT INTO volumes (id, owner, name, token, size_limit_mb, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (owner, name) DO NOTHING",
            params![
                v.id,
                v.owner,
                v.name,
                v.token,
                v.size_limit_mb,
                v.created_at
            ],
        )?;
        Ok(inserted == 1)
    }

    /// `owner`'s volume with that id; another key's is not found, as one that does not exist.
    pub fn volume(&self, owner: &str, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM volumes WHERE owner = ?1 AND id = ?2"),
                params![owner, id],
                record,
            )
            .optional()?)
    }

    /// The volume with that id, whoever owns it (for the content API, which the volume's own
    /// token authenticates).
    pub fn volume_by_id(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM volumes WHERE id = ?1"),
                params![id],
                record,
            )
            .optional()?)
    }

    /// `owner`'s volumes, oldest first.
    pub fn volumes(&self, owner: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {COLUMNS} FROM volumes WHERE owner = ?1 ORDER BY created_at, id"
        ))?;
        let rows = stmt.query_map(params![owner], record)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every volume, for the server's start (their host directories must be there).
    pub fn all_volumes(&self) -> Result<Vec<VolumeRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM volumes ORDER BY id"))?;
        let rows = stmt.query_map([], record)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets `owner`'s volume; `false` if it had none with that id.
    pub fn delete_volume(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        let deleted = self.conn().execute(
            "DELETE FROM volumes WHERE owner = ?1 AND id = ?2",
            params![owner, id],
        )?;
        Ok(deleted == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(id: &str, owner: &str, name: &str) -> VolumeRecord {
        VolumeRecord {
            id: id.into(),
            owner: owner.into(),
            name: name.into(),
            token: format!("tok-{id}"),
            size_limit_mb: 64,
            created_at: 1,
        }
    }

    #[test]
    fn names_are_unique_per_key_and_keys_see_only_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        assert!(store.insert_volume(&volume("v1", "alice", "data")).unwrap());
        assert!(!store.insert_volume(&volume("v2", "alice", "data")).unwrap());
        assert!(store.insert_volume(&volume("v3", "bob", "data")).unwrap());

        assert_eq!(
            store.volume("alice", "v1").unwrap().unwrap().token,
            "tok-v1"
        );
        assert_eq!(store.volume("bob", "v1").unwrap(), None);
        assert_eq!(store.volume_by_id("v3").unwrap().unwrap().owner, "bob");
        let names: Vec<String> = store
            .volumes("alice")
            .unwrap()
            .into_iter()
            .map(|v| v.id)
            .collect();
        assert_eq!(names, ["v1"]);
        assert_eq!(store.all_volumes().unwrap().len(), 2);

        assert!(!store.delete_volume("bob", "v1").unwrap());
        assert!(store.delete_volume("alice", "v1").unwrap());
        assert_eq!(store.volume_by_id("v1").unwrap(), None);
    }

    #[test]
    fn volume_names_are_file_names() {
        for good in ["data", "my-vol.2", "0_cache"] {
            assert!(valid_volume_name(good), "{good}");
        }
        for bad in ["", ".", "..", "-x", "a/b", "UPPER", &"x".repeat(65)] {
            assert!(!valid_volume_name(bad), "{bad}");
        }
    }
}
