//! The pivot (DESIGN.md §4, R9): the agent proposes the exact commit steps,
//! a person approves the plan they saw (by its digest), and the harness
//! runs exactly those steps, in order, rolling forward only.
//!
//! The commit steps' indices are fixed by the plan itself (`first_step` is
//! the run's next step when the plan is proposed, and a run awaiting
//! approval takes no other call), so the approval's single commit both
//! freezes the arguments and assigns the indices.

use super::agent_acts::{agent_may, AgentAct};
use super::class::{Phase, ToolClass};
use super::engine::{plan_digest, Engine, Refusal};
use super::key::step_key;
use super::model::*;
use super::status::{ApprovalStatus, RunStatus, StepStatus};
use super::store::StoreError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// One call the agent wants run after approval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedCall {
    pub tool: String,
    #[serde(default)]
    pub args: Value,
}

pub use super::class::AUTHORISATION_LIFETIME;

use super::resend::SENDS;

impl Engine {
    /// Proposes (or replaces) the run's pivot; a refusal the agent caused
    /// goes to the run's audit trail.
    pub async fn propose_pivot(
        &self,
        agent: &str,
        run_id: Uuid,
        summary: &str,
        commit: Vec<PlannedCall>,
    ) -> Result<Approval, Refusal> {
        let proposed = self.propose(agent, run_id, summary, commit).await;
        if let Err(refusal) = &proposed {
            self.note_refusal(agent, run_id, refusal).await;
        }
        proposed
    }

    async fn propose(
        &self,
        agent: &str,
        run_id: Uuid,
        summary: &str,
        commit: Vec<PlannedCall>,
    ) -> Result<Approval, Refusal> {
        let _serialised = self.serialise(run_id).await?;
        let run = self.agents_run(agent, run_id).await?;
        agent_may(AgentAct::ProposePivot, run.status)?;
        let run_move = (run.status == RunStatus::Running)
            .then_some((RunStatus::Running, RunStatus::AwaitingApproval));
        if summary.trim().is_empty() {
            return Err(Refusal::InvalidPlan(
                "the pivot needs a summary for the approver".into(),
            ));
        }
        if commit.is_empty() {
            return Err(Refusal::InvalidPlan("the commit plan is empty".into()));
        }
        self.ensure_earlier_steps_settled(run_id).await?;
        let mut planned = Vec::with_capacity(commit.len());
        for (i, call) in commit.iter().enumerate() {
            let step = run.next_step + i as i64;
            planned.push(self.planned_call(
                run_id,
                step,
                &format!("commit step {}", i + 1),
                call,
            )?);
        }
        let approvers_needed = self.approvers_needed(&planned);
        let plan = PivotPlan {
            first_step: run.next_step,
            commit: planned,
            edits: Vec::new(),
        }
        .to_value();
        let holds_lapse = self
            .store()
            .steps(run_id)
            .await?
            .iter()
            .filter(|s| s.tool_class == ToolClass::Reversible && s.status == StepStatus::Confirmed)
            .map(|s| s.created_at + AUTHORISATION_LIFETIME)
            .min();
        // The tools file's deadline, unless the holds lapse first.
        let expires_at = [
            holds_lapse,
            self.deadline_of(commit.iter().map(|c| c.tool.as_str())),
        ]
        .into_iter()
        .flatten()
        .min();
        let approval = self
            .store()
            .request_approval(
                NewApproval {
                    run_id,
                    kind: ApprovalKind::Pivot,
                    step_idx: None,
                    summary: summary.to_owned(),
                    digest: plan_digest(&plan),
                    plan,
                    expires_at,
                    approvers_needed,
                },
                run_move,
                &Actor::Agent(agent.to_owned()),
            )
            .await?;
        Ok(approval)
    }

    /// Checks that an approval a person is deciding belongs to the run
    /// whose page they decide it on: another run's approval id (even with
    /// its right digest) is refused as not found.
    pub async fn approval_of_run(
        &self,
        run_id: Uuid,
        approval_id: i64,
    ) -> Result<Approval, Refusal> {
        self.store()
            .approval(approval_id)
            .await?
            .filter(|a| a.run_id == run_id)
            .ok_or_else(|| {
                Refusal::Store(StoreError::NotFound {
                    what: format!("approval {approval_id} of run {run_id}"),
                })
            })
    }

    /// A person's decision on a pivot. Approve commits; reject (or a pivot
    /// past its deadline) unwinds the staged steps.
    pub async fn decide_pivot(
        &self,
        approval_id: i64,
        digest: &str,
        approve: bool,
        person: &Actor,
        via: Via,
    ) -> Result<Run, Refusal> {
        self.decide_pivot_because(approval_id, digest, approve, person, via, None)
            .await
    }

    /// As [`Engine::decide_pivot`], with the person's reason, which the
    /// approval's note (what the agent is told) and the audit line keep.
    pub async fn decide_pivot_because(
        &self,
        approval_id: i64,
        digest: &str,
        approve: bool,
        person: &Actor,
        via: Via,
        reason: Option<&str>,
    ) -> Result<Run, Refusal> {
        let reason = reason.map(str::trim).filter(|r| !r.is_empty());
        let noted = |via: Via| match (via.note(), reason) {
            (Some(note), Some(reason)) => Some(format!("{note}: {reason}")),
            (None, Some(reason)) => Some(reason.to_owned()),
            (note, None) => note,
        };
        let approval = self.pivot_approval(approval_id).await?;
        let run_id = approval.run_id;
        let expired = approval.status == ApprovalStatus::Pending
            && approval
                .expires_at
                .is_some_and(|at| at <= chrono::Utc::now());
        let (to, run_to, note) = if expired {
            (
                ApprovalStatus::Expired,
                RunStatus::Rejected,
                Some("past its deadline: nobody decided".to_owned()),
            )
        } else if approve {
            (ApprovalStatus::Approved, RunStatus::Committing, noted(via))
        } else {
            (ApprovalStatus::Rejected, RunStatus::Rejected, noted(via))
        };
        {
            let _serialised = self.serialise(run_id).await?;
            self.store()
                .decide_approval(
                    Decision {
                        approval_id,
                        digest: digest.to_owned(),
                        to,
                        note,
                        run_move: Some((RunStatus::AwaitingApproval, run_to)),
                    },
                    person,
                )
                .await?;
        }
        if to == ApprovalStatus::Approved {
            crate::failpoint::hit("pivot.after_approval");
        }
        if to == ApprovalStatus::Expired {
            self.observer().approval_expired(ApprovalKind::Pivot);
        }
        // A replayed decision finds the first one's outcome and carries on
        // from wherever the run is.
        let run = self
            .store()
            .run(run_id)
            .await?
            .ok_or(Refusal::RunNotFound)?;
        match run.status {
            RunStatus::Committing => self.commit(run_id).await,
            RunStatus::Rejected | RunStatus::Unwinding => {
                self.unwind(run_id, person, "the pivot was rejected").await
            }
            _ => Ok(run),
        }
    }

    /// Runs the approved commit steps in order, each through the log with
    /// its own key. Safe to call again after a crash: logged steps are
    /// reconciled, not re-sent blindly.
    pub async fn commit(&self, run_id: Uuid) -> Result<Run, Refusal> {
        let _serialised = self.serialise(run_id).await?;
        let run = self
            .store()
            .run(run_id)
            .await?
            .ok_or(Refusal::RunNotFound)?;
        if run.status != RunStatus::Committing {
            return Ok(run);
        }
        let plan = self.pivot_plan(&run).await?;
        for call in &plan.commit {
            let (idx, tool) = (call.step, call.tool.as_str());
            let mut step = match self.store().step(run_id, idx).await? {
                Some(step) => step,
                None => {
                    let spec = self.spec(tool)?;
                    let key = step_key(run_id, idx, tool);
                    // Approved by a person: counted against the limits,
                    // never held by them.
                    let limits = self
                        .registry()
                        .limits()
                        .charges(tool, spec.money.as_ref(), &call.args, run_id, &run.agent)
                        .map(|charges| charges.step.counted_only())
                        .unwrap_or_default();
                    crate::failpoint::hit("dispatch.before_intent");
                    let logged = self
                        .store()
                        .record_step(
                            NewStep {
                                run_id,
                                step_idx: idx,
                                tool: tool.to_owned(),
                                tool_class: spec.class,
                                idempotency_key: key,
                                args: call.args.clone(),
                                status: StepStatus::Intended,
                                compensation: call.way_back.clone().filter(|v| !v.is_null()),
                                audience: spec.audience_for(&call.args),
                                phase: Phase::AfterPivot,
                                limits,
                            },
                            &Actor::System,
                        )
                        .await?;
                    self.execute_logged(logged, &Actor::System).await?
                }
            };
            let mut attempts = 1;
            let mut resends = self.resends();
            while !matches!(step.status, StepStatus::Confirmed | StepStatus::Compensated) {
                let question = match step.status {
                    StepStatus::Failed => Some(format!(
                        "commit step {idx} ({tool}) failed: {}. The commit waits for a person",
                        step.error.clone().unwrap_or_default()
                    )),
                    // Refused for now: sent again only after a pause
                    // (saga::resend).
                    StepStatus::NotExecuted => self
                        .pause_before_resend(&step.idempotency_key, &mut resends)
                        .await
                        .err()
                        .map(|why| {
                            format!(
                                "commit step {idx} ({tool}) {why} ({})",
                                step.error.clone().unwrap_or_default()
                            )
                        }),
                    // Re-sends stop above; lookups stop here.
                    _ if attempts >= SENDS => Some(format!(
                        "commit step {idx} ({tool}) is still {} after {attempts} attempts",
                        step.status
                    )),
                    _ => None,
                };
                if let Some(question) = question {
                    return self.needs_attention(run_id, &question).await;
                }
                attempts += 1;
                step = self.settle_existing(step).await?;
                if step.status == StepStatus::Unknown && !self.has_lookup(tool)? {
                    // A person was asked; the commit resumes after the answer.
                    return self.store().run(run_id).await?.ok_or(Refusal::RunNotFound);
                }
            }
            crate::failpoint::hit("pivot.between_commit_steps");
        }
        Ok(self
            .store()
            .move_run(
                run_id,
                RunStatus::Committing,
                RunStatus::Completed,
                &Actor::System,
                Some("every commit step confirmed"),
            )
            .await?)
    }

    /// The pivot approval `approval_id`; a missing one, or a held step's,
    /// is not found.
    async fn pivot_approval(&self, approval_id: i64) -> Result<Approval, Refusal> {
        Ok(self
            .store()
            .approval(approval_id)
            .await?
            .filter(|a| a.kind == ApprovalKind::Pivot)
            .ok_or_else(|| StoreError::NotFound {
                what: format!("pivot approval {approval_id}"),
            })?)
    }

    /// One commit step as the plan records it: the call, its class,
    /// audience and reach, and its way back built under the step's own key.
    /// `label` names the step in a refusal ("commit step 2").
    fn planned_call(
        &self,
        run_id: Uuid,
        step: i64,
        label: &str,
        call: &PlannedCall,
    ) -> Result<CommitCall, Refusal> {
        let spec = self.spec(&call.tool)?;
        if spec.way_back_only {
            return Err(Refusal::WayBackOnly(call.tool.clone()));
        }
        if spec.class == ToolClass::Pure {
            return Err(Refusal::InvalidPlan(format!(
                "{label} ({}) is pure: call it directly, it needs no approval",
                call.tool
            )));
        }
        self.check_args(&call.tool, &call.args)
            .map_err(|refusal| Refusal::InvalidPlan(format!("{label} ({refusal})")))?;
        let key = step_key(run_id, step, &call.tool);
        let way_back = spec
            .way_back(&key, &call.args)
            .map_err(|reason| Refusal::InvalidPlan(format!("{label} ({}): {reason}", call.tool)))?;
        Ok(CommitCall {
            step,
            tool: call.tool.clone(),
            args: call.args.clone(),
            class: spec.class,
            audience: spec.audience_for(&call.args),
            gated: spec.gated,
            reach: reach(&spec.connector, &call.args),
            way_back,
        })
    }

    /// How many different people must approve a plan: two when any of its
    /// calls falls under the two-person rule.
    fn approvers_needed(&self, planned: &[CommitCall]) -> i64 {
        let policy = self.registry().approval_policy();
        planned
            .iter()
            .filter_map(|call| Some((self.spec(&call.tool).ok()?, &call.args)))
            .map(|(spec, args)| policy.approvers_for(spec, args))
            .fold(1, i64::max)
    }

    /// An approver's edit of one commit step's arguments before they
    /// decide. The new arguments must fit the tool's schema; the step's way
    /// back, audience and reach are rebuilt from them; the plan gets a new
    /// digest, so a decision (or a Slack button) bound to the old plan is
    /// refused, and a first approval under the two-person rule no longer
    /// counts. The plan keeps each edit (`edits`: before, after, who, when)
    /// for the audit trail and the agent's answer.
    pub async fn edit_pivot(
        &self,
        approval_id: i64,
        digest: &str,
        step: i64,
        args: Value,
        person: &Actor,
    ) -> Result<Approval, Refusal> {
        let approval = self.pivot_approval(approval_id).await?;
        let _serialised = self.serialise(approval.run_id).await?;
        if approval.status != ApprovalStatus::Pending {
            return Err(StoreError::Invalid(format!(
                "the pivot is {}: only a waiting plan can be edited",
                approval.status.as_str().to_lowercase()
            ))
            .into());
        }
        if approval.digest != digest {
            return Err(StoreError::PlanChanged.into());
        }
        let mut plan = PivotPlan::read(&approval.plan)
            .map_err(|why| StoreError::Corrupt(format!("pivot {approval_id}: {why}")))?;
        let Some(at) = plan.commit.iter().position(|c| c.step == step) else {
            return Err(Refusal::InvalidPlan(format!("the plan has no step {step}")));
        };
        let before = plan.commit[at].args.clone();
        if before == args {
            return Err(Refusal::InvalidPlan(format!(
                "step {step}: the arguments are unchanged, nothing to edit"
            )));
        }
        let call = PlannedCall {
            tool: plan.commit[at].tool.clone(),
            args,
        };
        plan.commit[at] =
            self.planned_call(approval.run_id, step, &format!("step {step}"), &call)?;
        let approvers_needed = self.approvers_needed(&plan.commit);
        let edit = PlanEdit::new(step, &call.tool, before, call.args, person);
        let line = edit.line();
        plan.edits.push(edit);
        let plan = plan.to_value();
        Ok(self
            .store()
            .edit_plan(
                PlanChange {
                    approval_id,
                    digest_before: digest.to_owned(),
                    digest: plan_digest(&plan),
                    plan,
                    approvers_needed,
                    detail: line,
                },
                person,
            )
            .await?)
    }

    /// The approved plan of the run's pivot.
    pub(crate) async fn pivot_plan(&self, run: &Run) -> Result<PivotPlan, Refusal> {
        let id = run.pivot_approval_id.ok_or_else(|| corrupt_plan(run))?;
        let approval = self
            .store()
            .approval(id)
            .await?
            .ok_or_else(|| corrupt_plan(run))?;
        PivotPlan::read(&approval.plan).map_err(|_| corrupt_plan(run))
    }
}

/// What a commit step reaches, for the pivot panel: its channel and how
/// many recipients its arguments name.
fn reach(connector: &str, args: &Value) -> Reach {
    let recipients = ["to", "recipients", "emails", "channel_members"]
        .iter()
        .filter_map(|field| args.get(*field))
        .map(|v| v.as_array().map_or(1, Vec::len))
        .sum::<usize>();
    Reach {
        channel: connector.to_owned(),
        recipients,
    }
}

fn corrupt_plan(run: &Run) -> Refusal {
    Refusal::Store(StoreError::Corrupt(format!(
        "run {} has no readable pivot plan",
        run.id
    )))
}
