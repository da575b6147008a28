//! Lifecycle events: each verb that succeeds records one, in order, for the sandbox's owner.

use super::*;
use crate::store::{EventQuery, EventType};

#[tokio::test]
async fn each_verb_records_its_event_in_order_for_the_owner() {
    let driver = Arc::new(RecordingDriver::default());
    let (_dir, store, lc) = setup(driver, Limits::default()).await;
    let mut feed = lc.webhook_feed().unwrap();
    assert!(lc.webhook_feed().is_none(), "one reader only");
    tokio::spawn(lc.run_events());
    let sbx = lc.create(params()).await.unwrap();
    let id = sbx.id().to_string();
    lc.set_timeout(&id, Duration::from_secs(60)).await.unwrap();
    lc.pause(&id, PauseMode::Full, false).await.unwrap();
    // A verb that fails records nothing.
    assert!(lc.pause(&id, PauseMode::Full, false).await.is_err());
    lc.resume(&id, None, PauseMode::Full).await.unwrap();
    lc.set_network(&id, Egress::default(), Some(true))
        .await
        .unwrap();
    lc.snapshot(&id, Some("snap")).await.unwrap();
    lc.kill(&id).await.unwrap();
    // Without an owner, no key could read them: none are kept.
    let unowned = lc
        .create(CreateParams {
            owner: None,
            ..params()
        })
        .await
        .unwrap();
    lc.kill(unowned.id().as_str()).await.unwrap();
    lc.flush_events().await;

    let all = EventQuery {
        oldest_first: true,
        limit: 100,
        ..EventQuery::default()
    };
    let events = store.events().list("k1", &all).await.unwrap();
    let kinds: Vec<EventType> = events.iter().map(|e| e.kind).collect();
    use EventType::*;
    assert_eq!(
        kinds,
        [
            Created,
            Updated,
            Paused,
            Resumed,
            Updated,
            Checkpointed,
            Killed
        ]
    );
    assert!(events
        .iter()
        .all(|e| e.sandbox_id == id && e.build_id == "base"));
    assert!(events.windows(2).all(|w| w[0].at_us < w[1].at_us));
    let timeout = events[1].data.as_ref().unwrap();
    assert!(timeout["set_timeout"].as_str().unwrap().ends_with('Z'));
    let network = &events[4].data.as_ref().unwrap()["set_network"];
    assert_eq!(network["allowPublicTraffic"], false);
    assert!(store.events().list("", &all).await.unwrap().is_empty());

    // The webhooks' feed has each written event, in order.
    let mut fed = Vec::new();
    while let Ok(e) = feed.try_recv() {
        fed.push(e);
    }
    assert_eq!(fed, events);
}
