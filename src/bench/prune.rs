//! `bench --prune`: what taking settled history out of the saga log costs.
//! Each round seeds runs of five engine steps each, completed (settled
//! history), then:
//! - times a prune of all of them flat out (`prune --share 1`, a day and
//!   more later by its clock): seconds per million saga_log rows;
//! - measures one run's step p50 and steps/s alone, then again while a
//!   prune of another seeded batch runs beside it at the default share:
//!   the ratio is what a prune costs the agents' calls on the hot path.
//!
//! With `--prune-log-rows N`, the same two step timings are also taken on
//! a log grown to about N saga_log rows (engine-made runs, copied in bulk
//! under new ids and keys), beside a prune of it that is stopped once the
//! steps are timed: a whole pass at ten million rows takes hours.

use super::path::EnginePath;
use super::stats::{percentile, Better, Figures};
use super::Target;
use crate::saga::registry::Share;
use futures::future::try_join_all;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Steps per seeded run.
const STEPS: usize = 5;
/// Seeded runs per batch, and steps timed on the hot path (seconds of
/// them, many of a pass's work-and-rest cycles); a twentieth and a tenth
/// with `--quick`.
const RUNS: usize = 4_000;
const TIMED: usize = 3_000;

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
    share: Share,
) -> anyhow::Result<crate::ops::retention::Pass> {
    crate::ops::retention::prune(
        store,
        chrono::Utc::now() + chrono::Duration::days(2),
        Duration::from_secs(1),
        None,
        false,
        share,
        |_| {},
    )
    .await
}

pub async fn measure(
    target: &mut Target,
    rounds: usize,
    quick: bool,
    log_rows: Option<u64>,
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
        let pass = prune_all(&*store, Share::FLAT_OUT).await?;
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
            let (latencies, per_s, beside) =
                timed_steps(&path, &store, variant == "on", timed).await?;
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
    if let Some(rows) = log_rows {
        beside_a_long_log(target, rounds, quick, rows, figures).await?;
    }
    for at in ["prune", "prune.log"] {
        for (what, name) in [("p50_ms", "p50"), ("per_s", "per_s")] {
            if let Some(ratio) = figures.ratio(
                &format!("{prefix}.{at}.on.{what}"),
                &format!("{prefix}.{at}.off.{what}"),
            ) {
                figures.record(
                    &format!("{prefix}.{at}.ratio.{name}"),
                    "×",
                    Better::Lower,
                    ratio,
                );
            }
        }
    }
    Ok(())
}

type PruneTask = tokio::task::JoinHandle<anyhow::Result<crate::ops::retention::Pass>>;

/// `timed` steps of one new run, with a prune started beside them or not:
/// each step's latency in ms, steps/s, and the prune, still going or not.
async fn timed_steps(
    path: &EnginePath,
    store: &std::sync::Arc<dyn crate::saga::store::SagaStore>,
    beside_a_prune: bool,
    timed: usize,
) -> anyhow::Result<(Vec<f64>, f64, Option<PruneTask>)> {
    let beside = beside_a_prune.then(|| {
        let store = store.clone();
        tokio::spawn(async move { prune_all(&*store, Share::DEFAULT).await })
    });
    let run = path.new_run().await?;
    let started = Instant::now();
    let latencies = path.steps_on(run, "noop_looked_up", timed).await?;
    let per_s = latencies.len() as f64 / started.elapsed().as_secs_f64();
    Ok((latencies, per_s, beside))
}

/// One run's steps alone and beside a prune of a log of about `rows`
/// saga_log rows; the prune is stopped once the steps are timed.
async fn beside_a_long_log(
    target: &mut Target,
    rounds: usize,
    quick: bool,
    rows: u64,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let (runs, timed) = sizes(quick);
    let prefix = target.prefix();
    let url = target.database("prune_log").await?;
    {
        let opened = crate::store::open(&url).await?;
        seed(&EnginePath::new(opened.saga_store())?, runs).await?;
        opened.close().await;
    }
    let grown = grow(&url, prefix == "postgres", rows).await?;
    figures.notes.insert(
        format!("{prefix}.prune.log.saga_log_rows"),
        Value::from(grown),
    );
    for round in 1..=rounds {
        eprintln!("bench: {prefix}: steps beside a prune of {grown} saga_log rows, round {round} of {rounds}");
        let opened = crate::store::open(&url).await?;
        let store = opened.saga_store();
        let path = EnginePath::new(store.clone())?;
        for variant in ["off", "on"] {
            let (latencies, per_s, beside) =
                timed_steps(&path, &store, variant == "on", timed).await?;
            if let Some(task) = beside {
                anyhow::ensure!(
                    !task.is_finished(),
                    "the prune of {grown} rows ended before the timed steps did: {:?}",
                    task.await
                );
                // Gone (and its hold on the log with it) before the
                // next round opens the log again.
                task.abort();
                let _ = task.await;
            }
            let key = |what: &str| format!("{prefix}.prune.log.{variant}.{what}");
            figures.record(
                &key("p50_ms"),
                "ms",
                Better::Lower,
                percentile(&latencies, 50.0),
            );
            figures.record(&key("per_s"), "/s", Better::Higher, per_s);
        }
        drop(path);
        drop(store);
        opened.close().await;
    }
    Ok(())
}

/// A connection for bulk statements outside the store.
enum Bulk {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl Bulk {
    async fn run(&mut self, sql: &str) -> anyhow::Result<()> {
        match self {
            Bulk::Sqlite(conn) => sqlx::raw_sql(sql).execute(conn).await.map(drop)?,
            Bulk::Postgres(conn) => sqlx::raw_sql(sql).execute(conn).await.map(drop)?,
        }
        Ok(())
    }

    async fn count(&mut self, sql: &str) -> anyhow::Result<u64> {
        let n: i64 = match self {
            Bulk::Sqlite(conn) => sqlx::query_scalar(sql).fetch_one(conn).await?,
            Bulk::Postgres(conn) => sqlx::query_scalar(sql).fetch_one(conn).await?,
        };
        Ok(n as u64)
    }
}

/// Copies the log's runs (with their steps and audit lines) until it
/// holds about `rows` saga_log rows. Copy `n` of a run keeps its first 24
/// id characters and puts `n` in hex in the last 12 (still a UUID), and
/// its keys get `:n`. Says how many saga_log rows there are.
async fn grow(url: &str, postgres: bool, rows: u64) -> anyhow::Result<u64> {
    use sqlx::Connection as _;
    let mut bulk = if postgres {
        Bulk::Postgres(sqlx::PgConnection::connect(url).await?)
    } else {
        Bulk::Sqlite(sqlx::SqliteConnection::connect(url).await?)
    };
    // Scratch data: no flush per commit, and SQLite's page cache large
    // enough for indexes that take random ids (without it, each copy
    // reads its index pages back from the file and growth slows tenfold).
    bulk.run(if postgres {
        "SET synchronous_commit = off;"
    } else {
        "PRAGMA synchronous = OFF; PRAGMA cache_size = -4000000;"
    })
    .await?;
    bulk.run(
        "CREATE TABLE bench_templates (id TEXT PRIMARY KEY);
         INSERT INTO bench_templates SELECT id FROM runs;",
    )
    .await?;
    let per_copy = bulk.count("SELECT count(*) FROM saga_log").await?.max(1);
    let copies = rows.saturating_sub(per_copy).div_ceil(per_copy);
    let id = |column: &str| {
        if postgres {
            format!("substr({column}, 1, 24) || lpad(to_hex(k.n), 12, '0')")
        } else {
            format!("substr({column}, 1, 24) || printf('%012x', k.n)")
        }
    };
    // Enough copies per transaction to make about 200,000 rows.
    let together = (200_000 / per_copy).max(1);
    let mut first = 1;
    while first <= copies {
        let last = (first + together - 1).min(copies);
        let numbers = if postgres {
            format!("(SELECT generate_series({first}, {last}) AS n) k")
        } else {
            format!(
                "(WITH RECURSIVE c(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM c WHERE n < {last})
                  SELECT n FROM c) k"
            )
        };
        bulk.run(&format!(
            "BEGIN;
             INSERT INTO runs (id, agent, label, purpose, status, resume_to, next_step,
                               pivot_approval_id, irreversible_before_pivot, created_at, updated_at)
                 SELECT {run}, r.agent, NULL, r.purpose, r.status, r.resume_to, r.next_step,
                        r.pivot_approval_id, r.irreversible_before_pivot, r.created_at, r.updated_at
                 FROM bench_templates t JOIN runs r ON r.id = t.id CROSS JOIN {numbers};
             INSERT INTO saga_log (run_id, step_idx, tool, tool_class, idempotency_key, args, status,
                                   external_ref, compensation, audience, result, error, phase,
                                   approved_individually, owed_to_agent, created_at, updated_at)
                 SELECT {step_run}, s.step_idx, s.tool, s.tool_class,
                        s.idempotency_key || ':' || k.n, s.args, s.status, s.external_ref,
                        s.compensation, s.audience, s.result, s.error, s.phase,
                        s.approved_individually, s.owed_to_agent, s.created_at, s.updated_at
                 FROM bench_templates t JOIN saga_log s ON s.run_id = t.id CROSS JOIN {numbers};
             INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status, detail, at)
                 SELECT {event_run}, e.entity, e.entity_id, e.actor, e.from_status, e.to_status,
                        e.detail, e.at
                 FROM bench_templates t JOIN events e ON e.run_id = t.id CROSS JOIN {numbers};
             COMMIT;",
            run = id("r.id"),
            step_run = id("s.run_id"),
            event_run = id("e.run_id"),
        ))
        .await?;
        eprintln!(
            "bench: grown to {} of about {rows} saga_log rows",
            per_copy * (last + 1)
        );
        first = last + 1;
    }
    bulk.run("DROP TABLE bench_templates; ANALYZE;").await?;
    bulk.count("SELECT count(*) FROM saga_log").await
}

/// The targets: a step's p50 while a prune runs at most 1.10 times
/// without, and steps/s at least 0.90 times (said as without ÷ with, at
/// most 1/0.90), beside the seeded batch and, when measured, beside a long
/// log.
pub fn targets(figures: &Figures) -> Vec<(String, Option<f64>, f64)> {
    let mut out = Vec::new();
    for prefix in ["sqlite", "postgres"] {
        for (at, said) in [
            ("prune", "while pruning"),
            ("prune.log", "beside a long log's prune"),
        ] {
            let ratio = |what: &str| {
                figures
                    .get(&format!("{prefix}.{at}.ratio.{what}"))
                    .and_then(|f| f.median())
            };
            out.push((
                format!("{prefix}: step p50 {said} ÷ without"),
                ratio("p50"),
                1.10,
            ));
            out.push((
                format!("{prefix}: steps/s without ÷ {said}"),
                ratio("per_s").map(|r| 1.0 / r),
                (1.0f64 / 0.90 * 100.0).round() / 100.0,
            ));
        }
    }
    out
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
        "| pruning settled runs flat out (`--share 1`, archive off) | {} | {} | |\n",
        rate("sqlite"),
        rate("postgres")
    ));
    out.push_str(&format!(
        "| one run's steps, alone → while a prune runs (the default share, a tenth) | {} | {} | p50 ≤ ×1.10, steps/s ≥ ×0.90 |\n",
        hot("sqlite"),
        hot("postgres")
    ));
    let long_log =
        |prefix: &str| report["notes"][format!("{prefix}.prune.log.saga_log_rows")].as_u64();
    if long_log("sqlite").is_some() || long_log("postgres").is_some() {
        let beside = |prefix: &str| match long_log(prefix) {
            Some(rows) => format!(
                "{} (a log of {} saga_log rows)",
                super::off_on_cell(
                    report,
                    &format!("{prefix}.prune.log.off"),
                    &format!("{prefix}.prune.log.on"),
                    &format!("{prefix}.prune.log.ratio.p50"),
                ),
                if rows >= 1_000_000 {
                    format!("{:.1} million", rows as f64 / 1e6)
                } else {
                    rows.to_string()
                }
            ),
            None => "not measured".into(),
        };
        out.push_str(&format!(
            "| one run's steps, alone → beside a prune of a long log | {} | {} | p50 ≤ ×1.10, steps/s ≥ ×0.90 |\n",
            beside("sqlite"),
            beside("postgres")
        ));
    }
    out.push_str(&super::measured_line(
        report,
        &format!("{runs} runs of {STEPS} steps pruned per batch, {timed} steps timed"),
    ));
    out
}
