//! `Idempotency-Key` on create (E2B's `idempotency_key`, which its SDK reuses on retries). The
//! same key from the same API key within 24 hours answers what the first create with it
//! answered: the same sandbox, even if it was killed since. The same key with another request
//! is a 409. Duplicates sent at once, to any gateway, make one sandbox: the first claims the key
//! in the database ([`airlock_core::store::IdempotencyRecords`]) and the others wait for its
//! answer. A create that fails gives the key back, so a retry of it creates afresh.

use crate::http::error::ApiError;
use airlock_core::lifecycle::now_unix;
use airlock_core::store::{Claim, IdempotencyRecords};
use axum::http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::time::Duration;

const HEADER: &str = "idempotency-key";
const MAX_KEY_LEN: usize = 255;

/// How often a duplicate looks whether the first create has answered.
const POLL: Duration = Duration::from_millis(50);

/// The longest a duplicate waits for the first create's answer.
const MAX_WAIT: Duration = Duration::from_secs(120);

/// How often claims past their day are forgotten.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// The request's `Idempotency-Key`, if it sent one: 1-255 visible ASCII characters (E2B's SDK
/// sends lowercase letters, digits and hyphens).
pub(crate) fn key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(HEADER) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key)
            if (1..=MAX_KEY_LEN).contains(&key.len())
                && key.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(Some(key.to_owned()))
        }
        _ => Err(ApiError::bad_request(format!(
            "Idempotency-Key must be 1-{MAX_KEY_LEN} visible ASCII characters"
        ))),
    }
}

/// What makes two creates the same request: the route and the body's JSON, whatever its
/// spacing and key order.
pub(crate) fn fingerprint(route: &str, body: &serde_json::Value) -> String {
    // `serde_json`'s maps are sorted (no `preserve_order`), so equal bodies print alike.
    let digest = Sha256::new()
        .chain_update(route)
        .chain_update([0])
        .chain_update(body.to_string())
        .finalize();
    hex::encode(digest)
}

/// Runs `create` once for `owner`'s `key`, and answers its JSON for every request with the
/// key. `create` runs to its end even if its caller goes away, so its answer is kept.
pub(crate) async fn once<F>(
    claims: &IdempotencyRecords,
    owner: &str,
    key: &str,
    fingerprint: &str,
    create: F,
) -> Result<String, ApiError>
where
    F: Future<Output = Result<String, ApiError>> + Send + 'static,
{
    let deadline = tokio::time::Instant::now() + MAX_WAIT;
    let mut create = Some(create);
    let mut claim = claims.claim(owner, key, fingerprint, now_unix()).await?;
    loop {
        let held = match &claim {
            Claim::Won => None,
            Claim::Answered { fingerprint, .. } | Claim::Pending { fingerprint } => {
                Some(fingerprint)
            }
        };
        if held.is_some_and(|f| f != fingerprint) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "this Idempotency-Key was used for a different create request in the last \
                 24 hours; send a new key for a new request",
            ));
        }
        match claim {
            Claim::Won => {
                let create = create.take().expect("a key is won once");
                let task = tokio::spawn(settle(
                    claims.clone(),
                    owner.to_owned(),
                    key.to_owned(),
                    create,
                ));
                return task.await.unwrap_or_else(|e| {
                    tracing::error!(error = %e, "an idempotent create's task failed");
                    Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal error; see the server log",
                    ))
                });
            }
            Claim::Answered { response, .. } => return Ok(response),
            Claim::Pending { .. } if tokio::time::Instant::now() >= deadline => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "a create with this Idempotency-Key is still at work; retry it later",
                ))
            }
            // A wait only reads; a claim released meanwhile (it failed) is claimed again.
            Claim::Pending { .. } => {
                tokio::time::sleep(POLL).await;
                claim = match claims.held(owner, key).await? {
                    Some(held) => held,
                    None => claims.claim(owner, key, fingerprint, now_unix()).await?,
                };
            }
        }
    }
}

/// Forgets claims past their day, hourly, for the process's life. The next claim of such a
/// key takes it over anyway: this only keeps the table from growing.
pub(crate) async fn purge_expired(claims: IdempotencyRecords) {
    let mut every = tokio::time::interval(PURGE_EVERY);
    loop {
        every.tick().await;
        if let Err(e) = claims.forget_expired(now_unix()).await {
            tracing::warn!(error = %e, "forgetting old Idempotency-Key claims failed");
        }
    }
}

/// The claimed create: its answer is kept for the key, or the key is given back if it failed.
async fn settle(
    claims: IdempotencyRecords,
    owner: String,
    key: String,
    create: impl Future<Output = Result<String, ApiError>>,
) -> Result<String, ApiError> {
    let answer = create.await;
    let kept = match &answer {
        Ok(response) => claims.answer(&owner, &key, response).await,
        Err(_) => claims.release(&owner, &key).await,
    };
    if let Err(e) = kept {
        // Its duplicates wait until the claim counts as abandoned, then create afresh.
        tracing::warn!(error = %e, "recording an idempotent create's outcome failed");
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_request_has_the_same_fingerprint_however_it_is_written() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"templateID":"base","metadata":{"a":"1","b":"2"}}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(r#"{ "metadata": {"b":"2", "a":"1"}, "templateID": "base" }"#)
                .unwrap();
        assert_eq!(fingerprint("v2", &a), fingerprint("v2", &b));
        assert_ne!(fingerprint("v1", &a), fingerprint("v2", &a));
        let c = serde_json::json!({"templateID": "base", "metadata": {"a": "1"}});
        assert_ne!(fingerprint("v2", &a), fingerprint("v2", &c));
    }

    #[test]
    fn keys_are_short_visible_ascii() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(HEADER, v.parse().unwrap());
            key(&h)
        };
        assert_eq!(with("abc-123").unwrap().as_deref(), Some("abc-123"));
        assert!(with("").is_err());
        assert!(with("a b").is_err());
        assert!(with(&"a".repeat(256)).is_err());
        assert_eq!(key(&HeaderMap::new()).unwrap(), None);
    }
}
