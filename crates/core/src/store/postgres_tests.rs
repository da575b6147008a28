//! The store on a real PostgreSQL. `./test.sh` starts one (`scripts/postgres.sh`) and runs
//! these with `cargo test -p airlock-core --lib postgres -- --ignored`; each test works in a
//! schema of its own.

use super::db::Db;
use super::migrations;
use std::collections::BTreeSet;
use std::str::FromStr;

/// A new, migrated schema on the PostgreSQL that `AIRLOCK_TEST_POSTGRES_URL` names, and a
/// client and a config whose connections use it.
async fn migrated_schema() -> (tokio_postgres::Client, tokio_postgres::Config, String) {
    let url = std::env::var("AIRLOCK_TEST_POSTGRES_URL").expect(
        "AIRLOCK_TEST_POSTGRES_URL names a PostgreSQL to test against (scripts/postgres.sh)",
    );
    let schema = format!("test_{}", uuid::Uuid::new_v4().simple());
    let mut config = tokio_postgres::Config::from_str(&url).unwrap();
    config.options(format!("-c search_path={schema}"));
    let (mut client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let report = migrations::runner().run_async(&mut client).await.unwrap();
    assert_eq!(
        report.applied_migrations().len(),
        migrations::runner().get_migrations().len()
    );
    (client, config, schema)
}

async fn drop_schema(client: &tokio_postgres::Client, schema: &str) {
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_gets_the_tables_and_columns_sqlite_gets() {
    let (mut client, _, schema) = migrated_schema().await;
    let again = migrations::runner().run_async(&mut client).await.unwrap();
    assert!(again.applied_migrations().is_empty());

    // Every table and column, with its type, is the same on both (refinery's own history
    // table aside, whose types refinery picks per database).
    let rows = client
        .query(
            "SELECT table_name::text, column_name::text, data_type::text
             FROM information_schema.columns
             WHERE table_schema = $1 AND table_name <> 'refinery_schema_history'",
            &[&schema],
        )
        .await
        .unwrap();
    let postgres: BTreeSet<(String, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    drop(super::Store::open(&dir.path().join("db")).unwrap());
    let sqlite = rusqlite::Connection::open(dir.path().join("db")).unwrap();
    let mut stmt = sqlite
        .prepare(
            "SELECT m.name, c.name, lower(c.type) FROM sqlite_master m, pragma_table_info(m.name) c
             WHERE m.type = 'table' AND m.name <> 'refinery_schema_history'",
        )
        .unwrap();
    let sqlite: BTreeSet<(String, String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(postgres, sqlite);
    assert!(postgres.contains(&("build_logs".into(), "at_ms".into(), "bigint".into())));

    // Integers are 64-bit on both: a build log's milliseconds and a layer's bytes fit.
    client
        .execute(
            "INSERT INTO build_logs (build_id, seq, at_ms, level, message)
             VALUES ('b', 0, $1, 'info', 'm')",
            &[&1_795_000_000_000_i64],
        )
        .await
        .unwrap();
    drop_schema(&client, &schema).await;
}

/// Runs `check` on a pool of connections to a new, migrated schema, then drops the schema.
async fn in_a_new_schema<F: std::future::Future<Output = ()>>(check: impl FnOnce(Db) -> F) {
    let (client, config, schema) = migrated_schema().await;
    check(Db::postgres(config).unwrap()).await;
    drop_schema(&client, &schema).await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_keys_as_sqlite_does() {
    in_a_new_schema(|db| async move { super::keys::behaves(&super::Keys::new(db)).await }).await;
}

/// Many tasks on many connections, as gateways are: a key's volume quota holds among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_volumes_as_sqlite_does() {
    in_a_new_schema(
        |db| async move { super::volumes::behaves(&super::VolumeRecords::new(db)).await },
    )
    .await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_snapshots_as_sqlite_does() {
    in_a_new_schema(|db| async move {
        super::snapshots::behaves(&super::SnapshotRecords::new(db)).await
    })
    .await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_sandboxes_as_sqlite_does() {
    in_a_new_schema(|db| async move {
        super::sandboxes_tests::behaves(&super::SandboxRecords::new(db)).await
    })
    .await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_templates_as_sqlite_does() {
    in_a_new_schema(|db| async move {
        super::templates_tests::behaves(&super::Templates::new(db)).await
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_postgresql_is_unavailable_not_corrupt() {
    // Nothing listens on port 1 of loopback.
    let config = tokio_postgres::Config::from_str("host=127.0.0.1 port=1 user=x dbname=x").unwrap();
    let keys = super::Keys::new(Db::postgres(config).unwrap());
    let err = keys.live("00").await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn a_refused_password_is_an_error_not_unavailable() {
    let url = std::env::var("AIRLOCK_TEST_POSTGRES_URL").unwrap();
    let mut config = tokio_postgres::Config::from_str(&url).unwrap();
    config.password("not-the-password");
    let keys = super::Keys::new(Db::postgres(config).unwrap());
    let err = keys.live("00").await.unwrap_err();
    assert!(!err.is_unavailable(), "{err:?}");
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_events_as_sqlite_does() {
    in_a_new_schema(
        |db| async move { super::events::behaves(&super::EventRecords::new(db)).await },
    )
    .await;
}

/// Concurrent claims on many connections, as gateways make them: one create wins a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_claims_idempotency_keys_as_sqlite_does() {
    in_a_new_schema(|db| async move {
        super::idempotency::behaves(&super::IdempotencyRecords::new(db)).await
    })
    .await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_webhooks_as_sqlite_does() {
    in_a_new_schema(
        |db| async move { super::webhooks::behaves(&super::WebhookRecords::new(db)).await },
    )
    .await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_paused_images_as_sqlite_does() {
    in_a_new_schema(|db| async move {
        super::paused_images::behaves(&super::PausedImages::new(db)).await
    })
    .await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_keeps_settings_as_sqlite_does() {
    in_a_new_schema(|db| async move { super::settings::behaves(&super::Settings::new(db)).await })
        .await;
}

/// Each guard on a connection of its own, as builds and a collection on different nodes are.
#[tokio::test]
#[ignore = "needs PostgreSQL at AIRLOCK_TEST_POSTGRES_URL; ./test.sh starts one"]
async fn postgres_locks_objects_as_sqlite_does() {
    in_a_new_schema(|db| async move {
        super::objects_lock::behaves(&super::ObjectsLock::new(db)).await
    })
    .await;
}
