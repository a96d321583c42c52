//! The records the saga log is made of (DESIGN.md §3), in saga terms.
//! Both storage backends read and write exactly these.

use super::class::{Audience, Phase, Role, ToolClass};
use super::status::{ApprovalStatus, CorrectionStatus, RunStatus, StepStatus};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use uuid::Uuid;

/// Who made a change: recorded with every event in the audit trail. Stored
/// and sent as text (`user:lead`, `agent:bot`, `system`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Actor {
    /// An agent, by the name its API token was issued to.
    Agent(String),
    /// A support lead signed in to the dashboard.
    User(String),
    /// The harness itself (resume, reconcile, expiry).
    System,
}

/// What an agent whose token is unknown or revoked is told, wherever the
/// token is found wanting (the API's own check or the intent's statement).
pub const TOKEN_NOT_VALID: &str =
    "this token is not valid; issue one with `saga-harness token create`";

/// The agent a call comes from, as the store's hot path checks it: its
/// name, and the hash of the bearer token the request came with when that
/// token has not been looked up for this request. The step's intent then
/// lands only if, when it commits, the token is still issued to this agent
/// and not revoked: a revocation takes effect at the next call without a
/// lookup of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bearer<'a> {
    pub agent: &'a str,
    pub token_to_check: Option<&'a str>,
}

/// An agent whose token was already checked (or that has none to check).
impl<'a> From<&'a str> for Bearer<'a> {
    fn from(agent: &'a str) -> Self {
        Bearer {
            agent,
            token_to_check: None,
        }
    }
}

impl Actor {
    /// Reads an actor as the log stores it (`user:lead`, `agent:bot`,
    /// `system`); anything else is taken as a person's name.
    pub fn parse(stored: &str) -> Actor {
        if let Some(name) = stored.strip_prefix("user:") {
            Actor::User(name.to_owned())
        } else if let Some(name) = stored.strip_prefix("agent:") {
            Actor::Agent(name.to_owned())
        } else if stored == "system" {
            Actor::System
        } else {
            Actor::User(stored.to_owned())
        }
    }

    /// Who it is, in words: a person's or an agent's name, or the harness.
    pub fn name(&self) -> &str {
        match self {
            Actor::Agent(name) | Actor::User(name) => name,
            Actor::System => "the harness",
        }
    }

    /// Who it is, for a person reading: a person by name, an agent as
    /// "agent <name>", or the harness.
    pub fn described(&self) -> String {
        match self {
            Actor::User(name) => name.clone(),
            Actor::Agent(name) => format!("agent {name}"),
            Actor::System => "the harness".to_owned(),
        }
    }
}

impl From<Actor> for String {
    fn from(actor: Actor) -> String {
        actor.to_string()
    }
}

impl From<String> for Actor {
    fn from(stored: String) -> Actor {
        Actor::parse(&stored)
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Actor::Agent(name) => write!(f, "agent:{name}"),
            Actor::User(name) => write!(f, "user:{name}"),
            Actor::System => f.write_str("system"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewRun {
    pub agent: String,
    /// The client's own name for the run: makes creation idempotent per
    /// agent, and never enters a key (R3).
    pub label: Option<String>,
    pub purpose: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub id: Uuid,
    pub agent: String,
    pub label: Option<String>,
    pub purpose: String,
    pub status: RunStatus,
    /// Where a run in NEEDS_ATTENTION returns once its questions are answered.
    pub resume_to: Option<RunStatus>,
    /// The index the next new non-pure step must name (R3).
    pub next_step: i64,
    /// The pivot request currently in force, if one was proposed.
    pub pivot_approval_id: Option<i64>,
    /// Irreversible steps that ran before the pivot (goal: 0; R9).
    pub irreversible_before_pivot: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A non-pure call about to be written to the log, with everything R6 says
/// must be known before it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewStep {
    pub run_id: Uuid,
    pub step_idx: i64,
    pub tool: String,
    pub tool_class: ToolClass,
    pub idempotency_key: String,
    pub args: Value,
    /// INTENDED (about to be sent) or AWAITING_APPROVAL (held, nothing sent).
    pub status: StepStatus,
    /// The pre-written undo, compensation or correction, referring to the key.
    pub compensation: Option<Value>,
    pub audience: Audience,
    pub phase: Phase,
    /// What the step counts against the tools file's limits, checked (for
    /// an agent's call) and counted in the intent's own commit.
    #[serde(default)]
    pub limits: super::limits::StepLimits,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub run_id: Uuid,
    pub step_idx: i64,
    pub tool: String,
    pub tool_class: ToolClass,
    pub idempotency_key: String,
    pub args: Value,
    pub status: StepStatus,
    pub external_ref: Option<String>,
    pub compensation: Option<Value>,
    pub audience: Audience,
    pub result: Option<Value>,
    pub error: Option<String>,
    pub phase: Phase,
    /// An irreversible step run before the pivot on its own approval.
    pub approved_individually: bool,
    /// R12: the step's last answer to the agent was not final (unknown, not
    /// executed, awaiting approval); the agent has yet to be given its
    /// final outcome.
    pub owed_to_agent: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// How soon an outcome must be on disk (DESIGN.md §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// On disk before the call returns: every INTENDED row, and outcomes of
    /// tools that have no lookup.
    Durable,
    /// May reach the disk with the next durable commit: outcomes that
    /// reconcile can recover from the real system.
    Lazy,
}

/// A move of a step (or compensation) from one status to the next, with what
/// was learnt on the way. `from` makes the write a compare-and-set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub from: StepStatus,
    pub to: StepStatus,
    pub external_ref: Option<String>,
    pub result: Option<Value>,
    pub error: Option<String>,
}

impl Outcome {
    pub fn moving(from: StepStatus, to: StepStatus) -> Self {
        Outcome {
            from,
            to,
            external_ref: None,
            result: None,
            error: None,
        }
    }

    /// To CONFIRMED, with what the real system called the effect.
    pub fn confirmed(from: StepStatus, external_ref: String, result: Value) -> Self {
        Outcome {
            external_ref: Some(external_ref),
            result: Some(result),
            ..Outcome::moving(from, StepStatus::Confirmed)
        }
    }

    /// A move that records why.
    pub fn because(from: StepStatus, to: StepStatus, error: impl Into<String>) -> Self {
        Outcome {
            error: Some(error.into()),
            ..Outcome::moving(from, to)
        }
    }
}

/// The intent row of a compensation or undo (R8): its own key, its own
/// lifecycle, written before the compensating call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewCompensation {
    pub run_id: Uuid,
    /// The step being compensated.
    pub step_idx: i64,
    /// The operation that compensates (`stripe.refund`, `jira.close` …).
    pub tool: String,
    pub idempotency_key: String,
    pub args: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compensation {
    pub run_id: Uuid,
    pub step_idx: i64,
    pub tool: String,
    pub idempotency_key: String,
    pub args: Value,
    pub status: StepStatus,
    pub external_ref: Option<String>,
    pub result: Option<Value>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray, strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum ApprovalKind {
    /// The whole commit plan of a run.
    Pivot,
    /// One held call (irreversible before the pivot, or no compensation).
    Step,
}

crate::names::names! {
    ApprovalKind: "approval kind",
    CorrectionSource: "correction source",
    NoticeStatus: "notice status",
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewApproval {
    pub run_id: Uuid,
    pub kind: ApprovalKind,
    /// The held step, for a single-step approval.
    pub step_idx: Option<i64>,
    /// What the approver reads first: the agent's summary or why the call
    /// was held.
    pub summary: String,
    /// The exact plan shown: commit steps for a pivot, the call for a step.
    pub plan: Value,
    /// Digest of `plan`; the approve form carries it back (DESIGN.md §4).
    pub digest: String,
    /// After this the request expires (never a person's rejection).
    pub expires_at: Option<DateTime<Utc>>,
    /// How many different people must approve (the two-person rule: 2).
    pub approvers_needed: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: i64,
    pub run_id: Uuid,
    pub kind: ApprovalKind,
    pub step_idx: Option<i64>,
    pub summary: String,
    pub plan: Value,
    pub digest: String,
    pub status: ApprovalStatus,
    pub expires_at: Option<DateTime<Utc>>,
    pub decided_by: Option<Actor>,
    pub decided_at: Option<DateTime<Utc>>,
    pub note: Option<String>,
    pub created_at: DateTime<Utc>,
    pub approvers_needed: i64,
    /// Under the two-person rule, who approved first (it waits for a
    /// second, different approver).
    pub first_approver: Option<Actor>,
    pub first_approved_at: Option<DateTime<Utc>>,
}

/// A person's edit of one commit step's arguments before the pivot is
/// decided. The plan keeps every edit, so the audit trail and the agent
/// both see what the approver changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanEdit {
    pub step: i64,
    pub tool: String,
    pub before: Value,
    pub after: Value,
    /// The top-level arguments that differ, in order.
    pub changed: Vec<String>,
    /// Who edited.
    pub by: Actor,
    pub at: DateTime<Utc>,
}

impl PlanEdit {
    pub fn new(step: i64, tool: &str, before: Value, after: Value, person: &Actor) -> PlanEdit {
        let empty = serde_json::Map::new();
        let (old, new) = (
            before.as_object().unwrap_or(&empty),
            after.as_object().unwrap_or(&empty),
        );
        let mut changed: Vec<String> = new
            .iter()
            .filter(|(field, value)| old.get(*field) != Some(value))
            .map(|(field, _)| field.clone())
            .collect();
        changed.extend(
            old.keys()
                .filter(|field| !new.contains_key(*field))
                .cloned(),
        );
        if changed.is_empty() && before != after {
            changed.push("the arguments".to_owned());
        }
        PlanEdit {
            step,
            tool: tool.to_owned(),
            before,
            after,
            changed,
            by: person.clone(),
            at: Utc::now(),
        }
    }

    /// The edit in one sentence: who changed which fields of which step.
    pub fn summary(&self) -> String {
        format!(
            "{} changed {} of step {} ({})",
            self.by.name(),
            self.changed.join(", "),
            self.step,
            self.tool
        )
    }

    /// The audit line: the sentence and both versions of the arguments.
    pub fn line(&self) -> String {
        format!(
            "edited before deciding: {}. Before: {}. After: {}",
            self.summary(),
            self.before,
            self.after
        )
    }
}

/// A pivot's plan, as its approval stores it (`Approval::plan`, digested
/// as JSON): the commit steps in the order they run, and the edits
/// approvers made before deciding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PivotPlan {
    /// The run's step index of the first commit step; the others follow.
    pub first_step: i64,
    pub commit: Vec<CommitCall>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<PlanEdit>,
}

/// One commit step, as the approver reads it and the commit sends it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommitCall {
    pub step: i64,
    pub tool: String,
    pub args: Value,
    pub class: ToolClass,
    pub audience: Audience,
    pub gated: bool,
    pub reach: Reach,
    /// The call that undoes it, built under the step's own key; `None`
    /// when it has none (an irreversible step).
    pub way_back: Option<Value>,
}

/// Who a commit step reaches: its connector and how many recipients its
/// arguments name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reach {
    pub channel: String,
    pub recipients: usize,
}

impl PivotPlan {
    /// The plan a pivot approval stores; `Err` says why it cannot be read.
    pub fn read(stored: &Value) -> Result<PivotPlan, String> {
        PivotPlan::deserialize(stored).map_err(|e| format!("an unreadable pivot plan: {e}"))
    }

    /// The plan as it is stored and digested.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a plan of JSON values serialises")
    }

    pub fn call(&self, step: i64) -> Option<&CommitCall> {
        self.commit.iter().find(|call| call.step == step)
    }
}

/// The edits a pivot plan records (empty for a plan nobody edited, or for
/// a held step's request, which has no edits).
pub fn plan_edits(plan: &Value) -> Vec<PlanEdit> {
    PivotPlan::read(plan)
        .map(|plan| plan.edits)
        .unwrap_or_default()
}

/// An edited plan replacing the one an approval waits on, compared and
/// set on the digest the editor saw.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanChange {
    pub approval_id: i64,
    pub digest_before: String,
    pub plan: Value,
    pub digest: String,
    pub approvers_needed: i64,
    /// The audit line (both versions of the arguments).
    pub detail: String,
}

/// A person's decision on an approval, and the run move that goes with it
/// in the same transaction (AWAITING_APPROVAL → COMMITTING for a pivot).
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub approval_id: i64,
    /// The digest the approver saw; a changed plan refuses the decision.
    pub digest: String,
    pub to: ApprovalStatus,
    pub note: Option<String>,
    pub run_move: Option<(RunStatus, RunStatus)>,
}

/// Which record a correction corrects.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray, strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum CorrectionSource {
    Step,
    Compensation,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewCorrection {
    pub run_id: Uuid,
    pub step_idx: i64,
    pub source: CorrectionSource,
    pub tool: String,
    pub audience: Audience,
    pub template: String,
    pub recipients: Vec<String>,
    /// `correct:` key of the send (R10).
    pub idempotency_key: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    pub id: i64,
    pub run_id: Uuid,
    pub step_idx: i64,
    pub source: CorrectionSource,
    pub tool: String,
    pub audience: Audience,
    /// Blast radius: higher is sent (or dismissed) first.
    pub rank: i64,
    pub template: String,
    pub recipients: Vec<String>,
    /// The text that will go out: the template until someone edits it.
    pub message: String,
    pub status: CorrectionStatus,
    pub idempotency_key: String,
    /// The send's own lifecycle once it has been attempted.
    pub send_status: Option<StepStatus>,
    pub external_ref: Option<String>,
    pub decided_by: Option<Actor>,
    pub decided_at: Option<DateTime<Utc>>,
    pub dismiss_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A correction as the inbox lists it, read in one query with its run's
/// title and the effect it corrects.
#[derive(Clone, Debug, PartialEq)]
pub struct QueuedCorrection {
    pub correction: Correction,
    /// The run's label, or its purpose when it has none.
    pub run_title: String,
    /// The step the correction is about; `None` if the log has no such step.
    pub original: Option<OriginalEffect>,
}

/// The logged call a correction answers for.
#[derive(Clone, Debug, PartialEq)]
pub struct OriginalEffect {
    pub tool: String,
    pub args: Value,
    pub external_ref: Option<String>,
}

/// One line of the append-only audit trail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: i64,
    pub run_id: Option<Uuid>,
    pub entity: EventEntity,
    /// The step index, approval id or correction id the event is about.
    pub entity_id: Option<i64>,
    pub actor: Actor,
    pub from_status: Option<String>,
    pub to_status: Option<String>,
    pub detail: Option<String>,
    pub at: DateTime<Utc>,
}

/// What an audit line is about.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum EventEntity {
    Run,
    Step,
    Compensation,
    Approval,
    Correction,
    User,
    Token,
}

crate::names::names! {
    EventEntity: "audit entity",
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub role: Role,
    /// The groups the account is in (`saga-harness user group add`).
    pub groups: Vec<String>,
    pub created_at: DateTime<Utc>,
}

/// A user with the stored password hash, for sign-in only.
#[derive(Clone, Debug, PartialEq)]
pub struct Credentials {
    pub user: User,
    pub password_hash: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiToken {
    pub id: i64,
    pub agent: String,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// Where a message telling people an approval waits (a Slack post) stands.
/// It is kept like a step: written with its key before it is posted, so a
/// post whose answer was lost is looked up by that key, never sent twice.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray, strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum NoticeStatus {
    /// Written, not yet known to be posted.
    Intended,
    Posted,
    /// The post's answer was lost: the key is looked up before posting again.
    Unknown,
    /// The channel refused it (a missing channel, a revoked token).
    Failed,
}

/// Which message of an approval a notice is.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum NoticePlace {
    /// The first post.
    Primary,
    /// The post to the escalation channel, once nobody decided in time.
    Escalation,
}

crate::names::names! {
    NoticePlace: "notice place",
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewNotice {
    pub approval_id: i64,
    pub run_id: Uuid,
    /// Which message of the approval.
    pub place: NoticePlace,
    pub idempotency_key: String,
    pub channel: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub approval_id: i64,
    pub run_id: Uuid,
    pub place: NoticePlace,
    pub idempotency_key: String,
    pub channel: String,
    pub status: NoticeStatus,
    /// Where the channel keeps it (Slack: `CHANNEL_ID:TS`).
    pub message_ref: Option<String>,
    /// Digest of the message as last posted or updated.
    pub shown: Option<String>,
    /// It shows the approval's final outcome: nothing more to update.
    pub done: bool,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Where a person's decision came from, kept with it in the audit trail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Dashboard,
    Slack,
    /// The harness itself: an expiry, or a decision replayed after a crash.
    Harness,
}

impl Via {
    /// The note the decision is recorded with.
    pub fn note(self) -> Option<String> {
        match self {
            Via::Dashboard => Some("decided in the dashboard".to_owned()),
            Via::Slack => Some("decided in Slack".to_owned()),
            Via::Harness => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A plan as proposals have stored it since the pivot existed.
    fn stored_plan() -> Value {
        json!({
            "first_step": 3,
            "commit": [
                {
                    "step": 3, "tool": "refund", "args": {"amount": 900},
                    "class": "compensatable", "audience": "customer", "gated": false,
                    "reach": {"channel": "stripe.refund", "recipients": 0},
                    "way_back": {"tool": "charge_card", "args": {"amount": 900}}
                },
                {
                    "step": 4, "tool": "email_customer", "args": {"to": ["a@example.com"]},
                    "class": "irreversible", "audience": "customer", "gated": true,
                    "reach": {"channel": "mail.send", "recipients": 1},
                    "way_back": null
                }
            ]
        })
    }

    #[test]
    fn a_stored_pivot_plan_reads_back_to_the_same_json_so_its_digest_holds() {
        let stored = stored_plan();
        let plan = PivotPlan::read(&stored).unwrap();
        assert_eq!(
            plan.call(4).map(|c| c.tool.as_str()),
            Some("email_customer")
        );
        assert_eq!(plan.call(4).and_then(|c| c.way_back.clone()), None);
        assert!(plan.edits.is_empty());
        assert_eq!(plan.to_value(), stored);
    }

    #[test]
    fn a_plan_that_is_not_a_pivot_plan_is_refused_with_its_reason() {
        let held_step = json!({"tool": "refund", "args": {"amount": 5}});
        let why = PivotPlan::read(&held_step).unwrap_err();
        assert!(why.contains("first_step"), "{why}");
        assert!(plan_edits(&held_step).is_empty());
    }
}
