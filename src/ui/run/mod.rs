//! The run page: the pivot panel (what was staged, what the agent wants to
//! commit, one Approve and one Reject), single held steps, the saga log
//! drawn as a timeline, the questions only a person can answer, and the
//! unwind review. Every action is a plain form that works without JS.

use super::timeline::Timeline;
use super::words::CallWords;
use super::{Notice, TopBar};
use crate::saga::status::{ApprovalStatus, InWords, RunStatus};
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
                        {move || errors.get().into_iter().map(|(_, e)| super::error_words(&e)).collect::<Vec<_>>().join("; ")}
                    </p>
                }>
                    {move || Suspend::new(async move { detail.await.map(run_view) })}
                </ErrorBoundary>
            </Suspense>
        </main>
    }
}

fn run_view(run: RunSheet) -> impl IntoView {
    let title = run.label.clone().unwrap_or_else(|| run.purpose.clone());
    let may = run.may_decide;
    let id = run.id.clone();
    let irreversible = run.irreversible_before_pivot;
    view! {
        <header class="run-head">
            <h1>{title}</h1>
            // A div, not a p: a <details> inside a <p> closes the paragraph
            // in the browser's parser, and hydration would find another tree.
            <div class="meta">
                <StatusWords words=run.status.in_words() constant=run.status.as_str()/>
                " · agent " <strong>{run.agent.clone()}</strong>
                " · started " {run.age.clone()} " ago"
                {(irreversible > 0).then(|| view! {
                    " · " <span class="bad">
                        {irreversible} {if irreversible == 1 { " step that cannot be undone" } else { " steps that cannot be undone" }}
                        " ran before anyone approved"
                    </span>
                })}
            </div>
            <p class="purpose">{run.purpose.clone()}</p>
        </header>
        {run.unwound.clone().map(|why| view! {
            <section class="panel why" aria-label="Why this run was taken back">
                <p>
                    <strong>{if run.status == RunStatus::Unwinding { "Being taken back: " } else { "Taken back: " }}</strong>
                    {why.reason}
                </p>
                <p class="muted">"Started by " {why.by} " at " {why.at}</p>
            </section>
        })}
        {(!run.questions.is_empty()).then(|| questions_panel(&id, run.questions.clone(), may))}
        {run.pivot.clone().map(|pivot| pivot_panel(&id, pivot, may))}
        {run.held.clone().into_iter().map(|held| held_panel(&id, held, may)).collect_view()}
        {(!run.limits.is_empty()).then(|| limits_panel(run.limits.clone()))}
        <section class="panel">
            <h2>"What happened, step by step"</h2>
            <Timeline steps=run.steps.clone() corrections=run.corrections.clone()/>
            {steps_list(run.steps.clone())}
        </section>
        {(!run.refusals.is_empty()).then(|| refusals_panel(run.refusals.clone()))}
        {run.unwind_plan.clone().filter(|_| may).map(|plan| unwind_panel(&id, plan))}
    }
}

/// What the agent asked for and was told no: nothing of it was sent.
fn refusals_panel(calls: Vec<RefusedCall>) -> impl IntoView {
    view! {
        <section class="panel refusals" aria-labelledby="refusals-title">
            <h2 id="refusals-title">"Calls the harness refused"</h2>
            <p class="muted">"The agent asked for these and was told no; nothing was sent."</p>
            <ul>
                {calls.into_iter().map(|call| view! {
                    <li>
                        <span class="meta">{call.at}</span> " " {call.why} " "
                        <code>{call.code}</code>
                    </li>
                }).collect_view()}
            </ul>
        </section>
    }
}

/// What the run's calls have spent of each limit they count against.
fn limits_panel(lines: Vec<LimitLine>) -> impl IntoView {
    view! {
        <section class="panel limits" aria-labelledby="limits-title">
            <h2 id="limits-title">"Limits"</h2>
            <ul class="limit-lines">
                {lines.into_iter().map(|line| {
                    let class = if line.percent >= 100 {
                        "limit-line at-limit"
                    } else if line.percent >= 80 {
                        "limit-line near-limit"
                    } else {
                        "limit-line"
                    };
                    view! {
                        <li class=class>
                            <strong>{line.name}</strong>
                            " (" {line.whose} "): "
                            {line.spent} " used so far"
                            <meter min="0" max="100" value=line.percent.min(100)></meter>
                        </li>
                    }
                }).collect_view()}
            </ul>
        </section>
    }
}

/// A status in words, its constant one click (or tap) away for engineers.
#[component]
pub fn StatusWords(words: &'static str, constant: &'static str) -> impl IntoView {
    view! {
        <details class="status-words">
            <summary class=super::status_class(constant)>{words}</summary>
            <code>{constant}</code>
        </details>
    }
}

fn pivot_panel(run: &str, pivot: PivotView, may: bool) -> impl IntoView {
    let pending = pivot.status == ApprovalStatus::Pending;
    // The role lets them decide, and so do their groups.
    let role_may = may;
    let may = may && pivot.deciders.you;
    let who = pivot.deciders.who.clone().filter(|_| pending);
    let run = run.to_owned();
    let (approval, digest) = (pivot.approval_id, pivot.digest.clone());
    let decision = match (&pivot.decided_by, &pivot.decided_at) {
        (Some(by), Some(at)) => Some(format!("{} by {by} at {at}", pivot.status.in_words())),
        _ => None,
    };
    let glance = pivot.at_a_glance.clone();
    let decide = ServerAction::<DecidePivot>::new();
    let (run_a, run_r, digest_a, digest_r) =
        (run.clone(), run.clone(), digest.clone(), digest.clone());
    view! {
        <section class="panel pivot" aria-labelledby="pivot-title">
            <h2 id="pivot-title">{if pending { "Waiting for your decision: " } else { "The plan: " }} {pivot.summary.clone()}</h2>
            <div class="meta">
                <StatusWords words=pivot.status.in_words() constant=pivot.status.as_str()/>
                {pivot.waiting.clone().filter(|_| pending).map(|waiting| view! { " · " {waiting} })}
            </div>
            <dl class="glance">
                {(!glance.money.is_empty()).then(|| view! {
                    <div><dt>"Money"</dt><dd>{glance.money.join(" · ")}</dd></div>
                })}
                {(!glance.people.is_empty()).then(|| view! {
                    <div><dt>"Reaches"</dt><dd>{glance.people.join(", ")}</dd></div>
                })}
                <div><dt>"Systems"</dt><dd>{glance.systems.join(", ")}</dd></div>
            </dl>
            {pivot.over_limits.iter().map(|over| view! {
                <p class="over-limit">"Over a limit: " {over.clone()}</p>
            }).collect_view()}
            <p class="if-approve">{glance.if_approve.clone()}</p>
            <p class="if-reject">{glance.if_reject.clone()}</p>
            {decision.map(|d| view! { <p class="decided" role="status">"Decision: " {d}</p> })}
            {pivot.note.clone().map(|n| view! { <p class="muted">{n}</p> })}
            {who.map(|who| view! { <p class="who-may">{who}</p> })}
            {(pending && may).then(|| view! {
                <div class="decide">
                    <ActionForm action=decide>
                        <input type="hidden" name="run" value=run_a/>
                        <input type="hidden" name="approval" value=approval/>
                        <input type="hidden" name="digest" value=digest_a/>
                        <input type="hidden" name="decision" value="approve"/>
                        <button type="submit" class="approve">"Approve"</button>
                    </ActionForm>
                    <ActionForm action=decide attr:class="reject-form">
                        <input type="hidden" name="run" value=run_r/>
                        <input type="hidden" name="approval" value=approval/>
                        <input type="hidden" name="digest" value=digest_r/>
                        <input type="hidden" name="decision" value="reject"/>
                        <input type="text" name="reason" aria-label="Why you reject (optional; the agent is told)" placeholder="Why? (optional)"/>
                        <button type="submit" class="reject">"Reject"</button>
                    </ActionForm>
                </div>
            })}
            {(pending && !role_may).then(|| view! {
                <p class="muted">"Only an approver can decide this pivot."</p>
            })}
            {(!pivot.messages.is_empty()).then(|| view! {
                <h3>"What the customer will read"</h3>
                {pivot.messages.iter().map(|m| view! {
                    <div class="message">
                        <p class="muted">"To " {m.to.clone()}</p>
                        {m.subject.clone().map(|subject| view! { <p class="subject">{subject}</p> })}
                        <p class="body">{m.body.clone()}</p>
                    </div>
                }).collect_view()}
            })}
            <h3>"What approval runs, in this order"</h3>
            <ol class="plan">
                {pivot.commit.iter().map(|call| view! {
                    <li>
                        <CallWords words=call.words.clone()/>
                        {(pending && may).then(|| edit_form(&run, approval, &digest, call))}
                    </li>
                }).collect_view()}
            </ol>
            {(!pivot.staged.is_empty()).then(|| view! {
                <h3>"Already staged (taken back if you reject)"</h3>
                <ul class="plan staged">
                    {pivot.staged.iter().map(|staged| view! {
                        <li>
                            <CallWords words=staged.words.clone()/>
                            <p class="muted">"Open until " {staged.open_until.clone()}</p>
                        </li>
                    }).collect_view()}
                </ul>
            })}
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
    let may = may && held.deciders.you;
    let who = held.deciders.who.clone();
    let run = run.to_owned();
    let (approval, digest) = (held.approval_id, held.digest.clone());
    let (run_a, run_r, digest_a, digest_r) =
        (run.clone(), run.clone(), digest.clone(), digest.clone());
    view! {
        <section class="panel pivot held">
            <h2>"Waiting for your decision: " {held.summary.clone()}</h2>
            <p class="muted">"Held before it was sent: step " {held.step_idx}</p>
            {held.waiting.clone().map(|waiting| view! { <p class="meta">{waiting}</p> })}
            <CallWords words=held.words.clone()/>
            {who.map(|who| view! { <p class="who-may">{who}</p> })}
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
        <section class="panel attention" aria-labelledby="attention-title">
            <h2 id="attention-title">"Needs a person"</h2>
            {questions.into_iter().map(|q| {
                let (yes_run, no_run) = (run.to_owned(), run.to_owned());
                let (yes_asked, no_asked) = (q.asked.clone(), q.asked.clone());
                let step = q.step_idx;
                let (yes_label, no_label) = if q.about_compensation {
                    ("It is undone", "It did not happen: send it again")
                } else {
                    ("It happened", "It did not happen")
                };
                let offer_no = !q.about_compensation || q.may_resend;
                let about_compensation = q.about_compensation;
                let form = move |yes: bool, run: String, asked: String| {
                    let (field, value) = match (about_compensation, yes) {
                        (true, true) => ("undone", "yes"),
                        (true, false) => ("undone", "no"),
                        (false, true) => ("happened", "yes"),
                        (false, false) => ("happened", "no"),
                    };
                    let label = if yes { yes_label } else { no_label };
                    let body = view! {
                        <input type="hidden" name="run" value=run/>
                        <input type="hidden" name="step" value=step/>
                        <input type="hidden" name="asked" value=asked/>
                        <input type="hidden" name=field value=value/>
                        <button type="submit">{label}</button>
                    };
                    if about_compensation {
                        view! { <ActionForm action=undo_answer>{body}</ActionForm> }.into_any()
                    } else {
                        view! { <ActionForm action=answer>{body}</ActionForm> }.into_any()
                    }
                };
                view! {
                    <div class="question">
                        <p class="uncertain"><strong>{q.uncertain.clone()}</strong></p>
                        <p><strong>"How to check: "</strong>{q.check.clone()}</p>
                        <dl class="answers">
                            <div><dt>{format!("{yes_label}:")}</dt><dd>{q.if_yes.clone()}</dd></div>
                            <div><dt>{format!("{no_label}:")}</dt><dd>{q.if_no.clone()}</dd></div>
                        </dl>
                        {may.then(|| view! {
                            <div class="decide">
                                {form(true, yes_run, yes_asked)}
                                {offer_no.then(|| form(false, no_run, no_asked))}
                            </div>
                        })}
                        <details class="exact">
                            <summary>"Technical details"</summary>
                            <p class="muted">"Step " {q.step_idx} " · " <code>{q.tool.clone()}</code> " · key " <code>{q.key.clone()}</code></p>
                            <pre class="args">{q.args.clone()}</pre>
                        </details>
                    </div>
                }
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
                    <div class="step-head">
                        <span class="num">"Step " {step.idx}</span>
                        <StatusWords words=step.status.in_words() constant=step.status.as_str()/>
                        {step.after_pivot.then(|| view! { <span class="badge">"after approval"</span> })}
                        {step.external_ref.clone().map(|r| view! { <span class="muted">{r}</span> })}
                    </div>
                    <CallWords words=step.words.clone() key=step.key.clone()/>
                    <p class="account">{step.account.clone()}</p>
                </li>
            }).collect_view()}
        </ol>
    }
}
