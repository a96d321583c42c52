//! Group commit on PostgreSQL: the hot path's step writes of many runs
//! share one statement, and so one round trip and one commit.
//!
//! A step on the hot path is two writes: the intent, which takes the run's
//! lease with it, and the outcome, which gives the lease back. Each is a
//! job sent to one dispatcher task. The task takes the first job and
//! whatever others are waiting, at most one a run, and sends them as one
//! statement: the intents and the outcomes each as a JSON array of
//! records, unpacked by `jsonb_to_recordset`. The commit is durable when
//! any write in it must be. A job alone goes the same way, as a group of
//! one, so there is one statement text for both.
//!
//! Each write keeps its own condition: an intent lands only on a ready
//! run, an outcome only from the status it expects. A write whose
//! condition fails writes nothing, and its caller gets no row. A write
//! that raises an error (a key already in the log, a deadlock) fails the
//! whole statement, which PostgreSQL rolls back; each write of the group
//! is then sent again on its own, so the error reaches only the caller
//! whose write caused it. A statement that found its connection broken is
//! sent once more on a fresh connection, and its callers are told so: a
//! write that had landed the first time finds nothing to do the second.
//!
//! Callers are answered only after the commit, so an intent is on disk
//! before its call goes out, as before. At most `GROUPS_IN_FLIGHT`
//! statements are out at once; jobs that arrive meanwhile wait for the
//! next group, and past `QUEUE` waiting jobs callers wait their turn.

use crate::store::group_commit::{Counts, GroupCounts, MAX_GROUP, QUEUE};
use crate::store::sql::{unsettled_sql, Sql};
use serde::Serialize;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{Connection as _, PgPool, Postgres, Row as _};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Group statements out at once. Two keep both of PostgreSQL's cores of a
/// small server busy while the next group gathers; more would split the
/// waiting writes into smaller groups without more commits a second.
const GROUPS_IN_FLIGHT: usize = 2;

/// The whole group in one statement. `$1` holds the intents, `$2` the
/// outcomes, `$3` is `'off'` when no write needs its commit flushed
/// before the answer (DESIGN.md §9).
///
/// An intent advances and leases the run only if it is ready (running,
/// this agent's, at this index, no unsettled or owed step, no live lease
/// of another holder), then writes the step and its audit line. The
/// readiness test reads the statement's snapshot: a step settled by a
/// holder this statement waited for looks unsettled, which only sends the
/// caller down the general path. An outcome is a compare-and-set on the
/// step's status, with its audit line, and gives back the lease its
/// holder names if that lease still holds the run.
const GROUP_STATEMENT: &str = concat!(
    "WITH commit_mode AS (
        SELECT set_config('synchronous_commit',
            COALESCE($3, current_setting('synchronous_commit')), true) AS mode
     ), intent AS (
        SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(run_id text, step_idx int8, tool text,
            tool_class text, idempotency_key text, args text, status text, compensation text,
            audience text, phase text, at timestamptz, irreversible int8, actor text,
            detail text, agent text, lease_owner text, lease_ms float8, handover text)
     ), advanced AS (
        UPDATE runs SET next_step = runs.next_step + 1,
            irreversible_before_pivot = runs.irreversible_before_pivot + intent.irreversible,
            updated_at = intent.at, lease_owner = intent.lease_owner,
            lease_until = clock_timestamp() + intent.lease_ms * interval '1 millisecond'
        FROM intent
        WHERE runs.id = intent.run_id AND runs.next_step = intent.step_idx
            AND runs.agent = intent.agent AND runs.status = 'RUNNING'
            AND (runs.lease_owner IS NULL OR runs.lease_until < clock_timestamp()
                OR runs.lease_owner = intent.handover)
            AND NOT EXISTS (SELECT 1 FROM saga_log
                WHERE saga_log.run_id = intent.run_id AND saga_log.status IN ",
    unsettled_sql!(),
    ")
            AND NOT EXISTS (SELECT 1 FROM saga_log
                WHERE saga_log.run_id = intent.run_id AND saga_log.owed_to_agent)
            AND (SELECT mode FROM commit_mode) IS NOT NULL
        RETURNING runs.id
     ), inserted AS (
        INSERT INTO saga_log (run_id, step_idx, tool, tool_class, idempotency_key, args,
            status, compensation, audience, phase, approved_individually, created_at,
            updated_at)
        SELECT intent.run_id, intent.step_idx, intent.tool, intent.tool_class,
            intent.idempotency_key, intent.args::jsonb, intent.status,
            intent.compensation::jsonb, intent.audience, intent.phase, FALSE, intent.at,
            intent.at
        FROM intent JOIN advanced ON advanced.id = intent.run_id
        RETURNING *
     ), outcome AS (
        SELECT * FROM jsonb_to_recordset($2::jsonb) AS o(run_id text, step_idx int8,
            from_status text, to_status text, external_ref text, result text, error text,
            at timestamptz, actor text, detail text, release text)
     ), settled AS (
        UPDATE saga_log SET status = outcome.to_status,
            external_ref = COALESCE(outcome.external_ref, saga_log.external_ref),
            result = COALESCE(outcome.result::jsonb, saga_log.result),
            error = COALESCE(outcome.error, saga_log.error), updated_at = outcome.at
        FROM outcome
        WHERE saga_log.run_id = outcome.run_id AND saga_log.step_idx = outcome.step_idx
            AND saga_log.status = outcome.from_status
            AND (SELECT mode FROM commit_mode) IS NOT NULL
        RETURNING saga_log.*
     ), logged AS (
        INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status,
            detail, at)
        SELECT inserted.run_id, 'step', inserted.step_idx, intent.actor, NULL,
            inserted.status, intent.detail, intent.at
        FROM inserted JOIN intent ON intent.run_id = inserted.run_id
        UNION ALL
        SELECT settled.run_id, 'step', settled.step_idx, outcome.actor, outcome.from_status,
            settled.status, outcome.detail, outcome.at
        FROM settled JOIN outcome
            ON outcome.run_id = settled.run_id AND outcome.step_idx = settled.step_idx
     ), released AS (
        UPDATE runs SET lease_owner = NULL, lease_until = NULL
        FROM settled JOIN outcome
            ON outcome.run_id = settled.run_id AND outcome.step_idx = settled.step_idx
        WHERE runs.id = settled.run_id AND outcome.release IS NOT NULL
            AND runs.lease_owner = outcome.release
     )
     SELECT * FROM inserted UNION ALL SELECT * FROM settled"
);

/// A new step's intent on a ready run, with the lease it takes.
#[derive(Serialize)]
pub(super) struct IntentRecord {
    pub run_id: String,
    pub step_idx: i64,
    pub tool: String,
    pub tool_class: &'static str,
    pub idempotency_key: String,
    /// JSON text: a JSON `null` stays a value, not an SQL NULL.
    pub args: String,
    pub status: &'static str,
    pub compensation: Option<String>,
    pub audience: &'static str,
    pub phase: &'static str,
    /// RFC 3339, to the microsecond.
    pub at: String,
    /// 1 when the step counts as irreversible before the pivot.
    pub irreversible: i64,
    pub actor: String,
    pub detail: String,
    pub agent: String,
    pub lease_owner: String,
    pub lease_ms: i64,
    /// This store's own earlier lease of the run, let go of and maybe not
    /// yet released in the database: the intent may take over from it.
    pub handover: Option<String>,
}

/// A step's outcome, giving back the lease `release` names.
#[derive(Serialize)]
pub(super) struct OutcomeRecord {
    pub run_id: String,
    pub step_idx: i64,
    pub from_status: &'static str,
    pub to_status: &'static str,
    pub external_ref: Option<String>,
    /// JSON text.
    pub result: Option<String>,
    pub error: Option<String>,
    pub at: String,
    pub actor: String,
    pub detail: Option<String>,
    pub release: Option<String>,
    /// Its commit may return before the WAL is flushed.
    #[serde(skip)]
    pub lazy: bool,
}

pub(super) enum StepWrite {
    Intent(IntentRecord),
    Outcome(OutcomeRecord),
}

impl StepWrite {
    fn run_id(&self) -> &str {
        match self {
            StepWrite::Intent(i) => &i.run_id,
            StepWrite::Outcome(o) => &o.run_id,
        }
    }

    fn step_idx(&self) -> i64 {
        match self {
            StepWrite::Intent(i) => i.step_idx,
            StepWrite::Outcome(o) => o.step_idx,
        }
    }

    fn lazy(&self) -> bool {
        matches!(self, StepWrite::Outcome(o) if o.lazy)
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
}

/// Where a group goes: the store's pool, whether a transaction pooler
/// stands between, and the store's record of broken connections.
#[derive(Clone)]
struct Target {
    pool: PgPool,
    pooler: bool,
    broken_at: Arc<AtomicI64>,
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
        };
        tokio::spawn(dispatch(target, queue, counts.clone()));
        StepWriter { jobs, counts }
    }

    pub(super) fn counts(&self) -> GroupCounts {
        self.counts.now()
    }

    /// Sends `write` in the next group; what it did once that committed.
    pub(super) async fn write(&self, write: StepWrite) -> Result<Written, sqlx::Error> {
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
    let slots = Arc::new(Semaphore::new(GROUPS_IN_FLIGHT));
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
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // The connection before the rest of the group: jobs that arrive
        // while the pool is busy join this group.
        let conn = match target.pool.acquire().await {
            Ok(conn) => conn,
            Err(err) => {
                let _ = first.1.send(Err(err));
                continue;
            }
        };
        let mut runs = HashSet::from([first.0.run_id().to_owned()]);
        let mut group = vec![first];
        let mut later = VecDeque::new();
        while group.len() < MAX_GROUP {
            let Some(job) = held.pop_front().or_else(|| queue.try_recv().ok()) else {
                break;
            };
            if runs.insert(job.0.run_id().to_owned()) {
                group.push(job);
            } else {
                later.push_back(job);
            }
        }
        held.extend(later);
        counts.group(group.len());
        let target = target.clone();
        tokio::spawn(async move {
            write_group(&target, conn, group).await;
            drop(slot);
        });
    }
}

/// Sends the group and answers its callers; see the module's comment for
/// what happens when the statement fails.
async fn write_group(target: &Target, conn: PoolConnection<Postgres>, group: Vec<Job>) {
    let writes: Vec<&StepWrite> = group.iter().map(|(write, _)| write).collect();
    match send_retrying(target, conn, &writes).await {
        Ok((rows, sent_twice)) => {
            let mut rows: HashMap<(String, i64), PgRow> = rows
                .into_iter()
                .filter_map(|row| {
                    Some((
                        (row.try_get("run_id").ok()?, row.try_get("step_idx").ok()?),
                        row,
                    ))
                })
                .collect();
            for (write, reply) in group {
                let row = rows.remove(&(write.run_id().to_owned(), write.step_idx()));
                let _ = reply.send(Ok(Written { row, sent_twice }));
            }
        }
        Err((err, _)) if group.len() == 1 => {
            if let Some((_, reply)) = group.into_iter().next() {
                let _ = reply.send(Err(err));
            }
        }
        Err((err, broke)) if broke => {
            for (_, reply) in group {
                let _ = reply.send(Err(lost(&err)));
            }
        }
        Err(_) => {
            // Rolled back whole: each write again on its own.
            for (write, reply) in group {
                let alone = match target.pool.acquire().await {
                    Ok(conn) => send_retrying(target, conn, &[&write])
                        .await
                        .map(|(rows, sent_twice)| Written {
                            row: rows.into_iter().next(),
                            sent_twice,
                        })
                        .map_err(|(err, _)| err),
                    Err(err) => Err(err),
                };
                let _ = reply.send(alone);
            }
        }
    }
}

/// The group's statement, sent once more on a fresh connection when the
/// first found its connection broken; the rows and whether it was sent
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

/// One statement for `writes`; behind a transaction pooler inside an
/// explicit transaction, so the pooler never splits it between servers.
async fn send(
    target: &Target,
    mut conn: PoolConnection<Postgres>,
    writes: &[&StepWrite],
) -> Result<Vec<PgRow>, sqlx::Error> {
    let mut intents = Vec::new();
    let mut outcomes = Vec::new();
    for write in writes {
        match write {
            StepWrite::Intent(i) => intents.push(i),
            StepWrite::Outcome(o) => outcomes.push(o),
        }
    }
    let lazy = writes.iter().all(|w| w.lazy());
    let statement = Sql::<super::PostgresStore>::query(GROUP_STATEMENT)
        .bind(Json(&intents))
        .bind(Json(&outcomes))
        .bind(lazy.then_some("off"));
    if !target.pooler {
        return statement.fetch_all(&mut *conn).await;
    }
    let mut tx = conn.begin().await?;
    let rows = statement.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows)
}

fn lost(cause: &sqlx::Error) -> sqlx::Error {
    sqlx::Error::Protocol(format!("the group's statement was not written: {cause}"))
}
