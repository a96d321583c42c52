//! The agent API over real HTTP on port 0, with the model world behind the
//! connectors: outcomes are 200s, refusals carry their codes, bad input and
//! bad tokens say what is wrong.

use crate::common;

use common::app::{Spawn, TestApp};
use common::world::{Fault, World, TOOLS};
use reqwest::StatusCode;
use saga_harness::auth::token_hash;
use saga_harness::connectors::ConnectorSet;
use serde_json::{json, Value};
use std::sync::Arc;

struct Api {
    base: String,
    token: String,
    other_token: String,
    world: Arc<World>,
    store: Arc<dyn saga_harness::saga::store::SagaStore>,
    http: reqwest::Client,
    _app: TestApp,
    _db: common::TestDb,
    _tools: tempfile::TempDir,
}

async fn start(db: common::TestDb) -> Api {
    let tools = tempfile::tempdir().unwrap();
    let path = tools.path().join("tools.toml");
    std::fs::write(&path, TOOLS).unwrap();
    let world = Arc::new(World::new());
    let connectors = ConnectorSet::new().serve(common::world::OPERATIONS, world.clone());
    let app = Spawn::on(&db)
        .tools(path)
        .connectors(connectors)
        .start()
        .await;
    let token = saga_harness::auth::new_api_token();
    let other_token = saga_harness::auth::new_api_token();
    let store = app.state().store.clone();
    store
        .add_api_token("support-bot", &token_hash(&token), None)
        .await
        .unwrap();
    store
        .add_api_token("billing-bot", &token_hash(&other_token), None)
        .await
        .unwrap();
    let base = app.api();
    Api {
        base,
        token,
        other_token,
        world,
        store,
        http: reqwest::Client::new(),
        _app: app,
        _db: db,
        _tools: tools,
    }
}

impl Api {
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(
            self.http.post(format!("{}{path}", self.base)).json(&body),
            &self.token,
        )
        .await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.http.get(format!("{}{path}", self.base)), &self.token)
            .await
    }

    async fn send(&self, request: reqwest::RequestBuilder, token: &str) -> (StatusCode, Value) {
        let response = request.bearer_auth(token).send().await.unwrap();
        let status = response.status();
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        (status, body)
    }

    async fn new_run(&self) -> String {
        let (status, body) = self
            .post("/runs", json!({"purpose": "refund a double charge"}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["run"]["id"].as_str().unwrap().to_owned()
    }

    /// The OpenAPI document, as served (without a token).
    async fn openapi(&self) -> reqwest::Response {
        let root = self.base.trim_end_matches("/api/v1");
        self.http
            .get(format!("{root}{}", saga_harness::api::OPENAPI_PATH))
            .send()
            .await
            .unwrap()
    }

    /// Proposes the pivot that captures a $500 payment.
    async fn propose_capture(&self, run: &str) -> (StatusCode, Value) {
        self.post(
            &format!("/runs/{run}/pivot"),
            json!({"summary": "capture the payment", "commit": [{"tool": "charge_card", "args": {"amount": 500}}]}),
        )
        .await
    }
}

#[tokio::test]
async fn a_missing_or_wrong_token_is_401_with_a_hint() {
    let api = start(common::sqlite()).await;
    let response = api
        .http
        .get(format!("{}/tools", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "unauthorized");
    assert!(body["message"].as_str().unwrap().contains("Bearer"));
    let (status, body) = api
        .send(
            api.http.get(format!("{}/tools", api.base)),
            "sh_not-a-token",
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body["message"].as_str().unwrap().contains("token create"));
}

#[tokio::test]
async fn runs_are_created_once_per_label() {
    let api = start(common::sqlite()).await;
    let (first, a) = api
        .post(
            "/runs",
            json!({"label": "ticket-4512", "purpose": "refund"}),
        )
        .await;
    let (again, b) = api
        .post(
            "/runs",
            json!({"label": "ticket-4512", "purpose": "refund"}),
        )
        .await;
    assert_eq!((first, again), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(a["run"]["id"], b["run"]["id"]);
    assert_eq!(a["next_step"], 0);
}

async fn an_unknown_outcome_is_resolved_by_resending_the_step(api: Api) {
    let run = api.new_run().await;
    api.world.fail_next("tickets.create", Fault::EffectThen504);
    let (status, first) = api
        .post(
            &format!("/runs/{run}/calls"),
            json!({"tool": "create_ticket", "args": {"summary": "charged twice"}, "step": 0}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a tool outcome is not an HTTP error"
    );
    assert_eq!(first["outcome"], "unknown");
    assert!(first["message"]
        .as_str()
        .unwrap()
        .contains("Do not retry with new arguments"));
    let (_, again) = api
        .post(
            &format!("/runs/{run}/calls"),
            json!({"tool": "create_ticket", "args": {"summary": "double charge!!"}, "step": 0}),
        )
        .await;
    assert_eq!(again["outcome"], "confirmed");
    assert_eq!(again["key"], first["key"]);
    assert_eq!(again["next_step"], 1);
    assert_eq!(api.world.effects("tickets.create").len(), 1);
    let (status, view) = api.get(&format!("/runs/{run}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["next_step"], 1);
    assert_eq!(view["steps"][0]["status"], "CONFIRMED");
    assert_eq!(view["steps"][0]["args"]["summary"], "charged twice");
}

#[tokio::test]
async fn sqlite_an_unknown_outcome_is_resolved_by_resending_the_step() {
    an_unknown_outcome_is_resolved_by_resending_the_step(start(common::sqlite()).await).await;
}

#[tokio::test]
async fn postgres_an_unknown_outcome_is_resolved_by_resending_the_step() {
    let db = crate::common::postgres_or_skip!();
    an_unknown_outcome_is_resolved_by_resending_the_step(start(db).await).await;
}

/// A token this instance has found valid is not looked up again for a
/// call on the hot path: the step's intent checks it in its own statement.
/// Revoked by another process (here in the store, not through this
/// server), it is refused at the very next call, which writes nothing and
/// reaches no system; so is every call that takes another path: a re-sent
/// step, a step out of order, another agent's run.
async fn a_revoked_token_is_refused_at_its_next_call(api: Api) {
    let run = api.new_run().await;
    let calls = format!("/runs/{run}/calls");
    let call = |step: i64| json!({"tool": "create_ticket", "args": {"summary": format!("ticket {step}")}, "step": step});
    for step in 0..2 {
        let (status, answer) = api.post(&calls, call(step)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["outcome"], "confirmed");
    }
    let (status, theirs) = api
        .send(
            api.http
                .post(format!("{}/runs", api.base))
                .json(&json!({"purpose": "billing"})),
            &api.other_token,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let theirs = theirs["run"]["id"].as_str().unwrap().to_owned();

    assert_eq!(api.store.revoke_tokens("support-bot").await.unwrap(), 1);
    let refused = [
        ("a new step", calls.clone(), call(2)),
        ("a re-sent step", calls.clone(), call(1)),
        ("a step out of order", calls.clone(), call(7)),
        (
            "another agent's run",
            format!("/runs/{theirs}/calls"),
            call(0),
        ),
        ("a negative step", calls.clone(), call(-1)),
        (
            "an unknown field",
            calls.clone(),
            json!({"tool": "create_ticket", "stepp": 2}),
        ),
        (
            "a run id that is not one",
            "/runs/not-a-run/calls".to_owned(),
            call(2),
        ),
    ];
    for (what, path, body) in refused {
        let (status, answer) = api.post(&path, body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {answer}");
        assert_eq!(answer["code"], "unauthorized", "{what}");
        assert!(
            answer["message"].as_str().unwrap().contains("token create"),
            "{what}: {answer}"
        );
    }
    assert_eq!(api.world.effects("tickets.create").len(), 2);
    let id = run.parse().unwrap();
    assert_eq!(api.store.run(id).await.unwrap().unwrap().next_step, 2);
    assert_eq!(api.store.steps(id).await.unwrap().len(), 2);
    let id = theirs.parse().unwrap();
    assert!(api.store.steps(id).await.unwrap().is_empty());
}

#[tokio::test]
async fn sqlite_a_revoked_token_is_refused_at_its_next_call() {
    a_revoked_token_is_refused_at_its_next_call(start(common::sqlite()).await).await;
}

#[tokio::test]
async fn postgres_a_revoked_token_is_refused_at_its_next_call() {
    let db = crate::common::postgres_or_skip!();
    a_revoked_token_is_refused_at_its_next_call(start(db).await).await;
}

#[tokio::test]
async fn refusals_carry_their_codes() {
    let api = start(common::sqlite()).await;
    let run = api.new_run().await;
    let calls = format!("/runs/{run}/calls");
    let cases = [
        (
            json!({"tool": "create_ticket", "args": {}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "step_required",
        ),
        (
            json!({"tool": "create_ticket", "args": {}, "step": 4}),
            StatusCode::CONFLICT,
            "step_out_of_order",
        ),
        (
            json!({"tool": "teleport", "args": {}, "step": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_tool",
        ),
        (
            json!({"tool": "announce", "args": {"to": ["a@example.com"]}, "step": 0}),
            StatusCode::FORBIDDEN,
            "gated_tool",
        ),
    ];
    for (body, status, code) in cases {
        let (got, answer) = api.post(&calls, body.clone()).await;
        assert_eq!(
            (got, answer["code"].as_str()),
            (status, Some(code)),
            "{body} → {answer}"
        );
    }
    api.post(
        &calls,
        json!({"tool": "create_ticket", "args": {}, "step": 0}),
    )
    .await;
    let (status, answer) = api
        .post(
            &calls,
            json!({"tool": "charge_card", "args": {"amount": 1}, "step": 0}),
        )
        .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("step_mismatch"))
    );
    // Another agent's run does not exist for it.
    let (status, answer) = api
        .send(
            api.http.get(format!("{}/runs/{run}", api.base)),
            &api.other_token,
        )
        .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("run_not_found"))
    );
    let (status, answer) = api.get("/runs/not-a-uuid").await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_run_id"))
    );
    assert_eq!(
        api.world.effects("tickets.create").len(),
        1,
        "refused calls did nothing"
    );
}

#[tokio::test]
async fn bad_input_says_what_is_wrong() {
    let api = start(common::sqlite()).await;
    let run = api.new_run().await;
    let url = format!("{}/runs/{run}/calls", api.base);
    let send_raw = |body: &'static str, content_type: &'static str| {
        api.http
            .post(url.clone())
            .header("content-type", content_type)
            .bearer_auth(&api.token)
            .body(body)
            .send()
    };
    let malformed = send_raw("{\"tool\": ", "application/json").await.unwrap();
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        malformed.json::<Value>().await.unwrap()["code"],
        "malformed_json"
    );
    let wrong_type = send_raw("{\"tool\": 7, \"step\": 0}", "application/json")
        .await
        .unwrap();
    assert_eq!(wrong_type.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body = wrong_type.json::<Value>().await.unwrap();
    assert_eq!(body["code"], "invalid_body");
    assert!(body["message"].as_str().unwrap().contains("tool"), "{body}");
    let unknown_field = send_raw(
        "{\"tool\": \"create_ticket\", \"stpe\": 0}",
        "application/json",
    )
    .await
    .unwrap();
    assert!(unknown_field.json::<Value>().await.unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("stpe"));
    let not_json = send_raw("tool=create_ticket", "text/plain").await.unwrap();
    assert_eq!(not_json.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        not_json.json::<Value>().await.unwrap()["code"],
        "expected_json"
    );
    let huge = format!(
        "{{\"tool\": \"create_ticket\", \"step\": 0, \"args\": {{\"summary\": \"{}\"}}}}",
        "x".repeat(300 * 1024)
    );
    let too_large = api
        .http
        .post(url.clone())
        .header("content-type", "application/json")
        .bearer_auth(&api.token)
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        too_large.json::<Value>().await.unwrap()["code"],
        "body_too_large"
    );
    let (_, view) = api.get(&format!("/runs/{run}")).await;
    assert_eq!(view["next_step"], 0, "nothing half-written");
}

#[tokio::test]
async fn pivot_unwind_and_complete_over_http() {
    let api = start(common::sqlite()).await;
    let run = api.new_run().await;
    api.post(
        &format!("/runs/{run}/calls"),
        json!({"tool": "authorize_card", "args": {"amount": 500}, "step": 0}),
    )
    .await;
    let (status, answer) = api.post(&format!("/runs/{run}/complete"), json!({})).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("run_has_open_effects"))
    );
    let (status, pivot) = api.propose_capture(&run).await;
    assert_eq!(status, StatusCode::OK, "{pivot}");
    assert_eq!(pivot["outcome"], "awaiting_approval");
    assert!(
        pivot["expires_at"].is_string(),
        "an authorisation sets a deadline: {pivot}"
    );
    let (status, answer) = api
        .post(
            &format!("/runs/{run}/calls"),
            json!({"tool": "create_ticket", "args": {}, "step": 1}),
        )
        .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("run_awaiting_approval"))
    );
    let (status, answer) = api
        .post(
            &format!("/runs/{run}/unwind"),
            json!({"reason": "changed my mind"}),
        )
        .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::CONFLICT, Some("run_awaiting_approval"))
    );

    let other = api.new_run().await;
    api.post(
        &format!("/runs/{other}/calls"),
        json!({"tool": "authorize_card", "args": {"amount": 9}, "step": 0}),
    )
    .await;
    let (status, answer) = api
        .post(&format!("/runs/{other}/unwind"), json!({"reason": ""}))
        .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_body"))
    );
    let (status, unwound) = api
        .post(
            &format!("/runs/{other}/unwind"),
            json!({"reason": "wrong customer"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{unwound}");
    assert_eq!(unwound["status"], "UNWOUND");
    assert_eq!(api.world.effects("payments.cancel").len(), 1);
}

#[tokio::test]
async fn the_event_stream_follows_the_run_and_resumes_after_last_event_id() {
    let api = start(common::sqlite()).await;
    let run = api.new_run().await;
    let mut stream = api
        .http
        .get(format!("{}/runs/{run}/events", api.base))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    api.post(
        &format!("/runs/{run}/calls"),
        json!({"tool": "create_ticket", "args": {}, "step": 0}),
    )
    .await;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !seen.contains("CONFIRMED") {
        let chunk = tokio::time::timeout_at(deadline, stream.chunk())
            .await
            .expect("events arrive")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: run"), "{seen}");
    assert!(seen.contains("\"to_status\":\"INTENDED\""), "{seen}");
    // Reconnecting after the last id seen sends only what came later.
    let last_id: i64 = seen
        .lines()
        .filter_map(|l| l.strip_prefix("id:"))
        .filter_map(|v| v.trim().parse().ok())
        .max()
        .unwrap();
    api.post(&format!("/runs/{run}/unwind"), json!({"reason": "done"}))
        .await;
    let mut again = api
        .http
        .get(format!("{}/runs/{run}/events", api.base))
        .bearer_auth(&api.token)
        .header("last-event-id", last_id.to_string())
        .send()
        .await
        .unwrap();
    let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), again.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&chunk);
    let ids: Vec<i64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id:"))
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    assert!(!ids.is_empty(), "no event after reconnecting: {text}");
    assert!(
        ids.iter().all(|id| *id > last_id),
        "old events repeated: {ids:?} after {last_id}"
    );
    let (status, _) = api
        .send(
            api.http.get(format!("{}/runs/{run}/events", api.base)),
            &api.other_token,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_tools_registry_is_listed() {
    let api = start(common::sqlite()).await;
    let (status, body) = api.get("/tools").await;
    assert_eq!(status, StatusCode::OK);
    let tools = body["tools"].as_array().unwrap();
    let announce = tools.iter().find(|t| t["name"] == "announce").unwrap();
    assert_eq!(announce["class"], "irreversible");
    assert_eq!(announce["gated"], true);
    let lookup = tools.iter().find(|t| t["name"] == "crm.lookup").unwrap();
    assert_eq!(lookup["needs_step"], false);
}

#[tokio::test]
async fn start_up_refuses_tools_no_connector_can_perform() {
    let tools = tempfile::tempdir().unwrap();
    let path = tools.path().join("tools.toml");
    std::fs::write(&path, TOOLS).unwrap();
    let db = common::sqlite();
    let Err(err) = Spawn::on(&db).tools(path).build().await else {
        panic!("started with tools nothing can perform");
    };
    let message = err.to_string();
    assert!(
        message.contains("tool `create_ticket`: no connector serves operation `tickets.create`"),
        "{message}"
    );
}

/// Every route the API serves, as (method, path): the OpenAPI document must
/// name exactly these, and the router must answer each.
const ROUTES: &[(&str, &str)] = &[
    ("post", "/api/v1/runs"),
    ("get", "/api/v1/runs/{run}"),
    ("post", "/api/v1/runs/{run}/calls"),
    ("post", "/api/v1/runs/{run}/pivot"),
    ("post", "/api/v1/runs/{run}/unwind"),
    ("post", "/api/v1/runs/{run}/complete"),
    ("get", "/api/v1/runs/{run}/events"),
    ("get", "/api/v1/tools"),
];

#[tokio::test]
async fn the_openapi_document_is_valid_openapi_3_and_covers_every_route() {
    let api = start(common::sqlite()).await;
    let root = api.base.trim_end_matches("/api/v1");
    let response = api.openapi().await;
    assert_eq!(response.status(), StatusCode::OK, "served without a token");
    let doc: Value = response.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));

    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                documented.push((method.clone(), path.clone()));
            }
        }
    }
    documented.sort();
    let mut expected: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    expected.sort();
    assert_eq!(documented, expected);

    // The router serves each documented route: a route it lacks would be
    // axum's bare 404 or 405, never an answer in the API's error shape.
    let run = api.new_run().await;
    for (method, path) in ROUTES {
        if path.ends_with("/events") {
            continue; // a stream; answered in its own test
        }
        let url = format!("{root}{}", path.replace("{run}", &run));
        let request = match *method {
            "get" => api.http.get(url),
            _ => api.http.post(url).json(&json!({})),
        };
        let response = request.bearer_auth(&api.token).send().await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(
            status != StatusCode::METHOD_NOT_ALLOWED
                && (status != StatusCode::NOT_FOUND || body["code"].is_string()),
            "{method} {path}: {status} {body}"
        );
    }

    // The document validates as OpenAPI 3 with an independent validator.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let validated = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .expect("python3 runs");
    assert!(
        validated.status.success(),
        "openapi-spec-validator refused the document (install it with `pip install openapi-spec-validator`):\n{}{}",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );
}

/// The names of an object's fields, sorted.
fn keys_of(object: &Value) -> Vec<String> {
    let mut keys: Vec<String> = object.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

/// The schemas of the saga's types live beside the API, apart from the
/// types themselves: what the document names must be what the API sends,
/// field for field, and every status it can send must be in its list.
#[tokio::test]
async fn the_documented_schemas_name_every_field_the_api_sends() {
    let api = start(common::sqlite()).await;
    let doc: Value = api.openapi().await.json().await.unwrap();
    let schemas = &doc["components"]["schemas"];
    let documented = |name: &str| keys_of(&schemas[name]["properties"]);

    let run = api.new_run().await;
    let (_, outcome) = api
        .post(
            &format!("/runs/{run}/calls"),
            json!({"tool": "authorize_card", "args": {"amount": 500}, "step": 0}),
        )
        .await;
    assert_eq!(outcome["outcome"], "confirmed", "{outcome}");
    let (status, pivot) = api.propose_capture(&run).await;
    assert_eq!(status, StatusCode::OK, "{pivot}");
    let (status, view) = api.get(&format!("/runs/{run}")).await;
    assert_eq!(status, StatusCode::OK, "{view}");

    assert_eq!(documented("CallOutcome"), keys_of(&outcome));
    assert_eq!(documented("Run"), keys_of(&view["run"]));
    assert_eq!(documented("Step"), keys_of(&view["steps"][0]));
    assert_eq!(documented("Approval"), keys_of(&view["pivot"]));
    assert_eq!(documented("RunView"), keys_of(&view));
    // What the agent sends for a pivot is what the document asks for.
    assert_eq!(documented("PlannedCall"), ["args", "tool"]);

    let listed = |name: &str| -> Vec<String> {
        schemas[name]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} lists no values: {}", schemas[name]))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let sent = |value: &Value| value.as_str().unwrap().to_owned();
    assert!(listed("OutcomeKind").contains(&sent(&outcome["outcome"])));
    assert!(listed("RunStatus").contains(&sent(&view["run"]["status"])));
    assert!(listed("StepStatus").contains(&sent(&view["steps"][0]["status"])));
    assert!(listed("ToolClass").contains(&sent(&view["steps"][0]["tool_class"])));
    assert!(listed("Audience").contains(&sent(&view["steps"][0]["audience"])));
    assert!(listed("Phase").contains(&sent(&view["steps"][0]["phase"])));
    assert!(listed("ApprovalKind").contains(&sent(&view["pivot"]["kind"])));
    assert!(listed("ApprovalStatus").contains(&sent(&view["pivot"]["status"])));
    // Every status the engine knows is documented, spelt as it is sent.
    for status in saga_harness::saga::status::RunStatus::ALL {
        assert!(listed("RunStatus").contains(&sent(&serde_json::to_value(status).unwrap())));
    }
    for status in saga_harness::saga::status::StepStatus::ALL {
        assert!(listed("StepStatus").contains(&sent(&serde_json::to_value(status).unwrap())));
    }
}
