//! The MCP gateway, driven by a real MCP client (the official Rust SDK's,
//! over streamable HTTP) against the harness on port 0 and the simulators:
//! the tool list and its annotations, naming the run, the cursor rule, and
//! reworded retries after a 504, a reset and a blank 200.

mod common;

use axum::http::{HeaderName, HeaderValue};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use saga_harness::auth::token_hash;
use saga_harness::config::{DatabaseArgs, ServeArgs};
use saga_harness::server::Application;
use saga_harness::sim::bundle::{use_simulated_credentials, Simulators};
use saga_harness::sim::{Fault, FaultRule};
use serde_json::{json, Value};
use std::collections::HashMap;

const AGENT: &str = "support-bot";

struct Harness {
    base: String,
    token: String,
    sims: Simulators,
    _dir: tempfile::TempDir,
    _db: common::TestDb,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(db: common::TestDb) -> Harness {
    use_simulated_credentials();
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = common::process::tools_file(&sims, dir.path(), 50);
    let app = Application::build(ServeArgs {
        bind: "127.0.0.1:0".parse().unwrap(),
        database: DatabaseArgs {
            database_url: db.url.clone(),
            store: Default::default(),
        },
        tools: Some(tools),
        secure_cookies: false,
        limits: Default::default(),
    })
    .await
    .unwrap();
    let token = saga_harness::auth::new_api_token();
    app.state()
        .store
        .add_api_token(AGENT, &token_hash(&token), None)
        .await
        .unwrap();
    let base = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel();
    tokio::spawn(app.serve(async {
        let _ = stopped.await;
    }));
    Harness {
        base,
        token,
        sims,
        _dir: dir,
        _db: db,
        _stop: stop,
    }
}

impl Harness {
    /// The agent API: `POST` (with a body) or `GET` (without), as JSON.
    async fn api(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        let http = reqwest::Client::new();
        let url = format!("{}/api/v1{path}", self.base);
        let request = match body {
            Some(body) => http.post(url).json(&body),
            None => http.get(url),
        };
        let response = request.bearer_auth(&self.token).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// An MCP client configured as a user would: the URL, the token, and the
/// run named by header (or by the URL's path, when `run_header` is None).
async fn client(
    url: &str,
    token: &str,
    run_header: Option<&str>,
) -> RunningService<RoleClient, ()> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token);
    if let Some(run) = run_header {
        config = config.custom_headers(HashMap::from([(
            HeaderName::from_static("x-saga-run"),
            HeaderValue::from_str(run).unwrap(),
        )]));
    }
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("the MCP client connects and initialises")
}

async fn call(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .expect("tools/call answers")
}

fn structured(result: &CallToolResult) -> Value {
    result.structured_content.clone().unwrap_or_else(|| {
        panic!("no structured content: {:?}", result.content);
    })
}

fn reship(email: &str) -> Value {
    json!({"order_id": "ord_1002", "items": ["LAMP-7"], "email": email})
}

#[tokio::test]
async fn mcp_lists_every_agent_tool_with_annotations_from_its_class() {
    let h = start(common::sqlite()).await;
    let client = client(&format!("{}/mcp", h.base), &h.token, Some("listing")).await;
    let tools = client.list_all_tools().await.unwrap();
    let by_name: HashMap<_, _> = tools.iter().map(|t| (t.name.to_string(), t)).collect();
    let hints = |name: &str| {
        let tool = by_name
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not listed: {:?}", by_name.keys()));
        let a = tool.annotations.clone().expect("annotations");
        (a.read_only_hint, a.destructive_hint, a.idempotent_hint)
    };
    // Pure: read-only. Keyed by the harness: idempotent. Irreversible:
    // destructive (it waits for a person).
    assert_eq!(
        hints("search_orders"),
        (Some(true), Some(false), Some(false))
    );
    assert_eq!(hints("reship"), (Some(false), Some(false), Some(true)));
    assert_eq!(hints("send_email"), (Some(false), Some(true), Some(true)));
    assert_eq!(hints("saga_run").0, Some(true));
    // Ways back and gated tools are not the agent's to call.
    for hidden in [
        "cancel_shipment",
        "cancel_authorization",
        "delete_email_draft",
    ] {
        assert!(!by_name.contains_key(hidden), "{hidden} is listed");
    }
    client.cancel().await.unwrap();
}

/// A reworded retry lands on the step whose outcome the agent was not
/// given, and reads it: one shipment in the warehouse, one request to
/// make it, whatever broke the first answer. A call after the final
/// outcome is a new step.
#[tokio::test]
async fn mcp_a_reworded_retry_after_a_504_a_reset_or_a_blank_200_reads_the_outcome_not_a_second_effect(
) {
    reworded_retries(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_mcp_a_reworded_retry_reads_the_outcome_not_a_second_effect() {
    let Some(db) = common::postgres().await else {
        eprintln!("skipped: SAGA_TEST_POSTGRES_URL is not set");
        return;
    };
    reworded_retries(db).await;
}

async fn reworded_retries(db: common::TestDb) {
    let h = start(db).await;
    let faults = [
        ("after-504", Fault::CommitThen504),
        ("after-reset", Fault::ResetAfterCommit),
        ("after-blank", Fault::CommitThenBlank),
    ];
    for (n, (label, fault)) in faults.into_iter().enumerate() {
        let client = client(&format!("{}/mcp", h.base), &h.token, Some(label)).await;
        h.sims
            .warehouse
            .state
            .faults
            .inject(FaultRule::new("POST", "/v1/shipments", fault).times(1));
        let first = structured(&call(&client, "reship", reship("grace@example.com")).await);
        assert_eq!(first["outcome"], "unknown", "{label}: {first}");
        assert_eq!(first["step"], 0);
        // The model rewords its retry: the logged arguments win.
        let again = structured(&call(&client, "reship", reship("Grace <grace@example.com>")).await);
        assert_eq!(again["outcome"], "confirmed", "{label}: {again}");
        assert_eq!(again["step"], 0, "{label}: the retry went to a new step");
        assert_eq!(again["key"], first["key"]);
        let shipments = h.sims.warehouse.ledger().of("shipment.created");
        assert_eq!(shipments.len(), n + 1, "{label}: {shipments:?}");
        assert_eq!(
            h.sims
                .warehouse
                .state
                .faults
                .requests_to("POST", "/v1/shipments"),
            n + 1,
            "{label}: the retry was sent again instead of looked up"
        );
        client.cancel().await.unwrap();
    }
    // After its final outcome, the same tool again is a new effect.
    let client = client(&format!("{}/mcp", h.base), &h.token, Some("after-504")).await;
    let second = structured(&call(&client, "reship", reship("grace@example.com")).await);
    assert_eq!(second["outcome"], "confirmed", "{second}");
    assert_eq!(second["step"], 1);
    assert_eq!(h.sims.warehouse.ledger().of("shipment.created").len(), 4);
    client.cancel().await.unwrap();
}

/// The run is named once, by header or by path; both name the same run,
/// created on first use with the API's label idempotency, and `saga_run`
/// reads its log.
#[tokio::test]
async fn mcp_the_run_named_by_header_or_path_is_one_run_and_saga_run_reads_its_log() {
    let h = start(common::sqlite()).await;
    let by_header = client(&format!("{}/mcp", h.base), &h.token, Some("case-7")).await;
    let made = structured(&call(&by_header, "reship", reship("grace@example.com")).await);
    assert_eq!(made["outcome"], "confirmed");
    let by_path = client(&format!("{}/mcp/runs/case-7", h.base), &h.token, None).await;
    let log = call(&by_path, "saga_run", json!({})).await;
    let view = structured(&log);
    assert_eq!(view["steps"].as_array().unwrap().len(), 1, "{view}");
    assert_eq!(view["steps"][0]["tool"], "reship");
    assert_eq!(view["steps"][0]["external_ref"], made["external_ref"]);
    let text = format!("{:?}", log.content);
    assert!(text.contains("step 0: reship"), "{text}");
    // The same label through the agent API is the same run.
    let (_, created) = h.api("/runs", Some(json!({"label": "case-7"}))).await;
    assert_eq!(created["run"]["id"], view["run"]["id"]);
    by_header.cancel().await.unwrap();
    by_path.cancel().await.unwrap();
}

#[tokio::test]
async fn mcp_without_a_run_a_side_effect_is_refused_and_without_a_token_nothing_is_served() {
    let h = start(common::sqlite()).await;
    let nameless = client(&format!("{}/mcp", h.base), &h.token, None).await;
    let refused = call(&nameless, "reship", reship("grace@example.com")).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(format!("{:?}", refused.content).contains("X-Saga-Run"));
    assert!(h.sims.warehouse.ledger().of("shipment.created").is_empty());
    nameless.cancel().await.unwrap();
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{}/mcp", h.base))
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "curl", "version": "1"}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
}

/// Each tool's schema from the tools file is what agents are shown (the
/// API's tool list and MCP's), and a new call whose arguments do not fit
/// it is refused naming the argument, before anything is logged or sent.
#[tokio::test]
async fn a_tools_argument_schema_is_served_and_every_new_call_is_checked_against_it() {
    let h = start(common::sqlite()).await;
    let (_, listed) = h.api("/tools", None).await;
    let reship_schema = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "reship")
        .unwrap()["schema"]
        .clone();
    assert_eq!(reship_schema["required"], json!(["order_id", "items"]));
    let client = client(&format!("{}/mcp", h.base), &h.token, Some("schemas")).await;
    let tools = client.list_all_tools().await.unwrap();
    let over_mcp = tools.iter().find(|t| t.name == "reship").unwrap();
    assert_eq!(
        Value::Object((*over_mcp.input_schema).clone()),
        reship_schema
    );
    // Over the API: 422 naming the argument, and no step taken.
    let (_, created) = h.api("/runs", Some(json!({"label": "schemas"}))).await;
    let run = created["run"]["id"].as_str().unwrap();
    let calls = format!("/runs/{run}/calls");
    for (args, named) in [
        (
            json!({"order_id": "ord_1002", "items": "LAMP-7"}),
            "`items`",
        ),
        (json!({"items": ["LAMP-7"]}), "`order_id`"),
    ] {
        let (status, refused) = h
            .api(
                &calls,
                Some(json!({"tool": "reship", "step": 0, "args": args})),
            )
            .await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (422, Some("invalid_args")),
            "{refused}"
        );
        assert!(
            refused["message"].as_str().unwrap().contains(named),
            "{refused}"
        );
    }
    // Over MCP: a tool error naming the argument.
    let refused = call(&client, "reship", json!({"order_id": "ord_1002"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        format!("{:?}", refused.content).contains("`items`"),
        "{:?}",
        refused.content
    );
    let (_, view) = h.api(&format!("/runs/{run}"), None).await;
    assert_eq!(view["steps"].as_array().unwrap().len(), 0, "{view}");
    assert!(h.sims.warehouse.ledger().of("shipment.created").is_empty());
    client.cancel().await.unwrap();
}
