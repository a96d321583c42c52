//! PostgreSQL, for when one machine is not enough: several harness
//! instances share one database. Work on a run holds a session-level
//! advisory lock on it for the whole call (`AdvisoryClaim`); a run's status
//! moves also lock its row (`SELECT … FOR UPDATE`). Lazy outcome commits
//! turn `synchronous_commit` off for their own transaction (DESIGN.md §9).

use crate::saga::model::Durability;
use crate::store::sql::saga_store_sql;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Connections in the pool, and how many of them run claims may hold.
/// A claim keeps its connection for a whole call. The call's step writes
/// go down that connection, but its other reads and writes (a held step,
/// a compensation, the dashboard's pages) take pool connections: were
/// every connection a claim, those would wait for one forever (64
/// concurrent runs on 32 connections did, before the cap).
const POOL_SIZE: u32 = 32;
const MAX_CLAIMS: usize = POOL_SIZE as usize / 2;

pub struct PostgresStore {
    pool: PgPool,
    claims: Arc<tokio::sync::Semaphore>,
    held: HeldRuns,
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
            claims: Arc::new(tokio::sync::Semaphore::new(MAX_CLAIMS)),
            held: HeldRuns::default(),
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

/// A claimed run's connection, shared between the claim and the store's
/// writes for that run while the claim is held.
type ClaimConn = Arc<tokio::sync::Mutex<PoolConnection<Postgres>>>;

/// The connections of the runs this store has claimed, by run.
type HeldRuns = Arc<std::sync::Mutex<HashMap<uuid::Uuid, ClaimConn>>>;

/// A slot and a connection on their way to holding a run's lock. Dropped
/// before the lock is confirmed (the caller gave up while waiting), the
/// connection is closed: it may still get the lock, and closing the
/// session is what releases it.
struct PendingClaim {
    conn: Option<PoolConnection<Postgres>>,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for PendingClaim {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            conn.close_on_drop();
        }
    }
}

/// A connection holding the session-level advisory lock of one run. While
/// it is held, the store's writes for that run go down this connection
/// (no pool hand-off per statement). The lock is released off the caller's
/// path when the claim is dropped: a spawned task waits for any write still
/// on the connection, unlocks and returns the connection. Whenever the
/// lock's state is in doubt (the unlock failed, no runtime to unlock on)
/// the connection is closed instead, and closing the session releases it.
pub struct AdvisoryClaim {
    conn: ClaimConn,
    run_id: uuid::Uuid,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
    held: HeldRuns,
}
impl crate::saga::store::RunClaim for AdvisoryClaim {}

const LOCK_RUN: &str = "SELECT pg_advisory_lock(hashtext('saga-run'), hashtext($1))";
const UNLOCK_RUN: &str = "SELECT pg_advisory_unlock(hashtext('saga-run'), hashtext($1))";

impl Drop for AdvisoryClaim {
    fn drop(&mut self) {
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if held
                .get(&self.run_id)
                .is_some_and(|c| Arc::ptr_eq(c, &self.conn))
            {
                held.remove(&self.run_id);
            }
        }
        let conn = self.conn.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if let Ok(mut conn) = conn.try_lock() {
                conn.close_on_drop();
            }
            return;
        };
        let run_id = self.run_id.to_string();
        let slot = self.slot.take();
        runtime.spawn(async move {
            let mut conn = conn.lock().await;
            let unlocked: Result<bool, _> = sqlx::query_scalar(UNLOCK_RUN)
                .bind(run_id)
                .fetch_one(&mut **conn)
                .await;
            if !matches!(unlocked, Ok(true)) {
                conn.close_on_drop();
            }
            drop(conn);
            drop(slot);
        });
    }
}

/// Where a write for one run goes: down the run's claim when this store
/// holds it, else a connection from the pool.
enum RunConn {
    Claimed(tokio::sync::OwnedMutexGuard<PoolConnection<Postgres>>),
    Pooled(PoolConnection<Postgres>),
}

impl std::ops::Deref for RunConn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            RunConn::Claimed(conn) => conn,
            RunConn::Pooled(conn) => conn,
        }
    }
}

impl std::ops::DerefMut for RunConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            RunConn::Claimed(conn) => conn,
            RunConn::Pooled(conn) => conn,
        }
    }
}

impl PostgresStore {
    /// A claim slot and a connection, not yet locked.
    async fn pending_claim(&self) -> StoreResult<PendingClaim> {
        let slot = self
            .claims
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Database("the store is closing".into()))?;
        let conn = self.pool.acquire().await.map_err(db)?;
        Ok(PendingClaim {
            conn: Some(conn),
            slot: Some(slot),
        })
    }

    /// The pending claim's lock is confirmed: the claim is registered so
    /// that this run's writes use its connection.
    fn locked_claim(
        &self,
        run_id: uuid::Uuid,
        mut pending: PendingClaim,
    ) -> StoreResult<AdvisoryClaim> {
        let conn = pending
            .conn
            .take()
            .map(|c| Arc::new(tokio::sync::Mutex::new(c)))
            .ok_or_else(|| StoreError::Database("a run claim lost its connection".into()))?;
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(run_id, conn.clone());
        Ok(AdvisoryClaim {
            conn,
            run_id,
            slot: pending.slot.take(),
            held: self.held.clone(),
        })
    }

    /// The connection for a write to `run_id` (see `RunConn`).
    async fn run_conn(&self, run_id: uuid::Uuid) -> StoreResult<RunConn> {
        let claimed = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&run_id)
            .cloned();
        match claimed {
            Some(conn) => Ok(RunConn::Claimed(conn.lock_owned().await)),
            None => Ok(RunConn::Pooled(self.pool.acquire().await.map_err(db)?)),
        }
    }

    async fn claim(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<Box<dyn crate::saga::store::RunClaim>> {
        let mut pending = self.pending_claim().await?;
        if let Some(conn) = pending.conn.as_mut() {
            sqlx::query(LOCK_RUN)
                .bind(run_id.to_string())
                .execute(&mut **conn)
                .await
                .map_err(db)?;
        }
        Ok(Box::new(self.locked_claim(run_id, pending)?))
    }

    /// The claim, the run and its unsettled steps in one round trip: three
    /// statements sent as one simple query. Each statement takes its own
    /// snapshot after the one before it finished, so the reads see every
    /// commit made by the claim's previous holder. (A single statement that
    /// locked and read would read from a snapshot taken before the wait.)
    /// The run id is the only value in the text, as a UUID's hex digits.
    async fn claim_and_read_here(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<crate::saga::store::ClaimedRun> {
        use futures::TryStreamExt as _;
        let mut pending = self.pending_claim().await?;
        let id = run_id.hyphenated().to_string();
        let batch = format!(
            "SELECT pg_advisory_lock(hashtext('saga-run'), hashtext('{id}'));
             SELECT * FROM runs WHERE id = '{id}';
             SELECT * FROM saga_log WHERE run_id = '{id}' AND status IN {unsettled} ORDER BY step_idx;
             SELECT * FROM saga_log WHERE run_id = '{id}' AND owed_to_agent AND status NOT IN {unsettled}",
            unsettled = crate::store::sql::unsettled_sql!()
        );
        let rows = match pending.conn.as_mut() {
            Some(conn) => sqlx::raw_sql(&batch)
                .fetch(&mut **conn)
                .try_collect()
                .await
                .map_err(db)?,
            None => Vec::new(),
        };
        let claim = self.locked_claim(run_id, pending)?;
        let read = run_and_unsettled(&rows)?;
        Ok(crate::saga::store::ClaimedRun {
            claim: Box::new(claim),
            read,
        })
    }

    /// The intent row in one statement (one round trip, one commit): the
    /// guarded counter update, the row and its audit line. When the run's
    /// counter does not match nothing is written, and a second query says
    /// why.
    async fn record_step_alone(&self, new: NewStep, actor: &Actor) -> StoreResult<Step> {
        check_new_step(&new)?;
        let mut conn = self.run_conn(new.run_id).await?;
        let now = Utc::now();
        let query = sqlx::query(concat!(
            "WITH advanced AS (
                UPDATE runs SET next_step = next_step + 1,
                    irreversible_before_pivot = irreversible_before_pivot + $12, updated_at = $11
                WHERE id = $1 AND next_step = $2
                RETURNING id
             ), inserted AS (",
            crate::store::sql::new_step_insert!(),
            " FROM advanced RETURNING *
             ), logged AS (
                INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status,
                    detail, at)
                SELECT run_id, 'step', step_idx, $13, NULL, status, $14, $11 FROM inserted
             )
             SELECT * FROM inserted"
        ));
        let row = bind_new_step(query, &new, now)
            .bind(i64::from(counts_as_irreversible(&new)))
            .bind(actor.to_string())
            .bind(step_event_detail(&new))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db_error(e, || format!("idempotency key {}", new.idempotency_key)))?;
        match row {
            Some(row) => step_from(&row),
            None => Err(why_step_refused(&mut conn, new.run_id, new.step_idx).await),
        }
    }

    /// An outcome in one statement: the compare-and-set, its audit line,
    /// and for a lazy commit `synchronous_commit = off` for this statement's
    /// own transaction only. (`settle_step` sends a held step released by
    /// a person down the general path instead.)
    async fn settle_step_alone(
        &self,
        run_id: uuid::Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Step> {
        let mut conn = self.run_conn(run_id).await?;
        // A durable commit keeps whatever the server is set to.
        let commit_mode = (durability == Durability::Lazy).then_some("off");
        let query = sqlx::query(concat!(
            "WITH commit_mode AS (
                SELECT set_config('synchronous_commit',
                    COALESCE($9, current_setting('synchronous_commit')), true) AS mode
             ), settled AS (",
            crate::store::sql::outcome_cas!(
                "saga_log",
                " AND (SELECT mode FROM commit_mode) IS NOT NULL"
            ),
            "), logged AS (
                INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status,
                    detail, at)
                SELECT run_id, 'step', step_idx, $10, $8, $1, $11, $5 FROM settled
             )
             SELECT * FROM settled"
        ));
        let row = bind_outcome(query, &outcome, Utc::now(), run_id, step_idx)
            .bind(commit_mode)
            .bind(actor.to_string())
            .bind(settle_event_detail(&outcome))
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        match row {
            Some(row) => step_from(&row),
            None => Err(step_not_settled(&mut conn, run_id, step_idx, outcome.from).await),
        }
    }
}

saga_store_sql!(
    PostgresStore,
    Postgres,
    Backend::Postgres,
    for_update = " FOR UPDATE"
);
