//! The store's one migration set, applied to a real PostgreSQL: the tables and columns it makes
//! there are the ones SQLite gets. `./test.sh` starts a server (scripts/postgres.sh) and runs
//! this with `--ignored`.

use airlock_core::store::{migrations, Store};
use std::collections::BTreeSet;

fn postgres_url() -> String {
    std::env::var("AIRLOCK_TEST_POSTGRES_URL").expect(
        "AIRLOCK_TEST_POSTGRES_URL names a PostgreSQL to test against (scripts/postgres.sh)",
    )
}

/// The columns of every table SQLite's store has, from a new database.
fn sqlite_columns() -> BTreeSet<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    drop(Store::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT m.name, c.name FROM sqlite_master m, pragma_table_info(m.name) c
             WHERE m.type = 'table'",
        )
        .unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn the_migration_set_makes_sqlites_schema_on_postgresql() {
    let (mut client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .expect("connecting to PostgreSQL");
    tokio::spawn(connection);
    // A schema of its own, so runs never see each other's tables.
    let schema = format!("migrations_{}", uuid::Uuid::new_v4().simple());
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path TO {schema}"
        ))
        .await
        .unwrap();

    let report = migrations::runner().run_async(&mut client).await.unwrap();
    let all = migrations::runner().get_migrations().len();
    assert_eq!(report.applied_migrations().len(), all);
    let again = migrations::runner().run_async(&mut client).await.unwrap();
    assert!(again.applied_migrations().is_empty());

    let rows = client
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns
             WHERE table_schema = $1",
            &[&schema],
        )
        .await
        .unwrap();
    let postgres: BTreeSet<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(postgres, sqlite_columns());

    // Integers are 64-bit on both: a build log's milliseconds and a layer's bytes fit.
    client
        .execute(
            "INSERT INTO build_logs (build_id, seq, at_ms, level, message)
             VALUES ('b', 0, $1, 'info', 'm')",
            &[&1_795_000_000_000_i64],
        )
        .await
        .unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
