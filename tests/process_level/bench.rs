//! The benchmark cannot rot: `saga-harness bench --quick` runs on SQLite
//! (and on PostgreSQL when `SAGA_TEST_POSTGRES_URL` names a server) and its
//! JSON holds every figure. No time is asserted: this machine is shared
//! and only ratios from one run mean anything.

use serde_json::Value;
use std::process::Command;

/// Every figure a backend must report, after its `sqlite.` / `postgres.` prefix.
const FIGURES: &[&str] = &[
    "floor.commit.c1.p50_ms",
    "floor.commit.c1.p99_ms",
    "floor.commit.c8.per_s",
    "floor.commit.c64.per_s",
    "floor.pair.c1.p50_ms",
    "floor.pair.c1.p99_ms",
    "floor.pair.c8.per_s",
    "floor.pair.c64.per_s",
    "floor.relaxed_commit.c1.p50_ms",
    "floor.relaxed_commit.c8.per_s",
    "engine.lookup.c1.p50_ms",
    "engine.lookup.c1.p99_ms",
    "engine.lookup.c8.per_s",
    "engine.lookup.c8.process_cores",
    "engine.lookup.c8.machine_busy_cores",
    "engine.lookup.c64.per_s",
    "engine.lookup.c64.process_cores",
    "engine.lookup.c64.machine_busy_cores",
    "engine.no_lookup.c1.p50_ms",
    "engine.no_lookup.c1.p99_ms",
    "engine.no_lookup.c8.per_s",
    "engine.no_lookup.c64.per_s",
    "store.intent.p50_ms",
    "store.outcome.p50_ms",
    "store.sum.p50_ms",
    "http.c1.p50_ms",
    "http.c1.p99_ms",
    "http.direct.p50_ms",
    "http.harness_share.p50_ms",
    "flat.first.p50_ms",
    "flat.last.p50_ms",
    "flat.last_over_first",
    "unwind.wall_ms",
    "dashboard.runs_list.p50_ms",
    "dashboard.runs_list.p99_ms",
    "dashboard.run_page.p50_ms",
    "dashboard.run_page.p99_ms",
];

fn quick_bench(backend: &str, postgres_url: Option<&str>) -> Value {
    let dir = tempfile::tempdir().expect("temporary directory");
    let json = dir.path().join("bench.json");
    let mut command = Command::new(env!("CARGO_BIN_EXE_saga-harness"));
    command
        .args(["bench", "--quick", "--backend", backend, "--json"])
        .arg(&json)
        .env_remove("SAGA_BENCH_POSTGRES_URL");
    if let Some(url) = postgres_url {
        command.args(["--postgres-url", url]);
    }
    let output = command.output().expect("running saga-harness bench");
    assert!(
        output.status.success(),
        "bench --quick --backend {backend} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("verdict"), "no table printed:\n{table}");
    serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON file")).expect("JSON")
}

fn assert_every_figure(report: &Value, prefix: &str) {
    assert_eq!(report["mode"], "quick");
    for figure in FIGURES {
        let key = format!("{prefix}.{figure}");
        let found = &report["figures"][&key];
        let median = found["median"].as_f64();
        assert!(
            median.is_some_and(f64::is_finite),
            "{key} is missing or not a number: {found}"
        );
        let rounds = found["rounds"].as_array().map_or(0, Vec::len);
        assert!(rounds >= 5, "{key} has {rounds} rounds, not at least 5");
    }
    assert!(report["targets"].as_array().is_some_and(|t| !t.is_empty()));
    assert!(
        report["notes"]["peers"].is_string(),
        "the report says why peers were not measured"
    );
}

#[test]
fn the_quick_benchmark_reports_every_figure_on_sqlite() {
    let report = quick_bench("sqlite", None);
    assert_every_figure(&report, "sqlite");
}

#[test]
fn the_quick_benchmark_reports_every_figure_on_postgres() {
    let Ok(url) = std::env::var("SAGA_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but SAGA_TEST_POSTGRES_URL is not: the PostgreSQL benchmark cannot be skipped in CI"
        );
        eprintln!("skipped: SAGA_TEST_POSTGRES_URL is not set");
        return;
    };
    let report = quick_bench("postgres", Some(&url));
    assert_every_figure(&report, "postgres");
}

/// benches/README.md's in-flight table is the committed benchmark output, not a
/// copy: regenerate it with `saga-harness bench --in-flight-table
/// benches/results/in-flight.json` after a new run.
#[test]
fn the_readme_in_flight_table_is_generated_from_the_committed_results() {
    let report = committed("in-flight.json");
    let readme = std::fs::read_to_string("benches/README.md").unwrap();
    assert_eq!(
        readme_region(&readme, "in-flight table", "in-flight.json"),
        saga_harness::bench::in_flight_table(&report),
        "benches/README.md's in-flight table differs from benches/results/in-flight.json"
    );
}

/// Runs `bench MODE --quick` on both backends (SQLite alone without a
/// PostgreSQL to use), checks that each of `keys` has a finite, positive
/// median for each backend, and gives back the report.
fn quick_ratio_bench(mode: &str, keys: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("temporary directory");
    let json = dir.path().join("report.json");
    let mut command = Command::new(env!("CARGO_BIN_EXE_saga-harness"));
    command
        .args(["bench", mode, "--quick", "--json"])
        .arg(&json)
        .env_remove("SAGA_BENCH_POSTGRES_URL");
    match std::env::var("SAGA_TEST_POSTGRES_URL") {
        Ok(url) => command.args(["--backend", "both", "--postgres-url", &url]),
        Err(_) => command.args(["--backend", "sqlite"]),
    };
    let output = command.output().expect("running saga-harness bench");
    assert!(
        output.status.success(),
        "bench {mode} --quick failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON file"))
            .expect("JSON");
    let backends: &[&str] = if std::env::var("SAGA_TEST_POSTGRES_URL").is_ok() {
        &["sqlite", "postgres"]
    } else {
        &["sqlite"]
    };
    for backend in backends {
        for key in keys {
            let median = report["figures"][format!("{backend}.{key}")]["median"].as_f64();
            assert!(
                median.is_some_and(|m| m.is_finite() && m > 0.0),
                "{backend}.{key}: {median:?}"
            );
        }
    }
    report
}

/// `bench --limits --quick` measures a step with and without limits on
/// both backends and writes each figure and its ratio.
#[test]
fn the_quick_limits_benchmark_reports_both_variants() {
    let report = quick_ratio_bench(
        "--limits",
        &[
            "limits.off.c1.p50_ms",
            "limits.on.c1.p50_ms",
            "limits.off.c8.per_s",
            "limits.on.c8.per_s",
            "limits.ratio.c1.p50",
            "limits.ratio.c8.p50",
        ],
    );
    let table = saga_harness::bench::limits_table(&report);
    assert!(table.contains("30 steps alone"), "{table}");
}

/// `bench --prune --quick` times a prune of settled runs and a step alone
/// and beside a prune, on both backends.
#[test]
fn the_quick_prune_benchmark_reports_the_rate_and_the_hot_path_beside_it() {
    let report = quick_ratio_bench(
        "--prune",
        &[
            "prune.s_per_million_saga_log_rows",
            "prune.runs_per_s",
            "prune.off.p50_ms",
            "prune.on.p50_ms",
            "prune.ratio.p50",
        ],
    );
    let table = saga_harness::bench::prune_table(&report);
    assert!(
        table.contains("200 runs of 5 steps pruned per batch"),
        "{table}"
    );
}

/// benches/README.md's retention table is the committed `bench --prune`
/// output: regenerate it with `saga-harness bench --prune-table
/// benches/results/prune.json` after a new run.
#[test]
fn the_readme_retention_table_is_generated_from_the_committed_results() {
    let report = committed("prune.json");
    let readme = std::fs::read_to_string("benches/README.md").unwrap();
    assert_eq!(
        readme_region(&readme, "retention table", "prune.json"),
        saga_harness::bench::prune_table(&report),
        "benches/README.md's retention table differs from benches/results/prune.json"
    );
}

/// benches/README.md's limits table is the committed `bench --limits`
/// output: regenerate it with `saga-harness bench --limits-table
/// benches/results/limits.json` after a new run.
#[test]
fn the_readme_limits_table_is_generated_from_the_committed_results() {
    let report = committed("limits.json");
    let readme = std::fs::read_to_string("benches/README.md").unwrap();
    assert_eq!(
        readme_region(&readme, "limits table", "limits.json"),
        saga_harness::bench::limits_table(&report),
        "benches/README.md's limits table differs from benches/results/limits.json"
    );
}

/// A benchmark report committed under benches/results.
fn committed(file: &str) -> Value {
    let path = format!("benches/results/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

/// A README's region between `<!-- NAME: generated from
/// benches/results/FILE -->` and `<!-- end of the NAME -->`.
fn readme_region<'a>(readme: &'a str, name: &str, file: &str) -> &'a str {
    let start = format!("<!-- {name}: generated from benches/results/{file} -->\n");
    let end = format!("<!-- end of the {name} -->");
    let from = readme
        .find(&start)
        .unwrap_or_else(|| panic!("no opening marker for {name}"))
        + start.len();
    let to = from
        + readme[from..]
            .find(&end)
            .unwrap_or_else(|| panic!("no closing marker for {name}"));
    &readme[from..to]
}

/// benches/README.md's benchmark, targets and durability tables are the committed
/// benchmark output, not copies: regenerate them with `saga-harness bench
/// --readme-tables benches/results/bench.json` after `./scripts/bench.sh`.
#[test]
fn the_readme_benchmark_tables_are_generated_from_one_committed_run() {
    use saga_harness::bench::readme;
    let report = committed("bench.json");
    let readme_text = std::fs::read_to_string("benches/README.md").unwrap();
    for (name, table) in [
        ("benchmark table", readme::figures_table(&report)),
        ("targets table", readme::targets_table(&report)),
        ("durability table", readme::durability_table(&report)),
    ] {
        assert_eq!(
            readme_region(&readme_text, name, "bench.json"),
            table,
            "benches/README.md's {name} differs from benches/results/bench.json"
        );
    }
}

/// The table of faults outside the process (docs/operations.md): one row per fault
/// test, from what the test measured in its last committed run.
fn faults_table(rows: &Value) -> String {
    let mut table = String::from(
        "| fault | what the test does | what it checks | result in the committed run | knob |\n\
         |---|---|---|---|---|\n",
    );
    for row in rows.as_array().expect("a list of rows") {
        let cell = |name: &str| row[name].as_str().unwrap_or("").replace('|', "\\|");
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            cell("fault"),
            cell("done"),
            cell("checked"),
            cell("result"),
            cell("knob")
        ));
    }
    table
}

/// docs/operations.md's table of faults is the committed output of the fault tests,
/// not a copy: `./scripts/faults.sh` runs them and rewrites it (with
/// `SAGA_UPDATE_README=1` this test writes the table instead of checking).
/// Where the table of faults outside the process is published.
const FAULTS_PAGE: &str = "docs/operations.md";

#[test]
fn the_readme_faults_table_is_generated_from_the_committed_fault_run() {
    let rows = committed("faults.json");
    let table = faults_table(&rows);
    let readme = std::fs::read_to_string(FAULTS_PAGE).unwrap();
    let region = readme_region(&readme, "faults table", "faults.json");
    if std::env::var_os("SAGA_UPDATE_README").is_some() {
        // The region is a slice of `readme`: splice by position.
        let from = region.as_ptr() as usize - readme.as_ptr() as usize;
        let updated = format!(
            "{}{table}{}",
            &readme[..from],
            &readme[from + region.len()..]
        );
        std::fs::write(FAULTS_PAGE, updated).unwrap();
        return;
    }
    assert_eq!(
        region, table,
        "docs/operations.md's faults table differs from benches/results/faults.json"
    );
    for fault in [
        "PostgreSQL stopped in immediate mode",
        "PgBouncer killed and restarted",
        "a synchronous standby takes over",
        "connections cut mid-statement",
        "a full disk (SQLite)",
        "the database unreachable",
    ] {
        assert!(
            rows.as_array().unwrap().iter().any(|r| r["fault"] == fault),
            "benches/results/faults.json has no row for {fault}"
        );
    }
}
