//! The storage the saga core needs, in saga terms (DESIGN.md §3, §8).
//!
//! Implemented for SQLite and PostgreSQL in `crate::store`; the same contract
//! test suite (tests/in_process/store_contract.rs) runs against both. Every status change
//! goes through the judges in [`super::status`] and appends an audit event in
//! the same transaction, and every change is a compare-and-set on the status
//! the caller last saw, so two harness instances never both win.

use super::model::*;
use super::status::{CorrectionStatus, IllegalTransition, RunStatus};
use async_trait::async_trait;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what} not found")]
    NotFound { what: String },
    #[error(transparent)]
    IllegalTransition(#[from] IllegalTransition),
    /// The row is no longer in the status the caller read: someone else
    /// moved it first. Re-read and decide again.
    #[error("{what} is {actual}, not {expected}: it changed meanwhile")]
    Stale {
        what: String,
        expected: String,
        actual: String,
    },
    /// A new step must take the run's `next_step` (R3).
    #[error("step {given} is out of order: the run's next step is {expected}")]
    StepOutOfOrder { given: i64, expected: i64 },
    #[error("step {step_idx} already exists")]
    StepExists { step_idx: i64 },
    /// An idempotency key, username or similar unique value is taken.
    #[error("{what} already exists")]
    Duplicate { what: String },
    /// The approver saw another plan than the one stored now.
    #[error("the plan changed since it was shown: reload and review it again")]
    PlanChanged,
    /// Another harness instance holds the run's lease (a call of its own is
    /// in flight) and did not let go within the wait.
    #[error("another harness instance is working on this run (waited {waited_ms} ms)")]
    RunBusy { waited_ms: u64 },
    /// This instance was paused past its lease on the run before a call
    /// left: another instance may have taken the run over, so nothing was
    /// sent and nothing written.
    #[error("this harness instance lost its hold on the run (it was paused past its lease); nothing was sent")]
    LeaseLost,
    /// The step's intent would take the limit of its charge number
    /// `charge` past its maximum, `used` being counted already: nothing
    /// was written.
    #[error(
        "the step would cross a limit (charge {charge}, {used} used already); nothing was written"
    )]
    OverLimit { charge: usize, used: i64 },
    /// The request cannot be stored as asked (says why).
    #[error("{0}")]
    Invalid(String),
    /// The database cannot be reached or cannot take the write now (it is
    /// restarting, a connection was cut, no connection came free within
    /// the wait, the disk is full). Nothing was done that the request
    /// needs undone: it can be sent again as it stands. The cause is for
    /// the log only.
    #[error("the harness's database cannot be reached now; nothing was sent, and the same request can be sent again in a few seconds")]
    Unavailable { cause: String },
    /// The call was made, and then the database could not take its
    /// outcome: the step stays as its intent left it, and the next call
    /// for it (or the next start) settles it by lookup under its key.
    #[error("the call was sent, but the harness's database could not record its outcome; it may have happened. Send the same request again in a few seconds: the harness looks the outcome up under the step's key and never makes the call twice")]
    OutcomeUnrecorded { cause: String },
    /// A row in the database that this version cannot read.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// The database refused or failed otherwise: what was being done, and
    /// the driver's error as the source.
    #[error("{context}: {source}")]
    Database {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// A database failure while doing `context`, keeping its cause.
    pub fn database(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StoreError {
        StoreError::Database {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A failure of the harness's own storage, not of the request: its
    /// words are for the log, never for whoever asked.
    pub fn is_internal(&self) -> bool {
        matches!(self, StoreError::Database { .. } | StoreError::Corrupt(_))
    }

    /// The database could not be reached; the same request can be sent
    /// again once it is back.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. } | StoreError::OutcomeUnrecorded { .. }
        )
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Which backend a store runs on (for messages and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A run's lease as its holder's own monotonic clock sees it: how long it
/// is sure to hold the run without asking the database.
#[async_trait]
pub trait LeaseFence: Send + Sync {
    /// `Ok` when this holder may still send a call of the run that can
    /// take up to `call` to be answered: by its own clock its lease lasts
    /// that long plus a margin (and at least a renewal period), or renewing
    /// it now, in the database, confirms the run is still this holder's.
    /// `LeaseLost` otherwise.
    async fn confirm(&self, call: std::time::Duration) -> StoreResult<()>;
}

/// Exclusive work on one run across every harness process sharing the
/// database, until dropped. Holds no connection: on PostgreSQL a lease in
/// the run's row, renewed while held.
pub trait RunClaim: Send + Sync {
    /// What a send checks first; `None` where one process owns the
    /// database (SQLite) and no pause can hand the run to another.
    fn fence(&self) -> Option<std::sync::Arc<dyn LeaseFence>> {
        None
    }
    /// The lease's token in the run's row, for a statement that gives the
    /// lease back with its own write; `None` when the claim holds nothing
    /// in the database.
    fn lease_token(&self) -> Option<&str> {
        None
    }
    /// A statement gave the lease back: dropping the claim writes nothing.
    fn given_back(&mut self) {}
}

/// A run claimed, and what a call reads first, read under the claim.
pub struct ClaimedRun {
    pub claim: Box<dyn RunClaim>,
    pub read: ClaimedRead,
}

/// What a call reads first about its run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimedRead {
    pub run: Option<Run>,
    /// The run's unsettled steps, in step order (see `unsettled_steps`).
    pub unsettled: Vec<Step>,
    /// The run's steps still owed to the agent (R12), settled or not, in
    /// step order.
    pub owed: Vec<Step>,
}

/// A page of the runs list and how many runs match in all.
#[derive(Clone, Debug, PartialEq)]
pub struct RunsPage {
    /// Each run, and whether it waits for an approval.
    pub runs: Vec<(Run, bool)>,
    pub total: i64,
}

#[async_trait]
pub trait SagaStore: Send + Sync + 'static {
    fn backend(&self) -> Backend;

    /// Waits until no other process works on this run, then holds it until
    /// the claim is dropped; `RunBusy` when another holds it past the
    /// store's wait. (A SQLite file has one process by design, so there the
    /// claim is free.)
    async fn claim_run(&self, run_id: Uuid) -> StoreResult<Box<dyn RunClaim>>;
    /// `claim_run` without waiting: `None` when another process holds the
    /// run now (background work leaves it to its holder).
    async fn try_claim_run(&self, run_id: Uuid) -> StoreResult<Option<Box<dyn RunClaim>>> {
        self.claim_run(run_id).await.map(Some)
    }
    /// `claim_run`, then the run and its unsettled steps read under the
    /// claim: on PostgreSQL all three in one round trip.
    async fn claim_and_read(&self, run_id: Uuid) -> StoreResult<ClaimedRun>;

    /// The hot path of a new step: the run claimed and the step's intent
    /// written in one commit (on PostgreSQL one statement), when the run is
    /// ready for it: RUNNING, the bearer's agent's, its next step
    /// `new.step_idx`, no step unsettled and none owed to the agent, (on
    /// PostgreSQL) no live lease of another holder, and the bearer's token
    /// to check, if any, issued to that agent and not revoked. `None` when
    /// it is not: then nothing was claimed or written, and the caller takes
    /// the general path (`claim_and_read`), which waits for the run and
    /// says what stands in the way.
    async fn claim_and_record_step(
        &self,
        bearer: Bearer<'_>,
        new: NewStep,
        actor: &Actor,
    ) -> StoreResult<Option<(Box<dyn RunClaim>, Step)>>;
    /// `settle_step` that gives the run's claim back in the same commit:
    /// for an outcome that is the holder's last write on the run. Once the
    /// outcome is written the claim is empty, and dropping it writes
    /// nothing; when the compare-and-set finds the step moved, the claim is
    /// left as it was.
    async fn settle_step_and_release(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
        claim: &mut dyn RunClaim,
    ) -> StoreResult<Step>;

    // --- runs -------------------------------------------------------------

    /// Creates a run, or returns the agent's existing run with the same
    /// label. The boolean says whether it was created now.
    async fn create_run(&self, new: NewRun) -> StoreResult<(Run, bool)>;
    async fn run(&self, id: Uuid) -> StoreResult<Option<Run>>;
    /// Newest first.
    async fn list_runs(&self, limit: i64) -> StoreResult<Vec<Run>>;
    /// Runs in `status` last changed before `before`, in the order they
    /// were created, after the keyset `after` (their `created_at` and id):
    /// the pruner's pages.
    async fn finished_runs_before(
        &self,
        status: crate::status::RunStatus,
        before: chrono::DateTime<chrono::Utc>,
        after: Option<(chrono::DateTime<chrono::Utc>, Uuid)>,
        limit: i64,
    ) -> StoreResult<Vec<Run>>;
    /// Everything the log holds about each of these runs (a page of the
    /// pruner's), in their order, with one read per table however many
    /// runs there are.
    async fn histories(&self, runs: Vec<Run>) -> StoreResult<Vec<crate::retention::RunHistory>>;
    /// Removes runs and everything about them (steps, compensations,
    /// approvals and their messages, corrections, audit lines, limit
    /// usage) in one transaction, except those changed since they were
    /// read: each comes with the `updated_at` it was read with. Says which
    /// were removed, and counts the rows.
    async fn remove_runs(
        &self,
        runs: &[(Uuid, chrono::DateTime<chrono::Utc>)],
    ) -> StoreResult<(Vec<Uuid>, crate::retention::Removed)>;
    /// `remove_runs` for one run: `None` when it changed since it was read.
    async fn remove_run(
        &self,
        run_id: Uuid,
        seen: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<Option<crate::retention::Removed>> {
        let (gone, rows) = self.remove_runs(&[(run_id, seen)]).await?;
        Ok((!gone.is_empty()).then_some(rows))
    }
    /// One page of runs for people: those awaiting approval (a pivot, or a
    /// held single step) first, then those needing a person, then the rest,
    /// newest first; optionally only one status.
    ///
    /// `search`, unless empty, keeps the runs whose label, purpose or agent
    /// contains it, or any of whose calls' arguments do (a customer's id or
    /// address), ignoring case.
    async fn runs_page(
        &self,
        status: Option<RunStatus>,
        search: &str,
        offset: i64,
        limit: i64,
    ) -> StoreResult<RunsPage>;
    /// Why each of these runs is being or was taken back: the audit line
    /// that moved it to UNWINDING (who, when, and the reason in its detail).
    /// Runs never unwound are absent.
    async fn unwind_reasons(
        &self,
        runs: &[Uuid],
    ) -> StoreResult<std::collections::HashMap<Uuid, Event>>;
    /// Every run in one of these statuses, oldest first (resume, sweeps).
    async fn runs_with_status(&self, statuses: &[RunStatus]) -> StoreResult<Vec<Run>>;
    /// Moves a run; entering NEEDS_ATTENTION remembers where it was, and
    /// leaving it may only return there.
    async fn move_run(
        &self,
        id: Uuid,
        from: RunStatus,
        to: RunStatus,
        actor: &Actor,
        detail: Option<&str>,
    ) -> StoreResult<Run>;

    // --- the saga log -----------------------------------------------------

    /// Commits the intent row durably before anything is sent (R2). The
    /// index must be the run's `next_step`, which then advances.
    async fn record_step(&self, new: NewStep, actor: &Actor) -> StoreResult<Step>;
    /// A step held for a person (AWAITING_APPROVAL) and its approval
    /// request, in one commit: a held call always has its request.
    async fn record_held_step(
        &self,
        new: NewStep,
        approval: NewApproval,
        actor: &Actor,
    ) -> StoreResult<(Step, Approval)>;
    /// Moves a step to its outcome; `Durability::Lazy` lets the commit reach
    /// the disk with the next durable one (DESIGN.md §9).
    async fn settle_step(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Step>;
    async fn step(&self, run_id: Uuid, step_idx: i64) -> StoreResult<Option<Step>>;
    async fn steps(&self, run_id: Uuid) -> StoreResult<Vec<Step>>;
    /// The counted usage of each limit scope (`refunds|agent:demo-agent`)
    /// within its window of seconds (`None`: ever), on the database's
    /// clock: what the steps still counted add up to.
    async fn limit_usage(&self, scopes: &[(String, Option<i64>)]) -> StoreResult<Vec<i64>>;
    /// For each limit (its name, its window), the highest counted usage of
    /// any one of its scopes: how near the busiest agent, run or customer
    /// is to it.
    async fn limit_peaks(&self, limits: &[(String, Option<i64>)]) -> StoreResult<Vec<i64>>;
    /// The steps of several runs that call one of `tools`, in one read (a
    /// page of the runs list reads only the calls that name a customer or
    /// move money).
    async fn steps_of_runs(&self, runs: &[Uuid], tools: &[&str]) -> StoreResult<Vec<Step>>;
    /// The run's steps that are not settled (INTENDED, UNKNOWN,
    /// AWAITING_APPROVAL), in step order: what a new step must wait for.
    /// Its cost follows the unsettled steps, not the length of the run.
    async fn unsettled_steps(&self, run_id: Uuid) -> StoreResult<Vec<Step>>;
    async fn step_by_key(&self, idempotency_key: &str) -> StoreResult<Option<Step>>;
    /// R12: records whether the step's last answer to the agent left it
    /// owed (a non-final answer) or gave the agent its final outcome.
    async fn set_owed_to_agent(&self, run_id: Uuid, step_idx: i64, owed: bool) -> StoreResult<()>;
    /// An audit line about a run that changes no status (an agent's
    /// declared new effect, say).
    async fn note(&self, run_id: Uuid, actor: &Actor, detail: &str) -> StoreResult<()>;
    /// (run, step index) of every INTENDED or UNKNOWN step not touched
    /// since `before`, in a run that is in one of `statuses`, in run and step
    /// order. One query over the unsettled-steps index: its cost follows the
    /// unsettled steps, not the size of the log.
    async fn stale_steps(
        &self,
        before: chrono::DateTime<chrono::Utc>,
        statuses: &[RunStatus],
    ) -> StoreResult<Vec<(Uuid, i64)>>;

    // --- compensations ----------------------------------------------------

    /// The compensation's own intent row, durable before the call (R8).
    async fn record_compensation(
        &self,
        new: NewCompensation,
        actor: &Actor,
    ) -> StoreResult<Compensation>;
    async fn settle_compensation(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Compensation>;
    async fn compensations(&self, run_id: Uuid) -> StoreResult<Vec<Compensation>>;

    // --- approvals --------------------------------------------------------

    /// A new request. A pivot request supersedes the run's pending one and
    /// becomes the run's pivot.
    /// `run_move` happens in the same transaction (RUNNING → AWAITING_APPROVAL
    /// when a pivot is first proposed).
    async fn request_approval(
        &self,
        new: NewApproval,
        run_move: Option<(RunStatus, RunStatus)>,
        actor: &Actor,
    ) -> StoreResult<Approval>;
    /// Replaces a waiting approval's plan with an approver's edit, if the
    /// plan is still the one they edited (else `PlanChanged`). A first
    /// approval under the two-person rule is cleared: it approved the old
    /// plan. The audit line is appended in the same transaction.
    async fn edit_plan(&self, change: PlanChange, actor: &Actor) -> StoreResult<Approval>;
    /// Decides a pending request, checking the digest the person saw, and
    /// moves the run in the same transaction. A replay finds it decided.
    async fn decide_approval(&self, decision: Decision, actor: &Actor) -> StoreResult<Approval>;
    async fn approval(&self, id: i64) -> StoreResult<Option<Approval>>;
    async fn approvals(&self, run_id: Uuid) -> StoreResult<Vec<Approval>>;
    /// Every pending request, oldest first.
    async fn pending_approvals(&self) -> StoreResult<Vec<Approval>>;

    // --- notices: messages telling people an approval waits ---------------

    /// Pending approvals no notice has been written for, oldest first.
    async fn approvals_without_notice(&self) -> StoreResult<Vec<Approval>>;
    /// Writes a notice as intended before it is posted; writing the same
    /// (approval, place) again returns the existing one.
    async fn record_notice(&self, new: NewNotice) -> StoreResult<Notice>;
    /// Stores a notice's status, reference, shown digest, done flag and
    /// error as given.
    async fn save_notice(&self, notice: &Notice) -> StoreResult<()>;
    /// Notices not yet showing their approval's final outcome.
    async fn open_notices(&self) -> StoreResult<Vec<Notice>>;
    /// The notices of one approval.
    async fn notices(&self, approval_id: i64) -> StoreResult<Vec<Notice>>;
    /// Remembers a signed request's signature; `false` when it was seen
    /// before (a replay). Signatures seen before `forget_before` are
    /// dropped first: their timestamps are refused anyway.
    async fn first_sighting(
        &self,
        signature: &str,
        now: chrono::DateTime<chrono::Utc>,
        forget_before: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<bool>;

    // --- corrections ------------------------------------------------------

    /// Queues a correction; queuing the same (run, step, source) again
    /// returns the existing one.
    async fn queue_correction(&self, new: NewCorrection, actor: &Actor) -> StoreResult<Correction>;
    /// Edits the text while it is still pending (a signed-off text is frozen).
    async fn edit_correction(
        &self,
        id: i64,
        message: &str,
        actor: &Actor,
    ) -> StoreResult<Correction>;
    async fn move_correction(
        &self,
        id: i64,
        from: CorrectionStatus,
        to: CorrectionStatus,
        reason: Option<&str>,
        actor: &Actor,
    ) -> StoreResult<Correction>;
    /// The send's own lifecycle (INTENDED → …), like a compensation's.
    async fn settle_correction_send(
        &self,
        id: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Correction>;
    async fn correction(&self, id: i64) -> StoreResult<Option<Correction>>;
    async fn corrections(&self, run_id: Uuid) -> StoreResult<Vec<Correction>>;
    /// Pending and approved-but-unsent corrections, highest blast radius
    /// first, then oldest first.
    async fn correction_queue(&self) -> StoreResult<Vec<Correction>>;
    /// The same queue, each with its run's title and the logged call it
    /// corrects: the corrections inbox, in one query.
    async fn correction_inbox(&self) -> StoreResult<Vec<QueuedCorrection>>;

    // --- audit ------------------------------------------------------------

    /// Oldest first; all runs when `run_id` is `None`.
    async fn events(&self, run_id: Option<Uuid>, limit: i64) -> StoreResult<Vec<Event>>;
    /// A run's events with ids above `after_id`, oldest first.
    async fn events_after(
        &self,
        run_id: Uuid,
        after_id: i64,
        limit: i64,
    ) -> StoreResult<Vec<Event>>;

    /// Every run's events, newest first (the audit page).
    async fn recent_events(&self, limit: i64) -> StoreResult<Vec<Event>>;
    /// One page of the audit trail, newest first: events with ids below
    /// `before_id` (all when `None`), only people's decisions when
    /// `people_only`. Filtered in the database, so agents' events cannot
    /// push people's decisions off the page.
    async fn audit_page(
        &self,
        people_only: bool,
        before_id: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<Event>>;
    /// Every run's events with ids above `after_id`, oldest first (the
    /// dashboard's live stream).
    async fn all_events_after(&self, after_id: i64, limit: i64) -> StoreResult<Vec<Event>>;

    // --- people and agents ------------------------------------------------

    async fn add_user(
        &self,
        username: &str,
        password_hash: &str,
        role: super::class::Role,
    ) -> StoreResult<User>;
    /// The person by username, whatever its case.
    async fn credentials(&self, username: &str) -> StoreResult<Option<Credentials>>;
    /// Removes a person; their sessions end at their next request.
    async fn remove_user(&self, username: &str) -> StoreResult<User>;
    /// Changes a person's role; it applies from their next request.
    async fn set_role(&self, username: &str, role: super::class::Role) -> StoreResult<User>;
    /// Puts a person in `group` (`member`) or takes them out of it; it
    /// applies from their next request.
    async fn set_group(&self, username: &str, group: &str, member: bool) -> StoreResult<User>;
    /// Revokes every live token of an agent; returns how many.
    async fn revoke_tokens(&self, agent: &str) -> StoreResult<u64>;
    async fn add_api_token(
        &self,
        agent: &str,
        token_hash: &str,
        label: Option<&str>,
    ) -> StoreResult<ApiToken>;
    /// The agent a (hashed) bearer token belongs to, if it is valid.
    async fn agent_for_token(&self, token_hash: &str) -> StoreResult<Option<String>>;
}
