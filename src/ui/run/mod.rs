//! The run page: the pivot panel (what was staged, what the agent wants to
//! commit, one Approve and one Reject), single held steps, the saga log
//! drawn as a timeline, the questions only a person can answer, and the
//! unwind review. Every action is a plain form that works without JS.

use super::timeline::Timeline;
use super::words::CallWords;
use super::{Notice, TopBar};
use crate::saga::status::ApprovalStatus;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_params_map, use_query_map};

mod actions;
pub mod sheet;
#[cfg(feature = "ssr")]
pub(crate) mod ssr;

pub use actions::*;
pub use sheet::*;

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
