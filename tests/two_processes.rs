//! Two harness processes share one PostgreSQL and race for the same step of
//! the same run over HTTP (§5, §8): the real system sees one effect, and
//! both agents read the same outcome.

mod common;

use saga_harness::sim::bundle::{Simulators, CREDENTIALS};
use serde_json::{json, Value};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Harness {
    child: Child,
    base: String,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn spawn_harness(database_url: &str, tools: &std::path::Path) -> Harness {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_saga-harness"));
    command
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .arg("--tools")
        .arg(tools)
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (name, value) in CREDENTIALS {
        command.env(name, value);
    }
    let child = command.spawn().expect("the harness binary starts");
    let harness = Harness {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(response) = http.get(format!("{}/healthz", harness.base)).send().await {
            if response.status().is_success() {
                return harness;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the harness on port {port} did not become healthy");
}

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

#[tokio::test]
async fn postgres_two_processes_racing_one_step_make_one_effect_and_agree() {
    let Some(db) = common::postgres().await else {
        eprintln!("SAGA_TEST_POSTGRES_URL is not set: skipping the two-process race");
        return;
    };
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    // The warehouse answers slowly, so both requests are in flight at once.
    sims.warehouse.state.faults.inject(
        saga_harness::sim::FaultRule::new(
            "POST",
            "/v1/shipments",
            saga_harness::sim::Fault::Delay { ms: 300 },
        )
        .times(10),
    );
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools.toml");
    let shipped = std::fs::read_to_string("tools/support.toml").unwrap();
    std::fs::write(&tools, sims.point(&shipped).unwrap()).unwrap();

    let first = spawn_harness(&db.url, &tools).await;
    let second = spawn_harness(&db.url, &tools).await;
    let store = saga_harness::store::open(&db.url)
        .await
        .unwrap()
        .saga_store();
    let token = saga_harness::auth::new_api_token();
    store
        .add_api_token("support-bot", &saga_harness::auth::token_hash(&token), None)
        .await
        .unwrap();

    let http = reqwest::Client::new();
    let rounds = 5;
    for round in 0..rounds {
        let (status, created) = post(
            &http,
            format!("{}/api/v1/runs", first.base),
            &token,
            json!({"purpose": format!("race {round}")}),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        let run = created["run"]["id"].as_str().unwrap().to_owned();
        let body = json!({"tool": "reship", "step": 0,
            "args": {"order_id": "ord_1002", "items": ["LAMP-7"], "email": "grace@example.com"}});
        let (a, b) = tokio::join!(
            post(
                &http,
                format!("{}/api/v1/runs/{run}/calls", first.base),
                &token,
                body.clone()
            ),
            post(
                &http,
                format!("{}/api/v1/runs/{run}/calls", second.base),
                &token,
                body.clone()
            ),
        );
        for (status, out) in [&a, &b] {
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
    // Not one request more: the second process never sent the step again,
    // it read the first one's outcome.
    assert_eq!(
        sims.warehouse
            .state
            .faults
            .requests_to("POST", "/v1/shipments"),
        rounds
    );
}
