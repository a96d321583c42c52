//! One answer to the agent, whichever door it came in by: what its call
//! came to (the outcome kinds of §5) and the words a model acts on. The
//! agent API and the MCP gateway both answer from here; they differ only
//! in how the agent asks about a step again.

use super::model::Step;
use super::status::StepStatus;
use serde::Serialize;
use serde_json::Value;

/// What the agent is told about its call (§5): never an HTTP error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    Confirmed,
    Failed,
    Unknown,
    NotExecuted,
    AwaitingApproval,
    /// Held for a person because it would take a limit on the sum of calls
    /// (money, recipients, calls) past its maximum; nothing was sent.
    HeldOverLimit,
    Rejected,
    /// Held for a person, and nobody decided before the deadline: not
    /// sent, and nobody said no. Told as `rejected`, the set DESIGN.md §5
    /// gives agents, in words that say nobody rejected it.
    #[serde(rename = "rejected")]
    Expired,
}

impl OutcomeKind {
    /// Every kind an agent can be told, as it is told (`Expired` is told
    /// as `rejected`).
    pub const ALL: [OutcomeKind; 7] = [
        OutcomeKind::Confirmed,
        OutcomeKind::Failed,
        OutcomeKind::Unknown,
        OutcomeKind::NotExecuted,
        OutcomeKind::AwaitingApproval,
        OutcomeKind::HeldOverLimit,
        OutcomeKind::Rejected,
    ];

    /// Whether this answer gives the agent the step's final outcome; any
    /// other leaves the step owed to the agent (R12).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            OutcomeKind::Confirmed
                | OutcomeKind::Failed
                | OutcomeKind::Rejected
                | OutcomeKind::Expired
        )
    }

    /// Whether the effect is final and did not happen: a tool error, to a
    /// client that has them.
    pub fn is_final_no(&self) -> bool {
        matches!(
            self,
            OutcomeKind::Failed | OutcomeKind::Rejected | OutcomeKind::Expired
        )
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            OutcomeKind::Confirmed => "confirmed",
            OutcomeKind::Failed => "failed",
            OutcomeKind::Unknown => "unknown",
            OutcomeKind::NotExecuted => "not_executed",
            OutcomeKind::AwaitingApproval => "awaiting_approval",
            OutcomeKind::HeldOverLimit => "held_over_limit",
            OutcomeKind::Rejected | OutcomeKind::Expired => "rejected",
        }
    }

    /// What the agent is told of a step in this status. (A rejected held
    /// step whose approval expired is `Expired`: the engine's
    /// `outcome_kind` reads that from the approval.)
    pub fn of(status: StepStatus) -> OutcomeKind {
        match status {
            StepStatus::Confirmed | StepStatus::Compensated => OutcomeKind::Confirmed,
            StepStatus::Failed => OutcomeKind::Failed,
            StepStatus::Intended | StepStatus::Unknown => OutcomeKind::Unknown,
            StepStatus::NotExecuted => OutcomeKind::NotExecuted,
            StepStatus::AwaitingApproval => OutcomeKind::AwaitingApproval,
            StepStatus::Rejected => OutcomeKind::Rejected,
        }
    }
}

/// How an agent asks about a step again.
#[derive(Clone, Copy, Debug)]
pub enum AskAgain<'a> {
    /// The agent API: the step is named; re-sending it unchanged reads it.
    Step(i64),
    /// The MCP gateway keeps the cursor: calling the same tool again, in
    /// any words, reaches the step.
    Tool(&'a str),
}

/// The words a model acts on for `kind`: what happened and what to do
/// next. `error` is the system's (or the person's) reason; `page` where a
/// person decides a held call.
pub fn outcome_words(
    kind: OutcomeKind,
    again: AskAgain<'_>,
    error: Option<&str>,
    page: Option<&str>,
) -> String {
    let (read_again, try_again, ask_new) = match again {
        AskAgain::Step(idx) => (
            format!("re-send step {idx} unchanged to read its outcome"),
            format!("re-send step {idx} to try it once more under the same key"),
            "send it as a new step".to_owned(),
        ),
        AskAgain::Tool(tool) => (
            format!(
                "call {tool} again, reworded or not, to read its outcome (the harness maps it to \
                 the same step)"
            ),
            format!("call {tool} again to try it once more under the same key"),
            format!("call {tool} again"),
        ),
    };
    match kind {
        OutcomeKind::Confirmed => "done".to_owned(),
        OutcomeKind::Failed => match error {
            Some(why) => format!(
                "the system refused this call; nothing happened: {why}. Change course rather \
                 than retrying it"
            ),
            None => "the system refused this call; nothing happened. Change course rather than \
                     retrying it"
                .to_owned(),
        },
        OutcomeKind::Unknown => format!(
            "the outcome is unknown and may have happened. Do not retry with new arguments and \
             do not assume it failed: the harness resolves it. {}",
            capitalised(&read_again)
        ),
        OutcomeKind::NotExecuted => format!("nothing happened; {try_again}"),
        OutcomeKind::AwaitingApproval => format!(
            "held for a person's approval; nothing was sent. {}{} later to read the decision",
            page.map(|page| format!("A support lead decides at {page}. "))
                .unwrap_or_default(),
            capitalised(match again {
                AskAgain::Step(_) => "re-send it",
                AskAgain::Tool(_) => "call it again",
            })
        ),
        OutcomeKind::HeldOverLimit => format!(
            "held for a person: {}; nothing was sent. Do not split it into smaller calls or \
             retry it reworded: a person decides whether it goes past the limit. {}{} later \
             to read the decision",
            error.unwrap_or("it would cross a limit"),
            page.map(|page| format!("A support lead decides at {page}. "))
                .unwrap_or_default(),
            capitalised(match again {
                AskAgain::Step(_) => "re-send it",
                AskAgain::Tool(_) => "call it again",
            })
        ),
        OutcomeKind::Rejected => {
            "a person rejected this call; it was not sent. Go on without it".to_owned()
        }
        OutcomeKind::Expired => format!(
            "nobody decided before the deadline, so it was not sent. Nobody rejected it: \
             {ask_new} if it is still wanted"
        ),
    }
}

/// `words` with its first letter in capitals, as a sentence starts.
pub fn capitalised(words: &str) -> String {
    let mut chars = words.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Where a run's step cursor stands for its agent (R12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The step to send next: the oldest owed step, else `new_step`.
    pub next_step: i64,
    /// The index a new effect takes.
    pub new_step: i64,
}

impl Cursor {
    pub(crate) fn of(new_step: i64, owed: impl IntoIterator<Item = i64>) -> Cursor {
        Cursor {
            next_step: owed.into_iter().min().unwrap_or(new_step).min(new_step),
            new_step,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallOutcome {
    pub outcome: OutcomeKind,
    /// `None` for pure calls: they take no step index (R2).
    pub step: Option<i64>,
    pub key: Option<String>,
    pub external_ref: Option<String>,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// Written for a model: what to do next.
    pub message: String,
    /// The step to send next (R12): the oldest step still owed to the agent
    /// (its last answer was unknown, not executed or awaiting approval),
    /// to be re-sent unchanged; else the index a new step takes.
    pub next_step: i64,
    /// The index a new effect takes, whatever is owed.
    pub new_step: i64,
    /// For `held_over_limit`: the limit, the sum so far, this call's
    /// amount and the maximum; `null` otherwise.
    pub limit: Option<Box<super::limits::OverLimit>>,
}

impl CallOutcome {
    /// The answer about `step`, told as `kind`, with the run's cursor.
    pub fn of(step: &Step, kind: OutcomeKind, cursor: Cursor) -> CallOutcome {
        CallOutcome {
            outcome: kind,
            step: Some(step.step_idx),
            key: Some(step.idempotency_key.clone()),
            external_ref: step.external_ref.clone(),
            result: step.result.clone(),
            error: step.error.clone(),
            message: outcome_words(
                kind,
                AskAgain::Step(step.step_idx),
                step.error.as_deref(),
                None,
            ),
            next_step: cursor.next_step,
            new_step: cursor.new_step,
            limit: None,
        }
    }

    /// The answer about a step held over a limit.
    pub fn over_limit(mut self, over: super::limits::OverLimit) -> CallOutcome {
        self.message = outcome_words(
            OutcomeKind::HeldOverLimit,
            AskAgain::Step(self.step.unwrap_or_default()),
            Some(&over.words),
            None,
        );
        self.limit = Some(Box::new(over));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_hold_is_final_and_says_nobody_said_no() {
        assert!(OutcomeKind::Expired.is_final());
        // Told within DESIGN.md §5's set of outcomes.
        assert_eq!(
            serde_json::to_value(OutcomeKind::Expired).unwrap(),
            serde_json::json!("rejected")
        );
        let words = outcome_words(OutcomeKind::Expired, AskAgain::Step(3), None, None);
        assert!(words.contains("Nobody rejected it"), "{words}");
        assert!(words.contains("send it as a new step"), "{words}");
        let words = outcome_words(
            OutcomeKind::Expired,
            AskAgain::Tool("send_email"),
            None,
            None,
        );
        assert!(words.contains("call send_email again"), "{words}");
    }

    #[test]
    fn each_door_says_how_to_ask_again_in_its_own_way() {
        let api = outcome_words(OutcomeKind::Unknown, AskAgain::Step(4), None, None);
        assert!(api.contains("Re-send step 4 unchanged"), "{api}");
        let mcp = outcome_words(OutcomeKind::Unknown, AskAgain::Tool("refund"), None, None);
        assert!(mcp.contains("Call refund again, reworded or not"), "{mcp}");
        let held = outcome_words(
            OutcomeKind::AwaitingApproval,
            AskAgain::Tool("refund"),
            None,
            Some("http://harness/runs/r"),
        );
        assert!(
            held.contains("A support lead decides at http://harness/runs/r. Call it again later"),
            "{held}"
        );
    }

    #[test]
    fn a_refusal_carries_the_systems_reason() {
        let words = outcome_words(
            OutcomeKind::Failed,
            AskAgain::Step(1),
            Some("HTTP 422: KETTLE-2 is out of stock"),
            None,
        );
        assert!(
            words.contains("nothing happened: HTTP 422: KETTLE-2 is out of stock"),
            "{words}"
        );
    }
}
