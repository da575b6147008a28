//! The templates API keys own, and which of them a name reaches for a key.
//!
//! A user template is a name an API key owns (its alias) with an id; each build of it is a row
//! of `template_builds` (see `builds.rs`). When a build is ready, its root filesystem is
//! recorded in `templates` under the build's id, like a built-in's under its name, so golden
//! images and pools treat both alike; its tags (see `tags.rs`) then name it.

use super::db::{Row, Statement};
use super::tags::{split_reference, DEFAULT_TAG};
use super::{StoreError, TemplateRecord, Templates};
use crate::ids::TemplateName;
use crate::template::KNOWN_TEMPLATES;

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

const COLUMNS: &str =
    "id, owner, alias, public, cpu_count, memory_mb, created_at FROM user_templates";

fn user_template(row: &Row) -> Result<UserTemplate, StoreError> {
    let id: String = row.get(0)?;
    let corrupt = || StoreError::Corrupt(id.clone());
    let name = |s: &str| TemplateName::parse(s).map_err(|_| corrupt());
    let resource = |i| -> Result<Option<u32>, StoreError> {
        let n: Option<i64> = row.get(i)?;
        n.map(|n| u32::try_from(n).map_err(|_| corrupt()))
            .transpose()
    };
    Ok(UserTemplate {
        id: name(&id)?,
        owner: row.get(1)?,
        alias: name(&row.get::<String>(2)?)?,
        public: row.get::<i64>(3)? != 0,
        cpu_count: resource(4)?,
        memory_mb: resource(5)?,
        created_at: row.get(6)?,
    })
}

impl Templates {
    /// Records a new user template; `false` if its owner already has one of that alias.
    pub async fn insert_user_template(&self, t: &UserTemplate) -> Result<bool, StoreError> {
        let n = self
            .db
            .execute(
                "INSERT INTO user_templates
                   (id, owner, alias, public, cpu_count, memory_mb, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                &[
                    t.id.as_str().into(),
                    t.owner.as_str().into(),
                    t.alias.as_str().into(),
                    t.public.into(),
                    t.cpu_count.map(i64::from).into(),
                    t.memory_mb.map(i64::from).into(),
                    t.created_at.into(),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    /// Sets what a new build asked for (E2B keeps a template's latest resources), and whether
    /// it is public.
    pub async fn update_user_template(&self, t: &UserTemplate) -> Result<(), StoreError> {
        self.db
            .execute(
                "UPDATE user_templates SET cpu_count = $2, memory_mb = $3, public = $4
                 WHERE id = $1",
                &[
                    t.id.as_str().into(),
                    t.cpu_count.map(i64::from).into(),
                    t.memory_mb.map(i64::from).into(),
                    t.public.into(),
                ],
            )
            .await?;
        Ok(())
    }

    pub async fn user_template(&self, id: &str) -> Result<Option<UserTemplate>, StoreError> {
        let sql = format!("SELECT {COLUMNS} WHERE id = $1");
        self.db.query_opt(&sql, &[id.into()], user_template).await
    }

    /// The owner's template of that alias.
    pub async fn user_template_by_alias(
        &self,
        owner: &str,
        alias: &str,
    ) -> Result<Option<UserTemplate>, StoreError> {
        let sql = format!("SELECT {COLUMNS} WHERE owner = $1 AND alias = $2");
        let params = [owner.into(), alias.into()];
        self.db.query_opt(&sql, &params, user_template).await
    }

    pub async fn user_templates(&self) -> Result<Vec<UserTemplate>, StoreError> {
        let sql = format!("SELECT {COLUMNS} ORDER BY created_at, id");
        self.db.query(&sql, &[], user_template).await
    }

    /// The templates `owner` made, oldest first.
    pub async fn user_templates_of(&self, owner: &str) -> Result<Vec<UserTemplate>, StoreError> {
        let sql = format!("SELECT {COLUMNS} WHERE owner = $1 ORDER BY created_at, id");
        self.db.query(&sql, &[owner.into()], user_template).await
    }

    /// Deletes the template, its builds, their logs and built root filesystems' records, and
    /// its tags: all of them or, if the database fails midway, none.
    pub async fn delete_user_template(&self, id: &TemplateName) -> Result<(), StoreError> {
        let statements = [
            "DELETE FROM build_logs WHERE build_id IN
               (SELECT id FROM template_builds WHERE template_id = $1)",
            "DELETE FROM templates WHERE name IN
               (SELECT id FROM template_builds WHERE template_id = $1)",
            "DELETE FROM template_builds WHERE template_id = $1",
            "DELETE FROM template_tags WHERE template_id = $1",
            "DELETE FROM user_templates WHERE id = $1",
        ]
        .map(|sql| Statement::new(sql, [id.as_str().into()]));
        self.db.batch(&statements).await
    }

    /// The user template that `name` means to `owner` (`None`: no key). A bare name is the
    /// owner's own (by alias or id), else a public template by its id, which the server made
    /// and no key chooses. Another key's public template is named with its owner's namespace,
    /// `{key id}/{alias}` (E2B's `team/name`): a bare alias never reaches another key's
    /// template, so no key can publish a name that shadows one of another key's names.
    /// Never another key's private template.
    pub async fn user_template_named(
        &self,
        owner: Option<&str>,
        name: &str,
    ) -> Result<Option<UserTemplate>, StoreError> {
        let visible = |t: &UserTemplate| t.public || Some(t.owner.as_str()) == owner;
        if let Some((namespace, alias)) = name.split_once('/') {
            let found = self.user_template_by_alias(namespace, alias).await?;
            return Ok(found.filter(visible));
        }
        if let Some(owner) = owner {
            if let Some(t) = self.user_template_by_alias(owner, name).await? {
                return Ok(Some(t));
            }
        }
        Ok(self.user_template(name).await?.filter(visible))
    }

    /// The built template that `reference` (`name` or `name:tag`) means to `owner`: the
    /// tagged build of a user template as [`Templates::user_template_named`] finds it, or else
    /// a built-in (whose one tag is `default`). With the user template, if it is one. A build's
    /// record is never found by its own name: only through its template, which checks the key.
    pub async fn visible_template(
        &self,
        owner: Option<&str>,
        reference: &str,
    ) -> Result<Option<(TemplateRecord, Option<UserTemplate>)>, StoreError> {
        let (name, tag) = split_reference(reference);
        let tag = tag.unwrap_or(DEFAULT_TAG);
        let Some(user_template) = self.user_template_named(owner, name).await? else {
            if !KNOWN_TEMPLATES.contains(&name) || tag != DEFAULT_TAG {
                return Ok(None);
            }
            let built_in = TemplateName::parse(name).expect("built-in names are valid");
            return Ok(self.get(&built_in).await?.map(|record| (record, None)));
        };
        let build = self.build_tagged(&user_template.id, tag).await?;
        let Some(build) = build.and_then(|b| TemplateName::parse(&b).ok()) else {
            return Ok(None);
        };
        Ok(self
            .get(&build)
            .await?
            .map(|record| (record, Some(user_template))))
    }

    /// The user template whose build a template record is (`None`: a built-in's record).
    pub async fn template_of_record(
        &self,
        record: &TemplateName,
    ) -> Result<Option<UserTemplate>, StoreError> {
        let template: Option<String> = self
            .db
            .query_opt(
                "SELECT template_id FROM template_builds WHERE id = $1",
                &[record.as_str().into()],
                |row| row.get(0),
            )
            .await?;
        // Sandboxes from before tags name the template itself.
        self.user_template(template.as_deref().unwrap_or(record.as_str()))
            .await
    }
}
