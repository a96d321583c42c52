//! Dispatch: where a tool call becomes an INTENDED row, then a call, then an
//! outcome (R2–R7, R9, DESIGN.md §4–§5).
//!
//! `Engine::call` is the one entry for an agent's call. Pure calls go
//! straight to the connector. A non-pure call names its step: a new step is
//! logged (or held for approval) before anything is sent; an old step gets
//! its recorded outcome, reconciled first if it is unsettled, re-executed
//! under the same key and logged arguments if nothing happened.

use super::agent_acts::{agent_may, AgentAct};
use super::answer::capitalised;
use super::class::{Phase, ToolClass};
use super::connector::{
    classify, outcome_of_call, outcome_of_lookup, CallReport, Classified, Connector, Lookup,
    LookupError,
};
use super::key::step_key;
use super::limits::{OverLimit, StepLimits};
use super::model::*;
use super::observe::{system_of, Observer, Settlement, SystemRequest, Unobserved};
pub use super::refusal::Refusal;
use super::registry::{ArgsMistake, Registry, ToolSpec};
pub use super::run_locks::RunGuard;
use super::run_locks::{FenceEntry, RunLocks, Runs};
use super::status::{ApprovalStatus, RunStatus, StepStatus};
use super::store::{ClaimedRead, RunClaim, SagaStore, StoreError};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;
use uuid::Uuid;

pub use super::answer::{CallOutcome, Cursor, OutcomeKind};

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

pub struct Engine {
    pub(crate) store: Arc<dyn SagaStore>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) connector: Arc<dyn Connector>,
    /// This process's locks on runs and the lease fences of those it holds.
    pub(crate) runs: Runs,
    pub(crate) observer: Arc<dyn Observer>,
    /// The waits systems asked for before a call is sent again.
    pub(crate) hold_offs: super::resend::HoldOffs,
    /// The first pause before the engine sends a refused call again.
    pub(crate) first_resend_pause: std::time::Duration,
    /// The longest a system's call may take to be answered (connecting
    /// included): a lease must outlast it before the call is sent. The
    /// connectors know it; until they say (`calls_answered_within`), the
    /// lease need only be valid when the call leaves.
    pub(crate) longest_call: std::time::Duration,
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
            runs: Runs::default(),
            observer: Arc::new(Unobserved),
            hold_offs: Default::default(),
            first_resend_pause: super::resend::FIRST_PAUSE,
            longest_call: std::time::Duration::ZERO,
        }
    }

    /// The engine, sending a call only while its run's lease outlasts
    /// `longest` (the connectors' longest call, connecting included).
    pub fn calls_answered_within(mut self, longest: std::time::Duration) -> Self {
        self.longest_call = longest;
        self
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

    /// Serialises work on one run, in this process and across processes
    /// sharing the database (see `Runs::serialise`).
    pub async fn serialise(&self, run_id: Uuid) -> Result<RunGuard, Refusal> {
        Ok(self.runs.serialise(self.store.as_ref(), run_id).await?)
    }

    /// `serialise` without waiting: `None` when a call in this process or
    /// another instance is working on the run now. Background work (resume,
    /// the sweeps) leaves such a run to its holder and looks again later.
    pub(crate) async fn try_serialise(&self, run_id: Uuid) -> Result<Option<RunGuard>, Refusal> {
        Ok(self.runs.try_serialise(self.store.as_ref(), run_id).await?)
    }

    /// Just before a call of the run leaves: the run must still be this
    /// process's for the longest a call takes (see `Runs::confirm_lease`).
    pub(crate) async fn confirm_lease(&self, run_id: Uuid) -> Result<(), Refusal> {
        Ok(self.runs.confirm_lease(run_id, self.longest_call).await?)
    }

    fn fence_while_held(&self, run_id: Uuid, claim: &dyn RunClaim) -> Option<FenceEntry> {
        self.runs.fence_while_held(run_id, claim)
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, RunLocks> {
        self.runs.locks()
    }

    /// How many per-run locks this process keeps (bounded: see `RunLocks`).
    pub fn run_locks_kept(&self) -> usize {
        self.locks().len()
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
    pub async fn agents_run(&self, agent: &str, run_id: Uuid) -> Result<Run, Refusal> {
        self.store
            .run(run_id)
            .await?
            .filter(|r| r.agent == agent)
            .ok_or(Refusal::RunNotFound)
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
                self.note_refusal(agent, run_id, refusal).await;
            }
        }
        answered
    }

    /// Writes a refusal the agent caused to its run's audit trail; a
    /// failure to write it is logged, and the agent still gets its refusal.
    pub(crate) async fn note_refusal(&self, agent: &str, run_id: Uuid, refusal: &Refusal) {
        if !refusal.is_the_agents_doing() {
            return;
        }
        let line = refusal.audit_line();
        if let Err(err) = self
            .store
            .note(run_id, &Actor::Agent(agent.to_owned()), &line)
            .await
        {
            tracing::warn!(%run_id, code = refusal.code(), error = %err, "the refusal was not written to the audit trail");
        }
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
        let local = self.runs.lock(run_id).lock_owned().await;
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
            return self.call_again(&run, step, tool, &owed, listening).await;
        }
        if step > run.next_step {
            return Err(Refusal::StepOutOfOrder {
                step,
                next_step: run.next_step,
            });
        }
        let new = NewCall {
            agent,
            spec,
            tool,
            step,
            args,
            new_effect,
            intent_failpoint_met,
            unsettled,
            owed,
        };
        self.call_new(&run, new, listening).await
    }

    /// A step the log already has, sent again: the logged arguments win (a
    /// reworded retry never changes them), and the agent reads its outcome.
    /// Only a running run sends again a step that did not happen; in any
    /// other state the agent reads what the log (and the real system) says.
    async fn call_again(
        &self,
        run: &Run,
        step: i64,
        tool: &str,
        owed: &[Step],
        listening: &(dyn Fn() -> bool + Sync),
    ) -> Result<CallOutcome, Refusal> {
        let logged = self
            .store
            .step(run.id, step)
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
        let settled = if run.status == RunStatus::Running {
            self.settle_existing(logged).await?
        } else {
            self.reconcile(logged).await?
        };
        let others = owed.iter().map(|s| s.step_idx).filter(|&idx| idx != step);
        self.answer_agent(&settled, run.next_step, others, listening)
            .await
    }

    /// The run's next step, on the general path: refused for the run's
    /// status, a misfit argument, a likely repeat of a step still owed (R12)
    /// or a gated tool; held for a person when it must be; else logged
    /// (R2) and sent.
    async fn call_new(
        &self,
        run: &Run,
        call: NewCall<'_>,
        listening: &(dyn Fn() -> bool + Sync),
    ) -> Result<CallOutcome, Refusal> {
        let NewCall {
            agent,
            spec,
            tool,
            step,
            args,
            new_effect,
            intent_failpoint_met,
            unsettled,
            owed,
        } = call;
        let owed_steps = || owed.iter().map(|s| s.step_idx);
        agent_may(AgentAct::Call, run.status)?;
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
                    run.id,
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
        let charges = self
            .registry
            .limits()
            .charges(tool, spec.money.as_ref(), &args, run.id, agent)
            .map_err(|mistake| Refusal::InvalidArgs {
                tool: tool.to_owned(),
                mistake: ArgsMistake {
                    field: mistake.field,
                    problem: mistake.problem,
                },
            })?;
        let (new, held_because) = new_step_row(spec, run.id, step, tool, &args, charges.step);
        tracing::Span::current().record("key", new.idempotency_key.as_str());
        let actor = Actor::Agent(agent.to_owned());
        if let Some(over) = charges.over_now {
            return self
                .hold_over_limit(run, new, over, &actor, owed_steps(), listening)
                .await;
        }
        if let Some(reason) = held_because {
            // Held: the index is reserved and the exact call stored, with
            // its approval request, in one commit; nothing is sent. The
            // person deciding also reads a limit it would cross.
            let reason = match self.would_cross(&new.limits, agent).await? {
                Some(over) => format!("{reason}. {}", capitalised(&over.words)),
                None => reason,
            };
            let call = json!({"tool": tool, "args": args, "step": step});
            let (held, _) = self
                .store
                .record_held_step(
                    new,
                    NewApproval {
                        run_id: run.id,
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
        // R2: the row is committed before anything is sent; with its
        // limits checked and counted in the same commit.
        let logged = match self.store.record_step(new.clone(), &actor).await {
            Err(StoreError::OverLimit { charge, used }) => {
                let over = match new.limits.charges.get(charge) {
                    Some(crossed) => self.registry.limits().over(crossed, used, agent),
                    None => return Err(StoreError::OverLimit { charge, used }.into()),
                };
                return self
                    .hold_over_limit(run, new, over, &actor, owed_steps(), listening)
                    .await;
            }
            other => other?,
        };
        let settled = self.execute_logged(logged, &actor).await?;
        self.answer_agent(&settled, step + 1, owed_steps(), listening)
            .await
    }

    /// The first limit these charges would take past its maximum now, as
    /// a person reads it (for a call held for another reason).
    async fn would_cross(
        &self,
        limits: &StepLimits,
        agent: &str,
    ) -> Result<Option<OverLimit>, Refusal> {
        if limits.is_empty() {
            return Ok(None);
        }
        let scopes: Vec<(String, Option<i64>)> = limits
            .charges
            .iter()
            .map(|c| (c.scope.clone(), c.window_s))
            .collect();
        let used = self.store.limit_usage(&scopes).await?;
        Ok(limits
            .charges
            .iter()
            .zip(used)
            .find(|(c, used)| used.saturating_add(c.amount) > c.max)
            .map(|(c, used)| self.registry.limits().over(c, used, agent)))
    }

    /// What approving a pending pivot's commit steps would take past a
    /// limit now, in sentences (nothing for an approval that is not a
    /// waiting pivot).
    pub async fn pivot_over_limits(
        &self,
        run: &Run,
        approval: &Approval,
    ) -> Result<Vec<String>, Refusal> {
        let limits = self.registry.limits();
        if limits.is_empty()
            || approval.kind != ApprovalKind::Pivot
            || approval.status != ApprovalStatus::Pending
        {
            return Ok(Vec::new());
        }
        let Ok(plan) = PivotPlan::read(&approval.plan) else {
            return Ok(Vec::new());
        };
        let calls: Vec<(&str, Option<&super::limits::MoneyArgs>, &Value)> = plan
            .commit
            .iter()
            .map(|c| {
                let money = self.registry.get(&c.tool).and_then(|s| s.money.as_ref());
                (c.tool.as_str(), money, &c.args)
            })
            .collect();
        let charges = limits.charges_of_calls(&calls, run.id, &run.agent);
        let scopes: Vec<(String, Option<i64>)> = charges
            .iter()
            .map(|c| (c.scope.clone(), c.window_s))
            .collect();
        let used = self.store.limit_usage(&scopes).await?;
        Ok(charges
            .iter()
            .zip(used)
            .filter(|(c, used)| used.saturating_add(c.amount) > c.max)
            .map(|(c, used)| capitalised(&limits.over(c, used, &run.agent).words))
            .collect())
    }

    /// A call that would take a limit past its maximum: held for the
    /// tool's approvers with the reason in words, nothing sent. Its charges
    /// are kept with it, counted once a person approves it.
    async fn hold_over_limit(
        &self,
        run: &Run,
        mut new: NewStep,
        over: OverLimit,
        actor: &Actor,
        owed: impl Iterator<Item = i64>,
        listening: &(dyn Fn() -> bool + Sync),
    ) -> Result<CallOutcome, Refusal> {
        let spec = self.spec(&new.tool)?;
        let step = new.step_idx;
        new.status = StepStatus::AwaitingApproval;
        new.limits = std::mem::take(&mut new.limits).counted_only();
        let call = json!({
            "tool": new.tool,
            "args": new.args,
            "step": step,
            "over_limit": over,
        });
        let (held, _) = self
            .store
            .record_held_step(
                new.clone(),
                NewApproval {
                    run_id: run.id,
                    kind: ApprovalKind::Step,
                    step_idx: Some(step),
                    summary: capitalised(&over.words),
                    digest: plan_digest(&call),
                    plan: call,
                    expires_at: self.deadline_of([new.tool.as_str()]),
                    approvers_needed: self
                        .registry
                        .approval_policy()
                        .approvers_for(spec, &new.args),
                },
                actor,
            )
            .await?;
        self.answer_agent(&held, step + 1, owed, listening).await
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
        if spec.class == ToolClass::Pure
            || spec.way_back_only
            || spec.gated
            || self.check_args(tool, args).is_err()
        {
            return not_ready(false);
        }
        // A call whose limits cannot be read, or that crosses one on its
        // own, is the general path's to refuse or hold.
        let Ok(charges) =
            self.registry
                .limits()
                .charges(tool, spec.money.as_ref(), args, run_id, bearer.agent)
        else {
            return not_ready(false);
        };
        if charges.over_now.is_some() {
            return not_ready(false);
        }
        let (new, held_because) = new_step_row(spec, run_id, step, tool, args, charges.step);
        if held_because.is_some() {
            return not_ready(false);
        }
        let key = new.idempotency_key.clone();
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
    pub async fn check_token(&self, agent: &str, token: Option<&str>) -> Result<(), Refusal> {
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
        let kind = self.outcome_kind(step).await?;
        let owed = !kind.is_final() || !listening();
        if owed != step.owed_to_agent {
            self.store
                .set_owed_to_agent(step.run_id, step.step_idx, owed)
                .await?;
        }
        let this = owed.then_some(step.step_idx);
        let cursor = Cursor::of(new_step, others.chain(this));
        let answer = CallOutcome::of(step, kind, cursor);
        if kind != OutcomeKind::HeldOverLimit {
            return Ok(answer);
        }
        Ok(match self.over_limit_of(step).await? {
            Some(over) => answer.over_limit(over),
            None => answer,
        })
    }

    /// The limit a held step would cross, as its approval records it.
    pub async fn over_limit_of(&self, step: &Step) -> Result<Option<OverLimit>, Refusal> {
        let approvals = self.store.approvals(step.run_id).await?;
        Ok(approvals
            .iter()
            .rev()
            .find(|a| a.kind == ApprovalKind::Step && a.step_idx == Some(step.step_idx))
            .and_then(|a| a.plan.get("over_limit"))
            .and_then(|over| serde_json::from_value(over.clone()).ok()))
    }

    /// What the agent is told of `step`: what its status says, except that
    /// a held step whose approval ran out of time is `expired`, not
    /// `rejected` (nobody said no), as its approval records.
    pub async fn outcome_kind(&self, step: &Step) -> Result<OutcomeKind, Refusal> {
        let kinds = self.outcome_kinds(std::slice::from_ref(step)).await?;
        Ok(kinds
            .first()
            .copied()
            .unwrap_or_else(|| OutcomeKind::of(step.status)))
    }

    /// [`Engine::outcome_kind`] for every step of one run's log, reading
    /// the run's approvals once at most (only a rejected step needs them).
    pub async fn outcome_kinds(&self, steps: &[Step]) -> Result<Vec<OutcomeKind>, Refusal> {
        let kinds: Vec<OutcomeKind> = steps.iter().map(|s| OutcomeKind::of(s.status)).collect();
        let Some(run_id) = steps
            .iter()
            .zip(&kinds)
            .find(|(_, kind)| matches!(kind, OutcomeKind::Rejected | OutcomeKind::AwaitingApproval))
            .map(|(step, _)| step.run_id)
        else {
            return Ok(kinds);
        };
        let approvals = self.store.approvals(run_id).await?;
        Ok(steps
            .iter()
            .zip(kinds)
            .map(|(step, kind)| {
                let expired = kind == OutcomeKind::Rejected
                    && approvals.iter().any(|a| {
                        a.kind == ApprovalKind::Step
                            && a.step_idx == Some(step.step_idx)
                            && a.status == ApprovalStatus::Expired
                    });
                let over_limit = kind == OutcomeKind::AwaitingApproval
                    && approvals.iter().any(|a| {
                        a.kind == ApprovalKind::Step
                            && a.step_idx == Some(step.step_idx)
                            && a.status == ApprovalStatus::Pending
                            && a.plan.get("over_limit").is_some()
                    });
                if expired {
                    OutcomeKind::Expired
                } else if over_limit {
                    OutcomeKind::HeldOverLimit
                } else {
                    kind
                }
            })
            .collect())
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
        agent_may(AgentAct::Complete, run.status)?;
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
            limit: None,
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
}

/// A new step as the general path has it, once its run is claimed.
struct NewCall<'a> {
    agent: &'a str,
    spec: &'a ToolSpec,
    tool: &'a str,
    step: i64,
    args: Value,
    new_effect: bool,
    /// The hot path met `dispatch.before_intent` already.
    intent_failpoint_met: bool,
    /// The run's unsettled steps and those owed to the agent, as read with
    /// its claim.
    unsettled: Vec<Step>,
    owed: Vec<Step>,
}

/// A new step's row, the same on the hot path and the general one: its
/// key (R3), its way back filled in (R6) and its audience. With the reason
/// it is held for a person instead of sent, when it is: its way back cannot
/// be built, or it is irreversible before the pivot.
fn new_step_row(
    spec: &ToolSpec,
    run_id: Uuid,
    step: i64,
    tool: &str,
    args: &Value,
    limits: StepLimits,
) -> (NewStep, Option<String>) {
    let key = step_key(run_id, step, tool);
    let (compensation, held_because) = match spec.way_back(&key, args) {
        Ok(way) if spec.class == ToolClass::Irreversible => (
            way,
            Some("an irreversible call before the pivot needs its own approval".to_owned()),
        ),
        Ok(way) => (way, None),
        Err(reason) => (
            None,
            Some(format!("the way back cannot be built: {reason}")),
        ),
    };
    let new = NewStep {
        run_id,
        step_idx: step,
        tool: tool.to_owned(),
        tool_class: spec.class,
        idempotency_key: key,
        args: args.clone(),
        status: if held_because.is_some() {
            StepStatus::AwaitingApproval
        } else {
            StepStatus::Intended
        },
        compensation,
        audience: spec.audience_for(args),
        phase: Phase::BeforePivot,
        // A step held for a person counts once it is approved; only an
        // agent's call that goes at once must fit under its limits.
        limits: if held_because.is_some() {
            limits.counted_only()
        } else {
            limits
        },
    };
    (new, held_because)
}

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
