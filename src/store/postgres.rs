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

/// Connections in the pool.
const MAX_CONNECTIONS: u32 = 32;

/// How many run claims may hold a connection at once. A claim keeps its
/// connection (and its advisory lock) for the whole call, and the call needs
/// another connection for its own queries: were every connection a claim,
/// every caller would wait for a connection none of them gives back, until
/// the pool's timeout failed them all (seen under 200 concurrent runs).
/// Half the pool stays free for the work the claims are waiting on.
const MAX_CLAIMS: usize = MAX_CONNECTIONS as usize / 2;

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
            .max_connections(MAX_CONNECTIONS)
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
    // Dropped after the transaction (fields drop in order): the connection
    // is back in the pool before the next claim may take one.
    _permit: tokio::sync::OwnedSemaphorePermit,
}
impl crate::saga::store::RunClaim for AdvisoryClaim {}

impl PostgresStore {
    async fn claim(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<Box<dyn crate::saga::store::RunClaim>> {
        let permit = self
            .claims
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| StoreError::Database(format!("claiming run {run_id}: {e}")))?;
        let mut tx = self.pool.begin().await.map_err(db)?;
        // Two 32-bit halves of the run id's hash space: "saga" runs only.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('saga-run'), hashtext($1))")
            .bind(run_id.to_string())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        Ok(Box::new(AdvisoryClaim {
            _tx: tx,
            _permit: permit,
        }))
    }
}

saga_store_sql!(
    PostgresStore,
    Postgres,
    Backend::Postgres,
    for_update = " FOR UPDATE"
);
