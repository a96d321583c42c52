//! The Slack message of one approval, in Block Kit: what waits, each call
//! in the same words as the dashboard's pivot panel, its reach, the
//! deadline, a link to the run page, and Approve / Reject buttons while it
//! waits; once decided, who decided, when, from where, and what came of it.

use crate::saga::model::{Actor, Approval, ApprovalKind, Run};
use crate::saga::status::{ApprovalStatus, RunStatus};
use crate::saga::words::{shorten, CallInWords};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The `action_id`s of the two buttons.
pub const APPROVE: &str = "saga_approve";
pub const REJECT: &str = "saga_reject";
/// The `block_id` of the buttons' block.
pub const ACTIONS_BLOCK: &str = "saga_approval";

/// What the message says about one approval.
pub struct Facts<'a> {
    pub approval: &'a Approval,
    pub run: &'a Run,
    /// The calls it approves, in words, in plan order.
    pub calls: Vec<CallInWords>,
    /// What came of the decision, once there is something to say
    /// ("2 of 2 commit steps confirmed; the run is completed").
    pub outcome: Option<String>,
    pub run_url: String,
    /// The message to the escalation channel: nobody decided in time.
    pub escalated: bool,
    /// The limits approving a waiting pivot would take past their maximum.
    pub over_limits: Vec<String>,
}

/// A message ready to post or to rewrite a posted one with.
#[derive(Clone, Debug, PartialEq)]
pub struct Shown {
    /// The notification's text (and what clients without blocks show).
    pub text: String,
    pub blocks: Value,
    /// Digest of text and blocks: an unchanged message is not rewritten.
    pub digest: String,
    /// It shows the approval's final outcome: nothing more will change it.
    pub last: bool,
}

/// The button's value: the approval and the digest of the plan the
/// message shows, so a plan replaced since is refused.
pub fn button_value(approval: &Approval) -> String {
    format!("{}:{}", approval.id, approval.digest)
}

/// Reads a button's value back: `(approval id, digest)`.
pub fn parse_button_value(value: &str) -> Option<(i64, &str)> {
    let (id, digest) = value.split_once(':')?;
    if digest.is_empty() {
        return None;
    }
    Some((id.parse().ok()?, digest))
}

/// Slack's mrkdwn reads `&`, `<` and `>` as markup: text from an agent or
/// a tool is escaped so it shows as written and cannot make a link.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Slack's limit on one section's text.
const SECTION_CHARS: usize = 3000;

fn section(text: String) -> Value {
    json!({"type": "section", "text": {"type": "mrkdwn", "text": shorten(&text, SECTION_CHARS)}})
}

fn context(text: String) -> Value {
    json!({"type": "context", "elements": [{"type": "mrkdwn", "text": shorten(&text, SECTION_CHARS)}]})
}

fn call_lines(position: usize, call: &CallInWords) -> String {
    let mut lines = format!("*{position}. {}*", escape(&call.sentence));
    let mut facts = vec![format!("`{}`", escape(&call.tool))];
    if let Some(reach) = &call.reach {
        facts.push(format!("reaches {}", escape(reach)));
    }
    if call.gated {
        facts.push("gated".to_owned());
    }
    lines.push_str(&format!("\n{}", facts.join(" · ")));
    lines.push_str(&format!("\n{}", escape(&call.if_undone)));
    if call.hidden_characters {
        lines.push_str(
            "\n:warning: its arguments hold characters that display differently from what they are; read them on the run page",
        );
    }
    lines
}

fn who(decided_by: Option<&Actor>) -> String {
    decided_by.unwrap_or(&Actor::System).described()
}

fn when(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map(|at| at.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default()
}

/// The message as it should read now.
pub fn render(facts: &Facts<'_>) -> Shown {
    let approval = facts.approval;
    let run = facts.run;
    let label = run.label.clone().unwrap_or_else(|| run.id.to_string());
    let what = match (approval.kind, facts.escalated) {
        (ApprovalKind::Pivot, false) => "Pivot waiting for approval",
        (ApprovalKind::Step, false) => "Held step waiting for approval",
        (ApprovalKind::Pivot, true) => "Escalated: a pivot still waits for approval",
        (ApprovalKind::Step, true) => "Escalated: a held step still waits for approval",
    };
    let mut blocks = vec![
        json!({"type": "header", "text": {"type": "plain_text", "text": shorten(what, 150)}}),
        section(format!("*{}*", escape(&approval.summary))),
    ];
    if approval.status == ApprovalStatus::Pending {
        for over in &facts.over_limits {
            blocks.push(section(format!(":warning: Over a limit: {}", escape(over))));
        }
    }
    for (i, call) in facts.calls.iter().enumerate() {
        blocks.push(section(call_lines(i + 1, call)));
    }
    for edit in crate::saga::model::plan_edits(&approval.plan) {
        blocks.push(context(format!(
            ":pencil2: Edited before deciding: {} at {}",
            escape(&edit.summary()),
            when(Some(edit.at))
        )));
    }
    let deadline = match approval.expires_at {
        Some(at) => format!("decide by {}", when(Some(at))),
        None => "no deadline".to_owned(),
    };
    blocks.push(context(format!(
        "<{}|Run {}> · agent {} · {deadline}",
        facts.run_url,
        escape(&label),
        escape(&run.agent)
    )));
    let decided = format!(
        "by *{}* at {}{}",
        escape(&who(approval.decided_by.as_ref())),
        when(approval.decided_at),
        approval
            .note
            .as_deref()
            .map(|note| format!(" ({})", escape(note)))
            .unwrap_or_default()
    );
    let outcome = facts
        .outcome
        .as_deref()
        .map(|o| format!("\n{}", escape(o)))
        .unwrap_or_default();
    let (status_line, text) = match approval.status {
        ApprovalStatus::Pending => {
            let votes = match (&approval.first_approver, approval.approvers_needed) {
                (_, 1) => None,
                (None, needed) => Some(format!(
                    ":busts_in_silhouette: Needs {needed} different approvers."
                )),
                (Some(first), needed) => Some(format!(
                    ":ballot_box_with_check: *1 of {needed}*: approved by *{}* at {}; a second, different approver decides.",
                    escape(&who(Some(first))),
                    when(approval.first_approved_at)
                )),
            };
            if let Some(votes) = votes {
                blocks.push(section(votes));
            }
            blocks.push(buttons(approval, facts.calls.len()));
            (None, format!("{what}: {}", approval.summary))
        }
        ApprovalStatus::Approved => (
            Some(format!(":white_check_mark: *Approved* {decided}{outcome}")),
            format!("Approved: {}", approval.summary),
        ),
        ApprovalStatus::Rejected => (
            Some(format!(":x: *Rejected* {decided}{outcome}")),
            format!("Rejected: {}", approval.summary),
        ),
        ApprovalStatus::Expired => (
            Some(format!(
                ":hourglass: *Expired* at {}: nobody decided in time, so nothing was approved{outcome}",
                when(approval.decided_at)
            )),
            format!("Expired: {}", approval.summary),
        ),
        ApprovalStatus::Superseded => (
            Some(
                ":arrows_counterclockwise: *Replaced* by a newer plan: this one can no longer be approved. The new plan is posted on its own."
                    .to_owned(),
            ),
            format!("Replaced: {}", approval.summary),
        ),
    };
    if let Some(line) = status_line {
        blocks.push(section(line));
    }
    let blocks = Value::Array(blocks);
    let last = approval.status != ApprovalStatus::Pending
        && !matches!(run.status, RunStatus::Committing | RunStatus::Unwinding);
    let digest = hex::encode(Sha256::digest(format!("{text}\n{blocks}").as_bytes()));
    Shown {
        text: shorten(&text, SECTION_CHARS),
        blocks,
        digest,
        last,
    }
}

fn buttons(approval: &Approval, calls: usize) -> Value {
    let steps = if calls == 1 {
        "this step".to_owned()
    } else {
        format!("these {calls} steps")
    };
    json!({
        "type": "actions",
        "block_id": ACTIONS_BLOCK,
        "elements": [
            {
                "type": "button",
                "action_id": APPROVE,
                "style": "primary",
                "text": {"type": "plain_text", "text": "Approve"},
                "value": button_value(approval),
                "confirm": {
                    "title": {"type": "plain_text", "text": "Approve?"},
                    "text": {"type": "mrkdwn", "text": format!("The harness runs {steps} as shown, in order.")},
                    "confirm": {"type": "plain_text", "text": "Approve"},
                    "deny": {"type": "plain_text", "text": "Back"}
                }
            },
            {
                "type": "button",
                "action_id": REJECT,
                "style": "danger",
                "text": {"type": "plain_text", "text": "Reject"},
                "value": button_value(approval)
            }
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_button_value_reads_back_as_the_approval_and_its_digest() {
        assert_eq!(parse_button_value("12:abc"), Some((12, "abc")));
        assert_eq!(parse_button_value("12:"), None);
        assert_eq!(parse_button_value("x:abc"), None);
        assert_eq!(parse_button_value("12"), None);
    }

    #[test]
    fn agent_text_cannot_make_a_link_in_slack() {
        assert_eq!(
            escape("<https://evil.example|Approve> & more"),
            "&lt;https://evil.example|Approve&gt; &amp; more"
        );
    }
}
