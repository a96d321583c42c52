//! Racing instances and load, over HTTP against the real binary.
//!
//! Three harness processes share one PostgreSQL and many clients of one
//! agent race each other on the same runs and steps (§5, §8): every step
//! has exactly one effect in the real system and every client reads the
//! same outcome. Three processes that start at once on a log with
//! unfinished unwinds resume them once between them.
//!
//! A bounded load test drives runs of steps through the API with 10% of the
//! calls meeting a fault in the simulators: no 5xx, no lost row, every
//! effect once, the server's resident memory under 512 MB; it prints
//! throughput and p99. CI runs 40 runs × 5 steps per backend (more runs at
//! once than the harness has PostgreSQL connections);
//! `SAGA_LOAD_RUNS=200 SAGA_LOAD_STEPS=50` is the big run, and
//! `SAGA_RACE_RUNS` / `SAGA_RACE_CLIENTS` (default 8 and 6) size the races.

use crate::common;

use common::process::{provision, rss_kib, tools_file, Launch, TestProcess};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use saga_harness::sim::bundle::Simulators;
use saga_harness::sim::{Fault, FaultRule};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const AGENT: &str = "support-bot";

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A tool the load uses, where its effect lands and what it is called.
struct Tool {
    name: &'static str,
    /// (simulator, POST path that makes the effect)
    path: &'static str,
    action: &'static str,
}

const TOOLS: [Tool; 4] = [
    Tool {
        name: "create_ticket",
        path: "/rest/api/3/issue",
        action: "issue.created",
    },
    Tool {
        name: "reship",
        path: "/v1/shipments",
        action: "shipment.created",
    },
    Tool {
        name: "charge_card",
        path: "/v1/payment_intents",
        action: "payment_intent.created",
    },
    Tool {
        name: "create_email_draft",
        path: "/v1/drafts",
        action: "draft.created",
    },
];

fn sim<'a>(sims: &'a Simulators, tool: &str) -> &'a saga_harness::sim::bundle::Sim {
    match tool {
        "create_ticket" => &sims.jira,
        "reship" => &sims.warehouse,
        "charge_card" => &sims.stripe,
        _ => &sims.orders,
    }
}

fn args(tool: &str, run: usize, step: usize) -> Value {
    match tool {
        "create_ticket" => json!({"summary": format!("Case {run}.{step}")}),
        "reship" => json!({"order_id": format!("ord_{run}_{step}"), "items": ["KETTLE-2"],
                           "email": "ada@example.com"}),
        "charge_card" => json!({"customer": "cus_ada", "amount": 100 + step, "currency": "usd",
                                "email": "ada@example.com", "receipt": false}),
        _ => {
            json!({"to": "ada@example.com", "subject": format!("Case {run}.{step}"), "body": "Draft."})
        }
    }
}

/// Every effect of `action` the simulators recorded, counted by key.
fn effects_by_key(sims: &Simulators, tool: &str, action: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for effect in sim(sims, tool).ledger().of(action) {
        if let Some(key) = effect.key {
            *counts.entry(key).or_default() += 1;
        }
    }
    counts
}

/// POSTs to exactly `path` (not to paths below it).
fn posts_to(sim: &saga_harness::sim::bundle::Sim, path: &str) -> usize {
    let faults = &sim.state.faults;
    faults.requests_to("POST", path) - faults.requests_to("POST", &format!("{path}/"))
}

async fn post(http: &reqwest::Client, url: &str, token: &str, body: &Value) -> (u16, Value) {
    let response = http
        .post(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// What each racer was told, by (run, step).
type Answers = HashMap<(usize, usize), Vec<Value>>;

#[tokio::test]
async fn postgres_three_processes_and_many_clients_racing_make_one_effect_per_step() {
    let db = crate::common::postgres_or_skip!();
    let runs = knob("SAGA_RACE_RUNS", 8);
    let racers = knob("SAGA_RACE_CLIENTS", 6);
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    // Slow answers keep the racers' requests in flight together.
    for tool in &TOOLS {
        sim(&sims, tool.name)
            .state
            .faults
            .inject(FaultRule::new("POST", tool.path, Fault::Delay { ms: 80 }).times(u32::MAX));
    }
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 50);
    let token = provision(&db.url, AGENT, &[]).await;
    let launch = Launch::new(&db.url, Some(&tools));
    let harnesses = vec![
        TestProcess::start(&launch).await,
        TestProcess::start(&launch).await,
        TestProcess::start(&launch).await,
    ];
    let bases: Vec<String> = harnesses.iter().map(|h| h.base.clone()).collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let started = Instant::now();
    let mut tasks = Vec::new();
    let answers: Arc<Mutex<Answers>> = Arc::default();
    for run in 0..runs {
        // Every racer creates "the same" run by label: one run.
        for racer in 0..racers {
            let (http, bases, token, answers) =
                (http.clone(), bases.clone(), token.clone(), answers.clone());
            tasks.push(tokio::spawn(async move {
                let base = &bases[(run + racer) % bases.len()];
                let (status, created) = post(
                    &http,
                    &format!("{base}/api/v1/runs"),
                    &token,
                    &json!({"label": format!("race-{run}"), "purpose": "race"}),
                )
                .await;
                assert!(status == 200 || status == 201, "{status} {created}");
                let id = created["run"]["id"].as_str().unwrap().to_owned();
                for (step, tool) in TOOLS.iter().enumerate() {
                    let body = json!({"tool": tool.name, "args": args(tool.name, run, step), "step": step});
                    let mut attempt = 0;
                    loop {
                        // Each attempt goes to another process.
                        let base = &bases[(run + racer + attempt) % bases.len()];
                        attempt += 1;
                        assert!(attempt < 60, "run {run} step {step} never settled");
                        let (status, out) =
                            post(&http, &format!("{base}/api/v1/runs/{id}/calls"), &token, &body).await;
                        assert!(status < 500, "{status} {out}");
                        if status == 409 {
                            // Another racer holds the run or moved the step first.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                        assert_eq!(status, 200, "{out}");
                        if out["outcome"] == "confirmed" {
                            answers.lock().unwrap().entry((run, step)).or_default().push(out);
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                id
            }));
        }
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), runs, "one run per label");
    let answers = answers.lock().unwrap();
    let mut effects_checked = 0;
    for ((run, step), seen) in answers.iter() {
        assert_eq!(seen.len(), racers, "run {run} step {step}");
        let key = &seen[0]["key"];
        for out in seen {
            assert_eq!(&out["key"], key, "run {run} step {step}: one step, one key");
            assert_eq!(
                out["external_ref"], seen[0]["external_ref"],
                "run {run} step {step}"
            );
        }
        let tool = &TOOLS[*step];
        let found = effects_by_key(&sims, tool.name, tool.action)
            .get(key.as_str().unwrap())
            .copied()
            .unwrap_or(0);
        assert_eq!(
            found, 1,
            "run {run} step {step} ({}): {found} effects",
            tool.name
        );
        effects_checked += 1;
    }
    for tool in &TOOLS {
        // Not one request more than steps: no racer sent a step again.
        assert_eq!(
            posts_to(sim(&sims, tool.name), tool.path),
            runs,
            "{}",
            tool.name
        );
    }
    eprintln!(
        "load race: 3 processes × {racers} clients on each of {runs} runs × {} steps: \
         {effects_checked} steps, each one effect, {} requests to the systems; {:.1} s",
        TOOLS.len(),
        runs * TOOLS.len(),
        elapsed.as_secs_f64()
    );
    drop(harnesses);
}

#[tokio::test]
async fn postgres_three_processes_resuming_at_once_finish_each_unwind_once() {
    let db = crate::common::postgres_or_skip!();
    let runs = knob("SAGA_RACE_RUNS", 8);
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 50);
    let token = provision(&db.url, AGENT, &[]).await;
    let launch = Launch::new(&db.url, Some(&tools));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    // Runs with three effects each, then unwinds that die with their
    // compensations written down and not yet sent.
    let mut ids = Vec::new();
    {
        let harness = TestProcess::start(&launch).await;
        for run in 0..runs {
            let base = &harness.base;
            let (_, created) = post(
                &http,
                &format!("{base}/api/v1/runs"),
                &token,
                &json!({"purpose": "resume race"}),
            )
            .await;
            let id = created["run"]["id"].as_str().unwrap().to_owned();
            for (step, tool) in TOOLS.iter().take(3).enumerate() {
                let body =
                    json!({"tool": tool.name, "args": args(tool.name, run, step), "step": step});
                let (_, out) = post(
                    &http,
                    &format!("{base}/api/v1/runs/{id}/calls"),
                    &token,
                    &body,
                )
                .await;
                assert_eq!(out["outcome"], "confirmed", "{out}");
            }
            ids.push(id);
        }
    }
    // All the unwinds at once on one process, whose compensations answer
    // slowly; it dies at the n-th compensation it is about to send, with
    // the others at every stage of theirs.
    for (path, sim) in [
        ("/v1/refunds", &sims.stripe),
        ("/v1/shipments/by-reference", &sims.warehouse),
        ("/rest/api/3/issue/", &sims.jira),
    ] {
        sim.state
            .faults
            .inject(FaultRule::new("POST", path, Fault::Delay { ms: 150 }).times(u32::MAX));
    }
    // The process that dies has a name; one of the three that resume
    // restarts under it (and so takes back at once what it held), the other
    // two are new instances that find those runs held until then.
    let named = launch.clone().env("SAGA_INSTANCE_ID", "resume-race");
    let mut armed = TestProcess::start(
        &named
            .clone()
            .failpoint(format!("unwind.before_compensation_call:{runs}")),
    )
    .await;
    let unwinds: Vec<_> = ids
        .iter()
        .map(|id| {
            let (http, url, token) = (
                http.clone(),
                format!("{}/api/v1/runs/{id}/unwind", armed.base),
                token.clone(),
            );
            tokio::spawn(async move {
                http.post(url)
                    .bearer_auth(token)
                    .json(&json!({"reason": "race"}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            })
        })
        .collect();
    let mut interrupted = 0;
    for unwind in unwinds {
        match unwind.await.unwrap() {
            Ok(status) => assert_eq!(status, 200),
            Err(_) => interrupted += 1,
        }
    }
    assert!(interrupted > 0, "the failpoint did not fire");
    assert!(armed.wait_for_exit(Duration::from_secs(30)).await.is_some());
    // Three processes start together; each resumes every unwinding run.
    let (a, b, c) = tokio::join!(
        TestProcess::start(&named),
        TestProcess::start(&launch),
        TestProcess::start(&launch)
    );
    let mut unwound = 0;
    for id in &ids {
        let read = || async {
            http.get(format!("{}/api/v1/runs/{id}", a.base))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        };
        let mut view = read().await;
        if view["run"]["status"] == "RUNNING" {
            // This run's unwind request died with the process before it
            // began: the agent, told nothing, sends it again.
            let (status, body) = post(
                &http,
                &format!("{}/api/v1/runs/{id}/unwind", a.base),
                &token,
                &json!({"reason": "race"}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            view = read().await;
        }
        assert_eq!(view["run"]["status"], "UNWOUND", "{view}");
        unwound += 1;
    }
    drop((a, b, c));
    // Each effect was taken back once: one refund per charge, one
    // cancellation per shipment, one close per ticket.
    let refunds = sims.stripe.ledger().of("refund.created").len();
    let cancels = sims.warehouse.ledger().of("shipment.cancelled").len();
    let closes = sims
        .jira
        .ledger()
        .of("issue.transitioned")
        .into_iter()
        .filter(|e| e.detail["to"] == "Done")
        .count();
    assert_eq!((refunds, cancels, closes), (runs, runs, runs));
    assert_eq!(
        sims.stripe.state.faults.requests_to("POST", "/v1/refunds"),
        runs
    );
    assert_eq!(
        sims.warehouse
            .state
            .faults
            .requests_to("POST", "/v1/shipments/by-reference"),
        runs
    );
    eprintln!(
        "load resume race: 3 processes resumed {interrupted} interrupted unwinds at once ({unwound} runs UNWOUND); \
         {refunds} refunds, {cancels} cancellations, {closes} closes: each once"
    );
}

/// What the load test saw.
#[derive(Default)]
struct Seen {
    latencies: Mutex<Vec<Duration>>,
    calls: AtomicUsize,
    faults: AtomicUsize,
    five_xx: AtomicUsize,
    max_rss_kib: AtomicU64,
}

async fn bounded_load(db: common::TestDb, backend: &str) {
    let runs = knob("SAGA_LOAD_RUNS", 40);
    let steps = knob("SAGA_LOAD_STEPS", 5);
    let sims = Arc::new(
        Simulators::start("127.0.0.1".parse().unwrap(), 0)
            .await
            .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 50);
    let token = provision(&db.url, AGENT, &[]).await;
    let harness = TestProcess::start(&Launch::new(&db.url, Some(&tools))).await;
    let base = harness.base.clone();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(runs)
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(
        knob("SAGA_LOAD_SEED", 7) as u64
    )));
    // Resident memory, sampled throughout.
    let pid = harness.pid;
    let sampler = {
        let seen = seen.clone();
        tokio::spawn(async move {
            loop {
                if let Some(kib) = rss_kib(pid) {
                    seen.max_rss_kib.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let started = Instant::now();
    let mut tasks = Vec::new();
    for run in 0..runs {
        let (http, base, token, seen, rng, sims) = (
            http.clone(),
            base.clone(),
            token.clone(),
            seen.clone(),
            rng.clone(),
            sims.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let timed = |path: String, body: Value| {
                let (http, base, token, seen) = (&http, &base, &token, &seen);
                async move {
                    let at = Instant::now();
                    let (status, out) = post(http, &format!("{base}{path}"), token, &body).await;
                    seen.latencies.lock().unwrap().push(at.elapsed());
                    if status >= 500 {
                        seen.five_xx.fetch_add(1, Ordering::Relaxed);
                    }
                    (status, out)
                }
            };
            let created = loop {
                let (status, created) = timed(
                    "/api/v1/runs".into(),
                    json!({"purpose": format!("load {run}")}),
                )
                .await;
                if status < 500 {
                    assert_eq!(status, 201, "{created}");
                    break created;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let id = created["run"]["id"].as_str().unwrap().to_owned();
            let mut last = Vec::new();
            for step in 0..steps {
                let tool = &TOOLS[(run + step) % TOOLS.len()];
                let body =
                    json!({"tool": tool.name, "args": args(tool.name, run, step), "step": step});
                let outcome = loop {
                    // One call in ten meets a fault in the system it reaches.
                    let fault = {
                        let mut rng = rng.lock().unwrap();
                        rng.gen_bool(0.1).then(|| match rng.gen_range(0..7) {
                            0 => Fault::CommitThen504,
                            1 => Fault::ResetAfterCommit,
                            2 => Fault::CommitThenBlank,
                            3 => Fault::Delay { ms: 300 },
                            4 => Fault::Reject {
                                status: 503,
                                message: "overloaded".into(),
                            },
                            5 => Fault::RateLimit,
                            _ => Fault::Reject {
                                status: 422,
                                message: "refused".into(),
                            },
                        })
                    };
                    if let Some(fault) = fault {
                        sim(&sims, tool.name)
                            .state
                            .faults
                            .inject(FaultRule::new("POST", tool.path, fault));
                        seen.faults.fetch_add(1, Ordering::Relaxed);
                    }
                    let (status, out) =
                        timed(format!("/api/v1/runs/{id}/calls"), body.clone()).await;
                    seen.calls.fetch_add(1, Ordering::Relaxed);
                    if status >= 500 {
                        // Counted (and failed below); an agent would re-send.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    assert_eq!(status, 200, "run {run} step {step}: {out}");
                    match out["outcome"].as_str() {
                        Some(done @ ("confirmed" | "failed")) => break done.to_owned(),
                        Some("unknown" | "not_executed") => {
                            tokio::time::sleep(Duration::from_millis(20)).await
                        }
                        _ => panic!("run {run} step {step}: {out}"),
                    }
                };
                last.push(outcome);
            }
            (id, last)
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    sampler.abort();
    // No lost rows: every step the agent was told about is in the log, as
    // it was told; every effect the log confirms happened once, and none
    // that it does not.
    let mut effects_checked = 0;
    let mut counts: HashMap<&str, HashMap<String, usize>> = HashMap::new();
    for tool in &TOOLS {
        counts.insert(tool.name, effects_by_key(&sims, tool.name, tool.action));
    }
    for (id, told) in &results {
        let view: Value = reqwest::Client::new()
            .get(format!("{base}/api/v1/runs/{id}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let logged = view["steps"].as_array().unwrap();
        assert_eq!(logged.len(), steps, "run {id}: rows lost");
        for (step, outcome) in logged.iter().zip(told) {
            let status = step["status"].as_str().unwrap();
            assert_eq!(status, outcome.to_uppercase(), "run {id}: {step}");
            let key = step["idempotency_key"].as_str().unwrap();
            let found = counts[step["tool"].as_str().unwrap()]
                .get(key)
                .copied()
                .unwrap_or(0);
            assert_eq!(
                found,
                usize::from(status == "CONFIRMED"),
                "run {id}: {step}"
            );
            effects_checked += 1;
        }
    }
    let mut latencies = seen.latencies.lock().unwrap().clone();
    latencies.sort();
    let p = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let calls = seen.calls.load(Ordering::Relaxed);
    let rss_mib = seen.max_rss_kib.load(Ordering::Relaxed) / 1024;
    let failed = results
        .iter()
        .flat_map(|(_, t)| t)
        .filter(|o| *o == "failed")
        .count();
    eprintln!(
        "load on {backend}: {runs} runs × {steps} steps, {calls} calls ({} faults injected, {failed} steps failed by a 4xx), \
         {} 5xx; {:.0} steps/s, {:.0} requests/s; latency p50 {:?}, p99 {:?}, max {:?}; peak RSS {rss_mib} MiB; {effects_checked} steps checked",
        seen.faults.load(Ordering::Relaxed),
        seen.five_xx.load(Ordering::Relaxed),
        (runs * steps) as f64 / elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        p(0.5),
        p(0.99),
        latencies.last().unwrap(),
    );
    let errors: Vec<String> = harness
        .log_text()
        .lines()
        .filter(|l| l.contains("ERROR"))
        .take(5)
        .map(str::to_owned)
        .collect();
    assert_eq!(seen.five_xx.load(Ordering::Relaxed), 0, "{errors:#?}");
    assert!(rss_mib < 512, "peak RSS {rss_mib} MiB");
    drop(harness);
}

#[tokio::test]
async fn sqlite_bounded_load_with_faults_loses_nothing_and_stays_small() {
    bounded_load(common::sqlite(), "SQLite").await;
}

#[tokio::test]
async fn postgres_bounded_load_with_faults_loses_nothing_and_stays_small() {
    let db = crate::common::postgres_or_skip!();
    bounded_load(db, "PostgreSQL").await;
}
