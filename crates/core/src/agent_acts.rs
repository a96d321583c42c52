//! What an agent may do with its run in each of the run's statuses: one
//! check for every act, whose refusal names the real reason (waiting for a
//! pivot's decision, past the pivot, waiting for a person's answer, over).

use super::refusal::Refusal;
use super::status::RunStatus;

/// Something an agent asks of its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentAct {
    /// A new step.
    Call,
    /// Propose (or replace) the run's pivot.
    ProposePivot,
    /// Say the run is done.
    Complete,
    /// Start undoing what the run did.
    Unwind,
}

/// Whether an agent may do `act` while its run is `status`; if not, the
/// refusal says why.
pub fn agent_may(act: AgentAct, status: RunStatus) -> Result<(), Refusal> {
    match (status, act) {
        (RunStatus::Running, _)
        | (RunStatus::AwaitingApproval, AgentAct::ProposePivot)
        | (RunStatus::Rejected | RunStatus::Unwinding, AgentAct::Unwind) => Ok(()),
        (RunStatus::AwaitingApproval, _) => Err(Refusal::RunAwaitingApproval),
        (RunStatus::Committing | RunStatus::Completed, _) => Err(Refusal::RunPastPivot),
        (RunStatus::NeedsAttention, _) => Err(Refusal::RunNeedsAttention),
        (status, _) => Err(Refusal::RunClosed { status }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACTS: [AgentAct; 4] = [
        AgentAct::Call,
        AgentAct::ProposePivot,
        AgentAct::Complete,
        AgentAct::Unwind,
    ];

    fn code(act: AgentAct, status: RunStatus) -> &'static str {
        match agent_may(act, status) {
            Ok(()) => "ok",
            Err(refusal) => refusal.code(),
        }
    }

    #[test]
    fn a_running_run_takes_every_act() {
        for act in ACTS {
            assert_eq!(code(act, RunStatus::Running), "ok", "{act:?}");
        }
    }

    #[test]
    fn a_run_waiting_for_a_person_says_so_not_that_it_is_past_its_pivot() {
        // A run stopped on a question before it ever reached a pivot.
        for act in ACTS {
            assert_eq!(
                code(act, RunStatus::NeedsAttention),
                "run_needs_attention",
                "{act:?}"
            );
        }
        let said = agent_may(AgentAct::Unwind, RunStatus::NeedsAttention)
            .unwrap_err()
            .to_string();
        assert!(said.contains("only a person may unwind it"), "{said}");
        assert!(!said.contains("pivot"), "{said}");
    }

    #[test]
    fn only_a_pivot_may_replace_a_pivot_while_it_waits() {
        assert_eq!(
            code(AgentAct::ProposePivot, RunStatus::AwaitingApproval),
            "ok"
        );
        for act in [AgentAct::Call, AgentAct::Complete, AgentAct::Unwind] {
            assert_eq!(
                code(act, RunStatus::AwaitingApproval),
                "run_awaiting_approval",
                "{act:?}"
            );
        }
    }

    #[test]
    fn past_the_pivot_the_agent_may_do_nothing() {
        for status in [RunStatus::Committing, RunStatus::Completed] {
            for act in ACTS {
                assert_eq!(code(act, status), "run_past_pivot", "{act:?} {status:?}");
            }
        }
    }

    #[test]
    fn a_rejected_run_may_only_be_unwound_and_an_unwinding_one_carried_on() {
        for status in [RunStatus::Rejected, RunStatus::Unwinding] {
            assert_eq!(code(AgentAct::Unwind, status), "ok", "{status:?}");
            for act in [AgentAct::Call, AgentAct::ProposePivot, AgentAct::Complete] {
                assert_eq!(code(act, status), "run_closed", "{act:?} {status:?}");
            }
        }
        for act in ACTS {
            assert_eq!(code(act, RunStatus::Unwound), "run_closed", "{act:?}");
        }
    }
}
