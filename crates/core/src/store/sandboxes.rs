//! The sandbox catalog: what each sandbox is and which node runs it, enough to adopt or resume
//! it after a restart; and the per-key quotas of running and paused sandboxes, admitted by the
//! catalog's own writes so that they hold whichever gateway or node admits.

use super::db::{Db, Row, Statement, Value};
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
    /// The node that runs it, or keeps it paused (E2B's `clientID`).
    pub node: String,
}

const COLUMNS: &str = "id, template, rootfs, state, slot, access_token, metadata, env_vars, \
                       started_at_us, end_at, cpu_count, memory_mb, disk_mb, pause_on_timeout, \
                       auto_resume, owner, egress, traffic_access_token, require_traffic_token, \
                       timeout_pause, pause_mode, volume_mounts, node";

/// The columns a record is written to, in [`row_params`]' order, with the SQL type that
/// PostgreSQL needs to be told for an `INSERT ... SELECT`'s parameters.
const WRITTEN: [(&str, &str); 23] = [
    ("id", "TEXT"),
    ("template", "TEXT"),
    ("rootfs", "TEXT"),
    ("state", "TEXT"),
    ("slot", "BIGINT"),
    ("access_token", "TEXT"),
    ("metadata", "TEXT"),
    ("env_vars", "TEXT"),
    ("started_at_us", "BIGINT"),
    ("end_at", "BIGINT"),
    ("cpu_count", "BIGINT"),
    ("memory_mb", "BIGINT"),
    ("disk_mb", "BIGINT"),
    ("pause_on_timeout", "BIGINT"),
    ("auto_resume", "BIGINT"),
    ("owner", "TEXT"),
    ("egress", "TEXT"),
    ("traffic_access_token", "TEXT"),
    ("require_traffic_token", "BIGINT"),
    ("timeout_pause", "TEXT"),
    ("pause_mode", "TEXT"),
    ("volume_mounts", "TEXT"),
    ("node", "TEXT"),
];

/// Rows of the same owner as the row `o` (a sandbox without one is in no key's quota but
/// counts with the others that have none, as before keys had owners).
const SAME_OWNER: &str = "COALESCE(o.owner, '') = COALESCE(sandboxes.owner, '')";
/// What the running quota counts: running sandboxes, the ones starting or pausing among them,
/// and the paused ones resuming; not killed ones.
const RUNNING_PLACE: &str = "((o.state = 'running' OR o.transition = 'resuming')
                              AND COALESCE(o.transition, '') <> 'stopping')";
/// What the paused quota counts: paused sandboxes, resuming ones among them, and running ones
/// pausing; not killed ones.
const PAUSED_PLACE: &str = "((o.state = 'paused' OR o.transition = 'pausing')
                             AND COALESCE(o.transition, '') <> 'stopping')";
/// Rows every reader sees: a sandbox still starting answers to no id. A killed one whose host
/// cleanup is at work is seen, since it still holds its root filesystem and volumes.
const LISTED: &str = "COALESCE(transition, '') <> 'starting'";
/// What a user still has: neither starting nor killed.
const ALIVE: &str = "COALESCE(transition, '') NOT IN ('starting', 'stopping')";

/// A record's JSON and path columns, encoded once so that its parameters can borrow them.
struct Encoded {
    metadata: String,
    env_vars: String,
    egress: String,
    mounts: String,
    rootfs: String,
}

impl Encoded {
    fn of(r: &SandboxRecord) -> Encoded {
        Encoded {
            metadata: serde_json::to_string(&r.metadata).expect("map serializes"),
            env_vars: serde_json::to_string(&r.env_vars).expect("map serializes"),
            egress: serde_json::to_string(&r.egress).expect("policy serializes"),
            mounts: serde_json::to_string(&r.volume_mounts).expect("mounts serialize"),
            rootfs: r.rootfs.to_string_lossy().into_owned(),
        }
    }
}

/// `r`'s values for the columns of [`WRITTEN`], in order.
fn row_params<'a>(r: &'a SandboxRecord, e: &'a Encoded) -> Vec<Value<'a>> {
    vec![
        r.id.as_str().into(),
        r.template.as_str().into(),
        e.rootfs.as_str().into(),
        r.state.as_str().into(),
        r.slot.map(i64::from).into(),
        r.access_token.as_deref().into(),
        e.metadata.as_str().into(),
        e.env_vars.as_str().into(),
        r.started_at_us.into(),
        r.end_at.into(),
        i64::from(r.resources.cpu_count).into(),
        i64::from(r.resources.memory_mb).into(),
        i64::from(r.resources.disk_mb).into(),
        r.pause_on_timeout.into(),
        r.auto_resume.into(),
        r.owner.as_deref().into(),
        e.egress.as_str().into(),
        r.traffic_access_token.as_deref().into(),
        r.require_traffic_token.into(),
        r.timeout_pause.as_str().into(),
        r.pause_mode.map(PauseMode::as_str).into(),
        e.mounts.as_str().into(),
        r.node.as_str().into(),
    ]
}

/// A quota as the catalog's SQL compares it.
fn limit(quota: usize) -> i64 {
    i64::try_from(quota).unwrap_or(i64::MAX)
}

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
        node: row.get(22)?,
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

    /// Records `r` as starting (in no list yet) if its owner runs fewer than `running_quota`
    /// sandboxes, counted and written at once, whichever gateway or node admits at the same
    /// time. `false` if refused. [`SandboxRecords::started`] then lists it, or
    /// [`SandboxRecords::delete`] forgets it.
    pub async fn admit(&self, r: &SandboxRecord, running_quota: usize) -> Result<bool, StoreError> {
        let columns: Vec<&str> = WRITTEN.iter().map(|(column, _)| *column).collect();
        let values: Vec<String> = (WRITTEN.iter().enumerate())
            .map(|(i, (_, sql_type))| format!("CAST(${} AS {sql_type})", i + 1))
            .collect();
        // The owner is parameter 16 (see WRITTEN); the quota comes after the columns.
        let sql = format!(
            "INSERT INTO sandboxes ({}, transition) SELECT {}, 'starting'
             WHERE (SELECT COUNT(*) FROM sandboxes o
                    WHERE COALESCE(o.owner, '') = COALESCE(CAST($16 AS TEXT), '')
                      AND {RUNNING_PLACE}) < CAST(${} AS BIGINT)",
            columns.join(", "),
            values.join(", "),
            WRITTEN.len() + 1,
        );
        let encoded = Encoded::of(r);
        let mut params = row_params(r, &encoded);
        params.push(limit(running_quota).into());
        Ok(self.db.admit(&sql, &params).await? == 1)
    }

    /// Lists an admitted sandbox as running in `slot` on `rootfs`. Fails if its node's slot is
    /// taken.
    pub async fn started(
        &self,
        id: &SandboxId,
        slot: u32,
        rootfs: &std::path::Path,
    ) -> Result<(), StoreError> {
        let rootfs = rootfs.to_string_lossy();
        self.db
            .execute(
                "UPDATE sandboxes SET state = 'running', transition = NULL, slot = $2, rootfs = $3
                 WHERE id = $1",
                &[
                    id.as_str().into(),
                    i64::from(slot).into(),
                    rootfs.as_ref().into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Marks a running sandbox pausing if its owner keeps fewer than `paused_quota` sandboxes
    /// paused (this one aside); `false` if refused. [`SandboxRecords::set_state`] ends it, or
    /// [`SandboxRecords::end_transition`] if the pause fails.
    pub async fn begin_pause(
        &self,
        id: &SandboxId,
        paused_quota: usize,
    ) -> Result<bool, StoreError> {
        let from = SandboxState::Running;
        self.begin(id, from, "pausing", PAUSED_PLACE, paused_quota)
            .await
    }

    /// Marks a paused sandbox resuming if its owner runs fewer than `running_quota`
    /// sandboxes; `false` if refused. [`SandboxRecords::set_state`] ends it, or
    /// [`SandboxRecords::end_transition`] if the resume fails.
    pub async fn begin_resume(
        &self,
        id: &SandboxId,
        running_quota: usize,
    ) -> Result<bool, StoreError> {
        let from = SandboxState::Paused;
        self.begin(id, from, "resuming", RUNNING_PLACE, running_quota)
            .await
    }

    /// Marks a sandbox in state `from` as at `transition` if its owner's rows that are in
    /// `place` number fewer than `quota`.
    async fn begin(
        &self,
        id: &SandboxId,
        from: SandboxState,
        transition: &str,
        place: &str,
        quota: usize,
    ) -> Result<bool, StoreError> {
        let sql = format!(
            "UPDATE sandboxes SET transition = '{transition}'
             WHERE id = $1 AND state = '{}' AND transition IS NULL
               AND (SELECT COUNT(*) FROM sandboxes o WHERE {SAME_OWNER} AND {place})
                   < CAST($2 AS BIGINT)",
            from.as_str()
        );
        let params = [id.as_str().into(), limit(quota).into()];
        Ok(self.db.admit(&sql, &params).await? == 1)
    }

    /// Moves a paused sandbox from node `from` to node `to`, which will resume it (its node
    /// is gone or busy), unless a verb is under way on it or another node took it first.
    pub async fn move_paused(
        &self,
        id: &SandboxId,
        from: &str,
        to: &str,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE sandboxes SET node = $3
                   WHERE id = $1 AND node = $2 AND state = 'paused' AND transition IS NULL";
        let params = [id.as_str().into(), from.into(), to.into()];
        Ok(self.db.execute(sql, &params).await? == 1)
    }

    /// Lets requests resume the sandbox (E2B's `auto_resume`), as a drain does for the
    /// sandboxes it pauses.
    pub async fn set_auto_resume(&self, id: &SandboxId) -> Result<(), StoreError> {
        let sql = "UPDATE sandboxes SET auto_resume = 1 WHERE id = $1";
        self.db.execute(sql, &[id.as_str().into()]).await?;
        Ok(())
    }

    /// A pause or resume that failed: the sandbox stays as it was.
    pub async fn end_transition(&self, id: &SandboxId) -> Result<(), StoreError> {
        let sql = "UPDATE sandboxes SET transition = NULL WHERE id = $1";
        self.db.execute(sql, &[id.as_str().into()]).await?;
        Ok(())
    }

    /// Marks a sandbox killed: it no longer counts in its key's quotas, and its row stays
    /// until its host cleanup is done ([`SandboxRecords::delete`]).
    pub async fn stopping(&self, id: &SandboxId) -> Result<(), StoreError> {
        let sql = "UPDATE sandboxes SET transition = 'stopping' WHERE id = $1";
        self.db.execute(sql, &[id.as_str().into()]).await?;
        Ok(())
    }

    /// Marks running sandbox `id` of `node`, a node that is gone, killed (as
    /// [`SandboxRecords::stopping`] does), unless another verb took it meanwhile: its key's
    /// quota frees at once, and the node's recovery forgets the row and destroys what is left
    /// if the node comes back.
    pub async fn stop_lost(&self, id: &SandboxId, node: &str) -> Result<bool, StoreError> {
        let sql = "UPDATE sandboxes SET transition = 'stopping'
                   WHERE id = $1 AND node = $2 AND state = 'running'
                     AND (transition IS NULL OR transition IN ('pausing', 'resuming'))";
        let params = [id.as_str().into(), node.into()];
        Ok(self.db.execute(sql, &params).await? == 1)
    }

    /// Marks killed (as [`SandboxRecords::stop_lost`] does) every running sandbox whose
    /// timeout passed before `before` (Unix seconds) on a node not among `answering`: nobody
    /// runs it, so nobody else ends it, and it would hold its key's quota for good. Rows of no
    /// node and rows with a verb under way are left alone. The rows this call marked (of
    /// several gateways at once, each row is one's).
    pub async fn stop_lost_past_timeout(
        &self,
        answering: &[String],
        before: i64,
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        let others: Vec<String> = (0..answering.len())
            .map(|i| format!("${}", i + 2))
            .collect();
        let not_answering = match others.is_empty() {
            true => String::new(),
            false => format!("AND node NOT IN ({})", others.join(", ")),
        };
        let sql = format!(
            "UPDATE sandboxes SET transition = 'stopping'
             WHERE state = 'running' AND transition IS NULL AND node <> ''
               AND end_at < CAST($1 AS BIGINT) {not_answering}
             RETURNING {COLUMNS}"
        );
        let mut params: Vec<Value> = vec![before.into()];
        params.extend(answering.iter().map(|n| Value::from(n.as_str())));
        self.db.query(&sql, &params, record).await
    }

    /// After `node` (re)starts: forgets the creates it had not finished and the kills whose
    /// cleanup it had not (the orphan sweep destroys what is left of them), ends the pauses
    /// and resumes it was at (each is then as its state says), and takes the rows from before
    /// sandboxes had nodes.
    pub async fn recover_node(&self, node: &str) -> Result<(), StoreError> {
        self.db
            .batch(&[
                Statement::new(
                    "DELETE FROM sandboxes
                     WHERE node = $1 AND transition IN ('starting', 'stopping')",
                    [node.into()],
                ),
                Statement::new(
                    "UPDATE sandboxes SET transition = NULL WHERE node = $1",
                    [node.into()],
                ),
                Statement::new(
                    "UPDATE sandboxes SET node = $1 WHERE node = ''",
                    [node.into()],
                ),
            ])
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
                "UPDATE sandboxes SET state = $2, slot = $3, end_at = $4, pause_mode = $5,
                 transition = NULL WHERE id = $1",
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

    /// Every sandbox of every node, in the order they were created.
    pub async fn all(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM sandboxes WHERE {LISTED} ORDER BY started_at_us, id");
        self.db.query(&sql, &[], record).await
    }

    /// The sandboxes of API key `owner` on every node, in the order they were created, but
    /// for those killed.
    pub async fn of_owner(&self, owner: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM sandboxes WHERE owner = $1 AND {ALIVE} ORDER BY started_at_us, id");
        self.db.query(&sql, &[owner.into()], record).await
    }

    /// The sandboxes `node` runs or keeps paused, in the order they were created.
    pub async fn of_node(&self, node: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM sandboxes WHERE node = $1 AND {LISTED} ORDER BY started_at_us, id");
        self.db.query(&sql, &[node.into()], record).await
    }

    pub async fn get(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE id = $1 AND {LISTED}");
        self.db.query_opt(&sql, &[id.as_str().into()], record).await
    }

    /// Sandbox `id` unless it is starting or killed: what a gateway routes to.
    pub async fn alive(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE id = $1 AND {ALIVE}");
        self.db.query_opt(&sql, &[id.as_str().into()], record).await
    }
}
