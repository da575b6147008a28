//! Sandboxes' lifecycle events (E2B's `sandbox.lifecycle.*`), each its API key's own. They
//! outlive their sandbox: a killed sandbox's events are read after its kill.

use super::db::{Db, Row, Value};
use super::SandboxRecord;
use super::StoreError;

/// How long events are kept (E2B's retention).
pub const EVENT_RETENTION_US: i64 = 7 * 24 * 3600 * 1_000_000;

/// What happened to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Created,
    Paused,
    Resumed,
    /// Its timeout or its network settings changed.
    Updated,
    /// A snapshot was taken of it (E2B's name for a snapshot's event).
    Checkpointed,
    Killed,
}

impl EventType {
    pub const ALL: [EventType; 6] = [
        EventType::Created,
        EventType::Paused,
        EventType::Resumed,
        EventType::Updated,
        EventType::Checkpointed,
        EventType::Killed,
    ];

    /// E2B's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Created => "sandbox.lifecycle.created",
            EventType::Paused => "sandbox.lifecycle.paused",
            EventType::Resumed => "sandbox.lifecycle.resumed",
            EventType::Updated => "sandbox.lifecycle.updated",
            EventType::Checkpointed => "sandbox.lifecycle.checkpointed",
            EventType::Killed => "sandbox.lifecycle.killed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxEvent {
    /// A UUID.
    pub id: String,
    /// Id of the API key that owns the sandbox.
    pub owner: String,
    pub sandbox_id: String,
    pub kind: EventType,
    /// Unix microseconds; one server's events never tie.
    pub at_us: i64,
    /// The template build (or built-in, or snapshot) the sandbox runs.
    pub build_id: String,
    /// Details (the new deadline of an update, say), as E2B's `eventData`.
    pub data: Option<serde_json::Value>,
}

impl SandboxEvent {
    /// Event `kind` of sandbox `r` at `at_us` (Unix microseconds). A sandbox without an owner
    /// has no events: no key could read them.
    pub fn of(
        r: &SandboxRecord,
        kind: EventType,
        at_us: i64,
        data: Option<serde_json::Value>,
    ) -> Option<SandboxEvent> {
        Some(SandboxEvent {
            id: uuid::Uuid::new_v4().to_string(),
            owner: r.owner.clone()?,
            sandbox_id: r.id.to_string(),
            kind,
            at_us,
            build_id: r.template.to_string(),
            data,
        })
    }
}

/// Which of a key's events a read wants.
#[derive(Debug, Clone, Default)]
pub struct EventQuery<'a> {
    /// One sandbox's, or all of the key's.
    pub sandbox_id: Option<&'a str>,
    /// Any of these types; empty for all.
    pub types: &'a [EventType],
    /// None older than this (Unix microseconds).
    pub since_us: i64,
    pub oldest_first: bool,
    pub offset: u64,
    pub limit: u64,
}

const COLUMNS: &str = "id, owner, sandbox_id, type, at_us, build_id, data";

fn record(row: &Row) -> Result<SandboxEvent, StoreError> {
    let id: String = row.get(0)?;
    let corrupt = || StoreError::Corrupt(format!("event {id}"));
    let data: Option<String> = row.get(6)?;
    Ok(SandboxEvent {
        owner: row.get(1)?,
        sandbox_id: row.get(2)?,
        kind: EventType::parse(&row.get::<String>(3)?).ok_or_else(corrupt)?,
        at_us: row.get(4)?,
        build_id: row.get(5)?,
        data: data
            .map(|d| serde_json::from_str(&d))
            .transpose()
            .map_err(|_| corrupt())?,
        id,
    })
}

/// The events' table, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct EventRecords {
    db: Db,
}

impl EventRecords {
    pub fn new(db: Db) -> EventRecords {
        EventRecords { db }
    }

    pub async fn put(&self, e: &SandboxEvent) -> Result<(), StoreError> {
        let data = e.data.as_ref().map(ToString::to_string);
        self.db
            .execute(
                &format!(
                    "INSERT INTO sandbox_events ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"
                ),
                &[
                    e.id.as_str().into(),
                    e.owner.as_str().into(),
                    e.sandbox_id.as_str().into(),
                    e.kind.as_str().into(),
                    e.at_us.into(),
                    e.build_id.as_str().into(),
                    data.as_deref().into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// `owner`'s events that `q` asks for, in time order (then by id).
    pub async fn list(
        &self,
        owner: &str,
        q: &EventQuery<'_>,
    ) -> Result<Vec<SandboxEvent>, StoreError> {
        let mut params: Vec<Value> = vec![owner.into(), q.since_us.into()];
        let mut sql =
            format!("SELECT {COLUMNS} FROM sandbox_events WHERE owner = $1 AND at_us >= $2");
        if let Some(sandbox) = q.sandbox_id {
            params.push(sandbox.into());
            sql += &format!(" AND sandbox_id = ${}", params.len());
        }
        if !q.types.is_empty() {
            let first = params.len() + 1;
            params.extend(q.types.iter().map(|t| Value::from(t.as_str())));
            let places: Vec<String> = (first..=params.len()).map(|n| format!("${n}")).collect();
            sql += &format!(" AND type IN ({})", places.join(", "));
        }
        let order = if q.oldest_first { "ASC" } else { "DESC" };
        params.push(clamp(q.limit).into());
        params.push(clamp(q.offset).into());
        sql += &format!(
            " ORDER BY at_us {order}, id {order} LIMIT ${} OFFSET ${}",
            params.len() - 1,
            params.len()
        );
        self.db.query(&sql, &params, record).await
    }

    /// Forgets the events older than `at_us`; returns how many.
    pub async fn forget_before(&self, at_us: i64) -> Result<u64, StoreError> {
        self.db
            .execute(
                "DELETE FROM sandbox_events WHERE at_us < $1",
                &[at_us.into()],
            )
            .await
    }
}

fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

/// What both backends must do alike; run on SQLite below and on PostgreSQL by
/// `store::postgres_tests`.
#[cfg(test)]
pub(crate) async fn behaves(events: &EventRecords) {
    let event = |n: i64, owner: &str, sandbox: &str, kind: EventType| SandboxEvent {
        id: format!("00000000-0000-0000-0000-{n:012}"),
        owner: owner.into(),
        sandbox_id: sandbox.into(),
        kind,
        at_us: 1_000 + n,
        build_id: "base".into(),
        data: (kind == EventType::Updated).then(|| serde_json::json!({"set_timeout": "t"})),
    };
    let mine = [
        event(1, "k1", "a", EventType::Created),
        event(2, "k1", "a", EventType::Updated),
        event(3, "k1", "b", EventType::Created),
        event(4, "k1", "a", EventType::Killed),
    ];
    for e in &mine {
        events.put(e).await.unwrap();
    }
    events
        .put(&event(5, "k2", "a", EventType::Created))
        .await
        .unwrap();
    let all = EventQuery {
        limit: 100,
        ..EventQuery::default()
    };
    let ids = |got: Vec<SandboxEvent>| got.into_iter().map(|e| e.at_us - 1_000).collect::<Vec<_>>();

    // Newest first by default, one sandbox's or the key's, never another key's.
    let of_a = EventQuery {
        sandbox_id: Some("a"),
        ..all.clone()
    };
    assert_eq!(ids(events.list("k1", &of_a).await.unwrap()), [4, 2, 1]);
    assert_eq!(ids(events.list("k1", &all).await.unwrap()), [4, 3, 2, 1]);
    assert_eq!(ids(events.list("k2", &of_a).await.unwrap()), [5]);
    assert!(events.list("k3", &all).await.unwrap().is_empty());
    // Read back as written, details and all.
    let oldest = EventQuery {
        oldest_first: true,
        ..of_a.clone()
    };
    let got = events.list("k1", &oldest).await.unwrap();
    assert_eq!(got, [mine[0].clone(), mine[1].clone(), mine[3].clone()]);

    // Types, pages and age.
    let types = [EventType::Created, EventType::Killed];
    let typed = EventQuery {
        types: &types,
        ..all.clone()
    };
    assert_eq!(ids(events.list("k1", &typed).await.unwrap()), [4, 3, 1]);
    let page = EventQuery {
        offset: 1,
        limit: 2,
        ..all.clone()
    };
    assert_eq!(ids(events.list("k1", &page).await.unwrap()), [3, 2]);
    let recent = EventQuery {
        since_us: 1_003,
        ..all.clone()
    };
    assert_eq!(ids(events.list("k1", &recent).await.unwrap()), [4, 3]);

    assert_eq!(events.forget_before(1_003).await.unwrap(), 2);
    assert_eq!(ids(events.list("k1", &all).await.unwrap()), [4, 3]);
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn events_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        super::behaves(store.events()).await;
    }
}
