//! Creates sent with an `Idempotency-Key` (E2B's `idempotency_key`). The first create with a
//! key claims it for its API key, whichever gateway it reaches; the same key then answers
//! what that create answered, for a day. A create that failed gives its claim back, so a retry
//! creates afresh.

use super::db::{Db, Value};
use super::StoreError;

/// How long a key's answer is kept (E2B's 24 hours), in seconds.
pub const IDEMPOTENCY_WINDOW_SECS: i64 = 24 * 3600;

/// How long a claim may go unanswered before it counts as abandoned (its gateway stopped
/// mid-create) and another create may take it over, in seconds.
pub const ABANDONED_AFTER_SECS: i64 = 600;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is this create's: it creates, then answers or releases.
    Won,
    /// An earlier create with the key answered this.
    Answered {
        fingerprint: String,
        response: String,
    },
    /// An earlier create with the key is still at work.
    Pending { fingerprint: String },
}

/// The claims' table, on SQLite or PostgreSQL ([`Db`]).
#[derive(Clone)]
pub struct IdempotencyRecords {
    db: Db,
}

impl IdempotencyRecords {
    pub fn new(db: Db) -> IdempotencyRecords {
        IdempotencyRecords { db }
    }

    /// Claims `owner`'s `key` at `now` (Unix seconds) for a create whose request is
    /// `fingerprint`, unless a live claim holds it: one past the window, or one left
    /// unanswered too long, is taken over by the insert itself.
    pub async fn claim(
        &self,
        owner: &str,
        key: &str,
        fingerprint: &str,
        now: i64,
    ) -> Result<Claim, StoreError> {
        // The conflict alone decides between concurrent claims: one insert (or takeover)
        // wins, the others change nothing.
        let params: [Value; 6] = [
            owner.into(),
            key.into(),
            fingerprint.into(),
            now.into(),
            (now - IDEMPOTENCY_WINDOW_SECS).into(),
            (now - ABANDONED_AFTER_SECS).into(),
        ];
        // A claim released between the insert and the read is claimed again.
        loop {
            let won = self
                .db
                .execute(
                    "INSERT INTO idempotent_creates (owner, key, fingerprint, claimed_at)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (owner, key) DO UPDATE
                       SET fingerprint = excluded.fingerprint, claimed_at = excluded.claimed_at,
                           response = NULL
                       WHERE idempotent_creates.claimed_at < $5
                          OR (idempotent_creates.response IS NULL
                              AND idempotent_creates.claimed_at < $6)",
                    &params,
                )
                .await?;
            if won == 1 {
                return Ok(Claim::Won);
            }
            if let Some(held) = self.held(owner, key).await? {
                return Ok(held);
            }
        }
    }

    /// What holds `owner`'s `key` now, if anything: a read only, for creates that wait on
    /// the one that claimed it.
    pub async fn held(&self, owner: &str, key: &str) -> Result<Option<Claim>, StoreError> {
        self.db
            .query_opt(
                "SELECT fingerprint, response FROM idempotent_creates
                 WHERE owner = $1 AND key = $2",
                &[owner.into(), key.into()],
                |row| {
                    let fingerprint = row.get::<String>(0)?;
                    Ok(match row.get::<Option<String>>(1)? {
                        Some(response) => Claim::Answered {
                            fingerprint,
                            response,
                        },
                        None => Claim::Pending { fingerprint },
                    })
                },
            )
            .await
    }

    /// Forgets the claims made before the window that ends at `now`; returns how many.
    pub async fn forget_expired(&self, now: i64) -> Result<u64, StoreError> {
        self.db
            .execute(
                "DELETE FROM idempotent_creates WHERE claimed_at < $1",
                &[(now - IDEMPOTENCY_WINDOW_SECS).into()],
            )
            .await
    }

    /// Keeps the answer of the create that holds `owner`'s `key`.
    pub async fn answer(&self, owner: &str, key: &str, response: &str) -> Result<(), StoreError> {
        self.db
            .execute(
                "UPDATE idempotent_creates SET response = $3 WHERE owner = $1 AND key = $2",
                &[owner.into(), key.into(), response.into()],
            )
            .await?;
        Ok(())
    }

    /// Gives back the claim of a create that failed, so that a retry creates afresh.
    pub async fn release(&self, owner: &str, key: &str) -> Result<(), StoreError> {
        self.db
            .execute(
                "DELETE FROM idempotent_creates
                 WHERE owner = $1 AND key = $2 AND response IS NULL",
                &[owner.into(), key.into()],
            )
            .await?;
        Ok(())
    }
}

/// What both backends must do alike; run on SQLite below and on PostgreSQL by
/// `store::postgres_tests`.
#[cfg(test)]
pub(crate) async fn behaves(claims: &IdempotencyRecords) {
    let now = 1_800_000_000;
    // Many claim one key at once: exactly one wins, the others see it at work.
    let all =
        futures::future::join_all((0..8).map(|_| claims.claim("k1", "key-1", "body-a", now))).await;
    let won = all.iter().filter(|c| matches!(c, Ok(Claim::Won))).count();
    assert_eq!(won, 1, "{all:?}");
    let pending = Claim::Pending {
        fingerprint: "body-a".into(),
    };
    assert!(all
        .iter()
        .all(|c| matches!(c, Ok(c) if *c == Claim::Won || *c == pending)));

    // Answered: the answer, with what it answered.
    claims
        .answer("k1", "key-1", "{\"sandboxID\":\"a\"}")
        .await
        .unwrap();
    let answered = Claim::Answered {
        fingerprint: "body-a".into(),
        response: "{\"sandboxID\":\"a\"}".into(),
    };
    assert_eq!(
        claims
            .claim("k1", "key-1", "body-b", now + 1)
            .await
            .unwrap(),
        answered
    );
    // Another key's claim of the same key is its own; a release leaves an answer alone.
    assert_eq!(
        claims.claim("k2", "key-1", "body-b", now).await.unwrap(),
        Claim::Won
    );
    claims.release("k1", "key-1").await.unwrap();
    assert_eq!(
        claims
            .claim("k1", "key-1", "body-a", now + 2)
            .await
            .unwrap(),
        answered
    );
    // Waiting reads what holds a key, and changes nothing.
    assert_eq!(
        claims.held("k1", "key-1").await.unwrap(),
        Some(answered.clone())
    );
    assert_eq!(claims.held("k1", "key-9").await.unwrap(), None);
    // A day later the key is free again, purged or not.
    let later = now + IDEMPOTENCY_WINDOW_SECS + 1;
    assert_eq!(
        claims.claim("k1", "key-1", "body-c", later).await.unwrap(),
        Claim::Won
    );
    assert_eq!(
        claims.held("k1", "key-1").await.unwrap(),
        Some(Claim::Pending {
            fingerprint: "body-c".into()
        })
    );

    // A failed create releases its claim: the retry wins it.
    assert_eq!(
        claims.claim("k1", "key-2", "body-a", now).await.unwrap(),
        Claim::Won
    );
    claims.release("k1", "key-2").await.unwrap();
    assert_eq!(
        claims.claim("k1", "key-2", "body-a", now).await.unwrap(),
        Claim::Won
    );
    // A claim left unanswered too long is taken over.
    assert_eq!(
        claims
            .claim("k1", "key-2", "body-a", now + 1)
            .await
            .unwrap(),
        pending
    );
    let abandoned = now + ABANDONED_AFTER_SECS + 1;
    assert_eq!(
        claims
            .claim("k1", "key-2", "body-a", abandoned)
            .await
            .unwrap(),
        Claim::Won
    );

    // The purge forgets what is past the window only: k2's claim (made at `now`), not k1's
    // (taken over since).
    assert_eq!(claims.forget_expired(later).await.unwrap(), 1);
    assert_eq!(claims.held("k2", "key-1").await.unwrap(), None);
    assert!(claims.held("k1", "key-1").await.unwrap().is_some());
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    #[tokio::test]
    async fn idempotency_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        super::behaves(store.idempotency()).await;
    }
}
