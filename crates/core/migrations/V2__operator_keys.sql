-- An operator key also reads the nodes' admin routes (`GET /nodes`); a tenant's never does.
ALTER TABLE api_keys ADD COLUMN operator BIGINT NOT NULL DEFAULT 0;
