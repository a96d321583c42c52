//! Several harness processes share one PostgreSQL (§5, §8): they race for
//! the same step of the same run over HTTP, one dies or stalls while it
//! owns a step in flight, and the real system still sees one effect for
//! each step. Every test runs on PostgreSQL directly and behind a
//! transaction-pooling PgBouncer.

use crate::common;

use common::process::{provision, Launch, TestProcess};
use saga_harness::sim::bundle::Simulators;
use saga_harness::sim::{Fault, FaultRule};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const AGENT: &str = "support-bot";

async fn post(http: &reqwest::Client, url: String, token: &str, body: Value) -> (u16, Value) {
    let response = http
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A harness process on `db`, with a short run lease where a test needs
/// one to run out.
async fn spawn_harness(
    db: &common::TestDb,
    tools: &std::path::Path,
    lease_ms: Option<u64>,
) -> TestProcess {
    let mut launch = Launch::new(&db.url, Some(tools));
    for (name, value) in db.env() {
        launch = launch.env(&name, &value);
    }
    if let Some(ms) = lease_ms {
        launch = launch.env("SAGA_RUN_LEASE_MS", &ms.to_string());
    }
    TestProcess::start(&launch).await
}

fn reship() -> Value {
    json!({"tool": "reship", "step": 0,
        "args": {"order_id": "ord_1002", "items": ["LAMP-7"], "email": "grace@example.com"}})
}

/// Waits until the warehouse has been asked for `n` shipments.
async fn until_shipments_asked(sims: &Simulators, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while sims
        .warehouse
        .state
        .faults
        .requests_to("POST", "/v1/shipments")
        < n
    {
        assert!(Instant::now() < deadline, "the warehouse was never asked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The agent re-sends its step to another instance, which answers with
/// the step's confirmed outcome.
async fn resent_and_confirmed(
    http: &reqwest::Client,
    at: &TestProcess,
    run: &str,
    token: &str,
) -> Value {
    let (status, out) = post(
        http,
        format!("{}/api/v1/runs/{run}/calls", at.base),
        token,
        reship(),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["outcome"], "confirmed", "{out}");
    out
}

async fn new_run(http: &reqwest::Client, base: &str, token: &str, purpose: &str) -> String {
    let (status, created) = post(
        http,
        format!("{base}/api/v1/runs"),
        token,
        json!({ "purpose": purpose }),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    created["run"]["id"].as_str().unwrap().to_owned()
}

async fn simulators_and_tools() -> (Simulators, tempfile::TempDir, std::path::PathBuf) {
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = common::process::tools_file(&sims, dir.path(), 50);
    (sims, dir, tools)
}

async fn three_processes_race(db: common::TestDb) {
    let (sims, _dir, tools) = simulators_and_tools().await;
    // The warehouse answers slowly, so both requests are in flight at once.
    sims.warehouse
        .state
        .faults
        .inject(FaultRule::new("POST", "/v1/shipments", Fault::Delay { ms: 300 }).times(10));
    let token = provision(&db.direct_url, AGENT, &[]).await;
    let first = spawn_harness(&db, &tools, None).await;
    let second = spawn_harness(&db, &tools, None).await;
    let third = spawn_harness(&db, &tools, None).await;
    let http = reqwest::Client::new();
    let rounds = 5;
    for round in 0..rounds {
        let run = new_run(&http, &first.base, &token, &format!("race {round}")).await;
        let call = |base: &str| {
            post(
                &http,
                format!("{base}/api/v1/runs/{run}/calls"),
                &token,
                reship(),
            )
        };
        let (a, b, c) = tokio::join!(call(&first.base), call(&second.base), call(&third.base));
        assert_eq!(c.1["key"], a.1["key"], "round {round}: one step, one key");
        for (status, out) in [&a, &b, &c] {
            assert_eq!(*status, 200, "round {round}: {out}");
            assert_eq!(out["outcome"], "confirmed", "round {round}: {out}");
        }
        assert_eq!(a.1["key"], b.1["key"], "round {round}: one step, one key");
        assert_eq!(
            a.1["external_ref"], b.1["external_ref"],
            "round {round}: the same shipment"
        );
        assert_eq!(a.1["next_step"], 1);
        let effects: Vec<_> = sims
            .warehouse
            .ledger()
            .of("shipment.created")
            .into_iter()
            .filter(|e| {
                e.key
                    .as_ref()
                    .and_then(|k| a.1["key"].as_str().map(|a| a == k))
                    .unwrap_or(false)
            })
            .collect();
        assert_eq!(
            effects.len(),
            1,
            "round {round}: exactly one shipment in the warehouse"
        );
    }
    assert_eq!(sims.warehouse.ledger().of("shipment.created").len(), rounds);
    // Not one request more: the other processes never sent the step
    // again, they read the first one's outcome.
    assert_eq!(
        sims.warehouse
            .state
            .faults
            .requests_to("POST", "/v1/shipments"),
        rounds
    );
}

/// An instance dies (SIGKILL) while it owns a step in flight. Another
/// instance does not touch the step while the dead one's lease lasts; once
/// it runs out, the agent's re-sent step is finished there by lookup
/// (R7): one shipment, never sent twice.
async fn killed_owner(db: common::TestDb) {
    let (sims, _dir, tools) = simulators_and_tools().await;
    // The shipment is made at once; the answer would come 30 s later.
    sims.warehouse
        .state
        .faults
        .inject(FaultRule::new("POST", "/v1/shipments", Fault::Delay { ms: 30_000 }).times(1));
    let token = provision(&db.direct_url, AGENT, &[]).await;
    let mut owner = spawn_harness(&db, &tools, Some(1_500)).await;
    let other = spawn_harness(&db, &tools, Some(1_500)).await;
    let http = reqwest::Client::new();
    let run = new_run(&http, &owner.base, &token, "killed mid-call").await;
    let in_flight = tokio::spawn({
        let (http, token) = (http.clone(), token.clone());
        let url = format!("{}/api/v1/runs/{run}/calls", owner.base);
        async move {
            http.post(url)
                .bearer_auth(token)
                .json(&reship())
                .send()
                .await
        }
    });
    until_shipments_asked(&sims, 1).await;
    owner.kill();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed instance answered"
    );
    let started = Instant::now();
    resent_and_confirmed(&http, &other, &run, &token).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}: the lease should run out within 1.5 s",
        started.elapsed()
    );
    assert_eq!(sims.warehouse.ledger().of("shipment.created").len(), 1);
    assert_eq!(
        sims.warehouse
            .state
            .faults
            .requests_to("POST", "/v1/shipments"),
        1,
        "the step was sent again instead of looked up"
    );
}

/// An instance stalls (SIGSTOP) past its lease with a step in flight;
/// another takes the run and settles the step by lookup. When the stalled
/// one wakes and its call returns, its outcome is not written over the
/// log: its agent reads what the log says, and the step's audit trail has
/// one outcome, not two.
async fn paused_owner(db: common::TestDb) {
    let (sims, _dir, tools) = simulators_and_tools().await;
    sims.warehouse
        .state
        .faults
        .inject(FaultRule::new("POST", "/v1/shipments", Fault::Delay { ms: 2_000 }).times(1));
    let token = provision(&db.direct_url, AGENT, &[]).await;
    let stalled = spawn_harness(&db, &tools, Some(1_000)).await;
    let other = spawn_harness(&db, &tools, Some(1_000)).await;
    let http = reqwest::Client::new();
    let run = new_run(&http, &stalled.base, &token, "paused mid-call").await;
    let in_flight = tokio::spawn({
        let (http, token) = (http.clone(), token.clone());
        let url = format!("{}/api/v1/runs/{run}/calls", stalled.base);
        async move { post(&http, url, &token, reship()).await }
    });
    until_shipments_asked(&sims, 1).await;
    signal(stalled.pid, "-STOP");
    let taken_over = resent_and_confirmed(&http, &other, &run, &token).await;
    signal(stalled.pid, "-CONT");
    let (status, late) = in_flight.await.unwrap();
    assert_eq!(status, 200, "{late}");
    assert_eq!(late["outcome"], "confirmed", "{late}");
    assert_eq!(late["external_ref"], taken_over["external_ref"]);
    assert_eq!(sims.warehouse.ledger().of("shipment.created").len(), 1);
    assert_eq!(
        sims.warehouse
            .state
            .faults
            .requests_to("POST", "/v1/shipments"),
        1
    );
    let store = saga_harness::store::open(&db.direct_url)
        .await
        .unwrap()
        .saga_store();
    let run_id = run.parse().unwrap();
    let outcomes: Vec<_> = store
        .events(Some(run_id), 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.entity.as_str() == "step" && e.from_status.as_deref() == Some("INTENDED"))
        .collect();
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(
        outcomes[0].actor,
        saga_harness::saga::model::Actor::System,
        "{outcomes:?}"
    );
    if !db.pooler {
        common::report_fault(
            "an instance frozen with its request in flight",
            "SIGSTOP while the warehouse holds the answer; another instance takes the run after \
             its lease (tests/process_level/two_processes.rs, directly and through PgBouncer)",
            "the step's outcomes in the audit trail; requests and shipments",
            "settled once, by the other instance's lookup; the woken instance read the same \
             reference and wrote nothing over it; 1 request, 1 shipment",
            "—",
        );
    }
}

/// A system the frozen instance's call goes to, and how to count what it
/// received and what it made.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// The warehouse: native idempotency (the key is a header) and a
    /// lookup.
    Warehouse,
    /// Jira: no idempotency of its own, only a search by the key's label,
    /// which lags behind a new issue.
    Jira,
}

impl Target {
    fn call(self) -> Value {
        match self {
            Target::Warehouse => reship(),
            Target::Jira => json!({"tool": "create_ticket", "step": 0,
                "args": {"summary": "Lamp arrived broken", "description": "Order ord_1002"}}),
        }
    }

    /// (requests received, effects made)
    fn counts(self, sims: &Simulators) -> (usize, usize) {
        match self {
            Target::Warehouse => (
                sims.warehouse
                    .state
                    .faults
                    .requests_to("POST", "/v1/shipments"),
                sims.warehouse.ledger().of("shipment.created").len(),
            ),
            Target::Jira => (
                ["/rest/api/2/issue", "/rest/api/3/issue"]
                    .iter()
                    .map(|path| sims.jira.state.faults.requests_to("POST", path))
                    .sum(),
                sims.jira.ledger().of("issue.created").len(),
            ),
        }
    }
}

/// Whether the process is stopped (SIGSTOP): its state in /proc is `T`.
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after_name = stat.rsplit_once(')')?.1;
            after_name.split_whitespace().next().map(|s| s == "T")
        })
        .unwrap_or(false)
}

/// Where a failpoint freezes an instance (SIGSTOP) on its way to a call.
#[derive(Clone, Copy, Debug)]
enum Freeze {
    /// Before the step's INTENDED row is written: the call has reached the
    /// instance and nothing of it is in the log yet.
    BeforeItsIntent,
    /// After the INTENDED row is committed and before the request leaves.
    BeforeTheRequestLeft,
}

impl Freeze {
    fn failpoint(self) -> &'static str {
        match self {
            Freeze::BeforeItsIntent => "dispatch.before_intent:1:stop",
            Freeze::BeforeTheRequestLeft => "dispatch.before_call:1:stop",
        }
    }
}

/// An instance freezes (SIGSTOP, by a failpoint) at `freeze`, for three
/// lease lengths. Another instance takes the run over, finds nothing by
/// lookup and makes the call. When the frozen one is continued it sends
/// nothing: frozen after its intent, it finds by its own clock that its
/// lease ran out, asks the database and learns the run is no longer its
/// own; frozen before its intent, its intent meets the step the other
/// wrote. Either way it answers `409 run_busy`, or, once the other has let
/// the run go, that step's outcome as the other recorded it. One request,
/// one effect, also on a system with no idempotency of its own.
async fn frozen(db: common::TestDb, target: Target, freeze: Freeze) {
    let (sims, _dir, tools) = simulators_and_tools().await;
    let token = provision(&db.direct_url, AGENT, &[]).await;
    let lease_ms = 1_000;
    let mut launch = Launch::new(&db.url, Some(&tools))
        .env("SAGA_RUN_LEASE_MS", &lease_ms.to_string())
        .failpoint(freeze.failpoint());
    for (name, value) in db.env() {
        launch = launch.env(&name, &value);
    }
    let frozen = TestProcess::start(&launch).await;
    let http = reqwest::Client::new();
    let run = new_run(&http, &frozen.base, &token, "frozen on its way to a call").await;
    let in_flight = tokio::spawn({
        let (http, token) = (http.clone(), token.clone());
        let url = format!("{}/api/v1/runs/{run}/calls", frozen.base);
        async move { post(&http, url, &token, target.call()).await }
    });
    until_stopped(frozen.pid).await;
    assert_eq!(
        target.counts(&sims),
        (0, 0),
        "nothing left before the freeze"
    );
    // Started only now: on a loaded machine the wait for the freeze may
    // outlast the lease, and the other instance would carry the run on
    // before the line above had looked.
    let other = spawn_harness(&db, &tools, Some(lease_ms)).await;
    tokio::time::sleep(Duration::from_millis(3 * lease_ms)).await;
    let (status, taken_over) = post(
        &http,
        format!("{}/api/v1/runs/{run}/calls", other.base),
        &token,
        target.call(),
    )
    .await;
    assert_eq!(status, 200, "{taken_over}");
    assert_eq!(taken_over["outcome"], "confirmed", "{taken_over}");
    signal(frozen.pid, "-CONT");
    let (status, late) = in_flight.await.unwrap();
    // The woken instance either says the run is busy or, having taken the
    // run back once the other let go, reads the other's outcome: never an
    // outcome of its own.
    assert!(status == 200 || status == 409, "{status} {late}");
    if status == 200 {
        assert_eq!(late["external_ref"], taken_over["external_ref"], "{late}");
    } else {
        assert_eq!(late["code"], "run_busy", "{late}");
    }
    if let Freeze::BeforeTheRequestLeft = freeze {
        assert!(
            frozen
                .log_text()
                .contains("taken over while this process was paused"),
            "{}",
            frozen.log_text()
        );
    }
    assert_eq!(
        target.counts(&sims),
        (1, 1),
        "{target:?} frozen {freeze:?}: one request and one effect for one step"
    );
    if !db.pooler {
        let moment = match freeze {
            Freeze::BeforeItsIntent => "before its INTENDED row was written",
            Freeze::BeforeTheRequestLeft => "after its INTENDED row, before the request left",
        };
        let system = match target {
            Target::Warehouse => "the warehouse (idempotency key)",
            Target::Jira => "Jira (lookup only)",
        };
        common::report_fault(
            &format!("an instance frozen {moment}, calling {system}"),
            "a failpoint stops the process (SIGSTOP); three lease lengths later another instance \
             takes the run and makes the call; then the frozen one is continued \
             (tests/process_level/two_processes.rs, directly and through PgBouncer)",
            "the woken instance's answer; requests and effects on the system",
            &format!(
                "the woken instance answered `{status}`{}; 1 request, 1 effect",
                late["code"]
                    .as_str()
                    .map(|code| format!(" `{code}`"))
                    .unwrap_or_default()
            ),
            "—",
        );
    }
}

/// Waits until the failpoint has frozen the process.
async fn until_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !is_stopped(pid) {
        assert!(
            Instant::now() < deadline,
            "the failpoint never froze the instance"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn frozen_before_sending_to_the_warehouse(db: common::TestDb) {
    frozen(db, Target::Warehouse, Freeze::BeforeTheRequestLeft).await;
}

async fn frozen_before_sending_to_jira(db: common::TestDb) {
    frozen(db, Target::Jira, Freeze::BeforeTheRequestLeft).await;
}

async fn frozen_before_the_intent_for_the_warehouse(db: common::TestDb) {
    frozen(db, Target::Warehouse, Freeze::BeforeItsIntent).await;
}

async fn frozen_before_the_intent_for_jira(db: common::TestDb) {
    frozen(db, Target::Jira, Freeze::BeforeItsIntent).await;
}

/// An instance freezes with its request to Jira in flight: Jira has made
/// the issue and holds its answer back, and Jira's search does not list a
/// new issue for 4 s. Three lease lengths later another instance takes the
/// run over: its first look finds nothing (the search lags), and the look
/// after the settle pause finds the issue, so it makes no second one.
/// When the frozen instance is continued its late answer is not written
/// over the log: one request, one issue.
async fn frozen_in_flight_to_jira_whose_search_lags(db: common::TestDb) {
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = common::process::tools_file(&sims, dir.path(), 2_500);
    sims.jira
        .state
        .faults
        .set_search_lag(Duration::from_secs(4));
    for path in ["/rest/api/2/issue", "/rest/api/3/issue"] {
        sims.jira
            .state
            .faults
            .inject(FaultRule::new("POST", path, Fault::Delay { ms: 4_000 }));
    }
    let token = provision(&db.direct_url, AGENT, &[]).await;
    let lease_ms = 1_000;
    let frozen = spawn_harness(&db, &tools, Some(lease_ms)).await;
    let other = spawn_harness(&db, &tools, Some(lease_ms)).await;
    let http = reqwest::Client::new();
    let run = new_run(&http, &frozen.base, &token, "frozen in flight to Jira").await;
    let in_flight = tokio::spawn({
        let (http, token) = (http.clone(), token.clone());
        let url = format!("{}/api/v1/runs/{run}/calls", frozen.base);
        async move { post(&http, url, &token, Target::Jira.call()).await }
    });
    common::until("Jira to get the request", || async {
        (Target::Jira.counts(&sims).0 == 1).then_some(())
    })
    .await;
    signal(frozen.pid, "-STOP");
    tokio::time::sleep(Duration::from_millis(3 * lease_ms)).await;
    let (status, taken_over) = post(
        &http,
        format!("{}/api/v1/runs/{run}/calls", other.base),
        &token,
        Target::Jira.call(),
    )
    .await;
    assert_eq!(status, 200, "{taken_over}");
    assert_eq!(taken_over["outcome"], "confirmed", "{taken_over}");
    signal(frozen.pid, "-CONT");
    let (status, late) = in_flight.await.unwrap();
    assert_eq!(status, 200, "{late}");
    assert_eq!(late["external_ref"], taken_over["external_ref"], "{late}");
    assert_eq!(
        Target::Jira.counts(&sims),
        (1, 1),
        "one request and one issue for one step"
    );
    let faults = &sims.jira.state.faults;
    let looked = faults.requests_to("GET", "/rest/api/2/search")
        + faults.requests_to("POST", "/rest/api/3/search");
    assert!(
        looked >= 2,
        "the other instance looked once, not twice: {looked}"
    );
    if !db.pooler {
        common::report_fault(
            "an instance frozen with its request in flight, to a system whose search lags",
            "SIGSTOP while Jira holds the answer to an issue it made; Jira's search lists a new \
             issue only after 4 s; three lease lengths later another instance takes the run \
             (tests/process_level/two_processes.rs, directly and through PgBouncer)",
            "lookups made; the woken instance's answer; requests and issues on Jira",
            &format!(
                "{looked} searches (the first found nothing, the look after the settle pause found \
                 the issue); the woken instance read the same reference; 1 request, 1 issue"
            ),
            "—",
        );
    }
}

fn signal(pid: u32, which: &str) {
    let status = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {which} {pid}");
}

/// Each scenario as two tests: on PostgreSQL itself, and behind a
/// transaction-pooling PgBouncer.
macro_rules! directly_and_through_pgbouncer {
    ($($scenario:ident: $direct:ident, $pooled:ident;)+) => {
        $(
            #[tokio::test]
            async fn $direct() {
                let db = crate::common::postgres_or_skip!();
                $scenario(db).await;
            }

            #[tokio::test]
            async fn $pooled() {
                let Some(db) = common::postgres_via_pgbouncer().await else {
                    return;
                };
                $scenario(db).await;
            }
        )+
    };
}

directly_and_through_pgbouncer! {
    three_processes_race:
        postgres_three_processes_racing_one_step_make_one_effect_and_agree,
        pgbouncer_three_processes_racing_one_step_make_one_effect_and_agree;
    killed_owner:
        postgres_a_step_in_flight_on_a_killed_instance_is_finished_once_by_another_after_its_lease,
        pgbouncer_a_step_in_flight_on_a_killed_instance_is_finished_once_by_another_after_its_lease;
    paused_owner:
        postgres_an_instance_paused_past_its_lease_never_writes_over_the_log,
        pgbouncer_an_instance_paused_past_its_lease_never_writes_over_the_log;
    frozen_before_sending_to_the_warehouse:
        postgres_an_instance_frozen_before_its_request_left_sends_nothing_when_continued,
        pgbouncer_an_instance_frozen_before_its_request_left_sends_nothing_when_continued;
    frozen_before_sending_to_jira:
        postgres_frozen_before_sending_to_a_system_without_idempotency_one_effect,
        pgbouncer_frozen_before_sending_to_a_system_without_idempotency_one_effect;
    frozen_before_the_intent_for_the_warehouse:
        postgres_an_instance_frozen_before_its_intent_makes_no_second_effect_when_continued,
        pgbouncer_an_instance_frozen_before_its_intent_makes_no_second_effect_when_continued;
    frozen_before_the_intent_for_jira:
        postgres_frozen_before_the_intent_for_a_system_without_idempotency_one_effect,
        pgbouncer_frozen_before_the_intent_for_a_system_without_idempotency_one_effect;
    frozen_in_flight_to_jira_whose_search_lags:
        postgres_frozen_in_flight_to_a_system_whose_search_lags_the_second_look_finds_the_effect,
        pgbouncer_frozen_in_flight_to_a_system_whose_search_lags_the_second_look_finds_the_effect;
}

/// 64 calls of $49.00 from one agent, spread over three harness processes
/// on one PostgreSQL, against $500.00 a day: Stripe's ledger holds ten.
async fn three_instances_racing_at_a_limit_never_sum_above_it(db: common::TestDb) {
    let (sims, _dir, tools) = simulators_and_tools().await;
    let shipped = std::fs::read_to_string(&tools).unwrap();
    std::fs::write(
        &tools,
        format!(
            "{shipped}\n[[limits.money]]\nname = \"race\"\nper = \"agent/day\"\nmax = 50000\ncurrency = \"usd\"\ntools = [\"charge_card\"]\n"
        ),
    )
    .unwrap();
    let token = provision(&db.direct_url, AGENT, &[]).await;
    let instances = [
        spawn_harness(&db, &tools, None).await,
        spawn_harness(&db, &tools, None).await,
        spawn_harness(&db, &tools, None).await,
    ];
    let http = reqwest::Client::new();
    let mut runs = Vec::new();
    for i in 0..64 {
        let base = &instances[i % 3].base;
        runs.push((base.clone(), new_run(&http, base, &token, "race").await));
    }
    let answers = futures::future::join_all(runs.iter().map(|(base, run)| {
        post(
            &http,
            format!("{base}/api/v1/runs/{run}/calls"),
            &token,
            json!({"tool": "charge_card", "step": 0,
                "args": {"customer": "cus_ada", "amount": 4900, "currency": "usd"}}),
        )
    }))
    .await;
    let outcomes: Vec<&str> = answers
        .iter()
        .map(|(status, out)| {
            assert_eq!(*status, 200, "{out}");
            out["outcome"].as_str().unwrap()
        })
        .collect();
    let charged: Vec<i64> = sims
        .stripe
        .ledger()
        .of("payment_intent.created")
        .iter()
        .map(|e| e.detail["amount"].as_i64().unwrap())
        .collect();
    assert_eq!(charged.len(), 10, "Stripe's ledger: {charged:?}");
    assert!(charged.iter().sum::<i64>() <= 50000);
    assert_eq!(outcomes.iter().filter(|o| **o == "confirmed").count(), 10);
    assert_eq!(
        outcomes.iter().filter(|o| **o == "held_over_limit").count(),
        54
    );
}

#[tokio::test]
async fn postgres_three_instances_racing_at_a_limit_never_sum_above_it() {
    if let Some(db) = common::postgres().await {
        three_instances_racing_at_a_limit_never_sum_above_it(db).await;
    }
}

#[tokio::test]
async fn pgbouncer_three_instances_racing_at_a_limit_never_sum_above_it() {
    if let Some(db) = common::postgres_via_pgbouncer().await {
        three_instances_racing_at_a_limit_never_sum_above_it(db).await;
    }
}
