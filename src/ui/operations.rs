//! The operators' page (admins only): this instance's figures for the last
//! hour, one small chart each, drawn on the server as SVG. The same figures
//! Prometheus scrapes from `--metrics-bind`, for a team that has no
//! Prometheus yet or wants a glance.

pub use super::figures::{Chart, OperationsView};
use super::TopBar;
use leptos::prelude::*;
use leptos_meta::Title;

#[component]
pub fn OperationsPage() -> impl IntoView {
    let live = super::live_tick();
    let figures = Resource::new(move || live.get(), |_| operations_figures());
    view! {
        <Title text="Operations · Saga Harness"/>
        <TopBar/>
        <main class="page">
            <h1>"Operations"</h1>
            <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match figures.await {
                        Ok(view) => view! {
                            <p class="lede">
                                {format!(
                                    "This instance since {} ({} minute{}); a reading a minute, the last one the minute under way. The same figures are served to Prometheus on the metrics address.",
                                    view.since,
                                    view.minutes,
                                    if view.minutes == 1 { "" } else { "s" },
                                )}
                            </p>
                            <div class="charts">
                                {view.charts.into_iter().map(|chart| view! { <ChartFigure chart/> }).collect_view()}
                            </div>
                        }.into_any(),
                        Err(err) => view! {
                            <p class="error" role="alert">{refusal(err)}</p>
                        }.into_any(),
                    }
                })}
            </Suspense>
        </main>
    }
}

const W: f64 = 260.0;
const H: f64 = 60.0;
/// Room above the tallest mark for the scale's label.
const HEADROOM: f64 = 13.0;
/// Minutes across a chart: the hour and the minute under way. Fewer
/// readings (an instance started lately) sit at the right, where now is.
const SLOTS: usize = 61;

/// `HH:MM`, `minutes` earlier.
fn minutes_before(time: &str, minutes: usize) -> String {
    let Some((h, m)) = time.split_once(':') else {
        return String::new();
    };
    let (Ok(h), Ok(m)) = (h.parse::<usize>(), m.parse::<usize>()) else {
        return String::new();
    };
    let at = (h * 60 + m + 24 * 60 - minutes % (24 * 60)) % (24 * 60);
    format!("{:02}:{:02}", at / 60, at % 60)
}

#[component]
fn ChartFigure(chart: Chart) -> impl IntoView {
    let top = chart
        .points
        .iter()
        .flatten()
        .copied()
        .chain(chart.ceiling)
        .fold(0.0_f64, f64::max);
    let scale = if top > 0.0 { top } else { 1.0 };
    let y = move |value: f64| H - value / scale * (H - HEADROOM);
    let slots = chart.points.len().max(SLOTS);
    let step = W / slots as f64;
    let offset = (slots - chart.points.len()) as f64;
    let x = move |i: usize| (offset + i as f64) * step;
    let marks = if chart.bars {
        chart
            .points
            .iter()
            .zip(&chart.times)
            .enumerate()
            .map(|(i, (point, time))| {
                let value = point.unwrap_or(0.0);
                let top_y = y(value);
                view! {
                    <rect x=format!("{:.1}", x(i) + 0.5) y=format!("{top_y:.1}")
                        width=format!("{:.1}", (step - 1.0).max(1.0)) height=format!("{:.1}", H - top_y)
                        fill="#175cd3">
                        <title>{format!("{time}: {}", figure(value))}</title>
                    </rect>
                }
                .into_any()
            })
            .collect_view()
            .into_any()
    } else {
        // A line broken where a minute has no value.
        let mut runs: Vec<Vec<String>> = vec![Vec::new()];
        for (i, point) in chart.points.iter().enumerate() {
            match point {
                Some(value) => runs.last_mut().expect("a run").push(format!(
                    "{:.1},{:.1}",
                    x(i) + step / 2.0,
                    y(*value)
                )),
                None => runs.push(Vec::new()),
            }
        }
        let dots = chart
            .points
            .iter()
            .zip(&chart.times)
            .enumerate()
            .filter_map(|(i, (point, time))| {
                point.map(|value| {
                    view! {
                        <circle cx=format!("{:.1}", x(i) + step / 2.0) cy=format!("{:.1}", y(value)) r="2" fill="#175cd3">
                            <title>{format!("{time}: {}", figure(value))}</title>
                        </circle>
                    }
                })
            })
            .collect_view();
        view! {
            {runs.into_iter().filter(|run| !run.is_empty()).map(|run| view! {
                <polyline points=run.join(" ") fill="none" stroke="#175cd3" stroke-width="1.5"/>
            }).collect_view()}
            {dots}
        }
        .into_any()
    };
    let ceiling = chart.ceiling.map(|limit| {
        let at = format!("{:.1}", y(limit));
        view! { <line x1="0" y1=at.clone() x2=W y2=at stroke="#b42318" stroke-dasharray="4 3"/> }
    });
    let last = chart.times.last().cloned().unwrap_or_default();
    // The left edge is an hour before the right, however few readings.
    let first = minutes_before(&last, slots - 1);
    view! {
        <figure class="chart">
            <figcaption><strong>{chart.title.clone()}</strong><span class="muted">{chart.now}</span></figcaption>
            <svg viewBox=format!("0 0 {W} {}", H + 14.0) width="100%" role="img"
                aria-label=chart.title xmlns="http://www.w3.org/2000/svg">
                <line x1="0" y1=H x2=W y2=H stroke="#d9dee7"/>
                <text x="2" y="9" font-size="9" fill="#5b6678">{figure(top)}</text>
                {marks}
                {ceiling}
                <text x="0" y=H + 12.0 font-size="9" fill="#5b6678">{first}</text>
                <text x=W y=H + 12.0 font-size="9" fill="#5b6678" text-anchor="end">{last}</text>
            </svg>
        </figure>
    }
    .into_any()
}

/// A refusal's own words, without the server-function wrapping.
fn refusal(err: ServerFnError) -> String {
    match err {
        ServerFnError::ServerError(message) => message,
        other => other.to_string(),
    }
}

/// A figure as a person reads it: whole numbers without decimals.
fn figure(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.3}")
    }
}

#[server(endpoint = "operations_figures")]
pub async fn operations_figures() -> Result<OperationsView, ServerFnError> {
    use crate::saga::class::Role;
    let user = super::ssr::signed_in().await?;
    if user.role != Role::Admin {
        return Err(super::ssr::refused(
            axum::http::StatusCode::FORBIDDEN,
            format!(
                "{} is {}: the operators' page is for admins.",
                user.username,
                user.role.with_article()
            ),
        ));
    }
    let state = super::ssr::app_state()?;
    let now = state
        .metrics
        .reading(state.metric_sources())
        .await
        .map_err(super::ssr::internal)?;
    Ok(crate::ops::history::view(state.metrics.last_hour(), now))
}
