//! People's decisions on what the engine asked them: an answer to "did
//! this happen?" (R7), a held step approved or rejected by its digest,
//! and a held step whose deadline passed.

use super::engine::Engine;
use super::model::*;
use super::observe::Settlement;
use super::refusal::Refusal;
use super::status::{ApprovalStatus, RunStatus, StepStatus};
use super::store::StoreError;
use uuid::Uuid;

impl Engine {
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
        Ok(self
            .settle_step(
                approval.run_id,
                step_idx,
                Outcome {
                    error: Some(
                        "expired: nobody decided before the deadline, so it was not sent; nobody \
                     rejected it"
                            .to_owned(),
                    ),
                    ..Outcome::moving(StepStatus::AwaitingApproval, StepStatus::Rejected)
                },
                Durability::Durable,
                &Actor::System,
            )
            .await?)
    }
}
