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
                        <table class="runs audit">
                            <thead><tr><th>"When"</th><th>"Who"</th><th>"What"</th><th>"Detail"</th></tr></thead>
                            <tbody>
                                {page.lines.into_iter().map(|line| view! {
                                    <tr>
                                        <td>{line.at}</td>
                                        <td>{line.actor}</td>
                                        <td>
                                            {match line.run_id {
                                                Some(run) => view! { <a href=format!("/runs/{run}")>{line.what}</a> }.into_any(),
                                                None => view! { <span>{line.what}</span> }.into_any(),
                                            }}
                                        </td>
                                        <td>{line.detail}</td>
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
    let older = (events.len() as i64 == AUDIT_PAGE)
        .then(|| events.last().map(|e| e.id))
        .flatten();
    let lines = events
        .into_iter()
        .map(|e| {
            let moved = match (&e.from_status, &e.to_status) {
                (Some(from), Some(to)) => format!("{from} → {to}"),
                (None, Some(to)) => to.clone(),
                _ => String::new(),
            };
            let subject = match e.entity_id {
                Some(id) => format!("{} {id}", e.entity),
                None => e.entity.to_string(),
            };
            AuditLine {
                at: e.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                actor: e.actor.described(),
                what: format!("{subject}: {moved}"),
                run_id: e.run_id.map(|r| r.to_string()),
                detail: e.detail.unwrap_or_default(),
            }
        })
        .collect();
    Ok(AuditPage { lines, older })
}
