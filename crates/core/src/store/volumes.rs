//! Volumes (E2B's `Volume`): named directories on the host that outlive sandboxes and belong to
//! the API key that made them. A volume's name is unique among its key's volumes; its id is what
//! the API and the SDK use. Each volume has its own token, which E2B's SDK sends to the volume
//! content API, and a size limit.

use super::db::{Db, Row, Value};
use super::StoreError;

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
    /// The node whose disk holds its files: the only one that serves them and runs the
    /// sandboxes that mount it. '' while they are only in object storage.
    pub node: String,
    /// Where its files are in object storage, while it is moving between nodes (moved off a
    /// drained node, and not yet all the way onto another).
    pub stored: Option<String>,
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

/// What one key's volumes may add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeQuota {
    pub count: u64,
    pub total_mb: u64,
}

/// What one key holds in volumes, and whether a name is among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeUsage {
    pub count: u64,
    pub total_mb: u64,
    pub name_taken: bool,
}

const COLUMNS: &str = "id, owner, name, token, size_limit_mb, created_at, node, stored";

fn record(row: &Row) -> Result<VolumeRecord, StoreError> {
    Ok(VolumeRecord {
        id: row.get(0)?,
        owner: row.get(1)?,
        name: row.get(2)?,
        token: row.get(3)?,
        size_limit_mb: row.get::<i64>(4)?.max(0) as u64,
        created_at: row.get(5)?,
        node: row.get(6)?,
        stored: row.get(7)?,
    })
}

/// The volumes' table, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct VolumeRecords {
    db: Db,
}

impl VolumeRecords {
    pub fn new(db: Db) -> VolumeRecords {
        VolumeRecords { db }
    }

    /// Records `v` if its owner has no volume of that name and stays within `quota` with it,
    /// checked and written at once, whichever gateway or task creates at the same time.
    /// `false` if refused: [`VolumeRecords::usage`] says why.
    pub async fn admit(&self, v: &VolumeRecord, quota: VolumeQuota) -> Result<bool, StoreError> {
        let admitted = self
            .db
            .admit(
                "INSERT INTO volumes (id, owner, name, token, size_limit_mb, created_at, node)
                 SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS TEXT), CAST($4 AS TEXT),
                        CAST($5 AS BIGINT), CAST($6 AS BIGINT), CAST($9 AS TEXT)
                 WHERE (SELECT COUNT(*) FROM volumes WHERE owner = CAST($2 AS TEXT))
                         < CAST($7 AS BIGINT)
                   AND (SELECT COALESCE(SUM(size_limit_mb), 0) FROM volumes
                        WHERE owner = CAST($2 AS TEXT)) + CAST($5 AS BIGINT)
                         <= CAST($8 AS BIGINT)
                 ON CONFLICT (owner, name) DO NOTHING",
                &[
                    v.id.as_str().into(),
                    v.owner.as_str().into(),
                    v.name.as_str().into(),
                    v.token.as_str().into(),
                    clamp(v.size_limit_mb).into(),
                    v.created_at.into(),
                    clamp(quota.count).into(),
                    clamp(quota.total_mb).into(),
                    v.node.as_str().into(),
                ],
            )
            .await?;
        Ok(admitted == 1)
    }

    /// How many volumes `owner` has, their MiB together, and whether one is called `name`.
    pub async fn usage(&self, owner: &str, name: &str) -> Result<VolumeUsage, StoreError> {
        let usage = self
            .db
            .query_opt(
                "SELECT COUNT(*), CAST(COALESCE(SUM(size_limit_mb), 0) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN name = $2 THEN 1 ELSE 0 END), 0) AS BIGINT)
                 FROM volumes WHERE owner = $1",
                &[owner.into(), name.into()],
                |row| {
                    Ok(VolumeUsage {
                        count: row.get::<i64>(0)?.max(0) as u64,
                        total_mb: row.get::<i64>(1)?.max(0) as u64,
                        name_taken: row.get::<i64>(2)? > 0,
                    })
                },
            )
            .await?;
        Ok(usage.expect("an aggregate answers one row"))
    }

    /// `owner`'s volume with that id; another key's is not found, as one that does not exist.
    pub async fn get(&self, owner: &str, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        self.db
            .query_opt(
                &format!("SELECT {COLUMNS} FROM volumes WHERE owner = $1 AND id = $2"),
                &[owner.into(), id.into()],
                record,
            )
            .await
    }

    /// The volume with that id, whoever owns it (for the content API, which the volume's own
    /// token authenticates).
    pub async fn by_id(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        self.db
            .query_opt(
                &format!("SELECT {COLUMNS} FROM volumes WHERE id = $1"),
                &[id.into()],
                record,
            )
            .await
    }

    /// `owner`'s volumes, oldest first.
    pub async fn of(&self, owner: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        self.db
            .query(
                &format!("SELECT {COLUMNS} FROM volumes WHERE owner = $1 ORDER BY created_at, id"),
                &[owner.into()],
                record,
            )
            .await
    }

    /// The volumes whose files are on `node`, for its start (their filesystems must be
    /// mounted). The rows from before volumes had nodes become `node`'s first (not those in
    /// object storage, which are no node's).
    pub async fn claim_of_node(&self, node: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        self.db
            .execute(
                "UPDATE volumes SET node = $1 WHERE node = '' AND stored IS NULL",
                &[Value::Text(node)],
            )
            .await?;
        self.of_node(node).await
    }

    /// Records that volume `id`, kept on `node` until now, is in object storage under
    /// `stored` and on no node; `false` if `node` no longer keeps it (deleted meanwhile).
    pub async fn move_out(&self, id: &str, node: &str, stored: &str) -> Result<bool, StoreError> {
        let sql = "UPDATE volumes SET node = '', stored = $3
                   WHERE id = $1 AND node = $2 AND stored IS NULL";
        let params = [id.into(), node.into(), stored.into()];
        Ok(self.db.execute(sql, &params).await? == 1)
    }

    /// Makes `node` the keeper of volume `id`, which is in object storage under `stored` and
    /// on no node: `false` if another node took it in first (or it is gone). `stored` stays
    /// named until [`VolumeRecords::settle_in`], so a node that dies meanwhile loses nothing.
    pub async fn take_in(&self, id: &str, node: &str, stored: &str) -> Result<bool, StoreError> {
        let sql = "UPDATE volumes SET node = $2 WHERE id = $1 AND node = '' AND stored = $3";
        let params = [id.into(), node.into(), stored.into()];
        Ok(self.db.execute(sql, &params).await? == 1)
    }

    /// Volume `id`'s files are all on `node` now: object storage's copy is no longer its.
    pub async fn settle_in(&self, id: &str, node: &str) -> Result<bool, StoreError> {
        let sql = "UPDATE volumes SET stored = NULL WHERE id = $1 AND node = $2";
        Ok(self.db.execute(sql, &[id.into(), node.into()]).await? == 1)
    }

    /// Forgets `owner`'s volume `id` if it still waits in object storage under `stored`, on
    /// no node (a node taking it in would be left with nothing to keep).
    pub async fn delete_stored(
        &self,
        owner: &str,
        id: &str,
        stored: &str,
    ) -> Result<bool, StoreError> {
        let sql = "DELETE FROM volumes WHERE owner = $1 AND id = $2 AND node = '' AND stored = $3";
        let params = [owner.into(), id.into(), stored.into()];
        Ok(self.db.execute(sql, &params).await? == 1)
    }

    /// Undoes [`VolumeRecords::take_in`] after a failed fetch: on no node again.
    pub async fn give_back(&self, id: &str, node: &str, stored: &str) -> Result<bool, StoreError> {
        let sql = "UPDATE volumes SET node = '' WHERE id = $1 AND node = $2 AND stored = $3";
        let params = [id.into(), node.into(), stored.into()];
        Ok(self.db.execute(sql, &params).await? == 1)
    }

    /// Where every volume that is moving between nodes has its files in object storage.
    pub async fn all_stored(&self) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT stored FROM volumes WHERE stored IS NOT NULL";
        self.db.query(sql, &[], |row| row.get::<String>(0)).await
    }

    /// The volumes whose files are on `node`.
    pub async fn of_node(&self, node: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        self.db
            .query(
                &format!("SELECT {COLUMNS} FROM volumes WHERE node = $1 ORDER BY id"),
                &[node.into()],
                record,
            )
            .await
    }

    /// Forgets `owner`'s volume; `false` if it had none with that id.
    pub async fn delete(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        let deleted = self
            .db
            .execute(
                "DELETE FROM volumes WHERE owner = $1 AND id = $2",
                &[Value::Text(owner), Value::Text(id)],
            )
            .await?;
        Ok(deleted == 1)
    }
}

/// A count or size as the database's signed 64 bits.
fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

/// What both backends must do alike; run on SQLite below and on PostgreSQL by
/// `store::postgres_tests`.
#[cfg(test)]
pub(crate) async fn behaves(volumes: &VolumeRecords) {
    let volume = |id: &str, owner: &str, name: &str| VolumeRecord {
        id: id.into(),
        owner: owner.into(),
        name: name.into(),
        token: format!("tok-{id}"),
        size_limit_mb: 64,
        created_at: 1,
        node: if owner == "bob" { "" } else { "n1" }.into(),
        stored: None,
    };
    let roomy = VolumeQuota {
        count: 10,
        total_mb: 1 << 20,
    };
    assert!(volumes
        .admit(&volume("v1", "alice", "data"), roomy)
        .await
        .unwrap());
    assert!(!volumes
        .admit(&volume("v2", "alice", "data"), roomy)
        .await
        .unwrap());
    assert!(volumes
        .admit(&volume("v3", "bob", "data"), roomy)
        .await
        .unwrap());
    assert_eq!(
        volumes.usage("alice", "data").await.unwrap(),
        VolumeUsage {
            count: 1,
            total_mb: 64,
            name_taken: true
        }
    );
    assert!(!volumes.usage("carol", "data").await.unwrap().name_taken);

    assert_eq!(
        volumes.get("alice", "v1").await.unwrap().unwrap().token,
        "tok-v1"
    );
    assert_eq!(volumes.get("bob", "v1").await.unwrap(), None);
    assert_eq!(volumes.by_id("v3").await.unwrap().unwrap().owner, "bob");
    let ids = |all: Vec<VolumeRecord>| all.into_iter().map(|v| v.id).collect::<Vec<_>>();
    assert_eq!(ids(volumes.of("alice").await.unwrap()), ["v1"]);
    // Bob's volume is from before nodes: the first node to look claims it, and no other.
    assert_eq!(ids(volumes.of_node("n1").await.unwrap()), ["v1"]);
    assert_eq!(ids(volumes.claim_of_node("n2").await.unwrap()), ["v3"]);
    assert_eq!(ids(volumes.claim_of_node("n1").await.unwrap()), ["v1"]);
    assert_eq!(volumes.by_id("v3").await.unwrap().unwrap().node, "n2");

    // A volume moves off n2 into object storage: no node's, and no start claims it; one node
    // takes it in (keeping its object named until settled), and can give it back.
    assert!(!volumes.move_out("v3", "n1", "volumes/v3/1").await.unwrap());
    assert!(volumes.move_out("v3", "n2", "volumes/v3/1").await.unwrap());
    let moving = volumes.by_id("v3").await.unwrap().unwrap();
    assert_eq!(
        (moving.node.as_str(), moving.stored.as_deref()),
        ("", Some("volumes/v3/1"))
    );
    assert_eq!(
        ids(volumes.claim_of_node("n3").await.unwrap()),
        Vec::<String>::new()
    );
    assert_eq!(volumes.all_stored().await.unwrap(), ["volumes/v3/1"]);
    assert!(
        !volumes.take_in("v3", "n3", "volumes/v3/0").await.unwrap(),
        "another image"
    );
    let racers = ["n3", "n4", "n5"].map(|n| volumes.take_in("v3", n, "volumes/v3/1"));
    let won = futures::future::join_all(racers).await;
    assert_eq!(won.iter().filter(|w| *w.as_ref().unwrap()).count(), 1);
    let keeper = volumes.by_id("v3").await.unwrap().unwrap().node;
    assert!(volumes
        .give_back("v3", &keeper, "volumes/v3/1")
        .await
        .unwrap());
    assert!(volumes.take_in("v3", "n3", "volumes/v3/1").await.unwrap());
    assert!(!volumes.settle_in("v3", "n4").await.unwrap());
    assert!(
        !volumes.move_out("v3", "n3", "volumes/v3/2").await.unwrap(),
        "half taken in"
    );
    assert!(
        !volumes
            .delete_stored("bob", "v3", "volumes/v3/1")
            .await
            .unwrap(),
        "taken in"
    );
    assert!(volumes.settle_in("v3", "n3").await.unwrap());
    let settled = volumes.by_id("v3").await.unwrap().unwrap();
    assert_eq!((settled.node.as_str(), settled.stored), ("n3", None));
    assert!(volumes.all_stored().await.unwrap().is_empty());

    // The quota counts volumes and their MiB.
    let two = VolumeQuota {
        count: 2,
        total_mb: 1 << 20,
    };
    assert!(volumes
        .admit(&volume("v4", "alice", "more"), two)
        .await
        .unwrap());
    assert!(!volumes
        .admit(&volume("v5", "alice", "most"), two)
        .await
        .unwrap());
    let small = VolumeQuota {
        count: 10,
        total_mb: 150,
    };
    assert!(!volumes
        .admit(&volume("v5", "alice", "most"), small)
        .await
        .unwrap());
    assert!(volumes
        .admit(&volume("v5", "bob", "most"), small)
        .await
        .unwrap());

    assert!(!volumes.delete("bob", "v1").await.unwrap());
    assert!(volumes.delete("alice", "v1").await.unwrap());
    assert_eq!(volumes.by_id("v1").await.unwrap(), None);

    // Creates at once hold the quota together: of 16 that start together with room for 3,
    // three are made. A few rounds, so that a check that does not hold is seen to fail.
    let quota = VolumeQuota {
        count: 3,
        total_mb: 1 << 20,
    };
    for round in 0..4 {
        let owner = format!("racer{round}");
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(16));
        let creates: Vec<_> = (0..16)
            .map(|i| {
                let (volumes, start) = (volumes.clone(), start.clone());
                let v = volume(&format!("{owner}-{i}"), &owner, &format!("n{i}"));
                tokio::spawn(async move {
                    start.wait().await;
                    volumes.admit(&v, quota).await.unwrap()
                })
            })
            .collect();
        let mut made = 0;
        for create in creates {
            made += u32::from(create.await.unwrap());
        }
        assert_eq!(made, 3, "{owner}");
        assert_eq!(volumes.of(&owner).await.unwrap().len(), 3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn volumes_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        behaves(store.volumes()).await;
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
