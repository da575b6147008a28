-- Sandboxes' lifecycle events (E2B's `GET /events/sandboxes/{id}`), each its key's own, kept
-- seven days. `data` is the event's JSON details, or NULL.
CREATE TABLE sandbox_events (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    type TEXT NOT NULL,
    at_us BIGINT NOT NULL,
    build_id TEXT NOT NULL,
    data TEXT
);
CREATE INDEX sandbox_events_by_sandbox ON sandbox_events (owner, sandbox_id, at_us);
CREATE INDEX sandbox_events_by_owner ON sandbox_events (owner, at_us);
CREATE INDEX sandbox_events_by_age ON sandbox_events (at_us);

-- Creates sent with an `Idempotency-Key`: the first claims the key for its API key, and its
-- answer is kept a day for the retries. `response` is NULL while that create is at work.
CREATE TABLE idempotent_creates (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    claimed_at BIGINT NOT NULL,
    response TEXT,
    PRIMARY KEY (owner, key)
);
CREATE INDEX idempotent_creates_by_age ON idempotent_creates (claimed_at);
