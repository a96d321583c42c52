//! What the people who run the harness see: each metric moved by the event
//! it counts, read from `/metrics` on its own listener (and accepted by
//! Prometheus's own checker); readiness; a trace from the API request to
//! the system request, in the log and exported over OTLP; shutdown that lets calls in flight finish and leaves
//! the rest to resume; `doctor` saying which systems are down; the
//! operators' page, for admins only.

use crate::common;
use common::app::{Spawn, TestApp};

use common::process::{
    free_port, provision, tools_file, ApiAgent, Dashboard, Launch, TestProcess, PASSWORD,
};
use common::world::{Fault, World, TOOLS};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use saga_harness::connectors::ConnectorSet;
use saga_harness::ops::logging::DEFAULT_FILTER;
use saga_harness::saga::engine::Engine;
use saga_harness::saga::model::{Actor, ApprovalKind, NewApproval, NewRun, Via};
use saga_harness::saga::store::SagaStore;
use saga_harness::sim::bundle::{Simulators, CREDENTIALS};
use saga_harness::sim::{Fault as SimFault, FaultRule};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const AGENT: &str = "support-bot";

/// A harness in this process over the model world, with its metrics
/// listener on a port of its own.
struct Ops {
    base: String,
    metrics: String,
    engine: Arc<Engine>,
    store: Arc<dyn SagaStore>,
    world: Arc<World>,
    http: reqwest::Client,
    _app: TestApp,
    _db: common::TestDb,
    _tools: tempfile::TempDir,
}

async fn start(db: common::TestDb) -> Ops {
    let tools = tempfile::tempdir().unwrap();
    let path = tools.path().join("tools.toml");
    std::fs::write(&path, TOOLS).unwrap();
    let world = Arc::new(World::new());
    let connectors = ConnectorSet::new().serve(crate::common::world::OPERATIONS, world.clone());
    let app = Spawn::on(&db)
        .tools(path)
        .connectors(connectors)
        .with(|args| args.operations.metrics_bind = Some("127.0.0.1:0".parse().unwrap()))
        .start()
        .await;
    let base = app.base.clone();
    let metrics = app.metrics.clone().expect("a metrics listener");
    let (engine, store) = (app.state().engine.clone(), app.state().store.clone());
    Ops {
        base,
        metrics,
        engine,
        store,
        world,
        http: reqwest::Client::new(),
        _app: app,
        _db: db,
        _tools: tools,
    }
}

impl Ops {
    async fn scrape(&self) -> Scrape {
        let response = self.http.get(&self.metrics).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"));
        Scrape(response.text().await.unwrap())
    }

    async fn run(&self) -> Uuid {
        self.store
            .create_run(NewRun {
                agent: AGENT.into(),
                label: None,
                purpose: "refund a double charge".into(),
            })
            .await
            .unwrap()
            .0
            .id
    }

    async fn call(&self, run: Uuid, tool: &str, args: Value, step: i64) -> String {
        let answer = self
            .engine
            .call(AGENT, run, tool, args, Some(step))
            .await
            .unwrap();
        answer.outcome.as_str().to_owned()
    }
}

/// One scrape's text.
struct Scrape(String);

impl Scrape {
    /// Whether a sample with this name and these labels is served at all.
    fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .any(|line| {
                let series = line.rsplit_once(' ').map_or(line, |(series, _)| series);
                let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
                metric == name
                    && labels
                        .iter()
                        .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            })
    }

    /// The value of the sample with this name whose labels include every
    /// `name="value"` pair given; 0 when there is none.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
                let fits = metric == name
                    && labels
                        .iter()
                        .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
                fits.then(|| value.parse::<f64>().ok()).flatten()
            })
            .sum()
    }
}

/// Every series the tools file names is served at zero before its first
/// event, as Prometheus's guidelines ask: a rate starts from zero, and an
/// alert on a series that is absent means "not scraped", not "never
/// happened".
#[tokio::test]
async fn every_series_the_tools_file_names_is_served_at_zero_before_its_first_event() {
    let ops = start(common::sqlite()).await;
    let scrape = ops.scrape().await;
    for (name, labels) in [
        (
            "saga_steps_total",
            &[("tool", "create_ticket"), ("outcome", "confirmed")][..],
        ),
        (
            "saga_steps_total",
            &[("tool", "create_ticket"), ("outcome", "unknown")],
        ),
        ("saga_unknown_outcomes_total", &[("tool", "create_ticket")]),
        (
            "saga_unknowns_settled_total",
            &[("tool", "create_ticket"), ("how", "second_look")],
        ),
        ("saga_reconcile_seconds_count", &[("tool", "create_ticket")]),
        (
            "saga_system_request_seconds_count",
            &[("system", "tickets"), ("request", "lookup")],
        ),
        ("saga_calls_in_flight", &[("system", "tickets")]),
        ("saga_unwinds_total", &[("by", "person")]),
        ("saga_approvals_expired_total", &[("kind", "pivot")]),
    ] {
        assert!(
            scrape.has(name, labels),
            "{name} {labels:?} is not served:\n{}",
            scrape.0
        );
        assert_eq!(scrape.value(name, labels), 0.0, "{name} {labels:?}");
    }
}

#[tokio::test]
async fn metrics_are_served_on_their_own_address_only_and_prometheus_accepts_them() {
    let ops = start(common::sqlite()).await;
    let run = ops.run().await;
    assert_eq!(
        ops.call(run, "create_ticket", json!({"subject": "double charge"}), 0)
            .await,
        "confirmed"
    );
    let scrape = ops.scrape().await;
    // The public address does not serve them: it sends a stranger to sign in.
    let public = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/metrics", ops.base))
        .send()
        .await
        .unwrap();
    assert_ne!(public.status(), 200);
    // Prometheus's own checker reads the text as Prometheus would.
    let promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match promtool {
        Ok(child) => child,
        Err(err) if std::env::var_os("CI").is_none() => {
            eprintln!("promtool not installed ({err}); scripts/setup.sh installs it. Not checked.");
            return;
        }
        Err(err) => panic!("promtool is needed under CI: {err}"),
    };
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.0.as_bytes())
        .unwrap();
    let checked = child.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool: {}{}\n{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr),
        scrape.0
    );
}

#[tokio::test]
async fn each_step_outcome_and_each_way_an_unknown_is_settled_moves_its_metric() {
    let ops = start(common::sqlite()).await;
    let run = ops.run().await;
    let ticket = |n: i64| json!({"subject": format!("double charge {n}")});
    assert_eq!(
        ops.call(run, "create_ticket", ticket(0), 0).await,
        "confirmed"
    );
    let scrape = ops.scrape().await;
    let confirmed = [
        ("tool", "create_ticket"),
        ("class", "compensatable"),
        ("outcome", "confirmed"),
    ];
    assert_eq!(scrape.value("saga_steps_total", &confirmed), 1.0);
    assert_eq!(
        scrape.value(
            "saga_system_request_seconds_count",
            &[("system", "tickets"), ("request", "execute")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value("saga_calls_in_flight", &[("system", "tickets")]),
        0.0
    );

    // A 504 after the effect: unknown; the re-sent step finds it at once.
    ops.world.fail_next("tickets.create", Fault::EffectThen504);
    assert_eq!(
        ops.call(run, "create_ticket", ticket(1), 1).await,
        "unknown"
    );
    let scrape = ops.scrape().await;
    assert_eq!(
        scrape.value("saga_unknown_outcomes_total", &[("tool", "create_ticket")]),
        1.0
    );
    assert_eq!(
        ops.call(run, "create_ticket", ticket(1), 1).await,
        "confirmed"
    );
    // The search lags once: found on the second look.
    ops.world.fail_next("tickets.create", Fault::EffectThen504);
    assert_eq!(
        ops.call(run, "create_ticket", ticket(2), 2).await,
        "unknown"
    );
    ops.world.lag_lookups("tickets.create", 1);
    assert_eq!(
        ops.call(run, "create_ticket", ticket(2), 2).await,
        "confirmed"
    );
    let scrape = ops.scrape().await;
    let settled = |how| {
        scrape.value(
            "saga_unknowns_settled_total",
            &[("tool", "create_ticket"), ("how", how)],
        )
    };
    assert_eq!((settled("lookup"), settled("second_look")), (1.0, 1.0));
    assert_eq!(
        scrape.value("saga_reconcile_seconds_count", &[("tool", "create_ticket")]),
        2.0
    );
    assert_eq!(scrape.value("saga_steps_total", &confirmed), 3.0);
    assert_eq!(
        scrape.value(
            "saga_system_request_seconds_count",
            &[("system", "tickets"), ("request", "lookup")]
        ),
        3.0
    );

    // An email before the pivot waits for its own approval; sent, it is
    // lost at the gateway, and mail has no lookup: a person answers.
    let email = json!({"to": "ada@example.com", "subject": "your refund", "body": "done"});
    assert_eq!(
        ops.call(run, "email_customer", email, 3).await,
        "awaiting_approval"
    );
    let scrape = ops.scrape().await;
    assert_eq!(
        scrape.value("saga_approvals_waiting", &[("kind", "step")]),
        1.0
    );
    assert!(scrape.value("saga_approvals_oldest_wait_seconds", &[("kind", "step")]) >= 0.0);
    let held = ops.store.pending_approvals().await.unwrap().remove(0);
    ops.world.fail_next("mail.send", Fault::EffectThen504);
    let lead = Actor::User("lead".into());
    let sent = ops
        .engine
        .decide_step(held.id, &held.digest, true, &lead, Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(sent.status.as_str(), "UNKNOWN");
    ops.engine
        .answer(run, 3, true, None, sent.updated_at, &lead)
        .await
        .unwrap();
    let scrape = ops.scrape().await;
    assert_eq!(
        scrape.value("saga_approvals_waiting", &[("kind", "step")]),
        0.0
    );
    assert_eq!(
        scrape.value(
            "saga_unknowns_settled_total",
            &[("tool", "email_customer"), ("how", "person")]
        ),
        1.0
    );
    assert!(scrape.value("saga_db_connections_max", &[]) >= 1.0);
}

#[tokio::test]
async fn unwinds_compensations_corrections_and_expired_approvals_move_their_metrics() {
    let ops = start(common::sqlite()).await;
    // A charge with a receipt: its customer saw it. Unwound by the agent,
    // it is refunded and a correction waits for the customer's audience.
    let run = ops.run().await;
    let charge = json!({"amount": 900, "receipt": true, "email": "ada@example.com"});
    assert_eq!(ops.call(run, "charge_card", charge, 0).await, "confirmed");
    ops.engine
        .unwind(run, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    let scrape = ops.scrape().await;
    assert_eq!(scrape.value("saga_unwinds_total", &[("by", "agent")]), 1.0);
    assert_eq!(
        scrape.value(
            "saga_compensations_total",
            &[("tool", "refund"), ("outcome", "confirmed")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value("saga_corrections_pending", &[("audience", "customer")]),
        1.0
    );

    // A pivot left pending past its deadline expires: its own outcome.
    let run = ops.run().await;
    assert_eq!(
        ops.call(run, "authorize_card", json!({"amount": 300}), 0)
            .await,
        "confirmed"
    );
    let plan = vec![saga_harness::saga::pivot::PlannedCall {
        tool: "charge_card".into(),
        args: json!({"amount": 300}),
    }];
    let pivot = ops
        .engine
        .propose_pivot(AGENT, run, "capture", plan)
        .await
        .unwrap();
    let scrape = ops.scrape().await;
    assert_eq!(
        scrape.value("saga_approvals_waiting", &[("kind", "pivot")]),
        1.0
    );
    ops.store
        .request_approval(
            NewApproval {
                run_id: run,
                kind: ApprovalKind::Pivot,
                step_idx: None,
                summary: pivot.summary.clone(),
                plan: pivot.plan.clone(),
                digest: pivot.digest.clone(),
                expires_at: Some(chrono::Utc::now() - chrono::Duration::days(1)),
                approvers_needed: 1,
            },
            None,
            &Actor::Agent(AGENT.into()),
        )
        .await
        .unwrap();
    assert_eq!(ops.engine.expire_approvals().await.unwrap(), 1);
    let scrape = ops.scrape().await;
    assert_eq!(
        scrape.value("saga_approvals_expired_total", &[("kind", "pivot")]),
        1.0
    );
    assert_eq!(
        scrape.value("saga_approvals_waiting", &[("kind", "pivot")]),
        0.0
    );
    assert_eq!(scrape.value("saga_unwinds_total", &[("by", "system")]), 1.0);
}

#[tokio::test]
async fn the_operators_page_draws_the_hours_figures_for_admins_only() {
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("ada", "admin"), ("vic", "viewer")]).await;
    let ops = start(db).await;
    let run = ops.run().await;
    for step in 0..2 {
        let ticket = json!({"subject": format!("double charge {step}")});
        assert_eq!(
            ops.call(run, "create_ticket", ticket, step).await,
            "confirmed"
        );
    }

    let admin = Dashboard::new();
    admin.sign_in(&ops.base, "ada", PASSWORD).await;
    let page = admin.page(&ops.base, "/operations").await;
    let words = common::visible_text(&page);
    assert!(words.contains("Operations"), "{words}");
    assert!(words.contains("Steps per minute"), "{words}");
    assert!(words.contains("2 steps in the hour shown"), "{words}");
    assert!(words.contains("tickets: answer time (mean, s)"), "{words}");
    assert!(words.contains("Database connections in use"), "{words}");
    assert!(page.contains("<svg"), "{page}");
    assert!(
        page.contains(r#"href="/operations""#),
        "an admin's bar links the page"
    );

    let viewer = Dashboard::new();
    viewer.sign_in(&ops.base, "vic", PASSWORD).await;
    let page = viewer.page(&ops.base, "/operations").await;
    assert!(page.contains("vic is a viewer"), "{page}");
    assert!(page.contains("page is for admins"), "{page}");
    assert!(!page.contains("Steps per minute"), "{page}");
    let runs = viewer.page(&ops.base, "/").await;
    assert!(
        !runs.contains(r#"href="/operations""#),
        "a viewer's bar has no link"
    );
}

#[tokio::test]
async fn readiness_says_the_database_answers_and_is_current() {
    let ops = start(common::sqlite()).await;
    let ready = ops
        .http
        .get(format!("{}/readyz", ops.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["database"], "ok", "{body}");
    assert_eq!(body["ready"], true, "{body}");
    assert!(body["tools"].as_u64().unwrap() > 0, "{body}");
}

/// An internal failure (here, tables the harness needs gone from under
/// it) is told as one fixed sentence with an incident id; the database's
/// own words stay in the log.
#[tokio::test]
async fn an_internal_failure_tells_only_that_it_failed_and_under_which_incident() {
    use sqlx::Connection as _;
    let db = common::sqlite();
    let ops = start(db).await;
    let token = saga_harness::auth::new_api_token();
    ops.store
        .add_api_token(AGENT, &saga_harness::auth::token_hash(&token), None)
        .await
        .unwrap();
    let mut direct = sqlx::SqliteConnection::connect(&ops._db.url).await.unwrap();
    for statement in [
        "ALTER TABLE _sqlx_migrations RENAME TO hidden_migrations",
        "ALTER TABLE runs RENAME TO hidden_runs",
    ] {
        sqlx::query(statement).execute(&mut direct).await.unwrap();
    }
    let ready = ops
        .http
        .get(format!("{}/readyz", ops.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let text = ready.text().await.unwrap();
    assert!(text.contains(r#""database":"unavailable""#), "{text}");
    assert!(!text.contains("no such table"), "{text}");

    let created = ops
        .http
        .post(format!("{}/api/v1/runs", ops.base))
        .bearer_auth(&token)
        .json(&json!({"purpose": "refund a double charge"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 500);
    let body: Value = created.json().await.unwrap();
    assert_eq!(body["code"], "internal", "{body}");
    let incident = body["incident"].as_str().unwrap_or_default();
    assert_eq!(incident.len(), 8, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("(incident {incident})")),
        "{body}"
    );
    assert!(
        !message.contains("no such table") && !message.contains("runs"),
        "{body}"
    );
}

#[tokio::test]
async fn postgres_readiness_says_the_database_answers_and_is_current() {
    let db = crate::common::postgres_or_skip!();
    let ops = start(db).await;
    let body: Value = ops
        .http
        .get(format!("{}/readyz", ops.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (body["ready"].clone(), body["database"].clone()),
        (json!(true), json!("ok"))
    );
}

/// The simulators, the shipped tools file pointed at them, a SQLite file
/// with an agent token, and a harness process started with `extra` flags.
struct Live {
    sims: Simulators,
    dir: tempfile::TempDir,
    url: String,
    token: String,
    launch: Launch,
}

async fn live(env: &[(&str, &str)]) -> Live {
    let sims = Simulators::start([127, 0, 0, 1].into(), 0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 0);
    let url = format!("sqlite://{}", dir.path().join("saga.db").display());
    let token = provision(&url, AGENT, &[]).await;
    let mut launch = Launch::new(&url, Some(&tools));
    for (name, value) in env {
        launch = launch.env(name, value);
    }
    Live {
        sims,
        dir,
        url,
        token,
        launch,
    }
}

impl Live {
    /// The warehouse makes the next shipment at once and answers `ms` later.
    fn slow_warehouse(&self, ms: u64) {
        self.sims.warehouse.state.faults.inject(FaultRule::new(
            "POST",
            "/v1/shipments",
            SimFault::Delay { ms },
        ));
    }

    fn shipments(&self) -> usize {
        self.sims.warehouse.ledger().of("shipment.created").len()
    }
}

async fn new_run(http: &reqwest::Client, base: &str, token: &str) -> String {
    let created: Value = http
        .post(format!("{base}/api/v1/runs"))
        .bearer_auth(token)
        .json(&json!({"purpose": "reship a lamp"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["run"]["id"].as_str().unwrap().to_owned()
}

fn reship_call(base: &str, run: &str, token: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("{base}/api/v1/runs/{run}/calls"))
        .bearer_auth(token)
        .json(&json!({"tool": "reship", "step": 0,
            "args": {"order_id": "ord_1002", "items": ["LAMP-7"], "email": "grace@example.com"}}))
}

#[tokio::test]
async fn a_calls_trace_runs_from_the_api_request_through_the_step_to_the_system_request() {
    let live = live(&[("SAGA_LOG_FORMAT", "json")]).await;
    let harness = TestProcess::start(&live.launch.clone().rust_log(DEFAULT_FILTER)).await;
    let http = reqwest::Client::new();
    let run = new_run(&http, &harness.base, &live.token).await;
    let answer: Value = reship_call(&harness.base, &run, &live.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["outcome"], "confirmed", "{answer}");
    let key = answer["key"].as_str().unwrap();
    // The warehouse's answer, logged inside its three spans.
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let found = harness.log_text().lines().find_map(|line| {
            let line: Value = serde_json::from_str(line).ok()?;
            // The event's own span is `span`; `spans` are its ancestors.
            let names: Vec<&str> = line["spans"]
                .as_array()?
                .iter()
                .chain([&line["span"]])
                .filter_map(|s| s["name"].as_str())
                .collect();
            (names == ["request", "saga.step", "system.request"]).then_some(line)
        });
        if let Some(line) = found {
            break line;
        }
        assert!(
            Instant::now() < deadline,
            "no such line:\n{}",
            harness.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let spans = line["spans"].as_array().unwrap();
    let spans = [&spans[0], &spans[1], &line["span"]];
    assert_eq!(spans[0]["method"], "POST", "{line}");
    assert_eq!(spans[0]["route"], "/api/v1/runs/{run}/calls", "{line}");
    assert_eq!(spans[1]["run_id"], run.as_str(), "{line}");
    assert_eq!(spans[1]["tool"], "reship", "{line}");
    assert_eq!(spans[1]["step"], 0, "{line}");
    assert_eq!(spans[1]["key"], key, "{line}");
    assert_eq!(spans[2]["system"], "warehouse", "{line}");
    assert_eq!(spans[2]["http.status"], 201, "{line}");
}

/// A collector's endpoint: every span posted to `/v1/traces`, decoded.
async fn collector() -> (String, tokio::sync::mpsc::UnboundedReceiver<Vec<Span>>) {
    use prost::Message as _;
    let (sent, received) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sent = sent.clone();
            async move {
                let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                    return axum::http::StatusCode::BAD_REQUEST;
                };
                let spans = request
                    .resource_spans
                    .into_iter()
                    .flat_map(|r| r.scope_spans)
                    .flat_map(|s| s.spans)
                    .collect();
                let _ = sent.send(spans);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (endpoint, received)
}

fn attribute(span: &Span, name: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == name)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Any::StringValue(text) => Some(text.clone()),
        Any::IntValue(n) => Some(n.to_string()),
        other => Some(format!("{other:?}")),
    }
}

#[tokio::test]
async fn with_an_otlp_endpoint_a_calls_spans_reach_the_collector_as_one_trace() {
    let (endpoint, mut received) = collector().await;
    let live = live(&[("SAGA_OTLP_ENDPOINT", &endpoint)]).await;
    let mut harness = TestProcess::start(&live.launch.clone().rust_log(DEFAULT_FILTER)).await;
    let http = reqwest::Client::new();
    let run = new_run(&http, &harness.base, &live.token).await;
    let answer: Value = reship_call(&harness.base, &run, &live.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["outcome"], "confirmed", "{answer}");
    // The queued spans are sent when the process stops.
    let sigterm = std::process::Command::new("kill")
        .args(["-TERM", &harness.pid.to_string()])
        .status()
        .unwrap();
    assert!(sigterm.success());
    let exit = harness.wait_for_exit(Duration::from_secs(30)).await;
    assert!(exit.is_some_and(|s| s.success()), "{}", harness.log_text());
    let mut spans = Vec::new();
    while let Ok(batch) = received.try_recv() {
        spans.extend(batch);
    }
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let system = named("system.request");
    let [system] = system.as_slice() else {
        panic!(
            "one system request: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
    };
    assert_eq!(attribute(system, "system").as_deref(), Some("warehouse"));
    assert_eq!(attribute(system, "http.status").as_deref(), Some("201"));
    let step = spans
        .iter()
        .find(|s| s.span_id == system.parent_span_id)
        .expect("the system request's parent is exported");
    assert_eq!(step.name, "saga.step");
    assert_eq!(attribute(step, "run_id").as_deref(), Some(run.as_str()));
    assert_eq!(attribute(step, "tool").as_deref(), Some("reship"));
    assert_eq!(attribute(step, "key").as_deref(), answer["key"].as_str());
    let request = spans
        .iter()
        .find(|s| s.span_id == step.parent_span_id)
        .expect("the step's parent is exported");
    assert_eq!(request.name, "request");
    assert_eq!(
        attribute(request, "route").as_deref(),
        Some("/api/v1/runs/{run}/calls")
    );
    assert!(request.parent_span_id.is_empty(), "the request is the root");
    assert_eq!(
        (&step.trace_id, &system.trace_id),
        (&request.trace_id, &request.trace_id),
        "one trace"
    );
}

#[tokio::test]
async fn shutdown_takes_no_new_calls_and_lets_the_one_in_flight_finish() {
    let metrics_port = free_port();
    let bind = format!("127.0.0.1:{metrics_port}");
    let live = live(&[("SAGA_METRICS_BIND", &bind)]).await;
    let mut harness = TestProcess::start(&live.launch).await;
    let http = reqwest::Client::new();
    let run = new_run(&http, &harness.base, &live.token).await;
    live.slow_warehouse(1_500);
    let call = tokio::spawn(reship_call(&harness.base, &run, &live.token).send());
    // In flight: the metric says so.
    let metrics = format!("http://{bind}/metrics");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = http
            .get(&metrics)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if Scrape(text).value("saga_calls_in_flight", &[("system", "warehouse")]) == 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the call never showed in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sigterm = std::process::Command::new("kill")
        .args(["-TERM", &harness.pid.to_string()])
        .status()
        .unwrap();
    assert!(sigterm.success());
    // No new connection is taken once shutdown has begun.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let fresh = reqwest::Client::new()
            .get(format!("{}/healthz", harness.base))
            .send()
            .await;
        if fresh.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "still taking new connections");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer: Value = call.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(answer["outcome"], "confirmed", "{answer}");
    let status = harness.wait_for_exit(Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert_eq!(live.shipments(), 1);
}

#[tokio::test]
async fn a_call_cut_off_by_the_shutdown_deadline_is_settled_from_the_log_at_the_next_start() {
    let live = live(&[("SAGA_SHUTDOWN_GRACE_SECS", "1")]).await;
    let mut harness = TestProcess::start(&live.launch).await;
    let http = reqwest::Client::new();
    let run = new_run(&http, &harness.base, &live.token).await;
    live.slow_warehouse(6_000);
    let call = tokio::spawn(reship_call(&harness.base, &run, &live.token).send());
    let deadline = Instant::now() + Duration::from_secs(10);
    while live.shipments() == 0 {
        assert!(
            Instant::now() < deadline,
            "the call never reached the warehouse"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &harness.pid.to_string()])
        .status()
        .unwrap();
    let status = harness.wait_for_exit(Duration::from_secs(15)).await;
    assert!(status.is_some(), "the harness did not stop");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown waited {:?}, past its 1 s grace",
        started.elapsed()
    );
    // The client was cut off without an answer.
    assert!(call.await.unwrap().is_err());
    // The next start reads the log: the step was in flight, so it is
    // looked up, found, and never sent again.
    let harness = TestProcess::start(&live.launch).await;
    let view: Value = http
        .get(format!("{}/api/v1/runs/{run}", harness.base))
        .bearer_auth(&live.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["steps"][0]["status"], "CONFIRMED", "{view}");
    assert_eq!(live.shipments(), 1);
    drop(live.dir);
    let _ = live.url;
}

/// Runs `saga-harness doctor` on `tools` with the simulators' credentials
/// (minus those named in `unset`); its exit status and what it printed.
/// The simulators run on the test's runtime, so the wait must not block it.
async fn doctor(tools: &std::path::Path, url: &str, unset: &[&str]) -> (bool, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_saga-harness"));
    command
        .args(["doctor", "--tools"])
        .arg(tools)
        .args(["--database-url", url]);
    for (name, value) in CREDENTIALS {
        if !unset.contains(name) {
            command.env(name, value);
        } else {
            command.env_remove(name);
        }
    }
    let output = command.output().await.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test]
async fn doctor_says_which_systems_are_down_and_which_credentials_are_missing() {
    let sims = Simulators::start([127, 0, 0, 1].into(), 0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 0);
    let url = format!("sqlite://{}", dir.path().join("saga.db").display());
    provision(&url, AGENT, &[]).await;

    let (healthy, text) = doctor(&tools, &url, &[]).await;
    assert!(healthy, "{text}");
    assert!(text.contains("stripe: reachable"), "{text}");
    assert!(text.contains("its lookup answers"), "{text}");
    assert!(text.contains("smtp: reachable"), "{text}");
    assert!(text.contains("migrations current"), "{text}");
    assert!(text.contains("nothing to fix"), "{text}");

    // Jira and the warehouse go away; Stripe's key is not set.
    let mut file: toml::Table = toml::from_str(&std::fs::read_to_string(&tools).unwrap()).unwrap();
    let connectors = file["connectors"].as_table_mut().unwrap();
    let dead = |port: u16| toml::Value::String(format!("http://127.0.0.1:{port}"));
    connectors["jira"].as_table_mut().unwrap()["base_url"] = dead(free_port());
    connectors["http"].as_table_mut().unwrap()["warehouse"]
        .as_table_mut()
        .unwrap()["base_url"] = dead(free_port());
    std::fs::write(&tools, toml::to_string(&file).unwrap()).unwrap();
    let (healthy, text) = doctor(&tools, &url, &["STRIPE_SECRET_KEY"]).await;
    assert!(!healthy, "{text}");
    let fixes: Vec<&str> = text.lines().filter(|l| l.contains("FIX")).collect();
    assert!(
        fixes.iter().any(|l| l.contains("jira: not reachable")),
        "{text}"
    );
    assert!(
        fixes.iter().any(|l| l.contains("warehouse: not reachable")),
        "{text}"
    );
    assert!(
        fixes
            .iter()
            .any(|l| l.contains("STRIPE_SECRET_KEY is not set")),
        "{text}"
    );
    assert!(
        !fixes.iter().any(|l| l.contains("zendesk")),
        "zendesk is up: {text}"
    );
    assert!(text.contains("3 things to fix"), "{text}");
}

#[tokio::test]
async fn postgres_doctor_reads_the_durability_settings() {
    let db = crate::common::postgres_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools.toml");
    std::fs::write(&tools, TOOLS).unwrap();
    // Opening the store migrates it, as a first start would.
    drop(saga_harness::store::open(&db.url).await.unwrap());
    let (_, text) = doctor(&tools, &db.url, &[]).await;
    assert!(text.contains("fsync = on"), "{text}");
    assert!(text.contains("synchronous_commit = on"), "{text}");
    assert!(text.contains("migrations current"), "{text}");
}

/// A fault test's size knob: `variable` in seconds, else `default`.
fn knob_secs(variable: &str, default: u64) -> Duration {
    Duration::from_secs(common::process::knob(variable, default))
}

/// How long the database stays unreachable in the outage test: longer than
/// the store's wait (2 s) in CI; `SAGA_FAULT_OUTAGE_SECS` asks for more.
fn outage() -> Duration {
    knob_secs("SAGA_FAULT_OUTAGE_SECS", 3)
}

/// The simulators, the shipped tools file pointed at them, an agent token
/// and a harness process whose PostgreSQL is reached through a proxy the
/// test can cut.
struct ProxiedWorld {
    sims: Simulators,
    cut: common::proxy::CutProxy,
    token: String,
    harness: TestProcess,
    _dir: tempfile::TempDir,
    _db: common::TestDb,
}

async fn proxied_world(rust_log: &str) -> Option<ProxiedWorld> {
    let (db, cut) = common::postgres_through_cut_proxy().await?;
    let sims = Simulators::start([127, 0, 0, 1].into(), 0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 0);
    let token = provision(&db.direct_url, AGENT, &[("rita", "approver")]).await;
    let harness = TestProcess::start(&Launch::new(&db.url, Some(&tools)).rust_log(rust_log)).await;
    Some(ProxiedWorld {
        sims,
        cut,
        token,
        harness,
        _dir: dir,
        _db: db,
    })
}

/// The database goes away under a running harness (every connection cut,
/// new ones refused) for longer than the store's wait, then comes back.
/// While it is gone an agent's call is answered promptly with `503
/// store_unavailable` and a `Retry-After`, and nothing is sent; `/readyz`
/// says not ready within a second; each background task logs the outage
/// once, not once a tick. Afterwards the same process carries on: the
/// same request, sent again, makes exactly one shipment.
#[tokio::test]
async fn postgres_an_unreachable_database_is_a_prompt_503_and_the_same_process_recovers() {
    let Some(ProxiedWorld {
        sims,
        cut,
        token,
        harness,
        _dir,
        _db,
    }) = proxied_world("info").await
    else {
        return;
    };
    let agent =
        ApiAgent::with_new_run(&harness.base, &token, "reship while the database restarts").await;
    let reship = |step| agent.reship(step);
    let http = &agent.http;
    let first = reship(0).await.unwrap();
    assert_eq!(first.status(), 200);
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "rita", PASSWORD).await;

    cut.down();
    let went_down = Instant::now();
    let started = Instant::now();
    let refused = reship(1).await.unwrap();
    let took = started.elapsed();
    assert_eq!(refused.status(), 503, "{:?}", refused.text().await);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "store_unavailable", "{body}");
    assert!(took < Duration::from_secs(4), "the 503 took {took:?}");
    let started = Instant::now();
    let ready = http
        .get(format!("{}/readyz", harness.base))
        .send()
        .await
        .unwrap();
    let readiness_took = started.elapsed();
    assert_eq!(ready.status(), 503);
    assert!(
        readiness_took < Duration::from_millis(1500),
        "/readyz took {readiness_took:?}"
    );
    println!(
        "database unreachable: the call's 503 after {took:?}, /readyz after {readiness_took:?}"
    );
    // The dashboard says so in words, and comes back by itself.
    let page = lead
        .http
        .get(format!("{}/", harness.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 503);
    assert!(page.headers().contains_key("retry-after"));
    let text = page.text().await.unwrap();
    assert!(
        text.contains("The harness cannot reach its database") && text.contains("Nothing is lost"),
        "{text}"
    );
    assert_eq!(
        sims.warehouse
            .state
            .faults
            .requests_to("POST", "/v1/shipments"),
        1,
        "a call whose intent could not be written was sent"
    );
    tokio::time::sleep(outage().saturating_sub(went_down.elapsed())).await;

    cut.up();
    let recovered = common::until("the same request to go through", || async {
        let answer = reship(1).await.ok()?;
        (answer.status() == 200).then_some(())?;
        answer.json::<Value>().await.ok()
    })
    .await;
    assert_eq!(recovered["outcome"], "confirmed", "{recovered}");
    assert_eq!(sims.warehouse.ledger().of("shipment.created").len(), 2);
    let runs = lead.page(&harness.base, "/").await;
    assert!(
        runs.contains("reship while the database restarts"),
        "{runs}"
    );
    let log = harness.log_text();
    let said = log
        .matches("expiring approvals past their deadline: the database cannot be reached")
        .count();
    assert_eq!(
        said, 1,
        "the expirer logged the outage {said} times:\n{log}"
    );
    common::report_fault(
        "the database unreachable",
        &format!(
            "every connection to PostgreSQL cut and new ones refused for {:?}, longer than \
             `--store-wait-ms` (tests/process_level/operations.rs)",
            outage()
        ),
        "the call's answer and what the warehouse got; `/readyz`; the dashboard; the log; the \
         same request once the database is back",
        &format!(
            "`503 store_unavailable` with `Retry-After` after {:.1} s, nothing sent; `/readyz` \
             `503` after {} ms; the dashboard's page says the database cannot be reached (`503`); \
             the expirer logged the outage once; the same process then made the one shipment",
            took.as_secs_f64(),
            readiness_took.as_millis()
        ),
        "`SAGA_FAULT_OUTAGE_SECS`",
    );
}

/// A small filesystem of the test's own (tmpfs), unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// `None` where this machine lets no test mount one (not root); under
    /// CI that fails the test instead.
    fn mount(megabytes: u32) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but a tmpfs cannot be mounted: the full-disk test cannot be skipped in CI"
            );
            eprintln!("cannot mount a tmpfs here: skipping");
            return None;
        }
        Some(SmallDisk { dir })
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fills what is left with one file; returns its path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write as _;
        let filler = self.path().join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 64 * 1024];
        while file.write_all(&block).is_ok() {}
        // The last few bytes a block could not take.
        while file.write_all(&[0u8; 512]).is_ok() {}
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// SQLite on a disk that fills up: a call whose intent cannot be written
/// is not made, and the agent hears so in plain words (`503
/// store_unavailable`); what was confirmed before stays; once space is
/// freed the harness carries on by itself.
#[tokio::test]
async fn a_full_disk_refuses_new_intents_plainly_and_the_harness_carries_on_once_freed() {
    let Some(disk) = SmallDisk::mount(16) else {
        return;
    };
    let sims = Simulators::start([127, 0, 0, 1].into(), 0).await.unwrap();
    let tools_dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, tools_dir.path(), 0);
    let url = format!("sqlite://{}", disk.path().join("saga.db").display());
    let token = provision(&url, AGENT, &[]).await;
    let harness = TestProcess::start(&Launch::new(&url, Some(&tools))).await;
    let agent = ApiAgent::with_new_run(&harness.base, &token, "reship on a full disk").await;
    let reship = |step| agent.reship(step);
    let (http, run) = (&agent.http, &agent.run);
    let first: Value = reship(0).await.unwrap().json().await.unwrap();
    assert_eq!(first["outcome"], "confirmed", "{first}");

    let filler = disk.fill();
    let refused = reship(1).await.unwrap();
    assert_eq!(refused.status(), 503, "{:?}", refused.text().await);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "store_unavailable", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("nothing was sent"),
        "{body}"
    );
    assert_eq!(
        sims.warehouse
            .state
            .faults
            .requests_to("POST", "/v1/shipments"),
        1,
        "a call whose intent could not be written was sent"
    );

    std::fs::remove_file(filler).unwrap();
    let recovered: Value = common::until("the call to go through once space is freed", || async {
        let answer = reship(1).await.ok()?;
        (answer.status() == 200).then_some(())?;
        answer.json().await.ok()
    })
    .await;
    assert_eq!(recovered["outcome"], "confirmed", "{recovered}");
    assert_eq!(sims.warehouse.ledger().of("shipment.created").len(), 2);
    // What was confirmed before the disk filled is still there.
    let log: Value = http
        .get(format!("{}/api/v1/runs/{run}", harness.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let steps = log["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{log}");
    assert!(steps.iter().all(|s| s["status"] == "CONFIRMED"), "{log}");
    common::report_fault(
        "a full disk (SQLite)",
        "the database on a 16 MiB tmpfs the test mounts, filled to the last byte, then freed \
         (tests/process_level/operations.rs)",
        "the call's answer; what the warehouse got; the log after freeing",
        "`503 store_unavailable` in plain words, nothing sent; the confirmed step kept; after \
         freeing, the same request went through by itself: 2 steps, 2 shipments",
        "—",
    );
}

/// For how long connections are cut at random in the test below: 5 s in
/// CI; `SAGA_FAULT_CUT_SECS` asks for more (the issue's figure is 30).
fn cutting() -> Duration {
    knob_secs("SAGA_FAULT_CUT_SECS", 5)
}

/// Connections between the harness and PostgreSQL are reset at random
/// points, mid-statement included, while eight agents each make four
/// calls, re-sending a step on any answer that is not final (as agents
/// should). Every step ends confirmed, and the warehouse holds exactly one
/// shipment per step: nothing lost, nothing doubled.
#[tokio::test]
async fn postgres_connections_cut_at_random_lose_and_double_nothing() {
    let Some(ProxiedWorld {
        sims,
        cut,
        token,
        harness,
        _dir,
        _db,
    }) = proxied_world("warn").await
    else {
        return;
    };
    let (agents, calls) = (8usize, 4i64);
    let window = cutting();
    let stop_cutting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cutter = tokio::spawn({
        let stop = stop_cutting.clone();
        async move {
            let (started, mut cuts, mut pick) = (Instant::now(), 0usize, 7usize);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && started.elapsed() < window {
                tokio::time::sleep(Duration::from_millis(40)).await;
                // A fixed sequence, so a failure replays the same cuts.
                pick = pick.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                if cut.cut_one(pick >> 4) {
                    cuts += 1;
                }
            }
            (cut, cuts)
        }
    });
    // Crowds one after another, so calls are in flight for the whole
    // window of cuts.
    let started = Instant::now();
    let mut tally = common::process::Tally::default();
    let mut rounds = 0;
    while rounds == 0 || started.elapsed() < window {
        rounds += 1;
        tally.add(
            common::process::crowd(
                &harness.base,
                &token,
                agents,
                calls,
                Duration::from_secs(300),
            )
            .await,
        );
    }
    stop_cutting.store(true, std::sync::atomic::Ordering::SeqCst);
    let steps = rounds * agents * calls as usize;
    let (_cut, cuts) = cutter.await.unwrap();
    let shipments = sims.warehouse.ledger().of("shipment.created");
    println!(
        "{cuts} connections cut over {window:?}; answers {:?}; {} shipments",
        tally.statuses,
        shipments.len()
    );
    assert_eq!(tally.confirmed.len(), steps);
    assert_eq!(shipments.len(), steps, "{shipments:?}");
    let mut keys: Vec<_> = shipments.iter().map(|s| s.key.clone()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), steps, "a step made two shipments");
    assert!(
        tally.unexpected().is_empty(),
        "answers other than 200, 409 and 503: {:?}",
        tally.unexpected()
    );
    common::report_fault(
        "connections cut mid-statement",
        &format!(
            "a proxy between the harness and PostgreSQL resets a random connection every 40 ms \
             for {window:?} while crowds of {agents} agents make {calls} calls each, one crowd \
             after another, re-sending any step whose answer is not final (tests/process_level/operations.rs)"
        ),
        "every answer's status; the warehouse's ledger",
        &format!(
            "{cuts} connections cut; {} of {} steps confirmed, {} shipments, each under its own \
             key: 0 lost, 0 doubled; {} answers `503` and {} `409` (send again), none `500`",
            tally.confirmed.len(),
            steps,
            shipments.len(),
            tally.count(503),
            tally.count(409)
        ),
        "`SAGA_FAULT_CUT_SECS`",
    );
}

/// How many agents the load-bearing fault tests run at once: 8 in CI;
/// `SAGA_FAULT_AGENTS` asks for more (the issue's trial had 50).
fn crowd_size() -> usize {
    common::process::knob("SAGA_FAULT_AGENTS", 8) as usize
}

/// Calls each agent of the crowd makes.
const CROWD_CALLS: i64 = 4;

/// How long PostgreSQL stays stopped in the immediate-stop test: longer
/// than every wait and timeout the harness has (the store's 2 s, a
/// request's 10 s, a run's 10 s wait); `SAGA_FAULT_LONG_OUTAGE_SECS`
/// changes it.
fn long_outage() -> Duration {
    knob_secs("SAGA_FAULT_LONG_OUTAGE_SECS", 12)
}

/// The simulators with a warehouse that answers each shipment after
/// 200 ms (a real system's latency), the tools file, an agent token, and a
/// harness process reaching its database at `url`.
struct LoadedWorld {
    sims: Simulators,
    token: String,
    harness: TestProcess,
    _dir: tempfile::TempDir,
}

async fn loaded_world(url: &str, direct_url: &str, pooler: bool) -> LoadedWorld {
    let sims = Simulators::start([127, 0, 0, 1].into(), 0).await.unwrap();
    sims.warehouse.state.faults.inject(
        FaultRule::new("POST", "/v1/shipments", SimFault::Delay { ms: 200 }).times(u32::MAX),
    );
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 0);
    let token = provision(direct_url, AGENT, &[]).await;
    let mut launch = Launch::new(url, Some(&tools)).rust_log("info,sqlx=warn");
    if pooler {
        launch = launch.env("SAGA_PG_TRANSACTION_POOLER", "true");
    }
    let harness = TestProcess::start(&launch).await;
    LoadedWorld {
        sims,
        token,
        harness,
        _dir: dir,
    }
}

impl LoadedWorld {
    /// The crowd, started: it runs until every step is confirmed.
    fn crowd(&self) -> tokio::task::JoinHandle<common::process::Tally> {
        let (base, token) = (self.harness.base.clone(), self.token.clone());
        tokio::spawn(async move {
            common::process::crowd(
                &base,
                &token,
                crowd_size(),
                CROWD_CALLS,
                Duration::from_secs(300),
            )
            .await
        })
    }

    /// Waits until the crowd is mid-run: `n` shipments made.
    async fn until_shipments(&self, n: usize) {
        common::until("the crowd to be under way", || async {
            (self.sims.warehouse.ledger().of("shipment.created").len() >= n).then_some(())
        })
        .await;
    }

    /// `/readyz`'s status and how long it took.
    async fn readiness(&self) -> (u16, Duration) {
        let started = Instant::now();
        let status = reqwest::get(format!("{}/readyz", self.harness.base))
            .await
            .unwrap()
            .status()
            .as_u16();
        (status, started.elapsed())
    }

    /// After the crowd: exactly one shipment for each step, under the
    /// step's own key, and every step of every run confirmed in the log
    /// with the reference its agent was told. Returns the shipments.
    async fn one_effect_per_step(&self, tally: &common::process::Tally) -> usize {
        let steps = crowd_size() * CROWD_CALLS as usize;
        assert_eq!(tally.confirmed.len(), steps, "{tally:?}");
        let shipments = self.sims.warehouse.ledger().of("shipment.created");
        let mut keys: Vec<_> = shipments.iter().map(|s| s.key.clone()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), shipments.len(), "a step made two shipments");
        assert_eq!(shipments.len(), steps, "{shipments:?}");
        let http = reqwest::Client::new();
        let mut runs: Vec<&String> = tally.confirmed.iter().map(|(run, _, _)| run).collect();
        runs.sort();
        runs.dedup();
        for run in runs {
            let log: Value = http
                .get(format!("{}/api/v1/runs/{run}", self.harness.base))
                .bearer_auth(&self.token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let steps = log["steps"].as_array().unwrap();
            assert_eq!(steps.len(), CROWD_CALLS as usize, "{log}");
            for (told_run, step, reference) in tally.confirmed.iter().filter(|c| &c.0 == run) {
                let kept = &steps[*step as usize];
                assert_eq!(kept["status"], "CONFIRMED", "{told_run} {step}: {log}");
                assert_eq!(kept["external_ref"], reference.as_str(), "{log}");
            }
        }
        shipments.len()
    }
}

/// What the crowd met, in the README's words.
fn crowd_result(tally: &common::process::Tally, shipments: usize, back: Instant) -> String {
    let recovered = match tally.last_refusal {
        Some(last) if last > back => format!(
            "the last `503` came {:.1} s after the database was back",
            last.duration_since(back).as_secs_f64()
        ),
        _ => "no `503` once the database was back".to_owned(),
    };
    format!(
        "{} of {} steps confirmed, {shipments} shipments: 0 lost, 0 doubled; {} answers were \
         `503` (the slowest after {:.1} s) and {} `409` (send again), none `500`; {recovered}",
        tally.confirmed.len(),
        crowd_size() * CROWD_CALLS as usize,
        tally.count(503),
        tally.slowest_refusal.as_secs_f64(),
        tally.count(409),
    )
}

/// What every fault test under load asserts of the agents' answers: each
/// was a `200` or a prompt `503`, never a `500` or a hang.
fn answers_were_200_or_prompt_503(tally: &common::process::Tally) {
    assert!(
        tally.unexpected().is_empty(),
        "answers other than 200, 409 and 503: {:?}",
        tally.unexpected()
    );
    assert_eq!(tally.no_answer, 0, "requests without an answer: {tally:?}");
    // A call whose request was out when the database went: one wait for
    // its outcome's write, one for the write sent again on a fresh
    // connection (2 s each by default).
    assert!(
        tally.slowest_refusal < Duration::from_millis(5_000),
        "a 503 took {:?}",
        tally.slowest_refusal
    );
}

/// PostgreSQL stopped in immediate mode (as a crash would: no checkpoint,
/// every connection dropped) under a crowd of agents, for longer than any
/// timeout the harness has, then started again. The agents hear `503`
/// promptly the whole time, `/readyz` says not ready within a second, and
/// afterwards the same process finishes every run: no confirmed step
/// lost, none doubled, counted on the warehouse's ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_in_immediate_mode_under_load_loses_and_doubles_nothing() {
    let Some(server) = common::cluster::Server::primary() else {
        return;
    };
    let world = loaded_world(&server.url(), &server.url(), false).await;
    let crowd = world.crowd();
    world.until_shipments(crowd_size()).await;
    tokio::task::block_in_place(|| server.stop_immediately());
    let stopped = Instant::now();
    let (ready, readiness_took) = world.readiness().await;
    assert_eq!(ready, 503);
    assert!(
        readiness_took < Duration::from_millis(1500),
        "{readiness_took:?}"
    );
    tokio::time::sleep(long_outage().saturating_sub(stopped.elapsed())).await;
    tokio::task::block_in_place(|| server.start());
    let back = Instant::now();
    let tally = crowd.await.unwrap();
    answers_were_200_or_prompt_503(&tally);
    assert!(tally.count(503) > 0, "nobody called during the outage");
    let shipments = world.one_effect_per_step(&tally).await;
    let (ready, _) = world.readiness().await;
    assert_eq!(ready, 200);
    common::report_fault(
        "PostgreSQL stopped in immediate mode",
        &format!(
            "`pg_ctl stop -m immediate` on a server of the test's own while {} agents make {} \
             calls each to a warehouse that answers in 200 ms; started again {:?} later, longer \
             than every wait and timeout (tests/process_level/operations.rs)",
            crowd_size(),
            CROWD_CALLS,
            long_outage()
        ),
        "every answer's status and time; `/readyz`; the warehouse's ledger; each run's log \
         against what its agent was told",
        &format!(
            "{}; `/readyz` `503` after {} ms; the same process, not restarted",
            crowd_result(&tally, shipments, back),
            readiness_took.as_millis()
        ),
        "`SAGA_FAULT_AGENTS`, `SAGA_FAULT_LONG_OUTAGE_SECS`",
    );
}

/// A transaction-pooling PgBouncer between the harness and PostgreSQL is
/// killed (SIGKILL) under a crowd of agents and started again on the same
/// port: the same promises as PostgreSQL going away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_killed_and_restarted_under_load_loses_and_doubles_nothing() {
    let Some(mut db) = common::postgres_via_pgbouncer().await else {
        return;
    };
    let world = loaded_world(&db.url, &db.direct_url, true).await;
    let crowd = world.crowd();
    world.until_shipments(crowd_size()).await;
    let bouncer = db.bouncer_mut();
    bouncer.kill();
    let killed = Instant::now();
    let (ready, readiness_took) = world.readiness().await;
    assert_eq!(ready, 503);
    tokio::time::sleep(outage().saturating_sub(killed.elapsed())).await;
    db.bouncer_mut().restart();
    let back = Instant::now();
    let tally = crowd.await.unwrap();
    answers_were_200_or_prompt_503(&tally);
    assert!(tally.count(503) > 0, "nobody called during the outage");
    let shipments = world.one_effect_per_step(&tally).await;
    common::report_fault(
        "PgBouncer killed and restarted",
        &format!(
            "SIGKILL to a transaction-pooling PgBouncer while {} agents make {} calls each; \
             started again on the same port {:?} later (tests/process_level/operations.rs)",
            crowd_size(),
            CROWD_CALLS,
            outage()
        ),
        "every answer's status and time; `/readyz`; the warehouse's ledger; each run's log",
        &format!(
            "{}; `/readyz` `503` after {} ms",
            crowd_result(&tally, shipments, back),
            readiness_took.as_millis()
        ),
        "`SAGA_FAULT_AGENTS`, `SAGA_FAULT_OUTAGE_SECS`",
    );
}

/// A primary with a synchronous streaming standby, the harness reaching it
/// through PgBouncer. Under a crowd of agents the primary is stopped in
/// immediate mode, the standby promoted and PgBouncer pointed at it (a
/// reload, no restart of anything else): every step an agent was told is
/// confirmed is still confirmed on the new primary, with the same
/// reference, and no step makes a second shipment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_promoted_under_load_loses_and_doubles_nothing() {
    let Some(primary) = common::cluster::Server::primary() else {
        return;
    };
    let standby = tokio::task::block_in_place(|| primary.synchronous_standby());
    let upstream = |server: &common::cluster::Server| common::cluster::Upstream {
        host: "127.0.0.1".into(),
        port: server.port,
        user: "postgres".into(),
        password: String::new(),
    };
    let Some(mut bouncer) = common::cluster::Bouncer::start(&upstream(&primary)).await else {
        return;
    };
    let url = format!("postgres://postgres@127.0.0.1:{}/saga", bouncer.port);
    let world = loaded_world(&url, &primary.url(), true).await;
    let crowd = world.crowd();
    world.until_shipments(crowd_size()).await;
    let failover = Instant::now();
    tokio::task::block_in_place(|| {
        primary.stop_immediately();
        standby.promote();
    });
    bouncer.point_at(&upstream(&standby));
    let back = Instant::now();
    let tally = crowd.await.unwrap();
    answers_were_200_or_prompt_503(&tally);
    let shipments = world.one_effect_per_step(&tally).await;
    common::report_fault(
        "a synchronous standby takes over",
        &format!(
            "a primary with a synchronous streaming standby, reached through PgBouncer; while {} \
             agents make {} calls each, the primary is stopped in immediate mode, the standby \
             promoted and PgBouncer reloaded to point at it, {:.1} s in all (tests/process_level/operations.rs)",
            crowd_size(),
            CROWD_CALLS,
            back.duration_since(failover).as_secs_f64()
        ),
        "the warehouse's ledger; each run's log on the new primary against what its agent was \
         told; every answer's status",
        &crowd_result(&tally, shipments, back),
        "`SAGA_FAULT_AGENTS`",
    );
}
