//! Webhooks (E2B's `/events/webhooks`), each its API key's own: told of the lifecycle events
//! of that key's sandboxes only, and seen or changed by that key only.

use super::db::{Db, Row};
use super::{EventType, StoreError};

#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    /// A UUID.
    pub id: String,
    /// Id of the API key that registered it.
    pub owner: String,
    pub name: String,
    pub url: String,
    pub enabled: bool,
    /// The event types it is told of.
    pub events: Vec<EventType>,
    /// What each delivery is signed with; never shown by the API.
    pub secret: String,
    /// Unix microseconds.
    pub created_at_us: i64,
}

/// What an update changes; `None` keeps what is there.
#[derive(Debug, Clone, Default)]
pub struct WebhookChange {
    pub name: Option<String>,
    pub url: Option<String>,
    pub enabled: Option<bool>,
    pub events: Option<Vec<EventType>>,
    pub secret: Option<String>,
}

const COLUMNS: &str = "id, owner, name, url, enabled, events, secret, created_at_us";

fn events_text(events: &[EventType]) -> String {
    serde_json::Value::from(events.iter().map(|e| e.as_str()).collect::<Vec<_>>()).to_string()
}

fn record(row: &Row) -> Result<Webhook, StoreError> {
    let id: String = row.get(0)?;
    let corrupt = || StoreError::Corrupt(format!("webhook {id}"));
    let names: Vec<String> = serde_json::from_str(&row.get::<String>(5)?).map_err(|_| corrupt())?;
    let events = names
        .iter()
        .map(|n| EventType::parse(n).ok_or_else(corrupt))
        .collect::<Result<_, _>>()?;
    Ok(Webhook {
        owner: row.get(1)?,
        name: row.get(2)?,
        url: row.get(3)?,
        enabled: row.get::<i64>(4)? != 0,
        events,
        secret: row.get(6)?,
        created_at_us: row.get(7)?,
        id,
    })
}

/// The webhooks' table, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct WebhookRecords {
    db: Db,
}

impl WebhookRecords {
    pub fn new(db: Db) -> WebhookRecords {
        WebhookRecords { db }
    }

    /// Keeps `w` unless its key has `most` webhooks already; whether it was kept. Two
    /// gateways registering at once cannot both pass the count ([`Db::admit`]).
    pub async fn put(&self, w: &Webhook, most: u32) -> Result<bool, StoreError> {
        let events = events_text(&w.events);
        let kept = self
            .db
            .admit(
                // Typed: PostgreSQL cannot tell a bare `SELECT $1`'s type.
                &format!(
                    "INSERT INTO webhooks ({COLUMNS})
                     SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS TEXT),
                            CAST($4 AS TEXT), CAST($5 AS BIGINT), CAST($6 AS TEXT),
                            CAST($7 AS TEXT), CAST($8 AS BIGINT)
                     WHERE (SELECT COUNT(*) FROM webhooks WHERE owner = CAST($2 AS TEXT))
                             < CAST($9 AS BIGINT)"
                ),
                &[
                    w.id.as_str().into(),
                    w.owner.as_str().into(),
                    w.name.as_str().into(),
                    w.url.as_str().into(),
                    w.enabled.into(),
                    events.as_str().into(),
                    w.secret.as_str().into(),
                    w.created_at_us.into(),
                    i64::from(most).into(),
                ],
            )
            .await?;
        Ok(kept == 1)
    }

    /// `owner`'s webhooks, oldest first.
    pub async fn list(&self, owner: &str) -> Result<Vec<Webhook>, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM webhooks WHERE owner = $1 ORDER BY created_at_us, id");
        self.db.query(&sql, &[owner.into()], record).await
    }

    /// `owner`'s webhook `id`; another key's is none.
    pub async fn get(&self, owner: &str, id: &str) -> Result<Option<Webhook>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM webhooks WHERE owner = $1 AND id = $2");
        self.db
            .query_opt(&sql, &[owner.into(), id.into()], record)
            .await
    }

    /// Changes `owner`'s webhook `id` as `change` says; returns it as it is now, or none if
    /// the key has no such webhook.
    pub async fn update(
        &self,
        owner: &str,
        id: &str,
        change: &WebhookChange,
    ) -> Result<Option<Webhook>, StoreError> {
        let events = change.events.as_deref().map(events_text);
        let changed = self
            .db
            .execute(
                "UPDATE webhooks SET name = COALESCE($3, name), url = COALESCE($4, url),
                   enabled = COALESCE($5, enabled), events = COALESCE($6, events),
                   secret = COALESCE($7, secret)
                 WHERE owner = $1 AND id = $2",
                &[
                    owner.into(),
                    id.into(),
                    change.name.as_deref().into(),
                    change.url.as_deref().into(),
                    change.enabled.into(),
                    events.as_deref().into(),
                    change.secret.as_deref().into(),
                ],
            )
            .await?;
        match changed {
            0 => Ok(None),
            _ => self.get(owner, id).await,
        }
    }

    /// Forgets `owner`'s webhook `id`; whether the key had it.
    pub async fn delete(&self, owner: &str, id: &str) -> Result<bool, StoreError> {
        let n = self
            .db
            .execute(
                "DELETE FROM webhooks WHERE owner = $1 AND id = $2",
                &[owner.into(), id.into()],
            )
            .await?;
        Ok(n > 0)
    }

    /// `owner`'s enabled webhooks that want events of type `kind`.
    pub async fn wanting(&self, owner: &str, kind: EventType) -> Result<Vec<Webhook>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM webhooks WHERE owner = $1 AND enabled = 1
             ORDER BY created_at_us, id"
        );
        let all = self.db.query(&sql, &[owner.into()], record).await?;
        Ok(all
            .into_iter()
            .filter(|w| w.events.contains(&kind))
            .collect())
    }
}

/// What both backends must do alike; run on SQLite below and on PostgreSQL by
/// `store::postgres_tests`.
#[cfg(test)]
pub(crate) async fn behaves(hooks: &WebhookRecords) {
    let hook = |n: i64, owner: &str, events: &[EventType]| Webhook {
        id: format!("00000000-0000-0000-0000-{n:012}"),
        owner: owner.into(),
        name: format!("hook {n}"),
        url: format!("https://example.com/{n}"),
        enabled: true,
        events: events.to_vec(),
        secret: format!("secret-{n}"),
        created_at_us: 1_000 + n,
    };
    let a = hook(1, "k1", &[EventType::Created, EventType::Killed]);
    let b = hook(2, "k1", &[EventType::Paused]);
    let theirs = hook(3, "k2", &EventType::ALL);
    for w in [&a, &b, &theirs] {
        assert!(hooks.put(w, 2).await.unwrap());
    }
    // A key at its most keeps no more; another key is not counted.
    assert!(!hooks
        .put(&hook(4, "k1", &[EventType::Paused]), 2)
        .await
        .unwrap());

    // Read back as written, the key's own only.
    assert_eq!(hooks.list("k1").await.unwrap(), [a.clone(), b.clone()]);
    assert_eq!(hooks.get("k1", &a.id).await.unwrap(), Some(a.clone()));
    assert_eq!(hooks.get("k1", &theirs.id).await.unwrap(), None);
    assert!(hooks.list("k3").await.unwrap().is_empty());

    // Those that want an event: enabled, of the key, of the type.
    let ids = |got: Vec<Webhook>| got.into_iter().map(|w| w.name).collect::<Vec<_>>();
    assert_eq!(
        ids(hooks.wanting("k1", EventType::Killed).await.unwrap()),
        ["hook 1"]
    );
    assert!(hooks
        .wanting("k1", EventType::Resumed)
        .await
        .unwrap()
        .is_empty());

    // An update changes what it names; another key's is not found and stays.
    let off = WebhookChange {
        enabled: Some(false),
        events: Some(vec![EventType::Resumed]),
        ..WebhookChange::default()
    };
    let changed = hooks.update("k1", &a.id, &off).await.unwrap().unwrap();
    assert_eq!(
        changed,
        Webhook {
            enabled: false,
            events: vec![EventType::Resumed],
            ..a.clone()
        }
    );
    assert!(hooks
        .wanting("k1", EventType::Killed)
        .await
        .unwrap()
        .is_empty());
    assert!(hooks
        .wanting("k1", EventType::Resumed)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(hooks.update("k1", &theirs.id, &off).await.unwrap(), None);
    assert_eq!(
        hooks.get("k2", &theirs.id).await.unwrap(),
        Some(theirs.clone())
    );

    // A delete is the key's own too.
    assert!(!hooks.delete("k1", &theirs.id).await.unwrap());
    assert!(hooks.delete("k1", &a.id).await.unwrap());
    assert!(!hooks.delete("k1", &a.id).await.unwrap());
    assert_eq!(hooks.list("k1").await.unwrap(), [b]);
    assert_eq!(hooks.list("k2").await.unwrap(), [theirs]);
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn webhooks_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        super::behaves(store.webhooks()).await;
    }
}
