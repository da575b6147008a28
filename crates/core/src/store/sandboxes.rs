//! The sandboxes' records: what each sandbox is, enough to adopt or resume it after a restart.

use super::db::{Db, Row};
use super::{StoreError, VolumeMount};
use crate::driver::Resources;
use crate::egress::Egress;
use crate::ids::{SandboxId, TemplateName};
use std::collections::BTreeMap;
use std::path::PathBuf;

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

const COLUMNS: &str = "id, template, rootfs, state, slot, access_token, metadata, env_vars, \
                       started_at_us, end_at, cpu_count, memory_mb, disk_mb, pause_on_timeout, \
                       auto_resume, owner, egress, traffic_access_token, require_traffic_token, \
                       timeout_pause, pause_mode, volume_mounts FROM sandboxes";

fn record(row: &Row) -> Result<SandboxRecord, StoreError> {
    let id: String = row.get(0)?;
    let corrupt = || StoreError::Corrupt(id.clone());
    let json = |i| -> Result<String, StoreError> { row.get(i) };
    let count =
        |i| -> Result<u32, StoreError> { u32::try_from(row.get::<i64>(i)?).map_err(|_| corrupt()) };
    let flag = |i| -> Result<bool, StoreError> { Ok(row.get::<i64>(i)? != 0) };
    Ok(SandboxRecord {
        template: TemplateName::parse(&row.get::<String>(1)?).map_err(|_| corrupt())?,
        rootfs: PathBuf::from(row.get::<String>(2)?),
        state: SandboxState::parse(&row.get::<String>(3)?).ok_or_else(corrupt)?,
        slot: match row.get::<Option<i64>>(4)? {
            Some(slot) => Some(u32::try_from(slot).map_err(|_| corrupt())?),
            None => None,
        },
        access_token: row.get(5)?,
        metadata: serde_json::from_str(&json(6)?).map_err(|_| corrupt())?,
        env_vars: serde_json::from_str(&json(7)?).map_err(|_| corrupt())?,
        started_at_us: row.get(8)?,
        end_at: row.get(9)?,
        resources: Resources {
            cpu_count: count(10)?,
            memory_mb: count(11)?,
            disk_mb: count(12)?,
        },
        pause_on_timeout: flag(13)?,
        auto_resume: flag(14)?,
        owner: row.get(15)?,
        egress: serde_json::from_str(&json(16)?).map_err(|_| corrupt())?,
        traffic_access_token: row.get(17)?,
        require_traffic_token: flag(18)?,
        timeout_pause: PauseMode::parse(&row.get::<String>(19)?).ok_or_else(corrupt)?,
        pause_mode: match row.get::<Option<String>>(20)? {
            Some(mode) => Some(PauseMode::parse(&mode).ok_or_else(corrupt)?),
            None => None,
        },
        volume_mounts: serde_json::from_str(&json(21)?).map_err(|_| corrupt())?,
        id: SandboxId::parse(&id).map_err(|_| corrupt())?,
    })
}

/// The sandboxes' table, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct SandboxRecords {
    db: Db,
}

impl SandboxRecords {
    pub fn new(db: Db) -> SandboxRecords {
        SandboxRecords { db }
    }

    pub async fn insert(&self, r: &SandboxRecord) -> Result<(), StoreError> {
        let metadata = serde_json::to_string(&r.metadata).expect("map serializes");
        let env_vars = serde_json::to_string(&r.env_vars).expect("map serializes");
        let egress = serde_json::to_string(&r.egress).expect("policy serializes");
        let mounts = serde_json::to_string(&r.volume_mounts).expect("mounts serialize");
        let rootfs = r.rootfs.to_string_lossy();
        self.db
            .execute(
                "INSERT INTO sandboxes (id, template, rootfs, state, slot, access_token,
                 metadata, env_vars, started_at_us, end_at, cpu_count, memory_mb, disk_mb,
                 pause_on_timeout, auto_resume, owner, egress, traffic_access_token,
                 require_traffic_token, timeout_pause, pause_mode, volume_mounts)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 $17, $18, $19, $20, $21, $22)",
                &[
                    r.id.as_str().into(),
                    r.template.as_str().into(),
                    rootfs.as_ref().into(),
                    r.state.as_str().into(),
                    r.slot.map(i64::from).into(),
                    r.access_token.as_deref().into(),
                    metadata.as_str().into(),
                    env_vars.as_str().into(),
                    r.started_at_us.into(),
                    r.end_at.into(),
                    i64::from(r.resources.cpu_count).into(),
                    i64::from(r.resources.memory_mb).into(),
                    i64::from(r.resources.disk_mb).into(),
                    r.pause_on_timeout.into(),
                    r.auto_resume.into(),
                    r.owner.as_deref().into(),
                    egress.as_str().into(),
                    r.traffic_access_token.as_deref().into(),
                    r.require_traffic_token.into(),
                    r.timeout_pause.as_str().into(),
                    r.pause_mode.map(PauseMode::as_str).into(),
                    mounts.as_str().into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Records a pause (no slot, and what it saved) or a resume (a slot and a new deadline).
    pub async fn set_state(
        &self,
        id: &SandboxId,
        state: SandboxState,
        slot: Option<u32>,
        end_at: i64,
        pause_mode: Option<PauseMode>,
    ) -> Result<(), StoreError> {
        self.db
            .execute(
                "UPDATE sandboxes SET state = $2, slot = $3, end_at = $4, pause_mode = $5
                 WHERE id = $1",
                &[
                    id.as_str().into(),
                    state.as_str().into(),
                    slot.map(i64::from).into(),
                    end_at.into(),
                    pause_mode.map(PauseMode::as_str).into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Records a sandbox's network settings (`update_network`).
    pub async fn set_network(
        &self,
        id: &SandboxId,
        egress: &Egress,
        require_traffic_token: bool,
    ) -> Result<(), StoreError> {
        let egress = serde_json::to_string(egress).expect("policy serializes");
        self.db
            .execute(
                "UPDATE sandboxes SET egress = $2, require_traffic_token = $3 WHERE id = $1",
                &[
                    id.as_str().into(),
                    egress.as_str().into(),
                    require_traffic_token.into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Sets when the sandbox ends; `false` if there is no such sandbox.
    pub async fn set_end_at(&self, id: &SandboxId, end_at: i64) -> Result<bool, StoreError> {
        let n = self
            .db
            .execute(
                "UPDATE sandboxes SET end_at = $2 WHERE id = $1",
                &[id.as_str().into(), end_at.into()],
            )
            .await?;
        Ok(n == 1)
    }

    pub async fn delete(&self, id: &SandboxId) -> Result<(), StoreError> {
        let sql = "DELETE FROM sandboxes WHERE id = $1";
        self.db.execute(sql, &[id.as_str().into()]).await?;
        Ok(())
    }

    /// Every sandbox, in the order they were created.
    pub async fn all(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} ORDER BY started_at_us, id");
        self.db.query(&sql, &[], record).await
    }

    pub async fn get(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} WHERE id = $1");
        self.db.query_opt(&sql, &[id.as_str().into()], record).await
    }
}

/// What the sandboxes' records must do, on SQLite here and on PostgreSQL in
/// `postgres_tests.rs`.
#[cfg(test)]
pub(crate) async fn behaves(sandboxes: &SandboxRecords) {
    use tests::record;
    sandboxes.insert(&record("a1", 0)).await.unwrap();
    assert!(
        sandboxes.insert(&record("b2", 0)).await.is_err(),
        "slot reuse must fail"
    );
    sandboxes.insert(&record("b2", 1)).await.unwrap();
    let a1 = SandboxId::parse("a1").unwrap();
    assert!(sandboxes.set_end_at(&a1, 99).await.unwrap());
    assert!(!sandboxes
        .set_end_at(&SandboxId::parse("zz").unwrap(), 99)
        .await
        .unwrap());
    let all = sandboxes.all().await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].end_at, 99);
    assert_eq!(all[1], record("b2", 1));
    let open = Egress::from_request(Some(true), &[], &[]).unwrap();
    sandboxes.set_network(&a1, &open, false).await.unwrap();
    let a = sandboxes.get(&a1).await.unwrap().unwrap();
    assert_eq!((a.egress, a.require_traffic_token), (open, false));
    sandboxes.delete(&a1).await.unwrap();
    assert_eq!(sandboxes.all().await.unwrap().len(), 1);
    assert_eq!(sandboxes.get(&a1).await.unwrap(), None);

    // Paused sandboxes hold no slot, so several can coexist.
    let paused = SandboxState::Paused;
    let mode = Some(PauseMode::Filesystem);
    sandboxes
        .set_state(&all[1].id, paused, None, 0, mode)
        .await
        .unwrap();
    let mut c = record("c3", 0);
    c.state = SandboxState::Paused;
    c.slot = None;
    sandboxes.insert(&c).await.unwrap();
    let paused = sandboxes.all().await.unwrap();
    assert!(paused
        .iter()
        .all(|r| r.state == SandboxState::Paused && r.slot.is_none()));
    let modes: Vec<_> = paused.iter().map(|r| r.pause_mode).collect();
    assert_eq!(modes, [Some(PauseMode::Filesystem), None]);
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn record(id: &str, slot: u32) -> SandboxRecord {
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

    #[tokio::test]
    async fn sandboxes_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("db")).unwrap();
        behaves(store.sandboxes()).await;
    }
}
