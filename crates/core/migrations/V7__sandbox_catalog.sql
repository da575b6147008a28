-- The sandboxes' table becomes the catalog of many machines.
-- * `node` names the node that runs the sandbox, or keeps it paused; rows from before are ''
--   until the node that opens the database first claims them.
-- * A network slot is a node's own, so it is unique per node, no longer across the table.
-- * `transition` is a verb at work on it: 'starting' (admitted, not yet handed over, and in
--   no list), 'pausing' or 'resuming'; NULL otherwise. The key's quotas count it, so that
--   admission is one conditional write that holds whichever gateway admits.
-- SQLite cannot drop a column's UNIQUE, so the table is built anew.
CREATE TABLE sandbox_catalog (
    id TEXT PRIMARY KEY,
    template TEXT NOT NULL,
    rootfs TEXT NOT NULL,
    state TEXT NOT NULL,
    slot BIGINT,
    access_token TEXT,
    metadata TEXT NOT NULL,
    env_vars TEXT NOT NULL,
    started_at_us BIGINT NOT NULL,
    end_at BIGINT NOT NULL,
    cpu_count BIGINT NOT NULL,
    memory_mb BIGINT NOT NULL,
    disk_mb BIGINT NOT NULL,
    pause_on_timeout BIGINT NOT NULL,
    auto_resume BIGINT NOT NULL,
    owner TEXT,
    egress TEXT NOT NULL DEFAULT '{}',
    traffic_access_token TEXT,
    require_traffic_token BIGINT NOT NULL DEFAULT 0,
    timeout_pause TEXT NOT NULL DEFAULT 'full',
    pause_mode TEXT,
    volume_mounts TEXT NOT NULL DEFAULT '[]',
    node TEXT NOT NULL DEFAULT '',
    transition TEXT,
    UNIQUE (node, slot)
);
INSERT INTO sandbox_catalog (id, template, rootfs, state, slot, access_token, metadata,
    env_vars, started_at_us, end_at, cpu_count, memory_mb, disk_mb, pause_on_timeout,
    auto_resume, owner, egress, traffic_access_token, require_traffic_token, timeout_pause,
    pause_mode, volume_mounts)
SELECT id, template, rootfs, state, slot, access_token, metadata, env_vars, started_at_us,
    end_at, cpu_count, memory_mb, disk_mb, pause_on_timeout, auto_resume, owner, egress,
    traffic_access_token, require_traffic_token, timeout_pause, pause_mode, volume_mounts
FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandbox_catalog RENAME TO sandboxes;
CREATE INDEX sandboxes_by_owner ON sandboxes (owner, state);
CREATE INDEX sandboxes_by_node ON sandboxes (node);
