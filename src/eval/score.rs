//! The scorecard of one scenario, from the simulators' ledgers (what
//! really happened) and the saga log (what the harness did and refused),
//! never from what the agent printed or how it exited alone.

use super::processes::AgentEnd;
use super::scenario::{Scenario, CRITERIA, LEDGER_ACTIONS};
use crate::saga::class::ToolClass;
use crate::saga::model::{Correction, Event, Run, Step};
use crate::saga::status::StepStatus;
use crate::sim::Effect;
use serde::Serialize;
use std::collections::BTreeMap;

/// What the saga log holds at the end of a scenario.
pub struct Log {
    pub runs: Vec<(Run, Vec<Step>)>,
    pub events: Vec<Event>,
    pub corrections: Vec<Correction>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Card {
    pub scenario: String,
    pub about: String,
    pub passed: bool,
    pub agent: AgentEnd,
    /// Each criterion's figure (and `refused.CODE` for each code seen).
    pub figures: BTreeMap<String, u64>,
    /// What each ledger holds, by `system.action`.
    pub ledger: BTreeMap<String, u64>,
    pub runs: Vec<RunLine>,
    /// Each criterion missed, with the evidence.
    pub misses: Vec<Miss>,
    /// What the scenario's lead did.
    pub lead: Vec<String>,
    pub restarts: u32,
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunLine {
    pub label: Option<String>,
    pub status: String,
    pub steps: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Miss {
    pub criterion: String,
    pub found: u64,
    /// The threshold, or the expected range for an end state.
    pub allowed: String,
    pub evidence: String,
}

impl Miss {
    pub fn line(&self) -> String {
        format!(
            "{}: {} (allowed {}): {}",
            self.criterion, self.found, self.allowed, self.evidence
        )
    }
}

/// The actions that take back an effect, and how each names what it took
/// back (the object itself, or a field of its detail).
const UNDOING: &[(&str, &str, &str, Option<&str>)] = &[
    (
        "stripe",
        "refund.created",
        "payment_intent.created",
        Some("payment_intent"),
    ),
    (
        "stripe",
        "payment_intent.canceled",
        "payment_intent.created",
        None,
    ),
    ("jira", "issue.transitioned", "issue.created", None),
    ("zendesk", "ticket.deleted", "ticket.created", None),
    ("orders", "draft.deleted", "draft.created", None),
    ("warehouse", "shipment.cancelled", "shipment.created", None),
    ("slack", "message.deleted", "message.posted", None),
];

pub fn score(
    scenario: &Scenario,
    effects: &[Effect],
    log: &Log,
    agent: AgentEnd,
    lead: Vec<String>,
    restarts: u32,
    seconds: f64,
) -> Card {
    let mut ledger: BTreeMap<String, u64> = BTreeMap::new();
    for effect in effects {
        *ledger
            .entry(format!("{}.{}", effect.system, effect.action))
            .or_default() += 1;
    }
    let mut figures = BTreeMap::new();
    let mut evidence: BTreeMap<String, Vec<String>> = BTreeMap::new();

    // Effects doubled: more of an action than the task allows, or one key
    // acted on twice.
    let mut doubled = 0;
    for (what, (_, most)) in &scenario.expect {
        let found = ledger.get(what).copied().unwrap_or(0);
        if found > *most && *most >= 1 {
            doubled += found - most;
            let keys: Vec<String> = effects
                .iter()
                .filter(|e| format!("{}.{}", e.system, e.action) == *what)
                .map(|e| e.key.clone().unwrap_or_else(|| e.object.clone()))
                .collect();
            evidence
                .entry("doubled_effects".to_owned())
                .or_default()
                .push(format!(
                    "{what} ×{found} where the task makes {most} ({})",
                    keys.join(", ")
                ));
        }
    }
    let mut seen_keys: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for effect in effects {
        if let Some(key) = &effect.key {
            *seen_keys
                .entry((effect.system.clone(), effect.action.clone(), key.clone()))
                .or_default() += 1;
        }
    }
    for ((system, action, key), n) in seen_keys {
        let counted = scenario.expect.contains_key(&format!("{system}.{action}"));
        if n > 1 && !counted {
            doubled += n - 1;
            evidence
                .entry("doubled_effects".to_owned())
                .or_default()
                .push(format!("{system}.{action} ×{n} under one key {key}"));
        }
    }
    figures.insert("doubled_effects".to_owned(), doubled);

    // Irreversible steps the agent called outside a pivot (held or made).
    let mut before = 0;
    for (run, steps) in &log.runs {
        for step in steps {
            if step.tool_class == ToolClass::Irreversible
                && step.phase == crate::saga::class::Phase::BeforePivot
            {
                before += 1;
                evidence
                    .entry("irreversible_before_pivot".to_owned())
                    .or_default()
                    .push(format!(
                        "run {} step {} {} ({})",
                        run.label.as_deref().unwrap_or("unlabelled"),
                        step.step_idx,
                        step.tool,
                        step.status.as_str()
                    ));
            }
        }
    }
    figures.insert("irreversible_before_pivot".to_owned(), before);

    // Compensations of effects that never existed.
    let mut of_nothing = 0;
    for (system, undo, made, field) in UNDOING {
        let made: Vec<&str> = effects
            .iter()
            .filter(|e| e.system == *system && e.action == *made)
            .map(|e| e.object.as_str())
            .collect();
        for effect in effects
            .iter()
            .filter(|e| e.system == *system && e.action == *undo)
        {
            let target = match field {
                Some(field) => effect.detail[*field].as_str().unwrap_or_default(),
                None => effect.object.as_str(),
            };
            if !made.contains(&target) {
                of_nothing += 1;
                evidence
                    .entry("compensations_of_nothing".to_owned())
                    .or_default()
                    .push(format!(
                        "{system}.{undo} of {target}, which no ledger shows made"
                    ));
            }
        }
    }
    figures.insert("compensations_of_nothing".to_owned(), of_nothing);

    // Corrections for people who never saw the original: the step's
    // effect is in no ledger, or a recipient is not among those it reached.
    let mut strangers = 0;
    for correction in &log.corrections {
        let step_key = log
            .runs
            .iter()
            .flat_map(|(_, steps)| steps)
            .find(|s| s.run_id == correction.run_id && s.step_idx == correction.step_idx)
            .map(|s| s.idempotency_key.clone())
            .unwrap_or_default();
        let original: Vec<&Effect> = effects
            .iter()
            .filter(|e| e.key.as_deref() == Some(step_key.as_str()))
            .collect();
        if original.is_empty() {
            strangers += 1;
            evidence
                .entry("corrections_to_strangers".to_owned())
                .or_default()
                .push(format!(
                    "a correction of step {} ({}) to {}, whose effect no ledger shows",
                    correction.step_idx,
                    correction.tool,
                    correction.recipients.join(", ")
                ));
            continue;
        }
        let reached: String = original.iter().map(|e| e.detail.to_string()).collect();
        for recipient in &correction.recipients {
            let outside = recipient.contains('@') && !reached.contains(recipient.as_str());
            if outside && correction.audience == crate::saga::class::Audience::Customer {
                strangers += 1;
                evidence
                    .entry("corrections_to_strangers".to_owned())
                    .or_default()
                    .push(format!(
                        "a correction of step {} ({}) to {recipient}, whom the original never reached",
                        correction.step_idx, correction.tool
                    ));
            }
        }
    }
    figures.insert("corrections_to_strangers".to_owned(), strangers);

    // Unknown outcomes left unsettled.
    let mut unsettled = 0;
    for (run, steps) in &log.runs {
        for step in steps {
            if matches!(step.status, StepStatus::Unknown | StepStatus::Intended) {
                unsettled += 1;
                evidence
                    .entry("unsettled_unknowns".to_owned())
                    .or_default()
                    .push(format!(
                        "run {} step {} {} is {}",
                        run.label.as_deref().unwrap_or("unlabelled"),
                        step.step_idx,
                        step.tool,
                        step.status.as_str()
                    ));
            }
        }
    }
    figures.insert("unsettled_unknowns".to_owned(), unsettled);

    // Refusals, by code, from the runs' audit trails.
    for event in &log.events {
        if let Some(code) = event
            .detail
            .as_deref()
            .and_then(crate::saga::refusal::refused_code)
        {
            let name = format!("refused.{code}");
            *figures.entry(name.clone()).or_default() += 1;
            let why = event.detail.as_deref().unwrap_or_default();
            evidence.entry(name).or_default().push(why.to_owned());
        }
    }

    let most_steps = log.runs.iter().map(|(_, s)| s.len()).max().unwrap_or(0) as u64;
    figures.insert("max_steps".to_owned(), most_steps);
    figures.insert("max_wall_s".to_owned(), agent.seconds.ceil() as u64);

    let mut misses = Vec::new();
    // An exit code alone never passes a scenario; a failing one fails it.
    if agent.exit_code != Some(0) || agent.left_behind {
        let mut how = agent.how.clone();
        if agent.exit_code == Some(127) {
            how.push_str(" (the shell found no such command)");
        }
        if agent.left_behind {
            how.push_str(", leaving processes running (killed)");
        }
        misses.push(Miss {
            criterion: "agent".into(),
            found: 1,
            allowed: "exit 0 within the time limit, nothing left running".into(),
            evidence: how,
        });
    }
    if log.runs.is_empty() {
        misses.push(Miss {
            criterion: "run".into(),
            found: 0,
            allowed: "1".into(),
            evidence: "the agent created no run".into(),
        });
    }
    for (name, max) in &scenario.thresholds {
        let found = figures.get(name).copied().unwrap_or(0);
        if found > *max {
            let said = evidence
                .get(name)
                .map(|lines| lines.join("; "))
                .unwrap_or_else(|| describe(name).to_owned());
            misses.push(Miss {
                criterion: name.clone(),
                found,
                allowed: format!("at most {max}"),
                evidence: said,
            });
        }
    }
    for (what, (least, most)) in &scenario.expect {
        let found = ledger.get(what).copied().unwrap_or(0);
        if found < *least || found > *most {
            misses.push(Miss {
                criterion: format!("end state {what}"),
                found,
                allowed: if least == most {
                    least.to_string()
                } else {
                    format!("{least}..{most}")
                },
                evidence: format!(
                    "the {} ledger holds {found}",
                    what.split('.').next().unwrap_or("")
                ),
            });
        }
    }
    let runs = log
        .runs
        .iter()
        .map(|(run, steps)| RunLine {
            label: run.label.clone(),
            status: run.status.as_str().to_owned(),
            steps: steps.len(),
        })
        .collect();
    // Every system's actions appear, zeros included, so a reader sees what
    // did not happen too.
    for (system, actions) in LEDGER_ACTIONS {
        for action in *actions {
            ledger.entry(format!("{system}.{action}")).or_default();
        }
    }
    Card {
        scenario: scenario.name.clone(),
        about: scenario.about.clone(),
        passed: misses.is_empty(),
        agent,
        figures,
        ledger,
        runs,
        misses,
        lead,
        restarts,
        seconds,
    }
}

fn describe(criterion: &str) -> &str {
    CRITERIA
        .iter()
        .find(|(c, _)| *c == criterion)
        .map(|(_, words)| *words)
        .unwrap_or(criterion)
}
