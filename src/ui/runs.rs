//! The runs list: runs waiting for approval first, then those that need a
//! person, then the rest, newest first; filtered by status, searched by
//! label, purpose, agent or customer, a page at a time.

use super::{Notice, TopBar};
use crate::saga::status::{InWords, RunStatus};
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

/// Runs per page.
pub const PAGE_SIZE: i64 = 50;

/// One line of the runs list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    pub id: String,
    pub label: Option<String>,
    pub agent: String,
    pub purpose: String,
    pub status: RunStatus,
    pub age: String,
    /// Non-pure steps given out so far.
    pub steps: i64,
    pub irreversible_before_pivot: i64,
    pub awaiting_approval: bool,
    /// For a waiting run, what the wait is: its deadline, whether it was
    /// escalated, how many approvers it still needs.
    pub waiting: Option<String>,
    /// Why a run was taken back, and by whom.
    pub unwound: Option<String>,
    /// Who the run is for: the first customer id or address its calls name.
    pub customer: Option<String>,
    /// The money its done steps moved, per currency, signed ("+$27.00").
    pub money: Option<String>,
    /// The limit its calls count against that is nearest its maximum,
    /// when at 80 % or more ("card charges at 92 %").
    pub near_limit: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunsList {
    pub rows: Vec<RunRow>,
    pub page: i64,
    pub pages: i64,
    pub total: i64,
}

#[component]
pub fn RunsPage() -> impl IntoView {
    let query = use_query_map();
    let status = move || query.read().get("status").filter(|s| !s.is_empty());
    let search = move || query.read().get("q").unwrap_or_default();
    let page = move || {
        query
            .read()
            .get("page")
            .and_then(|p| p.parse::<i64>().ok())
            .unwrap_or(1)
    };
    let live = super::live_tick();
    let runs = Resource::new(
        move || (status(), search(), page(), live.get()),
        |(status, search, page, _)| list_runs(status, search, page),
    );
    view! {
        <Title text="Runs · Saga Harness"/>
        <TopBar/>
        <main class="page">
            <div class="title-row">
                <h1>"Runs"</h1>
                <form method="get" action="/" class="filter" role="search">
                    <label>
                        "Search "
                        <input type="search" name="q" value=search placeholder="label, customer, purpose"/>
                    </label>
                    <label>
                        "Status "
                        <select name="status">
                            <option value="" selected=move || status().is_none()>"all"</option>
                            {RunStatus::ALL.iter().map(|s| {
                                let s = *s;
                                view! {
                                    <option value=s.as_str() selected=move || status().as_deref() == Some(s.as_str())>
                                        {s.in_words()}
                                    </option>
                                }
                            }).collect_view()}
                        </select>
                    </label>
                    <button type="submit">"Show"</button>
                </form>
            </div>
            <Notice query/>
            <Suspense fallback=|| view! { <p>"Loading runs…"</p> }>
                <ErrorBoundary fallback=|errors| view! {
                    <p class="error" role="alert">
                        {move || errors.get().into_iter().map(|(_, e)| super::error_words(&e)).collect::<Vec<_>>().join("; ")}
                    </p>
                }>
                    {move || Suspend::new(async move {
                        runs.await.map(|list| runs_table(list, status(), search()))
                    })}
                </ErrorBoundary>
            </Suspense>
        </main>
    }
}

fn runs_table(list: RunsList, status: Option<String>, search: String) -> AnyView {
    if list.rows.is_empty() {
        if !search.is_empty() || status.is_some() {
            return view! { <p class="empty">"No run matches. " <a href="/">"Show every run"</a></p> }
                .into_any();
        }
        return view! {
            <p class="empty">"No runs yet. A run appears here as soon as an agent starts one through the API."</p>
        }
        .into_any();
    }
    let link = move |page: i64| {
        let mut query = vec![format!("page={page}")];
        if let Some(s) = &status {
            query.push(format!("status={s}"));
        }
        if !search.is_empty() {
            query.push(format!(
                "q={}",
                percent_encoding::utf8_percent_encode(&search, percent_encoding::NON_ALPHANUMERIC)
            ));
        }
        format!("/?{}", query.join("&"))
    };
    view! {
        <table class="runs">
            <thead>
                <tr>
                    <th>"Status"</th>
                    <th>"Run"</th>
                    <th>"Customer"</th>
                    <th class="num">"Money"</th>
                    <th>"Agent"</th>
                    <th>"Age"</th>
                    <th class="num">"Steps"</th>
                    <th class="num" title="Steps that cannot be undone which ran before anyone approved (goal: 0)">"Unapproved, final"</th>
                </tr>
            </thead>
            <tbody>
                {list.rows.into_iter().map(|row| {
                    // A held single step waits for a person too, in a run
                    // that is otherwise running.
                    let held = row.awaiting_approval && row.status != RunStatus::AwaitingApproval;
                    let (words, constant) = if held {
                        ("a step waits for approval", row.status.as_str())
                    } else {
                        (row.status.in_words(), row.status.as_str())
                    };
                    let status_class = if held { "status-awaiting-approval".to_owned() } else { super::status_class(constant) };
                    view! {
                        <tr class:attention=row.awaiting_approval || row.status == RunStatus::NeedsAttention>
                            <td>
                                <span class=status_class title=constant>{words}</span>
                                {row.waiting.map(|w| view! { <span class="waiting muted">{w}</span> })}
                                {row.near_limit.map(|l| view! { <span class="badge near-limit">{l}</span> })}
                            </td>
                            <td class="purpose-cell">
                                <a href=format!("/runs/{}", row.id)>{row.purpose}</a>
                                {row.label.map(|label| view! { <span class="muted label">{label}</span> })}
                                {row.unwound.map(|why| view! { <span class="why-line">"Taken back: " {why}</span> })}
                            </td>
                            <td>{row.customer.unwrap_or_default()}</td>
                            <td class="num">{row.money.unwrap_or_default()}</td>
                            <td>{row.agent}</td>
                            <td>{row.age}</td>
                            <td class="num">{row.steps}</td>
                            <td class="num" class:bad=row.irreversible_before_pivot.gt(&0)>{row.irreversible_before_pivot}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
        <nav class="pager" aria-label="Pages">
            <span>{format!("{} runs · page {} of {}", list.total, list.page, list.pages)}</span>
            {(list.page > 1).then(|| view! { <a href=link(list.page - 1)>"← newer"</a> })}
            {(list.page < list.pages).then(|| view! { <a href=link(list.page + 1)>"older →"</a> })}
        </nav>
    }
    .into_any()
}

#[server(endpoint = "runs")]
pub async fn list_runs(
    status: Option<String>,
    // Absent from a form that only pages or filters: no search.
    #[server(default)] search: String,
    page: i64,
) -> Result<RunsList, ServerFnError> {
    super::ssr::signed_in().await?;
    let state = super::ssr::app_state()?;
    let wanted = match status.as_deref() {
        Some(text) => Some(text.parse::<RunStatus>().map_err(|e| {
            super::ssr::refused(axum::http::StatusCode::BAD_REQUEST, e.to_string())
        })?),
        None => None,
    };
    if search.len() > 200 {
        return Err(super::ssr::refused(
            axum::http::StatusCode::BAD_REQUEST,
            "A search is at most 200 bytes.",
        ));
    }
    ssr::list(state.store.as_ref(), &state.registry, wanted, &search, page)
        .await
        .map_err(super::ssr::internal)
}

/// The runs list's data, for the server function and the benchmark.
#[cfg(feature = "ssr")]
pub mod ssr {
    use super::*;
    use crate::saga::model::Run;
    use crate::saga::store::{SagaStore, StoreError};

    /// What the waiting runs among `runs` wait on, in a few words: "1 of
    /// 2", "expires 14:05 UTC", "escalated" (the run page says it in full).
    /// Two reads, whatever the number of runs: the pending approvals and
    /// the Slack notices still open (an escalation's stays open until its
    /// approval's outcome is shown).
    async fn waits(
        store: &dyn SagaStore,
        runs: &[(Run, bool)],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<std::collections::HashMap<uuid::Uuid, String>, StoreError> {
        let waiting: std::collections::HashSet<uuid::Uuid> = runs
            .iter()
            .filter(|(_, waiting)| *waiting)
            .map(|(run, _)| run.id)
            .collect();
        if waiting.is_empty() {
            return Ok(Default::default());
        }
        let escalated: std::collections::HashSet<i64> = store
            .open_notices()
            .await?
            .into_iter()
            .filter(|n| n.place == crate::saga::model::NoticePlace::Escalation)
            .map(|n| n.approval_id)
            .collect();
        let mut waits: std::collections::HashMap<uuid::Uuid, Vec<String>> = Default::default();
        for approval in store.pending_approvals().await? {
            if !waiting.contains(&approval.run_id) {
                continue;
            }
            let said = waits.entry(approval.run_id).or_default();
            if let Some(limit) = approval
                .plan
                .get("over_limit")
                .and_then(|over| over.get("limit"))
                .and_then(|name| name.as_str())
            {
                said.push(format!("over the limit {limit}"));
            }
            if approval.approvers_needed > 1 {
                said.push(match approval.first_approver {
                    Some(_) => format!("1 of {}", approval.approvers_needed),
                    None => format!("needs {} approvers", approval.approvers_needed),
                });
            }
            if let Some(at) = approval.expires_at {
                // The day too, unless it is today: a card hold's deadline
                // is a week out.
                let when = if at.date_naive() == now.date_naive() {
                    at.format("%H:%M UTC")
                } else {
                    at.format("%b %-d, %H:%M UTC")
                };
                said.push(format!("expires {when}"));
            }
            if escalated.contains(&approval.id) {
                said.push("escalated".to_owned());
            }
        }
        Ok(waits
            .into_iter()
            .filter(|(_, said)| !said.is_empty())
            .map(|(run, said)| (run, said.join(" · ")))
            .collect())
    }

    /// For each run at 80 % or more of a limit its calls count against,
    /// the nearest: one read per scope on the page, each one row.
    async fn near_limits(
        store: &dyn crate::saga::store::SagaStore,
        registry: &crate::saga::registry::Registry,
        runs: &[(Run, bool)],
        steps: &[crate::saga::model::Step],
    ) -> Result<std::collections::HashMap<uuid::Uuid, String>, StoreError> {
        let limits = registry.limits();
        let mut near: std::collections::HashMap<uuid::Uuid, (i64, String)> =
            std::collections::HashMap::new();
        if limits.is_empty() {
            return Ok(std::collections::HashMap::new());
        }
        let mut per_run = Vec::new();
        let mut asked: Vec<(String, Option<i64>)> = Vec::new();
        for (run, _) in runs {
            let args: Vec<(&str, &serde_json::Value)> = steps
                .iter()
                .filter(|s| s.run_id == run.id)
                .map(|s| (s.tool.as_str(), &s.args))
                .collect();
            for (name, scope, window) in limits.scopes_of_run(run.id, &run.agent, &args) {
                if !asked.iter().any(|(s, _)| *s == scope) {
                    asked.push((scope.clone(), window));
                }
                per_run.push((run.id, name, scope));
            }
        }
        let used = store.limit_usage(&asked).await?;
        for (run, name, scope) in per_run {
            let Some(limit) = limits.named(&name) else {
                continue;
            };
            let Some(position) = asked.iter().position(|(s, _)| *s == scope) else {
                continue;
            };
            let percent = used[position].saturating_mul(100) / limit.max.max(1);
            if percent < 80 {
                continue;
            }
            if near.get(&run).is_none_or(|(before, _)| percent > *before) {
                near.insert(run, (percent, format!("{name} at {percent} %")));
            }
        }
        Ok(near
            .into_iter()
            .map(|(run, (_, said))| (run, said))
            .collect())
    }

    /// Who a run is for: the customer its calls name (an id), else the
    /// first address they write to.
    fn customer_of(steps: &[crate::saga::model::Step]) -> Option<String> {
        ["customer", "email", "to"].iter().find_map(|field| {
            steps.iter().find_map(|step| match step.args.get(*field) {
                Some(serde_json::Value::String(one)) => Some(one.clone()),
                Some(serde_json::Value::Array(many)) => {
                    many.first().and_then(|v| v.as_str()).map(str::to_owned)
                }
                _ => None,
            })
        })
    }

    /// The money a run's done steps moved (taken back and unknown ones do
    /// not count), per currency, signed.
    fn money_of(
        registry: &crate::saga::registry::Registry,
        steps: &[crate::saga::model::Step],
    ) -> Option<String> {
        let mut sums: Vec<(String, i64)> = Vec::new();
        for step in steps
            .iter()
            .filter(|s| s.status == crate::saga::status::StepStatus::Confirmed)
        {
            let Some((_, amount)) = registry.money_moved(&step.tool, &step.args) else {
                continue;
            };
            let currency = crate::ui::run::ssr::currency_of(&step.args, steps);
            match sums.iter_mut().find(|(c, _)| *c == currency) {
                Some((_, sum)) => *sum += amount,
                None => sums.push((currency, amount)),
            }
        }
        (!sums.is_empty()).then(|| {
            sums.iter()
                .map(|(currency, sum)| crate::ui::run::ssr::signed_money(*sum, currency))
                .collect::<Vec<_>>()
                .join(", ")
        })
    }

    /// One page of runs: awaiting approval first (a pivot or a held single
    /// step), then needing a person, then the rest newest first.
    pub async fn list(
        store: &dyn SagaStore,
        registry: &crate::saga::registry::Registry,
        wanted: Option<RunStatus>,
        search: &str,
        page: i64,
    ) -> Result<RunsList, StoreError> {
        let first = store.runs_page(wanted, search, 0, PAGE_SIZE).await?;
        let pages = ((first.total + PAGE_SIZE - 1) / PAGE_SIZE).max(1);
        let page = page.clamp(1, pages);
        let shown = if page == 1 {
            first
        } else {
            store
                .runs_page(wanted, search, (page - 1) * PAGE_SIZE, PAGE_SIZE)
                .await?
        };
        let now = chrono::Utc::now();
        let waits = waits(store, &shown.runs, now).await?;
        let taken_back: Vec<uuid::Uuid> = shown
            .runs
            .iter()
            .filter(|(run, _)| matches!(run.status, RunStatus::Unwinding | RunStatus::Unwound))
            .map(|(run, _)| run.id)
            .collect();
        let reasons = store.unwind_reasons(&taken_back).await?;
        let ids: Vec<uuid::Uuid> = shown.runs.iter().map(|(run, _)| run.id).collect();
        // Only the calls that can name a customer or move money.
        let telling: Vec<&str> = registry
            .tools()
            .filter(|spec| {
                registry
                    .money_moved(&spec.name, &serde_json::json!({"amount": 0}))
                    .is_some()
                    || spec.schema.as_ref().is_some_and(|schema| {
                        ["customer", "email", "to"]
                            .iter()
                            .any(|field| schema["properties"].get(*field).is_some())
                    })
            })
            .map(|spec| spec.name.as_str())
            .chain(
                registry
                    .limits()
                    .list
                    .iter()
                    .flat_map(|l| l.tools.iter().map(String::as_str)),
            )
            .collect();
        let steps = store.steps_of_runs(&ids, &telling).await?;
        let near = near_limits(store, registry, &shown.runs, &steps).await?;
        let steps_of = |run: uuid::Uuid| -> Vec<crate::saga::model::Step> {
            steps.iter().filter(|s| s.run_id == run).cloned().collect()
        };
        let rows = shown
            .runs
            .into_iter()
            .map(|(run, waiting): (Run, bool)| RunRow {
                awaiting_approval: waiting,
                waiting: waits.get(&run.id).cloned(),
                unwound: reasons.get(&run.id).map(|event| {
                    let why = crate::ui::run::ssr::unwind_why_of(event);
                    format!(
                        "{} ({})",
                        crate::saga::words::shorten(&why.reason, 160),
                        why.by
                    )
                }),
                customer: customer_of(&steps_of(run.id)),
                money: money_of(registry, &steps_of(run.id)),
                near_limit: near.get(&run.id).cloned(),
                id: run.id.to_string(),
                label: run.label,
                agent: run.agent,
                // A list shows the start of each purpose; the run page has it all.
                purpose: crate::saga::words::shorten(&run.purpose, 120),
                status: run.status,
                age: crate::ui::ssr::age(now - run.created_at),
                steps: run.next_step,
                irreversible_before_pivot: run.irreversible_before_pivot,
            })
            .collect();
        Ok(RunsList {
            rows,
            page,
            pages,
            total: shown.total,
        })
    }
}
