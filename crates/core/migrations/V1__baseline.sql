-- The store's schema as of the first versioned migration. One set of files for SQLite (one box)
-- and PostgreSQL (a cluster), so only what both read the same way: TEXT, BIGINT (SQLite's
-- INTEGER; PostgreSQL's INTEGER is 32 bits, too small for milliseconds and bytes), flags as 0/1.
-- IF NOT EXISTS: a database from before versioned migrations already has these tables once
-- store/migrations.rs has brought its columns up to date.

-- Sandboxes this server runs or keeps paused, with what it needs to bring them back.
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    template TEXT NOT NULL,
    rootfs TEXT NOT NULL,
    state TEXT NOT NULL,
    slot BIGINT UNIQUE,
    access_token TEXT,
    metadata TEXT NOT NULL,
    env_vars TEXT NOT NULL,
    started_at BIGINT NOT NULL,
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
    volume_mounts TEXT NOT NULL DEFAULT '[]'
);

-- Built root filesystems: the built-ins by name, user templates by build id.
CREATE TABLE IF NOT EXISTS templates (
    name TEXT PRIMARY KEY,
    content_hash TEXT NOT NULL,
    rootfs TEXT NOT NULL,
    built_at BIGINT NOT NULL,
    size_bytes BIGINT NOT NULL,
    layers TEXT NOT NULL DEFAULT '[]',
    defaults TEXT
);

-- API keys by the SHA-256 of the key: the key itself is never stored.
CREATE TABLE IF NOT EXISTS api_keys (
    sha256 TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    revoked_at BIGINT,
    max_running BIGINT,
    max_paused BIGINT,
    max_snapshot_mb BIGINT
);

-- Snapshot names are unique per owner, not globally: two keys may both have a `ready`.
CREATE TABLE IF NOT EXISTS snapshots (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    image TEXT NOT NULL UNIQUE,
    template TEXT NOT NULL,
    rootfs TEXT NOT NULL,
    source_sandbox TEXT NOT NULL,
    access_token TEXT,
    created_at BIGINT NOT NULL,
    size_bytes BIGINT NOT NULL DEFAULT 0,
    volume_mounts TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (owner, id)
);

-- Templates that API keys build, their builds, logs and the layers those builds made.
CREATE TABLE IF NOT EXISTS user_templates (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    alias TEXT NOT NULL,
    public BIGINT NOT NULL,
    cpu_count BIGINT,
    memory_mb BIGINT,
    created_at BIGINT NOT NULL,
    UNIQUE (owner, alias)
);
CREATE TABLE IF NOT EXISTS template_builds (
    id TEXT PRIMARY KEY,
    template_id TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    reason_step TEXT,
    created_at BIGINT NOT NULL,
    finished_at BIGINT,
    tags TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS build_logs (
    build_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    level TEXT NOT NULL,
    step TEXT,
    message TEXT NOT NULL,
    PRIMARY KEY (build_id, seq)
);
CREATE TABLE IF NOT EXISTS build_layers (
    path TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    bytes BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS template_tags (
    template_id TEXT NOT NULL,
    tag TEXT NOT NULL,
    build_id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (template_id, tag)
);

CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    token TEXT NOT NULL,
    size_limit_mb BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (owner, name)
);
