//! Template tags (E2B's `name:tag`). A tag names one ready build of a user template, so one
//! name keeps several builds startable (`my-env:v1`, `my-env:stable`) and a tag moves between
//! them without a rebuild. A build asks for its tags when it is requested and gets them once it
//! is ready: a failed build moves none. A name without a tag means its `default` tag, and in
//! place of a tag a build's id picks that build.
//!
//! Each ready build's root filesystem is recorded in `templates` under the build's id, so every
//! build has its own golden image; the built-ins are recorded under their names.

use super::db::Statement;
use super::{StoreError, TemplateRecord, Templates};
use crate::ids::TemplateName;
use std::collections::HashSet;

/// The tag a name without one means, and the one a build gets when it asks for none.
pub const DEFAULT_TAG: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateTag {
    pub tag: String,
    pub build_id: String,
    /// When the tag last moved to this build.
    pub created_at: i64,
}

/// `name:tag` split at its colon (`None`: no tag given).
pub fn split_reference(reference: &str) -> (&str, Option<&str>) {
    match reference.split_once(':') {
        Some((name, tag)) => (name, Some(tag)),
        None => (reference, None),
    }
}

/// A tag as Docker allows one: 1-128 letters, digits, `_`, `.` and `-`, not starting with `.`
/// or `-`.
pub fn valid_tag(tag: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    (1..=128).contains(&tag.len()) && tag.chars().all(allowed) && !tag.starts_with(['.', '-'])
}

/// Points a tag of the template at the build, moving it from the build it named.
pub(super) fn point<'a>(
    template: &'a TemplateName,
    tag: &'a str,
    build: &'a str,
    now: i64,
) -> Statement<'a> {
    Statement::new(
        "INSERT INTO template_tags (template_id, tag, build_id, created_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id,
           created_at = excluded.created_at",
        [
            template.as_str().into(),
            tag.into(),
            build.into(),
            now.into(),
        ],
    )
}

impl Templates {
    /// The template's tags, by name.
    pub async fn tags_of(&self, template: &TemplateName) -> Result<Vec<TemplateTag>, StoreError> {
        self.db
            .query(
                "SELECT tag, build_id, created_at FROM template_tags WHERE template_id = $1
                 ORDER BY tag",
                &[template.as_str().into()],
                |row| {
                    Ok(TemplateTag {
                        tag: row.get(0)?,
                        build_id: row.get(1)?,
                        created_at: row.get(2)?,
                    })
                },
            )
            .await
    }

    /// Points the tags at the build (moving them from the builds they named), all at once.
    pub async fn assign_tags(
        &self,
        template: &TemplateName,
        build: &str,
        tags: &[String],
        now: i64,
    ) -> Result<(), StoreError> {
        let statements: Vec<_> = tags
            .iter()
            .map(|tag| point(template, tag, build, now))
            .collect();
        self.db.batch(&statements).await
    }

    /// Removes the tags from the template, all or none: the ones it does not have are returned
    /// (and then nothing was removed). The builds stay, startable by their ids.
    pub async fn remove_tags(
        &self,
        template: &TemplateName,
        tags: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let statements: Vec<_> = tags
            .iter()
            .map(|tag| {
                Statement::new(
                    "DELETE FROM template_tags WHERE template_id = $1 AND tag = $2",
                    [template.as_str().into(), tag.as_str().into()],
                )
            })
            .collect();
        let removed_all = |removed: &[u64]| removed.iter().all(|&n| n > 0);
        if self
            .db
            .transaction(&statements, removed_all)
            .await?
            .is_some()
        {
            return Ok(Vec::new());
        }
        // Rolled back: say which were missing. Another request may have removed or added one
        // meanwhile; the answer is as of this read.
        let have: HashSet<String> = self
            .tags_of(template)
            .await?
            .into_iter()
            .map(|t| t.tag)
            .collect();
        Ok(tags
            .iter()
            .filter(|t| !have.contains(*t))
            .cloned()
            .collect())
    }

    /// The template records that a name or tag reaches (the built-ins', the tagged builds'),
    /// and builds' that are being published: what golden images and pools are kept for. A
    /// build no tag names any more is started by its id only, by booting it.
    pub async fn named_templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        let untagged: HashSet<String> = self
            .db
            .query(
                "SELECT id FROM template_builds WHERE status = 'ready'
                   AND id NOT IN (SELECT build_id FROM template_tags)",
                &[],
                |row| row.get(0),
            )
            .await?
            .into_iter()
            .collect();
        let mut templates = self.all().await?;
        templates.retain(|t| !untagged.contains(t.name.as_str()));
        Ok(templates)
    }

    /// The ready build of the template that `tag` means: the build the tag names, else the
    /// build whose id it is.
    pub async fn build_tagged(
        &self,
        template: &TemplateName,
        tag: &str,
    ) -> Result<Option<String>, StoreError> {
        let params = [template.as_str().into(), tag.into()];
        let tagged = self
            .db
            .query_opt(
                "SELECT build_id FROM template_tags WHERE template_id = $1 AND tag = $2",
                &params,
                |row| row.get(0),
            )
            .await?;
        if tagged.is_some() {
            return Ok(tagged);
        }
        self.db
            .query_opt(
                "SELECT id FROM template_builds WHERE template_id = $1 AND id = $2
                   AND status = 'ready'",
                &params,
                |row| row.get(0),
            )
            .await
    }
}
