//! `saga-harness bench`: what a step costs against what durability costs
//! at the least, on SQLite and PostgreSQL, and against peer engines.
//!
//! The machine is shared and noisy, so absolute times drift: every figure
//! is measured once per round, the rounds interleave every measurement
//! (and both backends, and the peers), and only ratios taken within a
//! round are compared with the targets. Nothing here asserts a time.

mod cpu;
mod dashboard;
mod floor;
mod http;
mod in_flight;
mod limits;
mod path;
mod peers;
mod prune;
pub mod readme;
mod stats;

use crate::config::{BenchArgs, BenchBackend};
use anyhow::{bail, Context};
use serde_json::{json, Map, Value};
use sqlx::Connection;
use stats::{Better, Figures};
use std::path::PathBuf;

/// How much work one round does.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sizes {
    pub rounds: usize,
    /// Steps (or commits) per round at 1, 8 and 64 concurrent writers.
    pub c1: usize,
    pub c8: usize,
    pub c64: usize,
    /// The flatness run and the unwound run: this many steps.
    pub long_run: usize,
    /// Steps at each end of the long run whose p50 is compared.
    pub window: usize,
    pub dashboard_runs: usize,
    pub dashboard_steps: usize,
    /// Runs-list and run-page reads per round.
    pub dashboard_queries: usize,
}

impl Sizes {
    fn quick() -> Sizes {
        Sizes {
            rounds: 5,
            c1: 100,
            c8: 48,
            c64: 128,
            long_run: 60,
            window: 10,
            dashboard_runs: 200,
            dashboard_steps: 10,
            dashboard_queries: 10,
        }
    }

    fn full() -> Sizes {
        Sizes {
            rounds: 5,
            c1: 300,
            c8: 800,
            c64: 1280,
            long_run: 1000,
            window: 100,
            dashboard_runs: 10_000,
            dashboard_steps: 100,
            dashboard_queries: 100,
        }
    }

    pub fn ops(&self, writers: usize) -> usize {
        match writers {
            1 => self.c1,
            8 => self.c8,
            _ => self.c64,
        }
    }
}

/// Where one backend's benchmark databases live.
pub enum Target {
    /// SQLite files in a scratch directory (on the disk being measured).
    Sqlite { dir: PathBuf },
    /// Databases created on a PostgreSQL server, dropped afterwards.
    Postgres { admin: String, created: Vec<String> },
}

impl Target {
    fn prefix(&self) -> &'static str {
        match self {
            Target::Sqlite { .. } => "sqlite",
            Target::Postgres { .. } => "postgres",
        }
    }

    /// A fresh database named `name`, as a URL.
    async fn database(&mut self, name: &str) -> anyhow::Result<String> {
        match self {
            Target::Sqlite { dir } => Ok(format!(
                "sqlite://{}",
                dir.join(format!("{name}.db")).display()
            )),
            Target::Postgres { admin, created } => {
                let db = format!("saga_bench_{}_{name}", std::process::id());
                let mut conn = sqlx::PgConnection::connect(admin)
                    .await
                    .context("connecting to PostgreSQL with --postgres-url")?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await?;
                sqlx::query(&format!("CREATE DATABASE {db}"))
                    .execute(&mut conn)
                    .await
                    .with_context(|| format!("creating the database {db}"))?;
                conn.close().await?;
                created.push(db.clone());
                Ok(with_database(admin, &db))
            }
        }
    }

    async fn clean_up(&self) -> anyhow::Result<()> {
        match self {
            Target::Sqlite { dir } => std::fs::remove_dir_all(dir)
                .with_context(|| format!("removing {}", dir.display()))?,
            Target::Postgres { admin, created } => {
                let mut conn = sqlx::PgConnection::connect(admin).await?;
                for db in created {
                    sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await?;
                }
                conn.close().await?;
            }
        }
        Ok(())
    }
}

/// `url` with its database name replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let host_from = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[host_from..]
        .find('/')
        .map_or(base.len(), |i| host_from + i);
    format!("{}/{db}{query}", &base[..host_end])
}

/// Everything measured on one backend, set up once, run once per round.
struct BackendBench {
    prefix: &'static str,
    floor: floor::Floor,
    engine_url: String,
    full_path: Option<http::FullPath>,
    dashboard: dashboard::Dashboard,
    target: Target,
}

impl BackendBench {
    async fn setup(
        mut target: Target,
        sizes: &Sizes,
        figures: &mut Figures,
    ) -> anyhow::Result<BackendBench> {
        let prefix = target.prefix();
        eprintln!("bench: preparing {prefix}");
        let floor_url = target.database("floor").await?;
        let floor = floor::Floor::open(&target, &floor_url).await?;
        let engine_url = target.database("engine").await?;
        let http_url = target.database("http").await?;
        let full_path = http::FullPath::start(&http_url).await?;
        let dashboard_url = target.database("dashboard").await?;
        let (dashboard, filled_s) =
            dashboard::Dashboard::prepare(&target, &dashboard_url, sizes).await?;
        eprintln!(
            "bench: {prefix}: {} saga_log rows inserted in {filled_s:.1} s",
            sizes.dashboard_runs * sizes.dashboard_steps
        );
        figures.record(
            &format!("{prefix}.dashboard.bulk_fill_s"),
            "s",
            Better::Lower,
            filled_s,
        );
        Ok(BackendBench {
            prefix,
            floor,
            engine_url,
            full_path: Some(full_path),
            dashboard,
            target,
        })
    }

    async fn round(&mut self, sizes: &Sizes, figures: &mut Figures) -> anyhow::Result<()> {
        let prefix = self.prefix;
        self.floor
            .round(prefix, sizes, figures)
            .await
            .context("floor")?;
        // Opened for each round and closed after it: on PostgreSQL its pool
        // would otherwise hold connections the 64-writer floor needs.
        let opened = crate::store::open(&self.engine_url).await?;
        let path = path::EnginePath::new(opened.saga_store())?;
        path.round(prefix, sizes, figures)
            .await
            .context("engine path")?;
        drop(path);
        opened.close().await;
        if let Some(full_path) = self.full_path.as_mut() {
            full_path
                .round(prefix, sizes, figures)
                .await
                .context("full HTTP path")?;
        }
        self.dashboard
            .round(prefix, sizes, figures)
            .await
            .context("dashboard")?;
        Ok(())
    }

    async fn finish(mut self) -> anyhow::Result<()> {
        if let Some(full_path) = self.full_path.take() {
            full_path.stop().await;
        }
        self.floor.close().await;
        drop(self.dashboard);
        self.target.clean_up().await
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.in_flight_table {
        print!("{}", in_flight::markdown(&read_report(path)?));
        return Ok(());
    }
    if let Some(path) = &args.readme_tables {
        let report = read_report(path)?;
        // Each with the markers the README keeps it between.
        for (name, table) in [
            ("benchmark table", readme::figures_table(&report)),
            ("targets table", readme::targets_table(&report)),
            ("durability table", readme::durability_table(&report)),
        ] {
            println!(
                "<!-- {name}: generated from benches/results/bench.json -->\n{table}<!-- end of the {name} -->\n"
            );
        }
        return Ok(());
    }
    if let Some(path) = &args.limits_table {
        print!("{}", limits::markdown(&read_report(path)?));
        return Ok(());
    }
    if let Some(path) = &args.prune_table {
        print!("{}", prune::markdown(&read_report(path)?));
        return Ok(());
    }
    if args.in_flight {
        return run_ratio_mode(args, RatioMode::InFlight).await;
    }
    if args.limits {
        return run_ratio_mode(args, RatioMode::Limits).await;
    }
    if args.prune {
        return run_ratio_mode(args, RatioMode::Prune).await;
    }
    let mut sizes = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    if let Some(rounds) = args.rounds {
        if rounds < 5 {
            bail!("--rounds must be at least 5 (medians of fewer rounds are noise)");
        }
        sizes.rounds = rounds;
    }
    let targets = targets(&args)?;
    let mut figures = Figures::default();
    let mut benches = Vec::new();
    for target in targets {
        benches.push(BackendBench::setup(target, &sizes, &mut figures).await?);
    }
    let mut peers = peers::Peers::start(&args, &mut figures).await;
    for round in 1..=sizes.rounds {
        eprintln!("bench: round {round} of {}", sizes.rounds);
        for bench in &mut benches {
            bench.round(&sizes, &mut figures).await?;
        }
        peers.round(&mut figures).await;
    }
    peers.stop().await;
    for bench in benches {
        bench.finish().await?;
    }
    let targets = verdicts(&figures);
    print_table(&figures, &targets);
    if let Some(path) = &args.json {
        let report = report(&args, &sizes, &figures, &targets);
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}

/// A report `bench --json` wrote.
fn read_report(path: &std::path::Path) -> anyhow::Result<Value> {
    serde_json::from_str(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not a benchmark report", path.display()))
}

/// benches/README.md's in-flight table from a `bench --in-flight --json` report.
pub fn in_flight_table(report: &Value) -> String {
    in_flight::markdown(report)
}

/// Where the benchmark's databases go, per `--backend`.
fn targets(args: &BenchArgs) -> anyhow::Result<Vec<Target>> {
    let mut targets = Vec::new();
    if matches!(args.backend, BenchBackend::Sqlite | BenchBackend::Both) {
        let dir = std::env::temp_dir().join(format!("saga-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        targets.push(Target::Sqlite { dir });
    }
    if matches!(args.backend, BenchBackend::Postgres | BenchBackend::Both) {
        let Some(admin) = args.postgres_url.clone() else {
            bail!("--backend postgres needs --postgres-url (or SAGA_BENCH_POSTGRES_URL): a server where it may create databases");
        };
        targets.push(Target::Postgres {
            admin,
            created: Vec::new(),
        });
    }
    Ok(targets)
}

/// benches/README.md's limits table from a `bench --limits --json` report.
pub fn limits_table(report: &Value) -> String {
    limits::markdown(report)
}

/// benches/README.md's retention table from a `bench --prune --json` report.
pub fn prune_table(report: &Value) -> String {
    prune::markdown(report)
}

/// The modes that measure one path with and without something beside it
/// (limits, a prune, thousands of calls in flight) and report the ratio:
/// `--limits`, `--prune` and `--in-flight`.
#[derive(Clone, Copy)]
enum RatioMode {
    Limits,
    Prune,
    InFlight,
}

impl RatioMode {
    fn name(self) -> &'static str {
        match self {
            RatioMode::Limits => "limits",
            RatioMode::Prune => "prune",
            RatioMode::InFlight => "in-flight",
        }
    }

    fn default_rounds(self) -> usize {
        match self {
            RatioMode::InFlight => 3,
            RatioMode::Limits | RatioMode::Prune => 5,
        }
    }

    async fn measure(
        self,
        target: &mut Target,
        rounds: usize,
        args: &BenchArgs,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let quick = args.quick;
        match self {
            RatioMode::Limits => limits::measure(target, rounds, quick, figures).await,
            RatioMode::Prune => {
                prune::measure(target, rounds, quick, args.prune_log_rows, figures).await
            }
            RatioMode::InFlight => in_flight::measure(target, rounds, figures).await,
        }
    }

    fn targets(self, figures: &Figures) -> Vec<(String, Option<f64>, f64)> {
        match self {
            RatioMode::Limits => limits::targets(figures),
            RatioMode::Prune => prune::targets(figures),
            RatioMode::InFlight => in_flight::targets(figures),
        }
    }
}

/// A ratio mode's table cell from a report's medians: a step's p50 and
/// steps/s alone (`off`) and beside the thing measured (`on`), and the
/// p50 ratio, e.g. "0.705 → 0.714 ms (×1.01); 1386 → 1304 steps/s".
fn off_on_cell(report: &Value, off: &str, on: &str, ratio: &str) -> String {
    let median = |key: String| report["figures"][key]["median"].as_f64();
    match (
        median(format!("{off}.p50_ms")),
        median(format!("{on}.p50_ms")),
        median(ratio.to_owned()),
        median(format!("{off}.per_s")),
        median(format!("{on}.per_s")),
    ) {
        (Some(off), Some(on), Some(ratio), Some(off_s), Some(on_s)) => {
            format!("{off:.3} → {on:.3} ms (×{ratio:.2}); {off_s:.0} → {on_s:.0} steps/s")
        }
        _ => "not measured".to_owned(),
    }
}

/// The line under a ratio mode's table: when and how it was measured,
/// then `sizes`.
fn measured_line(report: &Value, sizes: &str) -> String {
    format!(
        "\nMeasured {} ({} build, {} rounds, medians; {} cores; {sizes}).\n",
        report["date"]
            .as_str()
            .unwrap_or("?")
            .get(..10)
            .unwrap_or("?"),
        report["build"].as_str().unwrap_or("?"),
        report["rounds"],
        report["machine"]["cores"],
    )
}

/// `bench --limits`, `--prune` and `--in-flight`: see `limits`, `prune`
/// and `in_flight`.
async fn run_ratio_mode(args: BenchArgs, mode: RatioMode) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("bench: this is a debug build; the figures that matter come from --release");
    }
    if let RatioMode::InFlight = mode {
        // Thousands of connections at once: the client's, the simulators'.
        crate::serving::raise_open_file_limit();
    }
    let rounds = args.rounds.unwrap_or(mode.default_rounds());
    let mut figures = Figures::default();
    for mut target in targets(&args)? {
        let measured = mode.measure(&mut target, rounds, &args, &mut figures).await;
        target.clean_up().await?;
        measured?;
    }
    let verdicts: Vec<Verdict> = mode
        .targets(&figures)
        .into_iter()
        .filter(|(_, value, _)| value.is_some())
        .map(|(target, value, at_most)| Verdict {
            hit: value.map(|v| v <= at_most),
            target,
            ratio: value,
            bound: format!("≤ {at_most}"),
        })
        .collect();
    print_table(&figures, &verdicts);
    if let Some(path) = &args.json {
        let report = json!({
            "date": chrono::Utc::now().to_rfc3339(),
            "mode": mode.name(),
            "quick": args.quick,
            "machine": machine(),
            "build": if cfg!(debug_assertions) { "debug" } else { "release" },
            "rounds": rounds,
            "figures": figures.all().iter().map(|f| (f.key.clone(), f.to_json())).collect::<Map<_, _>>(),
            "targets": verdicts,
            "notes": figures.notes,
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}

fn machine() -> Value {
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
    })
}

/// One target of issue 8, judged on ratios from the same run.
#[derive(Debug, serde::Serialize)]
struct Verdict {
    target: String,
    /// The measured ratio and the bound it is held to.
    ratio: Option<f64>,
    bound: String,
    hit: Option<bool>,
}

fn verdicts(figures: &Figures) -> Vec<Verdict> {
    let mut out = Vec::new();
    let mut judge =
        |target: String, ratio: Option<f64>, at_most: Option<f64>, at_least: Option<f64>| {
            let hit =
                ratio.map(|r| at_most.is_none_or(|m| r <= m) && at_least.is_none_or(|m| r >= m));
            let bound = match (at_most, at_least) {
                (Some(m), _) => format!("≤ {m}"),
                (_, Some(m)) => format!("≥ {m}"),
                _ => String::new(),
            };
            out.push(Verdict {
                target,
                ratio,
                bound,
                hit,
            });
        };
    for prefix in ["postgres", "sqlite"] {
        if figures
            .get(&format!("{prefix}.engine.lookup.c1.p50_ms"))
            .is_none()
        {
            continue;
        }
        let f = |k: &str| format!("{prefix}.{k}");
        judge(
            format!("{prefix}: engine p50 per step / Restate p50 per step"),
            figures.ratio(&f("engine.lookup.c1.p50_ms"), "restate.c1.p50_ms"),
            Some(0.5),
            None,
        );
        judge(
            format!("{prefix}: full HTTP p50 / Restate p50 per step"),
            figures.ratio(&f("http.c1.p50_ms"), "restate.c1.p50_ms"),
            Some(1.0),
            None,
        );
        judge(
            format!("{prefix}: steps/s at 8 runs / Restate's at 8"),
            figures.ratio(&f("engine.lookup.c8.per_s"), "restate.c8.per_s"),
            None,
            Some(1.0),
        );
        judge(
            format!("{prefix}: steps/s at 64 runs / two-commit floor at 64"),
            figures.ratio(&f("engine.lookup.c64.per_s"), &f("floor.pair.c64.per_s")),
            None,
            Some(0.8),
        );
        judge(
            format!("{prefix}: steps/s at 1 client / DBOS's at 1"),
            figures.ratio(&f("engine.lookup.c1.per_s"), "dbos.c1.per_s"),
            None,
            Some(5.0),
        );
        judge(
            format!("{prefix}: steps/s at 8 / DBOS's at 8"),
            figures.ratio(&f("engine.lookup.c8.per_s"), "dbos.c8.per_s"),
            None,
            Some(3.0),
        );
        judge(
            format!("{prefix}: last-window p50 / first-window p50 of a long run"),
            figures.ratio(&f("flat.last.p50_ms"), &f("flat.first.p50_ms")),
            Some(1.1),
            None,
        );
        judge(
            format!("{prefix}: run page p99 (ms) at the dashboard size"),
            figures
                .get(&f("dashboard.run_page.p99_ms"))
                .and_then(|f| f.median()),
            Some(50.0),
            None,
        );
        // Context, not a target: what durability across power loss costs
        // per commit (store settings against crash-only settings).
        judge(
            format!("{prefix}: durable commit p50 / relaxed commit p50 (context)"),
            figures.ratio(
                &f("floor.commit.c1.p50_ms"),
                &f("floor.relaxed_commit.c1.p50_ms"),
            ),
            None,
            None,
        );
        // Context, not a target: how far above the disk's floor a step is.
        judge(
            format!("{prefix}: engine p50 per step / two-commit floor p50 (context)"),
            figures.ratio(&f("engine.lookup.c1.p50_ms"), &f("floor.pair.c1.p50_ms")),
            None,
            None,
        );
        // Context, not a target: the engine against its own store calls
        // made back to back; above 1 is the harness's logic and hand-offs.
        judge(
            format!("{prefix}: engine p50 per step / its store calls alone p50 (context)"),
            figures.ratio(&f("engine.lookup.c1.p50_ms"), &f("store.sum.p50_ms")),
            None,
            None,
        );
    }
    out
}

fn print_table(figures: &Figures, verdicts: &[Verdict]) {
    println!("{:<48} {:>12} {:>9}  unit", "figure", "median", "spread");
    for figure in figures.all() {
        let median = figure.median().unwrap_or(f64::NAN);
        let spread = figure
            .spread()
            .map_or_else(|| "-".to_owned(), |s| format!("±{:.0}%", s * 100.0));
        println!(
            "{:<48} {:>12} {:>9}  {}",
            figure.key,
            number(median),
            spread,
            figure.unit
        );
    }
    if !figures.notes.is_empty() {
        println!();
        for (key, why) in &figures.notes {
            match why.as_str() {
                Some(words) => println!("{key}: {words}"),
                None => println!("{key}: {why}"),
            }
        }
    }
    println!();
    println!("{:<66} {:>9} {:>8}  verdict", "target", "ratio", "bound");
    for v in verdicts {
        let verdict = match v.hit {
            Some(true) if !v.bound.is_empty() => "hit",
            Some(false) if !v.bound.is_empty() => "MISSED",
            None => "not measured",
            _ => "",
        };
        let ratio = v.ratio.map_or_else(|| "-".to_owned(), number);
        println!("{:<66} {:>9} {:>8}  {verdict}", v.target, ratio, v.bound);
    }
}

fn number(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

fn report(args: &BenchArgs, sizes: &Sizes, figures: &Figures, verdicts: &[Verdict]) -> Value {
    let mut all = Map::new();
    for figure in figures.all() {
        all.insert(figure.key.clone(), figure.to_json());
    }
    json!({
        "date": chrono::Utc::now().to_rfc3339(),
        "mode": if args.quick { "quick" } else { "full" },
        "machine": machine(),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "sizes": sizes,
        "figures": all,
        "targets": verdicts,
        "notes": figures.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn a_database_name_replaces_the_one_in_the_url() {
        assert_eq!(
            with_database("postgres://u:p@127.0.0.1:5432/postgres", "x"),
            "postgres://u:p@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h/postgres?sslmode=disable", "x"),
            "postgres://u:p@h/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
    }
}
