//! The run page: the pivot panel (what was staged, what the agent wants to
//! commit, one Approve and one Reject), single held steps, the saga log
//! drawn as a timeline, the questions only a person can answer, and the
//! unwind review. Every action is a plain form that works without JS.

use super::timeline::Timeline;
use super::words::CallWords;
use super::{Notice, TopBar};
use crate::saga::status::{ApprovalStatus, CorrectionStatus, RunStatus, StepStatus};
use crate::saga::words::CallInWords;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_params_map, use_query_map};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSheet {
    pub id: String,
    pub agent: String,
    pub label: Option<String>,
    pub purpose: String,
    pub status: RunStatus,
    pub age: String,
    pub irreversible_before_pivot: i64,
    pub steps: Vec<StepView>,
    pub pivot: Option<PivotView>,
    pub held: Vec<HeldView>,
    pub questions: Vec<Question>,
    pub corrections: Vec<CorrectionLine>,
    pub unwind_plan: Option<UnwindPlan>,
    /// The signed-in person may approve, reject, answer and unwind.
    pub may_decide: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepView {
    pub idx: i64,
    pub tool: String,
    pub class: String,
    pub audience: String,
    pub status: StepStatus,
    pub after_pivot: bool,
    /// The call in words, with its pre-written way back.
    pub words: CallInWords,
    pub key: String,
    pub external_ref: Option<String>,
    pub error: Option<String>,
    /// The error is the step's outcome (the system refused it), not the
    /// history of how its outcome was learned.
    pub refused: bool,
    /// How the outcome was learned when not from the call's own answer:
    /// "found in the system", "a person said it happened" …
    pub reconciled: Option<String>,
    pub compensation: Option<CompensationView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompensationView {
    pub tool: String,
    pub status: StepStatus,
    pub key: String,
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PivotView {
    pub approval_id: i64,
    pub digest: String,
    pub status: ApprovalStatus,
    pub summary: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    pub expires_at: Option<String>,
    /// While it waits: its deadline, and where else it was asked for.
    pub waiting: Option<String>,
    pub note: Option<String>,
    /// What the run staged before the pivot and is still open (drafts,
    /// holds), which the commit builds on or a rejection undoes.
    pub staged: Vec<StagedView>,
    pub commit: Vec<PlannedView>,
    /// What approvers changed before deciding, oldest first.
    pub edits: Vec<EditView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EditView {
    /// Who changed which fields of which step.
    pub summary: String,
    pub at: String,
    /// The arguments as the agent (or the previous edit) had them.
    pub before: String,
    pub after: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StagedView {
    pub step: i64,
    pub words: CallInWords,
    /// When a hold staged this long ago lapses (§4).
    pub open_until: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedView {
    pub step: i64,
    pub words: CallInWords,
    /// The arguments as JSON, for an approver to edit before deciding.
    pub args: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldView {
    pub approval_id: i64,
    pub digest: String,
    pub step_idx: i64,
    pub summary: String,
    pub words: CallInWords,
    /// Its deadline, and where else it was asked for.
    pub waiting: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// About the step itself, or about its compensation.
    pub about_compensation: bool,
    /// Whether "it did not happen, send it again" is an answer (not for a
    /// compensation the system refused).
    pub may_resend: bool,
    pub step_idx: i64,
    pub tool: String,
    pub args: String,
    pub key: String,
    pub why: String,
    /// When the question was asked (the step's last change, RFC 3339): the
    /// answer is bound to it, so a resubmitted answer cannot settle a later
    /// question about the same step.
    pub asked: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CorrectionLine {
    pub id: i64,
    pub step_idx: i64,
    pub audience: String,
    pub status: CorrectionStatus,
    pub recipients: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnwindPlan {
    /// In the order they would run.
    pub compensations: Vec<String>,
    pub corrections: Vec<String>,
}

#[component]
pub fn RunPage() -> impl IntoView {
    let params = use_params_map();
    let query = use_query_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let live = super::live_tick();
    let detail = Resource::new(move || (id(), live.get()), |(id, _)| run_detail(id));
    view! {
        <Title text="Run · Saga Harness"/>
        <TopBar/>
        <main class="page">
            <p class="crumbs"><a href="/">"Runs"</a></p>
            <Notice query/>
            <Suspense fallback=|| view! { <p>"Loading the run…"</p> }>
                <ErrorBoundary fallback=|errors| view! {
                    <p class="error" role="alert">
                        {move || errors.get().into_iter().map(|(_, e)| e.to_string()).collect::<Vec<_>>().join("; ")}
                    </p>
                }>
                    {move || Suspend::new(async move { detail.await.map(run_view) })}
                </ErrorBoundary>
            </Suspense>
        </main>
    }
}

fn run_view(run: RunSheet) -> impl IntoView {
    let status_class = super::status_class(run.status.as_str());
    let title = run.label.clone().unwrap_or_else(|| run.purpose.clone());
    let may = run.may_decide;
    let id = run.id.clone();
    view! {
        <header class="run-head">
            <h1>{title}</h1>
            <p class="meta">
                <span class=status_class>{run.status.as_str()}</span>
                " · agent " <strong>{run.agent.clone()}</strong>
                " · started " {run.age.clone()} " ago"
                " · " <span class:bad=run.irreversible_before_pivot.gt(&0)>
                    {run.irreversible_before_pivot} " irreversible before the pivot"
                </span>
            </p>
            <p class="purpose">{run.purpose.clone()}</p>
        </header>
        {run.pivot.clone().map(|pivot| pivot_panel(&id, pivot, may))}
        {run.held.clone().into_iter().map(|held| held_panel(&id, held, may)).collect_view()}
        {(!run.questions.is_empty()).then(|| questions_panel(&id, run.questions.clone(), may))}
        <section class="panel">
            <h2>"Saga log"</h2>
            <Timeline steps=run.steps.clone() corrections=run.corrections.clone()/>
            {steps_list(run.steps.clone())}
        </section>
        {run.unwind_plan.clone().filter(|_| may).map(|plan| unwind_panel(&id, plan))}
    }
}

fn pivot_panel(run: &str, pivot: PivotView, may: bool) -> impl IntoView {
    let pending = pivot.status == ApprovalStatus::Pending;
    let run = run.to_owned();
    let (approval, digest) = (pivot.approval_id, pivot.digest.clone());
    let decision = match (&pivot.decided_by, &pivot.decided_at) {
        (Some(by), Some(at)) => Some(format!("{} by {by} at {at}", pivot.status.as_str())),
        _ => None,
    };
    let decide = ServerAction::<DecidePivot>::new();
    let (run_a, run_r, digest_a, digest_r) =
        (run.clone(), run.clone(), digest.clone(), digest.clone());
    view! {
        <section class="panel pivot" aria-labelledby="pivot-title">
            <h2 id="pivot-title">"Pivot: " {pivot.summary.clone()}</h2>
            <p class="meta">
                <span class=super::status_class(pivot.status.as_str())>{pivot.status.as_str()}</span>
                {pivot.waiting.clone().filter(|_| pending).map(|waiting| view! { " · " {waiting} })}
            </p>
            {(!pivot.staged.is_empty()).then(|| view! {
                <h3>"Staged, still open"</h3>
                <ul class="plan staged">
                    {pivot.staged.iter().map(|staged| view! {
                        <li>
                            <CallWords words=staged.words.clone()/>
                            <p class="muted">"Step " {staged.step} " · open until " {staged.open_until.clone()}</p>
                        </li>
                    }).collect_view()}
                </ul>
            })}
            <h3>"Commit steps, run in this order after approval"</h3>
            <ol class="plan">
                {pivot.commit.iter().map(|call| view! {
                    <li>
                        <CallWords words=call.words.clone()/>
                        <p class="muted">"Step " {call.step}</p>
                        {(pending && may).then(|| edit_form(&run, approval, &digest, call))}
                    </li>
                }).collect_view()}
            </ol>
            {(!pivot.edits.is_empty()).then(|| view! {
                <h3>"Edited before deciding"</h3>
                <ul class="edits">
                    {pivot.edits.iter().map(|edit| view! {
                        <li>
                            <p>{edit.summary.clone()} " at " {edit.at.clone()}</p>
                            <div class="versions">
                                <div><p class="muted">"Before"</p><pre class="args">{edit.before.clone()}</pre></div>
                                <div><p class="muted">"After"</p><pre class="args">{edit.after.clone()}</pre></div>
                            </div>
                        </li>
                    }).collect_view()}
                </ul>
            })}
            {decision.map(|d| view! { <p class="decided" role="status">"Decision: " {d}</p> })}
            {pivot.note.clone().map(|n| view! { <p class="muted">{n}</p> })}
            {(pending && may).then(|| view! {
                <div class="decide">
                    <ActionForm action=decide>
                        <input type="hidden" name="run" value=run_a/>
                        <input type="hidden" name="approval" value=approval/>
                        <input type="hidden" name="digest" value=digest_a/>
                        <input type="hidden" name="decision" value="approve"/>
                        <button type="submit" class="approve">"Approve"</button>
                    </ActionForm>
                    <ActionForm action=decide>
                        <input type="hidden" name="run" value=run_r/>
                        <input type="hidden" name="approval" value=approval/>
                        <input type="hidden" name="digest" value=digest_r/>
                        <input type="hidden" name="decision" value="reject"/>
                        <button type="submit" class="reject">"Reject"</button>
                    </ActionForm>
                </div>
            })}
            {(pending && !may).then(|| view! {
                <p class="muted">"Only an approver can decide this pivot."</p>
            })}
        </section>
    }
}

/// An approver's edit of one commit step's arguments: the arguments as
/// JSON, checked against the tool's schema when saved. Saving does not
/// approve: the panel then shows the edited plan and its way back, and the
/// approval binds that plan.
fn edit_form(run: &str, approval: i64, digest: &str, call: &PlannedView) -> impl IntoView {
    let edit = ServerAction::<EditPivotStep>::new();
    let field = format!("edit-args-{}", call.step);
    let rows = call.args.lines().count().clamp(3, 16);
    let (run, digest, step, args) = (
        run.to_owned(),
        digest.to_owned(),
        call.step,
        call.args.clone(),
    );
    view! {
        <details class="edit-step">
            <summary>"Edit this step's arguments"</summary>
            <ActionForm action=edit>
                <input type="hidden" name="run" value=run/>
                <input type="hidden" name="approval" value=approval/>
                <input type="hidden" name="digest" value=digest/>
                <input type="hidden" name="step" value=step/>
                <label for=field.clone()>"Arguments (JSON), checked against the tool's schema"</label>
                <textarea id=field name="args" rows=rows spellcheck="false">{super::textarea_text(args)}</textarea>
                <button type="submit">"Save the edit"</button>
                <p class="muted">"Saving does not approve: you approve the edited plan after you have read it."</p>
            </ActionForm>
        </details>
    }
}

fn held_panel(run: &str, held: HeldView, may: bool) -> impl IntoView {
    let decide = ServerAction::<DecideStep>::new();
    let run = run.to_owned();
    let (approval, digest) = (held.approval_id, held.digest.clone());
    let (run_a, run_r, digest_a, digest_r) =
        (run.clone(), run.clone(), digest.clone(), digest.clone());
    view! {
        <section class="panel pivot held">
            <h2>"Held step " {held.step_idx} ": " {held.words.tool.clone()}</h2>
            <p>{held.summary.clone()}</p>
            {held.waiting.clone().map(|waiting| view! { <p class="meta">{waiting}</p> })}
            <CallWords words=held.words.clone()/>
            {may.then(|| view! {
                <div class="decide">
                    <ActionForm action=decide>
                        <input type="hidden" name="run" value=run_a/>
                        <input type="hidden" name="approval" value=approval/>
                        <input type="hidden" name="digest" value=digest_a/>
                        <input type="hidden" name="decision" value="approve"/>
                        <button type="submit" class="approve">"Approve"</button>
                    </ActionForm>
                    <ActionForm action=decide>
                        <input type="hidden" name="run" value=run_r/>
                        <input type="hidden" name="approval" value=approval/>
                        <input type="hidden" name="digest" value=digest_r/>
                        <input type="hidden" name="decision" value="reject"/>
                        <button type="submit" class="reject">"Reject"</button>
                    </ActionForm>
                </div>
            })}
        </section>
    }
}

fn questions_panel(run: &str, questions: Vec<Question>, may: bool) -> impl IntoView {
    let answer = ServerAction::<AnswerQuestion>::new();
    let undo_answer = ServerAction::<AnswerCompensation>::new();
    view! {
        <section class="panel attention">
            <h2>"Needs a person"</h2>
            <p>"No system could say whether these calls took effect. Check in the system itself, then answer."</p>
            {questions.into_iter().map(|q| {
                let (yes_run, no_run) = (run.to_owned(), run.to_owned());
                let (yes_asked, no_asked) = (q.asked.clone(), q.asked.clone());
                let step = q.step_idx;
                if q.about_compensation {
                    return view! {
                        <div class="question">
                            <p><strong>"Undoing step " {q.step_idx} " with " {q.tool.clone()}</strong> " — " {q.why.clone()}</p>
                            <pre class="args">{q.args.clone()}</pre>
                            <p class="muted">"Key " <code>{q.key.clone()}</code></p>
                            {may.then(|| view! {
                                <div class="decide">
                                    <ActionForm action=undo_answer>
                                        <input type="hidden" name="run" value=yes_run/>
                                        <input type="hidden" name="step" value=step/>
                                        <input type="hidden" name="asked" value=yes_asked/>
                                        <input type="hidden" name="undone" value="yes"/>
                                        <button type="submit">"It is undone"</button>
                                    </ActionForm>
                                    {q.may_resend.then(|| view! {
                                        <ActionForm action=undo_answer>
                                            <input type="hidden" name="run" value=no_run/>
                                            <input type="hidden" name="step" value=step/>
                                            <input type="hidden" name="asked" value=no_asked/>
                                            <input type="hidden" name="undone" value="no"/>
                                            <button type="submit">"It did not happen: send it again"</button>
                                        </ActionForm>
                                    })}
                                </div>
                            })}
                        </div>
                    }.into_any();
                }
                view! {
                    <div class="question">
                        <p><strong>"Step " {q.step_idx} ": " {q.tool.clone()}</strong> " — " {q.why.clone()}</p>
                        <pre class="args">{q.args.clone()}</pre>
                        <p class="muted">"Key " <code>{q.key.clone()}</code></p>
                        {may.then(|| view! {
                            <div class="decide">
                                <ActionForm action=answer>
                                    <input type="hidden" name="run" value=yes_run/>
                                    <input type="hidden" name="step" value=step/>
                                    <input type="hidden" name="asked" value=yes_asked/>
                                    <input type="hidden" name="happened" value="yes"/>
                                    <button type="submit">"It happened"</button>
                                </ActionForm>
                                <ActionForm action=answer>
                                    <input type="hidden" name="run" value=no_run/>
                                    <input type="hidden" name="step" value=step/>
                                    <input type="hidden" name="asked" value=no_asked/>
                                    <input type="hidden" name="happened" value="no"/>
                                    <button type="submit">"It did not happen"</button>
                                </ActionForm>
                            </div>
                        })}
                    </div>
                }.into_any()
            }).collect_view()}
        </section>
    }
}

fn unwind_panel(run: &str, plan: UnwindPlan) -> impl IntoView {
    let unwind = ServerAction::<UnwindRun>::new();
    let run = run.to_owned();
    view! {
        <section class="panel unwind">
            <h2>"Unwind this run"</h2>
            <p>"Unwinding runs these compensations, in this order, each with its own key:"</p>
            <ol>{plan.compensations.into_iter().map(|c| view! { <li>{c}</li> }).collect_view()}</ol>
            {(!plan.corrections.is_empty()).then(|| view! {
                <p>"and queues these corrections for sign-off:"</p>
                <ul>{plan.corrections.clone().into_iter().map(|c| view! { <li>{c}</li> }).collect_view()}</ul>
            })}
            <ActionForm action=unwind attr:class="inline-form">
                <input type="hidden" name="run" value=run/>
                <label>"Why" <input type="text" name="reason" required placeholder="what went wrong"/></label>
                <button type="submit" class="reject">"Unwind"</button>
            </ActionForm>
        </section>
    }
}

fn steps_list(steps: Vec<StepView>) -> impl IntoView {
    view! {
        <ol class="steps">
            {steps.into_iter().map(|step| view! {
                <li id=format!("step-{}", step.idx) class="step">
                    <p class="step-head">
                        <span class="num">"Step " {step.idx}</span>
                        <span class=super::status_class(step.status.as_str())>{step.status.as_str()}</span>
                        {step.after_pivot.then(|| view! { <span class="badge">"after the pivot"</span> })}
                        {step.external_ref.clone().map(|r| view! { <span class="muted">"ref " <code>{r}</code></span> })}
                    </p>
                    <CallWords words=step.words.clone() key=step.key.clone()/>
                    {step.error.clone().map(|e| {
                        // The system's refusal is the outcome; any other error
                        // is the history of how the outcome was learned.
                        if step.refused {
                            view! { <p class="bad">{e}</p> }.into_any()
                        } else {
                            view! { <p class="muted">"First answer: " {e}</p> }.into_any()
                        }
                    })}
                    {step.reconciled.clone().map(|r| view! { <p class="muted">{r}</p> })}
                    {step.compensation.clone().map(|c| view! {
                        <p class="way-back">
                            "Way back " <span class=super::status_class(c.status.as_str())>{c.status.as_str()}</span>
                            {c.error.map(|e| view! { " " <small class="bad">{e}</small> })}
                        </p>
                    })}
                </li>
            }).collect_view()}
        </ol>
    }
}

#[server(endpoint = "run_detail")]
pub async fn run_detail(id: String) -> Result<RunSheet, ServerFnError> {
    let user = super::ssr::signed_in().await?;
    let state = super::ssr::app_state()?;
    let run_id = super::ssr::run_id(&id)?;
    ssr::detail(&state, run_id, &user)
        .await
        .map_err(super::ssr::internal)?
        .ok_or_else(|| {
            super::ssr::refused(axum::http::StatusCode::NOT_FOUND, "There is no such run.")
        })
}

#[server(endpoint = "decide_pivot")]
pub async fn decide_pivot(
    run: String,
    approval: i64,
    digest: String,
    decision: String,
) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    // Also where the browser is sent back to: a run id, never other text.
    let run = super::ssr::run_id(&run)?;
    let state = super::ssr::app_state()?;
    let approve = super::ssr::choice("decision", &decision, "approve", "reject")?;
    let done = match state.engine.approval_of_run(run, approval).await {
        Ok(_) => {
            state
                .engine
                .decide_pivot(
                    approval,
                    &digest,
                    approve,
                    &person,
                    crate::saga::model::Via::Dashboard,
                )
                .await
        }
        Err(refused) => Err(refused),
    };
    super::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|run| {
            format!(
                "Pivot {}. The run is now {}.",
                if approve { "approved" } else { "rejected" },
                run.status.as_str()
            )
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "edit_pivot_step")]
pub async fn edit_pivot_step(
    run: String,
    approval: i64,
    digest: String,
    step: i64,
    args: String,
) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    let run = super::ssr::run_id(&run)?;
    let state = super::ssr::app_state()?;
    let done = match serde_json::from_str::<serde_json::Value>(&args) {
        Err(e) => Err(format!(
            "The arguments of step {step} are not JSON ({e}); nothing was changed."
        )),
        Ok(args) => match state.engine.approval_of_run(run, approval).await {
            Ok(_) => state
                .engine
                .edit_pivot(approval, &digest, step, args, &person)
                .await
                .map_err(|refusal| format!("{refusal}; nothing was changed.")),
            Err(refusal) => Err(refusal.to_string()),
        },
    };
    super::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|approval| {
            let edits = crate::saga::model::plan_edits(&approval.plan);
            format!(
                "Saved: {}. Read the edited plan, then approve or reject it.",
                edits.last().map(|e| e.summary()).unwrap_or_default()
            )
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "decide_step")]
pub async fn decide_step(
    run: String,
    approval: i64,
    digest: String,
    decision: String,
) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    // Also where the browser is sent back to: a run id, never other text.
    let run = super::ssr::run_id(&run)?;
    let state = super::ssr::app_state()?;
    let approve = super::ssr::choice("decision", &decision, "approve", "reject")?;
    let done = match state.engine.approval_of_run(run, approval).await {
        Ok(_) => {
            state
                .engine
                .decide_step(
                    approval,
                    &digest,
                    approve,
                    &person,
                    crate::saga::model::Via::Dashboard,
                )
                .await
        }
        Err(refused) => Err(refused),
    };
    super::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|step| {
            format!(
                "Step {} {}: {}.",
                step.step_idx,
                if approve { "approved" } else { "rejected" },
                step.status.as_str()
            )
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "answer_question")]
pub async fn answer_question(
    run: String,
    step: i64,
    asked: String,
    happened: String,
) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    let state = super::ssr::app_state()?;
    let run_id = super::ssr::run_id(&run)?;
    let yes = super::ssr::choice("happened", &happened, "yes", "no")?;
    let asked = super::ssr::asked_at(&asked)?;
    let done = state
        .engine
        .answer(run_id, step, yes, None, asked, &person)
        .await;
    super::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|step| {
            format!(
                "Recorded: step {} {}.",
                step.step_idx,
                if yes { "happened" } else { "did not happen" }
            )
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "answer_compensation")]
pub async fn answer_compensation(
    run: String,
    step: i64,
    asked: String,
    undone: String,
) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    let state = super::ssr::app_state()?;
    let run_id = super::ssr::run_id(&run)?;
    let yes = super::ssr::choice("undone", &undone, "yes", "no")?;
    let asked = super::ssr::asked_at(&asked)?;
    let done = state
        .engine
        .answer_compensation(run_id, step, yes, asked, &person)
        .await;
    super::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|c| {
            if yes {
                format!("Recorded: step {} is undone.", c.step_idx)
            } else {
                format!(
                    "Recorded: the undo of step {} did not happen; it was sent again ({}).",
                    c.step_idx,
                    c.status.as_str()
                )
            }
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "unwind_run")]
pub async fn unwind_run(run: String, reason: String) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    let state = super::ssr::app_state()?;
    let run_id = super::ssr::run_id(&run)?;
    if reason.trim().is_empty() {
        super::ssr::back_to::<String, String>(
            &format!("/runs/{run}"),
            Err("Say why the run is unwound.".into()),
        )
        .await;
        return Ok(());
    }
    if let Some(why) = super::ssr::unstorable(&reason) {
        super::ssr::back_to::<String, String>(&format!("/runs/{run}"), Err(why.into())).await;
        return Ok(());
    }
    let done = state.engine.unwind(run_id, &person, reason.trim()).await;
    super::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|run| format!("Unwound: the run is now {}.", run.status.as_str())),
    )
    .await;
    Ok(())
}

#[cfg(feature = "ssr")]
pub(crate) mod ssr {
    use super::*;
    use crate::saga::class::ToolClass;
    use crate::saga::model::{ApprovalKind, Event, Step};
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
            let place = if notice.place == "escalation" {
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
        viewer: &super::super::SessionUser,
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

        let step_views = steps
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
                reconciled: reconciled_by(&events, step),
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
            .collect();

        let pivot = run
            .pivot_approval_id
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

        let unwindable = crate::saga::questions::person_may_unwind(&run, &steps, &person);
        let unwind_plan = if unwindable {
            let preview = state
                .engine
                .unwind_preview(run_id)
                .await
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            Some(UnwindPlan {
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
            .filter(|e| e.entity == "step" && e.entity_id == Some(step.step_idx))
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
}
