//! `bench --prune`: what taking settled history out of the saga log costs.
//! Each round seeds runs of five engine steps each, completed (settled
//! history), then:
//! - times a prune of all of them (`prune` as the command runs it, a day
//!   and more later by its clock): seconds per million saga_log rows;
//! - measures one run's step p50 and steps/s alone, then again while a
//!   prune of another seeded batch runs beside it: the ratio is what a
//!   prune costs the agents' calls on the hot path.

use super::path::EnginePath;
use super::stats::{percentile, Better, Figures};
use super::Target;
use futures::future::try_join_all;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Steps per seeded run.
const STEPS: usize = 5;
/// Seeded runs per batch, and steps timed on the hot path; a twentieth
/// and a tenth with `--quick`.
const RUNS: usize = 4_000;
const TIMED: usize = 300;

fn sizes(quick: bool) -> (usize, usize) {
    if quick {
        (RUNS / 20, TIMED / 10)
    } else {
        (RUNS, TIMED)
    }
}

/// Seeds `runs` completed runs, eight at a time.
async fn seed(path: &EnginePath, runs: usize) -> anyhow::Result<()> {
    let per_worker = runs / 8;
    try_join_all((0..8).map(|_| {
        let path = path.clone();
        tokio::spawn(async move {
            for _ in 0..per_worker {
                path.completed_run(STEPS).await?;
            }
            anyhow::Ok(())
        })
    }))
    .await?
    .into_iter()
    .collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

async fn prune_all(
    store: &dyn crate::saga::store::SagaStore,
) -> anyhow::Result<crate::ops::retention::Pass> {
    crate::ops::retention::prune(
        store,
        chrono::Utc::now() + chrono::Duration::days(2),
        Duration::from_secs(1),
        None,
        false,
        |_| {},
    )
    .await
}

pub async fn measure(
    target: &mut Target,
    rounds: usize,
    quick: bool,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let (runs, timed) = sizes(quick);
    let prefix = target.prefix();
    let url = target.database("prune").await?;
    for round in 1..=rounds {
        eprintln!("bench: {prefix}: prune round {round} of {rounds}");
        let opened = crate::store::open(&url).await?;
        let store = opened.saga_store();
        let path = EnginePath::new(store.clone())?;
        let key = |what: &str| format!("{prefix}.prune.{what}");

        // The prune alone.
        seed(&path, runs).await?;
        let started = Instant::now();
        let pass = prune_all(&*store).await?;
        let took = started.elapsed().as_secs_f64();
        let rows = pass.removed.get("saga_log").copied().unwrap_or(0);
        anyhow::ensure!(
            rows as usize >= runs / 8 * 8 * STEPS,
            "the prune took {rows} saga_log rows"
        );
        figures.record(
            &key("s_per_million_saga_log_rows"),
            "s",
            Better::Lower,
            took / rows as f64 * 1e6,
        );
        figures.record(
            &key("runs_per_s"),
            "/s",
            Better::Higher,
            pass.pruned as f64 / took,
        );

        // The hot path, without and with a prune beside it.
        seed(&path, runs).await?;
        for variant in ["off", "on"] {
            let beside = (variant == "on").then(|| {
                let store = store.clone();
                tokio::spawn(async move { prune_all(&*store).await })
            });
            let run = path.new_run().await?;
            let started = Instant::now();
            let latencies = path.steps_on(run, "noop_looked_up", timed).await?;
            let per_s = latencies.len() as f64 / started.elapsed().as_secs_f64();
            let pruning = beside.as_ref().is_some_and(|task| !task.is_finished());
            if let Some(task) = beside {
                let pass = task.await??;
                anyhow::ensure!(pass.pruned > 0, "the prune beside the steps pruned nothing");
                if !pruning {
                    figures.notes.insert(
                        format!("{prefix}.prune.round{round}"),
                        Value::String("the prune ended before the timed steps did".into()),
                    );
                }
            }
            figures.record(
                &key(&format!("{variant}.p50_ms")),
                "ms",
                Better::Lower,
                percentile(&latencies, 50.0),
            );
            figures.record(
                &key(&format!("{variant}.per_s")),
                "/s",
                Better::Higher,
                per_s,
            );
        }
        drop(path);
        drop(store);
        opened.close().await;
    }
    for (what, name) in [("p50_ms", "p50"), ("per_s", "per_s")] {
        if let Some(ratio) = figures.ratio(
            &format!("{prefix}.prune.on.{what}"),
            &format!("{prefix}.prune.off.{what}"),
        ) {
            figures.record(
                &format!("{prefix}.prune.ratio.{name}"),
                "×",
                Better::Lower,
                ratio,
            );
        }
    }
    Ok(())
}

/// The target: a step's p50 while a prune runs at most 1.10 times without.
pub fn targets(figures: &Figures) -> Vec<(String, Option<f64>, f64)> {
    ["sqlite", "postgres"]
        .into_iter()
        .map(|prefix| {
            (
                format!("{prefix}: step p50 while pruning ÷ without"),
                figures
                    .get(&format!("{prefix}.prune.ratio.p50"))
                    .and_then(|f| f.median()),
                1.10,
            )
        })
        .collect()
}

/// benches/README.md's retention table from a `bench --prune --json` report.
pub fn markdown(report: &Value) -> String {
    let (runs, timed) = sizes(report["quick"].as_bool().unwrap_or(false));
    let median = |key: &str| report["figures"][key]["median"].as_f64();
    let rate = |prefix: &str| match (
        median(&format!("{prefix}.prune.s_per_million_saga_log_rows")),
        median(&format!("{prefix}.prune.runs_per_s")),
    ) {
        (Some(s), Some(r)) => format!("{s:.0} s per million saga_log rows ({r:.0} runs/s)"),
        _ => "not measured".into(),
    };
    let hot = |prefix: &str| {
        super::off_on_cell(
            report,
            &format!("{prefix}.prune.off"),
            &format!("{prefix}.prune.on"),
            &format!("{prefix}.prune.ratio.p50"),
        )
    };
    let mut out = String::new();
    out.push_str("| retention | SQLite | PostgreSQL | target |\n|---|---|---|---|\n");
    out.push_str(&format!(
        "| pruning settled runs (archive off) | {} | {} | |\n",
        rate("sqlite"),
        rate("postgres")
    ));
    out.push_str(&format!(
        "| one run's step p50, alone → while a prune runs | {} | {} | p50 ≤ ×1.10 |\n",
        hot("sqlite"),
        hot("postgres")
    ));
    out.push_str(&super::measured_line(
        report,
        &format!("{runs} runs of {STEPS} steps pruned per batch, {timed} steps timed"),
    ));
    out
}
