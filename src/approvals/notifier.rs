//! Posts each waiting approval to Slack once, and rewrites the message as
//! the approval moves. A post is kept like a step: its row and key are
//! written first; a post whose answer was lost is looked up by its key
//! before it is sent again; the run's lease is held while posting, so two
//! instances never post the same approval.

use super::message::{render, Facts, Shown};
use super::SlackApprovals;
use crate::saga::connector::{classify, Classified, Connector, Lookup};
use crate::saga::engine::{Engine, Refusal};
use crate::saga::key::notice_key;
use crate::saga::model::{
    Actor, Approval, ApprovalKind, NewNotice, Notice, NoticePlace, NoticeStatus, PivotPlan,
};
use crate::saga::registry::Registry;
use crate::saga::status::{ApprovalStatus, StepStatus};
use crate::saga::words::CallInWords;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const POST: &str = "slack.post";
/// How often waiting and recently decided approvals are looked at.
const EVERY: Duration = Duration::from_millis(500);
/// After Slack could not be reached, how long before trying again.
const RETRY_AFTER: chrono::Duration = chrono::Duration::seconds(5);

pub struct Notifier {
    pub slack: Arc<SlackApprovals>,
    pub engine: Arc<Engine>,
    pub registry: Arc<Registry>,
}

impl Notifier {
    /// Works until the task is dropped; a failed round is logged and the
    /// next one starts from the log again.
    pub async fn run(self) {
        let mut every = tokio::time::interval(EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = self.slack.nudged.notified() => {}
            }
            if let Err(err) = self.round().await {
                tracing::warn!(%err, "posting approvals to Slack");
            }
        }
    }

    /// One pass: a notice for every approval that waits without one, then
    /// every notice not yet showing its approval's final outcome.
    pub async fn round(&self) -> Result<(), Refusal> {
        let store = self.engine.store();
        for approval in store.approvals_without_notice().await? {
            store
                .record_notice(NewNotice {
                    approval_id: approval.id,
                    run_id: approval.run_id,
                    place: NoticePlace::Primary,
                    idempotency_key: notice_key(approval.run_id, approval.id, NoticePlace::Primary),
                    channel: self.slack.channel.clone(),
                })
                .await?;
        }
        let now = chrono::Utc::now();
        self.escalate(now).await?;
        for notice in store.open_notices().await? {
            let resting = notice.error.is_some() && notice.updated_at + RETRY_AFTER > now;
            if resting {
                continue;
            }
            let worked = match notice.status {
                NoticeStatus::Intended | NoticeStatus::Unknown => self.post(notice).await,
                NoticeStatus::Posted => self.refresh(notice).await,
                NoticeStatus::Failed => Ok(()),
            };
            if let Err(err) = worked {
                tracing::warn!(%err, "a Slack approval message");
            }
        }
        Ok(())
    }

    /// Approvals nobody decided within `[approvals] escalate_after` are
    /// posted again to the escalation channel, once.
    async fn escalate(&self, now: chrono::DateTime<chrono::Utc>) -> Result<(), Refusal> {
        let policy = self.registry.approval_policy();
        let (Some(after), Some(channel)) = (policy.escalate_after, &self.slack.escalate_channel)
        else {
            return Ok(());
        };
        let after = chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
        let store = self.engine.store();
        for approval in store.pending_approvals().await? {
            if approval.created_at + after > now {
                continue;
            }
            let notices = store.notices(approval.id).await?;
            if notices.iter().any(|n| n.place == NoticePlace::Escalation) {
                continue;
            }
            store
                .record_notice(NewNotice {
                    approval_id: approval.id,
                    run_id: approval.run_id,
                    place: NoticePlace::Escalation,
                    idempotency_key: notice_key(
                        approval.run_id,
                        approval.id,
                        NoticePlace::Escalation,
                    ),
                    channel: channel.clone(),
                })
                .await?;
            store
                .note(
                    approval.run_id,
                    &Actor::System,
                    &format!(
                        "approval {} escalated to {channel}: nobody had decided within {}",
                        approval.id,
                        humantime::format_duration(policy.escalate_after.unwrap_or_default())
                    ),
                )
                .await?;
        }
        Ok(())
    }

    async fn post(&self, notice: Notice) -> Result<(), Refusal> {
        let store = self.engine.store();
        let _serialised = self.engine.serialise(notice.run_id).await?;
        // Another instance may have posted it while this one waited.
        let Some(mut notice) = store
            .notices(notice.approval_id)
            .await?
            .into_iter()
            .find(|n| n.place == notice.place)
        else {
            return Ok(());
        };
        if !matches!(
            notice.status,
            NoticeStatus::Intended | NoticeStatus::Unknown
        ) {
            return Ok(());
        }
        let Some(shown) = self.shown(&notice).await? else {
            return Ok(());
        };
        let args = post_args(&notice.channel, &shown);
        let key = notice.idempotency_key.clone();
        // A post whose answer was lost (a crash, a timeout) may be there:
        // look before posting again.
        match self.slack.slack.lookup(POST, &key, &args).await {
            Ok(Lookup::FoundSucceeded { external_ref, .. }) => {
                notice.status = NoticeStatus::Posted;
                notice.message_ref = Some(external_ref);
                // What it shows is not known: the next round rewrites it.
                notice.shown = None;
                notice.error = None;
                return Ok(store.save_notice(&notice).await?);
            }
            Ok(Lookup::NotFound | Lookup::FoundFailed { .. }) => {}
            Err(err) => {
                return self
                    .rest(notice, format!("looking for the post: {err}"))
                    .await
            }
        }
        let report = self.slack.slack.execute(POST, &key, &args).await;
        match classify(&report, |body| self.slack.slack.external_ref(POST, body)) {
            Classified::Confirmed { external_ref, .. } => {
                notice.status = NoticeStatus::Posted;
                notice.message_ref = Some(external_ref);
                notice.shown = Some(shown.digest);
                notice.done = shown.last;
                notice.error = None;
                store.save_notice(&notice).await?;
            }
            Classified::Unknown { reason } => {
                notice.status = NoticeStatus::Unknown;
                return self.rest(notice, reason).await;
            }
            Classified::NotExecuted { reason } => return self.rest(notice, reason).await,
            Classified::Failed { error } => {
                tracing::error!(%error, channel = %notice.channel, "Slack refused an approval message");
                store
                    .note(
                        notice.run_id,
                        &Actor::System,
                        &format!(
                            "the approval could not be posted to Slack ({}): {error}; it waits on the dashboard",
                            notice.channel
                        ),
                    )
                    .await?;
                notice.status = NoticeStatus::Failed;
                notice.done = true;
                notice.error = Some(error);
                store.save_notice(&notice).await?;
            }
        }
        Ok(())
    }

    /// Rewrites a posted message when what it should say has changed.
    async fn refresh(&self, mut notice: Notice) -> Result<(), Refusal> {
        let Some(shown) = self.shown(&notice).await? else {
            return Ok(());
        };
        if notice.shown.as_deref() != Some(shown.digest.as_str()) {
            let Some(message_ref) = notice.message_ref.clone() else {
                return Ok(());
            };
            if let Err(err) = self
                .slack
                .slack
                .update(&message_ref, &shown.text, &shown.blocks)
                .await
            {
                return self.rest(notice, err).await;
            }
            notice.shown = Some(shown.digest);
        } else if !shown.last {
            return Ok(());
        }
        notice.done = shown.last;
        notice.error = None;
        Ok(self.engine.store().save_notice(&notice).await?)
    }

    /// Keeps a notice as it is, with why it did not move, for a later round.
    async fn rest(&self, mut notice: Notice, why: String) -> Result<(), Refusal> {
        tracing::warn!(why = %why, approval = notice.approval_id, "a Slack approval message waits");
        notice.error = Some(why);
        Ok(self.engine.store().save_notice(&notice).await?)
    }

    /// A notice's message as it should read now.
    async fn shown(&self, notice: &Notice) -> Result<Option<Shown>, Refusal> {
        let store = self.engine.store();
        let Some(approval) = store.approval(notice.approval_id).await? else {
            return Ok(None);
        };
        let Some(run) = store.run(approval.run_id).await? else {
            return Ok(None);
        };
        let calls = self.calls(&approval).await?;
        let outcome = self.outcome(&approval, &run).await?;
        let over_limits = self.engine.pivot_over_limits(&run, &approval).await?;
        Ok(Some(render(&Facts {
            approval: &approval,
            run: &run,
            calls,
            outcome,
            run_url: self.slack.run_url(run.id),
            escalated: notice.place == NoticePlace::Escalation,
            over_limits,
        })))
    }

    /// The calls an approval approves, in the dashboard's words.
    async fn calls(&self, approval: &Approval) -> Result<Vec<CallInWords>, Refusal> {
        Ok(match approval.kind {
            ApprovalKind::Pivot => PivotPlan::read(&approval.plan)
                .map(|plan| plan.commit)
                .unwrap_or_default()
                .iter()
                .map(|call| {
                    self.registry
                        .in_words(&call.tool, &call.args, call.way_back.as_ref())
                })
                .collect(),
            ApprovalKind::Step => {
                let step = match approval.step_idx {
                    Some(idx) => self.engine.store().step(approval.run_id, idx).await?,
                    None => None,
                };
                let way_back = step.as_ref().and_then(|s| s.compensation.clone());
                vec![self.registry.in_words(
                    approval.plan["tool"].as_str().unwrap_or_default(),
                    &approval.plan["args"],
                    way_back.as_ref(),
                )]
            }
        })
    }

    /// What came of a decision, once it was made.
    async fn outcome(
        &self,
        approval: &Approval,
        run: &crate::saga::model::Run,
    ) -> Result<Option<String>, Refusal> {
        if matches!(
            approval.status,
            ApprovalStatus::Pending | ApprovalStatus::Superseded
        ) {
            return Ok(None);
        }
        let run_is = format!("the run is {}", words_of(run.status.as_str()));
        let steps = self.engine.store().steps(run.id).await?;
        Ok(Some(match (approval.kind, approval.status) {
            (ApprovalKind::Pivot, ApprovalStatus::Approved) => {
                let planned: Vec<i64> = PivotPlan::read(&approval.plan)
                    .map(|plan| plan.commit.iter().map(|call| call.step).collect())
                    .unwrap_or_default();
                let confirmed = steps
                    .iter()
                    .filter(|s| planned.contains(&s.step_idx) && s.status == StepStatus::Confirmed)
                    .count();
                format!(
                    "Commit: {confirmed} of {} steps confirmed; {run_is}.",
                    planned.len()
                )
            }
            (ApprovalKind::Step, _) => {
                let status = steps
                    .iter()
                    .find(|s| Some(s.step_idx) == approval.step_idx)
                    .map(|s| words_of(s.status.as_str()))
                    .unwrap_or_else(|| "not logged".to_owned());
                format!("The step is {status}; {run_is}.")
            }
            _ => format!("Nothing was committed; {run_is}."),
        }))
    }
}

/// `AWAITING_APPROVAL` → `awaiting approval`.
fn words_of(status: &str) -> String {
    status.to_lowercase().replace('_', " ")
}

/// What `slack.post` is sent: the message, with its fallback text.
fn post_args(channel: &str, shown: &Shown) -> Value {
    json!({"channel": channel, "text": shown.text, "blocks": shown.blocks})
}
