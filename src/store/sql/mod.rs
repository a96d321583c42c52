//! The SQL both backends share: the queries are written once in the common
//! dialect (`$n` parameters, `RETURNING`, `ON CONFLICT`), in one generic
//! `impl SagaStore` over [`Dialect`], the small trait of what each backend
//! does its own way (connections, durability, row locks, its hot path;
//! sqlite.rs and postgres/).

use crate::saga::class::{Audience, Phase, Role, ToolClass};
use crate::saga::model::*;
use crate::saga::names::UnknownName;
use crate::saga::status::*;
use crate::saga::store::{
    Backend, ClaimedRun, RunClaim, RunsPage, SagaStore, StoreError, StoreResult,
};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::types::Json;
use sqlx::{Connection as _, Row as _};
use std::future::Future;
use uuid::Uuid;

/// Maps a driver error; unique violations become `Duplicate { what }`.
pub(crate) fn db_error(err: sqlx::Error, what: impl FnOnce() -> String) -> StoreError {
    match &err {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Duplicate { what: what() }
        }
        _ => db(err),
    }
}

/// Maps a driver error: `Unavailable` when the database could not be
/// reached or could not take the write, `Database` for anything else.
pub(crate) fn db(err: sqlx::Error) -> StoreError {
    if unreachable(&err) {
        StoreError::Unavailable {
            cause: err.to_string(),
        }
    } else {
        StoreError::database("database error", err)
    }
}

/// Whether the database could not be reached or could not take the write
/// now, rather than refusing the statement itself: the request may be sent
/// again as it stands once the database is back.
pub(crate) fn unreachable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(e) => {
            if let Some(sqlite) = e.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
                // SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN (primary codes,
                // under any extended code).
                let code =
                    sqlx::error::DatabaseError::code(sqlite).and_then(|c| c.parse::<i64>().ok());
                return code.is_some_and(|c| matches!(c & 0xff, 10 | 13 | 14));
            }
            // PostgreSQL: connection exceptions (08), the server shutting
            // down or starting (57P), too many connections, a full disk, and
            // a standby that refuses writes (a failover under way).
            e.code().is_some_and(|c| {
                c.starts_with("08")
                    || c.starts_with("57P")
                    || ["53100", "53300", "25006"].contains(&c.as_ref())
            })
        }
        _ => false,
    }
}

pub(crate) fn corrupt(column: &str, err: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{column}: {err}"))
}

pub(crate) fn parse_uuid(column: &str, text: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(text).map_err(|e| corrupt(column, e))
}

/// One audit-trail line, written in the transaction of the change it records.
pub(crate) struct EventLine<'a> {
    pub run_id: Option<Uuid>,
    pub entity: EventEntity,
    pub entity_id: Option<i64>,
    pub actor: &'a Actor,
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
    pub detail: Option<String>,
    pub at: DateTime<Utc>,
}

/// The compare-and-set that moves a step (`saga_log`) or a compensation to
/// its outcome, returning the row; `$1`–`$8` are bound by `bind_outcome`.
/// A second argument adds a condition to the WHERE clause.
macro_rules! outcome_cas {
    ($table:literal) => {
        $crate::store::sql::outcome_cas!($table, "")
    };
    ($table:literal, $also:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET status = $1, external_ref = COALESCE($2, external_ref),
                result = COALESCE($3, result), error = COALESCE($4, error), updated_at = $5
             WHERE run_id = $6 AND step_idx = $7 AND status = $8",
            $also,
            " RETURNING *"
        )
    };
}
pub(crate) use outcome_cas;

/// A `LIKE` pattern for text that contains `search` (lower-cased, its
/// own `%`, `_` and `\\` taken literally); '' for no search.
pub(crate) fn like_pattern(search: &str) -> String {
    let search = search.trim().to_lowercase();
    if search.is_empty() {
        return String::new();
    }
    let mut pattern = String::from("%");
    for c in search.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// `$first, …` for `n` values, for an `IN (…)` list.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The two kinds of row an outcome's compare-and-set moves.
#[derive(Clone, Copy)]
pub(crate) enum Settled {
    Step,
    Compensation,
}

impl Settled {
    pub(crate) fn cas(self) -> &'static str {
        match self {
            Settled::Step => outcome_cas!("saga_log"),
            Settled::Compensation => outcome_cas!("compensations"),
        }
    }

    /// The query that reads the row's status, to say why a compare-and-set
    /// found nothing.
    pub(crate) fn status_of(self) -> &'static str {
        match self {
            Settled::Step => "SELECT status FROM saga_log WHERE run_id = $1 AND step_idx = $2",
            Settled::Compensation => {
                "SELECT status FROM compensations WHERE run_id = $1 AND step_idx = $2"
            }
        }
    }

    /// The audit trail's name for the row.
    pub(crate) fn entity(self) -> EventEntity {
        match self {
            Settled::Step => EventEntity::Step,
            Settled::Compensation => EventEntity::Compensation,
        }
    }

    pub(crate) fn what(self, run_id: Uuid, step_idx: i64) -> String {
        match self {
            Settled::Step => format!("step {step_idx} of run {run_id}"),
            Settled::Compensation => format!("compensation of step {step_idx} of run {run_id}"),
        }
    }
}

/// The INSERT of a new step's row, up to where a caller makes it
/// conditional (`FROM …` or `WHERE …`) and adds `RETURNING *`; `$1`–`$11`
/// are bound by `bind_new_step`.
macro_rules! new_step_insert {
    () => {
        "INSERT INTO saga_log (run_id, step_idx, tool, tool_class, idempotency_key, args,
            status, compensation, audience, phase, approved_individually, created_at,
            updated_at)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, FALSE, $11, $11"
    };
}
pub(crate) use new_step_insert;

/// The statuses of a step that is not settled, as SQL; migration 0002's
/// partial index `saga_log_open_by_run` has the same list.
macro_rules! unsettled_sql {
    () => {
        "('INTENDED', 'UNKNOWN', 'AWAITING_APPROVAL')"
    };
}
pub(crate) use unsettled_sql;

/// The statuses of a step whose limit charges count: its effect stands or
/// may stand.
macro_rules! counted_sql {
    () => {
        "('INTENDED', 'UNKNOWN', 'CONFIRMED')"
    };
}
pub(crate) use counted_sql;

/// A new step's limits as the intent statements read them: `None` when it
/// counts against none.
pub(crate) fn limits_json(
    new: &NewStep,
) -> Option<sqlx::types::Json<crate::saga::limits::StepLimits>> {
    (!new.limits.is_empty()).then(|| sqlx::types::Json(new.limits.clone()))
}

/// What each backend does its own way; everything else is written once, in
/// the generic `impl SagaStore` below.
pub(crate) trait Dialect: Send + Sync + 'static {
    type Db: sqlx::Database<QueryResult: RowsAffected> + sqlx::database::HasStatementCache;
    /// A connection for reads.
    type Reader: std::ops::DerefMut<Target = DbConn<Self>> + Send;
    const BACKEND: Backend;
    /// A run's row, locked for the rest of the transaction where the
    /// backend has row locks (per-run serialisation across processes).
    const RUN_FOR_UPDATE: &'static str;
    /// An approval's row, locked the same way.
    const APPROVAL_FOR_UPDATE: &'static str;
    /// The counted usage of one limit scope (`$1`) within a window of `$2`
    /// seconds (NULL: ever), on the database's clock.
    const LIMIT_USED: &'static str;
    /// The highest counted usage of any scope of one limit (`$1`, the
    /// scopes' prefix) within its window (`$2`).
    const LIMIT_PEAK: &'static str;
    /// One usage row (`$1` scope, `$2` run, `$3` step, `$4` amount) at the
    /// database's clock.
    const USAGE_INSERT: &'static str;

    /// Whether statements stay prepared on their connection.
    fn keeps_statements() -> bool;
    fn read_conn(&self) -> impl Future<Output = StoreResult<Self::Reader>> + Send;
    /// A connection ready for a write transaction at `durability`.
    fn write(
        &self,
        durability: Durability,
    ) -> impl Future<Output = StoreResult<PoolConnection<Self::Db>>> + Send;
    /// What the backend does inside a transaction for a lazy commit.
    fn lazy_commit(
        tx: &mut DbConn<Self>,
        durability: Durability,
    ) -> impl Future<Output = StoreResult<()>> + Send;
    fn claim(&self, run_id: Uuid) -> impl Future<Output = StoreResult<Box<dyn RunClaim>>> + Send;
    fn claim_now(
        &self,
        run_id: Uuid,
    ) -> impl Future<Output = StoreResult<Option<Box<dyn RunClaim>>>> + Send;
    fn claim_and_read_here(
        &self,
        run_id: Uuid,
    ) -> impl Future<Output = StoreResult<ClaimedRun>> + Send;
    fn claim_and_record_step_here(
        &self,
        bearer: Bearer<'_>,
        new: NewStep,
        actor: &Actor,
    ) -> impl Future<Output = StoreResult<Option<(Box<dyn RunClaim>, Step)>>> + Send;
    #[allow(clippy::too_many_arguments)]
    fn settle_step_and_release_here(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
        claim: &mut dyn RunClaim,
    ) -> impl Future<Output = StoreResult<Step>> + Send;
    fn record_step_alone(
        &self,
        new: NewStep,
        actor: &Actor,
    ) -> impl Future<Output = StoreResult<Step>> + Send;
    fn settle_step_alone(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> impl Future<Output = StoreResult<Step>> + Send;
}

/// How many rows a write statement changed, on either backend.
pub(crate) trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::sqlite::SqliteQueryResult::rows_affected(self)
    }
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::postgres::PgQueryResult::rows_affected(self)
    }
}

pub(crate) type DbRow<D> = <<D as Dialect>::Db as sqlx::Database>::Row;
pub(crate) type DbConn<D> = <<D as Dialect>::Db as sqlx::Database>::Connection;
pub(crate) type DbArgs<'q, D> = <<D as Dialect>::Db as sqlx::Database>::Arguments<'q>;

/// Refuses a new step that could never be logged, before any SQL.
pub(crate) fn check_new_step(new: &NewStep) -> StoreResult<()> {
    if new.tool_class == ToolClass::Pure {
        return Err(StoreError::Invalid(format!(
            "{} is pure: pure calls are never written to the saga log (R2)",
            new.tool
        )));
    }
    if !matches!(
        new.status,
        StepStatus::Intended | StepStatus::AwaitingApproval
    ) {
        return Err(StoreError::Invalid(format!(
            "a new step starts INTENDED or AWAITING_APPROVAL, not {}",
            new.status
        )));
    }
    Ok(())
}
/// Whether a new step counts against the run's irreversible calls
/// before the pivot (it is sent now, unapproved by a pivot).
pub(crate) fn counts_as_irreversible(new: &NewStep) -> bool {
    new.tool_class == ToolClass::Irreversible
        && new.phase == Phase::BeforePivot
        && new.status == StepStatus::Intended
}
pub(crate) fn step_event_detail(new: &NewStep) -> String {
    format!("{} key={}", new.tool, new.idempotency_key)
}
/// A held step released by a person's approval: the one move that
/// may mark a step approved on its own.
pub(crate) fn approves_individually(outcome: &Outcome) -> bool {
    outcome.from == StepStatus::AwaitingApproval && outcome.to == StepStatus::Intended
}
pub(crate) fn settle_event_detail(outcome: &Outcome) -> Option<String> {
    outcome.external_ref.clone().or(outcome.error.clone())
}

/// The queries and row mappings both backends share, for backend `D`.
pub(crate) struct Sql<D>(std::marker::PhantomData<D>);

mod shared;

/// `SagaStore` for a backend, written once over its `Dialect`. The trait is
/// the saga core's (another crate), so it is implemented for each store
/// type by name rather than for every `Dialect` at once.
macro_rules! saga_store_over_dialect {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl SagaStore for $store {
            fn backend(&self) -> Backend {
                Self::BACKEND
            }

            async fn claim_run(&self, run_id: Uuid) -> StoreResult<Box<dyn crate::saga::store::RunClaim>> {
                self.claim(run_id).await
            }

            async fn claim_and_read(&self, run_id: Uuid) -> StoreResult<crate::saga::store::ClaimedRun> {
                self.claim_and_read_here(run_id).await
            }

            async fn claim_and_record_step(
                &self,
                bearer: Bearer<'_>,
                new: NewStep,
                actor: &Actor,
            ) -> StoreResult<Option<(Box<dyn crate::saga::store::RunClaim>, Step)>> {
                self.claim_and_record_step_here(bearer, new, actor).await
            }

            async fn settle_step_and_release(
                &self,
                run_id: Uuid,
                step_idx: i64,
                outcome: Outcome,
                durability: Durability,
                actor: &Actor,
                claim: &mut dyn crate::saga::store::RunClaim,
            ) -> StoreResult<Step> {
                self.settle_step_and_release_here(run_id, step_idx, outcome, durability, actor, claim)
                    .await
            }

            async fn try_claim_run(
                &self,
                run_id: Uuid,
            ) -> StoreResult<Option<Box<dyn crate::saga::store::RunClaim>>> {
                self.claim_now(run_id).await
            }

            async fn create_run(&self, new: NewRun) -> StoreResult<(Run, bool)> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let id = Uuid::new_v4();
                let now = Utc::now();
                let inserted = Sql::<Self>::query(
                            "INSERT INTO runs (id, agent, label, purpose, status, next_step, irreversible_before_pivot, created_at, updated_at)
                             VALUES ($1, $2, $3, $4, $5, 0, 0, $6, $6)
                             ON CONFLICT (agent, label) DO NOTHING",
                        )
                        .bind(id.to_string())
                        .bind(&new.agent)
                        .bind(&new.label)
                        .bind(&new.purpose)
                        .bind(RunStatus::Running.as_str())
                        .bind(now)
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?
                        .rows_affected()
                            == 1;
                let row = if inserted {
                    Sql::<Self>::append_event(
                        &mut tx,
                        EventLine {
                            run_id: Some(id),
                            entity: EventEntity::Run,
                            entity_id: None,
                            actor: &Actor::Agent(new.agent.clone()),
                            from: None,
                            to: Some(RunStatus::Running.as_str()),
                            detail: Some(new.purpose.clone()),
                            at: now,
                        },
                    )
                    .await?;
                    Sql::<Self>::query("SELECT * FROM runs WHERE id = $1")
                        .bind(id.to_string())
                        .fetch_one(&mut *tx)
                        .await
                } else {
                    Sql::<Self>::query("SELECT * FROM runs WHERE agent = $1 AND label = $2")
                        .bind(&new.agent)
                        .bind(&new.label)
                        .fetch_one(&mut *tx)
                        .await
                }
                .map_err(db)?;
                Sql::<Self>::commit(tx).await?;
                Ok((Sql::<Self>::run_from(&row)?, inserted))
            }

            async fn run(&self, id: Uuid) -> StoreResult<Option<Run>> {
                let query = Sql::<Self>::query("SELECT * FROM runs WHERE id = $1").bind(id.to_string());
                Sql::<Self>::one(&mut *self.read_conn().await?, query, Sql::<Self>::run_from).await
            }

            async fn list_runs(&self, limit: i64) -> StoreResult<Vec<Run>> {
                let query =
                    Sql::<Self>::query("SELECT * FROM runs ORDER BY created_at DESC, id LIMIT $1").bind(limit);
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::run_from).await
            }

            async fn finished_runs_before(
                &self,
                status: RunStatus,
                before: DateTime<Utc>,
                after: Option<(DateTime<Utc>, Uuid)>,
                limit: i64,
            ) -> StoreResult<Vec<Run>> {
                // Keyset pages over the runs_by_status index (status,
                // created_at): a page costs the same however far the pruner
                // has come, and no index is kept on the last change, which
                // every step moves.
                let (at, id) = after
                    .map(|(at, id)| (Some(at), id.to_string()))
                    .unwrap_or((None, String::new()));
                let query = Sql::<Self>::query(
                    "SELECT * FROM runs WHERE status = $1
                       AND ($2 IS NULL OR created_at > $2 OR (created_at = $2 AND id > $3))
                       AND updated_at < $4
                     ORDER BY created_at, id LIMIT $5",
                )
                .bind(status.as_str())
                .bind(at)
                .bind(id)
                .bind(before)
                .bind(limit);
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::run_from).await
            }

            async fn histories(
                &self,
                runs: Vec<Run>,
            ) -> StoreResult<Vec<crate::saga::retention::RunHistory>> {
                use std::collections::HashMap;
                if runs.is_empty() {
                    return Ok(Vec::new());
                }
                let ids: Vec<String> = runs.iter().map(|r| r.id.to_string()).collect();
                let list = placeholders(1, ids.len());
                let mut conn = self.read_conn().await?;
                // Each table once for the whole page, in the order a
                // run's own reads use, then dealt out by run.
                macro_rules! by_run {
                    ($sql:expr, $from:expr) => {
                        by_run!($sql, $from, row => Some(row.run_id))
                    };
                    ($sql:expr, $from:expr, $row:ident => $run:expr) => {{
                        let sql = format!($sql, list = list);
                        let mut query = Sql::<Self>::query(&sql);
                        for id in &ids {
                            query = query.bind(id);
                        }
                        let mut rows: HashMap<Uuid, Vec<_>> = HashMap::new();
                        for $row in Sql::<Self>::all(&mut *conn, query, $from).await? {
                            if let Some(run) = $run {
                                rows.entry(run).or_default().push($row);
                            }
                        }
                        rows
                    }};
                }
                let mut steps = by_run!(
                    "SELECT * FROM saga_log WHERE run_id IN ({list}) ORDER BY run_id, step_idx",
                    Sql::<Self>::step_from
                );
                let mut compensations = by_run!(
                    "SELECT * FROM compensations WHERE run_id IN ({list})
                       ORDER BY created_at, step_idx",
                    Sql::<Self>::compensation_from
                );
                let mut approvals = by_run!(
                    "SELECT * FROM approvals WHERE run_id IN ({list}) ORDER BY id",
                    Sql::<Self>::approval_from
                );
                let mut notices = by_run!(
                    "SELECT * FROM approval_notices WHERE run_id IN ({list})
                       ORDER BY approval_id, created_at",
                    Sql::<Self>::notice_from
                );
                let mut corrections = by_run!(
                    "SELECT * FROM corrections WHERE run_id IN ({list}) ORDER BY rank DESC, id",
                    Sql::<Self>::correction_from
                );
                let mut events = by_run!(
                    "SELECT * FROM events WHERE run_id IN ({list}) ORDER BY id",
                    Sql::<Self>::event_from,
                    event => event.run_id
                );
                Ok(runs
                    .into_iter()
                    .map(|run| {
                        let id = run.id;
                        crate::saga::retention::RunHistory {
                            run,
                            steps: steps.remove(&id).unwrap_or_default(),
                            compensations: compensations.remove(&id).unwrap_or_default(),
                            approvals: approvals.remove(&id).unwrap_or_default(),
                            notices: notices.remove(&id).unwrap_or_default(),
                            corrections: corrections.remove(&id).unwrap_or_default(),
                            events: events.remove(&id).unwrap_or_default(),
                        }
                    })
                    .collect())
            }

            async fn remove_runs(
                &self,
                runs: &[(Uuid, DateTime<Utc>)],
            ) -> StoreResult<(Vec<Uuid>, crate::saga::retention::Removed)> {
                let mut removed = crate::saga::retention::Removed::default();
                if runs.is_empty() {
                    return Ok((Vec::new(), removed));
                }
                // Lazy: a removal lost to a power cut is made again by the
                // next pass (the archive may then hold the run twice), and
                // the writer is held for no flush.
                let mut conn = self.write(Durability::Lazy).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                // Only runs as they were read: one that moved since (a lead
                // unwinding a completed run) stays.
                let sql = format!(
                    "UPDATE runs SET updated_at = updated_at WHERE {} RETURNING id",
                    (0..runs.len())
                        .map(|i| format!("(id = ${} AND updated_at = ${})", 2 * i + 1, 2 * i + 2))
                        .collect::<Vec<_>>()
                        .join(" OR ")
                );
                let mut query = Sql::<Self>::query(&sql);
                for (id, seen) in runs {
                    query = query.bind(id.to_string()).bind(*seen);
                }
                let unchanged: std::collections::HashSet<Uuid> = query
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(|row| parse_uuid("id", &Sql::<Self>::text(row, "id")?))
                    .collect::<StoreResult<_>>()?;
                // In the order given.
                let gone: Vec<Uuid> = runs
                    .iter()
                    .map(|(id, _)| *id)
                    .filter(|id| unchanged.contains(id))
                    .collect();
                if gone.is_empty() {
                    return Ok((Vec::new(), removed));
                }
                let ids: Vec<String> = gone.iter().map(Uuid::to_string).collect();
                let list = placeholders(1, ids.len());
                // Amounts the limit totals still hold for these runs' calls
                // (rows no sweep has reached) leave with them, as a sweep
                // would have taken them; their per-run totals go too (a
                // per-run scope ends in its run's id, and has usage rows of
                // that run).
                let mut statements = vec![(
                    None,
                    format!(
                        concat!(
                            "UPDATE limit_totals SET used = used - coalesce((
                                 SELECT sum(u.amount) FROM limit_usage u
                                 JOIN saga_log s ON s.run_id = u.run_id AND s.step_idx = u.step_idx
                                 WHERE u.run_id IN ({list}) AND u.scope = limit_totals.scope
                                   AND u.at > limit_totals.swept_at AND s.status IN ",
                            crate::store::sql::counted_sql!(),
                            "), 0)
                             WHERE scope IN (SELECT scope FROM limit_usage WHERE run_id IN ({list}))"
                        ),
                        list = list
                    ),
                )];
                for (table, sql) in [
                    (
                        "limit_totals",
                        "DELETE FROM limit_totals WHERE scope IN (
                             SELECT u.scope FROM limit_usage u
                             WHERE u.run_id IN ({list}) AND u.scope LIKE '%|run:' || u.run_id)",
                    ),
                    ("limit_usage", "DELETE FROM limit_usage WHERE run_id IN ({list})"),
                    ("approval_notices", "DELETE FROM approval_notices WHERE run_id IN ({list})"),
                    ("corrections", "DELETE FROM corrections WHERE run_id IN ({list})"),
                    ("compensations", "DELETE FROM compensations WHERE run_id IN ({list})"),
                    ("events", "DELETE FROM events WHERE run_id IN ({list})"),
                    ("approvals", "DELETE FROM approvals WHERE run_id IN ({list})"),
                    ("saga_log", "DELETE FROM saga_log WHERE run_id IN ({list})"),
                    ("runs", "DELETE FROM runs WHERE id IN ({list})"),
                ] {
                    statements.push((Some(table), sql.replace("{list}", &list)));
                }
                for (table, sql) in &statements {
                    let mut query = Sql::<Self>::query(sql);
                    for id in &ids {
                        query = query.bind(id);
                    }
                    let done = query.execute(&mut *tx).await.map_err(db)?;
                    if let Some(table) = table {
                        removed.add(table, done.rows_affected());
                    }
                }
                Sql::<Self>::commit(tx).await?;
                Ok((gone, removed))
            }

            async fn runs_page(
                &self,
                status: Option<RunStatus>,
                search: &str,
                offset: i64,
                limit: i64,
            ) -> StoreResult<RunsPage> {
                // '' matches every status and every run: one statement for
                // both backends.
                let wanted = status.map(|s| s.as_str()).unwrap_or("");
                if search.contains('\0') {
                    // No stored text holds a NUL (PostgreSQL keeps none, and
                    // every writer refuses it): nothing matches.
                    return Ok(RunsPage { runs: Vec::new(), total: 0 });
                }
                let pattern = like_pattern(search);
                const MATCHES: &str = "($1 = '' OR runs.status = $1)
                     AND ($2 = '' OR LOWER(COALESCE(runs.label, '')) LIKE $2 ESCAPE '\\'
                          OR LOWER(runs.purpose) LIKE $2 ESCAPE '\\'
                          OR LOWER(runs.agent) LIKE $2 ESCAPE '\\'
                          OR EXISTS (SELECT 1 FROM saga_log s WHERE s.run_id = runs.id
                                     AND LOWER(CAST(s.args AS TEXT)) LIKE $2 ESCAPE '\\'))";
                let rows = Sql::<Self>::query(&format!(
                    "SELECT runs.*, CAST(CASE
                                 WHEN runs.status = 'AWAITING_APPROVAL' OR EXISTS (
                                     SELECT 1 FROM approvals
                                     WHERE approvals.run_id = runs.id AND approvals.status = 'pending')
                                 THEN 0
                                 WHEN runs.status = 'NEEDS_ATTENTION' THEN 1
                                 ELSE 2 END AS BIGINT) AS waiting_rank
                             FROM runs
                             WHERE {MATCHES}
                             ORDER BY waiting_rank, runs.created_at DESC, runs.id
                             LIMIT $3 OFFSET $4"
                ))
                .bind(wanted)
                .bind(&pattern)
                .bind(limit)
                .bind(offset)
                .fetch_all(&mut *self.read_conn().await?)
                .await
                .map_err(db)?;
                let mut runs = Vec::with_capacity(rows.len());
                for row in &rows {
                    let rank: i64 = row
                        .try_get("waiting_rank")
                        .map_err(|e| corrupt("waiting_rank", e))?;
                    runs.push((Sql::<Self>::run_from(row)?, rank == 0));
                }
                let total: i64 = Sql::<Self>::query_scalar(&format!(
                    "SELECT COUNT(*) FROM runs WHERE {MATCHES}"
                ))
                .bind(wanted)
                .bind(&pattern)
                .fetch_one(&mut *self.read_conn().await?)
                .await
                .map_err(db)?;
                Ok(RunsPage { runs, total })
            }

            async fn unwind_reasons(
                &self,
                runs: &[Uuid],
            ) -> StoreResult<std::collections::HashMap<Uuid, Event>> {
                if runs.is_empty() {
                    return Ok(Default::default());
                }
                let sql = format!(
                    "SELECT * FROM events WHERE entity = 'run' AND to_status = 'UNWINDING'
                       AND run_id IN ({}) ORDER BY id",
                    placeholders(1, runs.len())
                );
                let mut query = Sql::<Self>::query(&sql);
                for run in runs {
                    query = query.bind(run.to_string());
                }
                let rows = query
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?;
                let mut reasons = std::collections::HashMap::new();
                for row in &rows {
                    let event = Sql::<Self>::event_from(row)?;
                    // Oldest first: a later unwind's line replaces an earlier one.
                    if let Some(run) = event.run_id {
                        reasons.insert(run, event);
                    }
                }
                Ok(reasons)
            }

            async fn stale_steps(
                &self,
                before: chrono::DateTime<Utc>,
                statuses: &[RunStatus],
            ) -> StoreResult<Vec<(Uuid, i64)>> {
                if statuses.is_empty() {
                    return Ok(Vec::new());
                }
                // The status condition is the partial index saga_log_unsettled's.
                let sql = format!(
                    "SELECT s.run_id, s.step_idx FROM saga_log s JOIN runs r ON r.id = s.run_id
                             WHERE s.status IN ('INTENDED', 'UNKNOWN') AND s.updated_at <= $1
                               AND r.status IN ({})
                             ORDER BY s.run_id, s.step_idx",
                    placeholders(2, statuses.len())
                );
                Sql::<Self>::bind_statuses(Sql::<Self>::query(&sql).bind(before), statuses)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(|row| {
                        Ok((
                            parse_uuid("run_id", &Sql::<Self>::text(row, "run_id")?)?,
                            Sql::<Self>::get(row, "step_idx")?,
                        ))
                    })
                    .collect()
            }

            async fn runs_with_status(&self, statuses: &[RunStatus]) -> StoreResult<Vec<Run>> {
                if statuses.is_empty() {
                    return Ok(Vec::new());
                }
                // One query for every status: `status IN ($1, …, $n)`.
                let sql = format!(
                    "SELECT * FROM runs WHERE status IN ({}) ORDER BY created_at, id",
                    placeholders(1, statuses.len())
                );
                Sql::<Self>::bind_statuses(Sql::<Self>::query(&sql), statuses)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(Sql::<Self>::run_from)
                    .collect()
            }

            async fn move_run(
                &self,
                id: Uuid,
                from: RunStatus,
                to: RunStatus,
                actor: &Actor,
                detail: Option<&str>,
            ) -> StoreResult<Run> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let run = Sql::<Self>::apply_run_move(&mut tx, id, from, to, actor, detail).await?;
                Sql::<Self>::commit(tx).await?;
                Ok(run)
            }

            async fn record_step(&self, new: NewStep, actor: &Actor) -> StoreResult<Step> {
                self.record_step_alone(new, actor).await
            }

            async fn record_held_step(
                &self,
                new: NewStep,
                approval: NewApproval,
                actor: &Actor,
            ) -> StoreResult<(Step, Approval)> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let step = Sql::<Self>::insert_step(&mut tx, new, actor).await?;
                let approval = Sql::<Self>::insert_approval(&mut tx, approval, None, actor).await?;
                Sql::<Self>::commit(tx).await?;
                Ok((step, approval))
            }

            async fn settle_step(
                &self,
                run_id: Uuid,
                step_idx: i64,
                outcome: Outcome,
                durability: Durability,
                actor: &Actor,
            ) -> StoreResult<Step> {
                check_step_transition(Lifecycle::Step, outcome.from, outcome.to)?;
                if approves_individually(&outcome) {
                    // A held step released by a person also marks the step
                    // and counts it against the run: the general path.
                    let mut conn = self.write(durability).await?;
                    let mut tx = conn.begin().await.map_err(db)?;
                    Self::lazy_commit(&mut tx, durability).await?;
                    let step = Sql::<Self>::settle_step_in(&mut tx, run_id, step_idx, outcome, actor).await?;
                    Sql::<Self>::commit(tx).await?;
                    return Ok(step);
                }
                self.settle_step_alone(run_id, step_idx, outcome, durability, actor)
                    .await
            }

            async fn step(&self, run_id: Uuid, step_idx: i64) -> StoreResult<Option<Step>> {
                let query = Sql::<Self>::query("SELECT * FROM saga_log WHERE run_id = $1 AND step_idx = $2")
                    .bind(run_id.to_string())
                    .bind(step_idx);
                Sql::<Self>::one(&mut *self.read_conn().await?, query, Sql::<Self>::step_from).await
            }

            async fn limit_usage(&self, scopes: &[(String, Option<i64>)]) -> StoreResult<Vec<i64>> {
                let mut conn = self.read_conn().await?;
                let mut used = Vec::with_capacity(scopes.len());
                for (scope, window_s) in scopes {
                    used.push(Sql::<Self>::limit_used_in(&mut *conn, scope, *window_s).await?);
                }
                Ok(used)
            }

            async fn limit_peaks(&self, limits: &[(String, Option<i64>)]) -> StoreResult<Vec<i64>> {
                let mut conn = self.read_conn().await?;
                let mut peaks = Vec::with_capacity(limits.len());
                for (name, window_s) in limits {
                    let row = Sql::<Self>::query(Self::LIMIT_PEAK)
                        .bind(format!("{name}|"))
                        .bind(*window_s)
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(db)?;
                    peaks.push(Sql::<Self>::get::<i64>(&row, "used")?);
                }
                Ok(peaks)
            }

            async fn steps(&self, run_id: Uuid) -> StoreResult<Vec<Step>> {
                let query = Sql::<Self>::query("SELECT * FROM saga_log WHERE run_id = $1 ORDER BY step_idx")
                    .bind(run_id.to_string());
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::step_from).await
            }

            async fn steps_of_runs(&self, runs: &[Uuid], tools: &[&str]) -> StoreResult<Vec<Step>> {
                if runs.is_empty() || tools.is_empty() {
                    return Ok(Vec::new());
                }
                let sql = format!(
                    "SELECT * FROM saga_log WHERE run_id IN ({}) AND tool IN ({})
                       ORDER BY run_id, step_idx",
                    placeholders(1, runs.len()),
                    placeholders(runs.len() + 1, tools.len())
                );
                let mut query = Sql::<Self>::query(&sql);
                for run in runs {
                    query = query.bind(run.to_string());
                }
                for tool in tools {
                    query = query.bind(tool.to_string());
                }
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::step_from).await
            }

            async fn unsettled_steps(&self, run_id: Uuid) -> StoreResult<Vec<Step>> {
                // The same condition as the partial index saga_log_open_by_run
                // (migration 0002), word for word, so both backends use it.
                Sql::<Self>::query(concat!(
                    "SELECT * FROM saga_log WHERE run_id = $1 AND status IN ",
                    crate::store::sql::unsettled_sql!(),
                    " ORDER BY step_idx"
                ))
                .bind(run_id.to_string())
                .fetch_all(&mut *self.read_conn().await?)
                .await
                .map_err(db)?
                .iter()
                .map(Sql::<Self>::step_from)
                .collect()
            }

            async fn step_by_key(&self, idempotency_key: &str) -> StoreResult<Option<Step>> {
                let query = Sql::<Self>::query("SELECT * FROM saga_log WHERE idempotency_key = $1")
                    .bind(idempotency_key);
                Sql::<Self>::one(&mut *self.read_conn().await?, query, Sql::<Self>::step_from).await
            }

            async fn set_owed_to_agent(&self, run_id: Uuid, step_idx: i64, owed: bool) -> StoreResult<()> {
                // Lazy: a lost flag is rebuilt by the agent's next re-send,
                // and any later durable commit carries it to disk (§9).
                let mut conn = self.write(Durability::Lazy).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                Self::lazy_commit(&mut tx, Durability::Lazy).await?;
                let changed = Sql::<Self>::query(
                    "UPDATE saga_log SET owed_to_agent = $1 WHERE run_id = $2 AND step_idx = $3",
                )
                .bind(owed)
                .bind(run_id.to_string())
                .bind(step_idx)
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
                if changed == 0 {
                    return Err(StoreError::NotFound {
                        what: format!("step {step_idx} of run {run_id}"),
                    });
                }
                Sql::<Self>::commit(tx).await
            }

            async fn note(&self, run_id: Uuid, actor: &Actor, detail: &str) -> StoreResult<()> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(run_id),
                        entity: EventEntity::Run,
                        entity_id: None,
                        actor,
                        from: None,
                        to: None,
                        detail: Some(detail.to_owned()),
                        at: Utc::now(),
                    },
                )
                .await?;
                Sql::<Self>::commit(tx).await
            }

            async fn record_compensation(
                &self,
                new: NewCompensation,
                actor: &Actor,
            ) -> StoreResult<Compensation> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let step_status =
                    Sql::<Self>::query("SELECT status FROM saga_log WHERE run_id = $1 AND step_idx = $2")
                        .bind(new.run_id.to_string())
                        .bind(new.step_idx)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?
                        .ok_or_else(|| StoreError::NotFound {
                            what: format!("step {} of run {}", new.step_idx, new.run_id),
                        })?;
                let step_status: StepStatus = Sql::<Self>::parsed(&step_status, "status")?;
                if step_status != StepStatus::Confirmed {
                    return Err(StoreError::Invalid(format!(
                        "step {} is {step_status}: only a confirmed step is compensated",
                        new.step_idx
                    )));
                }
                let now = Utc::now();
                let row = Sql::<Self>::query(
                            "INSERT INTO compensations (run_id, step_idx, tool, idempotency_key, args, status, created_at, updated_at)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
                             RETURNING *",
                        )
                        .bind(new.run_id.to_string())
                        .bind(new.step_idx)
                        .bind(&new.tool)
                        .bind(&new.idempotency_key)
                        .bind(Json(&new.args))
                        .bind(StepStatus::Intended.as_str())
                        .bind(now)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(|e| db_error(e, || format!("compensation of step {}", new.step_idx)))?;
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(new.run_id),
                        entity: EventEntity::Compensation,
                        entity_id: Some(new.step_idx),
                        actor,
                        from: None,
                        to: Some(StepStatus::Intended.as_str()),
                        detail: Some(format!("{} key={}", new.tool, new.idempotency_key)),
                        at: now,
                    },
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Sql::<Self>::compensation_from(&row)
            }

            async fn settle_compensation(
                &self,
                run_id: Uuid,
                step_idx: i64,
                outcome: Outcome,
                durability: Durability,
                actor: &Actor,
            ) -> StoreResult<Compensation> {
                check_step_transition(Lifecycle::Compensation, outcome.from, outcome.to)?;
                let mut conn = self.write(durability).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                Self::lazy_commit(&mut tx, durability).await?;
                let now = Utc::now();
                let row = Sql::<Self>::outcome_row(
                    &mut tx,
                    Settled::Compensation,
                    &outcome,
                    now,
                    actor,
                    run_id,
                    step_idx,
                )
                .await?;
                // A confirmed compensation settles its step as COMPENSATED in
                // the same commit, so the two can never disagree.
                if outcome.to == StepStatus::Confirmed {
                    check_step_transition(
                        Lifecycle::Step,
                        StepStatus::Confirmed,
                        StepStatus::Compensated,
                    )?;
                    let moved = Sql::<Self>::query(
                        "UPDATE saga_log SET status = $1, updated_at = $2
                                 WHERE run_id = $3 AND step_idx = $4 AND status = $5",
                    )
                    .bind(StepStatus::Compensated.as_str())
                    .bind(now)
                    .bind(run_id.to_string())
                    .bind(step_idx)
                    .bind(StepStatus::Confirmed.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?
                    .rows_affected();
                    if moved != 1 {
                        return Err(Sql::<Self>::step_not_settled(
                            &mut tx,
                            run_id,
                            step_idx,
                            StepStatus::Confirmed,
                        )
                        .await);
                    }
                    Sql::<Self>::append_event(
                        &mut tx,
                        EventLine {
                            run_id: Some(run_id),
                            entity: EventEntity::Step,
                            entity_id: Some(step_idx),
                            actor,
                            from: Some(StepStatus::Confirmed.as_str()),
                            to: Some(StepStatus::Compensated.as_str()),
                            detail: None,
                            at: now,
                        },
                    )
                    .await?;
                }
                Sql::<Self>::commit(tx).await?;
                Sql::<Self>::compensation_from(&row)
            }

            async fn compensations(&self, run_id: Uuid) -> StoreResult<Vec<Compensation>> {
                let query = Sql::<Self>::query(
                    "SELECT * FROM compensations WHERE run_id = $1 ORDER BY created_at, step_idx",
                )
                .bind(run_id.to_string());
                Sql::<Self>::all(
                    &mut *self.read_conn().await?,
                    query,
                    Sql::<Self>::compensation_from,
                )
                .await
            }

            async fn request_approval(
                &self,
                new: NewApproval,
                run_move: Option<(RunStatus, RunStatus)>,
                actor: &Actor,
            ) -> StoreResult<Approval> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let approval = Sql::<Self>::insert_approval(&mut tx, new, run_move, actor).await?;
                Sql::<Self>::commit(tx).await?;
                Ok(approval)
            }

            async fn edit_plan(&self, change: PlanChange, actor: &Actor) -> StoreResult<Approval> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let found = Sql::<Self>::query(
                    "UPDATE approvals SET plan = $1, digest = $2, approvers_needed = $3,
                                 first_approver = NULL, first_approved_at = NULL
                             WHERE id = $4 AND status = $5 AND digest = $6 RETURNING *",
                )
                .bind(Json(&change.plan))
                .bind(&change.digest)
                .bind(change.approvers_needed)
                .bind(change.approval_id)
                .bind(ApprovalStatus::Pending.as_str())
                .bind(&change.digest_before)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
                let Some(row) = found else {
                    let current = Sql::<Self>::query("SELECT status FROM approvals WHERE id = $1")
                        .bind(change.approval_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                    return Err(match current {
                        None => StoreError::NotFound {
                            what: format!("approval {}", change.approval_id),
                        },
                        Some(row)
                            if Sql::<Self>::text(&row, "status")? == ApprovalStatus::Pending.as_str() =>
                        {
                            StoreError::PlanChanged
                        }
                        Some(row) => StoreError::Invalid(format!(
                            "approval {} is {}: only a waiting plan can be edited",
                            change.approval_id,
                            Sql::<Self>::text(&row, "status")?.to_lowercase()
                        )),
                    });
                };
                let approval = Sql::<Self>::approval_from(&row)?;
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(approval.run_id),
                        entity: EventEntity::Approval,
                        entity_id: Some(approval.id),
                        actor,
                        from: Some(ApprovalStatus::Pending.as_str()),
                        to: Some(ApprovalStatus::Pending.as_str()),
                        detail: Some(change.detail),
                        at: Utc::now(),
                    },
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(approval)
            }

            async fn decide_approval(&self, decision: Decision, actor: &Actor) -> StoreResult<Approval> {
                check_approval_transition(ApprovalStatus::Pending, decision.to)?;
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let row = Sql::<Self>::query(Self::APPROVAL_FOR_UPDATE)
                    .bind(decision.approval_id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?
                    .ok_or_else(|| StoreError::NotFound {
                        what: format!("approval {}", decision.approval_id),
                    })?;
                let current = Sql::<Self>::approval_from(&row)?;
                if current.status == decision.to {
                    // A second click or a replay: already done.
                    return Ok(current);
                }
                if current.status == ApprovalStatus::Superseded {
                    // The approver looked at a plan that has since been replaced.
                    return Err(StoreError::PlanChanged);
                }
                check_approval_transition(current.status, decision.to)?;
                if current.digest != decision.digest {
                    return Err(StoreError::PlanChanged);
                }
                let now = Utc::now();
                if decision.to == ApprovalStatus::Approved && current.expires_at.is_some_and(|at| at <= now)
                {
                    return Err(StoreError::Invalid(format!(
                        "approval {} passed its deadline before it was approved; nothing was sent",
                        current.id
                    )));
                }
                if decision.to == ApprovalStatus::Approved && current.approvers_needed > 1 {
                    match &current.first_approver {
                        // The first of two: recorded; the approval still waits.
                        None => {
                            let row = Sql::<Self>::record_first_approval(
                                &mut tx, &current, &decision, actor, now,
                            )
                            .await?;
                            Sql::<Self>::commit(tx).await?;
                            return Sql::<Self>::approval_from(&row);
                        }
                        Some(first) if first == actor => {
                            return Err(StoreError::Invalid(format!(
                                        "{} already approved this; the two-person rule needs a second, different approver",
                                        actor.name()
                                    )));
                        }
                        Some(_) => {}
                    }
                }
                let row = Sql::<Self>::query(
                    "UPDATE approvals SET status = $1, decided_by = $2, decided_at = $3, note = $4
                             WHERE id = $5 AND status = $6 RETURNING *",
                )
                .bind(decision.to.as_str())
                .bind(actor.to_string())
                .bind(now)
                .bind(&decision.note)
                .bind(decision.approval_id)
                .bind(ApprovalStatus::Pending.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(current.run_id),
                        entity: EventEntity::Approval,
                        entity_id: Some(current.id),
                        actor,
                        from: Some(ApprovalStatus::Pending.as_str()),
                        to: Some(decision.to.as_str()),
                        detail: decision.note.clone(),
                        at: now,
                    },
                )
                .await?;
                if let Some((from, to)) = decision.run_move {
                    Sql::<Self>::apply_run_move(
                        &mut tx,
                        current.run_id,
                        from,
                        to,
                        actor,
                        Some("approval decided"),
                    )
                    .await?;
                }
                Sql::<Self>::commit(tx).await?;
                Sql::<Self>::approval_from(&row)
            }

            async fn approval(&self, id: i64) -> StoreResult<Option<Approval>> {
                let query = Sql::<Self>::query("SELECT * FROM approvals WHERE id = $1").bind(id);
                Sql::<Self>::one(
                    &mut *self.read_conn().await?,
                    query,
                    Sql::<Self>::approval_from,
                )
                .await
            }

            async fn approvals(&self, run_id: Uuid) -> StoreResult<Vec<Approval>> {
                let query = Sql::<Self>::query("SELECT * FROM approvals WHERE run_id = $1 ORDER BY id")
                    .bind(run_id.to_string());
                Sql::<Self>::all(
                    &mut *self.read_conn().await?,
                    query,
                    Sql::<Self>::approval_from,
                )
                .await
            }

            async fn pending_approvals(&self) -> StoreResult<Vec<Approval>> {
                let query =
                    Sql::<Self>::query("SELECT * FROM approvals WHERE status = $1 ORDER BY created_at, id")
                        .bind(ApprovalStatus::Pending.as_str());
                Sql::<Self>::all(
                    &mut *self.read_conn().await?,
                    query,
                    Sql::<Self>::approval_from,
                )
                .await
            }

            async fn approvals_without_notice(&self) -> StoreResult<Vec<Approval>> {
                let query = Sql::<Self>::query(
                    "SELECT a.* FROM approvals a
                             WHERE a.status = $1
                               AND NOT EXISTS (SELECT 1 FROM approval_notices n WHERE n.approval_id = a.id)
                             ORDER BY a.created_at, a.id",
                )
                .bind(ApprovalStatus::Pending.as_str());
                Sql::<Self>::all(
                    &mut *self.read_conn().await?,
                    query,
                    Sql::<Self>::approval_from,
                )
                .await
            }

            async fn record_notice(&self, new: NewNotice) -> StoreResult<Notice> {
                let mut conn = self.write(Durability::Durable).await?;
                let now = Utc::now();
                Sql::<Self>::query(
                    "INSERT INTO approval_notices (approval_id, place, run_id, idempotency_key, channel,
                                status, done, created_at, updated_at)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)
                             ON CONFLICT (approval_id, place) DO NOTHING",
                )
                .bind(new.approval_id)
                .bind(new.place.as_str())
                .bind(new.run_id.to_string())
                .bind(&new.idempotency_key)
                .bind(&new.channel)
                .bind(NoticeStatus::Intended.as_str())
                .bind(false)
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(|e| db_error(e, || format!("notice key {}", new.idempotency_key)))?;
                let row =
                    Sql::<Self>::query("SELECT * FROM approval_notices WHERE approval_id = $1 AND place = $2")
                        .bind(new.approval_id)
                        .bind(new.place.as_str())
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(db)?;
                Sql::<Self>::notice_from(&row)
            }

            async fn save_notice(&self, notice: &Notice) -> StoreResult<()> {
                let mut conn = self.write(Durability::Durable).await?;
                Sql::<Self>::query(
                    "UPDATE approval_notices SET status = $1, message_ref = $2, shown = $3, done = $4,
                                error = $5, updated_at = $6
                             WHERE approval_id = $7 AND place = $8",
                )
                .bind(notice.status.as_str())
                .bind(&notice.message_ref)
                .bind(&notice.shown)
                .bind(notice.done)
                .bind(&notice.error)
                .bind(Utc::now())
                .bind(notice.approval_id)
                .bind(notice.place.as_str())
                .execute(&mut *conn)
                .await
                .map_err(db)?;
                Ok(())
            }

            async fn open_notices(&self) -> StoreResult<Vec<Notice>> {
                let query = Sql::<Self>::query(
                    "SELECT * FROM approval_notices WHERE done = $1 ORDER BY created_at, approval_id",
                )
                .bind(false);
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::notice_from).await
            }

            async fn notices(&self, approval_id: i64) -> StoreResult<Vec<Notice>> {
                let query = Sql::<Self>::query(
                    "SELECT * FROM approval_notices WHERE approval_id = $1 ORDER BY created_at",
                )
                .bind(approval_id);
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::notice_from).await
            }

            async fn first_sighting(
                &self,
                signature: &str,
                now: chrono::DateTime<Utc>,
                forget_before: chrono::DateTime<Utc>,
            ) -> StoreResult<bool> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                Sql::<Self>::query("DELETE FROM slack_requests WHERE seen_at < $1")
                    .bind(forget_before)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                let inserted = Sql::<Self>::query(
                    "INSERT INTO slack_requests (signature, seen_at) VALUES ($1, $2)
                             ON CONFLICT (signature) DO NOTHING",
                )
                .bind(signature)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
                Sql::<Self>::commit(tx).await?;
                Ok(inserted == 1)
            }

            async fn queue_correction(&self, new: NewCorrection, actor: &Actor) -> StoreResult<Correction> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let inserted = Sql::<Self>::query(
                            "INSERT INTO corrections (run_id, step_idx, source, tool, audience, rank, template, recipients,
                                message, status, idempotency_key, created_at, updated_at)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $7, $9, $10, $11, $11)
                             ON CONFLICT (run_id, step_idx, source) DO NOTHING",
                        )
                        .bind(new.run_id.to_string())
                        .bind(new.step_idx)
                        .bind(new.source.as_str())
                        .bind(&new.tool)
                        .bind(new.audience.as_str())
                        .bind(new.audience.blast_radius())
                        .bind(&new.template)
                        .bind(Json(&new.recipients))
                        .bind(CorrectionStatus::Pending.as_str())
                        .bind(&new.idempotency_key)
                        .bind(now)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_error(e, || format!("correction key {}", new.idempotency_key)))?
                        .rows_affected()
                            == 1;
                let row = Sql::<Self>::query(
                    "SELECT * FROM corrections WHERE run_id = $1 AND step_idx = $2 AND source = $3",
                )
                .bind(new.run_id.to_string())
                .bind(new.step_idx)
                .bind(new.source.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(db)?;
                let correction = Sql::<Self>::correction_from(&row)?;
                if inserted {
                    Sql::<Self>::append_event(
                        &mut tx,
                        EventLine {
                            run_id: Some(new.run_id),
                            entity: EventEntity::Correction,
                            entity_id: Some(correction.id),
                            actor,
                            from: None,
                            to: Some(CorrectionStatus::Pending.as_str()),
                            detail: Some(format!(
                                "{} audience, {} recipient(s)",
                                new.audience,
                                new.recipients.len()
                            )),
                            at: now,
                        },
                    )
                    .await?;
                }
                Sql::<Self>::commit(tx).await?;
                Ok(correction)
            }

            async fn edit_correction(
                &self,
                id: i64,
                message: &str,
                actor: &Actor,
            ) -> StoreResult<Correction> {
                if message.trim().is_empty() {
                    return Err(StoreError::Invalid(
                        "a correction's message cannot be empty".into(),
                    ));
                }
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let found = Sql::<Self>::query(
                            "UPDATE corrections SET message = $1, updated_at = $2 WHERE id = $3 AND status = $4 RETURNING *",
                        )
                        .bind(message)
                        .bind(now)
                        .bind(id)
                        .bind(CorrectionStatus::Pending.as_str())
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                let Some(row) = found else {
                    let status = Sql::<Self>::query("SELECT status FROM corrections WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                    return Err(match status {
                        Some(row) => StoreError::Invalid(format!(
                            "correction {id} is {}: only a pending correction's text can change",
                            Sql::<Self>::text(&row, "status")?
                        )),
                        None => StoreError::NotFound {
                            what: format!("correction {id}"),
                        },
                    });
                };
                let correction = Sql::<Self>::correction_from(&row)?;
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(correction.run_id),
                        entity: EventEntity::Correction,
                        entity_id: Some(id),
                        actor,
                        from: None,
                        to: None,
                        detail: Some("message edited".into()),
                        at: now,
                    },
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(correction)
            }

            async fn move_correction(
                &self,
                id: i64,
                from: CorrectionStatus,
                to: CorrectionStatus,
                reason: Option<&str>,
                actor: &Actor,
            ) -> StoreResult<Correction> {
                check_correction_transition(from, to)?;
                if to == CorrectionStatus::Sent {
                    return Err(StoreError::Invalid(
                        "a correction becomes sent only when its send is confirmed".into(),
                    ));
                }
                if to == CorrectionStatus::Dismissed && reason.is_none_or(|r| r.trim().is_empty()) {
                    return Err(StoreError::Invalid(
                        "dismissing a correction needs a reason".into(),
                    ));
                }
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let found = Sql::<Self>::query(
                    "UPDATE corrections SET status = $1, decided_by = $2, decided_at = $3,
                                dismiss_reason = COALESCE($4, dismiss_reason), updated_at = $3
                             WHERE id = $5 AND status = $6 RETURNING *",
                )
                .bind(to.as_str())
                .bind(actor.to_string())
                .bind(now)
                .bind(reason)
                .bind(id)
                .bind(from.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
                let Some(row) = found else {
                    let status = Sql::<Self>::query("SELECT status FROM corrections WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                    return Err(match status {
                        Some(row) => StoreError::Stale {
                            what: format!("correction {id}"),
                            expected: from.as_str().into(),
                            actual: Sql::<Self>::text(&row, "status")?,
                        },
                        None => StoreError::NotFound {
                            what: format!("correction {id}"),
                        },
                    });
                };
                let correction = Sql::<Self>::correction_from(&row)?;
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(correction.run_id),
                        entity: EventEntity::Correction,
                        entity_id: Some(id),
                        actor,
                        from: Some(from.as_str()),
                        to: Some(to.as_str()),
                        detail: reason.map(str::to_owned),
                        at: now,
                    },
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(correction)
            }

            async fn settle_correction_send(
                &self,
                id: i64,
                outcome: Outcome,
                durability: Durability,
                actor: &Actor,
            ) -> StoreResult<Correction> {
                check_step_transition(Lifecycle::Compensation, outcome.from, outcome.to)?;
                let confirmed = outcome.to == StepStatus::Confirmed;
                if confirmed {
                    check_correction_transition(CorrectionStatus::Approved, CorrectionStatus::Sent)?;
                }
                let mut conn = self.write(durability).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                Self::lazy_commit(&mut tx, durability).await?;
                let now = Utc::now();
                // A send that was never attempted is, as far as the outside
                // world is concerned, NOT_EXECUTED.
                let found = Sql::<Self>::query(
                            "UPDATE corrections SET send_status = $1, external_ref = COALESCE($2, external_ref),
                                status = CASE WHEN $3 THEN 'sent' ELSE status END, updated_at = $4
                             WHERE id = $5 AND status = 'approved' AND COALESCE(send_status, 'NOT_EXECUTED') = $6
                             RETURNING *",
                        )
                        .bind(outcome.to.as_str())
                        .bind(&outcome.external_ref)
                        .bind(confirmed)
                        .bind(now)
                        .bind(id)
                        .bind(outcome.from.as_str())
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                let Some(row) = found else {
                    let current =
                        Sql::<Self>::query("SELECT status, send_status FROM corrections WHERE id = $1")
                            .bind(id)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(db)?;
                    return Err(match current {
                        Some(row) => StoreError::Stale {
                            what: format!("send of correction {id}"),
                            expected: format!("approved, send {}", outcome.from),
                            actual: format!(
                                "{}, send {}",
                                Sql::<Self>::text(&row, "status")?,
                                Sql::<Self>::opt_text(&row, "send_status")?
                                    .unwrap_or_else(|| "not attempted".into())
                            ),
                        },
                        None => StoreError::NotFound {
                            what: format!("correction {id}"),
                        },
                    });
                };
                let correction = Sql::<Self>::correction_from(&row)?;
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(correction.run_id),
                        entity: EventEntity::Correction,
                        entity_id: Some(id),
                        actor,
                        from: Some(outcome.from.as_str()),
                        to: Some(outcome.to.as_str()),
                        detail: Some(format!("send {}", outcome.to)),
                        at: now,
                    },
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(correction)
            }

            async fn correction(&self, id: i64) -> StoreResult<Option<Correction>> {
                let query = Sql::<Self>::query("SELECT * FROM corrections WHERE id = $1").bind(id);
                Sql::<Self>::one(
                    &mut *self.read_conn().await?,
                    query,
                    Sql::<Self>::correction_from,
                )
                .await
            }

            async fn corrections(&self, run_id: Uuid) -> StoreResult<Vec<Correction>> {
                let query =
                    Sql::<Self>::query("SELECT * FROM corrections WHERE run_id = $1 ORDER BY rank DESC, id")
                        .bind(run_id.to_string());
                Sql::<Self>::all(
                    &mut *self.read_conn().await?,
                    query,
                    Sql::<Self>::correction_from,
                )
                .await
            }

            async fn correction_queue(&self) -> StoreResult<Vec<Correction>> {
                let query = Sql::<Self>::query(
                    "SELECT * FROM corrections WHERE status IN ('pending', 'approved')
                             ORDER BY rank DESC, created_at, id",
                );
                Sql::<Self>::all(
                    &mut *self.read_conn().await?,
                    query,
                    Sql::<Self>::correction_from,
                )
                .await
            }

            async fn correction_inbox(&self) -> StoreResult<Vec<QueuedCorrection>> {
                let rows = Sql::<Self>::query(
                    "SELECT c.*, COALESCE(r.label, r.purpose) AS run_title,
                                 s.tool AS original_tool, s.args AS original_args,
                                 s.external_ref AS original_ref
                             FROM corrections c
                             JOIN runs r ON r.id = c.run_id
                             LEFT JOIN saga_log s ON s.run_id = c.run_id AND s.step_idx = c.step_idx
                             WHERE c.status IN ('pending', 'approved')
                             ORDER BY c.rank DESC, c.created_at, c.id",
                )
                .fetch_all(&mut *self.read_conn().await?)
                .await
                .map_err(db)?;
                rows.iter()
                    .map(|row| {
                        let original = match Sql::<Self>::opt_text(row, "original_tool")? {
                            Some(tool) => Some(OriginalEffect {
                                tool,
                                args: Sql::<Self>::json(row, "original_args")?,
                                external_ref: Sql::<Self>::opt_text(row, "original_ref")?,
                            }),
                            None => None,
                        };
                        Ok(QueuedCorrection {
                            correction: Sql::<Self>::correction_from(row)?,
                            run_title: Sql::<Self>::text(row, "run_title")?,
                            original,
                        })
                    })
                    .collect()
            }

            async fn events(&self, run_id: Option<Uuid>, limit: i64) -> StoreResult<Vec<Event>> {
                let rows = match run_id {
                    Some(id) => {
                        Sql::<Self>::query("SELECT * FROM events WHERE run_id = $1 ORDER BY id LIMIT $2")
                            .bind(id.to_string())
                            .bind(limit)
                            .fetch_all(&mut *self.read_conn().await?)
                            .await
                    }
                    None => {
                        Sql::<Self>::query("SELECT * FROM events ORDER BY id LIMIT $1")
                            .bind(limit)
                            .fetch_all(&mut *self.read_conn().await?)
                            .await
                    }
                }
                .map_err(db)?;
                rows.iter().map(Sql::<Self>::event_from).collect()
            }

            async fn events_after(
                &self,
                run_id: Uuid,
                after_id: i64,
                limit: i64,
            ) -> StoreResult<Vec<Event>> {
                let query = Sql::<Self>::query(
                    "SELECT * FROM events WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                )
                .bind(run_id.to_string())
                .bind(after_id)
                .bind(limit);
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::event_from).await
            }

            async fn recent_events(&self, limit: i64) -> StoreResult<Vec<Event>> {
                let query = Sql::<Self>::query("SELECT * FROM events ORDER BY id DESC LIMIT $1").bind(limit);
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::event_from).await
            }

            async fn audit_page(
                &self,
                people_only: bool,
                before_id: Option<i64>,
                limit: i64,
            ) -> StoreResult<Vec<Event>> {
                // Two texts, so the people-only one carries the partial
                // index events_by_people's condition word for word.
                let sql = if people_only {
                    "SELECT * FROM events WHERE actor LIKE 'user:%' AND id < $1 ORDER BY id DESC LIMIT $2"
                } else {
                    "SELECT * FROM events WHERE id < $1 ORDER BY id DESC LIMIT $2"
                };
                let query = Sql::<Self>::query(sql)
                    .bind(before_id.unwrap_or(i64::MAX))
                    .bind(limit);
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::event_from).await
            }

            async fn all_events_after(&self, after_id: i64, limit: i64) -> StoreResult<Vec<Event>> {
                let query = Sql::<Self>::query("SELECT * FROM events WHERE id > $1 ORDER BY id LIMIT $2")
                    .bind(after_id)
                    .bind(limit);
                Sql::<Self>::all(&mut *self.read_conn().await?, query, Sql::<Self>::event_from).await
            }

            async fn add_user(&self, username: &str, password_hash: &str, role: Role) -> StoreResult<User> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let row = Sql::<Self>::query(
                            "INSERT INTO users (username, password_hash, role, created_at) VALUES ($1, $2, $3, $4) RETURNING *",
                        )
                        .bind(username)
                        .bind(password_hash)
                        .bind(role.as_str())
                        .bind(now)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(|e| db_error(e, || format!("user {username}")))?;
                let user = Sql::<Self>::user_from(&row)?;
                Sql::<Self>::user_event(
                    &mut tx,
                    &user,
                    None,
                    Some(role.as_str()),
                    format!("user {username} added"),
                    now,
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(user)
            }

            async fn credentials(&self, username: &str) -> StoreResult<Option<Credentials>> {
                let row = Sql::<Self>::query("SELECT * FROM users WHERE lower(username) = lower($1)")
                    .bind(username)
                    .fetch_optional(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?;
                row.map(|row| {
                    Ok(Credentials {
                        user: Sql::<Self>::user_from(&row)?,
                        password_hash: Sql::<Self>::text(&row, "password_hash")?,
                    })
                })
                .transpose()
            }

            async fn remove_user(&self, username: &str) -> StoreResult<User> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let row =
                    Sql::<Self>::query("DELETE FROM users WHERE lower(username) = lower($1) RETURNING *")
                        .bind(username)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?
                        .ok_or_else(|| StoreError::NotFound {
                            what: format!("user {username}"),
                        })?;
                let user = Sql::<Self>::user_from(&row)?;
                Sql::<Self>::user_event(
                    &mut tx,
                    &user,
                    Some(user.role.as_str()),
                    None,
                    format!("user {} removed", user.username),
                    Utc::now(),
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(user)
            }

            async fn set_role(&self, username: &str, role: Role) -> StoreResult<User> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let before = Sql::<Self>::user_named(&mut tx, username).await?;
                let row = Sql::<Self>::query("UPDATE users SET role = $1 WHERE id = $2 RETURNING *")
                    .bind(role.as_str())
                    .bind(before.id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                let user = Sql::<Self>::user_from(&row)?;
                Sql::<Self>::user_event(
                    &mut tx,
                    &user,
                    Some(before.role.as_str()),
                    Some(role.as_str()),
                    format!("role of {} changed", user.username),
                    Utc::now(),
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(user)
            }

            async fn set_group(&self, username: &str, group: &str, member: bool) -> StoreResult<User> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let before = Sql::<Self>::user_named(&mut tx, username).await?;
                let mut groups = before.groups.clone();
                groups.retain(|g| g != group);
                if member {
                    groups.push(group.to_owned());
                }
                let row = Sql::<Self>::query("UPDATE users SET member_of = $1 WHERE id = $2 RETURNING *")
                    .bind(serde_json::to_string(&groups).map_err(|e| StoreError::Invalid(e.to_string()))?)
                    .bind(before.id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                let user = Sql::<Self>::user_from(&row)?;
                Sql::<Self>::user_event(
                    &mut tx,
                    &user,
                    None,
                    None,
                    format!(
                        "{} {} group {group} (now in: {})",
                        user.username,
                        if member { "added to" } else { "removed from" },
                        if user.groups.is_empty() { "no group".to_owned() } else { user.groups.join(", ") }
                    ),
                    Utc::now(),
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(user)
            }

            async fn revoke_tokens(&self, agent: &str) -> StoreResult<u64> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let revoked = Sql::<Self>::query(
                    "UPDATE api_tokens SET revoked_at = $1 WHERE agent = $2 AND revoked_at IS NULL",
                )
                .bind(now)
                .bind(agent)
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: None,
                        entity: EventEntity::Token,
                        entity_id: None,
                        actor: &Actor::System,
                        from: None,
                        to: Some("revoked"),
                        detail: Some(format!("{revoked} token(s) of agent {agent} revoked")),
                        at: now,
                    },
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(revoked)
            }

            async fn add_api_token(
                &self,
                agent: &str,
                token_hash: &str,
                label: Option<&str>,
            ) -> StoreResult<ApiToken> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let row = Sql::<Self>::query(
                            "INSERT INTO api_tokens (agent, token_hash, label, created_at) VALUES ($1, $2, $3, $4) RETURNING *",
                        )
                        .bind(agent)
                        .bind(token_hash)
                        .bind(label)
                        .bind(now)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(|e| db_error(e, || "api token".to_owned()))?;
                let token = ApiToken {
                    id: Sql::<Self>::get(&row, "id")?,
                    agent: Sql::<Self>::text(&row, "agent")?,
                    label: Sql::<Self>::opt_text(&row, "label")?,
                    created_at: Sql::<Self>::get(&row, "created_at")?,
                };
                Sql::<Self>::append_event(
                    &mut tx,
                    EventLine {
                        run_id: None,
                        entity: EventEntity::Token,
                        entity_id: Some(token.id),
                        actor: &Actor::System,
                        from: None,
                        to: None,
                        detail: Some(format!("token created for agent {agent}")),
                        at: now,
                    },
                )
                .await?;
                Sql::<Self>::commit(tx).await?;
                Ok(token)
            }

            async fn agent_for_token(&self, token_hash: &str) -> StoreResult<Option<String>> {
                let row = Sql::<Self>::query(
                    "SELECT agent FROM api_tokens WHERE token_hash = $1 AND revoked_at IS NULL",
                )
                .bind(token_hash)
                .fetch_optional(&mut *self.read_conn().await?)
                .await
                .map_err(db)?;
                row.map(|row| Sql::<Self>::text(&row, "agent")).transpose()
            }
        }
    };
}

mod backends;

#[cfg(test)]
mod tests {
    use crate::saga::status::StepStatus;

    #[test]
    fn the_unsettled_list_in_sql_is_every_unsettled_status() {
        let mut unsettled: Vec<&str> = StepStatus::ALL
            .into_iter()
            .filter(|s| !s.is_settled())
            .map(|s| s.as_str())
            .collect();
        unsettled.sort_unstable();
        let mut in_sql: Vec<&str> = unsettled_sql!()
            .trim_matches(['(', ')'])
            .split(", ")
            .map(|s| s.trim_matches('\''))
            .collect();
        in_sql.sort_unstable();
        assert_eq!(unsettled, in_sql);
    }
}
