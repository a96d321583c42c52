//! What a person is asked about a run, and what the run page may offer
//! them: the open "did this happen?" questions of R7 (a step or a
//! compensation nobody can look up, or one the system refused), which
//! answers each allows, and whether a person may unwind the run. The
//! dashboard asks here instead of deciding for itself.

use super::model::{Actor, Compensation, Run, Step};
use super::status::{RunStatus, StepStatus};
use chrono::{DateTime, Utc};

/// One question waiting for a person.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenQuestion {
    /// About the step itself, or about its compensation.
    pub about_compensation: bool,
    /// Whether "it did not happen, send it again" is an answer: not for a
    /// compensation the system refused (sending it again would be refused
    /// again).
    pub may_resend: bool,
    pub step_idx: i64,
    pub tool: String,
    pub args: serde_json::Value,
    pub key: String,
    /// Why the harness cannot settle it by itself.
    pub why: String,
    /// The row's last change: an answer is bound to it (R7), so one given
    /// again after the question was asked anew settles nothing.
    pub asked: DateTime<Utc>,
}

/// The questions a run in NEEDS_ATTENTION waits on: its steps whose
/// outcome is unknown, then its compensations that failed or whose outcome
/// nobody knows. A run in any other status asks nothing.
pub fn open_questions(
    run: &Run,
    steps: &[Step],
    compensations: &[Compensation],
) -> Vec<OpenQuestion> {
    if run.status != RunStatus::NeedsAttention {
        return Vec::new();
    }
    let about_steps = steps
        .iter()
        .filter(|s| s.status == StepStatus::Unknown)
        .map(|s| OpenQuestion {
            about_compensation: false,
            may_resend: true,
            step_idx: s.step_idx,
            tool: s.tool.clone(),
            args: s.args.clone(),
            key: s.idempotency_key.clone(),
            why: s
                .error
                .clone()
                .unwrap_or_else(|| "its outcome is unknown and it has no lookup".into()),
            asked: s.updated_at,
        });
    let about_compensations = compensations
        .iter()
        .filter(|c| {
            matches!(
                c.status,
                StepStatus::Failed | StepStatus::Unknown | StepStatus::Intended
            )
        })
        .map(|c| OpenQuestion {
            about_compensation: true,
            may_resend: c.status != StepStatus::Failed,
            step_idx: c.step_idx,
            tool: c.tool.clone(),
            args: c.args.clone(),
            key: c.idempotency_key.clone(),
            why: match (&c.error, c.status) {
                (Some(error), StepStatus::Failed) => format!("the system refused it: {error}"),
                _ => "nobody can tell whether it happened".to_owned(),
            },
            asked: c.updated_at,
        });
    about_steps.chain(about_compensations).collect()
}

/// Whether `actor` may start unwinding a run in `status`: before the pivot
/// anyone who may act on the run (the agent, or a person); once it is past
/// the pivot (committing, completed, or stopped for a person there) only a
/// person, from the dashboard. `None` when the run cannot be unwound at all
/// in that status (waiting at its pivot, already unwinding, closed).
pub fn may_start_unwind(status: RunStatus, actor: &Actor) -> Option<bool> {
    match status {
        RunStatus::Running | RunStatus::Rejected => Some(true),
        RunStatus::Committing | RunStatus::Completed | RunStatus::NeedsAttention => {
            Some(matches!(actor, Actor::User(_)))
        }
        _ => None,
    }
}

/// Whether the run page offers `person` an unwind: they may start one, and
/// there is a confirmed effect to undo.
pub fn person_may_unwind(run: &Run, steps: &[Step], person: &Actor) -> bool {
    may_start_unwind(run.status, person) == Some(true)
        && steps.iter().any(|s| s.status == StepStatus::Confirmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_the_pivot_only_a_person_may_start_an_unwind() {
        let person = Actor::User("dana".into());
        let agent = Actor::Agent("support-bot".into());
        for status in [
            RunStatus::Committing,
            RunStatus::Completed,
            RunStatus::NeedsAttention,
        ] {
            assert_eq!(may_start_unwind(status, &person), Some(true), "{status:?}");
            assert_eq!(may_start_unwind(status, &agent), Some(false), "{status:?}");
        }
        assert_eq!(may_start_unwind(RunStatus::Running, &agent), Some(true));
        assert_eq!(may_start_unwind(RunStatus::AwaitingApproval, &person), None);
        assert_eq!(may_start_unwind(RunStatus::Unwinding, &person), None);
    }
}
