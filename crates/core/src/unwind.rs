//! Unwind (R8) and the corrections it queues (R10).
//!
//! An unwind first reconciles every unsettled row, then compensates: effects
//! only the team could see first (silently), then those whose audience is
//! outside the team; newest first within each group. Every compensation has
//! its own key and intent row and goes through the same R4 table and R7
//! reconcile as any call, so an unwind that dies halfway resumes without
//! doubling anything. Effects that people outside the team saw get a
//! correction queued for a person to send or dismiss; an unwind never
//! "un-sends".

use super::agent_acts::{agent_may, AgentAct};
use super::class::{Audience, ToolClass};
use super::connector::{outcome_of_lookup, LookupError};
use super::engine::{Engine, Refusal};
use super::key::{compensation_key, correction_key};
use super::model::*;
use super::questions::may_start_unwind;
use super::status::{ApprovalStatus, RunStatus, StepStatus};
use serde_json::Value;
use uuid::Uuid;

use super::resend::SENDS;

impl Engine {
    /// Starts (or continues) unwinding a run. Agents may unwind a run
    /// before its pivot; after it, only a person from the dashboard.
    pub async fn unwind(&self, run_id: Uuid, actor: &Actor, reason: &str) -> Result<Run, Refusal> {
        {
            let _serialised = self.serialise(run_id).await?;
            let run = self
                .store()
                .run(run_id)
                .await?
                .ok_or(Refusal::RunNotFound)?;
            // Whether this starts the unwind (else it carries one on).
            let starts = match actor {
                Actor::Agent(_) => {
                    agent_may(AgentAct::Unwind, run.status)?;
                    run.status != RunStatus::Unwinding
                }
                _ => match (run.status, may_start_unwind(run.status, actor)) {
                    (_, Some(true)) => true,
                    (RunStatus::Unwinding, _) => false,
                    (RunStatus::AwaitingApproval, _) => return Err(Refusal::RunAwaitingApproval),
                    (status, _) => return Err(Refusal::RunClosed { status }),
                },
            };
            if starts {
                self.store()
                    .move_run(
                        run_id,
                        run.status,
                        RunStatus::Unwinding,
                        actor,
                        Some(reason),
                    )
                    .await?;
                self.observer().unwind_started(actor);
            }
        }
        self.continue_unwind(run_id).await
    }

    /// A person's answer about a compensation the unwind could not finish
    /// (R7, R8): `undone` says the effect is taken back (they checked, or
    /// did it by hand); otherwise that the compensation did not happen, so
    /// the unwind sends it again under its own key. The unwind carries on
    /// once nothing else waits for a person.
    pub async fn answer_compensation(
        &self,
        run_id: Uuid,
        step_idx: i64,
        undone: bool,
        asked: chrono::DateTime<chrono::Utc>,
        person: &Actor,
    ) -> Result<Compensation, Refusal> {
        let (row, carry_on) = {
            let _serialised = self.serialise(run_id).await?;
            let row = self
                .store()
                .compensations(run_id)
                .await?
                .into_iter()
                .find(|c| c.step_idx == step_idx)
                .ok_or_else(|| super::store::StoreError::NotFound {
                    what: format!("the compensation of step {step_idx}"),
                })?;
            // Bound to the question the person read, as `answer` is: a
            // replayed "it did not happen" would send the undo again.
            let open = matches!(
                row.status,
                StepStatus::Intended | StepStatus::Unknown | StepStatus::Failed
            );
            if open && row.updated_at != asked {
                return Err(Refusal::QuestionAskedAgain { step: step_idx });
            }
            let to = match (row.status, undone) {
                (StepStatus::Intended | StepStatus::Unknown | StepStatus::Failed, true) => {
                    StepStatus::Confirmed
                }
                (StepStatus::Intended | StepStatus::Unknown, false) => StepStatus::NotExecuted,
                (status, _) => {
                    return Err(super::store::StoreError::Invalid(format!(
                    "the compensation of step {step_idx} is {status}: there is nothing to answer{}",
                    if status == StepStatus::Failed {
                        " except that it was undone by hand"
                    } else {
                        ""
                    }
                ))
                    .into())
                }
            };
            let row = self
                .settle_compensation(
                    run_id,
                    step_idx,
                    Outcome::moving(row.status, to),
                    Durability::Durable,
                    person,
                )
                .await?;
            let run = self
                .store()
                .run(run_id)
                .await?
                .ok_or(Refusal::RunNotFound)?;
            let carry_on = run.status == RunStatus::NeedsAttention
                && run.resume_to == Some(RunStatus::Unwinding);
            if carry_on {
                self.store()
                    .move_run(
                        run_id,
                        RunStatus::NeedsAttention,
                        RunStatus::Unwinding,
                        person,
                        Some("a person answered about a compensation"),
                    )
                    .await?;
            }
            (row, carry_on)
        };
        if carry_on {
            self.continue_unwind(run_id).await?;
        }
        Ok(row)
    }

    /// The order compensations run in (R8): internal effects first, then
    /// outward ones; newest first within each group.
    pub fn compensation_order(steps: &[Step]) -> Vec<i64> {
        let mut order: Vec<&Step> = steps.iter().collect();
        order.sort_by_key(|s| (!s.audience.is_internal(), std::cmp::Reverse(s.step_idx)));
        order.into_iter().map(|s| s.step_idx).collect()
    }

    /// Drives an UNWINDING run as far as it can go. Idempotent: safe after
    /// a crash at any point.
    pub async fn continue_unwind(&self, run_id: Uuid) -> Result<Run, Refusal> {
        let _serialised = self.serialise(run_id).await?;
        let run = self
            .store()
            .run(run_id)
            .await?
            .ok_or(Refusal::RunNotFound)?;
        if run.status != RunStatus::Unwinding {
            return Ok(run);
        }
        // Held calls were never sent: they are rejected, not compensated.
        for approval in self.store().approvals(run_id).await? {
            if approval.status == ApprovalStatus::Pending && approval.kind == ApprovalKind::Step {
                self.store()
                    .decide_approval(
                        Decision {
                            approval_id: approval.id,
                            digest: approval.digest.clone(),
                            to: ApprovalStatus::Rejected,
                            note: Some("the run was unwound".into()),
                            run_move: None,
                        },
                        &Actor::System,
                    )
                    .await?;
            }
        }
        for step in self.store().steps(run_id).await? {
            if step.status == StepStatus::AwaitingApproval {
                self.settle_step(
                    run_id,
                    step.step_idx,
                    Outcome::moving(StepStatus::AwaitingApproval, StepStatus::Rejected),
                    Durability::Durable,
                    &Actor::System,
                )
                .await?;
            }
        }
        // Reconcile before any compensation: a ghost is never compensated,
        // a real effect never missed.
        for step in self.store().steps(run_id).await? {
            if matches!(step.status, StepStatus::Intended | StepStatus::Unknown) {
                let idx = step.step_idx;
                let after = self.reconcile(step).await?;
                if !after.status.is_settled() {
                    return self
                        .needs_attention(
                            run_id,
                            &format!("step {idx} is unsettled; the unwind waits for it"),
                        )
                        .await;
                }
            }
        }
        let steps = self.store().steps(run_id).await?;
        let compensations = self.store().compensations(run_id).await?;
        for idx in Self::compensation_order(&steps) {
            let Some(step) = steps.iter().find(|s| s.step_idx == idx) else {
                continue;
            };
            let undoable = matches!(
                step.tool_class,
                ToolClass::Reversible | ToolClass::Compensatable
            );
            if !undoable || step.status != StepStatus::Confirmed {
                continue;
            }
            let existing = compensations.iter().find(|c| c.step_idx == idx).cloned();
            if let Err(question) = self.compensate(step, existing).await? {
                return self.needs_attention(run_id, &question).await;
            }
        }
        self.queue_corrections(run_id).await?;
        Ok(self
            .store()
            .move_run(
                run_id,
                RunStatus::Unwinding,
                RunStatus::Unwound,
                &Actor::System,
                Some("every effect compensated"),
            )
            .await?)
    }

    /// Runs one compensation to CONFIRMED; `Ok(Err(question))` when a person
    /// must decide.
    async fn compensate(
        &self,
        step: &Step,
        existing: Option<Compensation>,
    ) -> Result<Result<(), String>, Refusal> {
        let way_back = step.compensation.clone().unwrap_or(Value::Null);
        let (Some(tool), Some(args)) = (way_back["tool"].as_str(), way_back.get("args")) else {
            return Ok(Err(format!(
                "step {} has no way back written down",
                step.step_idx
            )));
        };
        let compensating = self.spec(tool)?;
        let operation = compensating.connector.clone();
        let settle_ms = compensating.settle_ms;
        // A row found on disk may have been sent before a crash: look it up
        // before sending. A row written now certainly was not.
        let mut unsent = existing.is_none();
        let mut row = match existing {
            Some(row) => row,
            None => self.write_compensation(step, tool, args).await?,
        };
        let durability = if self.connector().has_lookup(&operation) {
            Durability::Lazy
        } else {
            Durability::Durable
        };
        let mut attempts = 0;
        let mut resends = self.resends();
        // Why the system last refused it for now, for the person asked.
        let mut refused = None;
        loop {
            let question = |what: String| {
                format!("the compensation of step {} ({tool}) {what}", step.step_idx)
            };
            let outcome = match row.status {
                StepStatus::Confirmed => return Ok(Ok(())),
                StepStatus::Failed => {
                    return Ok(Err(question(format!(
                        "failed: {}",
                        row.error.clone().unwrap_or_default()
                    ))))
                }
                StepStatus::NotExecuted => {
                    unsent = true;
                    refused = row.error.clone();
                    Outcome::moving(StepStatus::NotExecuted, StepStatus::Intended)
                }
                StepStatus::Intended if unsent => {
                    // A re-send waits (saga::resend); the first send does not.
                    if attempts > 0 {
                        if let Err(why) = self
                            .pause_before_resend(&row.idempotency_key, &mut resends)
                            .await
                        {
                            return Ok(Err(question(match &refused {
                                Some(refused) => format!("{why} ({refused})"),
                                None => why,
                            })));
                        }
                    }
                    attempts += 1;
                    unsent = false;
                    crate::failpoint::hit("unwind.before_compensation_call");
                    self.confirm_lease(row.run_id).await?;
                    let outcome = self.send(&operation, &row.idempotency_key, &row.args).await;
                    crate::failpoint::hit("unwind.before_compensation_outcome");
                    outcome
                }
                // Re-sends stop in `pause_before_resend`; lookups stop here.
                _ if attempts >= SENDS => {
                    return Ok(Err(question(format!(
                        "is still {} after {attempts} attempts",
                        row.status
                    ))))
                }
                StepStatus::Intended | StepStatus::Unknown => {
                    attempts += 1;
                    match self
                        .look_up(&operation, &row.idempotency_key, &row.args, settle_ms)
                        .await
                    {
                        Ok(found) => outcome_of_lookup(row.status, found),
                        Err(LookupError::Unsupported | LookupError::Unavailable(_)) => {
                            if row.status == StepStatus::Unknown {
                                return Ok(Err(question(
                                    "may have happened and cannot be looked up now".into(),
                                )));
                            }
                            Outcome::moving(StepStatus::Intended, StepStatus::Unknown)
                        }
                    }
                }
                other => return Ok(Err(question(format!("is {other}")))),
            };
            row = self
                .settle_compensation(
                    step.run_id,
                    step.step_idx,
                    outcome,
                    durability,
                    &Actor::System,
                )
                .await?;
        }
    }

    /// The compensation's own row, written before it is sent (R2), under
    /// its own key (R6).
    async fn write_compensation(
        &self,
        step: &Step,
        tool: &str,
        args: &Value,
    ) -> Result<Compensation, Refusal> {
        crate::failpoint::hit("unwind.before_compensation_intent");
        let new = NewCompensation {
            run_id: step.run_id,
            step_idx: step.step_idx,
            tool: tool.to_owned(),
            idempotency_key: compensation_key(step.run_id, step.step_idx, &step.tool),
            args: args.clone(),
        };
        Ok(self
            .store()
            .record_compensation(new, &Actor::System)
            .await?)
    }

    /// R10: a correction for every effect people outside the team saw —
    /// an irreversible step that went out, or a compensation of an effect
    /// whose audience saw the original. None when the audience never saw it.
    async fn queue_corrections(&self, run_id: Uuid) -> Result<(), Refusal> {
        for step in self.store().steps(run_id).await? {
            if step.audience == Audience::Internal {
                continue;
            }
            let source = match (step.tool_class, step.status) {
                (ToolClass::Irreversible, StepStatus::Confirmed) => CorrectionSource::Step,
                (ToolClass::Reversible | ToolClass::Compensatable, StepStatus::Compensated) => {
                    CorrectionSource::Compensation
                }
                _ => continue,
            };
            // R10: only the people who saw the original hear of it; an
            // audience with no declared correction gets none.
            let Some((template, recipients)) = self.correction_text(&step)? else {
                continue;
            };
            self.store()
                .queue_correction(
                    NewCorrection {
                        run_id,
                        step_idx: step.step_idx,
                        source,
                        tool: step.tool.clone(),
                        audience: step.audience,
                        template,
                        recipients,
                        idempotency_key: correction_key(run_id, step.step_idx, &step.tool),
                    },
                    &Actor::System,
                )
                .await?;
        }
        Ok(())
    }
}

/// What an unwind of a run would do now, for the person about to start it
/// (DESIGN.md §6, unwind review).
#[derive(Clone, Debug, PartialEq)]
pub struct UnwindPreview {
    /// Steps to compensate, in the order the unwind runs them, with the
    /// pre-written way back.
    pub compensations: Vec<(Step, Value)>,
    /// Corrections it would queue: the step, its text and its recipients.
    pub corrections: Vec<(Step, String, Vec<String>)>,
}

impl Engine {
    /// The compensations (in order) and corrections an unwind would make,
    /// following the same rules as [`Engine::continue_unwind`] and
    /// `queue_corrections`, without changing anything.
    pub async fn unwind_preview(&self, run_id: Uuid) -> Result<UnwindPreview, Refusal> {
        let steps = self.store().steps(run_id).await?;
        let mut preview = UnwindPreview {
            compensations: Vec::new(),
            corrections: Vec::new(),
        };
        for idx in Self::compensation_order(&steps) {
            let Some(step) = steps.iter().find(|s| s.step_idx == idx) else {
                continue;
            };
            let undoable = matches!(
                step.tool_class,
                ToolClass::Reversible | ToolClass::Compensatable
            );
            if undoable && step.status == StepStatus::Confirmed {
                let way_back = step.compensation.clone().unwrap_or(Value::Null);
                preview.compensations.push((step.clone(), way_back));
            }
        }
        for step in &steps {
            let seen_outside = step.audience != Audience::Internal;
            let corrected = match step.tool_class {
                ToolClass::Irreversible => step.status == StepStatus::Confirmed,
                ToolClass::Reversible | ToolClass::Compensatable => {
                    matches!(step.status, StepStatus::Confirmed | StepStatus::Compensated)
                }
                ToolClass::Pure => false,
            };
            if seen_outside && corrected {
                if let Some((text, recipients)) = self.correction_text(step)? {
                    preview.corrections.push((step.clone(), text, recipients));
                }
            }
        }
        Ok(preview)
    }

    /// The correction for a step people outside the team saw, addressed to
    /// the audience that saw it (R10): the one written before it ran, else
    /// the tool's declaration for the step's audience (with no recipient
    /// when these arguments name none: a person adds one or dismisses it).
    /// `None` when nothing is declared for that audience.
    fn correction_text(&self, step: &Step) -> Result<Option<(String, Vec<String>)>, Refusal> {
        let spec = self.spec(&step.tool)?;
        let written = step.compensation.clone().unwrap_or(Value::Null);
        if written["kind"].as_str() == Some("correction") {
            return Ok(Some((
                written["template"].as_str().unwrap_or_default().to_owned(),
                strings(&written["recipients"]),
            )));
        }
        let Some(declared) = spec.correction_to(step.audience) else {
            return Ok(None);
        };
        Ok(Some(
            spec.correction_for(step.audience, &step.idempotency_key, &step.args)
                .unwrap_or_else(|_| (declared.template.clone(), Vec::new())),
        ))
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}
