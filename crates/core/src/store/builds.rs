//! Users' templates, their builds and the builds' logs.
//!
//! A user template is a name an API key owns (its alias) with an id; each build of it is a row
//! here with its log. When a build is ready, its root filesystem is recorded in `templates`
//! under the build's id, like a built-in's under its name, so golden images and pools treat
//! both alike; its tags (see [`super::tags`]) then name it.

use super::tags::{split_reference, DEFAULT_TAG};
use super::{Store, StoreError, TemplateRecord};
use crate::ids::TemplateName;
use crate::template::KNOWN_TEMPLATES;
use rusqlite::{params, OptionalExtension, Row};
use std::path::{Path, PathBuf};

/// A template an API key builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserTemplate {
    /// What `templates` and sandboxes know it by once built.
    pub id: TemplateName,
    pub owner: String,
    /// Its name, unique among its owner's templates and snapshots.
    pub alias: TemplateName,
    /// Visible to every key (E2B's `public`).
    pub public: bool,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u32>,
    pub created_at: i64,
}

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

fn user_template(row: &Row<'_>) -> rusqlite::Result<(String, UserTemplateRow)> {
    Ok((
        row.get(0)?,
        UserTemplateRow {
            owner: row.get(1)?,
            alias: row.get(2)?,
            public: row.get(3)?,
            cpu_count: row.get(4)?,
            memory_mb: row.get(5)?,
            created_at: row.get(6)?,
        },
    ))
}

struct UserTemplateRow {
    owner: String,
    alias: String,
    public: bool,
    cpu_count: Option<u32>,
    memory_mb: Option<u32>,
    created_at: i64,
}

fn parse_user_template((id, r): (String, UserTemplateRow)) -> Result<UserTemplate, StoreError> {
    let name = |s: &str| TemplateName::parse(s).map_err(|_| StoreError::Corrupt(id.clone()));
    Ok(UserTemplate {
        id: name(&id)?,
        alias: name(&r.alias)?,
        owner: r.owner,
        public: r.public,
        cpu_count: r.cpu_count,
        memory_mb: r.memory_mb,
        created_at: r.created_at,
    })
}

const USER_TEMPLATE_COLUMNS: &str =
    "id, owner, alias, public, cpu_count, memory_mb, created_at FROM user_templates";

impl Store {
    /// Records a new user template; `false` if its owner already has one of that alias.
    pub fn insert_user_template(&self, t: &UserTemplate) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "INSERT OR IGNORE INTO user_templates
               (id, owner, alias, public, cpu_count, memory_mb, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                t.id.as_str(),
                t.owner,
                t.alias.as_str(),
                t.public,
                t.cpu_count,
                t.memory_mb,
                t.created_at
            ],
        )?;
        Ok(n == 1)
    }

    /// Sets what a new build asked for (E2B keeps a template's latest resources), and whether
    /// it is public.
    pub fn update_user_template(&self, t: &UserTemplate) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE user_templates SET cpu_count = ?2, memory_mb = ?3, public = ?4 WHERE id = ?1",
            params![t.id.as_str(), t.cpu_count, t.memory_mb, t.public],
        )?;
        Ok(())
    }

    pub fn user_template(&self, id: &str) -> Result<Option<UserTemplate>, StoreError> {
        let conn = self.conn();
        let sql = format!("SELECT {USER_TEMPLATE_COLUMNS} WHERE id = ?1");
        let row = conn
            .query_row(&sql, params![id], user_template)
            .optional()?;
        row.map(parse_user_template).transpose()
    }

    /// The owner's template of that alias.
    pub fn user_template_by_alias(
        &self,
        owner: &str,
        alias: &str,
    ) -> Result<Option<UserTemplate>, StoreError> {
        let conn = self.conn();
        let sql = format!("SELECT {USER_TEMPLATE_COLUMNS} WHERE owner = ?1 AND alias = ?2");
        let row = conn
            .query_row(&sql, params![owner, alias], user_template)
            .optional()?;
        row.map(parse_user_template).transpose()
    }

    pub fn user_templates(&self) -> Result<Vec<UserTemplate>, StoreError> {
        let conn = self.conn();
        let sql = format!("SELECT {USER_TEMPLATE_COLUMNS} ORDER BY created_at");
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([], user_template)?;
        rows.map(|r| parse_user_template(r?)).collect()
    }

    /// Deletes the template, its builds, their logs and built root filesystems' records, and
    /// its tags.
    pub fn delete_user_template(&self, id: &TemplateName) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for sql in [
            "DELETE FROM build_logs WHERE build_id IN
               (SELECT id FROM template_builds WHERE template_id = ?1)",
            "DELETE FROM templates WHERE name IN
               (SELECT id FROM template_builds WHERE template_id = ?1)",
            "DELETE FROM template_builds WHERE template_id = ?1",
            "DELETE FROM template_tags WHERE template_id = ?1",
            "DELETE FROM user_templates WHERE id = ?1",
        ] {
            tx.execute(sql, params![id.as_str()])?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn insert_build(&self, b: &BuildRecord) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO template_builds (id, template_id, status, created_at, tags)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                b.id,
                b.template_id.as_str(),
                b.status.as_str(),
                b.created_at,
                serde_json::to_string(&b.tags).unwrap_or_else(|_| "[]".into()),
            ],
        )?;
        Ok(())
    }

    pub fn build(&self, id: &str) -> Result<Option<BuildRecord>, StoreError> {
        Ok(self.query_builds("WHERE id = ?1", id)?.into_iter().next())
    }

    /// Every build of a template, newest first.
    pub fn builds_of(&self, template: &TemplateName) -> Result<Vec<BuildRecord>, StoreError> {
        self.query_builds(
            "WHERE template_id = ?1 ORDER BY created_at DESC, rowid DESC",
            template.as_str(),
        )
    }

    fn query_builds(&self, filter: &str, arg: &str) -> Result<Vec<BuildRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT id, template_id, status, reason, reason_step, created_at, finished_at, tags
             FROM template_builds {filter}"
        ))?;
        let rows = stmt.query_map(params![arg], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, Option<String>>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, Option<i64>>(6)?,
                row.get::<_, String>(7)?,
            ))
        })?;
        let mut builds = Vec::new();
        for row in rows {
            let (id, template, status, reason, step, created_at, finished_at, tags) = row?;
            let corrupt = || StoreError::Corrupt(id.clone());
            builds.push(BuildRecord {
                template_id: TemplateName::parse(&template).map_err(|_| corrupt())?,
                status: BuildStatus::parse(&status).ok_or_else(corrupt)?,
                failure: reason.map(|r| (r, step)),
                created_at,
                finished_at,
                tags: serde_json::from_str(&tags).map_err(|_| corrupt())?,
                id,
            });
        }
        Ok(builds)
    }

    /// Moves a build on; a final status (ready, error) also records when it ended, and a
    /// ready build gets the tags it asked for, at once.
    pub fn set_build_status(
        &self,
        id: &str,
        status: BuildStatus,
        failure: Option<(&str, Option<&str>)>,
        now: i64,
    ) -> Result<(), StoreError> {
        let finished = matches!(status, BuildStatus::Ready | BuildStatus::Error).then_some(now);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE template_builds SET status = ?2, reason = ?3, reason_step = ?4,
               finished_at = ?5 WHERE id = ?1",
            params![
                id,
                status.as_str(),
                failure.map(|f| f.0),
                failure.and_then(|f| f.1),
                finished
            ],
        )?;
        if status == BuildStatus::Ready {
            tx.execute(
                "INSERT OR REPLACE INTO template_tags (template_id, tag, build_id, created_at)
                 SELECT b.template_id, t.value, b.id, ?2
                 FROM template_builds b, json_each(b.tags) t WHERE b.id = ?1",
                params![id, now],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Forgets all but each template's `keep` newest builds and the ones a tag names, with
    /// their logs and root filesystems' records (collection then removes their files, unless a
    /// sandbox or snapshot still uses them).
    pub fn prune_builds(&self, keep: usize) -> Result<(), StoreError> {
        self.prune(None, keep)
    }

    /// [`Store::prune_builds`] for one template (as a new build of it starts, so that a key
    /// that builds one template again and again keeps no more records and logs than `keep`).
    pub fn prune_builds_of(&self, template: &TemplateName, keep: usize) -> Result<(), StoreError> {
        self.prune(Some(template.as_str()), keep)
    }

    fn prune(&self, template: Option<&str>, keep: usize) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let old = "SELECT id FROM (SELECT id, template_id, ROW_NUMBER() OVER (PARTITION BY
                     template_id ORDER BY created_at DESC, rowid DESC) AS n FROM template_builds)
                   WHERE n > ?1 AND (?2 IS NULL OR template_id = ?2)
                     AND id NOT IN (SELECT build_id FROM template_tags)";
        for rows in [
            "build_logs WHERE build_id",
            "templates WHERE name",
            "template_builds WHERE id",
        ] {
            tx.execute(
                &format!("DELETE FROM {rows} IN ({old})"),
                params![keep as i64, template],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// How many builds are on record in each status (pruned ones are not).
    pub fn build_counts(&self) -> Result<Vec<(BuildStatus, u64)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT status, COUNT(*) FROM template_builds GROUP BY status ORDER BY status",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })?;
        let mut counts = Vec::new();
        for row in rows {
            let (status, n) = row?;
            let status = BuildStatus::parse(&status)
                .ok_or_else(|| StoreError::Corrupt(format!("build status {status:?}")))?;
            counts.push((status, n as u64));
        }
        Ok(counts)
    }

    /// Builds that were under way when the server stopped: they cannot go on.
    pub fn unfinished_builds(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare("SELECT id FROM template_builds WHERE status IN ('waiting', 'building')")?;
        let rows = stmt.query_map([], |row| row.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Records that `owner`'s build made layer `path` of `bytes` (the first maker of a shared
    /// layer keeps it on its account).
    pub fn record_layer(&self, path: &Path, owner: &str, bytes: u64) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT OR IGNORE INTO build_layers (path, owner, bytes) VALUES (?1, ?2, ?3)",
            params![path.to_string_lossy(), owner, bytes as i64],
        )?;
        Ok(())
    }

    /// The layers `owner`'s builds made, with their sizes.
    pub fn layers_of(&self, owner: &str) -> Result<Vec<(PathBuf, u64)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT path, bytes FROM build_layers WHERE owner = ?1")?;
        let rows = stmt.query_map(params![owner], |row| {
            Ok((
                PathBuf::from(row.get::<_, String>(0)?),
                row.get::<_, i64>(1)?.max(0) as u64,
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets a layer that was removed from disk.
    pub fn forget_layer(&self, path: &Path) -> Result<(), StoreError> {
        self.conn().execute(
            "DELETE FROM build_layers WHERE path = ?1",
            params![path.to_string_lossy()],
        )?;
        Ok(())
    }

    pub fn append_build_log(&self, build: &str, entry: &LogEntry) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO build_logs (build_id, seq, at_ms, level, step, message)
             VALUES (?1, (SELECT COUNT(*) FROM build_logs WHERE build_id = ?1), ?2, ?3, ?4, ?5)",
            params![
                build,
                entry.at_ms,
                entry.level.as_str(),
                entry.step,
                entry.message
            ],
        )?;
        Ok(())
    }

    /// Up to `limit` of the build's log entries, from the `offset`th on.
    pub fn build_logs(
        &self,
        build: &str,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<LogEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT at_ms, level, step, message FROM build_logs
             WHERE build_id = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
        )?;
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![build, as_i64(offset), as_i64(limit)], |row| {
            Ok(LogEntry {
                at_ms: row.get(0)?,
                level: LogLevel::parse(&row.get::<_, String>(1)?).unwrap_or(LogLevel::Info),
                step: row.get(2)?,
                message: row.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The user template that `name` means to `owner` (`None`: no key). A bare name is the
    /// owner's own (by alias or id), else a public template by its id, which the server made
    /// and no key chooses. Another key's public template is named with its owner's namespace,
    /// `{key id}/{alias}` (E2B's `team/name`): a bare alias never reaches another key's
    /// template, so no key can publish a name that shadows one of another key's names.
    /// Never another key's private template.
    pub fn user_template_named(
        &self,
        owner: Option<&str>,
        name: &str,
    ) -> Result<Option<UserTemplate>, StoreError> {
        let visible = |t: &UserTemplate| t.public || Some(t.owner.as_str()) == owner;
        if let Some((namespace, alias)) = name.split_once('/') {
            let found = self.user_template_by_alias(namespace, alias)?;
            return Ok(found.filter(visible));
        }
        if let Some(owner) = owner {
            if let Some(t) = self.user_template_by_alias(owner, name)? {
                return Ok(Some(t));
            }
        }
        Ok(self.user_template(name)?.filter(visible))
    }

    /// The built template that `reference` (`name` or `name:tag`) means to `owner`: the
    /// tagged build of a user template as [`Store::user_template_named`] finds it, or else a
    /// built-in (whose one tag is `default`). With the user template, if it is one. A build's
    /// record is never found by its own name: only through its template, which checks the key.
    pub fn visible_template(
        &self,
        owner: Option<&str>,
        reference: &str,
    ) -> Result<Option<(TemplateRecord, Option<UserTemplate>)>, StoreError> {
        let (name, tag) = split_reference(reference);
        let tag = tag.unwrap_or(DEFAULT_TAG);
        let Some(user_template) = self.user_template_named(owner, name)? else {
            if !KNOWN_TEMPLATES.contains(&name) || tag != DEFAULT_TAG {
                return Ok(None);
            }
            let built_in = TemplateName::parse(name).expect("built-in names are valid");
            return Ok(self.template(&built_in)?.map(|record| (record, None)));
        };
        let build = self.build_tagged(&user_template.id, tag)?;
        let Some(build) = build.and_then(|b| TemplateName::parse(&b).ok()) else {
            return Ok(None);
        };
        Ok(self
            .template(&build)?
            .map(|record| (record, Some(user_template))))
    }

    /// The user template whose build a template record is (`None`: a built-in's record).
    pub fn template_of_record(
        &self,
        record: &TemplateName,
    ) -> Result<Option<UserTemplate>, StoreError> {
        let template: Option<String> = self
            .conn()
            .query_row(
                "SELECT template_id FROM template_builds WHERE id = ?1",
                params![record.as_str()],
                |row| row.get(0),
            )
            .optional()?;
        // Sandboxes from before tags name the template itself.
        self.user_template(template.as_deref().unwrap_or(record.as_str()))
    }
}
