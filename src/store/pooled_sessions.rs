//! Dashboard sessions on PostgreSQL behind a transaction-pooling PgBouncer.
//!
//! tower-sessions' own PostgreSQL store sends single statements outside a
//! transaction, and sqlx prepares a statement in one exchange and runs it
//! in the next: a transaction pooler may give the two exchanges to two
//! servers. This store keeps the same table and record encoding, but runs
//! every statement unnamed, inside a transaction of its own, so the pooler
//! keeps each one on one server. Without a pooler the crate's store is used.

use async_trait::async_trait;
use sqlx::{PgPool, Postgres};
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{self, ExpiredDeletion, SessionStore};

const TABLE: &str = r#""tower_sessions"."session""#;

#[derive(Clone, Debug)]
pub struct PooledSessions {
    pool: PgPool,
}

fn backend(err: impl std::fmt::Display) -> session_store::Error {
    session_store::Error::Backend(err.to_string())
}

impl PooledSessions {
    pub fn new(pool: PgPool) -> Self {
        PooledSessions { pool }
    }

    /// The table tower-sessions' PostgreSQL store uses, created if missing
    /// (one simple query: nothing is prepared).
    pub async fn migrate(&self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            r#"CREATE SCHEMA IF NOT EXISTS "tower_sessions";
               CREATE TABLE IF NOT EXISTS "tower_sessions"."session" (
                   id text PRIMARY KEY NOT NULL,
                   data bytea NOT NULL,
                   expiry_date timestamptz NOT NULL
               )"#,
        )
        .execute(&self.pool)
        .await
        .map(drop)
    }

    async fn begin(&self) -> session_store::Result<sqlx::Transaction<'static, Postgres>> {
        self.pool.begin().await.map_err(backend)
    }
}

fn statement(sql: &str) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql).persistent(false)
}

async fn upsert(conn: &mut sqlx::PgConnection, record: &Record) -> session_store::Result<()> {
    let data = rmp_serde::to_vec(record).map_err(backend)?;
    statement(&format!(
        "INSERT INTO {TABLE} (id, data, expiry_date) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET data = excluded.data, expiry_date = excluded.expiry_date"
    ))
    .bind(record.id.to_string())
    .bind(data)
    .bind(record.expiry_date)
    .execute(conn)
    .await
    .map_err(backend)?;
    Ok(())
}

#[async_trait]
impl SessionStore for PooledSessions {
    async fn create(&self, record: &mut Record) -> session_store::Result<()> {
        let mut tx = self.begin().await?;
        let exists = format!("SELECT 1 FROM {TABLE} WHERE id = $1");
        while statement(&exists)
            .bind(record.id.to_string())
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?
            .is_some()
        {
            record.id = Id::default();
        }
        upsert(&mut tx, record).await?;
        tx.commit().await.map_err(backend)
    }

    async fn save(&self, record: &Record) -> session_store::Result<()> {
        let mut tx = self.begin().await?;
        upsert(&mut tx, record).await?;
        tx.commit().await.map_err(backend)
    }

    async fn load(&self, id: &Id) -> session_store::Result<Option<Record>> {
        let mut tx = self.begin().await?;
        let data: Option<Vec<u8>> = sqlx::query_scalar(&format!(
            "SELECT data FROM {TABLE} WHERE id = $1 AND expiry_date > $2"
        ))
        .persistent(false)
        .bind(id.to_string())
        .bind(time::OffsetDateTime::now_utc())
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        data.map(|bytes| rmp_serde::from_slice(&bytes).map_err(backend))
            .transpose()
    }

    async fn delete(&self, id: &Id) -> session_store::Result<()> {
        let mut tx = self.begin().await?;
        statement(&format!("DELETE FROM {TABLE} WHERE id = $1"))
            .bind(id.to_string())
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }
}

#[async_trait]
impl ExpiredDeletion for PooledSessions {
    async fn delete_expired(&self) -> session_store::Result<()> {
        let mut tx = self.begin().await?;
        statement(&format!(
            "DELETE FROM {TABLE} WHERE expiry_date < (now() AT TIME ZONE 'utc')"
        ))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }
}
