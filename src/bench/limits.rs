//! `bench --limits`: what checking the tools file's limits costs a step.
//! The same engine step (`noop_looked_up`, an in-process system that
//! confirms at once) is measured in each round with the benchmark's tools
//! file as it is, and with the tool declaring money and counted by a
//! money limit per agent per day and a calls limit per run (neither ever
//! reached): one run at a time, and eight runs of the same agent at once.
//! Every step of the eight runs counts against one scope (the agent's), so
//! that figure is the worst case: the check serialises them.
//!
//! Usage is never cleared between rounds: like a busy agent's day, each
//! round's check sums more counted rows than the last.

use super::path::{EnginePath, TOOLS};
use super::stats::{percentile, Better, Figures};
use super::Target;
use crate::saga::registry::Registry;
use anyhow::Context;
use futures::future::try_join_all;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Steps per round: one run alone, and eight runs at once (each an
/// eighth); a tenth of each with `--quick`.
const ALONE: usize = 300;
const EIGHT: usize = 800;

fn sizes(quick: bool) -> (usize, usize) {
    if quick {
        (ALONE / 10, EIGHT / 10)
    } else {
        (ALONE, EIGHT)
    }
}

/// The benchmark's tools with limits that count every `noop_looked_up`
/// step.
pub fn limited_tools() -> String {
    let declared = TOOLS.replacen(
        "name = \"noop_looked_up\"\n",
        "name = \"noop_looked_up\"\nmoney = { amount = \"n\", currency_is = \"usd\" }\n",
        1,
    );
    format!(
        "{declared}
[[limits.money]]
name = \"bench money\"
per = \"agent/day\"
max = 1000000000000000
currency = \"usd\"
tools = [\"noop_looked_up\"]

[[limits.calls]]
name = \"bench calls\"
per = \"run\"
max = 1000000000
tools = [\"noop_looked_up\"]
"
    )
}

/// Both variants' figures for `target`, over `rounds` interleaved rounds.
pub async fn measure(
    target: &mut Target,
    rounds: usize,
    quick: bool,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let (alone_steps, eight_steps) = sizes(quick);
    let prefix = target.prefix();
    let url = target.database("limits").await?;
    let plain = super::path::registry()?;
    let limited =
        Arc::new(Registry::from_toml(&limited_tools()).context("the benchmark's limited tools")?);
    anyhow::ensure!(limited.limits().list.len() == 2);
    for round in 1..=rounds {
        eprintln!("bench: {prefix}: limits round {round} of {rounds}");
        for (variant, registry) in [("off", plain.clone()), ("on", limited.clone())] {
            let opened = crate::store::open(&url).await?;
            let path = EnginePath::with_registry(opened.saga_store(), registry);
            let key = |what: &str| format!("{prefix}.limits.{variant}.{what}");
            // Untimed: connections opened and plans settled.
            let warm = try_join_all((0..8).map(|_| path.new_run())).await?;
            try_join_all(
                warm.into_iter()
                    .map(|run| path.steps_on(run, "noop_looked_up", 4)),
            )
            .await?;
            let run = path.new_run().await?;
            let started = Instant::now();
            let alone = path.steps_on(run, "noop_looked_up", alone_steps).await?;
            let per_s = alone.len() as f64 / started.elapsed().as_secs_f64();
            figures.record(
                &key("c1.p50_ms"),
                "ms",
                Better::Lower,
                percentile(&alone, 50.0),
            );
            figures.record(&key("c1.per_s"), "/s", Better::Higher, per_s);
            let runs = try_join_all((0..8).map(|_| path.new_run())).await?;
            let started = Instant::now();
            let each = try_join_all(runs.into_iter().map(|run| {
                let path = path.clone();
                tokio::spawn(
                    async move { path.steps_on(run, "noop_looked_up", eight_steps / 8).await },
                )
            }))
            .await?;
            let mut latencies = Vec::with_capacity(eight_steps);
            for one in each {
                latencies.extend(one?);
            }
            let per_s = latencies.len() as f64 / started.elapsed().as_secs_f64();
            figures.record(
                &key("c8.p50_ms"),
                "ms",
                Better::Lower,
                percentile(&latencies, 50.0),
            );
            figures.record(&key("c8.per_s"), "/s", Better::Higher, per_s);
            drop(path);
            opened.close().await;
        }
    }
    for at in ["c1", "c8"] {
        for (what, name) in [("p50_ms", "p50"), ("per_s", "per_s")] {
            if let Some(ratio) = figures.ratio(
                &format!("{prefix}.limits.on.{at}.{what}"),
                &format!("{prefix}.limits.off.{at}.{what}"),
            ) {
                figures.record(
                    &format!("{prefix}.limits.ratio.{at}.{name}"),
                    "×",
                    Better::Lower,
                    ratio,
                );
            }
        }
    }
    Ok(())
}

/// The target: a step's p50 with limits at most 1.05 times without, at one
/// run and at eight, on each backend.
pub fn targets(figures: &Figures) -> Vec<(String, Option<f64>, f64)> {
    let mut out = Vec::new();
    for prefix in ["sqlite", "postgres"] {
        for (at, runs) in [("c1", "1 run"), ("c8", "8 runs of one agent")] {
            let value = figures
                .get(&format!("{prefix}.limits.ratio.{at}.p50"))
                .and_then(|f| f.median());
            out.push((
                format!("{prefix}: step p50 with limits ÷ without, {runs}"),
                value,
                1.05,
            ));
        }
    }
    out
}

/// benches/README.md's limits table from a `bench --limits --json` report.
pub fn markdown(report: &Value) -> String {
    let (alone, eight) = sizes(report["quick"].as_bool().unwrap_or(false));
    let cell = |prefix: &str, at: &str| {
        super::off_on_cell(
            report,
            &format!("{prefix}.limits.off.{at}"),
            &format!("{prefix}.limits.on.{at}"),
            &format!("{prefix}.limits.ratio.{at}.p50"),
        )
    };
    let mut out = String::new();
    out.push_str("| one engine step, without limits → with a money and a calls limit | SQLite | PostgreSQL | target |\n");
    out.push_str("|---|---|---|---|\n");
    out.push_str(&format!(
        "| one run at a time | {} | {} | p50 ≤ ×1.05 |\n",
        cell("sqlite", "c1"),
        cell("postgres", "c1")
    ));
    out.push_str(&format!(
        "| eight runs of one agent at once (one scope) | {} | {} | p50 ≤ ×1.05 |\n",
        cell("sqlite", "c8"),
        cell("postgres", "c8")
    ));
    out.push_str(&super::measured_line(
        report,
        &format!("{alone} steps alone and {eight} at eight runs per round and variant; usage kept across rounds"),
    ));
    out
}
