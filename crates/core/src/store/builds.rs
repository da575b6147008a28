//! Builds of users' templates, their logs, and the layers they made.

use super::db::{Row, Statement, Value};
use super::{StoreError, Templates};
use crate::ids::TemplateName;
use std::path::{Path, PathBuf};

/// Where a build is (E2B's build statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
    /// Requested; the steps have not come yet, or it waits for its turn.
    Waiting,
    Building,
    Ready,
    Error,
}

impl BuildStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStatus::Waiting => "waiting",
            BuildStatus::Building => "building",
            BuildStatus::Ready => "ready",
            BuildStatus::Error => "error",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::Waiting, Self::Building, Self::Ready, Self::Error]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRecord {
    /// A UUID, as E2B's SDK expects.
    pub id: String,
    pub template_id: TemplateName,
    pub status: BuildStatus,
    /// Why it failed: the message, and E2B's step label (`base`, a 1-based step, `finalize`).
    pub failure: Option<(String, Option<String>)>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    /// The tags it gets once it is ready.
    pub tags: Vec<String>,
}

/// E2B's log levels, the same for builds as for sandboxes.
pub use airlock_wire::logs::LogLevel;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub at_ms: i64,
    pub level: LogLevel,
    /// E2B's step label, as in [`BuildRecord::failure`].
    pub step: Option<String>,
    pub message: String,
}

const BUILD_COLUMNS: &str = "id, template_id, status, reason, reason_step, created_at, \
                             finished_at, tags FROM template_builds";

fn build(row: &Row) -> Result<BuildRecord, StoreError> {
    let id: String = row.get(0)?;
    let corrupt = || StoreError::Corrupt(id.clone());
    let reason: Option<String> = row.get(3)?;
    Ok(BuildRecord {
        template_id: TemplateName::parse(&row.get::<String>(1)?).map_err(|_| corrupt())?,
        status: BuildStatus::parse(&row.get::<String>(2)?).ok_or_else(corrupt)?,
        failure: reason
            .map(|r| row.get(4).map(|step| (r, step)))
            .transpose()?,
        created_at: row.get(5)?,
        finished_at: row.get(6)?,
        tags: serde_json::from_str(&row.get::<String>(7)?).map_err(|_| corrupt())?,
        id,
    })
}

/// The builds beyond each template's `$1` newest that no tag names (`$2`: of that template
/// only, if not NULL).
const PRUNED: &str = "SELECT id FROM (SELECT id, template_id, ROW_NUMBER() OVER (PARTITION BY
                        template_id ORDER BY created_at DESC, seq DESC, id DESC) AS n
                        FROM template_builds) AS ranked
                      WHERE n > $1 AND (CAST($2 AS TEXT) IS NULL OR template_id = $2)
                        AND id NOT IN (SELECT build_id FROM template_tags)";

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Templates {
    /// Records a requested build, after every earlier build of its template.
    pub async fn insert_build(&self, b: &BuildRecord) -> Result<(), StoreError> {
        let tags = serde_json::to_string(&b.tags).expect("tags serialize");
        self.db
            .execute(
                "INSERT INTO template_builds (id, template_id, status, created_at, tags, seq)
                 VALUES ($1, $2, $3, $4, $5, (SELECT COALESCE(MAX(seq), 0) + 1
                   FROM template_builds WHERE template_id = $2))",
                &[
                    b.id.as_str().into(),
                    b.template_id.as_str().into(),
                    b.status.as_str().into(),
                    b.created_at.into(),
                    tags.as_str().into(),
                ],
            )
            .await?;
        Ok(())
    }

    pub async fn build(&self, id: &str) -> Result<Option<BuildRecord>, StoreError> {
        let sql = format!("SELECT {BUILD_COLUMNS} WHERE id = $1");
        self.db.query_opt(&sql, &[id.into()], build).await
    }

    /// Every build of a template, newest first.
    pub async fn builds_of(&self, template: &TemplateName) -> Result<Vec<BuildRecord>, StoreError> {
        let sql = format!(
            "SELECT {BUILD_COLUMNS} WHERE template_id = $1
             ORDER BY created_at DESC, seq DESC, id DESC"
        );
        self.db
            .query(&sql, &[template.as_str().into()], build)
            .await
    }

    /// Moves a build on; a final status (ready, error) also records when it ended, and a
    /// ready build gets the tags it asked for, in the same transaction.
    pub async fn set_build_status(
        &self,
        id: &str,
        status: BuildStatus,
        failure: Option<(&str, Option<&str>)>,
        now: i64,
    ) -> Result<(), StoreError> {
        let finished = matches!(status, BuildStatus::Ready | BuildStatus::Error).then_some(now);
        let mut statements = vec![Statement::new(
            "UPDATE template_builds SET status = $2, reason = $3, reason_step = $4,
               finished_at = $5 WHERE id = $1",
            [
                id.into(),
                status.as_str().into(),
                failure.map(|f| f.0).into(),
                failure.and_then(|f| f.1).into(),
                finished.into(),
            ],
        )];
        // A build's tags are fixed when it is requested.
        let asked = match status {
            BuildStatus::Ready => self.build(id).await?.map(|b| (b.template_id, b.tags)),
            _ => None,
        };
        if let Some((template, tags)) = &asked {
            statements.extend(
                tags.iter()
                    .map(|tag| super::tags::point(template, tag, id, now)),
            );
        }
        self.db.batch(&statements).await
    }

    /// Forgets all but each template's `keep` newest builds and the ones a tag names, with
    /// their logs and root filesystems' records (collection then removes their files, unless a
    /// sandbox or snapshot still uses them).
    pub async fn prune_builds(&self, keep: usize) -> Result<(), StoreError> {
        self.prune(None, keep).await
    }

    /// [`Templates::prune_builds`] for one template (as a new build of it starts, so that a
    /// key that builds one template again and again keeps no more records and logs than
    /// `keep`).
    pub async fn prune_builds_of(
        &self,
        template: &TemplateName,
        keep: usize,
    ) -> Result<(), StoreError> {
        self.prune(Some(template.as_str()), keep).await
    }

    async fn prune(&self, template: Option<&str>, keep: usize) -> Result<(), StoreError> {
        let sql = [
            "build_logs WHERE build_id",
            "templates WHERE name",
            "template_builds WHERE id",
        ]
        .map(|rows| format!("DELETE FROM {rows} IN ({PRUNED})"));
        let params: [Value; 2] = [as_i64(keep as u64).into(), template.into()];
        let statements = sql.each_ref().map(|sql| Statement::new(sql, params));
        self.db.batch(&statements).await
    }

    /// How many builds are on record in each status (pruned ones are not).
    pub async fn build_counts(&self) -> Result<Vec<(BuildStatus, u64)>, StoreError> {
        let sql = "SELECT status, COUNT(*) FROM template_builds GROUP BY status ORDER BY status";
        self.db
            .query(sql, &[], |row| {
                let status: String = row.get(0)?;
                let status = BuildStatus::parse(&status)
                    .ok_or_else(|| StoreError::Corrupt(format!("build status {status:?}")))?;
                Ok((status, row.get::<i64>(1)?.max(0) as u64))
            })
            .await
    }

    /// Builds that were under way when the server stopped: they cannot go on.
    pub async fn unfinished_builds(&self) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT id FROM template_builds WHERE status IN ('waiting', 'building')";
        self.db.query(sql, &[], |row| row.get(0)).await
    }

    /// Records that `owner`'s build made layer `path` of `bytes` (the first maker of a shared
    /// layer keeps it on its account).
    pub async fn record_layer(
        &self,
        path: &Path,
        owner: &str,
        bytes: u64,
    ) -> Result<(), StoreError> {
        self.db
            .execute(
                "INSERT INTO build_layers (path, owner, bytes) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                &[
                    path.to_string_lossy().as_ref().into(),
                    owner.into(),
                    as_i64(bytes).into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// The layers `owner`'s builds made, with their sizes.
    pub async fn layers_of(&self, owner: &str) -> Result<Vec<(PathBuf, u64)>, StoreError> {
        let sql = "SELECT path, bytes FROM build_layers WHERE owner = $1";
        self.db
            .query(sql, &[owner.into()], |row| {
                let bytes = row.get::<i64>(1)?.max(0) as u64;
                Ok((PathBuf::from(row.get::<String>(0)?), bytes))
            })
            .await
    }

    /// Forgets a layer that was removed from disk.
    pub async fn forget_layer(&self, path: &Path) -> Result<(), StoreError> {
        let path = path.to_string_lossy();
        self.db
            .execute(
                "DELETE FROM build_layers WHERE path = $1",
                &[path.as_ref().into()],
            )
            .await?;
        Ok(())
    }

    pub async fn append_build_log(&self, build: &str, entry: &LogEntry) -> Result<(), StoreError> {
        self.db
            .execute(
                "INSERT INTO build_logs (build_id, seq, at_ms, level, step, message)
                 VALUES ($1, (SELECT COUNT(*) FROM build_logs WHERE build_id = $1), $2, $3, $4,
                   $5)",
                &[
                    build.into(),
                    entry.at_ms.into(),
                    entry.level.as_str().into(),
                    entry.step.as_deref().into(),
                    entry.message.as_str().into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Up to `limit` of the build's log entries, from the `offset`th on.
    pub async fn build_logs(
        &self,
        build: &str,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<LogEntry>, StoreError> {
        self.db
            .query(
                "SELECT at_ms, level, step, message FROM build_logs
                 WHERE build_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
                &[build.into(), as_i64(offset).into(), as_i64(limit).into()],
                |row| {
                    Ok(LogEntry {
                        at_ms: row.get(0)?,
                        level: LogLevel::parse(&row.get::<String>(1)?).unwrap_or(LogLevel::Info),
                        step: row.get(2)?,
                        message: row.get(3)?,
                    })
                },
            )
            .await
    }
}
