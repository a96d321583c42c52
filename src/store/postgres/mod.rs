//! PostgreSQL, for when one machine is not enough: several harness
//! instances share one database.
//!
//! Work on a run is serialised across instances by a lease in the run's row
//! (`LeaseClaim`): a compare-and-set takes it, and no connection or lock is
//! held while the call that needed it waits on its system. A holder renews
//! its lease while it works; one that dies stops renewing, and once the
//! lease is over another instance takes the run and reconciles whatever was
//! in flight (R7). A run's status moves also lock its row (`SELECT … FOR
//! UPDATE`) inside their own transaction. Lazy outcome commits turn
//! `synchronous_commit` off for their own transaction (DESIGN.md §9).
//!
//! Behind a transaction-pooling PgBouncer (`StoreSettings::
//! pg_transaction_pooler`) no prepared statement outlives its transaction:
//! the statement cache is off and every statement runs inside an explicit
//! transaction, so PgBouncer never hands its halves to two servers.

use crate::saga::model::Durability;
use crate::saga::model::*;
use crate::saga::status::*;
use crate::saga::store::{Backend, SagaStore, StoreError, StoreResult};
use crate::store::sql::{
    approves_individually, check_new_step, counts_as_irreversible, db, db_error, step_event_detail,
    Dialect, Sql,
};
use crate::store::StoreSettings;
use chrono::Utc;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool, Postgres};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod step_writes;

pub use step_writes::GROUPS_IN_FLIGHT;
use step_writes::{Intent, Settle, StepWrite, StepWriter};

/// Connections in the pool. None is held across a tool call, so this bounds
/// statements in progress, not calls in flight.
pub const POOL_SIZE: u32 = 32;

static KEEP_STATEMENTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

pub struct PostgresStore {
    pool: PgPool,
    settings: StoreSettings,
    /// The first half of every lease token this store writes.
    instance: String,
    /// Leases this store has let go of whose release may not have reached
    /// the database yet, by run: the next claim of that run here may take
    /// it over directly instead of waiting for the release.
    released: Released,
    /// When a statement last found its connection broken (milliseconds
    /// since the epoch, 0 for never): connections opened before it are
    /// discarded instead of lent out, so a server restart costs one failed
    /// statement, which is retried, not one per pooled connection.
    broken_at: Arc<AtomicI64>,
    /// The hot path's step writes, grouped (see `step_writes`).
    writer: StepWriter,
}

/// Per run, this store's own leases let go of and maybe not yet released
/// in the database (the newest last, at most [`HANDOVERS_KEPT`]): its next
/// claim of the run may take over from any of them.
type Released = Arc<std::sync::Mutex<HashMap<uuid::Uuid, Vec<String>>>>;

/// How many let-go leases of one run are remembered: a claim whose answer
/// was lost, then its re-send's, then that one's … during one outage.
const HANDOVERS_KEPT: usize = 4;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Whether `err` says the connection itself broke (the server restarted,
/// the network dropped): the statement may be sent again on a fresh
/// connection, and pooled connections opened before now are suspect
/// (`broken_at`).
fn connection_broke(err: &sqlx::Error, broken_at: &AtomicI64) -> bool {
    let broke = matches!(err, sqlx::Error::Io(_) | sqlx::Error::Protocol(_))
        || matches!(err, sqlx::Error::Database(e)
            if e.code().is_some_and(|c| c.starts_with("57P") || c.starts_with("08")));
    if broke {
        broken_at.store(now_ms(), Ordering::Release);
    }
    broke
}

impl PostgresStore {
    /// Connects to `url` and applies the migrations.
    pub async fn open(url: &str, settings: &StoreSettings) -> StoreResult<Self> {
        if let Some(name) = &settings.instance_id {
            crate::store::instance_id(name)
                .map_err(|why| StoreError::Invalid(format!("instance name {name:?}: {why}")))?;
        }
        let mut options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad PostgreSQL URL: {e}")))?;
        if settings.pg_transaction_pooler {
            options = options.statement_cache_capacity(0);
            KEEP_STATEMENTS.store(false, Ordering::Relaxed);
        } else {
            // Every statement here looks rows up by key, so one plan fits
            // all values. Without this, each of the pool's connections
            // plans each statement afresh for its first five runs, and the
            // step writes' statements take longer to plan (about 0.7 ms)
            // than to run. (A pooler would refuse the startup parameter;
            // behind one, statements are unnamed and planned every time.)
            options = options.options([("plan_cache_mode", "force_generic_plan")]);
        }
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
            .map_err(|e| StoreError::database(format!("cannot reach PostgreSQL at {place}"), e))?;
        probe.close().await.map_err(db)?;
        let broken_at = Arc::new(AtomicI64::new(0));
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(Duration::from_millis(settings.store_wait_ms))
            // No liveness ping per statement: a broken connection is found
            // by the statement that uses it (see `broken_at`).
            .test_before_acquire(false)
            .before_acquire({
                let broken_at = broken_at.clone();
                move |_conn, meta| {
                    let broken = broken_at.load(Ordering::Acquire);
                    let opened = now_ms() - meta.age.as_millis() as i64;
                    Box::pin(async move { Ok(broken == 0 || opened > broken) })
                }
            })
            .connect_with(options)
            .await
            .map_err(|e| StoreError::database(format!("cannot reach PostgreSQL at {place}"), e))?;
        let store = PostgresStore {
            writer: StepWriter::start(
                pool.clone(),
                settings.pg_transaction_pooler,
                broken_at.clone(),
            ),
            pool,
            instance: settings
                .instance_id
                .clone()
                .unwrap_or_else(|| format!("anonymous-{}", uuid::Uuid::new_v4().simple())),
            settings: settings.clone(),
            released: Released::default(),
            broken_at,
        };
        store.migrate().await.map_err(|e| match e {
            StoreError::Database { source, .. } => StoreError::Database {
                context: format!("migrating PostgreSQL at {place}"),
                source,
            },
            other => other,
        })?;
        if settings.instance_id.is_some() {
            store.take_back_leases().await?;
        }
        Ok(store)
    }

    /// Applies the migrations. Behind a transaction pooler they are only
    /// checked: the migrator keeps a session lock and reads outside a
    /// transaction, which a pooler cannot carry, so they are applied with
    /// `saga-harness migrate` against PostgreSQL itself.
    async fn migrate(&self) -> StoreResult<()> {
        let migrator = sqlx::migrate!("./migrations/postgres");
        if !self.settings.pg_transaction_pooler {
            return migrator
                .run(&self.pool)
                .await
                .map_err(|e| StoreError::database("migrating", e));
        }
        let needed = super::newest_migration(&migrator);
        let applied = self.applied_migration().await.ok().flatten();
        match applied {
            Some(version) if version >= needed => Ok(()),
            applied => Err(StoreError::Invalid(format!(
                "the database behind the transaction pooler is at migration {}, and this harness \
                 needs {needed}: run `saga-harness migrate` with DATABASE_URL naming PostgreSQL \
                 itself (not the pooler), then start again",
                applied.map_or("none".to_owned(), |v| v.to_string())
            ))),
        }
    }

    /// The newest migration applied to the database; an unreachable
    /// database is an error.
    async fn applied_migration(&self) -> StoreResult<Option<i64>> {
        let rows = self
            .simple_query("SELECT max(version) AS version FROM _sqlx_migrations WHERE success")
            .await?;
        Ok(rows
            .first()
            .and_then(|r| sqlx::Row::try_get(r, "version").ok()))
    }

    /// Whether this store can take calls now: PostgreSQL answers and its
    /// migrations are the ones this build needs.
    pub async fn readiness(&self) -> Result<(), String> {
        let needed = newest_migration_needed();
        let applied = self
            .applied_migration()
            .await
            .map_err(|e| format!("PostgreSQL does not answer: {e}"))?;
        super::migrations_current(applied, needed)
    }

    /// Connections open and idle in the pool.
    pub fn pool_use(&self) -> super::PoolUse {
        super::PoolUse::of(&self.pool)
    }

    /// Clears the leases this instance's previous life left behind: under
    /// the same name, that life is over. (The name was checked to hold no
    /// quote.)
    async fn take_back_leases(&self) -> StoreResult<()> {
        let sql = format!(
            "UPDATE runs SET lease_owner = NULL, lease_until = NULL \
             WHERE starts_with(lease_owner, '{}/')",
            self.instance
        );
        let taken = sqlx::raw_sql(&sql).execute(&self.pool).await.map_err(db)?;
        if taken.rows_affected() > 0 {
            tracing::info!(
                runs = taken.rows_affected(),
                instance = %self.instance,
                "took back the runs this instance held before it restarted"
            );
        }
        Ok(())
    }

    /// Whether the URL names a transaction pooler (see `StoreSettings`).
    pub fn behind_pooler(&self) -> bool {
        self.settings.pg_transaction_pooler
    }

    pub fn session_pool(&self) -> PgPool {
        self.pool.clone()
    }

    /// A connection for statements outside the caller's own transaction:
    /// plain, or behind a transaction pooler inside one (`Session::finish`
    /// commits it).
    async fn session(&self) -> StoreResult<Session> {
        let conn = self.pool.acquire().await.map_err(db)?;
        if !self.settings.pg_transaction_pooler {
            return Ok(Session::Plain(conn));
        }
        let tx = sqlx::Transaction::begin(conn, None).await.map_err(db)?;
        Ok(Session::Pooled(tx))
    }

    /// See `connection_broke`.
    fn broke(&self, err: &sqlx::Error) -> bool {
        connection_broke(err, &self.broken_at)
    }

    /// What the hot path's step writer has done so far: `jobs / groups` is
    /// how many step writes shared each statement and commit.
    pub fn commit_groups(&self) -> crate::store::group_commit::GroupCounts {
        self.writer.counts()
    }
}

/// Where statements outside a caller's transaction go: a pooled connection,
/// or behind a transaction pooler a transaction of their own.
pub(crate) enum Session {
    Plain(PoolConnection<Postgres>),
    Pooled(sqlx::Transaction<'static, Postgres>),
}

impl Session {
    /// Commits what a pooled session wrote.
    async fn finish(self) -> Result<(), sqlx::Error> {
        match self {
            Session::Plain(_) => Ok(()),
            Session::Pooled(tx) => tx.commit().await,
        }
    }
}

impl std::ops::Deref for Session {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Session::Plain(conn) => conn,
            Session::Pooled(tx) => tx,
        }
    }
}

impl std::ops::DerefMut for Session {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Session::Plain(conn) => conn,
            Session::Pooled(tx) => tx,
        }
    }
}

/// A run's lease, held by this store until dropped. A task renews it every
/// third of its length while held; dropping it stops the renewal and
/// releases the lease off the caller's path.
pub struct LeaseClaim {
    run_id: uuid::Uuid,
    token: String,
    pool: PgPool,
    /// Until when the lease is sure to hold, by this process's clock.
    fence: Arc<Fence>,
    released: Released,
    renewal: tokio::task::JoinHandle<()>,
    /// A statement of the holder's already released the lease.
    given_back: bool,
}
impl crate::saga::store::RunClaim for LeaseClaim {
    fn fence(&self) -> Option<Arc<dyn crate::saga::store::LeaseFence>> {
        Some(self.fence.clone())
    }

    fn lease_token(&self) -> Option<&str> {
        (!self.given_back).then_some(self.token.as_str())
    }

    fn given_back(&mut self) {
        self.given_back = true;
        self.renewal.abort();
    }
}

impl Drop for LeaseClaim {
    fn drop(&mut self) {
        self.renewal.abort();
        if self.given_back {
            return;
        }
        give_back(
            self.run_id,
            self.token.clone(),
            self.pool.clone(),
            self.released.clone(),
        );
    }
}

/// What a lease must outlast a call by, for the clock rates of two
/// machines and the time between the check and the request leaving.
pub const CALL_MARGIN: Duration = Duration::from_secs(1);

/// A lease as this process's monotonic clock sees it. The database's clock
/// decides when a lease runs out for everyone else, so the holder counts
/// conservatively on its own: from the moment it *sent* the statement that
/// took or renewed the lease, never from the answer. No synchronised wall
/// clocks are assumed, only that both clocks run at about the same rate.
pub struct Fence {
    run_id: uuid::Uuid,
    renew_sql: String,
    pool: PgPool,
    lease: Duration,
    state: Mutex<FenceState>,
}

struct FenceState {
    /// The lease holds at least until then.
    sure_until: tokio::time::Instant,
    /// A renewal found the run in another holder's lease.
    lost: bool,
}

impl Fence {
    /// The lease was taken or renewed by a statement sent at `sent`.
    fn renewed(&self, sent: tokio::time::Instant) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.sure_until = state.sure_until.max(sent + self.lease);
    }

    fn lose(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).lost = true;
    }

    /// Renews the lease now; `Ok(false)` when it is another holder's, or
    /// when the answer came back only after the renewed lease would have
    /// run out. The process was then paused with the statement in flight
    /// (it left before a SIGSTOP took hold, say), and a renewal that held
    /// back then proves nothing about now.
    async fn renew(&self) -> Result<bool, sqlx::Error> {
        let sent = tokio::time::Instant::now();
        let done = sqlx::raw_sql(&self.renew_sql).execute(&self.pool).await?;
        let in_time = tokio::time::Instant::now() < sent + self.lease;
        if done.rows_affected() == 1 && in_time {
            self.renewed(sent);
            Ok(true)
        } else {
            self.lose();
            Ok(false)
        }
    }
}

#[async_trait::async_trait]
impl crate::saga::store::LeaseFence for Fence {
    async fn confirm(&self, call: Duration) -> StoreResult<()> {
        // A call sent now is answered (or given up on) while the lease
        // still holds, even if this process stops renewing it mid-call:
        // no other instance can take the run and look the key up before
        // the request has had its time. A lease shorter than that is
        // renewed before every call, the best it can do (the server warns
        // at start).
        let margin = (call + CALL_MARGIN).min(self.lease).max(self.lease / 3);
        {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.lost {
                // A renewal found it first (after a pause, the renewer and
                // this check race to wake).
                tracing::warn!(run_id = %self.run_id, "the run was taken over while this process was paused; nothing is sent");
                return Err(StoreError::LeaseLost);
            }
            if state
                .sure_until
                .saturating_duration_since(tokio::time::Instant::now())
                >= margin
            {
                return Ok(());
            }
        }
        // Less left than a renewal period: the process was paused (or the
        // renewals failed). Only the database can say whose the run is now.
        tracing::warn!(run_id = %self.run_id, "a run's lease is nearly out by this process's clock; confirming it before sending");
        match self.renew().await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(run_id = %self.run_id, "the run was taken over while this process was paused; nothing is sent");
                Err(StoreError::LeaseLost)
            }
            Err(err) => Err(db(err)),
        }
    }
}

/// A lease asked for and not yet confirmed: dropped before then (the
/// caller gave up while the claim was on its way, or its answer was lost
/// with its connection), whatever it may have taken is released, and
/// until that release is known to have landed, this process's next claim
/// of the run may take the lease over from it directly.
struct PendingLease {
    run_id: uuid::Uuid,
    token: String,
    pool: Option<PgPool>,
    released: Released,
}

impl Drop for PendingLease {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else {
            return;
        };
        give_back(self.run_id, self.token.clone(), pool, self.released.clone());
    }
}

/// Gives back a lease this process no longer uses. Until the release is
/// known to have landed (the database may be unreachable just then), the
/// token stays this process's handover for the run, so its next claim does
/// not wait for a lease nobody holds to run out.
fn give_back(run_id: uuid::Uuid, token: String, pool: PgPool, released: Released) {
    {
        let mut released = released.lock().unwrap_or_else(|p| p.into_inner());
        let tokens = released.entry(run_id).or_default();
        tokens.retain(|t| *t != token);
        tokens.push(token.clone());
        let over = tokens.len().saturating_sub(HANDOVERS_KEPT);
        tokens.drain(..over);
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to release on: the lease runs out on its own.
        return;
    };
    runtime.spawn(async move {
        let sql = release_sql(run_id, &token);
        match sqlx::raw_sql(&sql).execute(&pool).await {
            // A store closing gives nothing back; the lease runs out.
            Ok(_) | Err(sqlx::Error::PoolClosed) => {}
            Err(err) => {
                tracing::warn!(%run_id, %err, "a run's lease was not released; this instance takes it over at its next claim, any other once it runs out");
                return;
            }
        }
        let mut released = released.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tokens) = released.get_mut(&run_id) {
            tokens.retain(|t| *t != token);
            if tokens.is_empty() {
                released.remove(&run_id);
            }
        }
    });
}

/// Taking and giving back a lease commit without waiting for the WAL flush
/// (for their own implicit transaction only). A lease lost to a database
/// crash costs nothing: the WAL is written in order, so the step's durable
/// intent, the first write that matters, flushes the lease before it; and a
/// lost release only makes the next holder wait for the lease to run out.
const LAZY_COMMIT: &str = "SELECT set_config('synchronous_commit', 'off', true) AS lazy_commit;";

/// Gives a run's lease back if `token` still holds it (a later holder's
/// lease is left alone). The token is hex and a checked instance name.
fn release_sql(run_id: uuid::Uuid, token: &str) -> String {
    format!(
        "{LAZY_COMMIT} UPDATE runs SET lease_owner = NULL, lease_until = NULL \
         WHERE id = '{run_id}' AND lease_owner = '{token}'"
    )
}

/// A claim on a run that does not exist: nothing to serialise.
struct NoRun;
impl crate::saga::store::RunClaim for NoRun {}

impl PostgresStore {
    /// Takes the run's lease and reads the run (the row the lease was
    /// written to), its unsettled steps and its steps owed to the agent, in
    /// one round trip: three statements sent as one simple Sql::<PostgresStore>::query (no
    /// prepared statement, so a transaction pooler keeps them together).
    /// The steps' read takes its own snapshot after the lease's statement
    /// ended, so it sees every commit of the lease's previous holder (one
    /// statement reading and writing would read from a snapshot taken
    /// before any wait for the row). The values in the text are a UUID, a
    /// hex token and a number, all made here.
    ///
    /// A lease held by another holder is waited for (polling, backing off)
    /// up to `wait`, then refused as `RunBusy`.
    async fn lease_and_read(
        &self,
        run_id: uuid::Uuid,
        wait: Duration,
    ) -> StoreResult<crate::saga::store::ClaimedRun> {
        let id = run_id.hyphenated().to_string();
        let lease_ms = self.settings.run_lease_ms;
        let deadline = tokio::time::Instant::now() + wait;
        let mut pause = Duration::from_millis(2);
        loop {
            let token = format!("{}/{}", self.instance, uuid::Uuid::new_v4().simple());
            let handover = match self.handover(run_id).as_slice() {
                [] => String::new(),
                tokens => format!(" OR lease_owner IN ('{}')", tokens.join("', '")),
            };
            let batch = format!(
                "{LAZY_COMMIT}
                 UPDATE runs SET lease_owner = '{token}',
                     lease_until = clock_timestamp() + interval '{lease_ms} milliseconds'
                 WHERE id = '{id}' AND (lease_owner IS NULL OR lease_until < clock_timestamp(){handover})
                 RETURNING *;
                 SELECT * FROM saga_log WHERE run_id = '{id}' AND status IN {unsettled}
                 UNION ALL
                 SELECT * FROM saga_log WHERE run_id = '{id}' AND owed_to_agent
                     AND status NOT IN {unsettled}
                 ORDER BY step_idx",
                unsettled = crate::store::sql::unsettled_sql!()
            );
            let mut pending = PendingLease {
                run_id,
                token: token.clone(),
                pool: Some(self.pool.clone()),
                released: self.released.clone(),
            };
            let sent = tokio::time::Instant::now();
            let rows = self.simple_query(&batch).await?;
            pending.pool = None;
            // The run's row comes back only with the lease.
            let read = Sql::<PostgresStore>::run_and_unsettled(&rows)?;
            if read.run.is_some() {
                return Ok(crate::saga::store::ClaimedRun {
                    claim: Box::new(self.lease_claim(run_id, token, sent)),
                    read,
                });
            }
            let exists = self
                .simple_query(&format!("SELECT 1 AS found FROM runs WHERE id = '{id}'"))
                .await?;
            if exists.is_empty() {
                return Ok(crate::saga::store::ClaimedRun {
                    claim: Box::new(NoRun),
                    read: Default::default(),
                });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::RunBusy {
                    waited_ms: wait.as_millis() as u64,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Statements without parameters, sent as one simple query; sent again
    /// once on a fresh connection when the first one found its connection
    /// broken.
    async fn simple_query(&self, sql: &str) -> StoreResult<Vec<sqlx::postgres::PgRow>> {
        use futures::TryStreamExt as _;
        match sqlx::raw_sql(sql).fetch(&self.pool).try_collect().await {
            Err(err) if self.broke(&err) => sqlx::raw_sql(sql)
                .fetch(&self.pool)
                .try_collect()
                .await
                .map_err(db),
            other => other.map_err(db),
        }
    }

    /// A confirmed lease, taken by a statement sent at `sent`, renewed
    /// while held.
    fn lease_claim(
        &self,
        run_id: uuid::Uuid,
        token: String,
        sent: tokio::time::Instant,
    ) -> LeaseClaim {
        let lease_ms = self.settings.run_lease_ms;
        let fence = Arc::new(Fence {
            run_id,
            renew_sql: format!(
                "UPDATE runs SET lease_until = clock_timestamp() + interval '{lease_ms} milliseconds' \
                 WHERE id = '{run_id}' AND lease_owner = '{token}'"
            ),
            pool: self.pool.clone(),
            lease: Duration::from_millis(lease_ms),
            state: Mutex::new(FenceState {
                sure_until: sent + Duration::from_millis(lease_ms),
                lost: false,
            }),
        });
        let renewal = tokio::spawn({
            let fence = fence.clone();
            async move {
                let every = Duration::from_millis(lease_ms / 3);
                loop {
                    tokio::time::sleep(every).await;
                    match fence.renew().await {
                        Ok(true) => {}
                        Ok(false) => {
                            // Another instance took the run after the lease
                            // ran out: this holder sends nothing more, and
                            // its outcome writes are compare-and-sets that
                            // lose to whatever the other did.
                            tracing::warn!(%run_id, "a run's lease was lost while held");
                            return;
                        }
                        Err(err) => tracing::warn!(%run_id, %err, "a run's lease was not renewed"),
                    }
                }
            }
        });
        LeaseClaim {
            run_id,
            token,
            pool: self.pool.clone(),
            fence,
            released: self.released.clone(),
            renewal,
            given_back: false,
        }
    }

    /// One attempt at `record_step_alone`; `Err` is the driver's error.
    async fn try_record_step(
        &self,
        new: &NewStep,
        actor: &Actor,
    ) -> Result<StoreResult<Step>, sqlx::Error> {
        let _turn = self.writer.stripes().hold(&new.limits).await;
        let mut conn = match self.session().await {
            Ok(conn) => conn,
            Err(err) => return Ok(Err(err)),
        };
        let now = Utc::now();
        let statement = Sql::<PostgresStore>::query(concat!(
            "WITH advanced AS (
                UPDATE runs SET next_step = next_step + 1,
                    irreversible_before_pivot = irreversible_before_pivot + $12, updated_at = $11
                WHERE id = $1 AND next_step = $2",
            step_writes::within_limits!("$15"),
            "
                RETURNING id
             ), inserted AS (",
            crate::store::sql::new_step_insert!(),
            " FROM advanced RETURNING *
             ), logged AS (
                INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status,
                    detail, at)
                SELECT run_id, 'step', step_idx, $13, NULL, status, $14, $11 FROM inserted
             ),",
            step_writes::usage_insert!("$15"),
            "
             SELECT * FROM inserted"
        ));
        let row = Sql::<PostgresStore>::bind_new_step(statement, new, now)
            .bind(i64::from(counts_as_irreversible(new)))
            .bind(actor.to_string())
            .bind(step_event_detail(new))
            .bind(crate::store::sql::limits_json(new))
            .fetch_optional(&mut *conn)
            .await?;
        let result = match row {
            Some(row) => Sql::<PostgresStore>::step_from(&row),
            None => {
                if let Some(over) = Sql::<PostgresStore>::over_limit(&mut conn, &new.limits)
                    .await
                    .transpose()
                {
                    conn.finish().await?;
                    return Ok(over.and_then(Err));
                }
                Err(
                    Sql::<PostgresStore>::why_step_refused(&mut conn, new.run_id, new.step_idx)
                        .await,
                )
            }
        };
        conn.finish().await?;
        Ok(result)
    }

    /// `settle_step_alone`, giving back in the same statement the lease
    /// `release` names, if it still holds the run. The write goes in the
    /// next group (`step_writes`); when it moved nothing, a read says why.
    /// An outcome whose statement had to be sent twice and finds the step
    /// already at this outcome had landed the first time.
    async fn settle_step_releasing(
        &self,
        run_id: uuid::Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
        release: Option<&str>,
    ) -> StoreResult<Step> {
        let from = outcome.from;
        let to = outcome.to;
        let settle = Settle {
            run_id,
            step_idx,
            outcome,
            lazy: durability == Durability::Lazy,
            actor: actor.to_string(),
            release: release.map(str::to_owned),
        };
        let written = self
            .writer
            .write(StepWrite::Outcome(settle))
            .await
            .map_err(db)?;
        if let Some(row) = &written.row {
            return Sql::<PostgresStore>::step_from(row);
        }
        let mut conn = self.session().await?;
        let why = Sql::<PostgresStore>::step_not_settled(&mut conn, run_id, step_idx, from).await;
        conn.finish().await.map_err(db)?;
        if written.sent_twice && matches!(why, StoreError::Stale { .. }) {
            if let Some(step) = self.step(run_id, step_idx).await? {
                if step.status == to {
                    return Ok(step);
                }
            }
        }
        Err(why)
    }
}

impl PostgresStore {
    /// The lease tokens this store's claims of the run let go of whose
    /// release may not have reached the database yet: the next claim here
    /// may take the run over from any of them directly.
    fn handover(&self, run_id: uuid::Uuid) -> Vec<String> {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&run_id)
            .cloned()
            .unwrap_or_default()
    }
}

impl Dialect for PostgresStore {
    type Db = Postgres;
    type Reader = Session;
    const BACKEND: Backend = Backend::Postgres;
    const RUN_FOR_UPDATE: &'static str = concat!("SELECT * FROM runs WHERE id = $1", " FOR UPDATE");
    const APPROVAL_FOR_UPDATE: &'static str =
        concat!("SELECT * FROM approvals WHERE id = $1", " FOR UPDATE");
    const LIMIT_USED: &'static str = concat!(
        "SELECT coalesce((SELECT t.used - (SELECT coalesce(sum(u.amount), 0) FROM limit_usage u
                 JOIN saga_log s ON s.run_id = u.run_id AND s.step_idx = u.step_idx
                 WHERE u.scope = t.scope AND u.at > t.swept_at AND $2::int8 IS NOT NULL
                     AND u.at <= now() - $2 * interval '1 second' AND s.status IN ",
        crate::store::sql::counted_sql!(),
        ") FROM limit_totals t WHERE t.scope = $1), 0)::int8 AS used"
    );
    const LIMIT_PEAK: &'static str = concat!(
        "SELECT coalesce(max(t.used - (SELECT coalesce(sum(u.amount), 0) FROM limit_usage u
                 JOIN saga_log s ON s.run_id = u.run_id AND s.step_idx = u.step_idx
                 WHERE u.scope = t.scope AND u.at > t.swept_at AND $2::int8 IS NOT NULL
                     AND u.at <= now() - $2 * interval '1 second' AND s.status IN ",
        crate::store::sql::counted_sql!(),
        ")), 0)::int8 AS used FROM limit_totals t WHERE left(t.scope, length($1)) = $1"
    );
    const USAGE_INSERT: &'static str =
        "INSERT INTO limit_usage (scope, run_id, step_idx, amount, at)
         VALUES ($1, $2, $3, $4, now())";

    /// A connection for reads (see `Session`).
    async fn read_conn(&self) -> StoreResult<Session> {
        self.session().await
    }

    async fn write(&self, _durability: Durability) -> StoreResult<PoolConnection<Postgres>> {
        self.pool.acquire().await.map_err(db)
    }

    /// Whether statements stay prepared on their connection: not behind a
    /// transaction pooler, which may give the next transaction another
    /// server. (Process-wide: one pooled store in a process makes every
    /// PostgreSQL store send its statements unnamed, which is slower but
    /// right everywhere.)
    fn keeps_statements() -> bool {
        KEEP_STATEMENTS.load(Ordering::Relaxed)
    }

    /// Lets this transaction's commit return before its WAL is flushed; the
    /// next durable commit flushes it (the WAL is written in order).
    async fn lazy_commit(tx: &mut PgConnection, durability: Durability) -> StoreResult<()> {
        if durability == Durability::Lazy {
            Sql::<PostgresStore>::query("SET LOCAL synchronous_commit = off")
                .execute(tx)
                .await
                .map_err(db)?;
        }
        Ok(())
    }

    async fn claim(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<Box<dyn crate::saga::store::RunClaim>> {
        Ok(self.claim_and_read_here(run_id).await?.claim)
    }

    async fn claim_now(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<Option<Box<dyn crate::saga::store::RunClaim>>> {
        match self.lease_and_read(run_id, Duration::ZERO).await {
            Ok(claimed) => Ok(Some(claimed.claim)),
            Err(StoreError::RunBusy { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    async fn claim_and_read_here(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<crate::saga::store::ClaimedRun> {
        self.lease_and_read(run_id, Duration::from_millis(self.settings.run_wait_ms))
            .await
    }

    /// The hot path's claim and intent in one write, grouped with other
    /// runs' step writes (`step_writes`): the run's row is advanced and
    /// leased only if it is ready, then the step and its audit line are
    /// written from it. A run that is not ready gets nothing written and
    /// its caller goes down the general path. A statement that found its
    /// connection broken is sent once more; if the first had landed, the
    /// second writes nothing, the pending lease is released, and the
    /// general path finds the step logged.
    async fn claim_and_record_step_here(
        &self,
        bearer: Bearer<'_>,
        new: NewStep,
        actor: &Actor,
    ) -> StoreResult<Option<(Box<dyn crate::saga::store::RunClaim>, Step)>> {
        check_new_step(&new)?;
        if new.status != StepStatus::Intended {
            return Ok(None);
        }
        let token = format!("{}/{}", self.instance, uuid::Uuid::new_v4().simple());
        let mut pending = PendingLease {
            run_id: new.run_id,
            token: token.clone(),
            pool: Some(self.pool.clone()),
            released: self.released.clone(),
        };
        let (run_id, key) = (new.run_id, new.idempotency_key.clone());
        let intent = Intent {
            handover: self.handover(run_id),
            new,
            agent: bearer.agent.to_owned(),
            token: bearer.token_to_check.map(str::to_owned),
            actor: actor.to_string(),
            lease_owner: token.clone(),
            lease_ms: self.settings.run_lease_ms as i64,
        };
        let sent = tokio::time::Instant::now();
        let written = self
            .writer
            .write(StepWrite::Intent(intent))
            .await
            .map_err(|e| db_error(e, || format!("idempotency key {key}")))?;
        let Some(row) = written.row else {
            return Ok(None);
        };
        let step = Sql::<PostgresStore>::step_from(&row)?;
        pending.pool = None;
        Ok(Some((
            Box::new(self.lease_claim(run_id, token, sent)),
            step,
        )))
    }

    /// `settle_step` and, in the same statement, the lease given back if
    /// this claim still holds it (a later holder's lease is left alone).
    async fn settle_step_and_release_here(
        &self,
        run_id: uuid::Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
        claim: &mut dyn crate::saga::store::RunClaim,
    ) -> StoreResult<Step> {
        let Some(token) = claim.lease_token().map(str::to_owned) else {
            return self
                .settle_step(run_id, step_idx, outcome, durability, actor)
                .await;
        };
        check_step_transition(Lifecycle::Step, outcome.from, outcome.to)?;
        if approves_individually(&outcome) {
            return self
                .settle_step(run_id, step_idx, outcome, durability, actor)
                .await;
        }
        let settled = self
            .settle_step_releasing(run_id, step_idx, outcome, durability, actor, Some(&token))
            .await?;
        claim.given_back();
        Ok(settled)
    }

    /// The intent row in one statement (one round trip, one commit): the
    /// guarded counter update, the row and its audit line. When the run's
    /// counter does not match nothing is written, and a second query says
    /// why. A statement that found its connection broken is sent once more;
    /// if the first one had landed, the second finds the step it wrote.
    async fn record_step_alone(&self, new: NewStep, actor: &Actor) -> StoreResult<Step> {
        check_new_step(&new)?;
        let taken = || format!("idempotency key {}", new.idempotency_key);
        match self.try_record_step(&new, actor).await {
            Ok(result) => result,
            Err(err) if self.broke(&err) => {
                match self
                    .try_record_step(&new, actor)
                    .await
                    .map_err(|e| db_error(e, taken))?
                {
                    Err(StoreError::StepExists { step_idx }) => {
                        match self.step(new.run_id, step_idx).await? {
                            Some(step) if step.idempotency_key == new.idempotency_key => Ok(step),
                            _ => Err(StoreError::StepExists { step_idx }),
                        }
                    }
                    other => other,
                }
            }
            Err(err) => Err(db_error(err, taken)),
        }
    }

    /// An outcome in one write, grouped with other runs' step writes
    /// (`step_writes`): the compare-and-set and its audit line, committed
    /// lazily when `durability` allows and nothing else in its group needs
    /// a flush. (`settle_step` sends a held step released by a person down
    /// the general path instead.)
    async fn settle_step_alone(
        &self,
        run_id: uuid::Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Step> {
        self.settle_step_releasing(run_id, step_idx, outcome, durability, actor, None)
            .await
    }
}

/// The newest migration this build carries for PostgreSQL.
pub fn newest_migration_needed() -> i64 {
    super::newest_migration(&sqlx::migrate!("./migrations/postgres"))
}
