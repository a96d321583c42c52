//! In flight: many runs, each making one call to a system that answers a
//! second later, all at once through the agent API of real harness
//! processes (the release binary running this benchmark, `serve`). With
//! no connection or lock held across a call, the wall time stays near the
//! system's one second however many calls wait on it.
//!
//! The baseline, measured in the same round: the same number of requests
//! sent straight to the simulator, with the same one-second answer. The
//! harness's own cost is the difference.

use super::stats::{Better, Figures};
use super::Target;
use crate::sim::bundle::{Simulators, CREDENTIALS};
use crate::sim::{Fault, FaultRule};
use anyhow::{anyhow, bail, Context};
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the warehouse takes to answer each call.
const SYSTEM_DELAY: Duration = Duration::from_secs(1);

/// Runs at once on one instance, and on three instances sharing one
/// PostgreSQL.
const ONE_INSTANCE: [usize; 3] = [1, 200, 1000];
const THREE_INSTANCES: usize = 3000;

/// A harness process serving the agent API.
struct Instance {
    child: std::process::Child,
    base: String,
}

impl Instance {
    async fn start(exe: &Path, url: &str, tools: &Path, name: &str) -> anyhow::Result<Instance> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut command = std::process::Command::new(exe);
        command
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .arg("--tools")
            .arg(tools)
            .env("DATABASE_URL", url)
            .env("SAGA_INSTANCE_ID", name)
            .env("RUST_LOG", "warn,sqlx=error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        for (variable, value) in CREDENTIALS {
            command.env(variable, value);
        }
        let child = command.spawn().context("starting a harness process")?;
        let mut instance = Instance {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = instance.child.try_wait()? {
                bail!("a harness process exited during start-up ({status})");
            }
            if let Ok(answer) = http.get(format!("{}/healthz", instance.base)).send().await {
                if answer.status().is_success() {
                    return Ok(instance);
                }
            }
            if Instant::now() > deadline {
                instance.stop();
                bail!("a harness process did not become healthy within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process's peak resident memory (VmHWM), in MiB.
    fn peak_rss_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kib: f64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kib / 1024.0)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One scenario: fresh database, simulators, instances, token.
struct Scenario {
    sims: Simulators,
    instances: Vec<Instance>,
    token: String,
    http: reqwest::Client,
    tools: std::path::PathBuf,
}

impl Drop for Scenario {
    fn drop(&mut self) {
        self.instances.clear();
        let _ = std::fs::remove_file(&self.tools);
    }
}

impl Scenario {
    async fn start(target: &mut Target, name: &str, instances: usize) -> anyhow::Result<Scenario> {
        let url = target.database(name).await?;
        // Migrated and provisioned here, then closed: a SQLite file is one
        // process's at a time.
        let token = crate::auth::new_api_token();
        {
            let opened = crate::store::open(&url).await?;
            opened
                .saga_store()
                .add_api_token(
                    super::path::AGENT,
                    &crate::auth::token_hash(&token),
                    Some("bench"),
                )
                .await?;
            opened.close().await;
        }
        let sims = Simulators::start([127, 0, 0, 1].into(), 0)
            .await
            .context("starting the simulators")?;
        let tools = std::env::temp_dir().join(format!(
            "saga-bench-{}-{name}-tools.toml",
            std::process::id()
        ));
        std::fs::write(
            &tools,
            sims.point(crate::demo::SUPPORT_TOOLS)
                .map_err(|e| anyhow!(e))?,
        )?;
        let exe = std::env::current_exe().context("finding this binary")?;
        let mut started = Vec::new();
        for i in 0..instances {
            started.push(Instance::start(&exe, &url, &tools, &format!("bench-{name}-{i}")).await?);
        }
        Ok(Scenario {
            sims,
            instances: started,
            token,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(usize::MAX)
                .pool_idle_timeout(crate::serving::CLIENT_POOL_IDLE)
                .timeout(Duration::from_secs(120))
                .build()?,
            tools,
        })
    }

    async fn post(&self, url: String, body: Value) -> anyhow::Result<Value> {
        let answer = self
            .http
            .post(url)
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        let status = answer.status();
        let body: Value = answer.json().await?;
        if !status.is_success() {
            bail!("{status}: {body}");
        }
        Ok(body)
    }

    /// `n` new runs, spread over the instances.
    async fn new_runs(&self, n: usize) -> anyhow::Result<Vec<(usize, String)>> {
        futures::stream::iter(0..n)
            .map(|i| async move {
                let at = i % self.instances.len();
                let created = self
                    .post(
                        format!("{}/api/v1/runs", self.instances[at].base),
                        json!({"purpose": "in flight"}),
                    )
                    .await?;
                let id = created["run"]["id"]
                    .as_str()
                    .ok_or_else(|| anyhow!("no run id in {created}"))?;
                Ok::<_, anyhow::Error>((at, id.to_owned()))
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// Every run's one call at once; the seconds until the last answer.
    async fn calls_at_once(&self, runs: &[(usize, String)]) -> anyhow::Result<f64> {
        self.slow_warehouse(runs.len());
        let started = Instant::now();
        let answers = futures::future::join_all(runs.iter().map(|(at, run)| {
            self.post(
                format!("{}/api/v1/runs/{run}/calls", self.instances[*at].base),
                json!({"tool": "reship", "step": 0,
                       "args": {"order_id": "ord_1002", "items": ["LAMP-7"], "email": "grace@example.com"}}),
            )
        }))
        .await;
        let took = started.elapsed().as_secs_f64();
        for answer in answers {
            let answer = answer?;
            if answer["outcome"] != "confirmed" {
                bail!("a call was not confirmed: {answer}");
            }
        }
        Ok(took)
    }

    /// The baseline: as many requests straight to the warehouse, each
    /// answered after the same delay.
    async fn direct_at_once(&self, n: usize) -> anyhow::Result<f64> {
        self.slow_warehouse(n);
        let url = format!("{}/v1/shipments", self.sims.warehouse.base_url());
        let started = Instant::now();
        let answers = futures::future::join_all((0..n).map(|_| {
            let reference = uuid::Uuid::new_v4().simple().to_string();
            self.http
                .post(&url)
                .header("Idempotency-Key", &reference)
                .json(&json!({"order_id": "ord_1002", "items": ["LAMP-7"], "reference": reference}))
                .send()
        }))
        .await;
        let took = started.elapsed().as_secs_f64();
        for answer in answers {
            answer?.error_for_status()?;
        }
        Ok(took)
    }

    fn slow_warehouse(&self, requests: usize) {
        self.sims.warehouse.state.faults.inject(
            FaultRule::new(
                "POST",
                "/v1/shipments",
                Fault::Delay {
                    ms: SYSTEM_DELAY.as_millis() as u64,
                },
            )
            .times(requests as u32),
        );
    }

    fn peak_rss_mib(&self) -> Option<f64> {
        self.instances
            .iter()
            .filter_map(Instance::peak_rss_mib)
            .reduce(f64::max)
    }
}

/// Measures one backend's in-flight figures into `figures`.
pub async fn measure(
    target: &mut Target,
    rounds: usize,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let prefix = target.prefix();
    let mut scenarios: Vec<(usize, usize)> = ONE_INSTANCE.iter().map(|&n| (1, n)).collect();
    if matches!(target, Target::Postgres { .. }) {
        scenarios.push((3, THREE_INSTANCES));
    }
    for (instances, n) in scenarios {
        let name = format!("inflight_{instances}x{n}");
        eprintln!("bench: {prefix}: {n} calls at once on {instances} instance(s)");
        let scenario = Scenario::start(target, &name, instances).await?;
        let key = |what: &str| format!("{prefix}.in_flight.i{instances}.n{n}.{what}");
        for _ in 0..rounds {
            let runs = scenario.new_runs(n).await?;
            let direct = scenario.direct_at_once(n).await?;
            let harness = scenario.calls_at_once(&runs).await?;
            figures.record(&key("wall_s"), "s", Better::Lower, harness);
            figures.record(&key("direct_s"), "s", Better::Lower, direct);
        }
        if let Some(mib) = scenario.peak_rss_mib() {
            figures.record(&key("peak_rss_mib"), "MiB", Better::Lower, mib);
        }
    }
    if let Target::Postgres { admin, .. } = target {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect(admin).await?;
        let limit: String = sqlx::query_scalar("SHOW max_connections")
            .fetch_one(&mut conn)
            .await?;
        figures.note(
            "postgres.in_flight",
            format!("the server's max_connections: {limit}"),
        );
        conn.close().await?;
    }
    Ok(())
}

/// The in-flight targets, each judged on this run's figures.
pub fn targets(figures: &Figures) -> Vec<(String, Option<f64>, f64)> {
    let mut out = Vec::new();
    for prefix in ["sqlite", "postgres"] {
        let wall = |i: usize, n: usize| {
            figures
                .get(&format!("{prefix}.in_flight.i{i}.n{n}.wall_s"))
                .and_then(|f| f.median())
        };
        if wall(1, 1).is_none() {
            continue;
        }
        out.push((
            format!("{prefix}: 200 runs × one 1-s call, one instance (s)"),
            wall(1, 200),
            1.5,
        ));
        out.push((
            format!("{prefix}: 1,000 runs × one 1-s call, one instance (s)"),
            wall(1, 1000),
            2.5,
        ));
        out.push((
            format!("{prefix}: peak RSS of that instance (MiB)"),
            figures
                .get(&format!("{prefix}.in_flight.i1.n1000.peak_rss_mib"))
                .and_then(|f| f.median()),
            256.0,
        ));
        if prefix == "postgres" {
            out.push((
                "postgres: 3,000 runs × one 1-s call, three instances (s)".to_owned(),
                wall(3, THREE_INSTANCES),
                3.0,
            ));
        }
    }
    out
}

/// benches/README.md's in-flight table, made from a report `bench --in-flight
/// --json` wrote (benches/results/in-flight.json), so the README never
/// copies a figure by hand.
pub fn markdown(report: &Value) -> String {
    let median = |key: &str| report["figures"][key]["median"].as_f64();
    let cell = |prefix: &str, instances: usize, n: usize| {
        let key = |what: &str| format!("{prefix}.in_flight.i{instances}.n{n}.{what}");
        match (median(&key("wall_s")), median(&key("direct_s"))) {
            (Some(wall), Some(direct)) => format!("{wall:.2} s (system alone {direct:.2} s)"),
            _ => "not measured".to_owned(),
        }
    };
    let rss = |prefix: &str| {
        median(&format!("{prefix}.in_flight.i1.n1000.peak_rss_mib"))
            .map_or_else(|| "not measured".to_owned(), |mib| format!("{mib:.0} MiB"))
    };
    let mut out = String::new();
    out.push_str("| runs at once, one call each that its system answers after 1 s | SQLite | PostgreSQL | target |\n");
    out.push_str("|---|---|---|---|\n");
    for (n, target) in [(1, ""), (200, "≤ 1.5 s"), (1000, "≤ 2.5 s")] {
        out.push_str(&format!(
            "| {}, one instance | {} | {} | {target} |\n",
            thousands(n),
            cell("sqlite", 1, n),
            cell("postgres", 1, n)
        ));
    }
    out.push_str(&format!(
        "| peak RSS of the instance at 1,000 | {} | {} | ≤ 256 MiB |\n",
        rss("sqlite"),
        rss("postgres")
    ));
    out.push_str(&format!(
        "| {}, three instances on one database | (one process per file) | {} | ≤ 3 s |\n",
        thousands(THREE_INSTANCES),
        cell("postgres", 3, THREE_INSTANCES)
    ));
    let note = report["notes"]["postgres.in_flight"].as_str().unwrap_or("");
    out.push_str(&super::measured_line(
        report,
        &format!("PostgreSQL: {note}"),
    ));
    out
}

fn thousands(n: usize) -> String {
    if n >= 1000 {
        format!("{},{:03}", n / 1000, n % 1000)
    } else {
        n.to_string()
    }
}
