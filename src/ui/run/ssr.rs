//! The run page's view model, built on the server from the store: what
//! the page shows and which questions and actions it offers (the rules come
//! from `saga::questions`).

use super::*;
use crate::saga::class::ToolClass;
use crate::saga::model::{ApprovalKind, Event, Step};
use crate::saga::status::StepStatus;
use crate::saga::store::StoreError;
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
            at.format("%Y-%m-%d %H:%M:%S UTC")
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

    let step_views = step_views(registry, &steps, &compensations, &events);
    let pivot = pivot_view(registry, &run, &steps, &approvals, &waiting);
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
                words: registry.in_words(&step.tool, &step.args, step.compensation.as_ref()),
                waiting: waiting.get(&a.id).cloned().flatten(),
            })
        })
        .collect();

    let questions = crate::saga::questions::open_questions(&run, &steps, &compensations)
        .into_iter()
        .map(|q| Question {
            about_compensation: q.about_compensation,
            may_resend: q.may_resend,
            step_idx: q.step_idx,
            tool: q.tool,
            args: pretty(&q.args),
            key: q.key,
            why: q.why,
            asked: q.asked.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        })
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
        Some(unwind_plan(state, run_id).await?)
    } else {
        None
    };

    Ok(Some(RunSheet {
        id: run.id.to_string(),
        agent: run.agent.clone(),
        label: run.label.clone(),
        purpose: run.purpose.clone(),
        status: run.status,
        age: crate::ui::ssr::age(now - run.created_at),
        irreversible_before_pivot: run.irreversible_before_pivot,
        steps: step_views,
        pivot,
        held,
        questions,
        corrections: correction_lines,
        unwind_plan,
        may_decide,
    }))
}

/// Each step as the page lists it, with its compensation and how it was
/// settled.
fn step_views(
    registry: &crate::saga::registry::Registry,
    steps: &[Step],
    compensations: &[crate::saga::model::Compensation],
    events: &[Event],
) -> Vec<StepView> {
    steps
        .iter()
        .map(|step| StepView {
            idx: step.step_idx,
            tool: step.tool.clone(),
            class: step.tool_class.as_str().to_owned(),
            audience: step.audience.as_str().to_owned(),
            status: step.status,
            after_pivot: step.phase == crate::saga::class::Phase::AfterPivot,
            words: registry.in_words(&step.tool, &step.args, step.compensation.as_ref()),
            key: step.idempotency_key.clone(),
            external_ref: step.external_ref.clone(),
            error: step.error.clone(),
            refused: step.status == StepStatus::Failed,
            reconciled: reconciled_by(events, step),
            compensation: compensations
                .iter()
                .find(|c| c.step_idx == step.step_idx)
                .map(|c| CompensationView {
                    tool: c.tool.clone(),
                    status: c.status,
                    key: c.idempotency_key.clone(),
                    error: c.error.clone(),
                }),
        })
        .collect()
}

/// The run's pivot, as the person deciding it reads it.
fn pivot_view(
    registry: &crate::saga::registry::Registry,
    run: &crate::saga::model::Run,
    steps: &[Step],
    approvals: &[crate::saga::model::Approval],
    waiting: &std::collections::HashMap<i64, Option<String>>,
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
            decided_at: a
                .decided_at
                .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
            expires_at: a
                .expires_at
                .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string()),
            waiting: waiting.get(&a.id).cloned().flatten(),
            note: a.note.clone(),
            staged: steps
                .iter()
                .filter(|s| {
                    s.tool_class == ToolClass::Reversible
                        && s.status == StepStatus::Confirmed
                        && s.phase == crate::saga::class::Phase::BeforePivot
                })
                .map(|s| StagedView {
                    step: s.step_idx,
                    words: registry.in_words(&s.tool, &s.args, s.compensation.as_ref()),
                    open_until: (s.created_at + crate::saga::pivot::AUTHORISATION_LIFETIME)
                        .format("%Y-%m-%d %H:%M UTC")
                        .to_string(),
                })
                .collect(),
            commit: plan
                .iter()
                .flat_map(|plan| &plan.commit)
                .map(|call| planned(registry, call))
                .collect(),
            edits: plan
                .iter()
                .flat_map(|plan| &plan.edits)
                .map(|edit| EditView {
                    summary: edit.summary(),
                    at: edit.at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                    before: pretty(&edit.before),
                    after: pretty(&edit.after),
                })
                .collect(),
        })
}

/// What an unwind would do now: each compensation and correction in words.
async fn unwind_plan(state: &AppState, run_id: uuid::Uuid) -> Result<UnwindPlan, StoreError> {
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
                let done = registry.in_words(&step.tool, &step.args, Some(way));
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
                let done = registry.in_words(&step.tool, &step.args, None);
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
) -> PlannedView {
    PlannedView {
        step: call.step,
        words: registry.in_words(&call.tool, &call.args, call.way_back.as_ref()),
        args: crate::saga::words::editable_json(&call.args),
    }
}

/// How the step's outcome was learned, when the call's own answer did
/// not settle it.
fn reconciled_by(events: &[Event], step: &Step) -> Option<String> {
    let moved: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.entity == crate::saga::model::EventEntity::Step && e.entity_id == Some(step.step_idx)
        })
        .collect();
    let from_unknown = moved.iter().rev().find(|e| {
        e.from_status.as_deref() == Some("UNKNOWN") && e.to_status.as_deref() != Some("UNKNOWN")
    })?;
    Some(
        if let crate::saga::model::Actor::User(person) = &from_unknown.actor {
            format!("answered by {person}")
        } else {
            "reconciled: looked up in the system by its key".to_owned()
        },
    )
}

/// Arguments for a person to check: pretty JSON with hidden and
/// control characters made visible.
pub fn pretty(value: &Value) -> String {
    crate::saga::words::visible(&serde_json::to_string_pretty(value).unwrap_or_default()).0
}
