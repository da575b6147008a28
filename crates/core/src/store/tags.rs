//! Template tags (E2B's `name:tag`). A tag names one ready build of a user template, so one
//! name keeps several builds startable (`my-env:v1`, `my-env:stable`) and a tag moves between
//! them without a rebuild. A build asks for its tags when it is requested and gets them once it
//! is ready: a failed build moves none. A name without a tag means its `default` tag, and in
//! place of a tag a build's id picks that build.
//!
//! Each ready build's root filesystem is recorded in `templates` under the build's id, so every
//! build has its own golden image; the built-ins are recorded under their names.

use super::{Store, StoreError, TemplateRecord};
use crate::ids::TemplateName;
use rusqlite::{params, OptionalExtension};
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

impl Store {
    /// The template's tags, by name.
    pub fn tags_of(&self, template: &TemplateName) -> Result<Vec<TemplateTag>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT tag, build_id, created_at FROM template_tags WHERE template_id = ?1
             ORDER BY tag",
        )?;
        let rows = stmt.query_map(params![template.as_str()], |row| {
            Ok(TemplateTag {
                tag: row.get(0)?,
                build_id: row.get(1)?,
                created_at: row.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Points the tags at the build (moving them from the builds they named).
    pub fn assign_tags(
        &self,
        template: &TemplateName,
        build: &str,
        tags: &[String],
        now: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for tag in tags {
            tx.execute(
                "INSERT OR REPLACE INTO template_tags (template_id, tag, build_id, created_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![template.as_str(), tag, build, now],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Removes the tags from the template, all or none: the ones it does not have are returned
    /// (and then nothing was removed). The builds stay, startable by their ids.
    pub fn remove_tags(
        &self,
        template: &TemplateName,
        tags: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut missing = Vec::new();
        for tag in tags {
            let removed = tx.execute(
                "DELETE FROM template_tags WHERE template_id = ?1 AND tag = ?2",
                params![template.as_str(), tag],
            )?;
            if removed == 0 {
                missing.push(tag.clone());
            }
        }
        if missing.is_empty() {
            tx.commit()?;
        }
        Ok(missing)
    }

    /// The template records that a name or tag reaches (the built-ins', the tagged builds'),
    /// and builds' that are being published: what golden images and pools are kept for. A
    /// build no tag names any more is started by its id only, by booting it.
    pub fn named_templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        let untagged: HashSet<String> = {
            let conn = self.conn();
            let mut stmt = conn.prepare(
                "SELECT id FROM template_builds WHERE status = 'ready'
                   AND id NOT IN (SELECT build_id FROM template_tags)",
            )?;
            let rows = stmt.query_map([], |row| row.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut templates = self.templates()?;
        templates.retain(|t| !untagged.contains(t.name.as_str()));
        Ok(templates)
    }

    /// The ready build of the template that `tag` means: the build the tag names, else the
    /// build whose id it is.
    pub fn build_tagged(
        &self,
        template: &TemplateName,
        tag: &str,
    ) -> Result<Option<String>, StoreError> {
        let conn = self.conn();
        let tagged = conn
            .query_row(
                "SELECT build_id FROM template_tags WHERE template_id = ?1 AND tag = ?2",
                params![template.as_str(), tag],
                |row| row.get(0),
            )
            .optional()?;
        if tagged.is_some() {
            return Ok(tagged);
        }
        Ok(conn
            .query_row(
                "SELECT id FROM template_builds WHERE template_id = ?1 AND id = ?2
                   AND status = 'ready'",
                params![template.as_str(), tag],
                |row| row.get(0),
            )
            .optional()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BuildRecord, BuildStatus, TemplateDefaults, TemplateRecord, UserTemplate};

    fn name(s: &str) -> TemplateName {
        TemplateName::parse(s).unwrap()
    }

    fn template(store: &Store, id: &str, owner: &str, alias: &str) {
        assert!(store
            .insert_user_template(&UserTemplate {
                id: name(id),
                owner: owner.into(),
                alias: name(alias),
                public: false,
                cpu_count: None,
                memory_mb: None,
                created_at: 0,
            })
            .unwrap());
    }

    /// A build of `template` asking for `tags`, recorded as built; ready if `ok`.
    fn build(store: &Store, template: &str, id: &str, tags: &[&str], ok: bool) {
        store
            .insert_build(&BuildRecord {
                id: id.into(),
                template_id: name(template),
                status: BuildStatus::Waiting,
                failure: None,
                created_at: 0,
                finished_at: None,
                tags: tags.iter().map(|t| t.to_string()).collect(),
            })
            .unwrap();
        if ok {
            record(store, id);
        }
        let status = if ok {
            BuildStatus::Ready
        } else {
            BuildStatus::Error
        };
        store.set_build_status(id, status, None, 7).unwrap();
    }

    fn record(store: &Store, as_name: &str) {
        store
            .put_template(&TemplateRecord {
                name: name(as_name),
                content_hash: as_name.into(),
                rootfs: format!("/t/{as_name}").into(),
                built_at: 0,
                size_bytes: 0,
                layers: Vec::new(),
                defaults: TemplateDefaults::default(),
            })
            .unwrap();
    }

    /// The record name `reference` starts for `owner`.
    fn starts(store: &Store, owner: &str, reference: &str) -> Option<String> {
        store
            .visible_template(Some(owner), reference)
            .unwrap()
            .map(|(record, _)| record.name.to_string())
    }

    #[test]
    fn tags_name_ready_builds_and_default_is_what_no_tag_means() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        template(&store, "t1", "k1", "app");
        build(&store, "t1", "b1", &[DEFAULT_TAG], true);
        build(&store, "t1", "b2", &["v2", "stable"], true);
        build(&store, "t1", "b3", &[DEFAULT_TAG, "stable"], false);
        assert_eq!(starts(&store, "k1", "app").as_deref(), Some("b1"));
        assert_eq!(starts(&store, "k1", "app:default").as_deref(), Some("b1"));
        assert_eq!(starts(&store, "k1", "app:stable").as_deref(), Some("b2"));
        assert_eq!(starts(&store, "k1", "t1:v2").as_deref(), Some("b2"));
        // A build's id in place of a tag; a failed build is nothing to start.
        assert_eq!(starts(&store, "k1", "app:b2").as_deref(), Some("b2"));
        assert_eq!(starts(&store, "k1", "app:b3"), None);
        assert_eq!(starts(&store, "k1", "app:nope"), None);
        let named = |store: &Store| -> Vec<String> {
            let named = store.named_templates().unwrap().into_iter();
            named.map(|t| t.name.to_string()).collect()
        };
        assert_eq!(named(&store), ["b1", "b2"]);
        // Another key gets nothing: not by alias, not by id, not by a build's record name.
        for reference in ["app", "app:v2", "t1", "t1:b1", "b1"] {
            assert_eq!(starts(&store, "k2", reference), None, "{reference}");
        }

        store
            .assign_tags(&name("t1"), "b2", &[DEFAULT_TAG.into()], 9)
            .unwrap();
        assert_eq!(starts(&store, "k1", "app").as_deref(), Some("b2"));
        let missing = store
            .remove_tags(&name("t1"), &["stable".into(), "nope".into()])
            .unwrap();
        assert_eq!(missing, ["nope"]);
        assert_eq!(starts(&store, "k1", "app:stable").as_deref(), Some("b2"));
        assert_eq!(named(&store), ["b2"], "no tag names b1 now");
        assert_eq!(starts(&store, "k1", "app:b1").as_deref(), Some("b1"));
        assert!(store
            .remove_tags(&name("t1"), &["stable".into()])
            .unwrap()
            .is_empty());
        let tags: Vec<_> = store
            .tags_of(&name("t1"))
            .unwrap()
            .into_iter()
            .map(|t| (t.tag, t.build_id))
            .collect();
        assert_eq!(
            tags,
            [("default".into(), "b2".into()), ("v2".into(), "b2".into())]
        );

        store.delete_user_template(&name("t1")).unwrap();
        assert!(store.tags_of(&name("t1")).unwrap().is_empty());
        assert!(store.templates().unwrap().is_empty());
    }

    #[test]
    fn a_public_template_is_reached_by_its_namespace_never_by_a_bare_alias() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        template(&store, "ta", "ka", "ready");
        build(&store, "ta", "ba", &[DEFAULT_TAG], true);
        let mut published = store.user_template("ta").unwrap().unwrap();
        published.public = true;
        store.update_user_template(&published).unwrap();
        // The attack: key B names `ready`, a name key A published; B has none of its own.
        assert_eq!(starts(&store, "kb", "ready"), None);
        // B reaches A's public template only by A's namespace, or by its id.
        assert_eq!(starts(&store, "kb", "ka/ready").as_deref(), Some("ba"));
        assert_eq!(starts(&store, "kb", "ta").as_deref(), Some("ba"));
        // B's own `ready` is B's whatever A publishes.
        template(&store, "tb", "kb", "ready");
        build(&store, "tb", "bb", &[DEFAULT_TAG], true);
        assert_eq!(starts(&store, "kb", "ready").as_deref(), Some("bb"));
        assert_eq!(starts(&store, "ka", "ready").as_deref(), Some("ba"));
        // A private template is not reached by its namespace either.
        assert_eq!(starts(&store, "ka", "kb/ready"), None);
        published.public = false;
        store.update_user_template(&published).unwrap();
        assert_eq!(starts(&store, "kb", "ka/ready"), None);
        assert_eq!(starts(&store, "kb", "ta"), None);
    }

    #[test]
    fn a_built_in_has_only_its_default_tag() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        record(&store, "base");
        assert_eq!(starts(&store, "k", "base").as_deref(), Some("base"));
        assert_eq!(starts(&store, "k", "base:default").as_deref(), Some("base"));
        assert_eq!(starts(&store, "k", "base:v1"), None);
    }

    #[tokio::test]
    async fn a_record_under_its_templates_id_moves_to_its_newest_ready_build() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let store = Store::open(&path).unwrap();
            template(&store, "t1", "k1", "app");
            build(&store, "t1", "b1", &[], true);
            build(&store, "t1", "b2", &[], false);
            // As builds were recorded before tags: under the template's id.
            store.conn().execute("DELETE FROM templates", []).unwrap();
            record(&store, "t1");
            template(&store, "t2", "k1", "lost");
            record(&store, "t2"); // its builds were forgotten
            store
                .conn()
                .execute_batch(
                    "DELETE FROM template_tags;
                     INSERT INTO snapshots (owner, id, image, template, rootfs, source_sandbox,
                       created_at) VALUES ('k1', 's', 'img', 't1', '/t/t1', 'x', 0);",
                )
                .unwrap();
        }
        // What opening a database from before versioned migrations does once.
        let store = Store::open(&path).unwrap();
        crate::store::migrations::move_untagged_records(&store.conn()).unwrap();
        assert_eq!(starts(&store, "k1", "app").as_deref(), Some("b1"));
        let lost = starts(&store, "k1", "lost").unwrap();
        assert!(uuid::Uuid::parse_str(&lost).is_ok(), "{lost}");
        let snapshots = store.snapshots().all().await.unwrap();
        assert_eq!(snapshots[0].template, name("b1"));
        let owner = store.template_of_record(&name("b1")).unwrap().unwrap();
        assert_eq!(owner.alias, name("app"));
    }
}
