//! The embedded default: one SQLite file in WAL mode, used by one harness
//! process at a time.
//!
//! Writes go through a single connection (SQLite has one writer anyway, and
//! queuing in the pool is cheaper than `SQLITE_BUSY` retries); reads use a
//! pool of read-only connections that WAL lets run beside the writer.
//! INTENDED rows commit with `synchronous = FULL` (durable on power loss);
//! lazy outcome commits use `NORMAL` (DESIGN.md §9).

use crate::saga::model::Durability;
use crate::saga::model::*;
use crate::saga::status::*;
use crate::saga::store::{Backend, SagaStore, StoreError, StoreResult};
use crate::store::group_commit::{GroupWriter, WriteJob};
use crate::store::sql::{
    check_new_step, counts_as_irreversible, db, db_error, settle_event_detail, step_event_detail,
    Dialect, Sql,
};
use chrono::Utc;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct SqliteStore {
    writer: SqlitePool,
    readers: SqlitePool,
    /// Whether the writer was last set to `synchronous = NORMAL`.
    synchronous_is_normal: Arc<AtomicBool>,
    /// The step writes, grouped into shared commits.
    group: GroupWriter,
    /// Held for the life of the store: a second harness on the same file is
    /// refused at start-up instead of corrupting the single-writer design.
    _lock: File,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url`, takes the
    /// one-process lock and applies the migrations.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad SQLite URL {url:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let path = options.get_filename().to_path_buf();
        if path.as_os_str() == ":memory:" || path.as_os_str().is_empty() {
            return Err(StoreError::Invalid(
                "an in-memory SQLite database would lose the saga log on exit; give a file, e.g. sqlite://saga-harness.db".into(),
            ));
        }
        let lock = take_process_lock(&path)?;
        // A pool normally pings a connection before lending it out; an
        // in-process SQLite connection cannot have gone away, and the ping
        // would be one more hop to its worker thread on every step.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await
            .map_err(|e| StoreError::database(format!("cannot open {}", path.display()), e))?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&writer)
            .await
            .map_err(|e| StoreError::database(format!("migrating {}", path.display()), e))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(8)
            .test_before_acquire(false)
            .connect_with(options.read_only(true))
            .await
            .map_err(|e| StoreError::database(format!("cannot open {}", path.display()), e))?;
        let synchronous_is_normal = Arc::new(AtomicBool::new(false));
        Ok(SqliteStore {
            group: GroupWriter::start(writer.clone(), synchronous_is_normal.clone()),
            writer,
            readers,
            synchronous_is_normal,
            _lock: lock,
        })
    }

    /// The writer pool, shared with the session store so that sign-ins do
    /// not contend with the saga log for the write lock.
    pub fn session_pool(&self) -> SqlitePool {
        self.writer.clone()
    }

    /// What the step writer has done so far (see `store::group_commit`).
    pub fn commit_groups(&self) -> crate::store::group_commit::GroupCounts {
        self.group.counts()
    }

    /// Whether this store can take calls now: the file answers and its
    /// migrations are the ones this build needs.
    pub async fn readiness(&self) -> Result<(), String> {
        let needed = newest_migration_needed();
        let applied: Option<i64> =
            sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(&self.readers)
                .await
                .map_err(|e| format!("the SQLite file does not answer: {e}"))?;
        super::migrations_current(applied, needed)
    }

    /// Connections open and idle, the writer's and the readers' together.
    pub fn pool_use(&self) -> super::PoolUse {
        let (writer, readers) = (
            super::PoolUse::of(&self.writer),
            super::PoolUse::of(&self.readers),
        );
        super::PoolUse {
            open: writer.open.saturating_add(readers.open),
            idle: writer.idle.saturating_add(readers.idle),
            max: writer.max.saturating_add(readers.max),
        }
    }

    pub async fn close(&self) {
        self.readers.close().await;
        self.writer.close().await;
    }
}

/// The writes of an intent, for `WriteJob`: each write after the counter
/// runs only when the one before it changed a row (SQLite has no
/// data-modifying CTE).
macro_rules! intent {
    () => {
        intent!("")
    };
    ($also:expr) => {
        concat!(
            sweep_limits!(),
            "UPDATE runs SET next_step = next_step + 1,
            irreversible_before_pivot = irreversible_before_pivot + $12, updated_at = $11
         WHERE id = $1 AND next_step = $2",
            $also,
            within_limits!(),
            ";",
            crate::store::sql::new_step_insert!(),
            " WHERE changes() = 1 RETURNING *;
             INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status, detail, at)
             SELECT $1, 'step', $2, $13, NULL, $7, $14, $11 WHERE changes() = 1;
             INSERT INTO limit_usage (scope, run_id, step_idx, amount, at)
             SELECT json_extract(c.value, '$.scope'), $1, $2, json_extract(c.value, '$.amount'),
                 julianday('now')
             FROM json_each($17, '$.charges') AS c WHERE changes() = 1;"
        )
    };
}

/// The limits of an intent: `$17` is the step's limits (JSON, or NULL for
/// none). `sweep_limits!` runs first: the counted rows that have left an
/// enforced charge's rolling window since its last check leave its
/// scope's sum (migration 0008; a scope with no totals row yet has
/// counted nothing). `within_limits!` is
/// then a condition of the intent's guarded write: every enforced charge
/// fits under its maximum with the scope's sum. One process writes the
/// file and each job's statements run in turn, so each check reads the
/// sums every earlier intent left; the intent's usage rows add themselves
/// (a trigger), so an intent that is not written counts nothing.
macro_rules! sweep_limits {
    () => {
        concat!(
            "UPDATE limit_totals
             SET used = used - (SELECT coalesce(sum(u.amount), 0) FROM limit_usage u
                     JOIN saga_log s ON s.run_id = u.run_id AND s.step_idx = u.step_idx
                     WHERE u.scope = limit_totals.scope AND u.at > limit_totals.swept_at
                         AND u.at <= julianday('now') - w.window_s / 86400.0
                         AND s.status IN ",
            crate::store::sql::counted_sql!(),
            "),
                 swept_at = julianday('now') - w.window_s / 86400.0
             FROM (SELECT json_extract(c.value, '$.scope') AS scope,
                          json_extract(c.value, '$.window_s') AS window_s
                   FROM json_each($17, '$.charges') AS c
                   WHERE json_extract($17, '$.enforce') = 1) AS w
             WHERE limit_totals.scope = w.scope AND w.window_s IS NOT NULL
                 AND EXISTS (SELECT 1 FROM limit_usage u
                     WHERE u.scope = limit_totals.scope AND u.at > limit_totals.swept_at
                         AND u.at <= julianday('now') - w.window_s / 86400.0);"
        )
    };
}

macro_rules! within_limits {
    () => {
        " AND ($17 IS NULL OR json_extract($17, '$.enforce') = 0 OR NOT EXISTS (
            SELECT 1 FROM json_each($17, '$.charges') AS c
            WHERE json_extract(c.value, '$.amount')
                + coalesce((SELECT t.used FROM limit_totals t
                            WHERE t.scope = json_extract(c.value, '$.scope')), 0)
                > json_extract(c.value, '$.max')))"
    };
}

/// The extra test of the hot path's intent (see `claim_and_record_step`):
/// the run is the agent's (`$15`), RUNNING, and has no step unsettled or
/// owed to the agent, and the bearer's token to check (`$16`), if any, is
/// the agent's and not revoked.
macro_rules! ready_run {
    () => {
        concat!(
            " AND agent = $15 AND status = 'RUNNING'
             AND ($16 IS NULL OR EXISTS (SELECT 1 FROM api_tokens
                 WHERE token_hash = $16 AND agent = $15 AND revoked_at IS NULL))
             AND NOT EXISTS (SELECT 1 FROM saga_log WHERE run_id = $1 AND status IN ",
            crate::store::sql::unsettled_sql!(),
            ")
             AND NOT EXISTS (SELECT 1 FROM saga_log WHERE run_id = $1 AND owed_to_agent = 1)"
        )
    };
}

/// The writes of an outcome, for `WriteJob`.
macro_rules! settle {
    () => {
        concat!(
            crate::store::sql::outcome_cas!("saga_log"),
            ";
             INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status, detail, at)
             SELECT $6, 'step', $7, $9, $8, $1, $10, $5 WHERE changes() = 1;"
        )
    };
}

/// The values bound to `query`, for a job that runs them under other text.
fn job_args(
    mut query: sqlx::query::Query<'static, Sqlite, SqliteArguments<'static>>,
) -> StoreResult<SqliteArguments<'static>> {
    use sqlx::Execute as _;
    query
        .take_arguments()
        .map_err(|e| StoreError::Invalid(format!("a value could not be bound: {e}")))
        .map(Option::unwrap_or_default)
}

pub struct NoClaim;
impl crate::saga::store::RunClaim for NoClaim {}

fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

fn take_process_lock(db: &Path) -> StoreResult<File> {
    let path = lock_path(db);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            StoreError::database(format!("cannot create lock file {}", path.display()), e)
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(StoreError::Invalid(format!(
            "{} is in use by another saga-harness process. A SQLite saga log has one harness at a time: \
             stop the other process, or point every instance at PostgreSQL (DATABASE_URL=postgres://...)",
            db.display()
        ))),
        Err(TryLockError::Error(e)) => Err(StoreError::database(
            format!("cannot lock {}", path.display()),
            e,
        )),
    }
}

impl Dialect for SqliteStore {
    type Db = Sqlite;
    type Reader = PoolConnection<Sqlite>;
    const BACKEND: Backend = Backend::Sqlite;
    const RUN_FOR_UPDATE: &'static str = concat!("SELECT * FROM runs WHERE id = $1", "");
    const APPROVAL_FOR_UPDATE: &'static str = concat!("SELECT * FROM approvals WHERE id = $1", "");
    const LIMIT_USED: &'static str = concat!(
        "SELECT coalesce((SELECT t.used - (SELECT coalesce(sum(u.amount), 0) FROM limit_usage u
                 JOIN saga_log s ON s.run_id = u.run_id AND s.step_idx = u.step_idx
                 WHERE u.scope = t.scope AND u.at > t.swept_at AND $2 IS NOT NULL
                     AND u.at <= julianday('now') - $2 / 86400.0 AND s.status IN ",
        crate::store::sql::counted_sql!(),
        ") FROM limit_totals t WHERE t.scope = $1), 0) AS used"
    );
    const LIMIT_PEAK: &'static str = concat!(
        "SELECT coalesce(max(t.used - (SELECT coalesce(sum(u.amount), 0) FROM limit_usage u
                 JOIN saga_log s ON s.run_id = u.run_id AND s.step_idx = u.step_idx
                 WHERE u.scope = t.scope AND u.at > t.swept_at AND $2 IS NOT NULL
                     AND u.at <= julianday('now') - $2 / 86400.0 AND s.status IN ",
        crate::store::sql::counted_sql!(),
        ")), 0) AS used FROM limit_totals t WHERE substr(t.scope, 1, length($1)) = $1"
    );
    const USAGE_INSERT: &'static str =
        "INSERT INTO limit_usage (scope, run_id, step_idx, amount, at)
         VALUES ($1, $2, $3, $4, julianday('now'))";

    async fn read_conn(&self) -> StoreResult<PoolConnection<Sqlite>> {
        self.readers.acquire().await.map_err(db)
    }

    /// The writer connection, set to the durability this commit needs.
    /// SQLite refuses to change it inside a transaction, so it is set here.
    /// The writer, set to `durability`. The pragma is sent only when the
    /// setting changes: `synchronous_is_normal` is set after the pragma ran,
    /// so when it is wrong (the pool opened a fresh connection, which starts
    /// at FULL) the connection is at FULL, the safe side.
    async fn write(&self, durability: Durability) -> StoreResult<PoolConnection<Sqlite>> {
        let mut conn = self.writer.acquire().await.map_err(db)?;
        let want_normal = durability == Durability::Lazy;
        if self.synchronous_is_normal.load(Ordering::Acquire) != want_normal {
            let pragma = if want_normal {
                "PRAGMA synchronous = NORMAL"
            } else {
                "PRAGMA synchronous = FULL"
            };
            sqlx::query(pragma).execute(&mut *conn).await.map_err(db)?;
            self.synchronous_is_normal
                .store(want_normal, Ordering::Release);
        }
        Ok(conn)
    }

    /// An in-process SQLite connection keeps its prepared statements.
    fn keeps_statements() -> bool {
        true
    }

    async fn lazy_commit(_tx: &mut SqliteConnection, _durability: Durability) -> StoreResult<()> {
        Ok(())
    }

    async fn claim(
        &self,
        _run_id: uuid::Uuid,
    ) -> StoreResult<Box<dyn crate::saga::store::RunClaim>> {
        Ok(Box::new(NoClaim))
    }

    async fn claim_now(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<Option<Box<dyn crate::saga::store::RunClaim>>> {
        self.claim(run_id).await.map(Some)
    }

    async fn claim_and_read_here(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<crate::saga::store::ClaimedRun> {
        let rows = sqlx::query(concat!(
            "SELECT * FROM runs WHERE id = $1;
             SELECT * FROM saga_log WHERE run_id = $1 AND status IN ",
            crate::store::sql::unsettled_sql!(),
            " ORDER BY step_idx;
             SELECT * FROM saga_log WHERE run_id = $1 AND owed_to_agent = 1 AND status NOT IN ",
            crate::store::sql::unsettled_sql!(),
        ))
        .bind(run_id.to_string())
        .fetch_all(&self.readers)
        .await
        .map_err(db)?;
        let read = Sql::<SqliteStore>::run_and_unsettled(&rows)?;
        Ok(crate::saga::store::ClaimedRun {
            claim: self.claim(run_id).await?,
            read,
        })
    }

    /// The hot path: the intent, written only if the run is ready for it,
    /// in the same grouped commit as any other intent. (The claim is free:
    /// one process owns the file.)
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
        let args = job_args(
            Sql::<SqliteStore>::bind_new_step(sqlx::query(""), &new, Utc::now())
                .bind(i64::from(counts_as_irreversible(&new)))
                .bind(actor.to_string())
                .bind(step_event_detail(&new))
                .bind(bearer.agent.to_owned())
                .bind(bearer.token_to_check.map(str::to_owned))
                .bind(crate::store::sql::limits_json(&new)),
        )?;
        let rows = self
            .group
            .write(WriteJob {
                alone: concat!(
                    "PRAGMA synchronous = FULL; BEGIN IMMEDIATE;",
                    intent!(ready_run!()),
                    "COMMIT;"
                ),
                grouped: concat!("SAVEPOINT job;", intent!(ready_run!()), "RELEASE job;"),
                args,
                durability: Durability::Durable,
            })
            .await
            .map_err(|e| db_error(e, || format!("idempotency key {}", new.idempotency_key)))?;
        match rows.first() {
            Some(row) => Ok(Some((
                Box::new(NoClaim),
                Sql::<SqliteStore>::step_from(row)?,
            ))),
            None => Ok(None),
        }
    }

    /// Nothing to give back: the outcome alone.
    async fn settle_step_and_release_here(
        &self,
        run_id: uuid::Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
        _claim: &mut dyn crate::saga::store::RunClaim,
    ) -> StoreResult<Step> {
        self.settle_step(run_id, step_idx, outcome, durability, actor)
            .await
    }

    /// The intent row: the guarded counter update, the row and its audit
    /// line, committed at `synchronous = FULL` (see `intent!`). A counter
    /// that does not match writes nothing, and a second query says why.
    async fn record_step_alone(&self, new: NewStep, actor: &Actor) -> StoreResult<Step> {
        check_new_step(&new)?;
        let now = Utc::now();
        let args = job_args(
            Sql::<SqliteStore>::bind_new_step(sqlx::query(""), &new, now)
                .bind(i64::from(counts_as_irreversible(&new)))
                .bind(actor.to_string())
                .bind(step_event_detail(&new))
                // `$15` and `$16` are the hot path's (`ready_run!`).
                .bind(None::<String>)
                .bind(None::<String>)
                .bind(crate::store::sql::limits_json(&new)),
        )?;
        let rows = self
            .group
            .write(WriteJob {
                alone: concat!(
                    "PRAGMA synchronous = FULL; BEGIN IMMEDIATE;",
                    intent!(),
                    "COMMIT;"
                ),
                grouped: concat!("SAVEPOINT job;", intent!(), "RELEASE job;"),
                args,
                durability: Durability::Durable,
            })
            .await
            .map_err(|e| db_error(e, || format!("idempotency key {}", new.idempotency_key)))?;
        match rows.first() {
            Some(row) => Sql::<SqliteStore>::step_from(row),
            None => {
                let mut conn = self.write(Durability::Durable).await?;
                if let Some(over) = Sql::<SqliteStore>::over_limit(&mut conn, &new.limits).await? {
                    return Err(over);
                }
                Err(Sql::<SqliteStore>::why_step_refused(&mut conn, new.run_id, new.step_idx).await)
            }
        }
    }

    /// An outcome: the compare-and-set and its audit line, at the
    /// durability asked for (see `settle!`). (`settle_step` sends a held
    /// step released by a person down the general path instead.)
    async fn settle_step_alone(
        &self,
        run_id: uuid::Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Step> {
        let args = job_args(
            Sql::<SqliteStore>::bind_outcome(
                sqlx::query(""),
                &outcome,
                Utc::now(),
                run_id,
                step_idx,
            )
            .bind(actor.to_string())
            .bind(settle_event_detail(&outcome)),
        )?;
        let alone = match durability {
            Durability::Durable => {
                concat!(
                    "PRAGMA synchronous = FULL; BEGIN IMMEDIATE;",
                    settle!(),
                    "COMMIT;"
                )
            }
            Durability::Lazy => {
                concat!(
                    "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE;",
                    settle!(),
                    "COMMIT;"
                )
            }
        };
        let rows = self
            .group
            .write(WriteJob {
                alone,
                grouped: concat!("SAVEPOINT job;", settle!(), "RELEASE job;"),
                args,
                durability,
            })
            .await
            .map_err(db)?;
        match rows.first() {
            Some(row) => Sql::<SqliteStore>::step_from(row),
            None => {
                let mut conn = self.write(durability).await?;
                Err(
                    Sql::<SqliteStore>::step_not_settled(&mut conn, run_id, step_idx, outcome.from)
                        .await,
                )
            }
        }
    }
}

/// The newest migration this build carries for SQLite.
pub fn newest_migration_needed() -> i64 {
    super::newest_migration(&sqlx::migrate!("./migrations/sqlite"))
}
