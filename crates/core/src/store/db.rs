//! One database, SQLite (one box) or PostgreSQL (many machines), behind the same calls: the SQL
//! is written once, with PostgreSQL's `$1` placeholders (SQLite reads them as `?1`), in the
//! dialect both share (`ON CONFLICT`, `substr`, `COUNT(*)`), over the columns the migration
//! set makes alike on both (`BIGINT`, `TEXT`). Parameters and columns are integers, text or
//! NULL.

use super::postgres_tls::Tls;
use super::StoreError;
use rusqlite::types::{ToSqlOutput, ValueRef};
use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// The longest a statement waits for a connection to PostgreSQL.
const WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A connection to the store's database.
#[derive(Clone)]
pub enum Db {
    /// The one-box file, shared with the rest of the store (see [`super::Store`]).
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(deadpool_postgres::Pool),
}

/// A pool of connections to the PostgreSQL that `config` names, made as `tls` says. A request
/// never waits longer than [`WAIT`] for a connection: a database that is down answers as
/// unavailable.
fn pool(
    mut config: tokio_postgres::Config,
    tls: Tls,
) -> Result<deadpool_postgres::Pool, StoreError> {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(WAIT);
    }
    let manager = match tls {
        Tls::Plain => deadpool_postgres::Manager::new(config, tokio_postgres::NoTls),
        Tls::Verified(tls) => deadpool_postgres::Manager::new(config, tls),
    };
    deadpool_postgres::Pool::builder(manager)
        .max_size(16)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(WAIT))
        .create_timeout(Some(WAIT))
        .build()
        .map_err(|e| StoreError::Pool(e.to_string()))
}

/// A statement's parameter.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Int(i64),
    Text(&'a str),
    Null,
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(text: &'a str) -> Self {
        Value::Text(text)
    }
}

impl From<i64> for Value<'_> {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

/// Flags are 0 or 1 on both databases.
impl From<bool> for Value<'_> {
    fn from(flag: bool) -> Self {
        Value::Int(flag.into())
    }
}

impl<'a, T: Into<Value<'a>>> From<Option<T>> for Value<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// One statement of a [`Db::transaction`], with its parameters.
pub struct Statement<'a> {
    pub sql: &'a str,
    pub params: Vec<Value<'a>>,
}

impl<'a> Statement<'a> {
    pub fn new(sql: &'a str, params: impl IntoIterator<Item = Value<'a>>) -> Self {
        Statement {
            sql,
            params: params.into_iter().collect(),
        }
    }
}

/// A row of an answer, read by column index.
pub enum Row<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Postgres(&'a tokio_postgres::Row),
}

impl Row<'_> {
    /// Column `i` as an `i64` or a `String`, or as an `Option` of one where it may be NULL.
    pub fn get<T>(&self, i: usize) -> Result<T, StoreError>
    where
        T: rusqlite::types::FromSql + for<'r> tokio_postgres::types::FromSql<'r>,
    {
        Ok(match self {
            Row::Sqlite(r) => r.get(i)?,
            Row::Postgres(r) => r.try_get(i)?,
        })
    }
}

impl Db {
    /// PostgreSQL through a [`pool`] of plain connections to the one `config` names.
    pub fn postgres(config: tokio_postgres::Config) -> Result<Db, StoreError> {
        Ok(Db::Postgres(pool(config, Tls::Plain)?))
    }

    /// [`Db::postgres`], with the schema brought up to date ([`super::migrations`]) one
    /// process at a time: gateways and nodes that start together would otherwise race to
    /// apply the same files.
    pub(super) async fn migrated_postgres(
        config: tokio_postgres::Config,
        tls: Tls,
    ) -> Result<Db, StoreError> {
        let pool = pool(config, tls)?;
        // Any number will do, as long as nothing else on the database takes the same lock.
        const MIGRATION_LOCK: i64 = 0x0061_6972_6c6f_636b;
        let mut client = pool.get().await.map_err(pool_error)?;
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        let migrated = super::migrations::runner().run_async(&mut **client).await;
        client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await?;
        migrated.map_err(StoreError::Migrate)?;
        Ok(Db::Postgres(pool))
    }

    /// Runs a statement; returns how many rows it changed.
    pub async fn execute(&self, sql: &str, params: &[Value<'_>]) -> Result<u64, StoreError> {
        match self {
            Db::Sqlite(conn) => {
                let n = lock(conn).execute(&sqlite_sql(sql), rusqlite::params_from_iter(params))?;
                Ok(n as u64)
            }
            Db::Postgres(pool) => {
                let client = pool.get().await.map_err(pool_error)?;
                Ok(client.execute(sql, &postgres_params(params)).await?)
            }
        }
    }

    /// Runs a query; `read` makes each row into a `T`.
    pub async fn query<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        read: impl Fn(&Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        match self {
            Db::Sqlite(conn) => {
                let conn = lock(conn);
                let mut stmt = conn.prepare(&sqlite_sql(sql))?;
                let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
                let mut all = Vec::new();
                while let Some(row) = rows.next()? {
                    all.push(read(&Row::Sqlite(row))?);
                }
                Ok(all)
            }
            Db::Postgres(pool) => {
                let client = pool.get().await.map_err(pool_error)?;
                let rows = client.query(sql, &postgres_params(params)).await?;
                rows.iter().map(|row| read(&Row::Postgres(row))).collect()
            }
        }
    }

    /// Runs one write whose `WHERE` checks what it may do (a quota, a name still free), as if
    /// no other write ran at the same time, so that two gateways admitting at once cannot both
    /// pass a check only one of them may. SQLite runs one statement at a time anyway;
    /// PostgreSQL runs it `SERIALIZABLE`, retrying when it had to give way to a concurrent
    /// write. Returns how many rows it changed.
    pub async fn admit(&self, sql: &str, params: &[Value<'_>]) -> Result<u64, StoreError> {
        let Db::Postgres(pool) = self else {
            return self.execute(sql, params).await;
        };
        let mut client = pool.get().await.map_err(pool_error)?;
        let mut attempt = 0;
        loop {
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::Serializable)
                .start()
                .await?;
            let outcome = match tx.execute(sql, &postgres_params(params)).await {
                Ok(n) => tx.commit().await.map(|()| n),
                Err(e) => Err(e),
            };
            match outcome {
                Err(e) if is_serialization_failure(&e) && attempt < ADMIT_ATTEMPTS => {
                    attempt += 1;
                    // Apart, so that the writes that collided do not collide again.
                    let pause = 2 * attempt + rand::random::<u64>() % (4 * attempt);
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                outcome => return Ok(outcome?),
            }
        }
    }

    /// Runs the statements in one transaction, in order, and commits only if `keep` holds for
    /// how many rows each changed (else nothing of it stays). Returns those counts if it
    /// committed. For writes that must all happen or none (a template with its builds, tags
    /// that are all there to remove).
    pub async fn transaction(
        &self,
        statements: &[Statement<'_>],
        keep: impl Fn(&[u64]) -> bool,
    ) -> Result<Option<Vec<u64>>, StoreError> {
        match self {
            Db::Sqlite(conn) => {
                let mut conn = lock(conn);
                let tx = conn.transaction()?;
                let mut changed = Vec::with_capacity(statements.len());
                for s in statements {
                    let params = rusqlite::params_from_iter(s.params.iter());
                    changed.push(tx.execute(&sqlite_sql(s.sql), params)? as u64);
                }
                if !keep(&changed) {
                    return Ok(None); // dropped: rolled back
                }
                tx.commit()?;
                Ok(Some(changed))
            }
            Db::Postgres(pool) => {
                let mut client = pool.get().await.map_err(pool_error)?;
                let tx = client.transaction().await?;
                let mut changed = Vec::with_capacity(statements.len());
                for s in statements {
                    changed.push(tx.execute(s.sql, &postgres_params(&s.params)).await?);
                }
                if !keep(&changed) {
                    tx.rollback().await?;
                    return Ok(None);
                }
                tx.commit().await?;
                Ok(Some(changed))
            }
        }
    }

    /// Runs the statements in one transaction: all of them, or none if one fails.
    pub async fn batch(&self, statements: &[Statement<'_>]) -> Result<(), StoreError> {
        self.transaction(statements, |_| true).await.map(drop)
    }

    /// The first row of a query, if any.
    pub async fn query_opt<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        read: impl Fn(&Row) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        Ok(self.query(sql, params, read).await?.into_iter().next())
    }
}

/// How often [`Db::admit`] tries again after giving way to a concurrent write.
const ADMIT_ATTEMPTS: u64 = 20;

fn is_serialization_failure(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE)
}

/// A connection the pool could not give: the database's own error if it answered, else
/// unavailable (no answer in time, or the pool closed).
pub(super) fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => StoreError::Postgres(e),
        other => StoreError::Unavailable(other.to_string()),
    }
}

pub(super) fn lock(conn: &Mutex<rusqlite::Connection>) -> MutexGuard<'_, rusqlite::Connection> {
    conn.lock().unwrap_or_else(|e| e.into_inner())
}

/// `$1` as SQLite's `?1`, which binds by number as PostgreSQL's does (SQLite would read `$1` as
/// a name). The store's SQL has no `$` in its literals.
fn sqlite_sql(sql: &str) -> Cow<'_, str> {
    if sql.contains('$') {
        Cow::Owned(sql.replace('$', "?"))
    } else {
        Cow::Borrowed(sql)
    }
}

fn postgres_params<'a>(params: &'a [Value<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

impl rusqlite::ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Value::Int(n) => ValueRef::Integer(n),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Null => ValueRef::Null,
        }))
    }
}

impl ToSql for Value<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match *self {
            Value::Int(n) => n.to_sql_checked(ty, out),
            Value::Text(s) => s.to_sql_checked(ty, out),
            Value::Null => Ok(IsNull::Yes),
        }
    }

    /// Which of them fits is checked per value, when it is written.
    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty) || <&str as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_bind_by_number_on_sqlite() {
        assert_eq!(sqlite_sql("SELECT $2, $1, $2"), "SELECT ?2, ?1, ?2");
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let got: (String, i64) = conn
            .query_row(
                &sqlite_sql("SELECT $2, $1 + $1"),
                rusqlite::params_from_iter([Value::Int(20), Value::Text("b")]),
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(got, ("b".into(), 40));
    }
}
