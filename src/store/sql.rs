//! The SQL both backends share. The queries are written once in the common
//! dialect (`$n` parameters, `RETURNING`, `ON CONFLICT`) and expanded for
//! each backend's concrete sqlx types by [`saga_store_sql!`]; what differs
//! (connections, durability, row locks) lives in sqlite.rs and postgres.rs.
//!
//! Each backend module provides, before invoking the macro:
//! - `async fn write(&self, Durability) -> StoreResult<PoolConnection<Db>>`:
//!   a connection ready for a write transaction at that durability;
//! - `async fn lazy_commit(tx: &mut Db::Connection, Durability)`: what the
//!   backend does inside the transaction for a lazy outcome commit;
//! - `async fn read_conn(&self) -> StoreResult<impl DerefMut<Target = Db::Connection>>`:
//!   a connection for reads.

use crate::saga::model::Actor;
use crate::saga::store::StoreError;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Maps a driver error; unique violations become `Duplicate { what }`.
pub(crate) fn db_error(err: sqlx::Error, what: impl FnOnce() -> String) -> StoreError {
    match &err {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Duplicate { what: what() }
        }
        _ => StoreError::Database(err.to_string()),
    }
}

pub(crate) fn db(err: sqlx::Error) -> StoreError {
    StoreError::Database(err.to_string())
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
    pub entity: &'static str,
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
    pub(crate) fn entity(self) -> &'static str {
        match self {
            Settled::Step => "step",
            Settled::Compensation => "compensation",
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

macro_rules! saga_store_sql {
    ($Store:ident, $Db:ty, $backend:expr, for_update = $for_update:literal) => {
        use $crate::saga::class::{Audience, Phase, Role, ToolClass};
        use $crate::saga::model::*;
        use $crate::saga::status::*;
        use $crate::saga::store::{Backend, RunsPage, SagaStore, StoreError, StoreResult};
        use $crate::store::sql::{corrupt, db, db_error, parse_uuid, placeholders, EventLine, Settled};
        use chrono::Utc;
        use serde_json::Value;
        use sqlx::types::Json;
        use sqlx::{Connection as _, Row as _};
        use uuid::Uuid;

        type DbRow = <$Db as sqlx::Database>::Row;
        type DbConn = <$Db as sqlx::Database>::Connection;
        type DbArgs<'q> = <$Db as sqlx::Database>::Arguments<'q>;

        /// A statement, kept prepared on its connection unless the backend
        /// says a pooler would hand it to another server.
        fn query(sql: &str) -> sqlx::query::Query<'_, $Db, DbArgs<'_>> {
            sqlx::query(sql).persistent($Store::keeps_statements())
        }

        fn query_scalar<O>(sql: &str) -> sqlx::query::QueryScalar<'_, $Db, O, DbArgs<'_>>
        where
            (O,): for<'r> sqlx::FromRow<'r, DbRow>,
        {
            sqlx::query_scalar(sql).persistent($Store::keeps_statements())
        }

        fn text(row: &DbRow, column: &str) -> StoreResult<String> {
            row.try_get::<String, _>(column).map_err(|e| corrupt(column, e))
        }

        fn opt_text(row: &DbRow, column: &str) -> StoreResult<Option<String>> {
            row.try_get::<Option<String>, _>(column).map_err(|e| corrupt(column, e))
        }

        fn opt_actor(row: &DbRow, column: &str) -> StoreResult<Option<Actor>> {
            Ok(opt_text(row, column)?.map(|stored| Actor::parse(&stored)))
        }

        fn parsed<T: std::str::FromStr>(row: &DbRow, column: &str) -> StoreResult<T>
        where
            T::Err: std::fmt::Display,
        {
            text(row, column)?.parse::<T>().map_err(|e| corrupt(column, e))
        }

        fn opt_parsed<T: std::str::FromStr>(row: &DbRow, column: &str) -> StoreResult<Option<T>>
        where
            T::Err: std::fmt::Display,
        {
            opt_text(row, column)?
                .map(|t| t.parse::<T>().map_err(|e| corrupt(column, e)))
                .transpose()
        }

        fn get<T>(row: &DbRow, column: &str) -> StoreResult<T>
        where
            T: for<'r> sqlx::Decode<'r, $Db> + sqlx::Type<$Db>,
        {
            row.try_get::<T, _>(column).map_err(|e| corrupt(column, e))
        }

        fn json(row: &DbRow, column: &str) -> StoreResult<Value> {
            Ok(get::<Json<Value>>(row, column)?.0)
        }

        fn opt_json(row: &DbRow, column: &str) -> StoreResult<Option<Value>> {
            Ok(get::<Option<Json<Value>>>(row, column)?.map(|j| j.0))
        }

        /// Sorts the rows of a claim's read (a run row, then its unsettled
        /// steps, then its settled steps still owed to the agent, from one
        /// batch of statements) by the columns they carry.
        fn run_and_unsettled(rows: &[DbRow]) -> StoreResult<$crate::saga::store::ClaimedRead> {
            let mut read = $crate::saga::store::ClaimedRead::default();
            for row in rows {
                if row.try_column("step_idx").is_ok() {
                    let step = step_from(row)?;
                    if step.owed_to_agent {
                        read.owed.push(step.clone());
                    }
                    if !step.status.is_settled() {
                        read.unsettled.push(step);
                    }
                } else if row.try_column("next_step").is_ok() {
                    read.run = Some(run_from(row)?);
                }
            }
            read.owed.sort_by_key(|s| s.step_idx);
            Ok(read)
        }

        fn run_from(row: &DbRow) -> StoreResult<Run> {
            Ok(Run {
                id: parse_uuid("runs.id", &text(row, "id")?)?,
                agent: text(row, "agent")?,
                label: opt_text(row, "label")?,
                purpose: text(row, "purpose")?,
                status: parsed(row, "status")?,
                resume_to: opt_parsed(row, "resume_to")?,
                next_step: get(row, "next_step")?,
                pivot_approval_id: get(row, "pivot_approval_id")?,
                irreversible_before_pivot: get(row, "irreversible_before_pivot")?,
                created_at: get(row, "created_at")?,
                updated_at: get(row, "updated_at")?,
            })
        }

        fn step_from(row: &DbRow) -> StoreResult<Step> {
            Ok(Step {
                run_id: parse_uuid("saga_log.run_id", &text(row, "run_id")?)?,
                step_idx: get(row, "step_idx")?,
                tool: text(row, "tool")?,
                tool_class: parsed::<ToolClass>(row, "tool_class")?,
                idempotency_key: text(row, "idempotency_key")?,
                args: json(row, "args")?,
                status: parsed(row, "status")?,
                external_ref: opt_text(row, "external_ref")?,
                compensation: opt_json(row, "compensation")?,
                audience: parsed::<Audience>(row, "audience")?,
                result: opt_json(row, "result")?,
                error: opt_text(row, "error")?,
                phase: parsed::<Phase>(row, "phase")?,
                approved_individually: get(row, "approved_individually")?,
                owed_to_agent: get(row, "owed_to_agent")?,
                created_at: get(row, "created_at")?,
                updated_at: get(row, "updated_at")?,
            })
        }

        fn compensation_from(row: &DbRow) -> StoreResult<Compensation> {
            Ok(Compensation {
                run_id: parse_uuid("compensations.run_id", &text(row, "run_id")?)?,
                step_idx: get(row, "step_idx")?,
                tool: text(row, "tool")?,
                idempotency_key: text(row, "idempotency_key")?,
                args: json(row, "args")?,
                status: parsed(row, "status")?,
                external_ref: opt_text(row, "external_ref")?,
                result: opt_json(row, "result")?,
                error: opt_text(row, "error")?,
                created_at: get(row, "created_at")?,
                updated_at: get(row, "updated_at")?,
            })
        }

        fn approval_from(row: &DbRow) -> StoreResult<Approval> {
            let kind = match text(row, "kind")?.as_str() {
                "pivot" => ApprovalKind::Pivot,
                "step" => ApprovalKind::Step,
                other => return Err(corrupt("approvals.kind", other)),
            };
            Ok(Approval {
                id: get(row, "id")?,
                run_id: parse_uuid("approvals.run_id", &text(row, "run_id")?)?,
                kind,
                step_idx: get(row, "step_idx")?,
                summary: text(row, "summary")?,
                plan: json(row, "plan")?,
                digest: text(row, "digest")?,
                status: parsed(row, "status")?,
                expires_at: get(row, "expires_at")?,
                decided_by: opt_actor(row, "decided_by")?,
                decided_at: get(row, "decided_at")?,
                note: opt_text(row, "note")?,
                created_at: get(row, "created_at")?,
                approvers_needed: get(row, "approvers_needed")?,
                first_approver: opt_actor(row, "first_approver")?,
                first_approved_at: get(row, "first_approved_at")?,
            })
        }

        fn correction_from(row: &DbRow) -> StoreResult<Correction> {
            let source = match text(row, "source")?.as_str() {
                "step" => CorrectionSource::Step,
                "compensation" => CorrectionSource::Compensation,
                other => return Err(corrupt("corrections.source", other)),
            };
            Ok(Correction {
                id: get(row, "id")?,
                run_id: parse_uuid("corrections.run_id", &text(row, "run_id")?)?,
                step_idx: get(row, "step_idx")?,
                source,
                tool: text(row, "tool")?,
                audience: parsed::<Audience>(row, "audience")?,
                rank: get(row, "rank")?,
                template: text(row, "template")?,
                recipients: get::<Json<Vec<String>>>(row, "recipients")?.0,
                message: text(row, "message")?,
                status: parsed(row, "status")?,
                idempotency_key: text(row, "idempotency_key")?,
                send_status: opt_parsed(row, "send_status")?,
                external_ref: opt_text(row, "external_ref")?,
                decided_by: opt_actor(row, "decided_by")?,
                decided_at: get(row, "decided_at")?,
                dismiss_reason: opt_text(row, "dismiss_reason")?,
                created_at: get(row, "created_at")?,
                updated_at: get(row, "updated_at")?,
            })
        }

        fn notice_from(row: &DbRow) -> StoreResult<Notice> {
            Ok(Notice {
                approval_id: get(row, "approval_id")?,
                run_id: parse_uuid("approval_notices.run_id", &text(row, "run_id")?)?,
                place: text(row, "place")?,
                idempotency_key: text(row, "idempotency_key")?,
                channel: text(row, "channel")?,
                status: parsed(row, "status")?,
                message_ref: opt_text(row, "message_ref")?,
                shown: opt_text(row, "shown")?,
                done: get(row, "done")?,
                error: opt_text(row, "error")?,
                created_at: get(row, "created_at")?,
                updated_at: get(row, "updated_at")?,
            })
        }

                fn event_from(row: &DbRow) -> StoreResult<Event> {
            Ok(Event {
                id: get(row, "id")?,
                run_id: opt_text(row, "run_id")?
                    .map(|t| parse_uuid("events.run_id", &t))
                    .transpose()?,
                entity: text(row, "entity")?,
                entity_id: get(row, "entity_id")?,
                actor: Actor::parse(&text(row, "actor")?),
                from_status: opt_text(row, "from_status")?,
                to_status: opt_text(row, "to_status")?,
                detail: opt_text(row, "detail")?,
                at: get(row, "at")?,
            })
        }

        fn user_from(row: &DbRow) -> StoreResult<User> {
            Ok(User {
                id: get(row, "id")?,
                username: text(row, "username")?,
                role: parsed::<Role>(row, "role")?,
                created_at: get(row, "created_at")?,
            })
        }

        /// The audit line of a change to a person's account (made from the
        /// command line, so by the system).
        async fn user_event(
            conn: &mut DbConn,
            user: &User,
            from: Option<&str>,
            to: Option<&str>,
            detail: String,
            at: chrono::DateTime<Utc>,
        ) -> StoreResult<()> {
            append_event(
                conn,
                EventLine {
                    run_id: None,
                    entity: "user",
                    entity_id: Some(user.id),
                    actor: &Actor::System,
                    from,
                    to,
                    detail: Some(detail),
                    at,
                },
            )
            .await
        }

        async fn append_event(conn: &mut DbConn, line: EventLine<'_>) -> StoreResult<()> {
            query(
                "INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status, detail, at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(line.run_id.map(|id| id.to_string()))
            .bind(line.entity)
            .bind(line.entity_id)
            .bind(line.actor.to_string())
            .bind(line.from)
            .bind(line.to)
            .bind(line.detail)
            .bind(line.at)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            Ok(())
        }

        /// Reads a run's row, locked for the rest of the transaction where
        /// the backend has row locks (per-run serialisation across processes).
        async fn lock_run(conn: &mut DbConn, id: Uuid) -> StoreResult<Run> {
            let row = query(concat!("SELECT * FROM runs WHERE id = $1", $for_update))
                .bind(id.to_string())
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?
                .ok_or_else(|| StoreError::NotFound { what: format!("run {id}") })?;
            run_from(&row)
        }

        /// The one place a run's status is written.
        async fn apply_run_move(
            conn: &mut DbConn,
            id: Uuid,
            from: RunStatus,
            to: RunStatus,
            actor: &Actor,
            detail: Option<&str>,
        ) -> StoreResult<Run> {
            let current = lock_run(conn, id).await?;
            if current.status != from {
                return Err(StoreError::Stale {
                    what: format!("run {id}"),
                    expected: from.to_string(),
                    actual: current.status.to_string(),
                });
            }
            check_run_transition(from, to, current.resume_to)?;
            let resume_to = if to == RunStatus::NeedsAttention {
                Some(from)
            } else {
                None
            };
            let now = Utc::now();
            let row = query(
                "UPDATE runs SET status = $1, resume_to = $2, updated_at = $3 WHERE id = $4 RETURNING *",
            )
            .bind(to.as_str())
            .bind(resume_to.map(|s| s.as_str()))
            .bind(now)
            .bind(id.to_string())
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
            append_event(
                conn,
                EventLine {
                    run_id: Some(id),
                    entity: "run",
                    entity_id: None,
                    actor,
                    from: Some(from.as_str()),
                    to: Some(to.as_str()),
                    detail: detail.map(str::to_owned),
                    at: now,
                },
            )
            .await?;
            run_from(&row)
        }

        /// Why a compare-and-set found nothing: the row is missing, or it
        /// moved on.
        async fn missing_or_stale(
            conn: &mut DbConn,
            sql: &'static str,
            what: String,
            run_id: Uuid,
            step_idx: i64,
            expected: StepStatus,
        ) -> StoreError {
            let found = query(sql)
                .bind(run_id.to_string())
                .bind(step_idx)
                .fetch_optional(&mut *conn)
                .await;
            match found {
                Ok(Some(row)) => match text(&row, "status") {
                    Ok(actual) => StoreError::Stale {
                        what,
                        expected: expected.to_string(),
                        actual,
                    },
                    Err(e) => e,
                },
                Ok(None) => StoreError::NotFound { what },
                Err(e) => db(e),
            }
        }

        /// Refuses a new step that could never be logged, before any SQL.
        fn check_new_step(new: &NewStep) -> StoreResult<()> {
            if new.tool_class == ToolClass::Pure {
                return Err(StoreError::Invalid(format!(
                    "{} is pure: pure calls are never written to the saga log (R2)",
                    new.tool
                )));
            }
            if !matches!(new.status, StepStatus::Intended | StepStatus::AwaitingApproval) {
                return Err(StoreError::Invalid(format!(
                    "a new step starts INTENDED or AWAITING_APPROVAL, not {}",
                    new.status
                )));
            }
            Ok(())
        }

        /// Whether a new step counts against the run's irreversible calls
        /// before the pivot (it is sent now, unapproved by a pivot).
        fn counts_as_irreversible(new: &NewStep) -> bool {
            new.tool_class == ToolClass::Irreversible
                && new.phase == Phase::BeforePivot
                && new.status == StepStatus::Intended
        }

        /// Why a run did not take a new step at `step_idx`: it is missing,
        /// the index is taken, or it skips ahead.
        async fn why_step_refused(conn: &mut DbConn, run_id: Uuid, step_idx: i64) -> StoreError {
            let found = query("SELECT next_step FROM runs WHERE id = $1")
                .bind(run_id.to_string())
                .fetch_optional(&mut *conn)
                .await;
            match found {
                Ok(None) => StoreError::NotFound { what: format!("run {run_id}") },
                Ok(Some(row)) => match get::<i64>(&row, "next_step") {
                    Ok(next) if step_idx < next => StoreError::StepExists { step_idx },
                    Ok(next) => StoreError::StepOutOfOrder { given: step_idx, expected: next },
                    Err(e) => e,
                },
                Err(e) => db(e),
            }
        }

        /// Inserts a new step at the run's next index, inside the caller's
        /// transaction. The guarded counter update comes first: it takes the
        /// run's row lock and checks the index in one statement.
        async fn insert_step(conn: &mut DbConn, new: NewStep, actor: &Actor) -> StoreResult<Step> {
            check_new_step(&new)?;
            let now = Utc::now();
            let advanced = query(
                "UPDATE runs SET next_step = next_step + 1,
                    irreversible_before_pivot = irreversible_before_pivot + $1, updated_at = $2
                 WHERE id = $3 AND next_step = $4",
            )
            .bind(i64::from(counts_as_irreversible(&new)))
            .bind(now)
            .bind(new.run_id.to_string())
            .bind(new.step_idx)
            .execute(&mut *conn)
            .await
            .map_err(db)?;
            if advanced.rows_affected() == 0 {
                return Err(why_step_refused(conn, new.run_id, new.step_idx).await);
            }
            let row = bind_new_step(
                query(concat!($crate::store::sql::new_step_insert!(), " RETURNING *")),
                &new,
                now,
            )
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| db_error(e, || format!("idempotency key {}", new.idempotency_key)))?;
            append_event(
                &mut *conn,
                EventLine {
                    run_id: Some(new.run_id),
                    entity: "step",
                    entity_id: Some(new.step_idx),
                    actor,
                    from: None,
                    to: Some(new.status.as_str()),
                    detail: Some(step_event_detail(&new)),
                    at: now,
                },
            )
            .await?;
            step_from(&row)
        }

        /// Binds run statuses, in order, to the placeholders `placeholders`
        /// wrote.
        fn bind_statuses<'q>(
            mut query: sqlx::query::Query<'q, $Db, <$Db as sqlx::Database>::Arguments<'q>>,
            statuses: &[RunStatus],
        ) -> sqlx::query::Query<'q, $Db, <$Db as sqlx::Database>::Arguments<'q>> {
            for status in statuses {
                query = query.bind(status.as_str());
            }
            query
        }

        /// Binds `$1`–`$11` of `new_step_insert!`.
        fn bind_new_step<'q>(
            query: sqlx::query::Query<'q, $Db, <$Db as sqlx::Database>::Arguments<'q>>,
            new: &NewStep,
            at: chrono::DateTime<Utc>,
        ) -> sqlx::query::Query<'q, $Db, <$Db as sqlx::Database>::Arguments<'q>> {
            query
                .bind(new.run_id.to_string())
                .bind(new.step_idx)
                .bind(new.tool.clone())
                .bind(new.tool_class.as_str())
                .bind(new.idempotency_key.clone())
                .bind(Json(new.args.clone()))
                .bind(new.status.as_str())
                .bind(new.compensation.clone().map(Json))
                .bind(new.audience.as_str())
                .bind(new.phase.as_str())
                .bind(at)
        }

        /// Binds `$1`–`$8` of `outcome_cas!`.
        fn bind_outcome<'q>(
            query: sqlx::query::Query<'q, $Db, <$Db as sqlx::Database>::Arguments<'q>>,
            outcome: &Outcome,
            at: chrono::DateTime<Utc>,
            run_id: Uuid,
            step_idx: i64,
        ) -> sqlx::query::Query<'q, $Db, <$Db as sqlx::Database>::Arguments<'q>> {
            query
                .bind(outcome.to.as_str())
                .bind(outcome.external_ref.clone())
                .bind(outcome.result.clone().map(Json))
                .bind(outcome.error.clone())
                .bind(at)
                .bind(run_id.to_string())
                .bind(step_idx)
                .bind(outcome.from.as_str())
        }

        fn step_event_detail(new: &NewStep) -> String {
            format!("{} key={}", new.tool, new.idempotency_key)
        }

        /// Inserts an approval request; a pivot request supersedes the run's
        /// pending one and becomes the run's pivot.
        async fn insert_approval(
            conn: &mut DbConn,
            new: NewApproval,
            run_move: Option<(RunStatus, RunStatus)>,
            actor: &Actor,
        ) -> StoreResult<Approval> {
                if new.kind == ApprovalKind::Step && new.step_idx.is_none() {
                    return Err(StoreError::Invalid("a single-step approval names its step".into()));
                }
                lock_run(&mut *conn, new.run_id).await?;
                let now = Utc::now();
                if new.kind == ApprovalKind::Pivot {
                    let superseded = query(
                        "UPDATE approvals SET status = $1 WHERE run_id = $2 AND kind = 'pivot' AND status = $3 RETURNING id",
                    )
                    .bind(ApprovalStatus::Superseded.as_str())
                    .bind(new.run_id.to_string())
                    .bind(ApprovalStatus::Pending.as_str())
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db)?;
                    for row in superseded {
                        append_event(
                            &mut *conn,
                            EventLine {
                                run_id: Some(new.run_id),
                                entity: "approval",
                                entity_id: Some(get(&row, "id")?),
                                actor,
                                from: Some(ApprovalStatus::Pending.as_str()),
                                to: Some(ApprovalStatus::Superseded.as_str()),
                                detail: Some("a new plan was proposed".into()),
                                at: now,
                            },
                        )
                        .await?;
                    }
                }
                let row = query(
                    "INSERT INTO approvals (run_id, kind, step_idx, summary, plan, digest, status, expires_at, created_at,
                        approvers_needed)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                     RETURNING *",
                )
                .bind(new.run_id.to_string())
                .bind(new.kind.as_str())
                .bind(new.step_idx)
                .bind(&new.summary)
                .bind(Json(&new.plan))
                .bind(&new.digest)
                .bind(ApprovalStatus::Pending.as_str())
                .bind(new.expires_at)
                .bind(now)
                .bind(new.approvers_needed)
                .fetch_one(&mut *conn)
                .await
                .map_err(db)?;
                let approval = approval_from(&row)?;
                if new.kind == ApprovalKind::Pivot {
                    query("UPDATE runs SET pivot_approval_id = $1, updated_at = $2 WHERE id = $3")
                        .bind(approval.id)
                        .bind(now)
                        .bind(new.run_id.to_string())
                        .execute(&mut *conn)
                        .await
                        .map_err(db)?;
                }
                append_event(
                    &mut *conn,
                    EventLine {
                        run_id: Some(new.run_id),
                        entity: "approval",
                        entity_id: Some(approval.id),
                        actor,
                        from: None,
                        to: Some(ApprovalStatus::Pending.as_str()),
                        detail: Some(format!("{} approval requested", new.kind.as_str())),
                        at: now,
                    },
                )
                .await?;
                if let Some((from, to)) = run_move {
                    apply_run_move(&mut *conn, new.run_id, from, to, actor, Some("approval requested")).await?;
                }
                Ok(approval)
        }

        /// Moves a step to its outcome inside the caller's transaction.
        async fn settle_step_in(
            conn: &mut DbConn,
            run_id: Uuid,
            step_idx: i64,
            outcome: Outcome,
            actor: &Actor,
        ) -> StoreResult<Step> {
            let now = Utc::now();
            let row =
                outcome_row(conn, Settled::Step, &outcome, now, actor, run_id, step_idx).await?;
            let mut step = step_from(&row)?;
            // An irreversible call held before the pivot runs on its own
            // approval: counted against the run, and marked as approved.
            if approves_individually(&outcome) && step.tool_class == ToolClass::Irreversible
                && step.phase == Phase::BeforePivot
            {
                query("UPDATE saga_log SET approved_individually = $1 WHERE run_id = $2 AND step_idx = $3")
                    .bind(true)
                    .bind(run_id.to_string())
                    .bind(step_idx)
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                query("UPDATE runs SET irreversible_before_pivot = irreversible_before_pivot + 1 WHERE id = $1")
                    .bind(run_id.to_string())
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                step.approved_individually = true;
            }
            Ok(step)
        }

        /// A held step released by a person's approval: the one move that
        /// may mark a step approved on its own.
        fn approves_individually(outcome: &Outcome) -> bool {
            outcome.from == StepStatus::AwaitingApproval && outcome.to == StepStatus::Intended
        }

        fn settle_event_detail(outcome: &Outcome) -> Option<String> {
            outcome.external_ref.clone().or(outcome.error.clone())
        }

        /// Why a step's compare-and-set found nothing.
        async fn step_not_settled(
            conn: &mut DbConn,
            run_id: Uuid,
            step_idx: i64,
            expected: StepStatus,
        ) -> StoreError {
            missing_or_stale(
                conn,
                Settled::Step.status_of(),
                Settled::Step.what(run_id, step_idx),
                run_id,
                step_idx,
                expected,
            )
            .await
        }

        /// An outcome's compare-and-set on a step or compensation row, with
        /// its audit line, inside the caller's transaction: the moved row, or
        /// why nothing moved.
        async fn outcome_row(
            conn: &mut DbConn,
            kind: Settled,
            outcome: &Outcome,
            at: chrono::DateTime<Utc>,
            actor: &Actor,
            run_id: Uuid,
            step_idx: i64,
        ) -> StoreResult<DbRow> {
            let found = bind_outcome(query(kind.cas()), outcome, at, run_id, step_idx)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
            match found {
                Some(row) => {
                    append_event(
                        conn,
                        EventLine {
                            run_id: Some(run_id),
                            entity: kind.entity(),
                            entity_id: Some(step_idx),
                            actor,
                            from: Some(outcome.from.as_str()),
                            to: Some(outcome.to.as_str()),
                            detail: settle_event_detail(outcome),
                            at,
                        },
                    )
                    .await?;
                    Ok(row)
                }
                None => Err(missing_or_stale(
                    conn,
                    kind.status_of(),
                    kind.what(run_id, step_idx),
                    run_id,
                    step_idx,
                    outcome.from,
                )
                .await),
            }
        }

        async fn commit(tx: sqlx::Transaction<'_, $Db>) -> StoreResult<()> {
            tx.commit().await.map_err(db)
        }

        #[async_trait::async_trait]
        impl SagaStore for $Store {
            fn backend(&self) -> Backend {
                $backend
            }

            async fn claim_run(&self, run_id: Uuid) -> StoreResult<Box<dyn $crate::saga::store::RunClaim>> {
                self.claim(run_id).await
            }

            async fn claim_and_read(&self, run_id: Uuid) -> StoreResult<$crate::saga::store::ClaimedRun> {
                self.claim_and_read_here(run_id).await
            }

            async fn claim_and_record_step(
                &self,
                agent: &str,
                new: NewStep,
                actor: &Actor,
            ) -> StoreResult<Option<(Box<dyn $crate::saga::store::RunClaim>, Step)>> {
                self.claim_and_record_step_here(agent, new, actor).await
            }

            async fn settle_step_and_release(
                &self,
                run_id: Uuid,
                step_idx: i64,
                outcome: Outcome,
                durability: Durability,
                actor: &Actor,
                claim: &mut dyn $crate::saga::store::RunClaim,
            ) -> StoreResult<Step> {
                self.settle_step_and_release_here(run_id, step_idx, outcome, durability, actor, claim)
                    .await
            }

            async fn try_claim_run(&self, run_id: Uuid) -> StoreResult<Option<Box<dyn $crate::saga::store::RunClaim>>> {
                self.claim_now(run_id).await
            }

            async fn create_run(&self, new: NewRun) -> StoreResult<(Run, bool)> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let id = Uuid::new_v4();
                let now = Utc::now();
                let inserted = query(
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
                    append_event(
                        &mut tx,
                        EventLine {
                            run_id: Some(id),
                            entity: "run",
                            entity_id: None,
                            actor: &Actor::Agent(new.agent.clone()),
                            from: None,
                            to: Some(RunStatus::Running.as_str()),
                            detail: Some(new.purpose.clone()),
                            at: now,
                        },
                    )
                    .await?;
                    query("SELECT * FROM runs WHERE id = $1")
                        .bind(id.to_string())
                        .fetch_one(&mut *tx)
                        .await
                } else {
                    query("SELECT * FROM runs WHERE agent = $1 AND label = $2")
                        .bind(&new.agent)
                        .bind(&new.label)
                        .fetch_one(&mut *tx)
                        .await
                }
                .map_err(db)?;
                commit(tx).await?;
                Ok((run_from(&row)?, inserted))
            }

            async fn run(&self, id: Uuid) -> StoreResult<Option<Run>> {
                query("SELECT * FROM runs WHERE id = $1")
                    .bind(id.to_string())
                    .fetch_optional(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .as_ref()
                    .map(run_from)
                    .transpose()
            }

            async fn list_runs(&self, limit: i64) -> StoreResult<Vec<Run>> {
                query("SELECT * FROM runs ORDER BY created_at DESC, id LIMIT $1")
                    .bind(limit)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(run_from)
                    .collect()
            }

            async fn runs_page(
                &self,
                status: Option<RunStatus>,
                offset: i64,
                limit: i64,
            ) -> StoreResult<RunsPage> {
                // '' matches every status: one statement for both backends.
                let wanted = status.map(|s| s.as_str()).unwrap_or("");
                let rows = query(
                    "SELECT runs.*, CAST(CASE
                         WHEN runs.status = 'AWAITING_APPROVAL' OR EXISTS (
                             SELECT 1 FROM approvals
                             WHERE approvals.run_id = runs.id AND approvals.status = 'pending')
                         THEN 0
                         WHEN runs.status = 'NEEDS_ATTENTION' THEN 1
                         ELSE 2 END AS BIGINT) AS waiting_rank
                     FROM runs
                     WHERE ($1 = '' OR runs.status = $1)
                     ORDER BY waiting_rank, runs.created_at DESC, runs.id
                     LIMIT $2 OFFSET $3",
                )
                .bind(wanted)
                .bind(limit)
                .bind(offset)
                .fetch_all(&mut *self.read_conn().await?)
                .await
                .map_err(db)?;
                let mut runs = Vec::with_capacity(rows.len());
                for row in &rows {
                    let rank: i64 = row.try_get("waiting_rank").map_err(|e| corrupt("waiting_rank", e))?;
                    runs.push((run_from(row)?, rank == 0));
                }
                let total: i64 = query_scalar(
                    "SELECT COUNT(*) FROM runs WHERE ($1 = '' OR status = $1)",
                )
                .bind(wanted)
                .fetch_one(&mut *self.read_conn().await?)
                .await
                .map_err(db)?;
                Ok(RunsPage { runs, total })
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
                bind_statuses(query(&sql).bind(before), statuses)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(|row| Ok((parse_uuid("run_id", &text(row, "run_id")?)?, get(row, "step_idx")?)))
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
                bind_statuses(query(&sql), statuses)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(run_from)
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
                let run = apply_run_move(&mut tx, id, from, to, actor, detail).await?;
                commit(tx).await?;
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
                let step = insert_step(&mut tx, new, actor).await?;
                let approval = insert_approval(&mut tx, approval, None, actor).await?;
                commit(tx).await?;
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
                    let step = settle_step_in(&mut tx, run_id, step_idx, outcome, actor).await?;
                    commit(tx).await?;
                    return Ok(step);
                }
                self.settle_step_alone(run_id, step_idx, outcome, durability, actor).await
            }

            async fn step(&self, run_id: Uuid, step_idx: i64) -> StoreResult<Option<Step>> {
                query("SELECT * FROM saga_log WHERE run_id = $1 AND step_idx = $2")
                    .bind(run_id.to_string())
                    .bind(step_idx)
                    .fetch_optional(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .as_ref()
                    .map(step_from)
                    .transpose()
            }

            async fn steps(&self, run_id: Uuid) -> StoreResult<Vec<Step>> {
                query("SELECT * FROM saga_log WHERE run_id = $1 ORDER BY step_idx")
                    .bind(run_id.to_string())
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(step_from)
                    .collect()
            }

            async fn unsettled_steps(&self, run_id: Uuid) -> StoreResult<Vec<Step>> {
                // The same condition as the partial index saga_log_open_by_run
                // (migration 0002), word for word, so both backends use it.
                query(concat!(
                    "SELECT * FROM saga_log WHERE run_id = $1 AND status IN ",
                    $crate::store::sql::unsettled_sql!(),
                    " ORDER BY step_idx"
                ))
                .bind(run_id.to_string())
                .fetch_all(&mut *self.read_conn().await?)
                .await
                .map_err(db)?
                .iter()
                .map(step_from)
                .collect()
            }

            async fn step_by_key(&self, idempotency_key: &str) -> StoreResult<Option<Step>> {
                query("SELECT * FROM saga_log WHERE idempotency_key = $1")
                    .bind(idempotency_key)
                    .fetch_optional(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .as_ref()
                    .map(step_from)
                    .transpose()
            }

            async fn set_owed_to_agent(&self, run_id: Uuid, step_idx: i64, owed: bool) -> StoreResult<()> {
                // Lazy: a lost flag is rebuilt by the agent's next re-send,
                // and any later durable commit carries it to disk (§9).
                let mut conn = self.write(Durability::Lazy).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                Self::lazy_commit(&mut tx, Durability::Lazy).await?;
                let changed = query(
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
                commit(tx).await
            }

            async fn note(&self, run_id: Uuid, actor: &Actor, detail: &str) -> StoreResult<()> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(run_id),
                        entity: "run",
                        entity_id: None,
                        actor,
                        from: None,
                        to: None,
                        detail: Some(detail.to_owned()),
                        at: Utc::now(),
                    },
                )
                .await?;
                commit(tx).await
            }

            async fn record_compensation(
                &self,
                new: NewCompensation,
                actor: &Actor,
            ) -> StoreResult<Compensation> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let step_status = query("SELECT status FROM saga_log WHERE run_id = $1 AND step_idx = $2")
                    .bind(new.run_id.to_string())
                    .bind(new.step_idx)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?
                    .ok_or_else(|| StoreError::NotFound {
                        what: format!("step {} of run {}", new.step_idx, new.run_id),
                    })?;
                let step_status: StepStatus = parsed(&step_status, "status")?;
                if step_status != StepStatus::Confirmed {
                    return Err(StoreError::Invalid(format!(
                        "step {} is {step_status}: only a confirmed step is compensated",
                        new.step_idx
                    )));
                }
                let now = Utc::now();
                let row = query(
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
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(new.run_id),
                        entity: "compensation",
                        entity_id: Some(new.step_idx),
                        actor,
                        from: None,
                        to: Some(StepStatus::Intended.as_str()),
                        detail: Some(format!("{} key={}", new.tool, new.idempotency_key)),
                        at: now,
                    },
                )
                .await?;
                commit(tx).await?;
                compensation_from(&row)
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
                let row = outcome_row(
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
                    check_step_transition(Lifecycle::Step, StepStatus::Confirmed, StepStatus::Compensated)?;
                    let moved = query(
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
                        return Err(step_not_settled(&mut tx, run_id, step_idx, StepStatus::Confirmed).await);
                    }
                    append_event(
                        &mut tx,
                        EventLine {
                            run_id: Some(run_id),
                            entity: "step",
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
                commit(tx).await?;
                compensation_from(&row)
            }

            async fn compensations(&self, run_id: Uuid) -> StoreResult<Vec<Compensation>> {
                query("SELECT * FROM compensations WHERE run_id = $1 ORDER BY created_at, step_idx")
                    .bind(run_id.to_string())
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(compensation_from)
                    .collect()
            }

            async fn request_approval(
                &self,
                new: NewApproval,
                run_move: Option<(RunStatus, RunStatus)>,
                actor: &Actor,
            ) -> StoreResult<Approval> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let approval = insert_approval(&mut tx, new, run_move, actor).await?;
                commit(tx).await?;
                Ok(approval)
            }

            async fn edit_plan(&self, change: PlanChange, actor: &Actor) -> StoreResult<Approval> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let found = query(
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
                    let current = query("SELECT status FROM approvals WHERE id = $1")
                        .bind(change.approval_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                    return Err(match current {
                        None => StoreError::NotFound { what: format!("approval {}", change.approval_id) },
                        Some(row) if text(&row, "status")? == ApprovalStatus::Pending.as_str() => StoreError::PlanChanged,
                        Some(row) => StoreError::Invalid(format!(
                            "approval {} is {}: only a waiting plan can be edited",
                            change.approval_id,
                            text(&row, "status")?.to_lowercase()
                        )),
                    });
                };
                let approval = approval_from(&row)?;
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(approval.run_id),
                        entity: "approval",
                        entity_id: Some(approval.id),
                        actor,
                        from: Some(ApprovalStatus::Pending.as_str()),
                        to: Some(ApprovalStatus::Pending.as_str()),
                        detail: Some(change.detail),
                        at: Utc::now(),
                    },
                )
                .await?;
                commit(tx).await?;
                Ok(approval)
            }

            async fn decide_approval(&self, decision: Decision, actor: &Actor) -> StoreResult<Approval> {
                check_approval_transition(ApprovalStatus::Pending, decision.to)?;
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let row = query(concat!("SELECT * FROM approvals WHERE id = $1", $for_update))
                    .bind(decision.approval_id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?
                    .ok_or_else(|| StoreError::NotFound {
                        what: format!("approval {}", decision.approval_id),
                    })?;
                let current = approval_from(&row)?;
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
                if decision.to == ApprovalStatus::Approved && current.approvers_needed > 1 {
                    let who = actor.to_string();
                    match &current.first_approver {
                        // The first of two: recorded; the approval still waits.
                        None => {
                            let row = query(
                                "UPDATE approvals SET first_approver = $1, first_approved_at = $2
                                 WHERE id = $3 AND status = $4 AND first_approver IS NULL RETURNING *",
                            )
                            .bind(&who)
                            .bind(now)
                            .bind(decision.approval_id)
                            .bind(ApprovalStatus::Pending.as_str())
                            .fetch_one(&mut *tx)
                            .await
                            .map_err(db)?;
                            append_event(
                                &mut tx,
                                EventLine {
                                    run_id: Some(current.run_id),
                                    entity: "approval",
                                    entity_id: Some(current.id),
                                    actor,
                                    from: Some(ApprovalStatus::Pending.as_str()),
                                    to: Some(ApprovalStatus::Pending.as_str()),
                                    detail: Some(format!(
                                        "approved, 1 of {}: a second, different approver decides{}",
                                        current.approvers_needed,
                                        decision.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
                                    )),
                                    at: now,
                                },
                            )
                            .await?;
                            commit(tx).await?;
                            return approval_from(&row);
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
                let row = query(
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
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(current.run_id),
                        entity: "approval",
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
                    apply_run_move(&mut tx, current.run_id, from, to, actor, Some("approval decided")).await?;
                }
                commit(tx).await?;
                approval_from(&row)
            }

            async fn approval(&self, id: i64) -> StoreResult<Option<Approval>> {
                query("SELECT * FROM approvals WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .as_ref()
                    .map(approval_from)
                    .transpose()
            }

            async fn approvals(&self, run_id: Uuid) -> StoreResult<Vec<Approval>> {
                query("SELECT * FROM approvals WHERE run_id = $1 ORDER BY id")
                    .bind(run_id.to_string())
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(approval_from)
                    .collect()
            }

            async fn pending_approvals(&self) -> StoreResult<Vec<Approval>> {
                query("SELECT * FROM approvals WHERE status = $1 ORDER BY created_at, id")
                    .bind(ApprovalStatus::Pending.as_str())
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(approval_from)
                    .collect()
            }

            async fn approvals_without_notice(&self) -> StoreResult<Vec<Approval>> {
                query(
                    "SELECT a.* FROM approvals a
                     WHERE a.status = $1
                       AND NOT EXISTS (SELECT 1 FROM approval_notices n WHERE n.approval_id = a.id)
                     ORDER BY a.created_at, a.id",
                )
                .bind(ApprovalStatus::Pending.as_str())
                .fetch_all(&mut *self.read_conn().await?)
                .await
                .map_err(db)?
                .iter()
                .map(approval_from)
                .collect()
            }

            async fn record_notice(&self, new: NewNotice) -> StoreResult<Notice> {
                let mut conn = self.write(Durability::Durable).await?;
                let now = Utc::now();
                query(
                    "INSERT INTO approval_notices (approval_id, place, run_id, idempotency_key, channel,
                        status, done, created_at, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)
                     ON CONFLICT (approval_id, place) DO NOTHING",
                )
                .bind(new.approval_id)
                .bind(&new.place)
                .bind(new.run_id.to_string())
                .bind(&new.idempotency_key)
                .bind(&new.channel)
                .bind(NoticeStatus::Intended.as_str())
                .bind(false)
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(|e| db_error(e, || format!("notice key {}", new.idempotency_key)))?;
                let row = query("SELECT * FROM approval_notices WHERE approval_id = $1 AND place = $2")
                    .bind(new.approval_id)
                    .bind(&new.place)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db)?;
                notice_from(&row)
            }

            async fn save_notice(&self, notice: &Notice) -> StoreResult<()> {
                let mut conn = self.write(Durability::Durable).await?;
                query(
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
                .bind(&notice.place)
                .execute(&mut *conn)
                .await
                .map_err(db)?;
                Ok(())
            }

            async fn open_notices(&self) -> StoreResult<Vec<Notice>> {
                query("SELECT * FROM approval_notices WHERE done = $1 ORDER BY created_at, approval_id")
                    .bind(false)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(notice_from)
                    .collect()
            }

            async fn notices(&self, approval_id: i64) -> StoreResult<Vec<Notice>> {
                query("SELECT * FROM approval_notices WHERE approval_id = $1 ORDER BY created_at")
                    .bind(approval_id)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(notice_from)
                    .collect()
            }

            async fn first_sighting(
                &self,
                signature: &str,
                now: chrono::DateTime<Utc>,
                forget_before: chrono::DateTime<Utc>,
            ) -> StoreResult<bool> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                query("DELETE FROM slack_requests WHERE seen_at < $1")
                    .bind(forget_before)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                let inserted = query(
                    "INSERT INTO slack_requests (signature, seen_at) VALUES ($1, $2)
                     ON CONFLICT (signature) DO NOTHING",
                )
                .bind(signature)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
                commit(tx).await?;
                Ok(inserted == 1)
            }

            async fn queue_correction(&self, new: NewCorrection, actor: &Actor) -> StoreResult<Correction> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let inserted = query(
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
                let row = query("SELECT * FROM corrections WHERE run_id = $1 AND step_idx = $2 AND source = $3")
                    .bind(new.run_id.to_string())
                    .bind(new.step_idx)
                    .bind(new.source.as_str())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                let correction = correction_from(&row)?;
                if inserted {
                    append_event(
                        &mut tx,
                        EventLine {
                            run_id: Some(new.run_id),
                            entity: "correction",
                            entity_id: Some(correction.id),
                            actor,
                            from: None,
                            to: Some(CorrectionStatus::Pending.as_str()),
                            detail: Some(format!("{} audience, {} recipient(s)", new.audience, new.recipients.len())),
                            at: now,
                        },
                    )
                    .await?;
                }
                commit(tx).await?;
                Ok(correction)
            }

            async fn edit_correction(&self, id: i64, message: &str, actor: &Actor) -> StoreResult<Correction> {
                if message.trim().is_empty() {
                    return Err(StoreError::Invalid("a correction's message cannot be empty".into()));
                }
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let found = query(
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
                    let status = query("SELECT status FROM corrections WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                    return Err(match status {
                        Some(row) => StoreError::Invalid(format!(
                            "correction {id} is {}: only a pending correction's text can change",
                            text(&row, "status")?
                        )),
                        None => StoreError::NotFound { what: format!("correction {id}") },
                    });
                };
                let correction = correction_from(&row)?;
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(correction.run_id),
                        entity: "correction",
                        entity_id: Some(id),
                        actor,
                        from: None,
                        to: None,
                        detail: Some("message edited".into()),
                        at: now,
                    },
                )
                .await?;
                commit(tx).await?;
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
                if to == CorrectionStatus::Dismissed && reason.map_or(true, |r| r.trim().is_empty()) {
                    return Err(StoreError::Invalid("dismissing a correction needs a reason".into()));
                }
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let found = query(
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
                    let status = query("SELECT status FROM corrections WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                    return Err(match status {
                        Some(row) => StoreError::Stale {
                            what: format!("correction {id}"),
                            expected: from.as_str().into(),
                            actual: text(&row, "status")?,
                        },
                        None => StoreError::NotFound { what: format!("correction {id}") },
                    });
                };
                let correction = correction_from(&row)?;
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(correction.run_id),
                        entity: "correction",
                        entity_id: Some(id),
                        actor,
                        from: Some(from.as_str()),
                        to: Some(to.as_str()),
                        detail: reason.map(str::to_owned),
                        at: now,
                    },
                )
                .await?;
                commit(tx).await?;
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
                let found = query(
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
                    let current = query("SELECT status, send_status FROM corrections WHERE id = $1")
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
                                text(&row, "status")?,
                                opt_text(&row, "send_status")?.unwrap_or_else(|| "not attempted".into())
                            ),
                        },
                        None => StoreError::NotFound { what: format!("correction {id}") },
                    });
                };
                let correction = correction_from(&row)?;
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: Some(correction.run_id),
                        entity: "correction",
                        entity_id: Some(id),
                        actor,
                        from: Some(outcome.from.as_str()),
                        to: Some(outcome.to.as_str()),
                        detail: Some(format!("send {}", outcome.to)),
                        at: now,
                    },
                )
                .await?;
                commit(tx).await?;
                Ok(correction)
            }

            async fn correction(&self, id: i64) -> StoreResult<Option<Correction>> {
                query("SELECT * FROM corrections WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .as_ref()
                    .map(correction_from)
                    .transpose()
            }

            async fn corrections(&self, run_id: Uuid) -> StoreResult<Vec<Correction>> {
                query("SELECT * FROM corrections WHERE run_id = $1 ORDER BY rank DESC, id")
                    .bind(run_id.to_string())
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(correction_from)
                    .collect()
            }

            async fn correction_queue(&self) -> StoreResult<Vec<Correction>> {
                query(
                    "SELECT * FROM corrections WHERE status IN ('pending', 'approved')
                     ORDER BY rank DESC, created_at, id",
                )
                .fetch_all(&mut *self.read_conn().await?)
                .await
                .map_err(db)?
                .iter()
                .map(correction_from)
                .collect()
            }

            async fn correction_inbox(&self) -> StoreResult<Vec<QueuedCorrection>> {
                let rows = query(
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
                        let original = match opt_text(row, "original_tool")? {
                            Some(tool) => Some(OriginalEffect {
                                tool,
                                args: json(row, "original_args")?,
                                external_ref: opt_text(row, "original_ref")?,
                            }),
                            None => None,
                        };
                        Ok(QueuedCorrection {
                            correction: correction_from(row)?,
                            run_title: text(row, "run_title")?,
                            original,
                        })
                    })
                    .collect()
            }

            async fn events(&self, run_id: Option<Uuid>, limit: i64) -> StoreResult<Vec<Event>> {
                let rows = match run_id {
                    Some(id) => {
                        query("SELECT * FROM events WHERE run_id = $1 ORDER BY id LIMIT $2")
                            .bind(id.to_string())
                            .bind(limit)
                            .fetch_all(&mut *self.read_conn().await?)
                            .await
                    }
                    None => {
                        query("SELECT * FROM events ORDER BY id LIMIT $1")
                            .bind(limit)
                            .fetch_all(&mut *self.read_conn().await?)
                            .await
                    }
                }
                .map_err(db)?;
                rows.iter().map(event_from).collect()
            }

            async fn events_after(&self, run_id: Uuid, after_id: i64, limit: i64) -> StoreResult<Vec<Event>> {
                query("SELECT * FROM events WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3")
                    .bind(run_id.to_string())
                    .bind(after_id)
                    .bind(limit)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(event_from)
                    .collect()
            }

            async fn recent_events(&self, limit: i64) -> StoreResult<Vec<Event>> {
                query("SELECT * FROM events ORDER BY id DESC LIMIT $1")
                    .bind(limit)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(event_from)
                    .collect()
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
                query(sql)
                    .bind(before_id.unwrap_or(i64::MAX))
                    .bind(limit)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(event_from)
                    .collect()
            }

            async fn all_events_after(&self, after_id: i64, limit: i64) -> StoreResult<Vec<Event>> {
                query("SELECT * FROM events WHERE id > $1 ORDER BY id LIMIT $2")
                    .bind(after_id)
                    .bind(limit)
                    .fetch_all(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(event_from)
                    .collect()
            }

            async fn add_user(&self, username: &str, password_hash: &str, role: Role) -> StoreResult<User> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let row = query(
                    "INSERT INTO users (username, password_hash, role, created_at) VALUES ($1, $2, $3, $4) RETURNING *",
                )
                .bind(username)
                .bind(password_hash)
                .bind(role.as_str())
                .bind(now)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| db_error(e, || format!("user {username}")))?;
                let user = user_from(&row)?;
                user_event(&mut tx, &user, None, Some(role.as_str()), format!("user {username} added"), now).await?;
                commit(tx).await?;
                Ok(user)
            }

            async fn credentials(&self, username: &str) -> StoreResult<Option<Credentials>> {
                let row = query("SELECT * FROM users WHERE lower(username) = lower($1)")
                    .bind(username)
                    .fetch_optional(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?;
                row.map(|row| {
                    Ok(Credentials {
                        user: user_from(&row)?,
                        password_hash: text(&row, "password_hash")?,
                    })
                })
                .transpose()
            }

            async fn remove_user(&self, username: &str) -> StoreResult<User> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let row = query("DELETE FROM users WHERE lower(username) = lower($1) RETURNING *")
                    .bind(username)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?
                    .ok_or_else(|| StoreError::NotFound { what: format!("user {username}") })?;
                let user = user_from(&row)?;
                user_event(&mut tx, &user, Some(user.role.as_str()), None, format!("user {} removed", user.username), Utc::now()).await?;
                commit(tx).await?;
                Ok(user)
            }

            async fn set_role(&self, username: &str, role: Role) -> StoreResult<User> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let before = query("SELECT * FROM users WHERE lower(username) = lower($1)")
                    .bind(username)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?
                    .ok_or_else(|| StoreError::NotFound { what: format!("user {username}") })?;
                let before = user_from(&before)?;
                let row = query("UPDATE users SET role = $1 WHERE id = $2 RETURNING *")
                    .bind(role.as_str())
                    .bind(before.id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                let user = user_from(&row)?;
                user_event(&mut tx, &user, Some(before.role.as_str()), Some(role.as_str()), format!("role of {} changed", user.username), Utc::now()).await?;
                commit(tx).await?;
                Ok(user)
            }

            async fn revoke_tokens(&self, agent: &str) -> StoreResult<u64> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let revoked = query("UPDATE api_tokens SET revoked_at = $1 WHERE agent = $2 AND revoked_at IS NULL")
                    .bind(now)
                    .bind(agent)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?
                    .rows_affected();
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: None,
                        entity: "token",
                        entity_id: None,
                        actor: &Actor::System,
                        from: None,
                        to: Some("revoked"),
                        detail: Some(format!("{revoked} token(s) of agent {agent} revoked")),
                        at: now,
                    },
                )
                .await?;
                commit(tx).await?;
                Ok(revoked)
            }

            async fn add_api_token(&self, agent: &str, token_hash: &str, label: Option<&str>) -> StoreResult<ApiToken> {
                let mut conn = self.write(Durability::Durable).await?;
                let mut tx = conn.begin().await.map_err(db)?;
                let now = Utc::now();
                let row = query(
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
                    id: get(&row, "id")?,
                    agent: text(&row, "agent")?,
                    label: opt_text(&row, "label")?,
                    created_at: get(&row, "created_at")?,
                };
                append_event(
                    &mut tx,
                    EventLine {
                        run_id: None,
                        entity: "token",
                        entity_id: Some(token.id),
                        actor: &Actor::System,
                        from: None,
                        to: None,
                        detail: Some(format!("token created for agent {agent}")),
                        at: now,
                    },
                )
                .await?;
                commit(tx).await?;
                Ok(token)
            }

            async fn agent_for_token(&self, token_hash: &str) -> StoreResult<Option<String>> {
                let row = query("SELECT agent FROM api_tokens WHERE token_hash = $1 AND revoked_at IS NULL")
                    .bind(token_hash)
                    .fetch_optional(&mut *self.read_conn().await?)
                    .await
                    .map_err(db)?;
                row.map(|row| text(&row, "agent")).transpose()
            }
        }
    };
}

pub(crate) use saga_store_sql;

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
