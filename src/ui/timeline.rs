//! The saga log drawn (server-rendered SVG): one lane per step, left to
//! right from intent to outcome, then how the outcome was learned, the way
//! back and its correction; the pivot is the line between the steps staged
//! before it and the ones committed after it.

use super::run::sheet::{CorrectionLine, StepView};
use crate::saga::status::{CorrectionStatus, InWords, StepStatus};
use leptos::prelude::*;

const LANE: i32 = 44;
const TOP: i32 = 34;
const LABEL_W: i32 = 210;
const COLUMNS: [&str; 5] = [
    "asked",
    "what came back",
    "how we know",
    "taken back",
    "correction",
];
const COL_W: i32 = 150;

/// The colour of a step's status, the same meanings as the badges: done
/// is green, taken back is violet (an undone step is not a success),
/// refused red, unknown amber, waiting blue, nothing happened grey.
fn colour(status: StepStatus) -> &'static str {
    match status {
        StepStatus::Confirmed => "#1e7a46",
        StepStatus::Compensated => "#6941c6",
        StepStatus::Failed | StepStatus::Rejected => "#b42318",
        StepStatus::Unknown => "#b54708",
        StepStatus::Intended | StepStatus::AwaitingApproval => "#175cd3",
        StepStatus::NotExecuted => "#667085",
    }
}

/// A correction's colour: sent is done, waiting is blue.
fn correction_colour(status: CorrectionStatus) -> &'static str {
    match status {
        CorrectionStatus::Sent => "#1e7a46",
        CorrectionStatus::Pending | CorrectionStatus::Approved => "#175cd3",
        CorrectionStatus::Dismissed => "#667085",
    }
}

#[component]
pub fn Timeline(steps: Vec<StepView>, corrections: Vec<CorrectionLine>) -> impl IntoView {
    if steps.is_empty() {
        return view! { <p class="empty">"No step with an effect yet."</p> }.into_any();
    }
    let width = LABEL_W + COL_W * COLUMNS.len() as i32 + 20;
    let pivot_after = steps.iter().position(|s| s.after_pivot);
    let extra = i32::from(pivot_after.is_some()) * 14;
    let height = TOP + LANE * steps.len() as i32 + extra + 10;
    let x = |col: usize| LABEL_W + COL_W * col as i32 + COL_W / 2;
    let lanes = steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let shift = if pivot_after.is_some_and(|p| i >= p) {
                14
            } else {
                0
            };
            let y = TOP + LANE * i as i32 + LANE / 2 + shift;
            let correction = corrections.iter().find(|c| c.step_idx == step.idx).cloned();
            lane(step, correction, y, &x)
        })
        .collect_view();
    let pivot_line = pivot_after.map(|p| {
        let y = TOP + LANE * p as i32 + 6;
        view! {
            <g class="pivot-line">
                <line x1="0" y1=y x2=width y2=y stroke="#1f3a5f" stroke-width="2" stroke-dasharray="6 4"/>
                <text x="4" y=y - 4 font-size="11" fill="#1f3a5f" font-weight="700">"Approval: the steps below ran after a person approved"</text>
            </g>
        }
    });
    view! {
        <figure class="timeline">
            <p class="scroll-cue muted" aria-hidden="true">"Scroll sideways for the whole chart →"</p>
            <div class="timeline-scroll" tabindex="0" role="region" aria-label="The saga log chart">
            <svg
                viewBox=format!("0 0 {width} {height}")
                width="100%"
                role="img"
                aria-label="The saga log: one lane per step"
                xmlns="http://www.w3.org/2000/svg"
            >
                {COLUMNS.iter().enumerate().map(|(col, name)| view! {
                    <text x=x(col) y="16" font-size="12" text-anchor="middle" fill="#5b6678">{*name}</text>
                }).collect_view()}
                {lanes}
                {pivot_line}
            </svg>
            </div>
            <figcaption class="muted">
                "Each lane is one step: green done, violet taken back, red refused, amber unknown, blue waiting, grey did not happen. Each step's full account is in the list below."
            </figcaption>
        </figure>
    }
    .into_any()
}

fn lane(
    step: &StepView,
    correction: Option<CorrectionLine>,
    y: i32,
    x: &impl Fn(usize) -> i32,
) -> impl IntoView {
    let label = format!("{} · {}", step.idx, step.tool);
    let badges = format!("{} · {}", step.class, step.audience);
    let status = step.status;
    let learned = step.reconciled.clone().map(|how| {
        let short = if how.starts_with("answered") {
            "a person"
        } else {
            "looked up"
        };
        (short.to_owned(), how)
    });
    let compensation = step.compensation.clone();
    let account = step.account.clone();
    view! {
        <g class="lane">
            <title>{account}</title>
            <line x1=x(0) y1=y x2=x(4) y2=y stroke="#d9dee7" stroke-width="2"/>
            <text x="4" y=y - 3 font-size="13" font-weight="600" fill="#1d2430">{label}</text>
            <text x="4" y=y + 12 font-size="11" fill="#5b6678">{badges}</text>
            <circle cx=x(0) cy=y r="6" fill="#175cd3"><title>"Written to the log before it was sent"</title></circle>
            <line x1=x(0) y1=y x2=x(1) y2=y stroke=colour(status) stroke-width="3"/>
            <rect x=x(1) - 60 y=y - 11 width="120" height="22" rx="11" fill=colour(status)/>
            <text x=x(1) y=y + 4 font-size="11" text-anchor="middle" fill="#fff" font-weight="700">{status.in_words()}</text>
            {learned.map(|(short, how)| view! {
                <g>
                    <circle cx=x(2) cy=y r="9" fill="#fff" stroke="#b54708" stroke-width="2"><title>{how}</title></circle>
                    <text x=x(2) y=y + 24 font-size="11" text-anchor="middle" fill="#b54708">{short}</text>
                </g>
            })}
            {compensation.map(|c| view! {
                <g>
                    <path d=format!("M {} {} L {} {}", x(1) + 60, y, x(3) - 55, y) stroke=colour(c.status) stroke-width="2" marker-end="none"/>
                    <rect x=x(3) - 55 y=y - 11 width="110" height="22" rx="4" fill="#fff" stroke=colour(c.status) stroke-width="2">
                        <title>{c.sentence.clone()}</title>
                    </rect>
                    <text x=x(3) y=y + 4 font-size="11" text-anchor="middle" fill=colour(c.status)>{c.status.in_words()}</text>
                </g>
            })}
            {correction.map(|c| view! {
                <g>
                    <polygon
                        points=format!("{},{} {},{} {},{} {},{}", x(4), y - 11, x(4) + 11, y, x(4), y + 11, x(4) - 11, y)
                        fill=correction_colour(c.status)
                    >
                        <title>{format!("correction to {} ({})", c.recipients, c.audience)}</title>
                    </polygon>
                    <text x=x(4) y=y + 24 font-size="11" text-anchor="middle" fill="#5b6678">{c.status.in_words()}</text>
                </g>
            })}
        </g>
    }
}
