//! Group commit on PostgreSQL: the hot path's step writes of many runs
//! share one statement, and so one round trip and one commit.
//!
//! A step on the hot path is two writes: the intent, which takes the run's
//! lease with it, and the outcome, which gives the lease back. A write
//! that finds nothing waiting and a group slot free goes at once, in a
//! statement of its own (`INTENT_ONE`, `OUTCOME_ONE`: bound values, the
//! cheapest form for one step). Otherwise it is a job for one dispatcher
//! task, which takes the first job and whatever others are waiting, at
//! most one a run, and sends the intents as one statement and the outcomes
//! as another (at the same time, on two connections): each a JSON array
//! of records, unpacked by `jsonb_to_recordset` (intents.sql,
//! outcomes.sql). An outcome's commit is lazy only when every outcome in
//! it may be.
//!
//! Each write keeps its own condition: an intent lands only on a ready
//! run, an outcome only from the status it expects. A write whose
//! condition fails writes nothing, and its caller gets no row. A write
//! that raises an error (a key already in the log, a deadlock) fails its
//! whole statement, which PostgreSQL rolls back; each write of it is then
//! sent again on its own, so the error reaches only the caller whose write
//! caused it. A statement that found its connection broken is sent once
//! more on a fresh connection, and its callers are told so: a write that
//! had landed the first time finds nothing to do the second.
//!
//! Callers are answered only after the commit, so an intent is on disk
//! before its call goes out, as before. At most `GROUPS_IN_FLIGHT` groups
//! are out at once; jobs that arrive meanwhile wait for the next one, and
//! past `QUEUE` waiting jobs callers wait their turn.

use crate::saga::model::{NewStep, Outcome};
use crate::store::group_commit::{Counts, GroupCounts, MAX_GROUP, QUEUE};
use crate::store::sql::{
    counts_as_irreversible, new_step_insert, outcome_cas, settle_event_detail, step_event_detail,
    unsettled_sql, Sql,
};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{Connection as _, PgPool, Postgres, Row as _};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Step-write statements out at once from one store. Measured on two
/// cores (`saga-harness bench`, PostgreSQL): two gave 6,300 steps/s at 64
/// runs and 1,980 at 8; four gave 5,100 and 1,740; eight 5,060 and 1,770.
/// Fewer at once means bigger groups, and so fewer commits.
pub const GROUPS_IN_FLIGHT: usize = 2;

/// The intents of a group in one statement; `$1` is their records.
///
/// Each advances and leases its run only if the run is ready (running,
/// this agent's, at this index, no unsettled or owed step, no live lease
/// of another holder, the bearer's token to check still the agent's and
/// not revoked), then writes the step and its audit line. The
/// readiness test reads the statement's snapshot: a step settled by a
/// holder this statement waited for looks unsettled, which only sends the
/// caller down the general path.
///
/// The planner guesses a hundred records for `jsonb_to_recordset`, and
/// for a hundred it would scan every running run and hash them. The
/// `= ANY (ARRAY(…))` condition names the rows by key, so the plan reads
/// them through the primary key whatever the guess.
const INTENTS: &str = include_str!("intents.sql");

/// The outcomes of a group in one statement; `$1` is their records, `$2`
/// is `'off'` when no outcome needs its commit flushed before the answer
/// (DESIGN.md §9). Each is a compare-and-set on the step's status, with
/// its audit line, and gives back the lease its holder names if that lease
/// still holds the run. The `= ANY (ARRAY(…))` conditions are there for
/// the planner, as in `INTENTS`.
const OUTCOMES: &str = include_str!("outcomes.sql");

/// The limits test of an intent, for the `advanced` update's condition:
/// `$N` is the step's limits (JSON, or NULL for none). Enforced charges
/// must fit (`saga_within_limits`, migration 0008: it locks each scope's
/// totals row and reads it as last committed, so concurrent intents are
/// counted in turn; the usage rows written with the intent add themselves
/// to the totals, so an intent that is not written counts nothing).
macro_rules! within_limits {
    ($n:literal) => {
        concat!(
            "
            AND (",
            $n,
            "::jsonb IS NULL OR NOT (",
            $n,
            "::jsonb->>'enforce')::boolean
                OR saga_within_limits(",
            $n,
            "::jsonb->'charges'))"
        )
    };
}
pub(crate) use within_limits;

/// The usage rows of an intent's charges (`$N`), as a CTE after `inserted`.
macro_rules! usage_insert {
    ($n:literal) => {
        concat!(
            " usage AS (
                INSERT INTO limit_usage (scope, run_id, step_idx, amount, at)
                SELECT c.scope, inserted.run_id, inserted.step_idx, c.amount, now()
                FROM inserted, jsonb_to_recordset(COALESCE(",
            $n,
            "::jsonb->'charges', '[]'::jsonb)) AS c(scope text, amount int8)
             )"
        )
    };
}
pub(crate) use usage_insert;

/// One intent alone, the same conditions and writes as `INTENTS` with the
/// values bound: `$1`–`$11` by `bind_new_step`, then the irreversible
/// count, the actor, the audit detail, the lease's owner and length, the
/// agent, this store's own earlier lease of the run and the bearer's token
/// to check.
const INTENT_ONE: &str = concat!(
    "WITH advanced AS (
        UPDATE runs SET next_step = next_step + 1,
            irreversible_before_pivot = irreversible_before_pivot + $12, updated_at = $11,
            lease_owner = $15,
            lease_until = clock_timestamp() + $16::float8 * interval '1 millisecond'
        WHERE id = $1 AND next_step = $2 AND agent = $17 AND status = 'RUNNING'
            AND (lease_owner IS NULL OR lease_until < clock_timestamp()
                OR lease_owner = ANY($18::text[]))
            AND ($19::text IS NULL OR EXISTS (SELECT 1 FROM api_tokens
                WHERE token_hash = $19 AND agent = $17 AND revoked_at IS NULL))
            AND NOT EXISTS (SELECT 1 FROM saga_log WHERE run_id = $1 AND status IN ",
    unsettled_sql!(),
    ")
            AND NOT EXISTS (SELECT 1 FROM saga_log WHERE run_id = $1 AND owed_to_agent)",
    within_limits!("$20"),
    "
        RETURNING id
     ), inserted AS (",
    new_step_insert!(),
    " FROM advanced RETURNING *
     ), logged AS (
        INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status,
            detail, at)
        SELECT run_id, 'step', step_idx, $13, NULL, status, $14, $11 FROM inserted
     ),",
    usage_insert!("$20"),
    "
     SELECT * FROM inserted"
);

/// One outcome alone, as in `OUTCOMES` with the values bound: `$1`–`$8`
/// by `bind_outcome`, then the commit mode, the actor, the audit detail
/// and the lease to give back.
const OUTCOME_ONE: &str = concat!(
    "WITH commit_mode AS (
        SELECT set_config('synchronous_commit',
            COALESCE($9, current_setting('synchronous_commit')), true) AS mode
     ), settled AS (",
    outcome_cas!(
        "saga_log",
        " AND (SELECT mode FROM commit_mode) IS NOT NULL"
    ),
    "), logged AS (
        INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status,
            detail, at)
        SELECT run_id, 'step', step_idx, $10, $8, $1, $11, $5 FROM settled
     ), released AS (
        UPDATE runs SET lease_owner = NULL, lease_until = NULL
        WHERE $12::text IS NOT NULL AND id = $6 AND lease_owner = $12
            AND EXISTS (SELECT 1 FROM settled)
     )
     SELECT * FROM settled"
);

/// A new step's intent on a ready run, with the lease it takes.
pub(super) struct Intent {
    pub new: NewStep,
    pub agent: String,
    /// The hash of a bearer token that must still be the agent's and not
    /// revoked when the intent commits.
    pub token: Option<String>,
    pub actor: String,
    pub lease_owner: String,
    pub lease_ms: i64,
    /// This store's own earlier leases of the run, let go of and maybe not
    /// yet released in the database: the intent may take over from them.
    pub handover: Vec<String>,
}

/// A step's outcome, giving back the lease `release` names.
pub(super) struct Settle {
    pub run_id: uuid::Uuid,
    pub step_idx: i64,
    pub outcome: Outcome,
    /// Its commit may return before the WAL is flushed.
    pub lazy: bool,
    pub actor: String,
    pub release: Option<String>,
}

pub(super) enum StepWrite {
    Intent(Intent),
    Outcome(Settle),
}

impl StepWrite {
    fn run_id(&self) -> uuid::Uuid {
        match self {
            StepWrite::Intent(i) => i.new.run_id,
            StepWrite::Outcome(o) => o.run_id,
        }
    }

    fn step_idx(&self) -> i64 {
        match self {
            StepWrite::Intent(i) => i.new.step_idx,
            StepWrite::Outcome(o) => o.step_idx,
        }
    }
}

/// An intent as `INTENTS` reads it.
#[derive(Serialize)]
struct IntentRecord<'a> {
    run_id: String,
    step_idx: i64,
    tool: &'a str,
    tool_class: &'static str,
    idempotency_key: &'a str,
    /// JSON text: a JSON `null` stays a value, not an SQL NULL.
    args: String,
    status: &'static str,
    compensation: Option<String>,
    audience: &'static str,
    phase: &'static str,
    /// RFC 3339, to the microsecond.
    at: String,
    /// 1 when the step counts as irreversible before the pivot.
    irreversible: i64,
    actor: &'a str,
    detail: String,
    agent: &'a str,
    token: Option<&'a str>,
    lease_owner: &'a str,
    lease_ms: i64,
    handover: &'a [String],
}

impl<'a> IntentRecord<'a> {
    fn of(i: &'a Intent, at: &str) -> Self {
        let new = &i.new;
        IntentRecord {
            run_id: new.run_id.to_string(),
            step_idx: new.step_idx,
            tool: &new.tool,
            tool_class: new.tool_class.as_str(),
            idempotency_key: &new.idempotency_key,
            args: new.args.to_string(),
            status: new.status.as_str(),
            compensation: new.compensation.as_ref().map(|c| c.to_string()),
            audience: new.audience.as_str(),
            phase: new.phase.as_str(),
            at: at.to_owned(),
            irreversible: i64::from(counts_as_irreversible(new)),
            actor: &i.actor,
            detail: step_event_detail(new),
            agent: &i.agent,
            token: i.token.as_deref(),
            lease_owner: &i.lease_owner,
            lease_ms: i.lease_ms,
            handover: &i.handover,
        }
    }
}

/// An outcome as `OUTCOMES` reads it.
#[derive(Serialize)]
struct OutcomeRecord<'a> {
    run_id: String,
    step_idx: i64,
    from_status: &'static str,
    to_status: &'static str,
    external_ref: Option<&'a str>,
    /// JSON text.
    result: Option<String>,
    error: Option<&'a str>,
    at: String,
    actor: &'a str,
    detail: Option<String>,
    release: Option<&'a str>,
}

impl<'a> OutcomeRecord<'a> {
    fn of(o: &'a Settle, at: &str) -> Self {
        OutcomeRecord {
            run_id: o.run_id.to_string(),
            step_idx: o.step_idx,
            from_status: o.outcome.from.as_str(),
            to_status: o.outcome.to.as_str(),
            external_ref: o.outcome.external_ref.as_deref(),
            result: o.outcome.result.as_ref().map(|r| r.to_string()),
            error: o.outcome.error.as_deref(),
            at: at.to_owned(),
            actor: &o.actor,
            detail: settle_event_detail(&o.outcome),
            release: o.release.as_deref(),
        }
    }
}

/// What a write did: the step's row as written, or none when its
/// condition did not hold.
pub(super) struct Written {
    pub row: Option<PgRow>,
    /// The statement was sent twice (its first connection broke): a write
    /// that finds nothing to do may have landed the first time.
    pub sent_twice: bool,
}

type Reply = oneshot::Sender<Result<Written, sqlx::Error>>;
type Job = (StepWrite, Reply);

/// The handle the store keeps; dropping it ends the dispatcher.
pub(super) struct StepWriter {
    jobs: mpsc::Sender<Job>,
    counts: Arc<Counts>,
    target: Target,
    stripes: LimitStripes,
}

/// Intents that must fit under a limit wait for each other here, in this
/// process, before they take a connection: `saga_within_limits` makes
/// intents of one scope wait for each other in the database, and each
/// waiter there would hold a connection of the pool (a crowd of one
/// agent's calls would take them all, and every other call would wait).
/// Scopes share a fixed set of stripes by hash, so no scope is ever turned
/// away and memory does not grow with the number of agents or customers.
pub(super) struct LimitStripes(Vec<tokio::sync::Mutex<()>>);

/// Stripes of `LimitStripes`: more than the pool has connections.
const LIMIT_STRIPES: usize = 64;

impl LimitStripes {
    fn new() -> LimitStripes {
        LimitStripes(
            (0..LIMIT_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        )
    }

    /// Holds the stripes of every enforced charge of `limits` (none when
    /// nothing is enforced), taken in one order so two holders never wait
    /// on each other crosswise.
    pub(super) async fn hold(
        &self,
        limits: &crate::saga::limits::StepLimits,
    ) -> Vec<tokio::sync::MutexGuard<'_, ()>> {
        if !limits.enforce {
            return Vec::new();
        }
        let mut stripes: Vec<usize> = limits
            .charges
            .iter()
            .map(|c| {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                c.scope.hash(&mut hasher);
                (hasher.finish() % LIMIT_STRIPES as u64) as usize
            })
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut held = Vec::with_capacity(stripes.len());
        for stripe in stripes {
            held.push(self.0[stripe].lock().await);
        }
        held
    }
}

/// Where writes go: the store's pool, whether a transaction pooler stands
/// between, the store's record of broken connections, and the groups that
/// may be out at once.
#[derive(Clone)]
struct Target {
    pool: PgPool,
    pooler: bool,
    broken_at: Arc<AtomicI64>,
    slots: Arc<Semaphore>,
}

impl StepWriter {
    /// Starts the dispatcher on the current runtime.
    pub(super) fn start(pool: PgPool, pooler: bool, broken_at: Arc<AtomicI64>) -> StepWriter {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let counts = Arc::new(Counts::default());
        let target = Target {
            pool,
            pooler,
            broken_at,
            slots: Arc::new(Semaphore::new(GROUPS_IN_FLIGHT)),
        };
        tokio::spawn(dispatch(target.clone(), queue, counts.clone()));
        StepWriter {
            jobs,
            counts,
            target,
            stripes: LimitStripes::new(),
        }
    }

    pub(super) fn stripes(&self) -> &LimitStripes {
        &self.stripes
    }

    pub(super) fn counts(&self) -> GroupCounts {
        self.counts.now()
    }

    /// Sends `write` at once when nothing waits and a group slot is free,
    /// else in the next group; what it did once its statement committed.
    pub(super) async fn write(&self, write: StepWrite) -> Result<Written, sqlx::Error> {
        // An intent with limits goes in a statement of its own: the
        // group's statement reads one snapshot for all its records, so two
        // intents in it could not count each other.
        if let StepWrite::Intent(i) = &write {
            if !i.new.limits.is_empty() {
                let _turn = self.stripes.hold(&i.new.limits).await;
                self.counts.sent();
                self.counts.group(1);
                let conn = self.target.pool.acquire().await?;
                return alone(&self.target, conn, &write).await;
            }
        }
        if self.jobs.capacity() == self.jobs.max_capacity() {
            if let Ok(_slot) = self.target.slots.clone().try_acquire_owned() {
                self.counts.sent();
                self.counts.group(1);
                let conn = self.target.pool.acquire().await?;
                return alone(&self.target, conn, &write).await;
            }
        }
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send((write, reply))
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        self.counts.sent();
        answer.await.map_err(|_| sqlx::Error::PoolClosed)?
    }
}

async fn dispatch(target: Target, mut queue: mpsc::Receiver<Job>, counts: Arc<Counts>) {
    // Jobs whose run already had a write in the group being gathered.
    let mut held: VecDeque<Job> = VecDeque::new();
    loop {
        let first = match held.pop_front() {
            Some(job) => job,
            None => match queue.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let Ok(slot) = target.slots.clone().acquire_owned().await else {
            return;
        };
        // The connection before the rest of the group: jobs that arrive
        // while the pool is busy join this group.
        let conn = match target.pool.acquire().await {
            Ok(conn) => conn,
            Err(err) => {
                // No connection came within the wait: the database cannot
                // be reached. Everything queued meanwhile is answered now,
                // not one wait after another.
                let mut waiting: Vec<Job> = held.drain(..).collect();
                while let Ok(job) = queue.try_recv() {
                    waiting.push(job);
                }
                answer_all(waiting, &err);
                let _ = first.1.send(Err(err));
                continue;
            }
        };
        let mut runs = HashSet::from([first.0.run_id()]);
        let mut group = vec![first];
        let mut later = VecDeque::new();
        while group.len() < MAX_GROUP {
            let Some(job) = held.pop_front().or_else(|| queue.try_recv().ok()) else {
                break;
            };
            if runs.insert(job.0.run_id()) {
                group.push(job);
            } else {
                later.push_back(job);
            }
        }
        held.extend(later);
        counts.group(group.len());
        let target = target.clone();
        tokio::spawn(async move {
            let (intents, outcomes): (Vec<Job>, Vec<Job>) = group
                .into_iter()
                .partition(|(write, _)| matches!(write, StepWrite::Intent(_)));
            match (intents.is_empty(), outcomes.is_empty()) {
                (false, true) => write_group(&target, conn, intents).await,
                (true, false) => write_group(&target, conn, outcomes).await,
                _ => {
                    let second = async {
                        match target.pool.acquire().await {
                            Ok(other) => write_group(&target, other, outcomes).await,
                            Err(err) => answer_all(outcomes, &err),
                        }
                    };
                    tokio::join!(write_group(&target, conn, intents), second);
                }
            }
            drop(slot);
        });
    }
}

/// One write in a statement of its own.
async fn alone(
    target: &Target,
    conn: PoolConnection<Postgres>,
    write: &StepWrite,
) -> Result<Written, sqlx::Error> {
    send_retrying(target, conn, &[write])
        .await
        .map(|(rows, sent_twice)| Written {
            row: rows.into_iter().next(),
            sent_twice,
        })
        .map_err(|(err, _)| err)
}

/// Sends writes of one kind as one statement and answers their callers;
/// see the module's comment for what happens when the statement fails.
async fn write_group(target: &Target, conn: PoolConnection<Postgres>, group: Vec<Job>) {
    let writes: Vec<&StepWrite> = group.iter().map(|(write, _)| write).collect();
    match send_retrying(target, conn, &writes).await {
        Ok((rows, sent_twice)) => {
            let mut rows: HashMap<(String, i64), PgRow> = rows
                .into_iter()
                .filter_map(|row| {
                    let key = (row.try_get("run_id").ok()?, row.try_get("step_idx").ok()?);
                    Some((key, row))
                })
                .collect();
            for (write, reply) in group {
                let row = rows.remove(&(write.run_id().to_string(), write.step_idx()));
                let _ = reply.send(Ok(Written { row, sent_twice }));
            }
        }
        Err((err, _)) if group.len() == 1 => {
            if let Some((_, reply)) = group.into_iter().next() {
                let _ = reply.send(Err(err));
            }
        }
        Err((err, true)) => answer_all(group, &err),
        Err(_) => {
            // Rolled back whole: each write again on its own.
            for (write, reply) in group {
                let written = match target.pool.acquire().await {
                    Ok(conn) => alone(target, conn, &write).await,
                    Err(err) => Err(err),
                };
                let _ = reply.send(written);
            }
        }
    }
}

/// Tells every caller of `group` that its write was not made.
fn answer_all(group: Vec<Job>, cause: &sqlx::Error) {
    for (_, reply) in group {
        let _ = reply.send(Err(sqlx::Error::Protocol(format!(
            "the group's statement was not written: {cause}"
        ))));
    }
}

/// The statement for `writes`, sent once more on a fresh connection when
/// the first found its connection broken; the rows and whether it was sent
/// twice, or the error and whether the connection broke.
async fn send_retrying(
    target: &Target,
    conn: PoolConnection<Postgres>,
    writes: &[&StepWrite],
) -> Result<(Vec<PgRow>, bool), (sqlx::Error, bool)> {
    match send(target, conn, writes).await {
        Ok(rows) => Ok((rows, false)),
        Err(err) if super::connection_broke(&err, &target.broken_at) => {
            let conn = target.pool.acquire().await.map_err(|e| (e, true))?;
            match send(target, conn, writes).await {
                Ok(rows) => Ok((rows, true)),
                Err(err) => {
                    let broke = super::connection_broke(&err, &target.broken_at);
                    Err((err, broke))
                }
            }
        }
        Err(err) => Err((err, false)),
    }
}

/// One statement for `writes`, all of one kind: a single-step statement
/// for one, the group's for more. Behind a transaction pooler it goes
/// inside an explicit transaction, so the pooler never splits it between
/// servers.
async fn send(
    target: &Target,
    mut conn: PoolConnection<Postgres>,
    writes: &[&StepWrite],
) -> Result<Vec<PgRow>, sqlx::Error> {
    let now = Utc::now();
    // Records only for a group: a lone write binds its values directly.
    let mut intents = Vec::new();
    let mut outcomes = Vec::new();
    if writes.len() > 1 {
        let at = now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        for write in writes {
            match write {
                StepWrite::Intent(i) => intents.push(IntentRecord::of(i, &at)),
                StepWrite::Outcome(o) => outcomes.push(OutcomeRecord::of(o, &at)),
            }
        }
    }
    let statement = match writes {
        [StepWrite::Intent(i)] => intent_one(i, now),
        [StepWrite::Outcome(o)] => outcome_one(o, now),
        _ if outcomes.is_empty() => {
            Sql::<super::PostgresStore>::query(INTENTS).bind(Json(&intents))
        }
        _ => {
            let lazy = writes
                .iter()
                .all(|w| matches!(w, StepWrite::Outcome(o) if o.lazy));
            Sql::<super::PostgresStore>::query(OUTCOMES)
                .bind(Json(&outcomes))
                .bind(lazy.then_some("off"))
        }
    };
    if !target.pooler {
        return statement.fetch_all(&mut *conn).await;
    }
    let mut tx = conn.begin().await?;
    let rows = statement.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows)
}

type Statement<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

fn intent_one(i: &Intent, now: DateTime<Utc>) -> Statement<'_> {
    Sql::<super::PostgresStore>::bind_new_step(
        Sql::<super::PostgresStore>::query(INTENT_ONE),
        &i.new,
        now,
    )
    .bind(i64::from(counts_as_irreversible(&i.new)))
    .bind(i.actor.as_str())
    .bind(step_event_detail(&i.new))
    .bind(i.lease_owner.as_str())
    .bind(i.lease_ms)
    .bind(i.agent.as_str())
    .bind(&i.handover)
    .bind(i.token.as_deref())
    .bind(crate::store::sql::limits_json(&i.new))
}

fn outcome_one(o: &Settle, now: DateTime<Utc>) -> Statement<'_> {
    Sql::<super::PostgresStore>::bind_outcome(
        Sql::<super::PostgresStore>::query(OUTCOME_ONE),
        &o.outcome,
        now,
        o.run_id,
        o.step_idx,
    )
    .bind(o.lazy.then_some("off"))
    .bind(o.actor.as_str())
    .bind(settle_event_detail(&o.outcome))
    .bind(o.release.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_intents_statement_tests_every_unsettled_status() {
        assert!(INTENTS.contains(crate::store::sql::unsettled_sql!()));
    }
}
