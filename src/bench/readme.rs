//! benches/README.md's benchmark tables, made from a report `bench --json` wrote
//! (benches/results/bench.json), so no figure in the README is copied by
//! hand and two tables can never disagree about the same run.

use serde_json::Value;

/// Reads figures and targets out of one report.
struct Report<'a>(&'a Value);

impl Report<'_> {
    fn median(&self, key: &str) -> Option<f64> {
        self.0["figures"][key]["median"].as_f64()
    }

    /// A time in milliseconds, as the README writes it.
    fn ms(&self, key: &str) -> String {
        self.median(key)
            .map_or_else(|| "not measured".to_owned(), |v| format!("{} ms", ms(v)))
    }

    /// A rate, rounded to a whole number with thousands separators.
    fn per_s(&self, key: &str) -> String {
        self.median(key)
            .map_or_else(|| "not measured".to_owned(), whole)
    }

    fn date(&self) -> String {
        let date = self.0["date"].as_str().unwrap_or("?");
        format!(
            "{} {} UTC",
            date.get(..10).unwrap_or("?"),
            date.get(11..16).unwrap_or("?")
        )
    }

    /// The verdict of the target named `target`, if the run judged it.
    fn target(&self, target: &str) -> Option<&Value> {
        self.0["targets"]
            .as_array()?
            .iter()
            .find(|v| v["target"] == target)
    }
}

fn ms(value: f64) -> String {
    if value >= 10.0 {
        format!("{value:.1}")
    } else if value >= 0.1 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

fn whole(value: f64) -> String {
    let n = value.round() as i64;
    if n >= 1000 {
        format!("{},{:03}", n / 1000, n % 1000)
    } else {
        n.to_string()
    }
}

fn ratio(value: f64) -> String {
    format!("{value:.2}")
}

/// The main table: every figure of one run, SQLite beside PostgreSQL.
pub fn figures_table(report: &Value) -> String {
    let r = Report(report);
    let both = |cell: &dyn Fn(&str) -> String| (cell("sqlite"), cell("postgres"));
    let rows: Vec<(&str, (String, String))> = vec![
        (
            "floor: one durable commit",
            both(&|b| r.ms(&format!("{b}.floor.commit.c1.p50_ms"))),
        ),
        (
            "floor: one relaxed commit (crash-safe, not power-safe)",
            both(&|b| r.ms(&format!("{b}.floor.relaxed_commit.c1.p50_ms"))),
        ),
        (
            "floor: two-commit pair, 1 / 8 / 64 writers",
            both(&|b| {
                format!(
                    "{}; {} / {} pairs/s",
                    r.ms(&format!("{b}.floor.pair.c1.p50_ms")),
                    r.per_s(&format!("{b}.floor.pair.c8.per_s")),
                    r.per_s(&format!("{b}.floor.pair.c64.per_s"))
                )
            }),
        ),
        (
            "engine step with lookup",
            both(&|b| r.ms(&format!("{b}.engine.lookup.c1.p50_ms"))),
        ),
        (
            "engine step without lookup",
            both(&|b| r.ms(&format!("{b}.engine.no_lookup.c1.p50_ms"))),
        ),
        (
            "engine steps/s at 1 / 8 / 64 runs (lookup)",
            both(&|b| {
                format!(
                    "{} / {} / {}",
                    r.per_s(&format!("{b}.engine.lookup.c1.per_s")),
                    r.per_s(&format!("{b}.engine.lookup.c8.per_s")),
                    r.per_s(&format!("{b}.engine.lookup.c64.per_s"))
                )
            }),
        ),
        (
            "the same step's store calls alone: claim with intent / outcome with release",
            both(&|b| {
                let part = |p: &str| {
                    r.median(&format!("{b}.store.{p}.p50_ms"))
                        .map_or_else(|| "-".to_owned(), ms)
                };
                format!(
                    "{} / {} ms (sum {})",
                    part("intent"),
                    part("outcome"),
                    part("sum")
                )
            }),
        ),
        (
            "full HTTP path (the simulator alone in brackets)",
            both(&|b| {
                format!(
                    "{} ({})",
                    r.ms(&format!("{b}.http.c1.p50_ms")),
                    r.ms(&format!("{b}.http.direct.p50_ms"))
                )
            }),
        ),
        (
            "step 1,000 ÷ step 1 (p50 of 100-step windows)",
            both(&|b| {
                r.median(&format!("{b}.flat.last_over_first"))
                    .map_or_else(|| "not measured".to_owned(), ratio)
            }),
        ),
        (
            "reconcile + unwind of 1,000 steps",
            both(&|b| {
                r.median(&format!("{b}.unwind.wall_ms")).map_or_else(
                    || "not measured".to_owned(),
                    |v| format!("{:.2} s", v / 1000.0),
                )
            }),
        ),
        (
            "runs list / run page at 1,000,000 rows",
            both(&|b| {
                let p50 = |what: &str| {
                    r.median(&format!("{b}.dashboard.{what}.p50_ms"))
                        .map_or_else(|| "-".to_owned(), ms)
                };
                format!("{} / {} ms", p50("runs_list"), p50("run_page"))
            }),
        ),
    ];
    let mut out =
        String::from("| figure (p50 unless said) | SQLite | PostgreSQL |\n|---|---|---|\n");
    for (figure, (sqlite, postgres)) in rows {
        out.push_str(&format!("| {figure} | {sqlite} | {postgres} |\n"));
    }
    out.push('\n');
    out.push_str(&peers_sentence(&r));
    out.push_str(&format!(
        "\nMeasured {} ({} build, {} rounds, medians; {} cores).\n",
        r.date(),
        report["build"].as_str().unwrap_or("?"),
        report["sizes"]["rounds"],
        report["machine"]["cores"],
    ));
    out
}

/// What the peers did in the same run, or why they were not measured.
fn peers_sentence(r: &Report) -> String {
    let peer = |name: &str, label: &str| match r.median(&format!("{name}.c1.p50_ms")) {
        Some(p50) => format!(
            "{label} {} ms per step (p50), {} steps/s sequential, {} steps/s with 8 concurrent",
            ms(p50),
            r.per_s(&format!("{name}.c1.per_s")),
            r.per_s(&format!("{name}.c8.per_s"))
        ),
        None => format!(
            "{label} not measured ({})",
            r.0["notes"][name].as_str().unwrap_or("not installed")
        ),
    };
    format!(
        "Peers in the same run: {}; {}.\n",
        peer("restate", "Restate"),
        peer("dbos", "DBOS Transact on the same PostgreSQL")
    )
}

/// The targets table: each target of the benchmark, per backend, with
/// its verdict.
pub fn targets_table(report: &Value) -> String {
    let r = Report(report);
    let rows = [
        (
            "engine p50 ÷ Restate p50",
            "engine p50 per step / Restate p50 per step",
        ),
        (
            "full HTTP p50 ÷ Restate p50",
            "full HTTP p50 / Restate p50 per step",
        ),
        (
            "steps/s at 8 ÷ Restate's at 8",
            "steps/s at 8 runs / Restate's at 8",
        ),
        (
            "steps/s at 64 ÷ two-commit floor at 64",
            "steps/s at 64 runs / two-commit floor at 64",
        ),
        ("steps/s at 1 ÷ DBOS's", "steps/s at 1 client / DBOS's at 1"),
        ("steps/s at 8 ÷ DBOS's", "steps/s at 8 / DBOS's at 8"),
        (
            "step 1,000 ÷ step 1",
            "last-window p50 / first-window p50 of a long run",
        ),
        (
            "run page p99 at 1,000,000 rows (ms)",
            "run page p99 (ms) at the dashboard size",
        ),
    ];
    let mut out = String::from("| target | PostgreSQL | SQLite |\n|---|---|---|\n");
    for (label, name) in rows {
        let cell = |backend: &str| match r.target(&format!("{backend}: {name}")) {
            Some(v) => match (v["ratio"].as_f64(), v["hit"].as_bool()) {
                (Some(value), Some(hit)) => format!(
                    "{} (bound {}): {}",
                    ratio(value),
                    v["bound"].as_str().unwrap_or(""),
                    if hit { "met" } else { "missed" }
                ),
                _ => "not measured".to_owned(),
            },
            None => "not measured".to_owned(),
        };
        out.push_str(&format!(
            "| {label} | {} | {} |\n",
            cell("postgres"),
            cell("sqlite")
        ));
    }
    out
}

/// What durability across power loss costs per commit, from the floor rows
/// of the same run.
pub fn durability_table(report: &Value) -> String {
    let r = Report(report);
    let cell = |b: &str, f: &dyn Fn(&str) -> String| f(b);
    let durable = |b: &str| r.ms(&format!("{b}.floor.commit.c1.p50_ms"));
    let relaxed = |b: &str| r.ms(&format!("{b}.floor.relaxed_commit.c1.p50_ms"));
    // The run's own ratio, taken round by round.
    let price = |b: &str| {
        r.target(&format!(
            "{b}: durable commit p50 / relaxed commit p50 (context)"
        ))
        .and_then(|v| v["ratio"].as_f64())
        .map_or_else(|| "not measured".to_owned(), |v| format!("{v:.1}×"))
    };
    let at8 = |b: &str| {
        format!(
            "{} / {}",
            r.per_s(&format!("{b}.floor.commit.c8.per_s")),
            r.per_s(&format!("{b}.floor.relaxed_commit.c8.per_s"))
        )
    };
    let mut out = format!(
        "| one commit, p50 (run of {}) | SQLite | PostgreSQL |\n|---|---|---|\n",
        r.date()
    );
    for (what, f) in [
        (
            "durable (`synchronous = FULL` / `synchronous_commit = on`)",
            &durable as &dyn Fn(&str) -> String,
        ),
        (
            "relaxed (`NORMAL` / `off`): survives a crash, not a power cut",
            &relaxed,
        ),
        ("price of surviving a power cut", &price),
        ("commits per second with 8 writers, durable / relaxed", &at8),
    ] {
        out.push_str(&format!(
            "| {what} | {} | {} |\n",
            cell("sqlite", f),
            cell("postgres", f)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_figure_the_run_did_not_measure_says_so_instead_of_a_number() {
        let report = json!({
            "date": "2026-12-04T18:30:00Z", "build": "release",
            "sizes": {"rounds": 5}, "machine": {"cores": 2},
            "figures": {"sqlite.floor.commit.c1.p50_ms": {"median": 0.184}},
            "targets": [], "notes": {"restate": "npm could not install it"}
        });
        let table = figures_table(&report);
        assert!(
            table.contains("| floor: one durable commit | 0.18 ms | not measured |"),
            "{table}"
        );
        assert!(
            table.contains("Restate not measured (npm could not install it)"),
            "{table}"
        );
        let durability = durability_table(&report);
        assert!(
            durability.contains("run of 2026-12-04 18:30 UTC"),
            "{durability}"
        );
        assert!(targets_table(&report)
            .contains("| engine p50 ÷ Restate p50 | not measured | not measured |"));
    }

    #[test]
    fn numbers_are_written_as_the_readme_writes_them() {
        assert_eq!(whole(2764.4), "2,764");
        assert_eq!(whole(767.0), "767");
        assert_eq!(ms(0.072), "0.072");
        assert_eq!(ms(1.304), "1.30");
        assert_eq!(ms(12.34), "12.3");
    }
}
