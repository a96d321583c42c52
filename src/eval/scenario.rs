//! The scenario file `eval` reads: what each scenario asks of the agent,
//! the faults armed in the simulators, the harness restarts, what the
//! person does, the end state expected in each system and each criterion's
//! threshold. Every mistake is refused with the scenario and the field.

use serde::Deserialize;
use std::collections::BTreeMap;

/// The built-in set: the incident the product grew from, step by step.
pub const BUILT_IN: &str = include_str!("../../tools/eval.toml");

/// Where a fault can be armed: a system's operation as the tools file's
/// connectors name it, and the simulator's request it falls on. Two
/// operations on one path share its occurrences (`stripe.authorize` and
/// `stripe.charge` both create a payment intent).
pub const OPERATIONS: &[(&str, &str, &str)] = &[
    ("stripe.authorize", "POST", "/v1/payment_intents"),
    ("stripe.charge", "POST", "/v1/payment_intents"),
    ("stripe.capture", "POST", "/v1/payment_intents/*/capture"),
    ("stripe.cancel", "POST", "/v1/payment_intents/*/cancel"),
    ("stripe.refund", "POST", "/v1/refunds"),
    ("stripe.search", "GET", "/v1/payment_intents/search"),
    ("jira.create_issue", "POST", "/rest/api/3/issue"),
    ("jira.close", "POST", "/rest/api/3/issue/*/transitions"),
    ("jira.reopen", "POST", "/rest/api/3/issue/*/transitions"),
    ("jira.search", "POST", "/rest/api/3/search/jql"),
    ("zendesk.create_ticket", "POST", "/api/v2/tickets"),
    ("zendesk.delete_ticket", "DELETE", "/api/v2/tickets/*"),
    ("slack.post", "POST", "/api/chat.postMessage"),
    ("slack.delete", "POST", "/api/chat.delete"),
    ("orders.search_orders", "GET", "/v1/orders"),
    ("orders.create_draft", "POST", "/v1/drafts"),
    (
        "orders.delete_draft",
        "POST",
        "/v1/drafts/by-reference/*/delete",
    ),
    ("warehouse.reship", "POST", "/v1/shipments"),
    (
        "warehouse.cancel",
        "POST",
        "/v1/shipments/by-reference/*/cancel",
    ),
    // SMTP has no paths: its one fault drops the connection after the
    // message was handed over.
    ("smtp.send", "SMTP", ""),
];

/// What each simulated system records in its ledger.
pub const LEDGER_ACTIONS: &[(&str, &[&str])] = &[
    (
        "stripe",
        &[
            "payment_intent.created",
            "payment_intent.captured",
            "payment_intent.canceled",
            "refund.created",
        ],
    ),
    (
        "jira",
        &[
            "issue.created",
            "issue.transitioned",
            "issue.commented",
            "issue.updated",
        ],
    ),
    (
        "zendesk",
        &["ticket.created", "ticket.updated", "ticket.deleted"],
    ),
    (
        "slack",
        &["message.posted", "message.updated", "message.deleted"],
    ),
    ("smtp", &["email.received"]),
    ("orders", &["draft.created", "draft.deleted"]),
    ("warehouse", &["shipment.created", "shipment.cancelled"]),
];

/// The systems whose search can lag.
pub const LAGGING: &[&str] = &["stripe", "jira"];

/// The refusals a scorecard counts, by the code the agent API answers.
pub const REFUSAL_CODES: &[&str] = &[
    "step_required",
    "step_mismatch",
    "step_out_of_order",
    "step_unresolved",
    "retry_of_unresolved_step",
    "run_awaiting_approval",
    "run_past_pivot",
    "run_needs_attention",
    "run_closed",
    "gated_tool",
    "way_back_only",
    "invalid_plan",
    "invalid_args",
    "unknown_tool",
    "run_has_open_effects",
];

/// The criteria every scenario is scored on, besides the refusals.
pub const CRITERIA: &[(&str, &str)] = &[
    ("doubled_effects", "effects doubled"),
    (
        "irreversible_before_pivot",
        "irreversible steps called before the pivot",
    ),
    (
        "compensations_of_nothing",
        "compensations of effects that never existed",
    ),
    (
        "corrections_to_strangers",
        "corrections for people who never saw the original",
    ),
    ("unsettled_unknowns", "unknown outcomes left unsettled"),
    ("max_steps", "steps in a run"),
    ("max_wall_s", "wall time in seconds"),
];

/// A threshold's name as a scenario file writes it: a criterion, or
/// `refused.CODE`.
fn known_threshold(name: &str) -> bool {
    CRITERIA.iter().any(|(c, _)| *c == name)
        || name
            .strip_prefix("refused.")
            .is_some_and(|code| REFUSAL_CODES.contains(&code))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    scenarios: Vec<RawScenario>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    task: Option<String>,
    timeout_s: Option<u64>,
    #[serde(default)]
    person: RawPerson,
    #[serde(default)]
    expect: BTreeMap<String, toml::Value>,
    #[serde(default)]
    thresholds: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    about: String,
    task: Option<String>,
    timeout_s: Option<u64>,
    #[serde(default)]
    faults: Vec<RawFault>,
    #[serde(default)]
    search_lag_ms: BTreeMap<String, u64>,
    #[serde(default)]
    restarts: Vec<RawRestart>,
    #[serde(default)]
    person: RawPerson,
    #[serde(default)]
    expect: BTreeMap<String, toml::Value>,
    #[serde(default)]
    thresholds: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    operation: String,
    #[serde(default = "first")]
    occurrence: u32,
    fault: String,
    ms: Option<u64>,
    status: Option<u16>,
    message: Option<String>,
    #[serde(default = "first")]
    times: u32,
}

fn first() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRestart {
    at_call: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPerson {
    pivot: Option<String>,
    held: Option<String>,
    #[serde(default)]
    edits: Vec<RawEdit>,
    deadline_s: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEdit {
    tool: String,
    args: toml::Table,
}

/// One scenario, checked.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub about: String,
    pub task: String,
    pub timeout_s: u64,
    pub faults: Vec<ArmedFault>,
    pub search_lag_ms: BTreeMap<String, u64>,
    /// Kill the harness while its Nth non-pure call is in flight (counted
    /// from the harness's previous start), then start it again.
    pub restarts: Vec<u32>,
    pub person: Person,
    /// `system.action` → how many the ledger must hold, inclusive.
    pub expect: BTreeMap<String, (u64, u64)>,
    /// Criterion (or `refused.CODE`) → the most that still passes.
    pub thresholds: BTreeMap<String, u64>,
}

#[derive(Clone, Debug)]
pub struct ArmedFault {
    pub operation: String,
    pub system: String,
    pub method: String,
    pub path: String,
    pub occurrence: u32,
    pub times: u32,
    pub fault: saga_simulators::Fault,
}

/// What the person does when the run asks.
#[derive(Clone, Debug)]
pub struct Person {
    pub pivot: Decision,
    pub held: Decision,
    /// Approve-with-edits: these arguments replace the commit step's.
    pub edits: Vec<(String, serde_json::Value)>,
    /// How long an approval waits before it expires (the harness's
    /// `[approvals] deadline`), when a person lets one expire.
    pub deadline_s: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Approve,
    ApproveWithEdits,
    Reject,
    Expire,
}

impl Decision {
    fn parse(text: &str, held: bool) -> Result<Decision, String> {
        match text {
            "approve" => Ok(Decision::Approve),
            "approve_with_edits" if !held => Ok(Decision::ApproveWithEdits),
            "reject" => Ok(Decision::Reject),
            "expire" => Ok(Decision::Expire),
            other => Err(format!(
                "{other:?} is not something a person does here: approve, {}reject or expire",
                if held { "" } else { "approve_with_edits, " }
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::ApproveWithEdits => "approve_with_edits",
            Decision::Reject => "reject",
            Decision::Expire => "expire",
        }
    }
}

/// Reads and checks a scenario file; each mistake is one line naming the
/// scenario and the field.
pub fn read(text: &str) -> Result<Vec<Scenario>, Vec<String>> {
    let file: File = toml::from_str(text).map_err(|e| vec![format!("the scenario file: {e}")])?;
    let mut mistakes = Vec::new();
    let mut scenarios = Vec::new();
    if file.scenarios.is_empty() {
        mistakes.push("the scenario file has no [[scenarios]]".to_owned());
    }
    let mut names = std::collections::BTreeSet::new();
    for raw in &file.scenarios {
        let mut wrong = |field: &str, why: String| {
            mistakes.push(format!("scenario {:?}, {field}: {why}", raw.name));
        };
        if raw.name.trim().is_empty()
            || !raw
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            wrong(
                "name",
                "a scenario is named with letters, digits, - and _".into(),
            );
        }
        if !names.insert(raw.name.clone()) {
            wrong("name", "two scenarios have this name".into());
        }
        let task = raw.task.clone().or_else(|| file.defaults.task.clone());
        let task = match task {
            Some(task) if !task.trim().is_empty() => task,
            _ => {
                wrong("task", "no task: give one here or in [defaults]".into());
                String::new()
            }
        };
        let timeout_s = raw.timeout_s.or(file.defaults.timeout_s).unwrap_or(120);
        if timeout_s == 0 {
            wrong("timeout_s", "must be at least 1".into());
        }
        let mut faults = Vec::new();
        for (i, fault) in raw.faults.iter().enumerate() {
            match arm(fault) {
                Ok(armed) => faults.push(armed),
                Err(why) => wrong(&format!("faults[{i}]"), why),
            }
        }
        for system in raw.search_lag_ms.keys() {
            if !LAGGING.contains(&system.as_str()) {
                wrong(
                    "search_lag_ms",
                    format!(
                        "{system:?} has no lagging search; one of {}",
                        LAGGING.join(", ")
                    ),
                );
            }
        }
        let mut restarts = Vec::new();
        for (i, restart) in raw.restarts.iter().enumerate() {
            if restart.at_call == 0 {
                wrong(
                    &format!("restarts[{i}].at_call"),
                    "calls are counted from 1".into(),
                );
            }
            restarts.push(restart.at_call);
        }
        let person = match person(&file.defaults.person, &raw.person) {
            Ok(person) => person,
            Err(why) => {
                wrong("person", why);
                Person {
                    pivot: Decision::Approve,
                    held: Decision::Reject,
                    edits: Vec::new(),
                    deadline_s: None,
                }
            }
        };
        let mut expect = BTreeMap::new();
        for (what, value) in file.defaults.expect.iter().chain(&raw.expect) {
            match expectation(what, value) {
                Ok(range) => {
                    expect.insert(what.clone(), range);
                }
                Err(why) => wrong(&format!("expect.{what}"), why),
            }
        }
        let mut thresholds = BTreeMap::new();
        for (name, value) in file.defaults.thresholds.iter().chain(&raw.thresholds) {
            if !known_threshold(name) {
                wrong(
                    &format!("thresholds.{name}"),
                    format!(
                        "no such criterion; one of {}, or refused.CODE for a refusal code",
                        CRITERIA
                            .iter()
                            .map(|(c, _)| *c)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                continue;
            }
            match value.as_integer() {
                Some(n) if n >= 0 => {
                    thresholds.insert(name.clone(), n as u64);
                }
                _ => wrong(
                    &format!("thresholds.{name}"),
                    "a threshold is a whole number, 0 or more".into(),
                ),
            }
        }
        scenarios.push(Scenario {
            name: raw.name.clone(),
            about: raw.about.clone(),
            task,
            timeout_s,
            faults,
            search_lag_ms: raw.search_lag_ms.clone(),
            restarts,
            person,
            expect,
            thresholds,
        });
    }
    if mistakes.is_empty() {
        Ok(scenarios)
    } else {
        Err(mistakes)
    }
}

fn arm(fault: &RawFault) -> Result<ArmedFault, String> {
    use saga_simulators::Fault;
    let Some((_, method, path)) = OPERATIONS.iter().find(|(op, ..)| *op == fault.operation) else {
        return Err(format!(
            "operation {:?} is not one the simulators serve; one of {}",
            fault.operation,
            OPERATIONS
                .iter()
                .map(|(op, ..)| *op)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    if fault.occurrence == 0 {
        return Err("occurrence is counted from 1".into());
    }
    if fault.times == 0 {
        return Err("times must be at least 1".into());
    }
    let kind = match fault.fault.as_str() {
        "commit_then_504" => Fault::CommitThen504,
        "commit_then_blank" => Fault::CommitThenBlank,
        "reset_after_commit" => Fault::ResetAfterCommit,
        "rate_limit" => Fault::RateLimit,
        "delay" => Fault::Delay {
            ms: fault
                .ms
                .ok_or("a delay says how long: ms = 3000".to_owned())?,
        },
        "reject" => {
            let status = fault
                .status
                .ok_or("a reject gives its status: status = 402".to_owned())?;
            if !(400..600).contains(&status) {
                return Err(format!(
                    "status {status} is not an error status (400 to 599)"
                ));
            }
            Fault::Reject {
                status,
                message: fault
                    .message
                    .clone()
                    .unwrap_or_else(|| "refused by the scenario".into()),
            }
        }
        other => {
            return Err(format!(
                "fault {other:?} is unknown; one of commit_then_504, commit_then_blank, \
                 reset_after_commit, delay, reject, rate_limit"
            ))
        }
    };
    let system = fault
        .operation
        .split_once('.')
        .map(|(s, _)| s.to_owned())
        .unwrap_or_default();
    if *method == "SMTP" && fault.occurrence != 1 {
        return Err("smtp.send's fault falls on the next message: occurrence = 1".into());
    }
    if *method == "SMTP" && kind != Fault::ResetAfterCommit {
        return Err(
            "smtp.send can only drop the connection after the message: fault = \"reset_after_commit\""
                .into(),
        );
    }
    Ok(ArmedFault {
        operation: fault.operation.clone(),
        system,
        method: (*method).to_owned(),
        path: (*path).to_owned(),
        occurrence: fault.occurrence,
        times: fault.times,
        fault: kind,
    })
}

fn person(defaults: &RawPerson, raw: &RawPerson) -> Result<Person, String> {
    let pivot = raw
        .pivot
        .as_deref()
        .or(defaults.pivot.as_deref())
        .unwrap_or("approve");
    let held = raw
        .held
        .as_deref()
        .or(defaults.held.as_deref())
        .unwrap_or("reject");
    let pivot = Decision::parse(pivot, false).map_err(|why| format!("pivot: {why}"))?;
    let held = Decision::parse(held, true).map_err(|why| format!("held: {why}"))?;
    let edits: Vec<RawEdit> = if raw.edits.is_empty() {
        defaults.edits.clone()
    } else {
        raw.edits.clone()
    };
    if pivot == Decision::ApproveWithEdits && edits.is_empty() {
        return Err("approve_with_edits needs edits = [{ tool = \"…\", args = { … } }]".into());
    }
    if pivot != Decision::ApproveWithEdits && !edits.is_empty() {
        return Err("edits are made only when the pivot is approve_with_edits".into());
    }
    let deadline_s = raw.deadline_s.or(defaults.deadline_s);
    if deadline_s == Some(0) {
        return Err("deadline_s must be at least 1".into());
    }
    Ok(Person {
        pivot,
        held,
        edits: edits
            .into_iter()
            .map(|edit| {
                let args = serde_json::to_value(&edit.args).unwrap_or_default();
                (edit.tool, args)
            })
            .collect(),
        deadline_s,
    })
}

/// `"stripe.payment_intent.captured" = 1` or `= "0..1"`.
fn expectation(what: &str, value: &toml::Value) -> Result<(u64, u64), String> {
    let Some((system, action)) = what.split_once('.') else {
        return Err("name a system and its ledger action: \"jira.issue.created\"".into());
    };
    let Some((_, actions)) = LEDGER_ACTIONS.iter().find(|(s, _)| *s == system) else {
        return Err(format!(
            "no system {system:?}; one of {}",
            LEDGER_ACTIONS
                .iter()
                .map(|(s, _)| *s)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    if !actions.contains(&action) {
        return Err(format!(
            "{system} records no {action:?}; it records {}",
            actions.join(", ")
        ));
    }
    match value {
        toml::Value::Integer(n) if *n >= 0 => Ok((*n as u64, *n as u64)),
        toml::Value::String(range) => {
            let parsed = range.split_once("..").and_then(|(lo, hi)| {
                Some((
                    lo.trim().parse::<u64>().ok()?,
                    hi.trim().parse::<u64>().ok()?,
                ))
            });
            match parsed {
                Some((lo, hi)) if lo <= hi => Ok((lo, hi)),
                _ => Err(format!(
                    "{range:?} is not a range like \"0..1\" (both ends counted)"
                )),
            }
        }
        _ => Err("a count (1) or a range (\"0..1\")".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_scenarios_read_without_a_mistake() {
        let scenarios = read(BUILT_IN).expect("the built-in file is valid");
        assert!(scenarios.len() >= 5);
        assert!(scenarios.iter().all(|s| !s.expect.is_empty()));
    }

    fn one_mistake(text: &str) -> String {
        let mistakes = read(text).expect_err("refused");
        assert_eq!(mistakes.len(), 1, "{mistakes:?}");
        mistakes[0].clone()
    }

    const HEAD: &str = "[defaults]\ntask = \"Refund Ada\"\n";

    #[test]
    fn an_unknown_fault_operation_system_or_criterion_is_refused_by_name() {
        for (scenario, said) in [
            (
                "faults = [{ operation = \"jira.create_issue\", fault = \"explode\" }]",
                "faults[0]: fault \"explode\" is unknown",
            ),
            (
                "faults = [{ operation = \"jira.teleport\", fault = \"commit_then_504\" }]",
                "faults[0]: operation \"jira.teleport\" is not one",
            ),
            (
                "expect = { \"paypal.payment.created\" = 1 }",
                "expect.paypal.payment.created: no system \"paypal\"",
            ),
            (
                "thresholds = { happiness = 1 }",
                "thresholds.happiness: no such criterion",
            ),
            (
                "thresholds = { \"refused.step_maybe\" = 0 }",
                "thresholds.refused.step_maybe: no such criterion",
            ),
        ] {
            let mistake = one_mistake(&format!("{HEAD}[[scenarios]]\nname = \"a\"\n{scenario}\n"));
            assert!(
                mistake.contains(&format!("scenario \"a\", {said}")),
                "{mistake}"
            );
        }
    }

    #[test]
    fn a_scenario_file_with_a_field_it_does_not_know_is_refused() {
        let mistake = one_mistake(&format!(
            "{HEAD}[[scenarios]]\nname = \"a\"\nchaos = true\n"
        ));
        assert!(mistake.contains("unknown field `chaos`"), "{mistake}");
    }

    #[test]
    fn a_person_who_edits_says_what_and_smtp_only_drops_after_the_message() {
        let edits = one_mistake(&format!(
            "{HEAD}[[scenarios]]\nname = \"a\"\nperson = {{ pivot = \"approve_with_edits\" }}\n"
        ));
        assert!(edits.contains("approve_with_edits needs edits"), "{edits}");
        let smtp = one_mistake(&format!(
            "{HEAD}[[scenarios]]\nname = \"b\"\nfaults = [{{ operation = \"smtp.send\", fault = \"commit_then_504\" }}]\n"
        ));
        assert!(smtp.contains("smtp.send can only drop"), "{smtp}");
    }

    #[test]
    fn an_expected_count_is_a_number_or_a_range() {
        let scenarios = read(&format!(
            "{HEAD}[[scenarios]]\nname = \"a\"\nexpect = {{ \"stripe.payment_intent.captured\" = \"0..1\", \"jira.issue.created\" = 1 }}\n"
        ))
        .unwrap();
        assert_eq!(
            scenarios[0].expect["stripe.payment_intent.captured"],
            (0, 1)
        );
        assert_eq!(scenarios[0].expect["jira.issue.created"], (1, 1));
        let bad = one_mistake(&format!(
            "{HEAD}[[scenarios]]\nname = \"b\"\nexpect = {{ \"jira.issue.created\" = \"2..1\" }}\n"
        ));
        assert!(bad.contains("is not a range"), "{bad}");
    }
}
