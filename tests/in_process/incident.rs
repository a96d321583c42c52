//! The seed's incident, replayed end to end over real HTTP: an agent talks
//! to the harness's API, the harness talks to the simulated Jira, Stripe and
//! warehouse, faults are injected in the simulators, and the harness is
//! restarted between the charge and the commit of its outcome. The end state
//! is read from the simulators' ledgers, not from the saga log.

use crate::common;

use common::app::{Spawn, TestApp};
use saga_harness::auth::token_hash;
use saga_harness::saga::class::{Audience, Phase, ToolClass};
use saga_harness::saga::connector::Connector;
use saga_harness::saga::key::step_key;
use saga_harness::saga::model::{Actor, NewStep};
use saga_harness::saga::status::StepStatus;
use saga_harness::sim::bundle::{use_simulated_credentials, Simulators};
use saga_harness::sim::{Fault, FaultRule};
use serde_json::{json, Value};
use std::path::PathBuf;

const AGENT: &str = "support-bot";

/// The harness on `database_url` over the tools file, with the agent's
/// token issued when one is given.
async fn start_harness(database_url: &str, tools: PathBuf, token: Option<&str>) -> TestApp {
    let app = Spawn::on_url(database_url).tools(tools).start().await;
    if let Some(token) = token {
        app.state()
            .store
            .add_api_token(AGENT, &token_hash(token), None)
            .await
            .unwrap();
    }
    app
}

async fn call(http: &reqwest::Client, h: &TestApp, token: &str, path: &str, body: Value) -> Value {
    let response = http
        .post(format!("{}{path}", h.api()))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

/// Step 0 opens the Jira ticket; the gateway answers 504 after Jira made
/// it, so the agent is told `unknown`.
async fn open_ticket_behind_a_504(
    sims: &Simulators,
    http: &reqwest::Client,
    harness: &TestApp,
    token: &str,
    calls: &str,
) -> Value {
    sims.jira.state.faults.inject(FaultRule::new(
        "POST",
        "/rest/api/3/issue",
        Fault::CommitThen504,
    ));
    let first = call(
        http,
        harness,
        token,
        calls,
        json!({"tool": "create_ticket", "args": {"summary": "Kettle arrived broken"}, "step": 0}),
    )
    .await;
    assert_eq!(first["outcome"], "unknown", "{first}");
    first
}

async fn the_seed_incident_over_real_http(db: common::TestDb) {
    use_simulated_credentials();
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools.toml");
    let shipped = std::fs::read_to_string("tools/support.toml").unwrap();
    std::fs::write(&tools, sims.point(&shipped).unwrap()).unwrap();
    let token = saga_harness::auth::new_api_token();
    let http = reqwest::Client::new();

    let harness = start_harness(&db.url, tools.clone(), Some(&token)).await;
    let run = call(
        &http,
        &harness,
        &token,
        "/runs",
        json!({"purpose": "kettle arrived broken"}),
    )
    .await;
    let run_id = run["run"]["id"].as_str().unwrap().to_owned();
    let calls = format!("/runs/{run_id}/calls");

    // The ticket is opened; Jira's gateway answers 504 after creating it.
    let first = open_ticket_behind_a_504(&sims, &http, &harness, &token, &calls).await;
    // The model retries at once, in other words.
    let retried = call(&http, &harness, &token, &calls,
        json!({"tool": "create_ticket", "args": {"summary": "Customer's kettle is damaged, open a ticket"}, "step": 0})).await;
    assert_eq!(retried["outcome"], "confirmed", "{retried}");
    assert_eq!(retried["key"], first["key"]);

    // The card is charged, and the harness dies before the outcome commit:
    // the intent is in the log and the charge is in Stripe, nothing more.
    let charge_args = json!({"customer": "cus_ada", "amount": 4900, "currency": "usd",
                             "email": "ada@example.com", "receipt": false});
    let run_uuid = run_id.parse().unwrap();
    let key = step_key(run_uuid, 1, "charge_card");
    let spec = harness.state().registry.get("charge_card").unwrap().clone();
    harness
        .state()
        .store
        .record_step(
            NewStep {
                run_id: run_uuid,
                step_idx: 1,
                tool: "charge_card".into(),
                tool_class: ToolClass::Compensatable,
                idempotency_key: key.clone(),
                args: charge_args.clone(),
                status: StepStatus::Intended,
                compensation: spec.way_back(&key, &charge_args).unwrap(),
                audience: Audience::Finance,
                phase: Phase::BeforePivot,
                limits: Default::default(),
            },
            &Actor::Agent(AGENT.into()),
        )
        .await
        .unwrap();
    let settings = std::fs::read_to_string(&tools).unwrap();
    let registry = saga_harness::saga::registry::Registry::from_toml(&settings).unwrap();
    let connectors = saga_harness::connectors::ConnectorSet::from_settings(
        registry.connector_settings(),
        &saga_harness::connectors::wire::Wire::new(&Default::default()),
    )
    .unwrap();
    connectors
        .execute("stripe.charge", &key, &charge_args)
        .await;
    harness.stop().await;

    // A new process over the same log: resume finds the charge in Stripe.
    let harness = start_harness(&db.url, tools.clone(), None).await;
    let charged = call(
        &http,
        &harness,
        &token,
        &calls,
        json!({"tool": "charge_card", "args": charge_args, "step": 1}),
    )
    .await;
    assert_eq!(charged["outcome"], "confirmed", "{charged}");

    // The warehouse refuses the replacement.
    sims.warehouse.state.faults.inject(FaultRule::new(
        "POST",
        "/v1/shipments",
        Fault::Reject {
            status: 422,
            message: "KETTLE-2 is out of stock".into(),
        },
    ));
    let reship = call(&http, &harness, &token, &calls,
        json!({"tool": "reship", "args": {"order_id": "ord_1001", "items": ["KETTLE-2"], "email": "ada@example.com"}, "step": 2})).await;
    assert_eq!(reship["outcome"], "failed", "{reship}");

    let unwound = call(
        &http,
        &harness,
        &token,
        &format!("/runs/{run_id}/unwind"),
        json!({"reason": "the replacement is out of stock"}),
    )
    .await;
    assert_eq!(unwound["status"], "UNWOUND", "{unwound}");

    // Checked in the systems themselves.
    assert_eq!(
        sims.jira.ledger().of("issue.created").len(),
        1,
        "one ticket"
    );
    let closes: Vec<_> = sims
        .jira
        .ledger()
        .of("issue.transitioned")
        .into_iter()
        .filter(|e| e.detail.to_string().to_lowercase().contains("done"))
        .collect();
    assert_eq!(closes.len(), 1, "closed once: {closes:?}");
    assert_eq!(
        sims.stripe.ledger().of("payment_intent.created").len(),
        1,
        "one charge"
    );
    assert_eq!(
        sims.stripe.ledger().of("refund.created").len(),
        1,
        "refunded once"
    );
    assert!(sims.smtp.ledger().effects().is_empty(), "no email");
    assert!(
        sims.warehouse.ledger().effects().is_empty(),
        "nothing shipped"
    );
    // The inbox: the charge was made without a receipt, so only finance
    // saw it; no correction is addressed to the customer.
    let corrections = harness.state().store.corrections(run_uuid).await.unwrap();
    let addressed: Vec<&[String]> = corrections
        .iter()
        .map(|c| c.recipients.as_slice())
        .collect();
    assert_eq!(
        addressed,
        vec![["finance@example.com".to_owned()].as_slice()],
        "{corrections:?}"
    );
}

/// R12 against the Jira simulator: the gateway answers 504 after the issue
/// was created. A model that trusts `next_step` re-sends the step and gets
/// the real outcome; one that takes a new step, reworded, is refused.
async fn a_reworded_retry_never_opens_a_second_jira_issue(db: common::TestDb) {
    use_simulated_credentials();
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools.toml");
    let shipped = std::fs::read_to_string("tools/support.toml").unwrap();
    std::fs::write(&tools, sims.point(&shipped).unwrap()).unwrap();
    let token = saga_harness::auth::new_api_token();
    let http = reqwest::Client::new();
    let harness = start_harness(&db.url, tools, Some(&token)).await;
    let run = call(
        &http,
        &harness,
        &token,
        "/runs",
        json!({"purpose": "kettle"}),
    )
    .await;
    let calls = format!("/runs/{}/calls", run["run"]["id"].as_str().unwrap());

    let first = open_ticket_behind_a_504(&sims, &http, &harness, &token, &calls).await;
    assert_eq!(first["next_step"], 0, "{first}");

    // A new step, reworded: refused with the step to re-send.
    let refused = http
        .post(format!("{}{calls}", harness.api()))
        .bearer_auth(&token)
        .json(&json!({"tool": "create_ticket", "args": {"summary": "Open a ticket: broken kettle"}, "step": first["new_step"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 409);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["code"], "retry_of_unresolved_step", "{refused}");
    assert_eq!(refused["step"], 0, "{refused}");

    // The step the answer named, reworded: its real outcome.
    let retried = call(&http, &harness, &token, &calls,
        json!({"tool": "create_ticket", "args": {"summary": "Customer's kettle is damaged"}, "step": first["next_step"]})).await;
    assert_eq!(retried["outcome"], "confirmed", "{retried}");
    assert_eq!(retried["next_step"], 1, "{retried}");
    assert_eq!(
        sims.jira.ledger().of("issue.created").len(),
        1,
        "one Jira issue"
    );
}

#[tokio::test]
async fn sqlite_a_reworded_retry_never_opens_a_second_jira_issue() {
    a_reworded_retry_never_opens_a_second_jira_issue(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_a_reworded_retry_never_opens_a_second_jira_issue() {
    if let Some(db) = common::postgres().await {
        a_reworded_retry_never_opens_a_second_jira_issue(db).await;
    }
}

#[tokio::test]
async fn sqlite_the_seed_incident_over_real_http() {
    the_seed_incident_over_real_http(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_the_seed_incident_over_real_http() {
    if let Some(db) = common::postgres().await {
        the_seed_incident_over_real_http(db).await;
    }
}
