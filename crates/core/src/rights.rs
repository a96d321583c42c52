//! Who may decide an approval. A tool may name the groups whose members
//! may approve a pivot or a held step that contains it (`approvers = […]`
//! on the tool, else `[approvals] approvers`). A person may decide when,
//! for every tool of the approval that names groups, they are in one of
//! them; under the two-person rule each of the two must be. The group that
//! gave the right is what the audit trail records.

use crate::model::{Approval, ApprovalKind, PivotPlan};
use crate::registry::Registry;

/// The groups one tool of an approval asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolRight {
    pub tool: String,
    pub groups: Vec<String>,
}

/// The tools of `approval` that name approver groups, each once, in the
/// plan's order. Empty: any approver may decide.
pub fn rights_of(registry: &Registry, approval: &Approval) -> Vec<ToolRight> {
    let tools: Vec<String> = match approval.kind {
        ApprovalKind::Pivot => PivotPlan::read(&approval.plan)
            .map(|plan| plan.commit.into_iter().map(|call| call.tool).collect())
            .unwrap_or_default(),
        ApprovalKind::Step => approval
            .plan
            .get("tool")
            .and_then(|tool| tool.as_str())
            .map(|tool| vec![tool.to_owned()])
            .unwrap_or_default(),
    };
    let mut rights: Vec<ToolRight> = Vec::new();
    for tool in tools {
        if rights.iter().any(|right| right.tool == tool) {
            continue;
        }
        let groups = registry.approver_groups(&tool);
        if !groups.is_empty() {
            rights.push(ToolRight {
                tool,
                groups: groups.to_vec(),
            });
        }
    }
    rights
}

/// Whether someone in `groups` may decide: `Ok` with the groups that gave
/// the right (the first of theirs each tool accepts, without repeats), or
/// `Err` with the rights they lack.
pub fn granted(rights: &[ToolRight], groups: &[String]) -> Result<Vec<String>, Vec<ToolRight>> {
    let mut giving: Vec<String> = Vec::new();
    let mut lacking = Vec::new();
    for right in rights {
        match right.groups.iter().find(|g| groups.contains(g)) {
            Some(group) => {
                if !giving.contains(group) {
                    giving.push(group.clone());
                }
            }
            None => lacking.push(right.clone()),
        }
    }
    if lacking.is_empty() {
        Ok(giving)
    } else {
        Err(lacking)
    }
}

/// Who may decide, as the run page and a refusal say it: "Only members of
/// billing-leads may decide this." `None` when any approver may.
pub fn who_may(rights: &[ToolRight]) -> Option<String> {
    let alternatives = |right: &ToolRight| right.groups.join(" or ");
    match rights {
        [] => None,
        [one] => Some(format!(
            "Only members of {} may decide this.",
            alternatives(one)
        )),
        many if many.iter().all(|r| r.groups == many[0].groups) => Some(format!(
            "Only members of {} may decide this.",
            alternatives(&many[0])
        )),
        many => {
            let each: Vec<String> = many
                .iter()
                .map(|r| format!("{} (for {})", alternatives(r), r.tool))
                .collect();
            Some(format!(
                "Only someone who is in each of {} may decide this.",
                each.join(" and ")
            ))
        }
    }
}

/// How a person came to be deciding, for the audit trail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignedIn {
    /// A local account's password, in the dashboard.
    Password,
    /// The identity provider: its issuer and the person's subject there.
    Provider { issuer: String, subject: String },
    /// A Slack user linked to a local account.
    Slack { user: String },
}

impl SignedIn {
    fn words(&self) -> String {
        match self {
            SignedIn::Password => "signed in with a local password".into(),
            SignedIn::Provider { issuer, subject } => {
                format!("signed in through {issuer} as {subject}")
            }
            SignedIn::Slack { user } => format!("pressed in Slack as {user}"),
        }
    }
}

/// The audit line that says where a decision's right came from.
pub fn right_note(signed_in: &SignedIn, giving: &[String]) -> String {
    let right = match giving {
        [] => "no group is asked for".to_owned(),
        [one] => format!("the right from group {one}"),
        many => format!("the right from groups {}", many.join(", ")),
    };
    format!("decided having {}; {right}", signed_in.words())
}

/// The audit line of a refused attempt to decide.
pub fn refused_note(
    signed_in: &SignedIn,
    approval_id: i64,
    groups: &[String],
    lacking: &[ToolRight],
) -> String {
    format!(
        "refused a decision on approval {approval_id} ({}; in {}): {}",
        signed_in.words(),
        if groups.is_empty() {
            "no group".to_owned()
        } else {
            groups.join(", ")
        },
        who_may(lacking).unwrap_or_default()
    )
}

/// A refused attempt to decide: the audit line, and the words for the
/// person (after "You cannot approve this: " in Slack).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub audit: String,
    pub words: String,
}

/// Whether `person`, in `groups` and signed in as `signed_in`, may decide
/// `approval`: `Ok` with the audit line of the right, to write once the
/// decision is made; `Err` with the refusal to audit and to say.
pub fn judge(
    registry: &Registry,
    approval: &Approval,
    person: &str,
    signed_in: &SignedIn,
    groups: &[String],
) -> Result<String, Refused> {
    let needed = rights_of(registry, approval);
    match granted(&needed, groups) {
        Ok(giving) => Ok(right_note(signed_in, &giving)),
        Err(lacking) => Err(Refused {
            audit: refused_note(signed_in, approval.id, groups, &lacking),
            words: format!(
                "{} {person} is not in a group that may.",
                who_may(&lacking).unwrap_or_default()
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn right(tool: &str, groups: &[&str]) -> ToolRight {
        ToolRight {
            tool: tool.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn groups(names: &[&str]) -> Vec<String> {
        names.iter().map(|g| g.to_string()).collect()
    }

    #[test]
    fn a_person_may_decide_only_when_allowed_for_every_tool_that_names_groups() {
        let rights = [
            right("refund_payment", &["billing-leads"]),
            right("send_email", &["support-leads", "billing-leads"]),
        ];
        assert_eq!(
            granted(&rights, &groups(&["billing-leads"])),
            Ok(groups(&["billing-leads"]))
        );
        assert_eq!(
            granted(&rights, &groups(&["support-leads"])),
            Err(vec![rights[0].clone()])
        );
        assert_eq!(
            granted(&rights, &groups(&["support-leads", "billing-leads"])),
            Ok(groups(&["billing-leads", "support-leads"]))
        );
        assert_eq!(
            granted(&[], &[]),
            Ok(vec![]),
            "no groups named: any approver"
        );
    }

    #[test]
    fn who_may_decide_is_said_in_one_sentence() {
        assert_eq!(who_may(&[]), None);
        assert_eq!(
            who_may(&[right("refund_payment", &["billing-leads"])]).unwrap(),
            "Only members of billing-leads may decide this."
        );
        assert_eq!(
            who_may(&[
                right("refund_payment", &["billing-leads"]),
                right("send_email", &["support-leads"])
            ])
            .unwrap(),
            "Only someone who is in each of billing-leads (for refund_payment) and support-leads (for send_email) may decide this."
        );
    }
}
