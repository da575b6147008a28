//! What the sandbox catalog must do, on SQLite here and on PostgreSQL in `postgres_tests.rs`:
//! the same checks on both.

use super::{PauseMode, SandboxRecord, SandboxRecords, SandboxState, VolumeMount};
use crate::driver::Resources;
use crate::egress::Egress;
use crate::ids::{SandboxId, TemplateName};
use std::collections::BTreeMap;

/// What the sandbox catalog must do.
pub(crate) async fn behaves(sandboxes: &SandboxRecords) {
    const ROOMY: usize = 100;
    // Admitted, a sandbox is in no list and answers to no id until it has started.
    assert!(sandboxes.admit(&starting("a1"), ROOMY).await.unwrap());
    let a1 = SandboxId::parse("a1").unwrap();
    assert!(sandboxes.all().await.unwrap().is_empty());
    assert_eq!(sandboxes.get(&a1).await.unwrap(), None);
    sandboxes
        .started(&a1, 0, "/t/rootfs".as_ref())
        .await
        .unwrap();
    assert_eq!(sandboxes.get(&a1).await.unwrap(), Some(record("a1", 0)));

    // A slot is its node's own.
    assert!(sandboxes.admit(&starting("b2"), ROOMY).await.unwrap());
    let b2 = SandboxId::parse("b2").unwrap();
    assert!(
        sandboxes
            .started(&b2, 0, "/t/rootfs".as_ref())
            .await
            .is_err(),
        "slot reuse on one node must fail"
    );
    sandboxes
        .started(&b2, 1, "/t/rootfs".as_ref())
        .await
        .unwrap();
    let mut elsewhere = record("c3", 0);
    elsewhere.node = "n2".into();
    start(sandboxes, &elsewhere).await;

    assert!(sandboxes.set_end_at(&a1, 99).await.unwrap());
    assert!(!sandboxes
        .set_end_at(&SandboxId::parse("zz").unwrap(), 99)
        .await
        .unwrap());
    let all = sandboxes.all().await.unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].end_at, 99);
    assert_eq!(all[1], record("b2", 1));
    assert_eq!(sandboxes.of_node("n2").await.unwrap(), [elsewhere.clone()]);
    assert_eq!(sandboxes.of_owner("k1").await.unwrap().len(), 3);
    assert!(sandboxes.of_owner("k2").await.unwrap().is_empty());
    let open = Egress::from_request(Some(true), &[], &[]).unwrap();
    sandboxes.set_network(&a1, &open, false).await.unwrap();
    let a = sandboxes.get(&a1).await.unwrap().unwrap();
    assert_eq!((a.egress, a.require_traffic_token), (open, false));

    // Quotas count every node's sandboxes of the key: three run now, and one starting counts.
    assert!(!sandboxes.admit(&starting("d4"), 3).await.unwrap());
    assert!(sandboxes.admit(&starting("d4"), 4).await.unwrap());
    assert!(!sandboxes.admit(&starting("e5"), 4).await.unwrap());
    let mut other_key = starting("f6");
    other_key.owner = Some("k2".into());
    assert!(
        sandboxes.admit(&other_key, 1).await.unwrap(),
        "k2 runs none"
    );

    // A pausing sandbox counts as paused, a resuming one as running.
    assert!(!sandboxes.begin_pause(&a1, 0).await.unwrap());
    assert!(sandboxes.begin_pause(&a1, 1).await.unwrap());
    assert!(!sandboxes.begin_pause(&b2, 1).await.unwrap());
    let paused = SandboxState::Paused;
    let mode = Some(PauseMode::Filesystem);
    sandboxes
        .set_state(&a1, paused, None, 0, mode)
        .await
        .unwrap();
    // b2, c3 and d4 (starting) run.
    assert!(!sandboxes.begin_resume(&a1, 3).await.unwrap());
    assert!(sandboxes.begin_resume(&a1, 4).await.unwrap());
    assert!(!sandboxes.admit(&starting("e5"), 4).await.unwrap());
    sandboxes.end_transition(&a1).await.unwrap();
    assert!(sandboxes.admit(&starting("e5"), 5).await.unwrap());
    let a = sandboxes.get(&a1).await.unwrap().unwrap();
    assert_eq!((a.state, a.slot, a.pause_mode), (paused, None, mode));

    // One verb at a time: a second resume cannot begin while one is under way, nor can the
    // sandbox move to another node; once it is done, it moves once, to the first that asks.
    assert!(sandboxes.begin_resume(&a1, ROOMY).await.unwrap());
    assert!(!sandboxes.begin_resume(&a1, ROOMY).await.unwrap());
    assert!(!sandboxes.move_paused(&a1, "n1", "n2").await.unwrap());
    sandboxes.end_transition(&a1).await.unwrap();
    assert!(sandboxes.move_paused(&a1, "n1", "n2").await.unwrap());
    assert!(!sandboxes.move_paused(&a1, "n1", "n3").await.unwrap());
    sandboxes.set_auto_resume(&a1).await.unwrap();
    let a = sandboxes.get(&a1).await.unwrap().unwrap();
    assert_eq!((a.node.as_str(), a.auto_resume), ("n2", true));
    assert!(sandboxes.move_paused(&a1, "n2", "n1").await.unwrap());

    // A node's restart forgets its unfinished creates and takes the rows without a node.
    let mut legacy = record("g7", 4);
    legacy.node = String::new();
    start(sandboxes, &legacy).await;
    sandboxes.recover_node("n1").await.unwrap();
    let ids = |records: Vec<SandboxRecord>| -> Vec<String> {
        records.into_iter().map(|r| r.id.to_string()).collect()
    };
    assert_eq!(
        ids(sandboxes.of_node("n1").await.unwrap()),
        ["a1", "b2", "g7"]
    );
    assert!(
        sandboxes.admit(&starting("d4"), 4).await.unwrap(),
        "d4 was forgotten"
    );

    // A killed sandbox is seen until its cleanup is done, and counts in no quota; users no
    // longer see it.
    assert!(sandboxes.alive(&b2).await.unwrap().is_some());
    sandboxes.stopping(&b2).await.unwrap();
    assert!(sandboxes.get(&b2).await.unwrap().is_some());
    assert!(sandboxes.alive(&b2).await.unwrap().is_none());
    assert!(!ids(sandboxes.of_owner("k1").await.unwrap()).contains(&"b2".to_owned()));
    assert!(
        sandboxes.admit(&starting("e5"), 4).await.unwrap(),
        "b2 no longer counts"
    );
    sandboxes.delete(&a1).await.unwrap();
    assert_eq!(sandboxes.get(&a1).await.unwrap(), None);
    sandboxes.recover_node("n1").await.unwrap();
    assert_eq!(ids(sandboxes.of_node("n1").await.unwrap()), ["g7"]);

    // A running sandbox of a node that is gone is given up once, and only there.
    assert!(!sandboxes.stop_lost(&elsewhere.id, "n1").await.unwrap());
    assert!(sandboxes.stop_lost(&elsewhere.id, "n2").await.unwrap());
    assert!(!sandboxes.stop_lost(&elsewhere.id, "n2").await.unwrap());
    assert!(sandboxes.alive(&elsewhere.id).await.unwrap().is_none());

    // Concurrent admissions against a quota of 3 for a new key admit exactly 3.
    let racing = (0..16).map(|i| {
        let mut r = starting(&format!("r{i}"));
        r.owner = Some("k3".into());
        async move { sandboxes.admit(&r, 3).await.unwrap() }
    });
    let admitted = futures::future::join_all(racing).await;
    assert_eq!(admitted.iter().filter(|a| **a).count(), 3);

    // Running sandboxes of a node that no longer answers are given up once their timeout
    // passed (end_at 20 here), unless a verb is under way on them; those of answering nodes
    // are their nodes' to end.
    let lost = |id: &str, node: &str, slot: u32, end_at: i64| SandboxRecord {
        node: node.into(),
        end_at,
        owner: Some("k4".into()),
        ..record(id, slot)
    };
    let (expired, in_time, pausing) = (
        lost("l1", "gone", 10, 20),
        lost("l2", "gone", 11, 1000),
        lost("l3", "gone", 12, 20),
    );
    let answering = lost("l4", "n1", 20, 20);
    for r in [&expired, &in_time, &pausing, &answering] {
        start(sandboxes, r).await;
    }
    assert!(sandboxes.begin_pause(&pausing.id, ROOMY).await.unwrap());
    let n1 = ["n1".to_owned()];
    assert_eq!(
        sandboxes
            .stop_lost_past_timeout(&n1, 20)
            .await
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        ids(sandboxes.stop_lost_past_timeout(&n1, 21).await.unwrap()),
        ["l1"]
    );
    assert_eq!(
        ids(sandboxes.of_owner("k4").await.unwrap()),
        ["l2", "l3", "l4"]
    );
    assert_eq!(
        sandboxes
            .stop_lost_past_timeout(&n1, 21)
            .await
            .unwrap()
            .len(),
        0
    );
    // With no node answering, every node's expired ones go: l4, and g7 of before.
    let mut marked = ids(sandboxes.stop_lost_past_timeout(&[], 21).await.unwrap());
    marked.sort();
    assert_eq!(marked, ["g7", "l4"]);
    assert_eq!(ids(sandboxes.of_owner("k4").await.unwrap()), ["l2", "l3"]);
}

fn record(id: &str, slot: u32) -> SandboxRecord {
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
        node: "n1".into(),
    }
}

/// `record(id, _)` as a create admits it: before it has a slot.
fn starting(id: &str) -> SandboxRecord {
    SandboxRecord {
        slot: None,
        ..record(id, 0)
    }
}

/// Admits `r` with room to spare and lists it as running.
async fn start(sandboxes: &SandboxRecords, r: &SandboxRecord) {
    let admitted = SandboxRecord {
        slot: None,
        ..r.clone()
    };
    assert!(sandboxes.admit(&admitted, usize::MAX).await.unwrap());
    let slot = r.slot.expect("a running record has a slot");
    sandboxes.started(&r.id, slot, &r.rootfs).await.unwrap();
}

#[tokio::test]
async fn sandboxes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::Store::open(&dir.path().join("db")).unwrap();
    behaves(store.sandboxes()).await;
}
