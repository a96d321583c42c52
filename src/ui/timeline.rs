//! The saga log drawn (server-rendered SVG): one lane per step, left to
//! right from intent to outcome, then how the outcome was learned, the way
//! back and its correction; the pivot is the line between the steps staged
//! before it and the ones committed after it.

use super::run::sheet::{CorrectionLine, StepView};
use leptos::prelude::*;

const LANE: i32 = 44;
const TOP: i32 = 34;
const LABEL_W: i32 = 210;
const COLUMNS: [&str; 5] = ["intent", "outcome", "learned by", "way back", "correction"];
const COL_W: i32 = 150;

/// The colour of a status: the same meanings as the badges.
fn colour(status: &str) -> &'static str {
    match status {
        "CONFIRMED" | "COMPENSATED" | "COMPLETED" | "SENT" => "#1e7a46",
        "FAILED" | "REJECTED" => "#b42318",
        "UNKNOWN" => "#b54708",
        "INTENDED" | "AWAITING_APPROVAL" | "PENDING" | "APPROVED" => "#175cd3",
        "NOT_EXECUTED" | "DISMISSED" => "#667085",
        _ => "#667085",
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
                <text x="4" y=y - 4 font-size="11" fill="#1f3a5f" font-weight="700">"PIVOT: approved commit steps below"</text>
            </g>
        }
    });
    view! {
        <figure class="timeline">
            <svg
                viewBox=format!("0 0 {width} {height}")
                width="100%"
                role="img"
                aria-label="The saga log: one lane per step"
                xmlns="http://www.w3.org/2000/svg"
            >
                {COLUMNS.iter().enumerate().map(|(col, name)| view! {
                    <text x=x(col) y="16" font-size="11" text-anchor="middle" fill="#5b6678">{name.to_uppercase()}</text>
                }).collect_view()}
                {lanes}
                {pivot_line}
            </svg>
            <figcaption class="muted">"Each lane is one step; colours follow status. Hover a mark for details."</figcaption>
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
    let status = step.status.as_str();
    let learned = step.reconciled.clone().map(|how| {
        let short = if how.starts_with("answered") {
            "a person"
        } else {
            "lookup"
        };
        (short.to_owned(), how)
    });
    let compensation = step.compensation.clone();
    view! {
        <g class="lane">
            <line x1=x(0) y1=y x2=x(4) y2=y stroke="#d9dee7" stroke-width="2"/>
            <text x="4" y=y - 3 font-size="13" font-weight="600" fill="#1d2430">{label}</text>
            <text x="4" y=y + 12 font-size="10" fill="#5b6678">{badges}</text>
            <circle cx=x(0) cy=y r="6" fill="#175cd3"><title>{format!("intent written, key {}", step.key)}</title></circle>
            <line x1=x(0) y1=y x2=x(1) y2=y stroke=colour(status) stroke-width="3"/>
            <rect x=x(1) - 55 y=y - 11 width="110" height="22" rx="11" fill=colour(status)>
                <title>{step.error.clone().unwrap_or_else(|| step.external_ref.clone().unwrap_or_default())}</title>
            </rect>
            <text x=x(1) y=y + 4 font-size="10" text-anchor="middle" fill="#fff" font-weight="700">{status}</text>
            {learned.map(|(short, how)| view! {
                <g>
                    <circle cx=x(2) cy=y r="9" fill="#fff" stroke="#b54708" stroke-width="2"><title>{how}</title></circle>
                    <text x=x(2) y=y + 24 font-size="10" text-anchor="middle" fill="#b54708">{short}</text>
                </g>
            })}
            {compensation.map(|c| view! {
                <g>
                    <path d=format!("M {} {} L {} {}", x(1) + 55, y, x(3) - 50, y) stroke=colour(c.status.as_str()) stroke-width="2" marker-end="none"/>
                    <rect x=x(3) - 50 y=y - 11 width="100" height="22" rx="4" fill="#fff" stroke=colour(c.status.as_str()) stroke-width="2">
                        <title>{format!("{} (key {}) {}", c.tool, c.key, c.error.clone().unwrap_or_default())}</title>
                    </rect>
                    <text x=x(3) y=y + 4 font-size="10" text-anchor="middle" fill=colour(c.status.as_str())>{c.status.as_str()}</text>
                </g>
            })}
            {correction.map(|c| view! {
                <g>
                    <polygon
                        points=format!("{},{} {},{} {},{} {},{}", x(4), y - 11, x(4) + 11, y, x(4), y + 11, x(4) - 11, y)
                        fill=colour(c.status.as_str())
                    >
                        <title>{format!("correction #{} to {} ({})", c.id, c.recipients, c.audience)}</title>
                    </polygon>
                    <text x=x(4) y=y + 24 font-size="10" text-anchor="middle" fill="#5b6678">{c.status.as_str()}</text>
                </g>
            })}
        </g>
    }
}
