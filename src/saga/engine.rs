//! Dispatch: where a tool call becomes an INTENDED row, then a call, then an
//! outcome (R2–R7, R9, DESIGN.md §4–§5).
//!
//! `Engine::call` is the one entry for an agent's call. Pure calls go
//! straight to the connector. A non-pure call names its step: a new step is
//! logged (or held for approval) before anything is sent; an old step gets
//! its recorded outcome, reconciled first if it is unsettled, re-executed
//! under the same key and logged arguments if nothing happened.

use super::class::{Phase, ToolClass};
use super::connector::{
    classify, outcome_of_call, outcome_of_lookup, CallReport, Classified, Connector, Lookup,
    LookupError,
};
use super::key::step_key;
use super::model::*;
use super::observe::{system_of, Observer, Settlement, SystemRequest, Unobserved};
use super::registry::{Registry, ToolSpec};
use super::status::{ApprovalStatus, RunStatus, StepStatus};
use super::store::{ClaimedRead, LeaseFence, RunClaim, SagaStore, StoreError};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument as _;
use uuid::Uuid;

/// What the agent is told about its call (§5): never an HTTP error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    Confirmed,
    Failed,
    Unknown,
    NotExecuted,
    AwaitingApproval,
    Rejected,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallOutcome {
    pub outcome: OutcomeKind,
    /// `None` for pure calls: they take no step index (R2).
    pub step: Option<i64>,
    pub key: Option<String>,
    pub external_ref: Option<String>,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// Written for a model: what to do next.
    pub message: String,
    /// The step to send next (R12): the oldest step still owed to the agent
    /// (its last answer was unknown, not executed or awaiting approval),
    /// to be re-sent unchanged; else the index a new step takes.
    pub next_step: i64,
    /// The index a new effect takes, whatever is owed.
    pub new_step: i64,
}

impl OutcomeKind {
    pub const ALL: [OutcomeKind; 6] = [
        OutcomeKind::Confirmed,
        OutcomeKind::Failed,
        OutcomeKind::Unknown,
        OutcomeKind::NotExecuted,
        OutcomeKind::AwaitingApproval,
        OutcomeKind::Rejected,
    ];

    /// Whether this answer gives the agent the step's final outcome; any
    /// other leaves the step owed to the agent (R12).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            OutcomeKind::Confirmed | OutcomeKind::Failed | OutcomeKind::Rejected
        )
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            OutcomeKind::Confirmed => "confirmed",
            OutcomeKind::Failed => "failed",
            OutcomeKind::Unknown => "unknown",
            OutcomeKind::NotExecuted => "not_executed",
            OutcomeKind::AwaitingApproval => "awaiting_approval",
            OutcomeKind::Rejected => "rejected",
        }
    }

    /// What the agent is told of a step in this status.
    pub fn of(status: StepStatus) -> OutcomeKind {
        match status {
            StepStatus::Confirmed | StepStatus::Compensated => OutcomeKind::Confirmed,
            StepStatus::Failed => OutcomeKind::Failed,
            StepStatus::Intended | StepStatus::Unknown => OutcomeKind::Unknown,
            StepStatus::NotExecuted => OutcomeKind::NotExecuted,
            StepStatus::AwaitingApproval => OutcomeKind::AwaitingApproval,
            StepStatus::Rejected => OutcomeKind::Rejected,
        }
    }
}

/// How a call's step is found, and whether its answer still has a listener.
struct How<'a> {
    choice: StepChoice,
    /// A new step of a tool whose earlier step is owed is meant as a second
    /// effect.
    new_effect: bool,
    /// Whether the client still waits for the answer (see
    /// [`Engine::call_choosing_step`]).
    listening: &'a (dyn Fn() -> bool + Sync),
    /// The hash of the request's bearer token when it has not been looked
    /// up for this call: the hot path's intent checks it, and any other
    /// path looks it up first.
    token_to_check: Option<&'a str>,
}

/// Which step a call goes to.
enum StepChoice {
    /// The step the agent named (none: a pure call, or refused).
    Named(Option<i64>),
    /// The gateway's rule: the oldest step of the tool still owed to the
    /// agent, else a new step.
    OldestOwedOrNew,
}

/// What the hot path of a new step came to.
enum AtOnce {
    Answered(CallOutcome),
    /// Not taken; nothing was written. `failpoint_met`: the intent's
    /// failpoint was already passed on the way.
    NotReady {
        failpoint_met: bool,
    },
}

/// Where a run's step cursor stands for its agent (R12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The step to send next: the oldest owed step, else `new_step`.
    pub next_step: i64,
    /// The index a new effect takes.
    pub new_step: i64,
}

impl Cursor {
    fn of(new_step: i64, owed: impl IntoIterator<Item = i64>) -> Cursor {
        Cursor {
            next_step: owed.into_iter().min().unwrap_or(new_step).min(new_step),
            new_step,
        }
    }
}

/// A call the harness refuses; `code` is machine-readable (§5).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("run not found")]
    RunNotFound,
    #[error("no tool named {0:?} is registered")]
    UnknownTool(String),
    #[error(
        "{tool} has side effects: name the step you mean (the run's next step is {next_step})"
    )]
    StepRequired { tool: String, next_step: i64 },
    #[error("step {step} was {logged}, not {tool}: a step keeps its tool. A new call takes step {new_step}")]
    StepMismatch {
        step: i64,
        logged: String,
        tool: String,
        new_step: i64,
    },
    #[error("step {step} is beyond the run's next step {next_step}")]
    StepOutOfOrder { step: i64, next_step: i64 },
    #[error("{}", unresolved_message(*step, *waiting_for_person))]
    StepUnresolved { step: i64, waiting_for_person: bool },
    /// R12: a new step of a tool whose earlier step is still owed to the
    /// agent is most likely a reworded retry of that step.
    #[error(
        "step {step} ({tool}) has not been given its final outcome yet (it is {outcome} now): \
         re-send step {step} unchanged to read it. A new call of {tool} now would most likely \
         repeat that effect; if a second {tool} is really meant, send it with \"new_effect\": true"
    )]
    RetryOfUnresolvedStep {
        step: i64,
        tool: String,
        outcome: &'static str,
    },
    #[error("the run waits for its pivot to be approved and takes no other calls")]
    RunAwaitingApproval,
    #[error("the run is past its pivot: the approved commit steps run without the agent")]
    RunPastPivot,
    #[error("the run is {status} and takes no new calls")]
    RunClosed { status: RunStatus },
    #[error("{0} runs only as a commit step of an approved pivot")]
    GatedTool(String),
    #[error("{0} only runs to undo another step; the harness calls it during an unwind")]
    WayBackOnly(String),
    #[error("the pivot plan is refused: {0}")]
    InvalidPlan(String),
    /// The arguments do not fit the tool's schema; nothing was logged.
    #[error("{tool}: {mistake}")]
    InvalidArgs {
        tool: String,
        mistake: super::registry::ArgsMistake,
    },
    #[error("the run still has open effects: {0}")]
    RunHasOpenEffects(String),
    /// A person's answer to a question that has been asked again since
    /// they read it (their answer was replayed, or the step was re-sent
    /// and lost again): it answers nothing now.
    #[error(
        "step {step} was asked about again after this answer was given: look at the step again \
         and answer what it asks now"
    )]
    QuestionAskedAgain { step: i64 },
    /// The request's bearer token, checked off the hot path, is no longer
    /// the agent's (revoked since it was last looked up).
    #[error("{}", crate::auth::TOKEN_NOT_VALID)]
    TokenNotValid,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Refusal {
    /// The database could not be reached: nothing was done, and the same
    /// request can be made again once it is back.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Refusal::Store(err) if err.is_unavailable())
    }

    /// A failure inside the harness rather than a refusal of the request.
    pub fn is_internal(&self) -> bool {
        matches!(self, Refusal::Store(err) if err.is_internal())
    }

    pub fn code(&self) -> &'static str {
        match self {
            Refusal::RunNotFound => "run_not_found",
            Refusal::UnknownTool(_) => "unknown_tool",
            Refusal::StepRequired { .. } => "step_required",
            Refusal::StepMismatch { .. } => "step_mismatch",
            Refusal::StepOutOfOrder { .. } => "step_out_of_order",
            Refusal::StepUnresolved { .. } => "step_unresolved",
            Refusal::RetryOfUnresolvedStep { .. } => "retry_of_unresolved_step",
            Refusal::RunAwaitingApproval => "run_awaiting_approval",
            Refusal::RunPastPivot => "run_past_pivot",
            Refusal::RunClosed { .. } => "run_closed",
            Refusal::GatedTool(_) => "gated_tool",
            Refusal::WayBackOnly(_) => "way_back_only",
            Refusal::InvalidPlan(_) => "invalid_plan",
            Refusal::InvalidArgs { .. } => "invalid_args",
            Refusal::RunHasOpenEffects(_) => "run_has_open_effects",
            Refusal::QuestionAskedAgain { .. } => "question_asked_again",
            Refusal::TokenNotValid => "unauthorized",
            Refusal::Store(err) if err.is_unavailable() => "store_unavailable",
            Refusal::Store(_) => "internal",
        }
    }
}

fn unresolved_message(step: i64, waiting_for_person: bool) -> String {
    if waiting_for_person {
        format!(
            "step {step} waits for a person's approval; nothing new runs until it is decided. \
             Re-send step {step} later to read the decision"
        )
    } else {
        format!(
            "step {step} is still unsettled; the harness is resolving it. \
             Re-send step {step} to read its outcome"
        )
    }
}

/// This process's lock per run, and the run's agent once known: a run's
/// owner never changes, so another agent's calls are refused before they
/// wait for (or hold) the owner's lock. Locks nobody holds or waits for
/// are dropped as the map grows.
#[derive(Default)]
struct RunLocks {
    slots: HashMap<Uuid, RunSlot>,
    /// The map's size after its last pruning.
    pruned_at: usize,
}

struct RunSlot {
    lock: Arc<tokio::sync::Mutex<()>>,
    owner: Option<String>,
    /// The index a new step took at this process's last answer on the run:
    /// a guess for a client that names no step, which the store checks.
    new_step: Option<i64>,
}

impl RunLocks {
    fn lock_for(&mut self, run_id: Uuid) -> Arc<tokio::sync::Mutex<()>> {
        if self.slots.len() >= (2 * self.pruned_at).max(1024) {
            // Held or awaited locks have clones outside the map.
            self.slots
                .retain(|_, slot| Arc::strong_count(&slot.lock) > 1);
            self.pruned_at = self.slots.len();
        }
        self.slots
            .entry(run_id)
            .or_insert_with(|| RunSlot {
                lock: Default::default(),
                owner: None,
                new_step: None,
            })
            .lock
            .clone()
    }

    /// Whether the run is known to belong to another agent.
    fn owned_by_another(&self, run_id: Uuid, agent: &str) -> bool {
        self.slots
            .get(&run_id)
            .and_then(|slot| slot.owner.as_deref())
            .is_some_and(|owner| owner != agent)
    }

    fn remember_owner(&mut self, run_id: Uuid, owner: &str) {
        if let Some(slot) = self.slots.get_mut(&run_id) {
            slot.owner.get_or_insert_with(|| owner.to_owned());
        }
    }

    fn remember_new_step(&mut self, run_id: Uuid, new_step: i64) {
        if let Some(slot) = self.slots.get_mut(&run_id) {
            slot.new_step = Some(new_step);
        }
    }

    fn new_step_of(&self, run_id: Uuid) -> Option<i64> {
        self.slots.get(&run_id).and_then(|slot| slot.new_step)
    }

    fn len(&self) -> usize {
        self.slots.len()
    }
}

/// Held while a run is worked on; dropping it lets the next caller in.
pub(crate) struct RunGuard {
    _fence: Option<FenceEntry>,
    _claim: Box<dyn RunClaim>,
    _local: tokio::sync::OwnedMutexGuard<()>,
}

/// The fences of the runs this process holds now, by run: a send looks
/// its run's up just before the call leaves.
type Fences = Arc<Mutex<HashMap<Uuid, Arc<dyn LeaseFence>>>>;

/// A run's fence, known to sends while this is held.
pub(crate) struct FenceEntry {
    run_id: Uuid,
    fences: Fences,
}

impl Drop for FenceEntry {
    fn drop(&mut self) {
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.run_id);
    }
}

pub struct Engine {
    store: Arc<dyn SagaStore>,
    registry: Arc<Registry>,
    connector: Arc<dyn Connector>,
    /// One call at a time per run in this process, so a re-sent step never
    /// races its own first attempt.
    run_locks: Mutex<RunLocks>,
    observer: Arc<dyn Observer>,
    /// The waits systems asked for before a call is sent again.
    hold_offs: super::resend::HoldOffs,
    /// The first pause before the engine sends a refused call again.
    first_resend_pause: std::time::Duration,
    fences: Fences,
    /// The longest a system's call may take to be answered (connecting
    /// included): a lease must outlast it before the call is sent.
    longest_call: std::time::Duration,
}

impl Engine {
    pub fn new(
        store: Arc<dyn SagaStore>,
        registry: Arc<Registry>,
        connector: Arc<dyn Connector>,
    ) -> Self {
        Engine {
            store,
            registry,
            connector,
            run_locks: Mutex::new(RunLocks::default()),
            observer: Arc::new(Unobserved),
            hold_offs: Default::default(),
            first_resend_pause: super::resend::FIRST_PAUSE,
            fences: Default::default(),
            longest_call: crate::connectors::wire::Timeouts::default().longest_call(),
        }
    }

    /// The engine, telling `observer` what it does (the operators' metrics).
    pub fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// The engine, pausing `first` before the first re-send of a refused
    /// call (and doubling from there) instead of `resend::FIRST_PAUSE`. A
    /// system's own `Retry-After` is honoured either way.
    pub fn pausing_resends_from(mut self, first: std::time::Duration) -> Self {
        self.first_resend_pause = first;
        self
    }

    /// The pauses before one call's re-sends.
    pub(crate) fn resends(&self) -> super::resend::Resends {
        super::resend::Resends::starting_at(self.first_resend_pause)
    }

    pub(crate) fn observer(&self) -> &dyn Observer {
        self.observer.as_ref()
    }

    /// Moves a step to its outcome in the log (the store's compare-and-set)
    /// and tells the observer. Every step outcome goes through here.
    pub(crate) async fn settle_step(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> Result<Step, StoreError> {
        self.settle_step_releasing(run_id, step_idx, outcome, durability, actor, None)
            .await
    }

    /// `settle_step`, giving `release` back in the same commit when given.
    async fn settle_step_releasing(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
        release: Option<&mut dyn RunClaim>,
    ) -> Result<Step, StoreError> {
        let from = outcome.from;
        let settled = match release {
            Some(claim) => {
                self.store
                    .settle_step_and_release(run_id, step_idx, outcome, durability, actor, claim)
                    .await?
            }
            None => {
                self.store
                    .settle_step(run_id, step_idx, outcome, durability, actor)
                    .await?
            }
        };
        self.observer.step_moved(
            &settled.tool,
            settled.tool_class.as_str(),
            from,
            settled.status,
        );
        Ok(settled)
    }

    /// A compensation's outcome, as `settle_step` is a step's.
    pub(crate) async fn settle_compensation(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> Result<Compensation, StoreError> {
        let settled = self
            .store
            .settle_compensation(run_id, step_idx, outcome, durability, actor)
            .await?;
        self.observer
            .compensation_moved(&settled.tool, settled.status);
        Ok(settled)
    }

    pub fn store(&self) -> &Arc<dyn SagaStore> {
        &self.store
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub(crate) fn connector(&self) -> &Arc<dyn Connector> {
        &self.connector
    }

    pub(crate) fn has_lookup(&self, tool: &str) -> Result<bool, Refusal> {
        Ok(self.connector.has_lookup(&self.spec(tool)?.connector))
    }

    /// The run, if it exists and belongs to this agent (others get 404).
    pub(crate) async fn agents_run(&self, agent: &str, run_id: Uuid) -> Result<Run, Refusal> {
        self.store
            .run(run_id)
            .await?
            .filter(|r| r.agent == agent)
            .ok_or(Refusal::RunNotFound)
    }

    /// Serialises work on one run: in this process (a mutex per run) and
    /// across processes sharing the database (the store's run claim, held
    /// for the whole call, not only for a transaction).
    pub(crate) async fn serialise(&self, run_id: Uuid) -> Result<RunGuard, Refusal> {
        let local = self.run_lock(run_id).lock_owned().await;
        let claim = self.store.claim_run(run_id).await?;
        Ok(RunGuard {
            _fence: self.fence_while_held(run_id, claim.as_ref()),
            _claim: claim,
            _local: local,
        })
    }

    /// `serialise` without waiting: `None` when a call in this process or
    /// another instance is working on the run now. Background work (resume,
    /// the sweeps) leaves such a run to its holder and looks again later.
    pub(crate) async fn try_serialise(&self, run_id: Uuid) -> Result<Option<RunGuard>, Refusal> {
        let Ok(local) = self.run_lock(run_id).try_lock_owned() else {
            return Ok(None);
        };
        Ok(self
            .store
            .try_claim_run(run_id)
            .await?
            .map(|claim| RunGuard {
                _fence: self.fence_while_held(run_id, claim.as_ref()),
                _claim: claim,
                _local: local,
            }))
    }

    /// Makes the claim's fence known to this run's sends until the entry
    /// is dropped.
    fn fence_while_held(&self, run_id: Uuid, claim: &dyn RunClaim) -> Option<FenceEntry> {
        let fence = claim.fence()?;
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(run_id, fence);
        Some(FenceEntry {
            run_id,
            fences: self.fences.clone(),
        })
    }

    /// Just before a call of the run leaves: refuses (`LeaseLost`, nothing
    /// sent, nothing written) when this process can no longer be sure the
    /// run is still its own, as after a pause longer than its lease.
    pub(crate) async fn confirm_lease(&self, run_id: Uuid) -> Result<(), Refusal> {
        let fence = self
            .fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&run_id)
            .cloned();
        match fence {
            Some(fence) => Ok(fence.confirm(self.longest_call).await?),
            None => Ok(()),
        }
    }

    fn run_lock(&self, run_id: Uuid) -> Arc<tokio::sync::Mutex<()>> {
        self.locks().lock_for(run_id)
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, RunLocks> {
        // A poisoned map only means another call panicked; the map is still
        // a valid set of locks.
        self.run_locks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many per-run locks this process keeps (bounded: see `RunLocks`).
    pub fn run_locks_kept(&self) -> usize {
        self.locks().len()
    }

    /// The arguments against the tool's schema.
    pub(crate) fn check_args(&self, tool: &str, args: &Value) -> Result<(), Refusal> {
        self.registry
            .check_args(tool, args)
            .map_err(|mistake| Refusal::InvalidArgs {
                tool: tool.to_owned(),
                mistake,
            })
    }

    pub(crate) fn spec(&self, tool: &str) -> Result<&ToolSpec, Refusal> {
        self.registry
            .get(tool)
            .ok_or_else(|| Refusal::UnknownTool(tool.to_owned()))
    }

    /// An agent's tool call (§5).
    pub async fn call(
        &self,
        agent: &str,
        run_id: Uuid,
        tool: &str,
        args: Value,
        step: Option<i64>,
    ) -> Result<CallOutcome, Refusal> {
        self.call_with(agent, run_id, tool, args, step, false).await
    }

    /// An agent's tool call; `new_effect` says a new step of a tool whose
    /// earlier step is still owed to the agent is meant as a second effect,
    /// not a retry (R12), and is recorded in the audit trail.
    pub async fn call_with(
        &self,
        agent: &str,
        run_id: Uuid,
        tool: &str,
        args: Value,
        step: Option<i64>,
        new_effect: bool,
    ) -> Result<CallOutcome, Refusal> {
        self.call_from(agent.into(), run_id, tool, args, step, new_effect)
            .await
    }

    /// `call_with` from a request whose bearer token may still be to check
    /// (`Bearer::token_to_check`): the step's intent checks it in its own
    /// statement, so a call on the hot path costs no lookup of the token,
    /// and a token revoked meanwhile writes nothing; any other path looks
    /// the token up before it reads the run.
    pub async fn call_from(
        &self,
        bearer: Bearer<'_>,
        run_id: Uuid,
        tool: &str,
        args: Value,
        step: Option<i64>,
        new_effect: bool,
    ) -> Result<CallOutcome, Refusal> {
        self.call_at(
            bearer.agent,
            run_id,
            tool,
            args,
            How {
                choice: StepChoice::Named(step),
                new_effect,
                // A client that names its steps re-sends by number.
                listening: &|| true,
                token_to_check: bearer.token_to_check,
            },
        )
        .await
    }

    /// A call from a client that names no step (the MCP gateway): it goes
    /// to the oldest step of this tool still owed to the agent, so a retry,
    /// reworded or not, reads that step's outcome; otherwise to a new step.
    /// Decided under the run's claim, from the owed steps read there.
    ///
    /// `listening` says whether the client still waits for this answer: a
    /// final outcome given to a client that gave up (its request timed out)
    /// leaves the step owed, so its retry reads the outcome rather than
    /// making a second effect. It is asked under the claim, so no retry
    /// can slip in between.
    pub async fn call_choosing_step(
        &self,
        agent: &str,
        run_id: Uuid,
        tool: &str,
        args: Value,
        listening: &(dyn Fn() -> bool + Sync),
    ) -> Result<CallOutcome, Refusal> {
        self.call_at(
            agent,
            run_id,
            tool,
            args,
            How {
                choice: StepChoice::OldestOwedOrNew,
                new_effect: false,
                listening,
                token_to_check: None,
            },
        )
        .await
    }

    /// One agent call in its span (run, tool, and, once known, step, key
    /// and outcome), so every system request it makes is a child of it.
    async fn call_at(
        &self,
        agent: &str,
        run_id: Uuid,
        tool: &str,
        args: Value,
        how: How<'_>,
    ) -> Result<CallOutcome, Refusal> {
        let span = tracing::info_span!(
            "saga.step",
            %run_id,
            tool,
            step = tracing::field::Empty,
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let answered = self
            .call_in_span(agent, run_id, tool, args, how)
            .instrument(span.clone())
            .await;
        match &answered {
            Ok(answer) => {
                self.locks().remember_new_step(run_id, answer.new_step);
                if let Some(step) = answer.step {
                    span.record("step", step);
                }
                if let Some(key) = &answer.key {
                    span.record("key", key.as_str());
                }
                span.record("outcome", answer.outcome.as_str());
            }
            Err(refusal) => {
                span.record("outcome", refusal.code());
            }
        }
        answered
    }

    async fn call_in_span(
        &self,
        agent: &str,
        run_id: Uuid,
        tool: &str,
        args: Value,
        how: How<'_>,
    ) -> Result<CallOutcome, Refusal> {
        let How {
            choice,
            new_effect,
            listening,
            token_to_check,
        } = how;
        // Another agent's run: refused before its lock is touched.
        if self.locks().owned_by_another(run_id, agent) {
            self.check_token(agent, token_to_check).await?;
            return Err(Refusal::RunNotFound);
        }
        let local = self.run_lock(run_id).lock_owned().await;
        // A client that names no step gets the oldest step of the tool still
        // owed to it, else a new one. When nothing is owed (which the store
        // checks) that is the run's new step, last seen here.
        let at_once = match choice {
            StepChoice::Named(step) => step,
            StepChoice::OldestOwedOrNew => self.locks().new_step_of(run_id),
        };
        let intent_failpoint_met = match at_once {
            Some(step) => {
                let bearer = Bearer {
                    agent,
                    token_to_check,
                };
                match self
                    .new_step_at_once(bearer, run_id, tool, step, &args, listening)
                    .await?
                {
                    AtOnce::Answered(answer) => return Ok(answer),
                    AtOnce::NotReady { failpoint_met } => failpoint_met,
                }
            }
            None => false,
        };
        self.check_token(agent, token_to_check).await?;
        let claimed = self.store.claim_and_read(run_id).await?;
        let _serialised = RunGuard {
            _fence: self.fence_while_held(run_id, claimed.claim.as_ref()),
            _claim: claimed.claim,
            _local: local,
        };
        let read = claimed.read;
        let ClaimedRead {
            run,
            unsettled,
            owed,
        } = read;
        if let Some(run) = &run {
            self.locks().remember_owner(run_id, &run.agent);
        }
        let run = run
            .filter(|r| r.agent == agent)
            .ok_or(Refusal::RunNotFound)?;
        let spec = self.spec(tool)?;
        if spec.way_back_only {
            return Err(Refusal::WayBackOnly(tool.to_owned()));
        }
        let owed_steps = || owed.iter().map(|s| s.step_idx);
        let step = match choice {
            StepChoice::Named(step) => step,
            StepChoice::OldestOwedOrNew => Some(
                owed.iter()
                    .filter(|s| s.tool == tool)
                    .map(|s| s.step_idx)
                    .min()
                    .unwrap_or(run.next_step),
            ),
        };
        if spec.class == ToolClass::Pure {
            self.check_args(tool, &args)?;
            let cursor = Cursor::of(run.next_step, owed_steps());
            return self.call_pure(cursor, spec, &args).await;
        }
        let step = step.ok_or_else(|| Refusal::StepRequired {
            tool: tool.to_owned(),
            next_step: Cursor::of(run.next_step, owed_steps()).next_step,
        })?;
        tracing::Span::current().record("step", step);
        if step < run.next_step {
            let logged = self
                .store
                .step(run_id, step)
                .await?
                .ok_or(Refusal::StepOutOfOrder {
                    step,
                    next_step: run.next_step,
                })?;
            tracing::Span::current().record("key", logged.idempotency_key.as_str());
            if logged.tool != tool {
                return Err(Refusal::StepMismatch {
                    step,
                    logged: logged.tool,
                    tool: tool.to_owned(),
                    new_step: run.next_step,
                });
            }
            // The logged arguments win: a reworded retry never changes them.
            // Only a running run re-executes a step that did not happen; in
            // any other state the agent reads what the log (and the real
            // system) says.
            let settled = if run.status == RunStatus::Running {
                self.settle_existing(logged).await?
            } else {
                self.reconcile(logged).await?
            };
            let others = owed_steps().filter(|&idx| idx != step);
            return self
                .answer_agent(&settled, run.next_step, others, listening)
                .await;
        }
        if step > run.next_step {
            return Err(Refusal::StepOutOfOrder {
                step,
                next_step: run.next_step,
            });
        }
        match run.status {
            RunStatus::Running => {}
            RunStatus::AwaitingApproval => return Err(Refusal::RunAwaitingApproval),
            RunStatus::Committing | RunStatus::Completed => return Err(Refusal::RunPastPivot),
            status => return Err(Refusal::RunClosed { status }),
        }
        // A new step's arguments must fit the tool's schema. (A re-sent
        // step is not checked: its logged arguments win.)
        self.check_args(tool, &args)?;
        // R12: a new step of a tool whose earlier step the agent has not
        // been given the final outcome of is most likely that step again,
        // reworded; it is refused unless the agent says it is a new effect.
        if let Some(prior) = owed.iter().find(|s| s.tool == tool) {
            if !new_effect {
                return Err(Refusal::RetryOfUnresolvedStep {
                    step: prior.step_idx,
                    tool: tool.to_owned(),
                    outcome: OutcomeKind::of(prior.status).as_str(),
                });
            }
            self.store
                .note(
                    run_id,
                    &Actor::Agent(agent.to_owned()),
                    &format!(
                        "step {step} ({tool}) sent as a new effect while step {} of the same tool was still owed its outcome",
                        prior.step_idx
                    ),
                )
                .await?;
        }
        self.settle_earlier_steps(unsettled).await?;
        if spec.gated {
            return Err(Refusal::GatedTool(tool.to_owned()));
        }
        let key = step_key(run_id, step, tool);
        tracing::Span::current().record("key", key.as_str());
        let (compensation, held_because) = match spec.way_back(&key, &args) {
            Ok(way) => (way, None),
            Err(reason) => (
                None,
                Some(format!("the way back cannot be built: {reason}")),
            ),
        };
        let held_because = match (spec.class, held_because) {
            (_, Some(reason)) => Some(reason),
            (ToolClass::Irreversible, None) => {
                Some("an irreversible call before the pivot needs its own approval".to_owned())
            }
            _ => None,
        };
        let actor = Actor::Agent(agent.to_owned());
        let new = NewStep {
            run_id,
            step_idx: step,
            tool: tool.to_owned(),
            tool_class: spec.class,
            idempotency_key: key.clone(),
            args: args.clone(),
            status: if held_because.is_some() {
                StepStatus::AwaitingApproval
            } else {
                StepStatus::Intended
            },
            compensation,
            audience: spec.audience_for(&args),
            phase: Phase::BeforePivot,
        };
        if let Some(reason) = held_because {
            // Held: the index is reserved and the exact call stored, with
            // its approval request, in one commit; nothing is sent.
            let call = json!({"tool": tool, "args": args, "step": step});
            let (held, _) = self
                .store
                .record_held_step(
                    new,
                    NewApproval {
                        run_id,
                        kind: ApprovalKind::Step,
                        step_idx: Some(step),
                        summary: reason,
                        digest: plan_digest(&call),
                        plan: call,
                        expires_at: self.deadline_of([tool]),
                        approvers_needed: self
                            .registry
                            .approval_policy()
                            .approvers_for(spec, &args),
                    },
                    &actor,
                )
                .await?;
            return self
                .answer_agent(&held, step + 1, owed_steps(), listening)
                .await;
        }
        if !intent_failpoint_met {
            crate::failpoint::hit("dispatch.before_intent");
        }
        // R2: the row is committed before anything is sent.
        let logged = self.store.record_step(new, &actor).await?;
        let settled = self.execute_logged(logged, &actor).await?;
        self.answer_agent(&settled, step + 1, owed_steps(), listening)
            .await
    }

    /// The hot path of a new step (DESIGN.md §9): two statements. The
    /// run's claim and the durable intent go in one commit
    /// (`claim_and_record_step`), and when the outcome is final and the
    /// agent is still there to read it, the outcome gives the claim back
    /// in its own commit; nothing else is read or written. Taken only for a
    /// step that needs nothing the general path decides: a named new step
    /// of a tool that is neither pure, gated nor irreversible, whose
    /// arguments fit and whose way back can be built, on a run ready for
    /// it. Anything else (and every refusal) is the general path's, which
    /// this leaves untouched when it returns `NotReady`.
    async fn new_step_at_once(
        &self,
        bearer: Bearer<'_>,
        run_id: Uuid,
        tool: &str,
        step: i64,
        args: &Value,
        listening: &(dyn Fn() -> bool + Sync),
    ) -> Result<AtOnce, Refusal> {
        let not_ready = |failpoint_met| Ok(AtOnce::NotReady { failpoint_met });
        let Ok(spec) = self.spec(tool) else {
            return not_ready(false);
        };
        if matches!(spec.class, ToolClass::Pure | ToolClass::Irreversible)
            || spec.way_back_only
            || spec.gated
            || self.check_args(tool, args).is_err()
        {
            return not_ready(false);
        }
        let key = step_key(run_id, step, tool);
        let Ok(compensation) = spec.way_back(&key, args) else {
            return not_ready(false);
        };
        let new = NewStep {
            run_id,
            step_idx: step,
            tool: tool.to_owned(),
            tool_class: spec.class,
            idempotency_key: key.clone(),
            args: args.clone(),
            status: StepStatus::Intended,
            compensation,
            audience: spec.audience_for(args),
            phase: Phase::BeforePivot,
        };
        let actor = Actor::Agent(bearer.agent.to_owned());
        crate::failpoint::hit("dispatch.before_intent");
        // R2: the row is committed before anything is sent.
        let Some((mut claim, logged)) = self
            .store
            .claim_and_record_step(bearer, new, &actor)
            .await?
        else {
            return not_ready(true);
        };
        let _fence = self.fence_while_held(run_id, claim.as_ref());
        self.locks().remember_owner(run_id, bearer.agent);
        tracing::Span::current().record("step", step);
        tracing::Span::current().record("key", key.as_str());
        // Whether the agent is still there is read once: the outcome's
        // commit and the answer go by the same reading.
        let heard = std::sync::OnceLock::new();
        let listening = || *heard.get_or_init(listening);
        let settled = self
            .execute_logged_releasing(logged, &actor, Some((claim.as_mut(), &listening)))
            .await?;
        self.answer_agent(&settled, step + 1, std::iter::empty(), &listening)
            .await
            .map(AtOnce::Answered)
    }

    /// A bearer token not looked up for this request, looked up now: the
    /// call goes on only while the token is still `agent`'s.
    pub(crate) async fn check_token(
        &self,
        agent: &str,
        token: Option<&str>,
    ) -> Result<(), Refusal> {
        let Some(hash) = token else {
            return Ok(());
        };
        match self.store.agent_for_token(hash).await? {
            Some(owner) if owner == agent => Ok(()),
            _ => Err(Refusal::TokenNotValid),
        }
    }

    /// The answer to the agent about a step, recording whether the step is
    /// still owed to it (R12); `others` are the run's other owed steps.
    async fn answer_agent(
        &self,
        step: &Step,
        new_step: i64,
        others: impl Iterator<Item = i64>,
        listening: &(dyn Fn() -> bool + Sync),
    ) -> Result<CallOutcome, Refusal> {
        let kind = OutcomeKind::of(step.status);
        let owed = !kind.is_final() || !listening();
        if owed != step.owed_to_agent {
            self.store
                .set_owed_to_agent(step.run_id, step.step_idx, owed)
                .await?;
        }
        let this = owed.then_some(step.step_idx);
        Ok(self.outcome_of(step, Cursor::of(new_step, others.chain(this))))
    }

    /// What a resuming agent reads (§5): the run, its log and its cursor.
    /// Reading a step's final outcome here gives it to the agent (R12).
    pub async fn agents_view(
        &self,
        agent: &str,
        run_id: Uuid,
    ) -> Result<(Run, Vec<Step>, Cursor), Refusal> {
        let run = self.agents_run(agent, run_id).await?;
        let mut steps = self.store.steps(run_id).await?;
        for step in steps.iter_mut().filter(|s| s.owed_to_agent) {
            if OutcomeKind::of(step.status).is_final() {
                self.store
                    .set_owed_to_agent(run_id, step.step_idx, false)
                    .await?;
                step.owed_to_agent = false;
            }
        }
        let owed = steps.iter().filter(|s| s.owed_to_agent).map(|s| s.step_idx);
        let cursor = Cursor::of(run.next_step, owed);
        Ok((run, steps, cursor))
    }

    /// The agent says the run is done. Refused while a step is unsettled or
    /// a staged effect (a draft, an authorisation) is still open: those
    /// are committed through a pivot or unwound.
    pub async fn complete(&self, agent: &str, run_id: Uuid) -> Result<Run, Refusal> {
        let _serialised = self.serialise(run_id).await?;
        let run = self.agents_run(agent, run_id).await?;
        match run.status {
            RunStatus::Running => {}
            RunStatus::AwaitingApproval => return Err(Refusal::RunAwaitingApproval),
            RunStatus::Committing | RunStatus::Completed => return Err(Refusal::RunPastPivot),
            status => return Err(Refusal::RunClosed { status }),
        }
        for step in self.store.steps(run_id).await? {
            let step = self.reconcile(step).await?;
            if !step.status.is_settled() {
                return Err(Refusal::RunHasOpenEffects(format!(
                    "step {} ({}) is {}",
                    step.step_idx, step.tool, step.status
                )));
            }
            if step.tool_class == ToolClass::Reversible && step.status == StepStatus::Confirmed {
                return Err(Refusal::RunHasOpenEffects(format!(
                    "step {} ({}) is still open: commit it through a pivot or unwind the run",
                    step.step_idx, step.tool
                )));
            }
        }
        Ok(self
            .store
            .move_run(
                run_id,
                RunStatus::Running,
                RunStatus::Completed,
                &Actor::Agent(agent.to_owned()),
                None,
            )
            .await?)
    }

    async fn call_pure(
        &self,
        cursor: Cursor,
        spec: &ToolSpec,
        args: &Value,
    ) -> Result<CallOutcome, Refusal> {
        // No key is needed: a pure call has no effect to deduplicate.
        let report = self.connector.execute(&spec.connector, "", args).await;
        let classified = classify(&report, |body| {
            self.connector
                .external_ref(&spec.connector, body)
                .or(Some(String::new()))
        });
        let (outcome, result, error, message) = match classified {
            Classified::Confirmed { result, .. } => (
                OutcomeKind::Confirmed,
                Some(result),
                None,
                "done".to_owned(),
            ),
            Classified::Failed { error } => (
                OutcomeKind::Failed,
                None,
                Some(error),
                "the system refused this read".to_owned(),
            ),
            Classified::Unknown { reason } | Classified::NotExecuted { reason } => (
                OutcomeKind::NotExecuted,
                None,
                Some(reason),
                "this read has no side effect: it is safe to call again".to_owned(),
            ),
        };
        Ok(CallOutcome {
            outcome,
            step: None,
            key: None,
            external_ref: None,
            result,
            error,
            message,
            next_step: cursor.next_step,
            new_step: cursor.new_step,
        })
    }

    /// Refuses a new step while an earlier one is unsettled, after trying
    /// to settle it here.
    pub(crate) async fn ensure_earlier_steps_settled(&self, run_id: Uuid) -> Result<(), Refusal> {
        let unsettled = self.store.unsettled_steps(run_id).await?;
        self.settle_earlier_steps(unsettled).await
    }

    /// As `ensure_earlier_steps_settled`, for unsettled steps already read
    /// under the run's claim.
    async fn settle_earlier_steps(&self, unsettled: Vec<Step>) -> Result<(), Refusal> {
        for step in unsettled {
            if step.status.is_settled() {
                continue;
            }
            let idx = step.step_idx;
            // Only reconcile here: retrying an earlier step is the agent's
            // call to make, by re-sending it.
            let after = self.reconcile(step).await?;
            if !after.status.is_settled() {
                return Err(Refusal::StepUnresolved {
                    step: idx,
                    waiting_for_person: after.status == StepStatus::AwaitingApproval,
                });
            }
        }
        Ok(())
    }

    /// Brings an existing step as far as it can go without a person:
    /// reconciles INTENDED / UNKNOWN, re-executes NOT_EXECUTED under the
    /// same key (R7, §5).
    pub(crate) async fn settle_existing(&self, step: Step) -> Result<Step, Refusal> {
        match step.status {
            StepStatus::Intended | StepStatus::Unknown => {
                let reconciled = self.reconcile(step).await?;
                if reconciled.status == StepStatus::NotExecuted {
                    return self.retry(reconciled).await;
                }
                Ok(reconciled)
            }
            StepStatus::NotExecuted => self.retry(step).await,
            _ => Ok(step),
        }
    }

    /// Waits before the engine sends the call under `key` again (see
    /// `saga::resend`); `Err` says why it will not.
    pub(crate) async fn pause_before_resend(
        &self,
        key: &str,
        resends: &mut super::resend::Resends,
    ) -> Result<(), String> {
        resends.pause(self.hold_offs.take(key)).await
    }

    /// NOT_EXECUTED → INTENDED → the call again: same key, logged arguments.
    async fn retry(&self, step: Step) -> Result<Step, Refusal> {
        let step = self
            .settle_step(
                step.run_id,
                step.step_idx,
                Outcome::moving(StepStatus::NotExecuted, StepStatus::Intended),
                Durability::Durable,
                &Actor::System,
            )
            .await?;
        self.execute_logged(step, &Actor::System).await
    }

    /// Sends one call whose intent is on disk and says where its row moves
    /// from INTENDED (R4). Steps, compensations and correction sends all
    /// go out through here.
    pub(crate) async fn send(&self, operation: &str, key: &str, args: &Value) -> Outcome {
        let system = system_of(operation);
        let span = tracing::info_span!(
            "system.request",
            system,
            operation,
            key,
            request = "execute",
            http.status = tracing::field::Empty,
        );
        self.observer.request_started(system);
        let started = std::time::Instant::now();
        let report = self
            .connector
            .execute(operation, key, args)
            .instrument(span.clone())
            .await;
        let took = started.elapsed();
        self.observer
            .request_ended(system, SystemRequest::Execute, took);
        let answered = match &report {
            CallReport::Answered { status, .. } => {
                span.record("http.status", status);
                "answered"
            }
            CallReport::Deferred { retry_after, .. } => {
                if let Some(wait) = retry_after {
                    self.hold_offs.record(key, *wait);
                }
                "refused for now"
            }
            CallReport::Accepted { .. } => "accepted",
            CallReport::Refused { .. } => "refused",
            CallReport::TimedOut => "timed out",
            CallReport::ResetAfterSend => "connection reset after the request went out",
            CallReport::NotSent { .. } => "not sent",
        };
        tracing::info!(parent: &span, took_ms = took.as_millis() as u64, "{system}: {answered}");
        let classified = classify(&report, |body| self.connector.external_ref(operation, body));
        outcome_of_call(StepStatus::Intended, classified)
    }

    /// Sends an INTENDED step and records what came back (R4). The outcome
    /// commit may be lazy when reconcile could recover it (§9).
    pub(crate) async fn execute_logged(&self, step: Step, actor: &Actor) -> Result<Step, Refusal> {
        self.execute_logged_releasing(step, actor, None).await
    }

    /// `execute_logged`; with `last` (the run's claim, and whether the
    /// agent still listens), a final outcome for a listening agent is the
    /// call's last write, and gives the claim back in the same commit.
    async fn execute_logged_releasing(
        &self,
        step: Step,
        actor: &Actor,
        last: Option<(&mut dyn RunClaim, &(dyn Fn() -> bool + Sync))>,
    ) -> Result<Step, Refusal> {
        let spec = self.spec(&step.tool)?;
        let operation = &spec.connector;
        crate::failpoint::hit("dispatch.before_call");
        self.confirm_lease(step.run_id).await?;
        let outcome = self
            .send(operation, &step.idempotency_key, &step.args)
            .await;
        crate::failpoint::hit("dispatch.before_outcome");
        let durability = if self.connector.has_lookup(operation) {
            Durability::Lazy
        } else {
            Durability::Durable
        };
        let release = last.and_then(|(claim, listening)| {
            (OutcomeKind::of(outcome.to).is_final() && listening()).then_some(claim)
        });
        let settled = match self
            .settle_step_releasing(
                step.run_id,
                step.step_idx,
                outcome,
                durability,
                actor,
                release,
            )
            .await
        {
            Ok(settled) => settled,
            // The step moved while the call was out: this instance outlived
            // its lease and another settled the step first (by lookup, or
            // by a person). What the log says stands; this outcome is not
            // written over it.
            Err(StoreError::Stale { .. }) => self
                .store
                .step(step.run_id, step.step_idx)
                .await?
                .ok_or_else(|| StoreError::NotFound {
                    what: format!("step {} of run {}", step.step_idx, step.run_id),
                })?,
            Err(StoreError::Unavailable { cause }) => {
                return Err(StoreError::OutcomeUnrecorded { cause }.into())
            }
            Err(err) => return Err(err.into()),
        };
        if settled.status == StepStatus::Unknown && durability == Durability::Durable {
            // Nothing can look this up: ask now rather than at the next call.
            self.ask_a_person(&settled).await?;
        }
        Ok(settled)
    }

    /// R7: asks the real system about the key. Found → the recorded
    /// outcome; not found twice (a settle pause apart) → NOT_EXECUTED; no
    /// lookup → UNKNOWN, and the run waits for a person's answer.
    pub async fn reconcile(&self, step: Step) -> Result<Step, Refusal> {
        if step.status.is_settled() || step.status == StepStatus::AwaitingApproval {
            return Ok(step);
        }
        let spec = self.spec(&step.tool)?;
        let started = std::time::Instant::now();
        let (found, looks) = self
            .look_up_counting(
                &spec.connector,
                &step.idempotency_key,
                &step.args,
                spec.settle_ms,
            )
            .await;
        if found.is_ok() {
            self.observer.reconciled(&step.tool, started.elapsed());
        }
        let outcome = match found {
            Ok(found) => outcome_of_lookup(step.status, found),
            Err(LookupError::Unsupported) => {
                let step = self
                    .mark_unknown(step, "no lookup: a person must say whether it happened")
                    .await?;
                self.ask_a_person(&step).await?;
                return Ok(step);
            }
            Err(LookupError::Unavailable(reason)) => {
                return self
                    .mark_unknown(step, &format!("lookup failed: {reason}"))
                    .await;
            }
        };
        let settled = self
            .settle_step(
                step.run_id,
                step.step_idx,
                outcome,
                Durability::Durable,
                &Actor::System,
            )
            .await?;
        if settled.status.is_settled() {
            self.observer.unknown_settled(&step.tool, looks);
        }
        Ok(settled)
    }

    /// R7's lookup: asks the system for the key; "not found" is asked
    /// again after the settle pause (search indexes lag) before it counts.
    pub(crate) async fn look_up(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
        settle_ms: u64,
    ) -> Result<Lookup, LookupError> {
        self.look_up_counting(operation, key, args, settle_ms)
            .await
            .0
    }

    /// `look_up`, also saying which look answered.
    async fn look_up_counting(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
        settle_ms: u64,
    ) -> (Result<Lookup, LookupError>, Settlement) {
        match self.ask_system(operation, key, args).await {
            Ok(Lookup::NotFound) => {
                tokio::time::sleep(Duration::from_millis(settle_ms)).await;
                (
                    self.ask_system(operation, key, args).await,
                    Settlement::SecondLook,
                )
            }
            other => (other, Settlement::Lookup),
        }
    }

    /// One lookup request to the system, in its span.
    async fn ask_system(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        let system = system_of(operation);
        let span =
            tracing::info_span!("system.request", system, operation, key, request = "lookup");
        let started = std::time::Instant::now();
        let found = self
            .connector
            .lookup(operation, key, args)
            .instrument(span.clone())
            .await;
        let took = started.elapsed();
        if !matches!(found, Err(LookupError::Unsupported)) {
            self.observer
                .request_ended(system, SystemRequest::Lookup, took);
            let answer = match &found {
                Ok(Lookup::FoundSucceeded { .. }) => "found".to_owned(),
                Ok(Lookup::FoundFailed { .. }) => "found failed".to_owned(),
                Ok(Lookup::NotFound) => "not found".to_owned(),
                Err(err) => err.to_string(),
            };
            tracing::info!(parent: &span, took_ms = took.as_millis() as u64, "{system} lookup: {answer}");
        }
        found
    }

    async fn mark_unknown(&self, step: Step, why: &str) -> Result<Step, Refusal> {
        if step.status == StepStatus::Unknown {
            return Ok(step);
        }
        let outcome = Outcome::because(step.status, StepStatus::Unknown, why);
        Ok(self
            .settle_step(
                step.run_id,
                step.step_idx,
                outcome,
                Durability::Durable,
                &Actor::System,
            )
            .await?)
    }

    /// Puts the run in NEEDS_ATTENTION with a "did this happen?" question.
    async fn ask_a_person(&self, step: &Step) -> Result<(), Refusal> {
        let question = format!(
            "did step {} ({}) happen? It cannot be looked up; key {}",
            step.step_idx, step.tool, step.idempotency_key
        );
        match self.needs_attention(step.run_id, &question).await {
            Ok(_) => Ok(()),
            // Terminal runs keep their status; the unknown step stays visible.
            Err(Refusal::Store(StoreError::IllegalTransition(_))) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Puts the run in NEEDS_ATTENTION (remembering where it was) with the
    /// question a person must answer; already there, it stays.
    pub(crate) async fn needs_attention(
        &self,
        run_id: Uuid,
        question: &str,
    ) -> Result<Run, Refusal> {
        let run = self.store.run(run_id).await?.ok_or(Refusal::RunNotFound)?;
        if run.status == RunStatus::NeedsAttention {
            return Ok(run);
        }
        Ok(self
            .store
            .move_run(
                run_id,
                run.status,
                RunStatus::NeedsAttention,
                &Actor::System,
                Some(question),
            )
            .await?)
    }

    /// A person's answer to "did this happen?" (R7), recorded in the audit
    /// trail. The run returns to where it was once no question is left.
    ///
    /// `asked` is when the question was asked (the step's `updated_at` as
    /// the person read it): an answer is bound to that question, so one
    /// given again (a resubmitted form after the harness died mid-request)
    /// cannot settle a later question about the same step, which may be
    /// about an effect the first answer never saw.
    pub async fn answer(
        &self,
        run_id: Uuid,
        step_idx: i64,
        happened: bool,
        external_ref: Option<String>,
        asked: chrono::DateTime<chrono::Utc>,
        person: &Actor,
    ) -> Result<Step, Refusal> {
        let (step, back) =
            {
                let _serialised = self.serialise(run_id).await?;
                let now = self.store.step(run_id, step_idx).await?.ok_or_else(|| {
                    StoreError::NotFound {
                        what: format!("step {step_idx} of run {run_id}"),
                    }
                })?;
                if now.status == StepStatus::Unknown && now.updated_at != asked {
                    return Err(Refusal::QuestionAskedAgain { step: step_idx });
                }
                let to = if happened {
                    StepStatus::Confirmed
                } else {
                    StepStatus::NotExecuted
                };
                let outcome = Outcome {
                    external_ref,
                    ..Outcome::moving(StepStatus::Unknown, to)
                };
                let step = self
                    .settle_step(run_id, step_idx, outcome, Durability::Durable, person)
                    .await?;
                self.observer
                    .unknown_settled(&step.tool, Settlement::Person);
                let open_questions = self
                    .store
                    .steps(run_id)
                    .await?
                    .into_iter()
                    .any(|s| s.status == StepStatus::Unknown);
                let mut back = None;
                if let Some(run) = self.store.run(run_id).await? {
                    if let (RunStatus::NeedsAttention, Some(to), false) =
                        (run.status, run.resume_to, open_questions)
                    {
                        self.store
                            .move_run(
                                run_id,
                                RunStatus::NeedsAttention,
                                to,
                                person,
                                Some("every question answered"),
                            )
                            .await?;
                        back = Some(to);
                    }
                }
                (step, back)
            };
        // The commit or unwind that waited for this answer carries on now.
        match back {
            Some(RunStatus::Committing) => {
                self.commit(run_id).await?;
            }
            Some(RunStatus::Unwinding) => {
                self.continue_unwind(run_id).await?;
            }
            _ => {}
        }
        Ok(step)
    }

    /// A person approves or rejects a held single step (§4). Approve runs
    /// the stored call; reject settles it as REJECTED.
    pub async fn decide_step(
        &self,
        approval_id: i64,
        digest: &str,
        approve: bool,
        person: &Actor,
        via: Via,
    ) -> Result<Step, Refusal> {
        let approval =
            self.store
                .approval(approval_id)
                .await?
                .ok_or_else(|| StoreError::NotFound {
                    what: format!("approval {approval_id}"),
                })?;
        let step_idx = approval.step_idx.ok_or_else(|| {
            StoreError::Invalid(format!(
                "approval {approval_id} is a pivot, not a single step"
            ))
        })?;
        // Past its deadline, a decision is too late: the approval expires
        // as if nobody had decided (the store refuses a late approval in
        // the decision's own transaction too, should the clock pass the
        // deadline meanwhile).
        if approval.status == ApprovalStatus::Pending
            && approval
                .expires_at
                .is_some_and(|at| at <= chrono::Utc::now())
        {
            return self.expire_step(&approval).await;
        }
        let _serialised = self.serialise(approval.run_id).await?;
        let run = self
            .store
            .run(approval.run_id)
            .await?
            .ok_or(Refusal::RunNotFound)?;
        if approve && approval.status == ApprovalStatus::Pending && run.status != RunStatus::Running
        {
            // An unwinding or finished run sends nothing new.
            return Err(Refusal::RunClosed { status: run.status });
        }
        let decided = self
            .store
            .decide_approval(
                Decision {
                    approval_id,
                    digest: digest.to_owned(),
                    to: if approve {
                        ApprovalStatus::Approved
                    } else {
                        ApprovalStatus::Rejected
                    },
                    note: via.note(),
                    run_move: None,
                },
                person,
            )
            .await?;
        let step = self
            .store
            .step(approval.run_id, step_idx)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: format!("step {step_idx}"),
            })?;
        if step.status != StepStatus::AwaitingApproval || decided.status == ApprovalStatus::Pending
        {
            // Decided before, or the first of two approvals: it still waits.
            return Ok(step);
        }
        let to = if decided.status == ApprovalStatus::Approved {
            StepStatus::Intended
        } else {
            StepStatus::Rejected
        };
        let step = self
            .settle_step(
                approval.run_id,
                step_idx,
                Outcome::moving(StepStatus::AwaitingApproval, to),
                Durability::Durable,
                person,
            )
            .await?;
        if to == StepStatus::Intended {
            return self.execute_logged(step, person).await;
        }
        Ok(step)
    }

    /// When an approval of calls of these tools expires, by the tools
    /// file's deadlines (the shortest of theirs); none when it sets none.
    pub(crate) fn deadline_of<'t>(
        &self,
        tools: impl IntoIterator<Item = &'t str>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let policy = self.registry.approval_policy();
        tools
            .into_iter()
            .filter_map(|tool| policy.deadline_for(tool))
            .min()
            .and_then(|wait| chrono::Duration::from_std(wait).ok())
            .map(|wait| chrono::Utc::now() + wait)
    }

    /// A held step left undecided past its deadline: its approval ends as
    /// expired (nobody said no) and the call is never sent.
    pub async fn expire_step(&self, approval: &Approval) -> Result<Step, Refusal> {
        let step_idx = approval.step_idx.ok_or_else(|| {
            StoreError::Invalid(format!(
                "approval {} is a pivot, not a single step",
                approval.id
            ))
        })?;
        let _serialised = self.serialise(approval.run_id).await?;
        self.store
            .decide_approval(
                Decision {
                    approval_id: approval.id,
                    digest: approval.digest.clone(),
                    to: ApprovalStatus::Expired,
                    note: Some("past its deadline: nobody decided".to_owned()),
                    run_move: None,
                },
                &Actor::System,
            )
            .await?;
        self.observer().approval_expired(ApprovalKind::Step);
        let step = self
            .store
            .step(approval.run_id, step_idx)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: format!("step {step_idx}"),
            })?;
        if step.status != StepStatus::AwaitingApproval {
            return Ok(step);
        }
        Ok(self.settle_step(
            approval.run_id,
            step_idx,
            Outcome {
                error: Some(format!(
                    "{EXPIRED}: nobody decided before the deadline, so it was not sent; nobody rejected it"
                )),
                ..Outcome::moving(StepStatus::AwaitingApproval, StepStatus::Rejected)
            },
            Durability::Durable,
            &Actor::System,
        )
        .await?)
    }

    /// What the agent is told about a step, with the run's cursor.
    fn outcome_of(&self, step: &Step, cursor: Cursor) -> CallOutcome {
        // The status-to-outcome table is `OutcomeKind::of`; here only the words.
        let outcome = OutcomeKind::of(step.status);
        let idx = step.step_idx;
        let message = match outcome {
            OutcomeKind::Confirmed => "done".to_owned(),
            OutcomeKind::Failed => "the system refused this call; nothing happened. Change course rather than retrying it".to_owned(),
            OutcomeKind::Unknown => format!(
                "the outcome is unknown and may have happened. Do not retry with new arguments and do not \
                 assume it failed: the harness resolves it. Re-send step {idx} unchanged to read its outcome"
            ),
            OutcomeKind::NotExecuted => {
                format!("nothing happened; re-send step {idx} to try it again under the same key")
            }
            OutcomeKind::AwaitingApproval => format!(
                "held for a person's approval; nothing was sent. Re-send step {idx} later to read the decision"
            ),
            OutcomeKind::Rejected if step.error.as_deref().is_some_and(|e| e.starts_with(EXPIRED)) => {
                "expired: nobody decided before the deadline, so it was not sent. Nobody rejected it: call it again as a new step if it is still wanted".to_owned()
            }
            OutcomeKind::Rejected => {
                "a person rejected this call; it was not sent. Go on without it".to_owned()
            }
        };
        CallOutcome {
            outcome,
            step: Some(step.step_idx),
            key: Some(step.idempotency_key.clone()),
            external_ref: step.external_ref.clone(),
            result: step.result.clone(),
            error: step.error.clone(),
            message,
            next_step: cursor.next_step,
            new_step: cursor.new_step,
        }
    }
}

/// How a held step's error begins when its approval expired.
pub const EXPIRED: &str = "expired";

/// The digest an approval form carries back (§4): SHA-256 of the plan's
/// canonical JSON, in lowercase hex. Canonical: object keys in byte order
/// at every depth, no whitespace, strings and numbers as serde_json writes
/// them. The order is written here, not left to serde_json's map type,
/// whose order a feature switched on by any crate in the tree would change
/// (and with it every digest a person is looking at).
pub fn plan_digest(plan: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(plan, &mut canonical);
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (n, (key, value)) in entries.into_iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod digest {
    use super::plan_digest;
    use serde_json::{Map, Value};

    /// The digest of one plan, pinned: computed outside Rust as SHA-256 of
    /// `json.dumps(plan, separators=(",", ":"), sort_keys=True,
    /// ensure_ascii=False)`. A change to the canonical form changes it,
    /// and with it the digest of every approval waiting for a person.
    #[test]
    fn an_approvals_digest_is_sha256_of_the_plans_canonical_json() {
        let plan: Value = serde_json::from_str(
            r#"{"steps":[{"tool":"capture_payment","args":{"currency":"usd","amount":3200}},
                {"tool":"send_email","args":{"to":["ada@example.com"],"subject":"Refund — ok \"quoted\""}}],
                "pivot":true,"note":null,"ratio":0.5}"#,
        )
        .unwrap();
        assert_eq!(
            plan_digest(&plan),
            "dbbf21564136f64de6027c978905015bc1fc33b3ff048213938381088d12d83e"
        );
    }

    #[test]
    fn the_order_keys_were_written_in_does_not_change_the_digest() {
        let mut forward = Map::new();
        forward.insert("a".into(), Value::from(1));
        forward.insert("b".into(), Value::from(2));
        let mut backward = Map::new();
        backward.insert("b".into(), Value::from(2));
        backward.insert("a".into(), Value::from(1));
        assert_eq!(
            plan_digest(&Value::Object(forward)),
            plan_digest(&Value::Object(backward))
        );
    }
}
