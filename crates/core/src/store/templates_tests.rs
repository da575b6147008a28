//! What the templates' records must do, on SQLite here and on PostgreSQL in
//! `postgres_tests.rs`: the same checks on both.

use super::{
    BuildRecord, BuildStatus, LogEntry, LogLevel, Store, TemplateDefaults, TemplateRecord,
    Templates, UserTemplate, DEFAULT_TAG,
};
use crate::ids::TemplateName;

fn name(s: &str) -> TemplateName {
    TemplateName::parse(s).unwrap()
}

async fn template(t: &Templates, id: &str, owner: &str, alias: &str) {
    let made = UserTemplate {
        id: name(id),
        owner: owner.into(),
        alias: name(alias),
        public: false,
        cpu_count: Some(2),
        memory_mb: None,
        created_at: 0,
    };
    assert!(t.insert_user_template(&made).await.unwrap());
}

/// A build of `template` asking for `tags`, made at `at` with one log line; ready (and
/// recorded) if `ok`.
async fn build(t: &Templates, template: &str, id: &str, tags: &[&str], ok: bool, at: i64) {
    t.insert_build(&BuildRecord {
        id: id.into(),
        template_id: name(template),
        status: BuildStatus::Waiting,
        failure: None,
        created_at: at,
        finished_at: None,
        tags: tags.iter().map(|t| t.to_string()).collect(),
    })
    .await
    .unwrap();
    let line = LogEntry {
        at_ms: at,
        level: LogLevel::Info,
        step: Some("1".into()),
        message: id.into(),
    };
    t.append_build_log(id, &line).await.unwrap();
    let (status, failure) = if ok {
        record(t, id).await;
        (BuildStatus::Ready, None)
    } else {
        (BuildStatus::Error, Some(("it broke", Some("2"))))
    };
    t.set_build_status(id, status, failure, at).await.unwrap();
}

async fn record(t: &Templates, as_name: &str) {
    let rootfs = format!("/t/{as_name}").into();
    t.put(&TemplateRecord::bare(as_name, as_name, rootfs))
        .await
        .unwrap();
}

/// The record name `reference` starts for `owner`.
async fn starts(t: &Templates, owner: &str, reference: &str) -> Option<String> {
    let found = t.visible_template(Some(owner), reference).await.unwrap();
    found.map(|(record, _)| record.name.to_string())
}

/// The named records among `of`.
async fn named(t: &Templates, of: &[&str]) -> Vec<String> {
    let named = t.named_templates().await.unwrap().into_iter();
    let names = named.map(|t| t.name.to_string());
    names.filter(|n| of.contains(&n.as_str())).collect()
}

pub(crate) async fn behaves(t: &Templates) {
    records_round_trip(t).await;
    tags_name_ready_builds_and_default_is_what_no_tag_means(t).await;
    a_public_template_is_reached_by_its_namespace_never_by_a_bare_alias(t).await;
    only_each_templates_newest_and_tagged_builds_are_kept(t).await;
}

async fn records_round_trip(t: &Templates) {
    let base = TemplateRecord {
        name: name("base"),
        content_hash: "abc".into(),
        rootfs: "/x/rootfs".into(),
        built_at: 5,
        size_bytes: 7,
        layers: vec!["/x/rootfs".into(), "/layers/1".into()],
        defaults: TemplateDefaults {
            user: "root".into(),
            workdir: Some("/app".into()),
            env: [("A".to_owned(), "1".to_owned())].into(),
            start_cmd: Some("python -m http.server".into()),
            ready_cmd: None,
        },
    };
    t.put(&base).await.unwrap();
    assert_eq!(t.get(&base.name).await.unwrap(), Some(base.clone()));
    let rebuilt = TemplateRecord {
        content_hash: "def".into(),
        ..base
    };
    t.put(&rebuilt).await.unwrap();
    assert_eq!(t.all().await.unwrap(), [rebuilt], "in place of the old one");
    // A built-in has its one tag, `default`.
    assert_eq!(starts(t, "k", "base").await.as_deref(), Some("base"));
    assert_eq!(
        starts(t, "k", "base:default").await.as_deref(),
        Some("base")
    );
    assert_eq!(starts(t, "k", "base:v1").await, None);
}

async fn tags_name_ready_builds_and_default_is_what_no_tag_means(t: &Templates) {
    template(t, "t1", "k1", "app").await;
    assert!(
        !t.insert_user_template(&UserTemplate {
            id: name("t9"),
            ..t.user_template("t1").await.unwrap().unwrap()
        })
        .await
        .unwrap(),
        "one alias per key"
    );
    build(t, "t1", "b1", &[DEFAULT_TAG], true, 1).await;
    build(t, "t1", "b2", &["v2", "stable"], true, 1).await;
    build(t, "t1", "b3", &[DEFAULT_TAG, "stable"], false, 1).await;
    let b3 = t.build("b3").await.unwrap().unwrap();
    assert_eq!(b3.failure, Some(("it broke".into(), Some("2".into()))));
    assert_eq!(b3.finished_at, Some(1));
    let order: Vec<_> = t.builds_of(&name("t1")).await.unwrap();
    let order: Vec<_> = order.into_iter().map(|b| b.id).collect();
    assert_eq!(
        order,
        ["b3", "b2", "b1"],
        "newest first, in the same second too"
    );
    for (reference, record) in [
        ("app", Some("b1")),
        ("app:default", Some("b1")),
        ("app:stable", Some("b2")),
        ("t1:v2", Some("b2")),
        // A build's id in place of a tag; a failed build is nothing to start.
        ("app:b2", Some("b2")),
        ("app:b3", None),
        ("app:nope", None),
    ] {
        assert_eq!(
            starts(t, "k1", reference).await.as_deref(),
            record,
            "{reference}"
        );
    }
    assert_eq!(named(t, &["b1", "b2", "b3"]).await, ["b1", "b2"]);
    // Another key gets nothing: not by alias, not by id, not by a build's record name.
    for reference in ["app", "app:v2", "t1", "t1:b1", "b1"] {
        assert_eq!(starts(t, "k2", reference).await, None, "{reference}");
    }

    t.assign_tags(&name("t1"), "b2", &[DEFAULT_TAG.into()], 9)
        .await
        .unwrap();
    assert_eq!(starts(t, "k1", "app").await.as_deref(), Some("b2"));
    // All or none: `stable` stays, since `nope` is not there.
    let missing = t
        .remove_tags(&name("t1"), &["stable".into(), "nope".into()])
        .await;
    assert_eq!(missing.unwrap(), ["nope"]);
    assert_eq!(starts(t, "k1", "app:stable").await.as_deref(), Some("b2"));
    assert_eq!(named(t, &["b1", "b2"]).await, ["b2"], "no tag names b1 now");
    assert_eq!(starts(t, "k1", "app:b1").await.as_deref(), Some("b1"));
    let missing = t.remove_tags(&name("t1"), &["stable".into()]).await;
    assert!(missing.unwrap().is_empty());
    let tags = t.tags_of(&name("t1")).await.unwrap().into_iter();
    let tags: Vec<_> = tags.map(|t| (t.tag, t.build_id)).collect();
    assert_eq!(
        tags,
        [("default".into(), "b2".into()), ("v2".into(), "b2".into())]
    );
    let owner = t.template_of_record(&name("b2")).await.unwrap().unwrap();
    assert_eq!((owner.alias, owner.cpu_count), (name("app"), Some(2)));
    assert_eq!(t.build_logs("b2", 0, 10).await.unwrap()[0].message, "b2");

    t.delete_user_template(&name("t1")).await.unwrap();
    assert!(t.tags_of(&name("t1")).await.unwrap().is_empty());
    assert!(t.builds_of(&name("t1")).await.unwrap().is_empty());
    assert!(t.build_logs("b2", 0, 10).await.unwrap().is_empty());
    assert_eq!(t.get(&name("b2")).await.unwrap(), None);
    assert_eq!(t.user_template("t1").await.unwrap(), None);
}

async fn a_public_template_is_reached_by_its_namespace_never_by_a_bare_alias(t: &Templates) {
    template(t, "ta", "ka", "ready").await;
    build(t, "ta", "ba", &[DEFAULT_TAG], true, 1).await;
    let mut published = t.user_template("ta").await.unwrap().unwrap();
    published.public = true;
    t.update_user_template(&published).await.unwrap();
    // The attack: key B names `ready`, a name key A published; B has none of its own.
    assert_eq!(starts(t, "kb", "ready").await, None);
    // B reaches A's public template only by A's namespace, or by its id.
    assert_eq!(starts(t, "kb", "ka/ready").await.as_deref(), Some("ba"));
    assert_eq!(starts(t, "kb", "ta").await.as_deref(), Some("ba"));
    // B's own `ready` is B's whatever A publishes.
    template(t, "tb", "kb", "ready").await;
    build(t, "tb", "bb", &[DEFAULT_TAG], true, 1).await;
    assert_eq!(starts(t, "kb", "ready").await.as_deref(), Some("bb"));
    assert_eq!(starts(t, "ka", "ready").await.as_deref(), Some("ba"));
    // A private template is not reached by its namespace either.
    assert_eq!(starts(t, "ka", "kb/ready").await, None);
    published.public = false;
    t.update_user_template(&published).await.unwrap();
    assert_eq!(starts(t, "kb", "ka/ready").await, None);
    assert_eq!(starts(t, "kb", "ta").await, None);
    let of_kb = t.user_templates_of("kb").await.unwrap();
    assert_eq!(
        of_kb.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["tb"]
    );
}

async fn only_each_templates_newest_and_tagged_builds_are_kept(t: &Templates) {
    for at in 1..=4 {
        build(t, "pa", &format!("pa{at}"), &[], true, at).await;
    }
    build(t, "pb", "pb1", &[], true, 1).await;
    t.assign_tags(&name("pa"), "pa2", &["v1".into()], 5)
        .await
        .unwrap();
    t.prune_builds(2).await.unwrap();
    let ids = |template: &'static str| async move {
        let builds = t.builds_of(&name(template)).await.unwrap().into_iter();
        builds.map(|b| b.id).collect::<Vec<_>>()
    };
    assert_eq!(ids("pa").await, ["pa4", "pa3", "pa2"]);
    assert_eq!(ids("pb").await, ["pb1"]);
    assert_eq!(
        t.get(&name("pa1")).await.unwrap(),
        None,
        "its record went too"
    );
    assert!(t.build_logs("pa1", 0, 10).await.unwrap().is_empty());
    assert_eq!(t.build_logs("pa4", 0, 10).await.unwrap().len(), 1);
    t.prune_builds_of(&name("pa"), 1).await.unwrap();
    assert_eq!(ids("pa").await, ["pa4", "pa2"], "the tagged one stays");
    t.set_build_status("pb1", BuildStatus::Building, None, 6)
        .await
        .unwrap();
    assert_eq!(t.unfinished_builds().await.unwrap(), ["pb1"]);
    let counts = t.build_counts().await.unwrap();
    let count = |status| counts.iter().find(|(s, _)| *s == status).map(|c| c.1);
    assert_eq!(count(BuildStatus::Building), Some(1));

    t.record_layer("/l/1".as_ref(), "ka", 10).await.unwrap();
    t.record_layer("/l/1".as_ref(), "kb", 20).await.unwrap();
    t.record_layer("/l/2".as_ref(), "kb", 5_000_000_000)
        .await
        .unwrap();
    assert_eq!(t.layers_of("ka").await.unwrap(), [("/l/1".into(), 10)]);
    t.forget_layer("/l/1".as_ref()).await.unwrap();
    assert!(t.layers_of("ka").await.unwrap().is_empty());
    assert_eq!(
        t.layers_of("kb").await.unwrap(),
        [("/l/2".into(), 5_000_000_000)]
    );
}

#[tokio::test]
async fn templates_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    behaves(store.templates()).await;
}

/// Databases from before tags recorded a build under its template's id; opening one moves
/// the record to the template's newest ready build.
#[tokio::test]
async fn a_record_under_its_templates_id_moves_to_its_newest_ready_build() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let store = Store::open(&path).unwrap();
        let t = store.templates();
        template(t, "t1", "k1", "app").await;
        build(t, "t1", "b1", &[], true, 1).await;
        build(t, "t1", "b2", &[], false, 1).await;
        // As builds were recorded before tags: under the template's id.
        store.conn().execute("DELETE FROM templates", []).unwrap();
        record(t, "t1").await;
        template(t, "t2", "k1", "lost").await;
        record(t, "t2").await; // its builds were forgotten
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
    super::migrations::move_untagged_records(&store.conn()).unwrap();
    let t = store.templates();
    assert_eq!(starts(t, "k1", "app").await.as_deref(), Some("b1"));
    let lost = starts(t, "k1", "lost").await.unwrap();
    assert!(uuid::Uuid::parse_str(&lost).is_ok(), "{lost}");
    let snapshots = store.snapshots().all().await.unwrap();
    assert_eq!(snapshots[0].template, name("b1"));
    let owner = t.template_of_record(&name("b1")).await.unwrap().unwrap();
    assert_eq!(owner.alias, name("app"));
}
