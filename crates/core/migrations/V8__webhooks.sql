-- Webhooks (E2B's `POST /events/webhooks`): each its API key's own, told of that key's
-- sandboxes' lifecycle events. `events` is a JSON array of event types; `secret` signs each
-- delivery, so it is kept as given (the database is the server's own, mode 0600).
CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    url TEXT NOT NULL,
    enabled BIGINT NOT NULL,
    events TEXT NOT NULL,
    secret TEXT NOT NULL,
    created_at_us BIGINT NOT NULL
);
CREATE INDEX webhooks_by_owner ON webhooks (owner, created_at_us);
