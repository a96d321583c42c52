//! Step and run statuses, and the one place where their transitions are
//! judged legal (DESIGN.md §3).
//!
//! Every store implementation asks [`check_step_transition`] or
//! [`check_run_transition`] before it writes a new status, so an illegal move
//! is refused as a bug instead of silently overwriting what the log says
//! happened. Strings appear only at the edges (`as_str` / `FromStr`).

use crate::names::names;

/// Where a non-pure step (or a compensation) stands in its lifecycle.
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
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum StepStatus {
    /// The index is reserved and the exact call stored; nothing was sent.
    AwaitingApproval,
    /// The intent is on disk; the call may or may not have left.
    Intended,
    Confirmed,
    Failed,
    /// The call may have had its effect: reconcile before anything else.
    Unknown,
    /// Nothing happened; the step may be retried under the same key.
    NotExecuted,
    Rejected,
    Compensated,
}

impl StepStatus {
    /// Settled steps need no reconcile: the log knows what happened.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            StepStatus::Confirmed
                | StepStatus::Failed
                | StepStatus::NotExecuted
                | StepStatus::Rejected
                | StepStatus::Compensated
        )
    }
}

/// A saga-log row and a compensation row share statuses but not every move:
/// only a step can be awaiting approval, rejected or compensated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Step,
    Compensation,
}

/// Where a run stands (DESIGN.md §3, "Run statuses").
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
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    Running,
    /// A pivot was proposed and waits for a person.
    AwaitingApproval,
    /// The pivot was approved; the commit steps are rolling forward.
    Committing,
    Completed,
    Rejected,
    Unwinding,
    Unwound,
    /// A person must answer a question before the run can move again.
    NeedsAttention,
}

impl RunStatus {
    /// Nothing more happens to a run in these states (short of an approver
    /// unwinding a completed one).
    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Unwound)
    }
}

/// The move asked for is not in DESIGN.md §3's diagram.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal {what} transition {from} -> {to}")]
pub struct IllegalTransition {
    pub what: &'static str,
    pub from: String,
    pub to: String,
}

/// The single judge of step and compensation moves.
pub fn check_step_transition(
    lifecycle: Lifecycle,
    from: StepStatus,
    to: StepStatus,
) -> Result<(), IllegalTransition> {
    use StepStatus::*;
    let legal = match (from, to) {
        (AwaitingApproval, Intended | Rejected) => lifecycle == Lifecycle::Step,
        (Intended, Confirmed | Failed | Unknown | NotExecuted) => true,
        (Unknown, Confirmed | Failed | NotExecuted) => true,
        (NotExecuted, Intended) => true,
        (Confirmed, Compensated) => lifecycle == Lifecycle::Step,
        // A compensation the system refused that a person carried out by
        // hand (only a person's answer makes this move).
        (Failed, Confirmed) => lifecycle == Lifecycle::Compensation,
        _ => false,
    };
    if legal {
        Ok(())
    } else {
        Err(IllegalTransition {
            what: match lifecycle {
                Lifecycle::Step => "step",
                Lifecycle::Compensation => "compensation",
            },
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
        })
    }
}

/// The single judge of run moves. `resume_to` is the status a run in
/// NEEDS_ATTENTION returns to once every question is answered.
pub fn check_run_transition(
    from: RunStatus,
    to: RunStatus,
    resume_to: Option<RunStatus>,
) -> Result<(), IllegalTransition> {
    use RunStatus::*;
    let legal = match (from, to) {
        // A person may also decide to unwind a run that waits for them.
        (NeedsAttention, back) => resume_to == Some(back) || back == Unwinding,
        (Running, AwaitingApproval | Unwinding | Completed) => true,
        // Proposing again replaces the plan and keeps the status; a pivot
        // never leaves AWAITING_APPROVAL except by a decision.
        (AwaitingApproval, Committing | Rejected) => true,
        (Committing, Completed | Unwinding) => true,
        (Completed, Unwinding) => true,
        (Rejected, Unwinding) => true,
        (Unwinding, Unwound) => true,
        (Running | AwaitingApproval | Committing | Rejected | Unwinding, NeedsAttention) => true,
        _ => false,
    };
    if legal {
        Ok(())
    } else {
        Err(IllegalTransition {
            what: "run",
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
        })
    }
}

/// Where a customer-facing correction stands (R10). Its send has a step
/// lifecycle of its own (`send_status`), judged by [`check_step_transition`].
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
pub enum CorrectionStatus {
    Pending,
    /// Signed off by a person; the text is frozen from here on.
    Approved,
    Sent,
    Dismissed,
}

/// The judge of correction moves: a signed-off correction can only be sent;
/// nothing comes back from sent or dismissed.
pub fn check_correction_transition(
    from: CorrectionStatus,
    to: CorrectionStatus,
) -> Result<(), IllegalTransition> {
    use CorrectionStatus::*;
    match (from, to) {
        (Pending, Approved | Dismissed) | (Approved, Sent) => Ok(()),
        _ => Err(IllegalTransition {
            what: "correction",
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
        }),
    }
}

/// Where an approval request (pivot or single step) stands.
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
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
    /// A newer pivot proposal replaced this one.
    Superseded,
    /// Left pending past its deadline (the tools file's, or when the holds it builds on lapse).
    Expired,
}

/// The judge of approval moves: only a pending request is decided, once.
pub fn check_approval_transition(
    from: ApprovalStatus,
    to: ApprovalStatus,
) -> Result<(), IllegalTransition> {
    if from == ApprovalStatus::Pending && to != ApprovalStatus::Pending {
        Ok(())
    } else {
        Err(IllegalTransition {
            what: "approval",
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
        })
    }
}

/// What a lead reads for a status: the state in plain words ("done",
/// "taken back", "waiting for you"). The constant stays the engineers'
/// (`as_str`), one click away on every page that shows these words.
pub trait InWords {
    fn in_words(self) -> &'static str;
}

impl InWords for StepStatus {
    fn in_words(self) -> &'static str {
        match self {
            StepStatus::AwaitingApproval => "waiting for you",
            StepStatus::Intended => "being sent",
            StepStatus::Confirmed => "done",
            StepStatus::Failed => "refused",
            StepStatus::Unknown => "unknown: being checked",
            StepStatus::NotExecuted => "did not happen",
            StepStatus::Rejected => "rejected",
            StepStatus::Compensated => "taken back",
        }
    }
}

impl InWords for RunStatus {
    fn in_words(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::AwaitingApproval => "waiting for approval",
            RunStatus::Committing => "carrying out the approved plan",
            RunStatus::Completed => "done",
            RunStatus::Rejected => "rejected",
            RunStatus::Unwinding => "being taken back",
            RunStatus::Unwound => "taken back",
            RunStatus::NeedsAttention => "needs a person",
        }
    }
}

impl InWords for ApprovalStatus {
    fn in_words(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "waiting for you",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Superseded => "replaced by a newer plan",
            ApprovalStatus::Expired => "expired: nobody decided",
        }
    }
}

impl InWords for CorrectionStatus {
    fn in_words(self) -> &'static str {
        match self {
            CorrectionStatus::Pending => "waiting for sign-off",
            CorrectionStatus::Approved => "signed off, being sent",
            CorrectionStatus::Sent => "sent",
            CorrectionStatus::Dismissed => "dismissed",
        }
    }
}

names! {
    StepStatus: "step status",
    RunStatus: "run status",
    CorrectionStatus: "correction status",
    ApprovalStatus: "approval status",
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lead never reads a constant where words belong: each status has
    /// words of its own, different from its constant.
    #[test]
    fn every_status_has_words_that_are_not_its_constant() {
        fn check<S: InWords + Copy + Into<&'static str>>(all: &[S]) {
            let mut seen = std::collections::HashSet::new();
            for s in all {
                let words = s.in_words();
                let constant: &str = (*s).into();
                // Never the constant's form: no underscores, no capitals.
                assert!(!words.contains('_'), "{words}");
                assert_eq!(words, words.to_lowercase(), "{constant}");
                if constant.contains('_') {
                    assert_ne!(words, constant.to_lowercase().replace('_', " "));
                }
                assert!(seen.insert(words), "two statuses read {words:?}");
            }
        }
        check(&StepStatus::ALL);
        check(&RunStatus::ALL);
        check(&ApprovalStatus::ALL);
        check(&CorrectionStatus::ALL);
    }

    /// Every pair is checked, so a new arrow in the diagram is a deliberate
    /// change to this list.
    #[test]
    fn step_transitions_are_exactly_the_diagram() {
        use StepStatus::*;
        let legal_for_steps = [
            (AwaitingApproval, Intended),
            (AwaitingApproval, Rejected),
            (Intended, Confirmed),
            (Intended, Failed),
            (Intended, Unknown),
            (Intended, NotExecuted),
            (Unknown, Confirmed),
            (Unknown, Failed),
            (Unknown, NotExecuted),
            (NotExecuted, Intended),
            (Confirmed, Compensated),
        ];
        for from in StepStatus::ALL {
            for to in StepStatus::ALL {
                let expected = legal_for_steps.contains(&(from, to));
                assert_eq!(
                    check_step_transition(Lifecycle::Step, from, to).is_ok(),
                    expected,
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn compensations_cannot_await_approval_or_be_compensated() {
        use StepStatus::*;
        assert!(check_step_transition(Lifecycle::Compensation, Intended, Unknown).is_ok());
        assert!(check_step_transition(Lifecycle::Compensation, Unknown, Confirmed).is_ok());
        assert!(check_step_transition(Lifecycle::Compensation, Confirmed, Compensated).is_err());
        assert!(
            check_step_transition(Lifecycle::Compensation, AwaitingApproval, Intended).is_err()
        );
    }

    #[test]
    fn run_transitions_follow_the_diagram() {
        use RunStatus::*;
        let legal = [
            (Running, AwaitingApproval),
            (Running, Unwinding),
            (Running, Completed),
            (AwaitingApproval, Committing),
            (AwaitingApproval, Rejected),
            (Committing, Completed),
            (Committing, Unwinding),
            (Completed, Unwinding),
            (Rejected, Unwinding),
            (Unwinding, Unwound),
            (Running, NeedsAttention),
            (AwaitingApproval, NeedsAttention),
            (Committing, NeedsAttention),
            (Rejected, NeedsAttention),
            (Unwinding, NeedsAttention),
        ];
        for from in RunStatus::ALL {
            for to in RunStatus::ALL {
                if from == NeedsAttention {
                    continue;
                }
                assert_eq!(
                    check_run_transition(from, to, None).is_ok(),
                    legal.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn needs_attention_returns_only_to_where_it_was() {
        use RunStatus::*;
        assert!(check_run_transition(NeedsAttention, Committing, Some(Committing)).is_ok());
        assert!(check_run_transition(NeedsAttention, Completed, Some(Committing)).is_err());
        assert!(check_run_transition(NeedsAttention, Running, None).is_err());
    }

    #[test]
    fn settled_statuses_match_the_design() {
        let settled: Vec<_> = StepStatus::ALL
            .into_iter()
            .filter(|s| s.is_settled())
            .collect();
        use StepStatus::*;
        assert_eq!(
            settled,
            vec![Confirmed, Failed, NotExecuted, Rejected, Compensated]
        );
    }

    #[test]
    fn statuses_round_trip_through_their_names() {
        for s in StepStatus::ALL {
            assert_eq!(s.as_str().parse::<StepStatus>(), Ok(s));
        }
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>(), Ok(s));
        }
        assert!("DONE".parse::<StepStatus>().is_err());
    }
    #[test]
    fn r10_a_signed_off_correction_is_only_ever_sent() {
        use CorrectionStatus::*;
        for from in CorrectionStatus::ALL {
            for to in CorrectionStatus::ALL {
                let legal = matches!(
                    (from, to),
                    (Pending, Approved) | (Pending, Dismissed) | (Approved, Sent)
                );
                assert_eq!(
                    check_correction_transition(from, to).is_ok(),
                    legal,
                    "{from:?} -> {to:?}"
                );
            }
        }
    }

    #[test]
    fn an_approval_is_decided_once() {
        use ApprovalStatus::*;
        for from in ApprovalStatus::ALL {
            for to in ApprovalStatus::ALL {
                let legal = from == Pending && to != Pending;
                assert_eq!(
                    check_approval_transition(from, to).is_ok(),
                    legal,
                    "{from:?} -> {to:?}"
                );
            }
        }
    }

    #[test]
    fn only_a_compensation_moves_from_failed_to_confirmed() {
        use StepStatus::*;
        assert!(check_step_transition(Lifecycle::Compensation, Failed, Confirmed).is_ok());
        assert!(check_step_transition(Lifecycle::Step, Failed, Confirmed).is_err());
    }

    #[test]
    fn a_run_waiting_for_a_person_may_be_unwound_or_return_where_it_was() {
        use RunStatus::*;
        for back in [Committing, Running, Rejected] {
            assert!(check_run_transition(NeedsAttention, Unwinding, Some(back)).is_ok());
            assert!(check_run_transition(NeedsAttention, back, Some(back)).is_ok());
        }
        assert!(check_run_transition(NeedsAttention, Completed, Some(Committing)).is_err());
    }
}
