//! Group commit for SQLite's single writer: the step writes of many runs
//! share one transaction, and so one fsync.
//!
//! Every step write (an intent, an outcome) is a job sent to one writer
//! task. The task takes the first job and whatever others are already
//! waiting, and commits them together: each job inside its own savepoint,
//! so one job's refusal (a duplicate key, a stale status) undoes that job
//! alone. A job is answered only after the commit that holds it returned,
//! so a durable job is on disk before its caller hears of it, as before.
//! A job alone in its group goes as one batch with its own `BEGIN` and
//! `COMMIT`: one call into SQLite, the same as without grouping.
//!
//! The task owns the work, so a caller that gives up half way (an agent
//! that hangs up) cannot leave the writer inside an open transaction.

use crate::saga::model::Durability;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Sqlite, SqlitePool};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// The most jobs one transaction carries.
pub(crate) const MAX_GROUP: usize = 64;

/// The most jobs waiting for the writer: four groups' worth. Callers past
/// it wait their turn (back-pressure), so a burst cannot queue without end.
pub const QUEUE: usize = 4 * MAX_GROUP;

/// One step write, in both of its forms.
pub struct WriteJob {
    /// The job alone: `PRAGMA synchronous …; BEGIN IMMEDIATE; … COMMIT;`.
    pub alone: &'static str,
    /// The same writes inside a group: `SAVEPOINT job; … RELEASE job;`.
    pub grouped: &'static str,
    pub args: SqliteArguments<'static>,
    pub durability: Durability,
}

type Writer = PoolConnection<Sqlite>;
type Reply = oneshot::Sender<Result<Vec<SqliteRow>, sqlx::Error>>;

/// The handle the store keeps; dropping it ends the writer task.
pub struct GroupWriter {
    jobs: mpsc::Sender<(WriteJob, Reply)>,
    counts: Arc<Counts>,
}

/// Jobs sent, transactions begun, and the jobs those carried.
#[derive(Default)]
pub(crate) struct Counts {
    sent: AtomicU64,
    groups: AtomicU64,
    jobs: AtomicU64,
}

impl Counts {
    /// One more job queued.
    pub(crate) fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// One more group, carrying `jobs`.
    pub(crate) fn group(&self, jobs: usize) {
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.jobs.fetch_add(jobs as u64, Ordering::Relaxed);
    }

    pub(crate) fn now(&self) -> GroupCounts {
        GroupCounts {
            sent: self.sent.load(Ordering::Relaxed),
            groups: self.groups.load(Ordering::Relaxed),
            jobs: self.jobs.load(Ordering::Relaxed),
        }
    }
}

/// What the writer has done so far: `jobs / groups` is how many step
/// writes shared each commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCounts {
    pub sent: u64,
    pub groups: u64,
    pub jobs: u64,
}

impl GroupWriter {
    /// Starts the writer task on the current runtime. `normal` says whether
    /// the writer connection was last left at `synchronous = NORMAL`; the
    /// task keeps it up to date after each of its commits.
    pub fn start(writer: SqlitePool, normal: Arc<AtomicBool>) -> GroupWriter {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let counts = Arc::new(Counts::default());
        tokio::spawn(run(writer, normal, queue, counts.clone()));
        GroupWriter { jobs, counts }
    }

    pub fn counts(&self) -> GroupCounts {
        self.counts.now()
    }

    /// Runs `job` in the next group; its rows once that group committed.
    pub async fn write(&self, job: WriteJob) -> Result<Vec<SqliteRow>, sqlx::Error> {
        let (reply, answer) = oneshot::channel();
        // A full queue is a wait, not an error: the caller's write goes in
        // as soon as the writer has taken earlier ones.
        self.jobs
            .send((job, reply))
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        self.counts.sent();
        answer.await.map_err(|_| sqlx::Error::PoolClosed)?
    }
}

async fn run(
    writer: SqlitePool,
    normal: Arc<AtomicBool>,
    mut queue: mpsc::Receiver<(WriteJob, Reply)>,
    counts: Arc<Counts>,
) {
    while let Some(first) = queue.recv().await {
        // The connection first: jobs that arrive while another writer holds
        // it join this group.
        let conn = match writer.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                let _ = first.1.send(Err(lost("no writer connection", &e)));
                continue;
            }
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        counts.group(group.len());
        if group.len() == 1 {
            if let Some((job, reply)) = group.pop() {
                let _ = reply.send(alone(conn, job, normal.clone()).await);
            }
        } else {
            together(conn, group, normal.clone()).await;
        }
    }
}

/// One job, one batch. A batch that fails is rolled back, and the writer
/// goes back to `synchronous = FULL`, the safe side.
async fn alone(
    mut conn: Writer,
    job: WriteJob,
    normal: Arc<AtomicBool>,
) -> Result<Vec<SqliteRow>, sqlx::Error> {
    let done = sqlx::query_with(job.alone, job.args)
        .fetch_all(&mut *conn)
        .await;
    match &done {
        Ok(_) => normal.store(job.durability == Durability::Lazy, Ordering::Release),
        Err(_) => abandon(conn, normal).await,
    }
    done
}

/// Several jobs in one transaction, at `FULL` when any of them must be
/// durable. A job that fails is rolled back to its savepoint; should that
/// roll-back fail, SQLite has already ended the transaction, so every job
/// of the group is answered with the failure (none of them is on disk).
async fn together(mut conn: Writer, group: Vec<(WriteJob, Reply)>, normal: Arc<AtomicBool>) {
    let durable = group
        .iter()
        .any(|(job, _)| job.durability == Durability::Durable);
    let begin = if durable {
        "PRAGMA synchronous = FULL; BEGIN IMMEDIATE;"
    } else {
        "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE;"
    };
    if let Err(e) = sqlx::query(begin).execute(&mut *conn).await {
        abandon(conn, normal).await;
        for (_, reply) in group {
            let _ = reply.send(Err(lost("the group's transaction did not begin", &e)));
        }
        return;
    }
    let mut answers = Vec::with_capacity(group.len());
    let mut broken = None;
    for (job, reply) in group {
        if let Some(why) = &broken {
            answers.push((reply, Err(lost("the group's transaction ended", why))));
            continue;
        }
        let done = sqlx::query_with(job.grouped, job.args)
            .fetch_all(&mut *conn)
            .await;
        if done.is_err() {
            if let Err(e) = sqlx::query("ROLLBACK TO job; RELEASE job;")
                .execute(&mut *conn)
                .await
            {
                broken = Some(e);
            }
        }
        answers.push((reply, done));
    }
    let committed = match broken {
        Some(e) => Err(e),
        None => sqlx::query("COMMIT").execute(&mut *conn).await.map(|_| ()),
    };
    match committed {
        Ok(()) => {
            normal.store(!durable, Ordering::Release);
            for (reply, done) in answers {
                let _ = reply.send(done);
            }
        }
        Err(e) => {
            abandon(conn, normal).await;
            for (reply, done) in answers {
                // A job that failed on its own keeps its own error.
                let answer = done.and_then(|_| Err(lost("the group commit failed", &e)));
                let _ = reply.send(answer);
            }
        }
    }
}

/// Rolls back whatever is open and returns the writer to `FULL`. Should
/// the reset fail too, the flag says NORMAL, so the next durable write
/// sets FULL again.
async fn abandon(mut conn: Writer, normal: Arc<AtomicBool>) {
    let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
    let reset = sqlx::query("PRAGMA synchronous = FULL")
        .execute(&mut *conn)
        .await;
    normal.store(reset.is_err(), Ordering::Release);
}

fn lost(what: &str, cause: &sqlx::Error) -> sqlx::Error {
    sqlx::Error::Protocol(format!("{what}: {cause}"))
}
