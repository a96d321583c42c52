//! The run page's data as the server sends it: the run, its steps, its
//! pivot, held steps, questions, corrections and unwind plan, each in the
//! words and fields the page draws.

use crate::saga::status::{ApprovalStatus, CorrectionStatus, RunStatus, StepStatus};
use crate::saga::words::CallInWords;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSheet {
    pub id: String,
    pub agent: String,
    pub label: Option<String>,
    pub purpose: String,
    pub status: RunStatus,
    pub age: String,
    pub irreversible_before_pivot: i64,
    /// Why the run is being or was taken back, when it is.
    pub unwound: Option<UnwindWhy>,
    pub steps: Vec<StepView>,
    pub pivot: Option<PivotView>,
    pub held: Vec<HeldView>,
    pub questions: Vec<Question>,
    pub corrections: Vec<CorrectionLine>,
    pub unwind_plan: Option<UnwindPlan>,
    /// The signed-in person may approve, reject, answer and unwind.
    pub may_decide: bool,
    /// Each limit the run's calls count against: spent of its maximum.
    pub limits: Vec<LimitLine>,
    /// The agent's calls the harness refused, oldest first.
    #[serde(default)]
    pub refusals: Vec<RefusedCall>,
}

/// One call the harness refused the agent, from the run's audit trail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RefusedCall {
    pub at: String,
    /// The stable code the agent got (`step_out_of_order`).
    pub code: String,
    /// What the agent was told.
    pub why: String,
}

/// One limit as the run page shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LimitLine {
    /// "refunds"
    pub name: String,
    /// "billing-bot, last 24 hours"
    pub whose: String,
    /// "$120.00 of $500.00"
    pub spent: String,
    /// Spent over the maximum, in percent (may pass 100 by a person's
    /// approval).
    pub percent: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepView {
    pub idx: i64,
    pub tool: String,
    pub class: String,
    pub audience: String,
    pub status: StepStatus,
    pub after_pivot: bool,
    /// The call in words, with its pre-written way back.
    pub words: CallInWords,
    pub key: String,
    pub external_ref: Option<String>,
    pub error: Option<String>,
    /// The error is the step's outcome (the system refused it), not the
    /// history of how its outcome was learned.
    pub refused: bool,
    /// How the outcome was learned when not from the call's own answer:
    /// "found in the system", "a person said it happened" …
    pub reconciled: Option<String>,
    pub compensation: Option<CompensationView>,
    /// The step told as one account from its events: what was asked, what
    /// came back, how the harness found out, what was undone and how.
    pub account: String,
}

/// Why a run is being or was taken back, who started it and when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnwindWhy {
    pub reason: String,
    /// "the agent demo-agent", "lead".
    pub by: String,
    pub at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompensationView {
    pub tool: String,
    pub status: StepStatus,
    pub key: String,
    pub error: Option<String>,
    /// The way back in words ("Close the Jira ticket SUP-1 (step 1)").
    pub sentence: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PivotView {
    pub approval_id: i64,
    pub digest: String,
    pub status: ApprovalStatus,
    pub summary: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    pub expires_at: Option<String>,
    /// While it waits: its deadline, and where else it was asked for.
    pub waiting: Option<String>,
    pub note: Option<String>,
    /// What the run staged before the pivot and is still open (drafts,
    /// holds), which the commit builds on or a rejection undoes.
    pub staged: Vec<StagedView>,
    pub commit: Vec<PlannedView>,
    /// What a lead reads first: the money, the people, the systems and
    /// what each answer does.
    pub at_a_glance: AtAGlance,
    /// What the customer will read, as they will read it.
    pub messages: Vec<MessageView>,
    /// What approvers changed before deciding, oldest first.
    pub edits: Vec<EditView>,
    pub deciders: Deciders,
    /// The limits approving would take past their maximum, in words.
    #[serde(default)]
    pub over_limits: Vec<String>,
}

/// Who may decide an approval, and whether the reader may.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Deciders {
    /// "Only members of billing-leads may decide this."; `None`: any
    /// approver may.
    pub who: Option<String>,
    /// The reader is in a group that may (their role aside).
    pub you: bool,
}

/// The pivot in five seconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AtAGlance {
    /// Per currency, signed: "$32.00 captured", "−$5.00 refunded", "$32.00
    /// held on the card now".
    pub money: Vec<String>,
    /// The people outside the team it reaches, by address ("12 people"
    /// past a few).
    pub people: Vec<String>,
    /// The systems the commit steps write to.
    pub systems: Vec<String>,
    pub if_approve: String,
    pub if_reject: String,
}

/// A message a commit step sends to people outside the team.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessageView {
    pub to: String,
    pub subject: Option<String>,
    pub body: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EditView {
    /// Who changed which fields of which step.
    pub summary: String,
    pub at: String,
    /// The arguments as the agent (or the previous edit) had them.
    pub before: String,
    pub after: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StagedView {
    pub step: i64,
    pub words: CallInWords,
    /// When a hold staged this long ago lapses (§4).
    pub open_until: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedView {
    pub step: i64,
    pub words: CallInWords,
    /// The arguments as JSON, for an approver to edit before deciding.
    pub args: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldView {
    pub approval_id: i64,
    pub digest: String,
    pub step_idx: i64,
    pub summary: String,
    pub words: CallInWords,
    /// Its deadline, and where else it was asked for.
    pub waiting: Option<String>,
    pub deciders: Deciders,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// What is uncertain, in words ("Did the email to ada@example.com:
    /// “Your replacement kettle” go out?").
    pub uncertain: String,
    /// How a person checks by hand (the tool's `check` template).
    pub check: String,
    /// What each answer does next.
    pub if_yes: String,
    pub if_no: String,
    /// About the step itself, or about its compensation.
    pub about_compensation: bool,
    /// Whether "it did not happen, send it again" is an answer (not for a
    /// compensation the system refused).
    pub may_resend: bool,
    pub step_idx: i64,
    pub tool: String,
    pub args: String,
    pub key: String,
    pub why: String,
    /// When the question was asked (the step's last change, RFC 3339): the
    /// answer is bound to it, so a resubmitted answer cannot settle a later
    /// question about the same step.
    pub asked: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CorrectionLine {
    pub id: i64,
    pub step_idx: i64,
    pub audience: String,
    pub status: CorrectionStatus,
    pub recipients: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnwindPlan {
    /// In the order they would run.
    pub compensations: Vec<String>,
    pub corrections: Vec<String>,
}
