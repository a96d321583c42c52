//! The run page's view model, built on the server from the store: what
//! the page shows and which questions and actions it offers (the rules come
//! from `saga::questions`).

use super::*;
use crate::saga::class::ToolClass;
use crate::saga::model::{ApprovalKind, Event, Step};
use crate::saga::status::StepStatus;
use crate::saga::store::StoreError;
use crate::saga::words::Referents;
use crate::state::AppState;
use serde_json::Value;

/// What a waiting approval's panel says of its wait: when it expires
/// and where else it was asked for (Slack, the escalation channel).
async fn waiting_note(
    store: &dyn crate::saga::store::SagaStore,
    approval: &crate::saga::model::Approval,
) -> Result<Option<String>, StoreError> {
    use crate::saga::model::NoticeStatus;
    let mut said = Vec::new();
    if approval.approvers_needed > 1 {
        said.push(match &approval.first_approver {
            Some(first) => format!(
                "1 of {} approvals: {} approved; a second, different approver decides",
                approval.approvers_needed,
                first.name()
            ),
            None => format!(
                "needs {} different approvers (the two-person rule)",
                approval.approvers_needed
            ),
        });
    }
    if let Some(at) = approval.expires_at {
        said.push(format!(
            "expires at {} if nobody decides (an expiry is never counted as a rejection)",
            when(at)
        ));
    }
    for notice in store.notices(approval.id).await? {
        let place = if notice.place == crate::saga::model::NoticePlace::Escalation {
            "escalated to"
        } else {
            "posted to"
        };
        match notice.status {
            NoticeStatus::Posted => said.push(format!("{place} {} in Slack", notice.channel)),
            NoticeStatus::Failed => said.push(format!(
                "could not be posted to {} in Slack: {}",
                notice.channel,
                notice.error.unwrap_or_default()
            )),
            NoticeStatus::Intended | NoticeStatus::Unknown => {}
        }
    }
    Ok((!said.is_empty()).then(|| said.join(" · ")))
}

/// Who may decide `approval`, and whether `viewer`'s groups let them.
fn deciders(
    registry: &crate::saga::registry::Registry,
    approval: &crate::saga::model::Approval,
    viewer: &crate::ui::SessionUser,
) -> Deciders {
    use crate::saga::rights;
    let needed = rights::rights_of(registry, approval);
    Deciders {
        who: rights::who_may(&needed),
        you: rights::granted(&needed, &viewer.groups).is_ok(),
    }
}

/// The run page as `viewer` sees it: what they may decide and undo is
/// the engine's answer for them.
pub async fn detail(
    state: &AppState,
    run_id: uuid::Uuid,
    viewer: &crate::ui::SessionUser,
) -> Result<Option<RunSheet>, StoreError> {
    let may_decide = viewer.role.can_decide();
    let person = crate::saga::model::Actor::User(viewer.username.clone());
    let store = &state.store;
    let Some(run) = store.run(run_id).await? else {
        return Ok(None);
    };
    let steps = store.steps(run_id).await?;
    let compensations = store.compensations(run_id).await?;
    let approvals = store.approvals(run_id).await?;
    let corrections = store.corrections(run_id).await?;
    let events = store.events(Some(run_id), 2000).await?;
    let now = chrono::Utc::now();
    let registry = &state.registry;
    let mut waiting = std::collections::HashMap::new();
    for a in approvals
        .iter()
        .filter(|a| a.status == ApprovalStatus::Pending)
    {
        waiting.insert(a.id, waiting_note(store.as_ref(), a).await?);
    }

    let known = referents(&steps);
    let step_views = step_views(registry, &steps, &compensations, &events, &known);
    let deciders_of = |approval_id: i64| {
        approvals
            .iter()
            .find(|a| a.id == approval_id)
            .map(|a| deciders(registry, a, viewer))
            .unwrap_or_default()
    };
    let pivot = pivot_view(registry, &run, &steps, &approvals, &waiting, &known).map(|mut p| {
        p.deciders = deciders_of(p.approval_id);
        p
    });
    let held = approvals
        .iter()
        .filter(|a| a.kind == ApprovalKind::Step && a.status == ApprovalStatus::Pending)
        .filter_map(|a| {
            let step = steps.iter().find(|s| Some(s.step_idx) == a.step_idx)?;
            Some(HeldView {
                approval_id: a.id,
                digest: a.digest.clone(),
                step_idx: step.step_idx,
                summary: a.summary.clone(),
                words: registry.in_words_among(
                    &step.tool,
                    &step.args,
                    step.compensation.as_ref(),
                    &known,
                ),
                waiting: waiting.get(&a.id).cloned().flatten(),
                deciders: deciders(registry, a, viewer),
            })
        })
        .collect();

    let questions = crate::saga::questions::open_questions(&run, &steps, &compensations)
        .into_iter()
        .map(|q| question(registry, &run, &steps, q, &known))
        .collect();

    let correction_lines = corrections
        .iter()
        .map(|c| CorrectionLine {
            id: c.id,
            step_idx: c.step_idx,
            audience: c.audience.as_str().to_owned(),
            status: c.status,
            recipients: c.recipients.join(", "),
        })
        .collect();

    let unwind_plan = if crate::saga::questions::person_may_unwind(&run, &steps, &person) {
        Some(unwind_plan(state, run_id, &known).await?)
    } else {
        None
    };

    let limits = limit_lines(state, &run, &steps).await?;
    let pivot = match pivot {
        Some(mut p) if p.status == ApprovalStatus::Pending => {
            if let Some(approval) = approvals.iter().find(|a| a.id == p.approval_id) {
                p.over_limits = state
                    .engine
                    .pivot_over_limits(&run, approval)
                    .await
                    .map_err(|refusal| match refusal {
                        crate::saga::engine::Refusal::Store(err) => err,
                        other => StoreError::Invalid(other.to_string()),
                    })?;
            }
            Some(p)
        }
        other => other,
    };

    Ok(Some(RunSheet {
        id: run.id.to_string(),
        agent: run.agent.clone(),
        label: run.label.clone(),
        purpose: run.purpose.clone(),
        status: run.status,
        age: crate::ui::ssr::age(now - run.created_at),
        irreversible_before_pivot: run.irreversible_before_pivot,
        unwound: unwind_why(&events),
        steps: step_views,
        pivot,
        held,
        questions,
        corrections: correction_lines,
        unwind_plan,
        may_decide,
        limits,
        refusals: refusals(&events),
    }))
}

/// The agent's refused calls, as the audit trail has them.
fn refusals(events: &[Event]) -> Vec<RefusedCall> {
    events
        .iter()
        .filter_map(|event| {
            let detail = event.detail.as_deref()?;
            let code = crate::saga::refusal::refused_code(detail)?;
            let why = detail.split_once(": ").map_or(detail, |(_, why)| why);
            Some(RefusedCall {
                at: when(event.at),
                code: code.to_owned(),
                why: why.to_owned(),
            })
        })
        .collect()
}

/// Each limit the run's steps count against, with what is spent of it now
/// (for a per-agent or per-customer limit, by everyone it counts).
async fn limit_lines(
    state: &AppState,
    run: &crate::saga::model::Run,
    steps: &[Step],
) -> Result<Vec<LimitLine>, StoreError> {
    let limits = state.registry.limits();
    if limits.is_empty() || steps.is_empty() {
        return Ok(Vec::new());
    }
    let args: Vec<(&str, &serde_json::Value)> =
        steps.iter().map(|s| (s.tool.as_str(), &s.args)).collect();
    let scopes = limits.scopes_of_run(run.id, &run.agent, &args);
    let asked: Vec<(String, Option<i64>)> = scopes
        .iter()
        .map(|(_, scope, window)| (scope.clone(), *window))
        .collect();
    let used = state.store.limit_usage(&asked).await?;
    Ok(scopes
        .iter()
        .zip(used)
        .filter_map(|((name, scope, _), used)| {
            let max = limits.named(name)?.max;
            Some(LimitLine {
                name: name.clone(),
                whose: limits.scope_in_words(name, scope),
                spent: limits.spent_in_words(name, used)?,
                percent: used.saturating_mul(100) / max.max(1),
            })
        })
        .collect())
}

/// Each step as the page lists it, with its compensation and how it was
/// settled.
fn step_views(
    registry: &crate::saga::registry::Registry,
    steps: &[Step],
    compensations: &[crate::saga::model::Compensation],
    events: &[Event],
    known: &Referents,
) -> Vec<StepView> {
    steps
        .iter()
        .map(|step| {
            let compensation = compensations
                .iter()
                .find(|c| c.step_idx == step.step_idx)
                .map(|c| CompensationView {
                    tool: c.tool.clone(),
                    status: c.status,
                    key: c.idempotency_key.clone(),
                    error: c.error.clone(),
                    sentence: registry
                        .in_words_among(&c.tool, &c.args, None, known)
                        .sentence,
                });
            let settled = settled_by(events, step);
            StepView {
                idx: step.step_idx,
                tool: step.tool.clone(),
                class: step.tool_class.as_str().to_owned(),
                audience: step.audience.as_str().to_owned(),
                status: step.status,
                after_pivot: step.phase == crate::saga::class::Phase::AfterPivot,
                words: registry.in_words_among(
                    &step.tool,
                    &step.args,
                    step.compensation.as_ref(),
                    known,
                ),
                key: step.idempotency_key.clone(),
                external_ref: crate::ui::lead_reference(step.external_ref.as_deref()),
                error: step.error.clone(),
                refused: step.status == StepStatus::Failed,
                reconciled: settled.as_ref().map(|(by, _)| match by {
                    crate::saga::model::Actor::User(person) => format!("answered by {person}"),
                    _ => "reconciled: looked up in the system by its key".to_owned(),
                }),
                account: account(
                    &registry.system_of(&step.tool),
                    step,
                    settled.as_ref(),
                    compensation.as_ref(),
                ),
                compensation,
            }
        })
        .collect()
}

/// What an earlier step's key stands for in a sentence: the reference its
/// system gave ("SUP-1 (step 1)"), or "of step 1" while none is known.
fn referents(steps: &[Step]) -> Referents {
    steps
        .iter()
        .map(|s| {
            let name = match crate::ui::lead_reference(s.external_ref.as_deref()) {
                Some(reference) => format!("{reference} (step {})", s.step_idx),
                None => format!("of step {}", s.step_idx),
            };
            (s.idempotency_key.clone(), name)
        })
        .collect()
}

/// One step's story in one paragraph: what came back, how the harness
/// found out, what was undone and how.
fn account(
    system: &str,
    step: &Step,
    settled: Option<&(crate::saga::model::Actor, String)>,
    compensation: Option<&CompensationView>,
) -> String {
    use crate::saga::model::Actor;
    let mut said = Vec::new();
    let reference = crate::ui::lead_reference(step.external_ref.as_deref())
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    if let (Some(error), false) = (&step.error, step.status == StepStatus::Failed) {
        said.push(format!("{system} gave no clear answer at first ({error})"));
    }
    let happened = |to: &str| {
        if to == StepStatus::Confirmed.as_str() {
            format!("it had happened{reference}")
        } else {
            "it had not happened".to_owned()
        }
    };
    match settled {
        Some((Actor::User(person), to)) => {
            said.push(format!("{person} checked and said {}", happened(to)))
        }
        Some((_, to)) => said.push(format!(
            "the harness looked it up in {system} by its key: {}",
            happened(to)
        )),
        None => {}
    }
    match (step.status, settled.is_some()) {
        (StepStatus::AwaitingApproval, _) => {
            said.push("it waits for a person's approval; nothing was sent".to_owned())
        }
        (StepStatus::Intended, _) => said.push(format!("sent to {system}; waiting for its answer")),
        (StepStatus::Confirmed | StepStatus::Compensated, false) => {
            said.push(format!("{system} confirmed it{reference}"))
        }
        (StepStatus::Failed, _) => said.push(format!(
            "{system} refused it: {}",
            step.error.clone().unwrap_or_default()
        )),
        (StepStatus::NotExecuted, false) => said.push("it did not happen".to_owned()),
        (StepStatus::Unknown, _) => {
            said.push("nobody can tell yet whether it happened: being checked".to_owned())
        }
        (StepStatus::Rejected, _) => said.push("a person rejected it; nothing was sent".to_owned()),
        _ => {}
    }
    if let Some(c) = compensation {
        let way = lower_first(&c.sentence);
        said.push(match c.status {
            StepStatus::Confirmed => format!("the unwind took it back ({way})"),
            StepStatus::Failed => format!(
                "taking it back failed: {} ({way})",
                c.error.clone().unwrap_or_default()
            ),
            StepStatus::NotExecuted => format!("taking it back has not happened yet ({way})"),
            _ => format!("being taken back ({way})"),
        });
    }
    let mut text = said.join("; ");
    if let Some(first) = text.get(..1) {
        text = first.to_uppercase() + &text[1..];
    }
    text.push('.');
    text
}

fn lower_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The run's pivot, as the person deciding it reads it.
fn pivot_view(
    registry: &crate::saga::registry::Registry,
    run: &crate::saga::model::Run,
    steps: &[Step],
    approvals: &[crate::saga::model::Approval],
    waiting: &std::collections::HashMap<i64, Option<String>>,
    known: &Referents,
) -> Option<PivotView> {
    run.pivot_approval_id
        .and_then(|id| approvals.iter().find(|a| a.id == id))
        .map(|a| (a, crate::saga::model::PivotPlan::read(&a.plan).ok()))
        .map(|(a, plan)| PivotView {
            approval_id: a.id,
            digest: a.digest.clone(),
            status: a.status,
            summary: a.summary.clone(),
            decided_by: a.decided_by.as_ref().map(|who| who.name().to_owned()),
            decided_at: a.decided_at.map(when),
            expires_at: a.expires_at.map(when),
            waiting: waiting.get(&a.id).cloned().flatten(),
            note: a.note.clone(),
            deciders: Deciders::default(),
            staged: staged(steps)
                .map(|s| StagedView {
                    step: s.step_idx,
                    words: registry.in_words_among(
                        &s.tool,
                        &s.args,
                        s.compensation.as_ref(),
                        known,
                    ),
                    open_until: when(s.created_at + crate::saga::pivot::AUTHORISATION_LIFETIME),
                })
                .collect(),
            commit: plan
                .iter()
                .flat_map(|plan| &plan.commit)
                .map(|call| planned(registry, call, known))
                .collect(),
            at_a_glance: at_a_glance(
                registry,
                steps,
                plan.as_ref().map_or(&[][..], |p| &p.commit[..]),
                known,
            ),
            messages: plan
                .iter()
                .flat_map(|plan| &plan.commit)
                .filter_map(|call| message(registry, call))
                .collect(),
            edits: plan
                .iter()
                .flat_map(|plan| &plan.edits)
                .map(|edit| EditView {
                    summary: edit.summary(),
                    at: when(edit.at),
                    before: pretty(&edit.before),
                    after: pretty(&edit.after),
                })
                .collect(),
            over_limits: Vec::new(),
        })
}

/// What an unwind would do now: each compensation and correction in words.
async fn unwind_plan(
    state: &AppState,
    run_id: uuid::Uuid,
    known: &Referents,
) -> Result<UnwindPlan, StoreError> {
    let registry = &state.registry;
    let preview = state
        .engine
        .unwind_preview(run_id)
        .await
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    Ok(UnwindPlan {
        compensations: preview
            .compensations
            .iter()
            .map(|(step, way)| {
                let done = registry.in_words_among(&step.tool, &step.args, Some(way), known);
                format!(
                    "Step {}, “{}”: {}",
                    step.step_idx,
                    done.sentence,
                    done.if_undone.trim_start_matches("If undone: ")
                )
            })
            .collect(),
        corrections: preview
            .corrections
            .iter()
            .map(|(step, text, to)| {
                let to = if to.is_empty() {
                    "nobody yet (add a recipient)".to_owned()
                } else {
                    to.join(", ")
                };
                let done = registry.in_words_among(&step.tool, &step.args, None, known);
                format!(
                    "Step {}, “{}”: to {to}: “{text}”",
                    step.step_idx, done.sentence
                )
            })
            .collect(),
    })
}

fn planned(
    registry: &crate::saga::registry::Registry,
    call: &crate::saga::model::CommitCall,
    known: &Referents,
) -> PlannedView {
    PlannedView {
        step: call.step,
        words: registry.in_words_among(&call.tool, &call.args, call.way_back.as_ref(), known),
        args: crate::saga::words::editable_json(&call.args),
    }
}

/// Who settled the step's unknown outcome and to what status, when the
/// call's own answer did not settle it.
fn settled_by(events: &[Event], step: &Step) -> Option<(crate::saga::model::Actor, String)> {
    events
        .iter()
        .filter(|e| {
            e.entity == crate::saga::model::EventEntity::Step && e.entity_id == Some(step.step_idx)
        })
        .rev()
        .find(|e| {
            e.from_status.as_deref() == Some("UNKNOWN") && e.to_status.as_deref() != Some("UNKNOWN")
        })
        .map(|e| (e.actor.clone(), e.to_status.clone().unwrap_or_default()))
}

/// Arguments for a person to check: pretty JSON with hidden and
/// control characters made visible.
pub fn pretty(value: &Value) -> String {
    crate::saga::words::visible(&serde_json::to_string_pretty(value).unwrap_or_default()).0
}

/// The run an agent labelled `label`, or why there is no one such run
/// (labels are unique per agent, so two agents may share one).
pub async fn run_labelled(
    state: &AppState,
    label: &str,
) -> Result<Result<uuid::Uuid, String>, StoreError> {
    let found = state.store.runs_page(None, label, 0, 200).await?;
    let named: Vec<uuid::Uuid> = found
        .runs
        .iter()
        .filter(|(run, _)| run.label.as_deref() == Some(label))
        .map(|(run, _)| run.id)
        .collect();
    Ok(match named.as_slice() {
        [one] => Ok(*one),
        [] => Err(format!("There is no run with the id or label “{label}”.")),
        many => Err(format!(
            "{} runs are labelled “{label}” (by different agents): search the runs list for it.",
            many.len()
        )),
    })
}

/// A time as every page of the dashboard writes it.
fn when(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// The steps staged before the pivot and still open, which the commit
/// builds on and a rejection takes back.
fn staged(steps: &[Step]) -> impl Iterator<Item = &Step> {
    steps.iter().filter(|s| {
        s.tool_class == ToolClass::Reversible
            && s.status == StepStatus::Confirmed
            && s.phase == crate::saga::class::Phase::BeforePivot
    })
}

/// Why the run is being or was taken back: the line that started the unwind.
fn unwind_why(events: &[Event]) -> Option<UnwindWhy> {
    events
        .iter()
        .rev()
        .find(|e| {
            e.entity == crate::saga::model::EventEntity::Run
                && e.to_status.as_deref()
                    == Some(crate::saga::status::RunStatus::Unwinding.as_str())
        })
        .map(unwind_why_of)
}

/// The unwind's reason as the run page, the runs list and the inbox say it.
pub fn unwind_why_of(event: &Event) -> UnwindWhy {
    UnwindWhy {
        reason: event
            .detail
            .clone()
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(|| "no reason was given".to_owned()),
        by: event.actor.described(),
        at: when(event.at),
    }
}

/// The currency of a call's amount: its own `currency`, else that of the
/// step whose key it names (a capture's hold), else dollars, as the
/// display templates' money filter reads it.
pub(crate) fn currency_of(args: &Value, steps: &[Step]) -> String {
    if let Some(currency) = args.get("currency").and_then(Value::as_str) {
        return currency.to_ascii_lowercase();
    }
    args.as_object()
        .into_iter()
        .flat_map(|o| o.values())
        .filter_map(Value::as_str)
        .find_map(|v| steps.iter().find(|s| s.idempotency_key == v))
        .and_then(|s| s.args.get("currency").and_then(Value::as_str))
        .unwrap_or("usd")
        .to_ascii_lowercase()
}

/// An amount with its sign: "+$32.00", "−$5.00".
pub(crate) fn signed_money(minor: i64, currency: &str) -> String {
    let text = crate::saga::words::money(minor, currency);
    if minor > 0 {
        format!("+{text}")
    } else {
        text.replacen('-', "−", 1)
    }
}

/// The addresses a call reaches outside the team.
fn people_of(registry: &crate::saga::registry::Registry, tool: &str, args: &Value) -> Vec<String> {
    let outside = registry
        .get(tool)
        .is_some_and(|spec| !spec.audience_for(args).is_internal());
    if !outside {
        return Vec::new();
    }
    ["to", "recipients", "emails", "cc", "bcc", "email"]
        .iter()
        .filter_map(|field| args.get(*field))
        .flat_map(|v| match v {
            Value::Array(items) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            Value::String(one) => vec![one.clone()],
            _ => Vec::new(),
        })
        .collect()
}

/// The pivot as a lead reads it first: the money per currency (signed),
/// the people reached, the systems touched, and what each answer does.
fn at_a_glance(
    registry: &crate::saga::registry::Registry,
    steps: &[Step],
    commit: &[crate::saga::model::CommitCall],
    known: &Referents,
) -> AtAGlance {
    use crate::saga::words::money;
    // Per currency, in the order first met: each movement, then the net.
    let mut moved: Vec<(String, Vec<(&str, i64)>)> = Vec::new();
    for call in commit {
        if let Some((what, amount)) = registry.money_moved(&call.tool, &call.args) {
            let currency = currency_of(&call.args, steps);
            match moved.iter_mut().find(|(c, _)| *c == currency) {
                Some((_, list)) => list.push((what, amount)),
                None => moved.push((currency, vec![(what, amount)])),
            }
        }
    }
    let signed = signed_money;
    let mut money_lines = Vec::new();
    for (currency, list) in &moved {
        for (what, amount) in list {
            money_lines.push(format!("{} {what}", signed(*amount, currency)));
        }
        if list.len() > 1 {
            let net: i64 = list.iter().map(|(_, a)| a).sum();
            money_lines.push(format!("{} net", signed(net, currency)));
        }
    }
    let staged: Vec<&Step> = staged(steps).collect();
    for hold in staged.iter().filter(|s| {
        registry
            .get(&s.tool)
            .is_some_and(|spec| spec.connector == "stripe.authorize")
    }) {
        if let Some(amount) = hold.args.get("amount").and_then(Value::as_i64) {
            money_lines.push(format!(
                "{} held on the card now (step {})",
                money(amount, &currency_of(&hold.args, steps)),
                hold.step_idx
            ));
        }
    }

    let mut people: Vec<String> = Vec::new();
    for call in commit {
        for person in people_of(registry, &call.tool, &call.args) {
            if !people.contains(&person) {
                people.push(person);
            }
        }
    }
    if people.len() > 5 {
        people = vec![format!("{} people", people.len())];
    }
    let mut systems: Vec<String> = Vec::new();
    for call in commit {
        let system = registry.system_of(&call.tool);
        if !systems.contains(&system) {
            systems.push(system);
        }
    }

    let sentences: Vec<String> = commit
        .iter()
        .map(|call| {
            lower_first(
                &registry
                    .in_words_among(&call.tool, &call.args, None, known)
                    .sentence,
            )
        })
        .collect();
    let if_approve = match sentences.as_slice() {
        [] => "If you approve: the run completes; the plan sends nothing.".to_owned(),
        [one] => format!("If you approve: the harness will {one}."),
        many => format!(
            "If you approve, in this order: {}.",
            many.iter()
                .enumerate()
                .map(|(i, s)| format!("{} {s}", i + 1))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    let taken_back: Vec<String> = staged
        .iter()
        .map(|s| {
            let words = registry.in_words_among(&s.tool, &s.args, s.compensation.as_ref(), known);
            lower_first(words.if_undone.trim_start_matches("If undone: "))
        })
        .collect();
    let if_reject = if taken_back.is_empty() {
        "If you reject: nothing in the plan is sent, and the agent is told, with your reason."
            .to_owned()
    } else {
        format!(
            "If you reject: nothing in the plan is sent; what the run staged is taken back ({}); \
             the agent is told, with your reason.",
            taken_back.join("; ")
        )
    };
    AtAGlance {
        money: money_lines,
        people,
        systems,
        if_approve,
        if_reject,
    }
}

/// The text a commit step sends to people outside the team, as they will
/// read it.
fn message(
    registry: &crate::saga::registry::Registry,
    call: &crate::saga::model::CommitCall,
) -> Option<MessageView> {
    let body = call
        .args
        .get("body")
        .or_else(|| call.args.get("text"))?
        .as_str()?;
    let to = people_of(registry, &call.tool, &call.args);
    if to.is_empty() {
        return None;
    }
    Some(MessageView {
        to: to.join(", "),
        subject: call
            .args
            .get("subject")
            .and_then(Value::as_str)
            .map(|s| crate::saga::words::visible(s).0),
        body: crate::saga::words::visible(body).0,
    })
}

/// One open question in words: what is uncertain, how to check, and what
/// each answer does next.
fn question(
    registry: &crate::saga::registry::Registry,
    run: &crate::saga::model::Run,
    steps: &[Step],
    q: crate::saga::questions::OpenQuestion,
    known: &Referents,
) -> Question {
    use crate::saga::status::RunStatus;
    let step = steps.iter().find(|s| s.step_idx == q.step_idx);
    let original =
        step.map(|s| registry.in_words_among(&s.tool, &s.args, s.compensation.as_ref(), known));
    let sentence = original
        .as_ref()
        .map(|w| w.sentence.clone())
        .unwrap_or_else(|| q.tool.clone());
    let (uncertain, if_yes, if_no) = if q.about_compensation {
        let way = registry
            .in_words_among(&q.tool, &q.args, None, known)
            .sentence;
        (
            format!(
                "Nobody can tell whether this was taken back: {sentence}. The harness sent \
                 “{way}”, and {}.",
                q.why
            ),
            "It is recorded as taken back, and the unwind goes on.".to_owned(),
            if q.may_resend {
                format!("“{way}” is sent again under its own key, then the unwind goes on.")
            } else {
                "Not offered: the system refused the undo, so sending it again would be refused \
                 again. Take it back by hand, then answer that it is undone."
                    .to_owned()
            },
        )
    } else {
        let (yes, no) = match run.resume_to {
            Some(RunStatus::Committing) => (
                "It is recorded as done, and the rest of the approved plan runs.".to_owned(),
                format!(
                    "It is sent again under the same key ({sentence}), then the rest of the \
                     approved plan runs."
                ),
            ),
            Some(RunStatus::Unwinding) => (
                format!(
                    "It is recorded as done, and the unwind takes it back ({}).",
                    original
                        .as_ref()
                        .map(|w| lower_first(w.if_undone.trim_start_matches("If undone: ")))
                        .unwrap_or_default()
                ),
                "It is recorded as not done: there is nothing to take back, and the unwind goes \
                 on."
                .to_owned(),
            ),
            _ => (
                "It is recorded as done; the agent is told and carries on.".to_owned(),
                "It is recorded as not done; the agent may send it again, under the same key."
                    .to_owned(),
            ),
        };
        (
            format!(
                "Nobody can tell whether this happened: {sentence}. {}.",
                upper_first(q.why.trim_end_matches('.'))
            ),
            yes,
            no,
        )
    };
    Question {
        check: registry.check_in_words(&q.tool, &q.args, &q.key, known),
        uncertain,
        if_yes,
        if_no,
        about_compensation: q.about_compensation,
        may_resend: q.may_resend,
        step_idx: q.step_idx,
        tool: q.tool,
        args: pretty(&q.args),
        key: q.key,
        why: q.why,
        asked: q.asked.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
    }
}

fn upper_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
