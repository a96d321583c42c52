//! Resume at start-up (R11): the log, never a transcript, says what to do.
//! Reconciles every unsettled row, finishes decisions a crash interrupted,
//! continues COMMITTING and UNWINDING runs (and REJECTED ones whose unwind
//! had not begun), and expires pivots left pending past their deadline.
//! Running it twice is harmless.

use super::class::Phase;
use super::engine::{Engine, Refusal};
use super::model::*;
use super::status::{ApprovalStatus, RunStatus, StepStatus};

/// What one resume pass did, for the log and the tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResumeReport {
    pub reconciled: usize,
    pub committed: usize,
    pub unwound: usize,
    pub expired_approvals: usize,
    /// Runs left waiting for a person.
    pub needs_attention: usize,
    /// Runs another live instance was working on, left to it.
    pub busy: usize,
}

impl Engine {
    /// Ends every approval left pending past its deadline as expired (the
    /// tools file's, or a pivot's authorisations' lapse, §4): a pivot's
    /// staged steps unwind, a held step is never sent. The server runs
    /// this every second as well as at start-up.
    pub async fn expire_approvals(&self) -> Result<usize, Refusal> {
        let now = chrono::Utc::now();
        let mut expired = 0;
        for approval in self.store().pending_approvals().await? {
            if approval.kind == ApprovalKind::Step
                && approval.expires_at.is_some_and(|at| at <= now)
            {
                self.expire_step(&approval).await?;
                expired += 1;
            } else if approval.kind == ApprovalKind::Pivot
                && approval.expires_at.is_some_and(|at| at <= now)
            {
                self.decide_pivot(
                    approval.id,
                    &approval.digest,
                    false,
                    &Actor::System,
                    Via::Harness,
                )
                .await?;
                expired += 1;
            }
        }
        Ok(expired)
    }

    /// R7 while the server runs: steps left UNKNOWN (or INTENDED with no
    /// call in flight) for longer than `min_age` are looked up in the real
    /// system, so an unknown settles even when the agent never comes back.
    /// Each run is worked under its claim, so a sweep never races a call on
    /// the same run, nor another instance's sweep. Returns how many steps
    /// it settled.
    pub async fn reconcile_stale(&self, min_age: chrono::Duration) -> Result<usize, Refusal> {
        let now = chrono::Utc::now();
        let live = [
            RunStatus::Running,
            RunStatus::Committing,
            RunStatus::Unwinding,
        ];
        // In run order, so each run is claimed once for all its stale steps.
        let mut by_run: Vec<(uuid::Uuid, Vec<i64>)> = Vec::new();
        for (run_id, idx) in self.store().stale_steps(now - min_age, &live).await? {
            match by_run.last_mut() {
                Some((last, steps)) if *last == run_id => steps.push(idx),
                _ => by_run.push((run_id, vec![idx])),
            }
        }
        let mut settled = 0;
        for (run_id, steps) in by_run {
            // A run another instance is working on is that instance's to
            // settle; the next sweep looks again.
            let Some(_serialised) = self.try_serialise(run_id).await? else {
                continue;
            };
            for idx in steps {
                // Read again under the claim: the call in flight, or another
                // instance, may have settled it meanwhile.
                let Some(step) = self.store().step(run_id, idx).await? else {
                    continue;
                };
                if self.reconcile_in_flight(step).await?.status.is_settled() {
                    settled += 1;
                }
            }
        }
        Ok(settled)
    }

    /// Reconciles a step left behind. An agent's step still INTENDED was in
    /// flight when its caller went away (the harness stopped, the client
    /// gave up): the agent never had its outcome, so the step stays owed to
    /// it (R12), and a retry that names no step (an MCP client's) reads it
    /// instead of making a second effect.
    async fn reconcile_in_flight(&self, step: Step) -> Result<Step, Refusal> {
        let unanswered = step.status == StepStatus::Intended
            && step.phase == Phase::BeforePivot
            && !step.owed_to_agent;
        let (run_id, step_idx) = (step.run_id, step.step_idx);
        let mut settled = self.reconcile(step).await?;
        if unanswered {
            self.store()
                .set_owed_to_agent(run_id, step_idx, true)
                .await?;
            settled.owed_to_agent = true;
        }
        Ok(settled)
    }

    pub async fn resume(&self) -> Result<ResumeReport, Refusal> {
        let mut report = ResumeReport {
            expired_approvals: self.expire_approvals().await?,
            ..ResumeReport::default()
        };
        let live = [
            RunStatus::Running,
            RunStatus::Committing,
            RunStatus::Rejected,
            RunStatus::Unwinding,
        ];
        for run in self.store().runs_with_status(&live).await? {
            self.resume_run(run.id, &mut report).await?;
        }
        Ok(report)
    }

    /// Runs left COMMITTING, UNWINDING or REJECTED (a pivot's unwind not yet
    /// begun) by an instance that stopped, once nobody has touched them for
    /// `min_age` and no live instance holds them: the sweep carries them on
    /// while the server runs, not only at the next start.
    pub async fn resume_left_behind(
        &self,
        min_age: chrono::Duration,
    ) -> Result<ResumeReport, Refusal> {
        let before = chrono::Utc::now() - min_age;
        let mut report = ResumeReport::default();
        let left = [
            RunStatus::Committing,
            RunStatus::Rejected,
            RunStatus::Unwinding,
        ];
        for run in self.store().runs_with_status(&left).await? {
            if run.updated_at < before {
                self.resume_run(run.id, &mut report).await?;
            }
        }
        Ok(report)
    }

    /// Resume for one run, under its claim; a run another live instance
    /// holds now is counted as busy and left to it.
    async fn resume_run(
        &self,
        run_id: uuid::Uuid,
        report: &mut ResumeReport,
    ) -> Result<(), Refusal> {
        // Another live instance sharing the database may be working on
        // this run: its in-flight step is not this start-up's to settle.
        let Some(serialised) = self.try_serialise(run_id).await? else {
            report.busy += 1;
            return Ok(());
        };
        let mut decided_steps = Vec::new();
        for step in self.store().steps(run_id).await? {
            match step.status {
                StepStatus::Intended | StepStatus::Unknown => {
                    self.reconcile_in_flight(step).await?;
                    report.reconciled += 1;
                }
                // Decided, but the crash came before the step followed:
                // finish what the person decided (below, under its own
                // claim).
                StepStatus::AwaitingApproval => {
                    let decided = self.store().approvals(run_id).await?.into_iter().find(|a| {
                        a.kind == ApprovalKind::Step
                            && a.step_idx == Some(step.step_idx)
                            && a.status != ApprovalStatus::Pending
                    });
                    decided_steps.extend(decided);
                }
                _ => {}
            }
        }
        drop(serialised);
        for approval in decided_steps {
            let person = approval.decided_by.clone().unwrap_or(Actor::System);
            let approve = approval.status == ApprovalStatus::Approved;
            self.decide_step(
                approval.id,
                &approval.digest,
                approve,
                &person,
                Via::Harness,
            )
            .await?;
        }
        let after = match self.store().run(run_id).await?.map(|r| r.status) {
            Some(RunStatus::Committing) => {
                report.committed += 1;
                self.commit(run_id).await?
            }
            Some(RunStatus::Unwinding) => {
                report.unwound += 1;
                self.continue_unwind(run_id).await?
            }
            // Rejected, and the crash came before the unwind began.
            Some(RunStatus::Rejected) => {
                report.unwound += 1;
                self.unwind(run_id, &Actor::System, "the pivot was rejected")
                    .await?
            }
            _ => return Ok(()),
        };
        if after.status == RunStatus::NeedsAttention {
            report.needs_attention += 1;
        }
        Ok(())
    }
}
