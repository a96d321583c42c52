//! What the harness refuses an agent (or a person), and the stable code
//! each refusal is known by in the API and the MCP gateway (§5).

use super::registry::ArgsMistake;
use super::status::RunStatus;
use super::store::StoreError;

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
    #[error(
        "the run waits for a person to answer a question about one of its steps (on the \
         dashboard); until then it takes nothing from the agent, and only a person may unwind it"
    )]
    RunNeedsAttention,
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
    InvalidArgs { tool: String, mistake: ArgsMistake },
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
    #[error("{}", super::model::TOKEN_NOT_VALID)]
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

    /// A refusal of how the agent went about its run (a step skipped,
    /// re-used or left unsettled, a tool it may not call yet), written to
    /// the run's audit trail so a person reading the run, and `eval`'s
    /// scorecard, see what the agent tried. Not a missing run, a bad token
    /// or the store failing: those say nothing about the run.
    pub fn is_the_agents_doing(&self) -> bool {
        !matches!(
            self,
            Refusal::RunNotFound
                | Refusal::TokenNotValid
                | Refusal::Store(_)
                | Refusal::QuestionAskedAgain { .. }
        )
    }

    /// The audit line of a refusal the agent caused: `refused CODE: why`.
    pub fn audit_line(&self) -> String {
        format!("{REFUSED}{}: {self}", self.code())
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
            Refusal::RunNeedsAttention => "run_needs_attention",
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

/// How the audit line of a refused agent call begins.
pub const REFUSED: &str = "refused ";

/// The code of a refusal's audit line ([`Refusal::audit_line`]), or `None`
/// for any other line.
pub fn refused_code(detail: &str) -> Option<&str> {
    let rest = detail.strip_prefix(REFUSED)?;
    let (code, _) = rest.split_once(':')?;
    (!code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')).then_some(code)
}

pub(crate) fn unresolved_message(step: i64, waiting_for_person: bool) -> String {
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
