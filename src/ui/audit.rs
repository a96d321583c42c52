//! The audit trail: every approval, rejection, answer, sign-off, edit and
//! dismissal, with who and when, newest first.

use super::TopBar;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditLine {
    pub at: String,
    pub actor: String,
    pub what: String,
    pub run_id: Option<String>,
    /// The run's label (or purpose), so a row says which run it is about.
    pub run_title: Option<String>,
    pub detail: String,
}

/// One page of the trail and where the next (older) one starts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditPage {
    pub lines: Vec<AuditLine>,
    /// The id to pass as `before` for older lines; none on the last page.
    pub older: Option<i64>,
}

/// People's decisions only, or everything the harness wrote.
#[component]
pub fn AuditPage() -> impl IntoView {
    let query = use_query_map();
    let everything = move || query.read().get("all").is_some();
    let before = move || {
        query
            .read()
            .get("before")
            .and_then(|b| b.parse::<i64>().ok())
    };
    let live = super::live_tick();
    let lines = Resource::new(
        move || (everything(), before(), live.get()),
        |(all, before, _)| audit_trail(all, before),
    );
    view! {
        <Title text="Audit · Saga Harness"/>
        <TopBar/>
        <main class="page">
            <h1>"Audit trail"</h1>
            <p class="lede">
                {move || if everything() {
                    view! { "Everything the harness recorded. " <a href="/audit">"Show people's decisions only"</a> }.into_any()
                } else {
                    view! { "Every decision a person made. " <a href="/audit?all=1">"Show everything"</a> }.into_any()
                }}
            </p>
            <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    lines.await.map(|page| view! {
                        <table class="audit">
                            <thead><tr><th>"When"</th><th>"Who"</th><th>"Run"</th><th>"What"</th><th>"Detail"</th></tr></thead>
                            <tbody>
                                {page.lines.into_iter().map(|line| view! {
                                    <tr>
                                        <td data-label="When">{line.at}</td>
                                        <td data-label="Who">{line.actor}</td>
                                        <td data-label="Run">
                                            {match (line.run_id, line.run_title) {
                                                (Some(run), Some(title)) => view! { <a href=format!("/runs/{run}")>{title}</a> }.into_any(),
                                                (Some(run), None) => view! { <a href=format!("/runs/{run}")>"a run"</a> }.into_any(),
                                                _ => view! { <span class="muted">"—"</span> }.into_any(),
                                            }}
                                        </td>
                                        <td data-label="What">{line.what}</td>
                                        <td data-label="Detail">{line.detail}</td>
                                    </tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                        {page.older.map(|id| view! {
                            <p class="pager">
                                <a href=move || format!("/audit?{}before={id}", if everything() { "all=1&" } else { "" })>"Older"</a>
                            </p>
                        })}
                    })
                })}
            </Suspense>
        </main>
    }
}

/// Lines on one page of the audit trail.
pub const AUDIT_PAGE: i64 = 200;

#[server(endpoint = "audit_trail")]
pub async fn audit_trail(
    everything: bool,
    before: Option<i64>,
) -> Result<AuditPage, ServerFnError> {
    super::ssr::signed_in().await?;
    let state = super::ssr::app_state()?;
    let events = state
        .store
        .audit_page(!everything, before, AUDIT_PAGE)
        .await
        .map_err(super::ssr::internal)?;
    use crate::saga::model::EventEntity;
    let older = (events.len() as i64 == AUDIT_PAGE)
        .then(|| events.last().map(|e| e.id))
        .flatten();
    // Each run named once, however many of its lines the page shows.
    let mut titles: std::collections::HashMap<uuid::Uuid, Option<String>> = Default::default();
    for run in events.iter().filter_map(|e| e.run_id) {
        if let std::collections::hash_map::Entry::Vacant(slot) = titles.entry(run) {
            let run = state.store.run(run).await.map_err(super::ssr::internal)?;
            slot.insert(run.map(|r| {
                r.label
                    .unwrap_or_else(|| crate::saga::words::shorten(&r.purpose, 60))
            }));
        }
    }
    let lines = events
        .into_iter()
        .map(|e| {
            let words = |status: &String| status_words(e.entity, status);
            let moved = match (&e.from_status, &e.to_status) {
                (Some(from), Some(to)) => format!("{} → {}", words(from), words(to)),
                (None, Some(to)) => words(to),
                _ => String::new(),
            };
            let subject = match (e.entity, e.entity_id) {
                (EventEntity::Step, Some(id)) => format!("step {id}"),
                (EventEntity::Compensation, Some(id)) => format!("taking back step {id}"),
                (EventEntity::Approval, Some(_)) => "approval".to_owned(),
                (EventEntity::Correction, Some(id)) => format!("correction {id}"),
                (entity, Some(id)) => format!("{entity} {id}"),
                (entity, None) => entity.to_string(),
            };
            AuditLine {
                at: e.at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                actor: e.actor.described(),
                what: if moved.is_empty() {
                    subject
                } else {
                    format!("{subject}: {moved}")
                },
                run_title: e.run_id.and_then(|r| titles.get(&r).cloned().flatten()),
                run_id: e.run_id.map(|r| r.to_string()),
                detail: e.detail.unwrap_or_default(),
            }
        })
        .collect();
    Ok(AuditPage { lines, older })
}

/// A status an audit line names, in the words the pages use; a value no
/// status has (an older line's) as it was written.
#[cfg(feature = "ssr")]
fn status_words(entity: crate::saga::model::EventEntity, status: &str) -> String {
    use crate::saga::model::EventEntity;
    use crate::saga::status::*;
    let words = match entity {
        EventEntity::Run => status.parse::<RunStatus>().ok().map(InWords::in_words),
        EventEntity::Step | EventEntity::Compensation => {
            status.parse::<StepStatus>().ok().map(InWords::in_words)
        }
        EventEntity::Approval => status.parse::<ApprovalStatus>().ok().map(InWords::in_words),
        EventEntity::Correction => status
            .parse::<CorrectionStatus>()
            .ok()
            .map(InWords::in_words),
        EventEntity::User | EventEntity::Token => None,
    };
    words.map_or_else(|| status.to_owned(), str::to_owned)
}
