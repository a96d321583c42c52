//! The statements and row mappings every method of the generic store
//! shares: reading a row into the saga's types, the audit line, a run's
//! status move, a new step, an outcome's compare-and-set.

use super::*;

impl<D> Sql<D>
where
    D: Dialect,
    for<'c> &'c mut DbConn<D>: sqlx::Executor<'c, Database = D::Db>,
    for<'q> DbArgs<'q, D>: sqlx::IntoArguments<'q, D::Db>,
    for<'q> String: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> &'q str: sqlx::Encode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> i64: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> bool: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Json<Value>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Json<Vec<String>>:
        sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> DateTime<Utc>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Option<String>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db>,
    for<'q> Option<&'q str>: sqlx::Encode<'q, D::Db>,
    for<'q> Option<i64>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db>,
    for<'q> Option<DateTime<Utc>>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db>,
    for<'q> Option<Json<Value>>: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db>,
    for<'q> Json<&'q Value>: sqlx::Encode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> Option<Json<&'q Value>>: sqlx::Encode<'q, D::Db>,
    for<'a> &'a str: sqlx::ColumnIndex<DbRow<D>>,
    usize: sqlx::ColumnIndex<DbRow<D>>,
    for<'q> Json<&'q Vec<String>>: sqlx::Encode<'q, D::Db> + sqlx::Type<D::Db>,
{
    /// A statement, kept prepared on its connection unless the backend
    /// says a pooler would hand it to another server.
    pub(crate) fn query(sql: &str) -> sqlx::query::Query<'_, D::Db, DbArgs<'_, D>> {
        sqlx::query(sql).persistent(D::keeps_statements())
    }

    /// Every row `query` finds, each read by `from`.
    pub(crate) async fn all<'q, T>(
        conn: &mut DbConn<D>,
        query: sqlx::query::Query<'q, D::Db, DbArgs<'q, D>>,
        from: fn(&DbRow<D>) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        query
            .fetch_all(&mut *conn)
            .await
            .map_err(db)?
            .iter()
            .map(from)
            .collect()
    }

    /// The row `query` finds, if any, read by `from`.
    pub(crate) async fn one<'q, T>(
        conn: &mut DbConn<D>,
        query: sqlx::query::Query<'q, D::Db, DbArgs<'q, D>>,
        from: fn(&DbRow<D>) -> StoreResult<T>,
    ) -> StoreResult<Option<T>> {
        query
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?
            .as_ref()
            .map(from)
            .transpose()
    }

    pub(crate) fn query_scalar<O>(
        sql: &str,
    ) -> sqlx::query::QueryScalar<'_, D::Db, O, DbArgs<'_, D>>
    where
        (O,): for<'r> sqlx::FromRow<'r, DbRow<D>>,
    {
        sqlx::query_scalar(sql).persistent(D::keeps_statements())
    }

    pub(crate) fn text(row: &DbRow<D>, column: &str) -> StoreResult<String> {
        row.try_get::<String, _>(column)
            .map_err(|e| corrupt(column, e))
    }

    pub(crate) fn opt_text(row: &DbRow<D>, column: &str) -> StoreResult<Option<String>> {
        row.try_get::<Option<String>, _>(column)
            .map_err(|e| corrupt(column, e))
    }

    pub(crate) fn opt_actor(row: &DbRow<D>, column: &str) -> StoreResult<Option<Actor>> {
        Ok(Self::opt_text(row, column)?.map(|stored| Actor::parse(&stored)))
    }

    pub(crate) fn parsed<T: std::str::FromStr>(row: &DbRow<D>, column: &str) -> StoreResult<T>
    where
        T::Err: std::fmt::Display,
    {
        Self::text(row, column)?
            .parse::<T>()
            .map_err(|e| corrupt(column, e))
    }

    pub(crate) fn opt_parsed<T: std::str::FromStr>(
        row: &DbRow<D>,
        column: &str,
    ) -> StoreResult<Option<T>>
    where
        T::Err: std::fmt::Display,
    {
        Self::opt_text(row, column)?
            .map(|t| t.parse::<T>().map_err(|e| corrupt(column, e)))
            .transpose()
    }

    pub(crate) fn get<T>(row: &DbRow<D>, column: &str) -> StoreResult<T>
    where
        T: for<'r> sqlx::Decode<'r, D::Db> + sqlx::Type<D::Db>,
    {
        row.try_get::<T, _>(column).map_err(|e| corrupt(column, e))
    }

    pub(crate) fn json(row: &DbRow<D>, column: &str) -> StoreResult<Value> {
        Ok(Self::get::<Json<Value>>(row, column)?.0)
    }

    pub(crate) fn opt_json(row: &DbRow<D>, column: &str) -> StoreResult<Option<Value>> {
        Ok(Self::get::<Option<Json<Value>>>(row, column)?.map(|j| j.0))
    }

    /// Sorts the rows of a claim's read (a run row, then its unsettled
    /// steps, then its settled steps still owed to the agent, from one
    /// batch of statements) by the columns they carry.
    pub(crate) fn run_and_unsettled(
        rows: &[DbRow<D>],
    ) -> StoreResult<crate::saga::store::ClaimedRead> {
        let mut read = crate::saga::store::ClaimedRead::default();
        for row in rows {
            if row.try_column("step_idx").is_ok() {
                let step = Self::step_from(row)?;
                if step.owed_to_agent {
                    read.owed.push(step.clone());
                }
                if !step.status.is_settled() {
                    read.unsettled.push(step);
                }
            } else if row.try_column("next_step").is_ok() {
                read.run = Some(Self::run_from(row)?);
            }
        }
        read.owed.sort_by_key(|s| s.step_idx);
        Ok(read)
    }

    pub(crate) fn run_from(row: &DbRow<D>) -> StoreResult<Run> {
        Ok(Run {
            id: parse_uuid("runs.id", &Self::text(row, "id")?)?,
            agent: Self::text(row, "agent")?,
            label: Self::opt_text(row, "label")?,
            purpose: Self::text(row, "purpose")?,
            status: Self::parsed(row, "status")?,
            resume_to: Self::opt_parsed(row, "resume_to")?,
            next_step: Self::get(row, "next_step")?,
            pivot_approval_id: Self::get(row, "pivot_approval_id")?,
            irreversible_before_pivot: Self::get(row, "irreversible_before_pivot")?,
            created_at: Self::get(row, "created_at")?,
            updated_at: Self::get(row, "updated_at")?,
        })
    }

    pub(crate) fn step_from(row: &DbRow<D>) -> StoreResult<Step> {
        Ok(Step {
            run_id: parse_uuid("saga_log.run_id", &Self::text(row, "run_id")?)?,
            step_idx: Self::get(row, "step_idx")?,
            tool: Self::text(row, "tool")?,
            tool_class: Self::parsed::<ToolClass>(row, "tool_class")?,
            idempotency_key: Self::text(row, "idempotency_key")?,
            args: Self::json(row, "args")?,
            status: Self::parsed(row, "status")?,
            external_ref: Self::opt_text(row, "external_ref")?,
            compensation: Self::opt_json(row, "compensation")?,
            audience: Self::parsed::<Audience>(row, "audience")?,
            result: Self::opt_json(row, "result")?,
            error: Self::opt_text(row, "error")?,
            phase: Self::parsed::<Phase>(row, "phase")?,
            approved_individually: Self::get(row, "approved_individually")?,
            owed_to_agent: Self::get(row, "owed_to_agent")?,
            created_at: Self::get(row, "created_at")?,
            updated_at: Self::get(row, "updated_at")?,
        })
    }

    pub(crate) fn compensation_from(row: &DbRow<D>) -> StoreResult<Compensation> {
        Ok(Compensation {
            run_id: parse_uuid("compensations.run_id", &Self::text(row, "run_id")?)?,
            step_idx: Self::get(row, "step_idx")?,
            tool: Self::text(row, "tool")?,
            idempotency_key: Self::text(row, "idempotency_key")?,
            args: Self::json(row, "args")?,
            status: Self::parsed(row, "status")?,
            external_ref: Self::opt_text(row, "external_ref")?,
            result: Self::opt_json(row, "result")?,
            error: Self::opt_text(row, "error")?,
            created_at: Self::get(row, "created_at")?,
            updated_at: Self::get(row, "updated_at")?,
        })
    }

    pub(crate) fn approval_from(row: &DbRow<D>) -> StoreResult<Approval> {
        let kind = match Self::text(row, "kind")?.as_str() {
            "pivot" => ApprovalKind::Pivot,
            "step" => ApprovalKind::Step,
            other => return Err(corrupt("approvals.kind", other)),
        };
        Ok(Approval {
            id: Self::get(row, "id")?,
            run_id: parse_uuid("approvals.run_id", &Self::text(row, "run_id")?)?,
            kind,
            step_idx: Self::get(row, "step_idx")?,
            summary: Self::text(row, "summary")?,
            plan: Self::json(row, "plan")?,
            digest: Self::text(row, "digest")?,
            status: Self::parsed(row, "status")?,
            expires_at: Self::get(row, "expires_at")?,
            decided_by: Self::opt_actor(row, "decided_by")?,
            decided_at: Self::get(row, "decided_at")?,
            note: Self::opt_text(row, "note")?,
            created_at: Self::get(row, "created_at")?,
            approvers_needed: Self::get(row, "approvers_needed")?,
            first_approver: Self::opt_actor(row, "first_approver")?,
            first_approved_at: Self::get(row, "first_approved_at")?,
        })
    }

    pub(crate) fn correction_from(row: &DbRow<D>) -> StoreResult<Correction> {
        let source = match Self::text(row, "source")?.as_str() {
            "step" => CorrectionSource::Step,
            "compensation" => CorrectionSource::Compensation,
            other => return Err(corrupt("corrections.source", other)),
        };
        Ok(Correction {
            id: Self::get(row, "id")?,
            run_id: parse_uuid("corrections.run_id", &Self::text(row, "run_id")?)?,
            step_idx: Self::get(row, "step_idx")?,
            source,
            tool: Self::text(row, "tool")?,
            audience: Self::parsed::<Audience>(row, "audience")?,
            rank: Self::get(row, "rank")?,
            template: Self::text(row, "template")?,
            recipients: Self::get::<Json<Vec<String>>>(row, "recipients")?.0,
            message: Self::text(row, "message")?,
            status: Self::parsed(row, "status")?,
            idempotency_key: Self::text(row, "idempotency_key")?,
            send_status: Self::opt_parsed(row, "send_status")?,
            external_ref: Self::opt_text(row, "external_ref")?,
            decided_by: Self::opt_actor(row, "decided_by")?,
            decided_at: Self::get(row, "decided_at")?,
            dismiss_reason: Self::opt_text(row, "dismiss_reason")?,
            created_at: Self::get(row, "created_at")?,
            updated_at: Self::get(row, "updated_at")?,
        })
    }

    pub(crate) fn notice_from(row: &DbRow<D>) -> StoreResult<Notice> {
        Ok(Notice {
            approval_id: Self::get(row, "approval_id")?,
            run_id: parse_uuid("approval_notices.run_id", &Self::text(row, "run_id")?)?,
            place: Self::text(row, "place")?
                .parse()
                .map_err(|e: UnknownName| StoreError::Corrupt(e.to_string()))?,
            idempotency_key: Self::text(row, "idempotency_key")?,
            channel: Self::text(row, "channel")?,
            status: Self::parsed(row, "status")?,
            message_ref: Self::opt_text(row, "message_ref")?,
            shown: Self::opt_text(row, "shown")?,
            done: Self::get(row, "done")?,
            error: Self::opt_text(row, "error")?,
            created_at: Self::get(row, "created_at")?,
            updated_at: Self::get(row, "updated_at")?,
        })
    }

    pub(crate) fn event_from(row: &DbRow<D>) -> StoreResult<Event> {
        Ok(Event {
            id: Self::get(row, "id")?,
            run_id: Self::opt_text(row, "run_id")?
                .map(|t| parse_uuid("events.run_id", &t))
                .transpose()?,
            entity: Self::text(row, "entity")?
                .parse()
                .map_err(|e: UnknownName| StoreError::Corrupt(e.to_string()))?,
            entity_id: Self::get(row, "entity_id")?,
            actor: Actor::parse(&Self::text(row, "actor")?),
            from_status: Self::opt_text(row, "from_status")?,
            to_status: Self::opt_text(row, "to_status")?,
            detail: Self::opt_text(row, "detail")?,
            at: Self::get(row, "at")?,
        })
    }

    pub(crate) fn user_from(row: &DbRow<D>) -> StoreResult<User> {
        Ok(User {
            id: Self::get(row, "id")?,
            username: Self::text(row, "username")?,
            role: Self::parsed::<Role>(row, "role")?,
            groups: serde_json::from_str(&Self::text(row, "member_of")?)
                .map_err(|e| StoreError::Invalid(format!("a user's groups: {e}")))?,
            created_at: Self::get(row, "created_at")?,
        })
    }

    /// A person's account by name (any case), read in `conn`'s transaction.
    pub(crate) async fn user_named(conn: &mut DbConn<D>, username: &str) -> StoreResult<User> {
        let row = Self::query("SELECT * FROM users WHERE lower(username) = lower($1)")
            .bind(username)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?
            .ok_or_else(|| StoreError::NotFound {
                what: format!("user {username}"),
            })?;
        Self::user_from(&row)
    }

    /// The audit line of a change to a person's account (made from the
    /// command line, so by the system).
    pub(crate) async fn user_event(
        conn: &mut DbConn<D>,
        user: &User,
        from: Option<&str>,
        to: Option<&str>,
        detail: String,
        at: chrono::DateTime<Utc>,
    ) -> StoreResult<()> {
        Self::append_event(
            conn,
            EventLine {
                run_id: None,
                entity: EventEntity::User,
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

    pub(crate) async fn append_event(conn: &mut DbConn<D>, line: EventLine<'_>) -> StoreResult<()> {
        Self::query(
                "INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status, detail, at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(line.run_id.map(|id| id.to_string()))
            .bind(line.entity.as_str())
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
    pub(crate) async fn lock_run(conn: &mut DbConn<D>, id: Uuid) -> StoreResult<Run> {
        let row = Self::query(D::RUN_FOR_UPDATE)
            .bind(id.to_string())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?
            .ok_or_else(|| StoreError::NotFound {
                what: format!("run {id}"),
            })?;
        Self::run_from(&row)
    }

    /// The one place a run's status is written.
    pub(crate) async fn apply_run_move(
        conn: &mut DbConn<D>,
        id: Uuid,
        from: RunStatus,
        to: RunStatus,
        actor: &Actor,
        detail: Option<&str>,
    ) -> StoreResult<Run> {
        let current = Self::lock_run(conn, id).await?;
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
        let row = Self::query(
                "UPDATE runs SET status = $1, resume_to = $2, updated_at = $3 WHERE id = $4 RETURNING *",
            )
            .bind(to.as_str())
            .bind(resume_to.map(|s| s.as_str()))
            .bind(now)
            .bind(id.to_string())
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        Self::append_event(
            conn,
            EventLine {
                run_id: Some(id),
                entity: EventEntity::Run,
                entity_id: None,
                actor,
                from: Some(from.as_str()),
                to: Some(to.as_str()),
                detail: detail.map(str::to_owned),
                at: now,
            },
        )
        .await?;
        Self::run_from(&row)
    }

    /// Why a compare-and-set found nothing: the row is missing, or it
    /// moved on.
    pub(crate) async fn missing_or_stale(
        conn: &mut DbConn<D>,
        sql: &'static str,
        what: String,
        run_id: Uuid,
        step_idx: i64,
        expected: StepStatus,
    ) -> StoreError {
        let found = Self::query(sql)
            .bind(run_id.to_string())
            .bind(step_idx)
            .fetch_optional(&mut *conn)
            .await;
        match found {
            Ok(Some(row)) => match Self::text(&row, "status") {
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

    /// Why a run did not take a new step at `step_idx`: it is missing,
    /// the index is taken, or it skips ahead.
    pub(crate) async fn why_step_refused(
        conn: &mut DbConn<D>,
        run_id: Uuid,
        step_idx: i64,
    ) -> StoreError {
        let found = Self::query("SELECT next_step FROM runs WHERE id = $1")
            .bind(run_id.to_string())
            .fetch_optional(&mut *conn)
            .await;
        match found {
            Ok(None) => StoreError::NotFound {
                what: format!("run {run_id}"),
            },
            Ok(Some(row)) => match Self::get::<i64>(&row, "next_step") {
                Ok(next) if step_idx < next => StoreError::StepExists { step_idx },
                Ok(next) => StoreError::StepOutOfOrder {
                    given: step_idx,
                    expected: next,
                },
                Err(e) => e,
            },
            Err(e) => db(e),
        }
    }

    /// The counted usage of a limit's scope in its window.
    pub(crate) async fn limit_used_in(
        conn: &mut DbConn<D>,
        scope: &str,
        window_s: Option<i64>,
    ) -> StoreResult<i64> {
        let row = Self::query(D::LIMIT_USED)
            .bind(scope.to_owned())
            .bind(window_s)
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        Self::get::<i64>(&row, "used")
    }

    /// The first of a new step's enforced charges that does not fit under
    /// its limit now, as the error its intent is refused with. (Read after
    /// an intent wrote nothing, to say why.)
    pub(crate) async fn over_limit(
        conn: &mut DbConn<D>,
        limits: &crate::saga::limits::StepLimits,
    ) -> StoreResult<Option<StoreError>> {
        if !limits.enforce {
            return Ok(None);
        }
        for (charge, c) in limits.charges.iter().enumerate() {
            let used = Self::limit_used_in(conn, &c.scope, c.window_s).await?;
            if used.saturating_add(c.amount) > c.max {
                return Ok(Some(StoreError::OverLimit { charge, used }));
            }
        }
        Ok(None)
    }

    /// Inserts a new step at the run's next index, inside the caller's
    /// transaction. The guarded counter update comes first: it takes the
    /// run's row lock and checks the index in one statement.
    pub(crate) async fn insert_step(
        conn: &mut DbConn<D>,
        new: NewStep,
        actor: &Actor,
    ) -> StoreResult<Step> {
        check_new_step(&new)?;
        let now = Utc::now();
        let advanced = Self::query(
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
            return Err(Self::why_step_refused(conn, new.run_id, new.step_idx).await);
        }
        let row = Self::bind_new_step(
            Self::query(concat!(
                crate::store::sql::new_step_insert!(),
                " RETURNING *"
            )),
            &new,
            now,
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| db_error(e, || format!("idempotency key {}", new.idempotency_key)))?;
        // Counted, not checked: a step written here waits for a person,
        // whose approval is the decision to go past a limit.
        for charge in &new.limits.charges {
            Self::query(D::USAGE_INSERT)
                .bind(charge.scope.clone())
                .bind(new.run_id.to_string())
                .bind(new.step_idx)
                .bind(charge.amount)
                .execute(&mut *conn)
                .await
                .map_err(db)?;
        }
        Self::append_event(
            &mut *conn,
            EventLine {
                run_id: Some(new.run_id),
                entity: EventEntity::Step,
                entity_id: Some(new.step_idx),
                actor,
                from: None,
                to: Some(new.status.as_str()),
                detail: Some(step_event_detail(&new)),
                at: now,
            },
        )
        .await?;
        Self::step_from(&row)
    }

    /// Binds run statuses, in order, to the placeholders `placeholders`
    /// wrote.
    pub(crate) fn bind_statuses<'q>(
        mut query: sqlx::query::Query<'q, D::Db, <D::Db as sqlx::Database>::Arguments<'q>>,
        statuses: &[RunStatus],
    ) -> sqlx::query::Query<'q, D::Db, <D::Db as sqlx::Database>::Arguments<'q>> {
        for status in statuses {
            query = query.bind(status.as_str());
        }
        query
    }

    /// Binds `$1`–`$11` of `new_step_insert!`.
    pub(crate) fn bind_new_step<'q>(
        query: sqlx::query::Query<'q, D::Db, <D::Db as sqlx::Database>::Arguments<'q>>,
        new: &NewStep,
        at: chrono::DateTime<Utc>,
    ) -> sqlx::query::Query<'q, D::Db, <D::Db as sqlx::Database>::Arguments<'q>> {
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
    pub(crate) fn bind_outcome<'q>(
        query: sqlx::query::Query<'q, D::Db, <D::Db as sqlx::Database>::Arguments<'q>>,
        outcome: &Outcome,
        at: chrono::DateTime<Utc>,
        run_id: Uuid,
        step_idx: i64,
    ) -> sqlx::query::Query<'q, D::Db, <D::Db as sqlx::Database>::Arguments<'q>> {
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

    /// Inserts an approval request; a pivot request supersedes the run's
    /// pending one and becomes the run's pivot.
    pub(crate) async fn insert_approval(
        conn: &mut DbConn<D>,
        new: NewApproval,
        run_move: Option<(RunStatus, RunStatus)>,
        actor: &Actor,
    ) -> StoreResult<Approval> {
        if new.kind == ApprovalKind::Step && new.step_idx.is_none() {
            return Err(StoreError::Invalid(
                "a single-step approval names its step".into(),
            ));
        }
        Self::lock_run(&mut *conn, new.run_id).await?;
        let now = Utc::now();
        if new.kind == ApprovalKind::Pivot {
            let superseded = Self::query(
                        "UPDATE approvals SET status = $1 WHERE run_id = $2 AND kind = 'pivot' AND status = $3 RETURNING id",
                    )
                    .bind(ApprovalStatus::Superseded.as_str())
                    .bind(new.run_id.to_string())
                    .bind(ApprovalStatus::Pending.as_str())
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db)?;
            for row in superseded {
                Self::append_event(
                    &mut *conn,
                    EventLine {
                        run_id: Some(new.run_id),
                        entity: EventEntity::Approval,
                        entity_id: Some(Self::get(&row, "id")?),
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
        let row = Self::query(
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
        let approval = Self::approval_from(&row)?;
        if new.kind == ApprovalKind::Pivot {
            Self::query("UPDATE runs SET pivot_approval_id = $1, updated_at = $2 WHERE id = $3")
                .bind(approval.id)
                .bind(now)
                .bind(new.run_id.to_string())
                .execute(&mut *conn)
                .await
                .map_err(db)?;
        }
        Self::append_event(
            &mut *conn,
            EventLine {
                run_id: Some(new.run_id),
                entity: EventEntity::Approval,
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
            Self::apply_run_move(
                &mut *conn,
                new.run_id,
                from,
                to,
                actor,
                Some("approval requested"),
            )
            .await?;
        }
        Ok(approval)
    }

    /// Moves a step to its outcome inside the caller's transaction.
    pub(crate) async fn settle_step_in(
        conn: &mut DbConn<D>,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        actor: &Actor,
    ) -> StoreResult<Step> {
        let now = Utc::now();
        let row =
            Self::outcome_row(conn, Settled::Step, &outcome, now, actor, run_id, step_idx).await?;
        let mut step = Self::step_from(&row)?;
        // An irreversible call held before the pivot runs on its own
        // approval: counted against the run, and marked as approved.
        if approves_individually(&outcome)
            && step.tool_class == ToolClass::Irreversible
            && step.phase == Phase::BeforePivot
        {
            Self::query("UPDATE saga_log SET approved_individually = $1 WHERE run_id = $2 AND step_idx = $3")
                    .bind(true)
                    .bind(run_id.to_string())
                    .bind(step_idx)
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
            Self::query("UPDATE runs SET irreversible_before_pivot = irreversible_before_pivot + 1 WHERE id = $1")
                    .bind(run_id.to_string())
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
            step.approved_individually = true;
        }
        Ok(step)
    }

    /// Why a step's compare-and-set found nothing.
    pub(crate) async fn step_not_settled(
        conn: &mut DbConn<D>,
        run_id: Uuid,
        step_idx: i64,
        expected: StepStatus,
    ) -> StoreError {
        Self::missing_or_stale(
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
    pub(crate) async fn outcome_row(
        conn: &mut DbConn<D>,
        kind: Settled,
        outcome: &Outcome,
        at: chrono::DateTime<Utc>,
        actor: &Actor,
        run_id: Uuid,
        step_idx: i64,
    ) -> StoreResult<DbRow<D>> {
        let found = Self::bind_outcome(Self::query(kind.cas()), outcome, at, run_id, step_idx)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        match found {
            Some(row) => {
                Self::append_event(
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
            None => Err(Self::missing_or_stale(
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

    /// The first of two approvers (the two-person rule): their name and
    /// time on the approval, which stays pending, and the audit line.
    pub(crate) async fn record_first_approval(
        conn: &mut DbConn<D>,
        current: &Approval,
        decision: &Decision,
        actor: &Actor,
        now: DateTime<Utc>,
    ) -> StoreResult<DbRow<D>> {
        let row = Self::query(
            "UPDATE approvals SET first_approver = $1, first_approved_at = $2
             WHERE id = $3 AND status = $4 AND first_approver IS NULL RETURNING *",
        )
        .bind(actor.to_string())
        .bind(now)
        .bind(decision.approval_id)
        .bind(ApprovalStatus::Pending.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
        let note = decision
            .note
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        Self::append_event(
            conn,
            EventLine {
                run_id: Some(current.run_id),
                entity: EventEntity::Approval,
                entity_id: Some(current.id),
                actor,
                from: Some(ApprovalStatus::Pending.as_str()),
                to: Some(ApprovalStatus::Pending.as_str()),
                detail: Some(format!(
                    "approved, 1 of {}: a second, different approver decides{note}",
                    current.approvers_needed
                )),
                at: now,
            },
        )
        .await?;
        Ok(row)
    }

    pub(crate) async fn commit(tx: sqlx::Transaction<'_, D::Db>) -> StoreResult<()> {
        tx.commit().await.map_err(db)
    }
}
