//! The store's schema: one numbered set of SQL files (`crates/core/migrations/V{n}__{name}.sql`),
//! applied by `refinery` in order and recorded in `refinery_schema_history`, for SQLite here and
//! for PostgreSQL alike. A released file never changes (refinery refuses a database whose
//! applied files differ); a change of schema is a new file.
//!
//! Databases from before versioned migrations have no history table. They are brought up to the
//! baseline (V1) by the frozen upgrades below, all in one transaction (V1's own SQL among them,
//! for the tables they lack), and then refinery applies V1 again, which its `IF NOT EXISTS`
//! makes a no-op, and records it. If anything stops it before the history is written, the next
//! open does it again: every upgrade finds what it already did.

use super::tags::DEFAULT_TAG;
use super::StoreError;
use rusqlite::{params, Connection, OptionalExtension};

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The migration set, for any backend refinery drives (the PostgreSQL tests use it too).
pub(crate) fn runner() -> refinery::Runner {
    embedded::migrations::runner()
}

/// Brings the database at `conn` to the newest schema.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let unversioned = !table_exists(conn, "refinery_schema_history")? && has_tables(conn)?;
    if unversioned {
        upgrade_to_baseline(conn)?;
    }
    runner().run(conn).map_err(StoreError::Migrate)?;
    Ok(())
}

fn has_tables(conn: &Connection) -> Result<bool, StoreError> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

fn table_exists(conn: &Connection, table: &str) -> Result<bool, StoreError> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            params![table],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool, StoreError> {
    Ok(conn
        .query_row(
            &format!("SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"),
            params![column],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

/// The columns that unversioned databases gained one release at a time, by definition.
const ADDED_COLUMNS: [(&str, &str); 17] = [
    ("sandboxes", "owner TEXT"),
    ("sandboxes", "egress TEXT NOT NULL DEFAULT '{}'"),
    ("sandboxes", "traffic_access_token TEXT"),
    (
        "sandboxes",
        "require_traffic_token INTEGER NOT NULL DEFAULT 0",
    ),
    ("sandboxes", "timeout_pause TEXT NOT NULL DEFAULT 'full'"),
    ("sandboxes", "pause_mode TEXT"),
    ("sandboxes", "volume_mounts TEXT NOT NULL DEFAULT '[]'"),
    ("api_keys", "name TEXT NOT NULL DEFAULT ''"),
    ("api_keys", "revoked_at INTEGER"),
    ("api_keys", "max_running INTEGER"),
    ("api_keys", "max_paused INTEGER"),
    ("api_keys", "max_snapshot_mb INTEGER"),
    ("snapshots", "size_bytes INTEGER NOT NULL DEFAULT 0"),
    ("snapshots", "volume_mounts TEXT NOT NULL DEFAULT '[]'"),
    ("templates", "layers TEXT NOT NULL DEFAULT '[]'"),
    ("templates", "defaults TEXT"),
    ("template_builds", "tags TEXT NOT NULL DEFAULT '[]'"),
];

/// One transaction: tables whose keys changed are set aside, the others gain their missing
/// columns, the baseline makes what is missing, and the set-aside rows move in.
fn upgrade_to_baseline(conn: &mut Connection) -> Result<(), StoreError> {
    // Immediate: the write lock first, so a CLI reading meanwhile makes it wait, not fail.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    // Before pause/resume: no `state`, `rootfs` or lifecycle flags, and a NOT NULL slot.
    let old_sandboxes = table_exists(&tx, "sandboxes")? && !has_column(&tx, "sandboxes", "state")?;
    if old_sandboxes {
        tx.execute_batch("ALTER TABLE sandboxes RENAME TO sandboxes_v1")?;
    }
    // Before snapshots had owners: one namespace of names, keyed by id alone.
    let old_snapshots = table_exists(&tx, "snapshots")?
        && tx.query_row(
            "SELECT COUNT(*) FROM pragma_table_info('snapshots') WHERE pk > 0",
            [],
            |r| r.get::<_, i64>(0),
        )? == 1;
    if old_snapshots {
        tx.execute_batch("ALTER TABLE snapshots RENAME TO snapshots_v1")?;
    }
    for (table, column) in ADDED_COLUMNS {
        let name = column.split_whitespace().next().unwrap_or(column);
        if table_exists(&tx, table)? && !has_column(&tx, table, name)? {
            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column}"))?;
        }
    }
    for migration in runner().get_migrations() {
        if migration.version() == 1 {
            tx.execute_batch(migration.sql().unwrap_or_default())?;
        }
    }
    if old_sandboxes {
        // Their rows are running sandboxes, carried over with their template's rootfs.
        tx.execute_batch(
            "INSERT INTO sandboxes (id, template, rootfs, state, slot, access_token, metadata,
                 env_vars, started_at, end_at, cpu_count, memory_mb, disk_mb, pause_on_timeout,
                 auto_resume)
             SELECT s.id, s.template, COALESCE(t.rootfs, ''), 'running', s.slot, s.access_token,
                 s.metadata, s.env_vars, s.started_at, s.end_at, s.cpu_count, s.memory_mb,
                 s.disk_mb, 0, 0
             FROM sandboxes_v1 s LEFT JOIN templates t ON t.name = s.template;
             DROP TABLE sandboxes_v1;",
        )?;
    }
    if old_snapshots {
        // Rows without an owner keep their names, under the empty owner no key has.
        let owner = if has_column(&tx, "snapshots_v1", "owner")? {
            "COALESCE(owner, '')"
        } else {
            "''"
        };
        tx.execute_batch(&format!(
            "INSERT INTO snapshots (owner, id, image, template, rootfs, source_sandbox,
                 access_token, created_at)
             SELECT {owner}, id, image, template, rootfs, source_sandbox, access_token,
                 created_at FROM snapshots_v1;
             DROP TABLE snapshots_v1;"
        ))?;
    }
    move_untagged_records(&tx)?;
    tx.commit()?;
    Ok(())
}

/// Before tags, a user template's one built rootfs was recorded under the template's id. It
/// moves to its newest ready build's id, with the `default` tag, and the sandboxes and snapshots
/// made from it follow.
pub(super) fn move_untagged_records(conn: &Connection) -> Result<(), StoreError> {
    let legacy: Vec<String> = {
        let mut stmt = conn
            .prepare("SELECT name FROM templates WHERE name IN (SELECT id FROM user_templates)")?;
        let rows = stmt.query_map([], |row| row.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    for template in legacy {
        let newest_ready: Option<String> = conn
            .query_row(
                "SELECT id FROM template_builds WHERE template_id = ?1 AND status = 'ready'
                 ORDER BY created_at DESC, rowid DESC LIMIT 1",
                params![template],
                |row| row.get(0),
            )
            .optional()?;
        // Its builds were forgotten: it gets a build record (E2B's SDK reads build ids as UUIDs).
        let build = newest_ready.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let now = chrono::Utc::now().timestamp();
        conn.execute(
            "INSERT OR IGNORE INTO template_builds (id, template_id, status, created_at,
               finished_at) VALUES (?1, ?2, 'ready', ?3, ?3)",
            params![build, template, now],
        )?;
        for sql in [
            "UPDATE OR REPLACE templates SET name = ?2 WHERE name = ?1",
            "UPDATE sandboxes SET template = ?2 WHERE template = ?1",
            "UPDATE snapshots SET template = ?2 WHERE template = ?1",
        ] {
            conn.execute(sql, params![template, build])?;
        }
        conn.execute(
            "INSERT OR IGNORE INTO template_tags (template_id, tag, build_id, created_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![template, DEFAULT_TAG, build, now],
        )?;
    }
    Ok(())
}

/// Every table's columns, sorted: what the schema is, whichever way it was reached.
#[cfg(test)]
fn columns(conn: &Connection) -> Vec<(String, String)> {
    let mut stmt = conn
        .prepare(
            "SELECT m.name, c.name FROM sqlite_master m, pragma_table_info(m.name) c
             WHERE m.type = 'table' ORDER BY m.name, c.name",
        )
        .unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn the_oldest_database_reaches_the_schema_a_new_one_has() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("fresh.db");
        drop(Store::open(&fresh).unwrap());
        // The first release's tables: sandboxes without lifecycle columns, unowned snapshots.
        let old = dir.path().join("old.db");
        Connection::open(&old)
            .unwrap()
            .execute_batch(
                "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, template TEXT NOT NULL,
                   slot INTEGER NOT NULL UNIQUE, access_token TEXT, metadata TEXT NOT NULL,
                   env_vars TEXT NOT NULL, started_at INTEGER NOT NULL, end_at INTEGER NOT NULL,
                   cpu_count INTEGER NOT NULL, memory_mb INTEGER NOT NULL,
                   disk_mb INTEGER NOT NULL);
                 CREATE TABLE templates (name TEXT PRIMARY KEY, content_hash TEXT NOT NULL,
                   rootfs TEXT NOT NULL, built_at INTEGER NOT NULL, size_bytes INTEGER NOT NULL);
                 CREATE TABLE api_keys (sha256 TEXT PRIMARY KEY, created_at INTEGER NOT NULL);
                 CREATE TABLE snapshots (id TEXT PRIMARY KEY, image TEXT NOT NULL,
                   template TEXT NOT NULL, rootfs TEXT NOT NULL, source_sandbox TEXT NOT NULL,
                   access_token TEXT, created_at INTEGER NOT NULL);",
            )
            .unwrap();
        drop(Store::open(&old).unwrap());
        let (fresh, old) = (
            Connection::open(&fresh).unwrap(),
            Connection::open(&old).unwrap(),
        );
        assert_eq!(columns(&old), columns(&fresh));
        assert!(columns(&fresh).contains(&("volumes".into(), "size_limit_mb".into())));
        // Both are recorded at the newest version, so neither is upgraded again.
        let newest = runner().get_migrations().iter().map(|m| m.version()).max();
        for conn in [&fresh, &old] {
            let applied: i64 = conn
                .query_row(
                    "SELECT MAX(version) FROM refinery_schema_history",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(Some(applied), newest.map(i64::from));
        }
    }

    #[test]
    fn opening_again_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        drop(Store::open(&path).unwrap());
        let before = columns(&Connection::open(&path).unwrap());
        drop(Store::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        assert_eq!(columns(&conn), before);
        let runs: i64 = conn
            .query_row("SELECT COUNT(*) FROM refinery_schema_history", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(runs as usize, runner().get_migrations().len());
    }
}
