//! A crash injector: a `SagaStore` that "kills the process" at the Nth
//! saga-log write, either just before it commits or just after. Together
//! with the model world this covers every boundary: before an INTENDED
//! commit, after it but before the call, after the call but before the
//! outcome commit, and the same inside an unwind or a pivot commit.
#![allow(dead_code)]

use async_trait::async_trait;
use saga_harness::saga::class::Role;
use saga_harness::saga::model::*;
use saga_harness::saga::status::{CorrectionStatus, RunStatus};
use saga_harness::saga::store::{Backend, SagaStore, StoreError, StoreResult};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use uuid::Uuid;

pub const CRASH: &str = "injected crash";

pub struct CrashingStore {
    inner: Arc<dyn SagaStore>,
    /// Writes left before the crash; negative when disarmed.
    countdown: AtomicI64,
    /// Crash after the write committed (true) or before it (false).
    after: bool,
    /// How many times a run was claimed and read (the general path).
    pub claims_read: std::sync::atomic::AtomicUsize,
}

impl CrashingStore {
    pub fn new(inner: Arc<dyn SagaStore>, crash_at_write: Option<i64>, after: bool) -> Self {
        CrashingStore {
            inner,
            countdown: AtomicI64::new(crash_at_write.unwrap_or(-1)),
            after,
            claims_read: Default::default(),
        }
    }

    pub fn is_crash(err: &StoreError) -> bool {
        matches!(err, StoreError::Database { context, .. } if context == CRASH)
    }

    /// Runs one write, crashing around it when the countdown reaches it.
    async fn write<T>(
        &self,
        op: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let crash_now = self.countdown.fetch_sub(1, Ordering::SeqCst) == 0;
        if crash_now && !self.after {
            return Err(StoreError::database(CRASH, "the test's crash"));
        }
        let result = op.await;
        if crash_now && result.is_ok() {
            return Err(StoreError::database(CRASH, "the test's crash"));
        }
        result
    }
}

#[async_trait]
impl SagaStore for CrashingStore {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    async fn claim_run(
        &self,
        run_id: Uuid,
    ) -> StoreResult<Box<dyn saga_harness::saga::store::RunClaim>> {
        self.inner.claim_run(run_id).await
    }
    async fn stale_steps(
        &self,
        before: chrono::DateTime<chrono::Utc>,
        statuses: &[RunStatus],
    ) -> StoreResult<Vec<(Uuid, i64)>> {
        self.inner.stale_steps(before, statuses).await
    }
    async fn claim_and_read(
        &self,
        run_id: Uuid,
    ) -> StoreResult<saga_harness::saga::store::ClaimedRun> {
        self.claims_read.fetch_add(1, Ordering::SeqCst);
        self.inner.claim_and_read(run_id).await
    }
    async fn create_run(&self, new: NewRun) -> StoreResult<(Run, bool)> {
        self.inner.create_run(new).await
    }
    async fn run(&self, id: Uuid) -> StoreResult<Option<Run>> {
        self.inner.run(id).await
    }
    async fn finished_runs_before(
        &self,
        status: RunStatus,
        before: chrono::DateTime<chrono::Utc>,
        after: Option<(chrono::DateTime<chrono::Utc>, Uuid)>,
        limit: i64,
    ) -> StoreResult<Vec<Run>> {
        self.inner
            .finished_runs_before(status, before, after, limit)
            .await
    }
    async fn histories(
        &self,
        runs: Vec<Run>,
    ) -> StoreResult<Vec<saga_harness::saga::retention::RunHistory>> {
        self.inner.histories(runs).await
    }
    async fn remove_runs(
        &self,
        runs: &[(Uuid, chrono::DateTime<chrono::Utc>)],
    ) -> StoreResult<(Vec<Uuid>, saga_harness::saga::retention::Removed)> {
        self.write(self.inner.remove_runs(runs)).await
    }
    async fn list_runs(&self, limit: i64) -> StoreResult<Vec<Run>> {
        self.inner.list_runs(limit).await
    }
    async fn runs_with_status(&self, statuses: &[RunStatus]) -> StoreResult<Vec<Run>> {
        self.inner.runs_with_status(statuses).await
    }
    async fn move_run(
        &self,
        id: Uuid,
        from: RunStatus,
        to: RunStatus,
        actor: &Actor,
        detail: Option<&str>,
    ) -> StoreResult<Run> {
        self.write(self.inner.move_run(id, from, to, actor, detail))
            .await
    }
    async fn claim_and_record_step(
        &self,
        bearer: Bearer<'_>,
        new: NewStep,
        actor: &Actor,
    ) -> StoreResult<Option<(Box<dyn saga_harness::saga::store::RunClaim>, Step)>> {
        self.write(self.inner.claim_and_record_step(bearer, new, actor))
            .await
    }
    async fn settle_step_and_release(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
        claim: &mut dyn saga_harness::saga::store::RunClaim,
    ) -> StoreResult<Step> {
        self.write(
            self.inner
                .settle_step_and_release(run_id, step_idx, outcome, durability, actor, claim),
        )
        .await
    }
    async fn record_step(&self, new: NewStep, actor: &Actor) -> StoreResult<Step> {
        self.write(self.inner.record_step(new, actor)).await
    }
    async fn record_held_step(
        &self,
        new: NewStep,
        approval: NewApproval,
        actor: &Actor,
    ) -> StoreResult<(Step, Approval)> {
        self.write(self.inner.record_held_step(new, approval, actor))
            .await
    }
    async fn settle_step(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Step> {
        self.write(
            self.inner
                .settle_step(run_id, step_idx, outcome, durability, actor),
        )
        .await
    }
    async fn audit_page(
        &self,
        people_only: bool,
        before_id: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<saga_harness::saga::model::Event>> {
        self.inner.audit_page(people_only, before_id, limit).await
    }
    async fn remove_user(&self, username: &str) -> StoreResult<saga_harness::saga::model::User> {
        self.inner.remove_user(username).await
    }
    async fn set_role(
        &self,
        username: &str,
        role: saga_harness::saga::class::Role,
    ) -> StoreResult<saga_harness::saga::model::User> {
        self.inner.set_role(username, role).await
    }
    async fn set_group(
        &self,
        username: &str,
        group: &str,
        member: bool,
    ) -> StoreResult<saga_harness::saga::model::User> {
        self.inner.set_group(username, group, member).await
    }
    async fn revoke_tokens(&self, agent: &str) -> StoreResult<u64> {
        self.inner.revoke_tokens(agent).await
    }
    async fn set_owed_to_agent(&self, run_id: Uuid, step_idx: i64, owed: bool) -> StoreResult<()> {
        self.write(self.inner.set_owed_to_agent(run_id, step_idx, owed))
            .await
    }
    async fn note(&self, run_id: Uuid, actor: &Actor, detail: &str) -> StoreResult<()> {
        self.write(self.inner.note(run_id, actor, detail)).await
    }
    async fn step(&self, run_id: Uuid, step_idx: i64) -> StoreResult<Option<Step>> {
        self.inner.step(run_id, step_idx).await
    }
    async fn steps(&self, run_id: Uuid) -> StoreResult<Vec<Step>> {
        self.inner.steps(run_id).await
    }
    async fn limit_usage(&self, scopes: &[(String, Option<i64>)]) -> StoreResult<Vec<i64>> {
        self.inner.limit_usage(scopes).await
    }
    async fn limit_peaks(&self, limits: &[(String, Option<i64>)]) -> StoreResult<Vec<i64>> {
        self.inner.limit_peaks(limits).await
    }
    async fn unsettled_steps(&self, run_id: Uuid) -> StoreResult<Vec<Step>> {
        self.inner.unsettled_steps(run_id).await
    }
    async fn step_by_key(&self, key: &str) -> StoreResult<Option<Step>> {
        self.inner.step_by_key(key).await
    }
    async fn record_compensation(
        &self,
        new: NewCompensation,
        actor: &Actor,
    ) -> StoreResult<Compensation> {
        self.write(self.inner.record_compensation(new, actor)).await
    }
    async fn settle_compensation(
        &self,
        run_id: Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Compensation> {
        self.write(
            self.inner
                .settle_compensation(run_id, step_idx, outcome, durability, actor),
        )
        .await
    }
    async fn compensations(&self, run_id: Uuid) -> StoreResult<Vec<Compensation>> {
        self.inner.compensations(run_id).await
    }
    async fn request_approval(
        &self,
        new: NewApproval,
        run_move: Option<(RunStatus, RunStatus)>,
        actor: &Actor,
    ) -> StoreResult<Approval> {
        self.write(self.inner.request_approval(new, run_move, actor))
            .await
    }
    async fn edit_plan(&self, change: PlanChange, actor: &Actor) -> StoreResult<Approval> {
        self.write(self.inner.edit_plan(change, actor)).await
    }
    async fn decide_approval(&self, decision: Decision, actor: &Actor) -> StoreResult<Approval> {
        self.write(self.inner.decide_approval(decision, actor))
            .await
    }
    async fn approval(&self, id: i64) -> StoreResult<Option<Approval>> {
        self.inner.approval(id).await
    }
    async fn approvals(&self, run_id: Uuid) -> StoreResult<Vec<Approval>> {
        self.inner.approvals(run_id).await
    }
    async fn pending_approvals(&self) -> StoreResult<Vec<Approval>> {
        self.inner.pending_approvals().await
    }
    async fn approvals_without_notice(&self) -> StoreResult<Vec<Approval>> {
        self.inner.approvals_without_notice().await
    }
    async fn record_notice(&self, new: NewNotice) -> StoreResult<Notice> {
        self.write(self.inner.record_notice(new)).await
    }
    async fn save_notice(&self, notice: &Notice) -> StoreResult<()> {
        self.write(self.inner.save_notice(notice)).await
    }
    async fn open_notices(&self) -> StoreResult<Vec<Notice>> {
        self.inner.open_notices().await
    }
    async fn notices(&self, approval_id: i64) -> StoreResult<Vec<Notice>> {
        self.inner.notices(approval_id).await
    }
    async fn first_sighting(
        &self,
        signature: &str,
        now: chrono::DateTime<chrono::Utc>,
        forget_before: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<bool> {
        self.write(self.inner.first_sighting(signature, now, forget_before))
            .await
    }
    async fn queue_correction(&self, new: NewCorrection, actor: &Actor) -> StoreResult<Correction> {
        self.write(self.inner.queue_correction(new, actor)).await
    }
    async fn edit_correction(
        &self,
        id: i64,
        message: &str,
        actor: &Actor,
    ) -> StoreResult<Correction> {
        self.write(self.inner.edit_correction(id, message, actor))
            .await
    }
    async fn move_correction(
        &self,
        id: i64,
        from: CorrectionStatus,
        to: CorrectionStatus,
        reason: Option<&str>,
        actor: &Actor,
    ) -> StoreResult<Correction> {
        self.write(self.inner.move_correction(id, from, to, reason, actor))
            .await
    }
    async fn settle_correction_send(
        &self,
        id: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Correction> {
        self.write(
            self.inner
                .settle_correction_send(id, outcome, durability, actor),
        )
        .await
    }
    async fn correction(&self, id: i64) -> StoreResult<Option<Correction>> {
        self.inner.correction(id).await
    }
    async fn corrections(&self, run_id: Uuid) -> StoreResult<Vec<Correction>> {
        self.inner.corrections(run_id).await
    }
    async fn correction_queue(&self) -> StoreResult<Vec<Correction>> {
        self.inner.correction_queue().await
    }
    async fn correction_inbox(&self) -> StoreResult<Vec<QueuedCorrection>> {
        self.inner.correction_inbox().await
    }
    async fn events(&self, run_id: Option<Uuid>, limit: i64) -> StoreResult<Vec<Event>> {
        self.inner.events(run_id, limit).await
    }
    async fn events_after(
        &self,
        run_id: Uuid,
        after_id: i64,
        limit: i64,
    ) -> StoreResult<Vec<Event>> {
        self.inner.events_after(run_id, after_id, limit).await
    }
    async fn runs_page(
        &self,
        status: Option<RunStatus>,
        search: &str,
        offset: i64,
        limit: i64,
    ) -> StoreResult<saga_harness::saga::store::RunsPage> {
        self.inner.runs_page(status, search, offset, limit).await
    }
    async fn steps_of_runs(&self, runs: &[Uuid], tools: &[&str]) -> StoreResult<Vec<Step>> {
        self.inner.steps_of_runs(runs, tools).await
    }
    async fn unwind_reasons(
        &self,
        runs: &[Uuid],
    ) -> StoreResult<std::collections::HashMap<Uuid, Event>> {
        self.inner.unwind_reasons(runs).await
    }
    async fn recent_events(&self, limit: i64) -> StoreResult<Vec<Event>> {
        self.inner.recent_events(limit).await
    }
    async fn all_events_after(&self, after_id: i64, limit: i64) -> StoreResult<Vec<Event>> {
        self.inner.all_events_after(after_id, limit).await
    }
    async fn add_user(&self, username: &str, password_hash: &str, role: Role) -> StoreResult<User> {
        self.inner.add_user(username, password_hash, role).await
    }
    async fn credentials(&self, username: &str) -> StoreResult<Option<Credentials>> {
        self.inner.credentials(username).await
    }
    async fn add_api_token(
        &self,
        agent: &str,
        token_hash: &str,
        label: Option<&str>,
    ) -> StoreResult<ApiToken> {
        self.inner.add_api_token(agent, token_hash, label).await
    }
    async fn agent_for_token(&self, token_hash: &str) -> StoreResult<Option<String>> {
        self.inner.agent_for_token(token_hash).await
    }
}
