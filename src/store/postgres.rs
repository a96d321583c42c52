//! PostgreSQL, for when one machine is not enough: several harness
//! instances share one database. Per-run serialisation uses row locks
//! (`SELECT … FOR UPDATE` on the run), and lazy outcome commits use
//! `SET LOCAL synchronous_commit = off` (DESIGN.md §9).

use crate::saga::model::Durability;
use crate::store::sql::saga_store_sql;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};
use std::str::FromStr;
use std::time::Duration;

/// Connections in the pool, and how many of them run claims may hold.
/// A claim keeps its connection for a whole call while the call's writes
/// take others: were every connection a claim, the writes would wait for
/// a connection forever (64 concurrent runs on 32 connections did).
const POOL_SIZE: u32 = 32;
const MAX_CLAIMS: usize = POOL_SIZE as usize / 2;

pub struct PostgresStore {
    pool: PgPool,
    claims: std::sync::Arc<tokio::sync::Semaphore>,
}

impl PostgresStore {
    /// Connects to `url` and applies the migrations.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad PostgreSQL URL: {e}")))?;
        let place = format!(
            "{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("(default database)")
        );
        // One direct attempt first: a pool retries until its timeout, but a
        // refused connection or a wrong password should be reported now.
        let probe = sqlx::PgConnection::connect_with(&options)
            .await
            .map_err(|e| {
                StoreError::Database(format!("cannot reach PostgreSQL at {place}: {e}"))
            })?;
        probe.close().await.map_err(db)?;
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(|e| {
                StoreError::Database(format!("cannot reach PostgreSQL at {place}: {e}"))
            })?;
        sqlx::migrate!("./migrations/postgres")
            .run(&pool)
            .await
            .map_err(|e| StoreError::Database(format!("migrating PostgreSQL at {place}: {e}")))?;
        Ok(PostgresStore {
            pool,
            claims: std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CLAIMS)),
        })
    }

    pub fn session_pool(&self) -> PgPool {
        self.pool.clone()
    }

    fn reader(&self) -> &PgPool {
        &self.pool
    }

    async fn write(&self, _durability: Durability) -> StoreResult<PoolConnection<Postgres>> {
        self.pool.acquire().await.map_err(db)
    }

    /// Lets this transaction's commit return before its WAL is flushed; the
    /// next durable commit flushes it (the WAL is written in order).
    async fn lazy_commit(tx: &mut PgConnection, durability: Durability) -> StoreResult<()> {
        if durability == Durability::Lazy {
            sqlx::query("SET LOCAL synchronous_commit = off")
                .execute(tx)
                .await
                .map_err(db)?;
        }
        Ok(())
    }
}

/// A transaction holding `pg_advisory_xact_lock` on the run: dropping it
/// rolls the (empty) transaction back, which releases the lock, even if the
/// holder panicked.
pub struct AdvisoryClaim {
    _tx: sqlx::Transaction<'static, Postgres>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}
impl crate::saga::store::RunClaim for AdvisoryClaim {}

impl PostgresStore {
    async fn claim(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<Box<dyn crate::saga::store::RunClaim>> {
        let slot = self
            .claims
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Database("the store is closing".into()))?;
        let mut tx = self.pool.begin().await.map_err(db)?;
        // Two 32-bit halves of the run id's hash space: "saga" runs only.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('saga-run'), hashtext($1))")
            .bind(run_id.to_string())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        Ok(Box::new(AdvisoryClaim {
            _tx: tx,
            _slot: slot,
        }))
    }
}

saga_store_sql!(
    PostgresStore,
    Postgres,
    Backend::Postgres,
    for_update = " FOR UPDATE"
);
