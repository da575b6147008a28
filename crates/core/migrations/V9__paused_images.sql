-- Paused sandboxes whose image is in object storage (`serve --object-store`), and where:
-- a sandbox with no row here has its image on its node's disk only.
CREATE TABLE paused_images (
    sandbox_id TEXT PRIMARY KEY,
    object TEXT NOT NULL,
    size_bytes BIGINT NOT NULL
);
