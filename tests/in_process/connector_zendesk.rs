//! The Zendesk connector against the Zendesk simulator over real HTTP: every
//! R4 row Zendesk can produce, the key as `Idempotency-Key` and
//! `external_id` (R5), lookups by it (R7), and the close / delete ways back
//! (R8).

use crate::common;

use saga_harness::connectors::wire::{Timeouts, Wire};
use saga_harness::connectors::zendesk::{
    ZendeskConnector, CLOSE_TICKET, CREATE_TICKET, DELETE_TICKET,
};
use saga_harness::connectors::ConnectorSet;
use saga_harness::saga::connector::{classify, CallReport, Classified, Connector, Lookup};
use saga_harness::sim::{self, Fault, FaultRule, Running, SimState};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const EMAIL: &str = "agent@example.com";
const SECRET: &str = "zendesk-secret-1a2b3c4d";

fn env_var(value: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "SAGA_TEST_ZENDESK_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    std::env::set_var(&name, value);
    name
}

fn settings(base_url: &str) -> toml::Table {
    let mut table = toml::Table::new();
    table.insert("base_url".into(), base_url.into());
    table.insert("email_env".into(), env_var(EMAIL).into());
    table.insert("api_token_env".into(), env_var(SECRET).into());
    table.insert("settle_ms".into(), 50.into());
    table
}

struct Rig {
    sim: SimState,
    running: Running,
    zendesk: ZendeskConnector,
}

async fn rig() -> Rig {
    rig_with(Timeouts::default(), |_| {}).await
}

async fn rig_with(timeouts: Timeouts, adjust: impl FnOnce(&mut toml::Table)) -> Rig {
    let sim = SimState::default();
    let running = sim::serve(sim::zendesk::router(&sim), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut table = settings(&running.base_url());
    adjust(&mut table);
    let zendesk = ZendeskConnector::from_settings(&table, Wire::new(&timeouts)).unwrap();
    Rig {
        sim,
        running,
        zendesk,
    }
}

fn ticket_args() -> Value {
    json!({
        "subject": "Refund follow-up",
        "body": "The customer asked twice.",
        "requester_email": "customer@example.org",
        "tags": ["refund"],
    })
}

impl Rig {
    fn inject(&self, method: &str, path: &str, fault: Fault) {
        self.sim.faults.inject(FaultRule::new(method, path, fault));
    }

    fn classify(&self, operation: &str, report: &CallReport) -> Classified {
        classify(report, |body| self.zendesk.external_ref(operation, body))
    }

    async fn create(&self, key: &str) -> CallReport {
        self.zendesk
            .execute(CREATE_TICKET, key, &ticket_args())
            .await
    }

    fn raw(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .request(method, format!("{}{path}", self.running.base_url()))
            .basic_auth(format!("{EMAIL}/token"), Some(SECRET))
    }

    async fn listed(&self, external_id: &str) -> Vec<Value> {
        let body: Value = self
            .raw(
                reqwest::Method::GET,
                &format!("/api/v2/tickets.json?external_id={external_id}"),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["tickets"].as_array().cloned().unwrap_or_default()
    }

    fn effects(&self, action: &str) -> usize {
        self.sim.ledger.of(action).len()
    }
}

fn confirmed_ref(classified: &Classified) -> &str {
    match classified {
        Classified::Confirmed { external_ref, .. } => external_ref,
        other => panic!("expected confirmed, got {other:?}"),
    }
}

fn found_ref(lookup: &Lookup) -> &str {
    match lookup {
        Lookup::FoundSucceeded { external_ref, .. } => external_ref,
        other => panic!("expected found-succeeded, got {other:?}"),
    }
}

#[tokio::test]
async fn r5_key_travels_as_idempotency_key_and_external_id() {
    let rig = rig().await;
    let report = rig.create("k-create").await;
    assert!(matches!(report, CallReport::Answered { status: 201, .. }));
    assert_eq!(confirmed_ref(&rig.classify(CREATE_TICKET, &report)), "1");

    let listed = rig.listed("k-create").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["external_id"], "k-create");
    assert_eq!(listed[0]["subject"], "Refund follow-up");
    assert_eq!(listed[0]["tags"], json!(["refund"]));
    assert_ne!(listed[0]["requester_id"], listed[0]["submitter_id"]);
    let created = rig.sim.ledger.of("ticket.created");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].key.as_deref(), Some("k-create"));
    assert_eq!(created[0].object, "1");
}

#[tokio::test]
async fn r5_the_same_key_and_body_is_replayed_without_a_second_ticket() {
    let rig = rig().await;
    let first = rig.create("k-twice").await;
    let second = rig.create("k-twice").await;
    assert_eq!(first, second, "the stored answer is replayed");
    assert_eq!(confirmed_ref(&rig.classify(CREATE_TICKET, &second)), "1");
    assert_eq!(rig.effects("ticket.created"), 1);

    // The replay says so in Zendesk's header.
    let body =
        json!({"ticket": {"subject": "s", "comment": {"body": "b"}, "external_id": "k-raw"}});
    let mut seen = Vec::new();
    for _ in 0..2 {
        let response = rig
            .raw(reqwest::Method::POST, "/api/v2/tickets.json")
            .header("Idempotency-Key", "k-raw")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        seen.push(
            response.headers()[sim::zendesk::IDEMPOTENCY_LOOKUP]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(seen, ["miss", "hit"]);
}

#[tokio::test]
async fn r4_the_same_key_with_other_params_is_an_idempotency_conflict_so_unknown() {
    let rig = rig().await;
    rig.create("k-conflict").await;
    let other = rig
        .zendesk
        .execute(
            CREATE_TICKET,
            "k-conflict",
            &json!({"subject": "Something else", "body": "other"}),
        )
        .await;
    let CallReport::Answered {
        status: 400,
        body: Some(body),
        idempotency_conflict: true,
    } = &other
    else {
        panic!("{other:?}")
    };
    assert_eq!(body["error"], "IdempotentRequestError");
    assert!(matches!(
        rig.classify(CREATE_TICKET, &other),
        Classified::Unknown { .. }
    ));
    let found = rig
        .zendesk
        .lookup(CREATE_TICKET, "k-conflict", &json!({}))
        .await
        .unwrap();
    assert_eq!(found_ref(&found), "1");
    assert_eq!(rig.effects("ticket.created"), 1);
}

/// After an unknown create the lookup finds the ticket, and a re-send with
/// the same key is replayed rather than creating a second one.
async fn unknown_then_found(rig: &Rig, report: &CallReport, key: &str) {
    assert!(
        matches!(
            rig.classify(CREATE_TICKET, report),
            Classified::Unknown { .. }
        ),
        "{report:?}"
    );
    let found = rig
        .zendesk
        .lookup(CREATE_TICKET, key, &json!({}))
        .await
        .unwrap();
    assert_eq!(found_ref(&found), "1");
    let Lookup::FoundSucceeded { result, .. } = found else {
        unreachable!()
    };
    assert_eq!(result["ticket"]["external_id"], key);
    let again = rig.create(key).await;
    assert_eq!(confirmed_ref(&rig.classify(CREATE_TICKET, &again)), "1");
    assert_eq!(rig.effects("ticket.created"), 1);
}

#[tokio::test]
async fn r4_commit_then_504_is_unknown_and_lookup_finds_it() {
    let rig = rig().await;
    rig.inject("POST", "/api/v2/tickets.json", Fault::CommitThen504);
    let report = rig.create("k-504").await;
    assert!(matches!(report, CallReport::Answered { status: 504, .. }));
    unknown_then_found(&rig, &report, "k-504").await;
}

#[tokio::test]
async fn r4_reset_after_commit_is_unknown_and_lookup_finds_it() {
    let rig = rig().await;
    rig.inject("POST", "/api/v2/tickets.json", Fault::ResetAfterCommit);
    let report = rig.create("k-reset").await;
    assert_eq!(report, CallReport::ResetAfterSend);
    unknown_then_found(&rig, &report, "k-reset").await;
}

#[tokio::test]
async fn r4_commit_then_blank_page_is_unknown_and_lookup_finds_it() {
    let rig = rig().await;
    rig.inject("POST", "/api/v2/tickets.json", Fault::CommitThenBlank);
    let report = rig.create("k-blank").await;
    assert!(matches!(
        report,
        CallReport::Answered {
            status: 200,
            body: None,
            ..
        }
    ));
    unknown_then_found(&rig, &report, "k-blank").await;
}

#[tokio::test]
async fn r4_a_delay_past_the_timeout_is_unknown_and_lookup_finds_it() {
    let short = Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_millis(300),
        ..Timeouts::default()
    };
    let rig = rig_with(short, |_| {}).await;
    rig.inject("POST", "/api/v2/tickets.json", Fault::Delay { ms: 1_000 });
    let report = rig.create("k-slow").await;
    assert_eq!(report, CallReport::TimedOut);
    unknown_then_found(&rig, &report, "k-slow").await;
}

#[tokio::test]
async fn r4_a_refusal_is_failed_with_zendesks_error_and_nothing_happened() {
    let rig = rig().await;
    rig.inject(
        "POST",
        "/api/v2/tickets.json",
        Fault::Reject {
            status: 403,
            message: "You do not have access to this page.".into(),
        },
    );
    let report = rig.create("k-403").await;
    assert!(matches!(
        rig.classify(CREATE_TICKET, &report),
        Classified::Failed { .. }
    ));
    assert_eq!(rig.effects("ticket.created"), 0);
}

#[tokio::test]
async fn r4_a_ticket_without_a_body_is_failed_as_record_invalid() {
    let rig = rig().await;
    let report = rig
        .zendesk
        .execute(CREATE_TICKET, "k-empty", &json!({"subject": "No body"}))
        .await;
    let CallReport::Answered {
        status: 422,
        body: Some(body),
        ..
    } = &report
    else {
        panic!("{report:?}")
    };
    assert_eq!(body["error"], "RecordInvalid");
    assert_eq!(body["description"], "Record validation errors");
    assert_eq!(
        body["details"]["base"][0]["description"],
        "Description: cannot be blank"
    );
    assert_eq!(
        rig.classify(CREATE_TICKET, &report),
        Classified::Failed {
            error: "HTTP 422: RecordInvalid".into()
        }
    );
    assert_eq!(rig.effects("ticket.created"), 0);
}

#[tokio::test]
async fn r4_429_is_not_executed_with_retry_after_and_nothing_happened() {
    let rig = rig().await;
    rig.inject("POST", "/api/v2/tickets.json", Fault::RateLimit);
    let report = rig.create("k-429").await;
    assert!(
        matches!(&report, saga_harness::saga::connector::CallReport::Deferred { retry_after: Some(wait), .. }
            if *wait == std::time::Duration::from_secs(1)),
        "{report:?}"
    );
    assert!(matches!(
        rig.classify(CREATE_TICKET, &report),
        Classified::NotExecuted { .. }
    ));
    assert_eq!(rig.effects("ticket.created"), 0);

    rig.inject("GET", "/api/v2/tickets.json", Fault::RateLimit);
    let limited = rig
        .raw(reqwest::Method::GET, "/api/v2/tickets.json")
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), 429);
    assert!(limited.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn r4_a_request_that_never_left_is_not_executed() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let zendesk =
        ZendeskConnector::from_settings(&settings(&url), Wire::new(&Timeouts::default())).unwrap();
    let report = zendesk.execute(CREATE_TICKET, "k", &ticket_args()).await;
    assert!(matches!(
        classify(&report, |b| zendesk.external_ref(CREATE_TICKET, b)),
        Classified::NotExecuted { .. }
    ));
    assert!(!format!("{report:?}").contains(SECRET));
}

#[tokio::test]
async fn r7_lookup_under_search_lag_misses_first_then_finds() {
    let rig = rig().await;
    rig.sim.faults.set_search_lag(Duration::from_millis(300));
    let report = rig.create("k-lag").await;
    assert_eq!(confirmed_ref(&rig.classify(CREATE_TICKET, &report)), "1");
    let first = rig
        .zendesk
        .lookup(CREATE_TICKET, "k-lag", &json!({}))
        .await
        .unwrap();
    assert_eq!(first, Lookup::NotFound, "the listing has not caught up");
    let again = common::until("the listing to catch up", || async {
        let again = rig
            .zendesk
            .lookup(CREATE_TICKET, "k-lag", &json!({}))
            .await
            .unwrap();
        (again != Lookup::NotFound).then_some(again)
    })
    .await;
    assert_eq!(found_ref(&again), "1");
}

#[tokio::test]
async fn r7_lookup_of_a_key_never_used_is_not_found() {
    let rig = rig().await;
    rig.create("k-other").await;
    let never = rig
        .zendesk
        .lookup(CREATE_TICKET, "k-never", &json!({}))
        .await
        .unwrap();
    assert_eq!(never, Lookup::NotFound);
}

#[tokio::test]
async fn r8_close_solves_the_ticket_with_a_private_comment_and_its_own_tag() {
    let rig = rig().await;
    rig.create("k-ticket").await;
    let args = json!({"ticket_key": "k-ticket", "comment": "Undone: refund reversed."});
    let report = rig.zendesk.execute(CLOSE_TICKET, "k-close", &args).await;
    let Classified::Confirmed {
        external_ref,
        result,
    } = rig.classify(CLOSE_TICKET, &report)
    else {
        panic!("{report:?}")
    };
    assert_eq!(external_ref, "1");
    assert_eq!(result["ticket"]["status"], "solved");
    assert_eq!(result["ticket"]["tags"], json!(["refund", "saga-k-close"]));
    let updated = rig.sim.ledger.of("ticket.updated");
    assert_eq!(updated.len(), 1);
    assert_eq!(updated[0].key.as_deref(), Some("k-close"));
    assert_eq!(updated[0].detail["to"], "solved");
    assert_eq!(updated[0].detail["comment"]["public"], false);

    let found = rig
        .zendesk
        .lookup(CLOSE_TICKET, "k-close", &args)
        .await
        .unwrap();
    assert_eq!(found_ref(&found), "1");
}

#[tokio::test]
async fn r8_already_solved_counts_as_compensated() {
    let rig = rig().await;
    let mut args = ticket_args();
    args["status"] = "solved".into();
    rig.zendesk.execute(CREATE_TICKET, "k-solved", &args).await;
    let close = json!({"ticket_key": "k-solved"});
    let report = rig.zendesk.execute(CLOSE_TICKET, "k-close", &close).await;
    assert!(matches!(report, CallReport::Answered { status: 200, .. }));
    assert_eq!(confirmed_ref(&rig.classify(CLOSE_TICKET, &report)), "1");
    assert_eq!(rig.effects("ticket.updated"), 0, "nothing to change");

    // A close sent twice changes the ticket once.
    rig.create("k-open").await;
    let close = json!({"ticket_key": "k-open"});
    rig.zendesk.execute(CLOSE_TICKET, "k-close-2", &close).await;
    let again = rig.zendesk.execute(CLOSE_TICKET, "k-close-2", &close).await;
    assert_eq!(confirmed_ref(&rig.classify(CLOSE_TICKET, &again)), "2");
    assert_eq!(rig.effects("ticket.updated"), 1);
}

#[tokio::test]
async fn r4_a_close_whose_answer_is_lost_is_unknown_and_lookup_finds_it() {
    let rig = rig().await;
    rig.create("k-lost").await;
    rig.inject("PUT", "/api/v2/tickets/*", Fault::CommitThen504);
    let args = json!({"ticket_key": "k-lost"});
    let report = rig.zendesk.execute(CLOSE_TICKET, "k-close", &args).await;
    assert!(matches!(
        rig.classify(CLOSE_TICKET, &report),
        Classified::Unknown { .. }
    ));
    let found = rig
        .zendesk
        .lookup(CLOSE_TICKET, "k-close", &args)
        .await
        .unwrap();
    assert_eq!(found_ref(&found), "1");
    assert_eq!(rig.effects("ticket.updated"), 1);
}

#[tokio::test]
async fn r7_close_lookup_is_not_found_while_the_ticket_is_open() {
    let rig = rig().await;
    rig.create("k-open").await;
    let open = rig
        .zendesk
        .lookup(CLOSE_TICKET, "k-close", &json!({"ticket_key": "k-open"}))
        .await
        .unwrap();
    assert_eq!(open, Lookup::NotFound);
}

#[tokio::test]
async fn r4_a_close_that_finds_no_ticket_is_not_executed() {
    let rig = rig().await;
    let report = rig
        .zendesk
        .execute(CLOSE_TICKET, "k-close", &json!({"ticket_key": "k-never"}))
        .await;
    let Classified::NotExecuted { reason } = rig.classify(CLOSE_TICKET, &report) else {
        panic!("{report:?}")
    };
    assert!(reason.contains("k-never"), "{reason}");
    assert!(rig.sim.ledger.effects().is_empty());
}

#[tokio::test]
async fn r8_delete_removes_the_draft_ticket_and_reports_its_id() {
    let rig = rig().await;
    rig.create("k-draft").await;
    let args = json!({"ticket_key": "k-draft"});
    let report = rig.zendesk.execute(DELETE_TICKET, "k-undo", &args).await;
    assert!(
        matches!(report, CallReport::Answered { status: 204, .. }),
        "the 204 is reported with the deleted ticket's id: {report:?}"
    );
    assert_eq!(confirmed_ref(&rig.classify(DELETE_TICKET, &report)), "1");
    assert!(rig.listed("k-draft").await.is_empty());
    let gone = rig
        .raw(reqwest::Method::GET, "/api/v2/tickets/1.json")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
    let body: Value = gone.json().await.unwrap();
    assert_eq!(
        body,
        json!({"error": "RecordNotFound", "description": "Not found"})
    );
    assert_eq!(rig.effects("ticket.deleted"), 1);

    let found = rig
        .zendesk
        .lookup(DELETE_TICKET, "k-undo", &args)
        .await
        .unwrap();
    assert!(matches!(found, Lookup::FoundSucceeded { .. }));
}

#[tokio::test]
async fn r8_a_ticket_already_gone_counts_as_deleted() {
    let rig = rig().await;
    rig.create("k-draft").await;
    let args = json!({"ticket_key": "k-draft"});
    rig.zendesk.execute(DELETE_TICKET, "k-undo", &args).await;
    let again = rig.zendesk.execute(DELETE_TICKET, "k-undo", &args).await;
    assert_eq!(
        confirmed_ref(&rig.classify(DELETE_TICKET, &again)),
        "k-draft",
        "no id is known for a ticket gone before the delete saw it"
    );
    assert_eq!(rig.effects("ticket.deleted"), 1);
}

#[tokio::test]
async fn r4_a_delete_whose_answer_is_lost_is_unknown_and_lookup_finds_it() {
    let rig = rig().await;
    rig.create("k-draft").await;
    rig.inject("DELETE", "/api/v2/tickets/*", Fault::ResetAfterCommit);
    let args = json!({"ticket_key": "k-draft"});
    let report = rig.zendesk.execute(DELETE_TICKET, "k-undo", &args).await;
    assert!(matches!(
        rig.classify(DELETE_TICKET, &report),
        Classified::Unknown { .. }
    ));
    let found = rig
        .zendesk
        .lookup(DELETE_TICKET, "k-undo", &args)
        .await
        .unwrap();
    assert!(matches!(found, Lookup::FoundSucceeded { .. }), "{found:?}");
    assert_eq!(rig.effects("ticket.deleted"), 1);
}

#[tokio::test]
async fn r7_delete_lookup_is_not_found_while_the_ticket_is_listed() {
    let rig = rig().await;
    rig.create("k-draft").await;
    let found = rig
        .zendesk
        .lookup(DELETE_TICKET, "k-undo", &json!({"ticket_key": "k-draft"}))
        .await
        .unwrap();
    assert_eq!(found, Lookup::NotFound);
}

#[tokio::test]
async fn r8_a_delete_waits_out_the_listing_lag_before_calling_a_ticket_gone() {
    let rig = rig_with(Timeouts::default(), |t| {
        t.insert("settle_ms".into(), 300.into());
    })
    .await;
    rig.sim.faults.set_search_lag(Duration::from_millis(200));
    rig.create("k-fresh").await;
    let report = rig
        .zendesk
        .execute(DELETE_TICKET, "k-undo", &json!({"ticket_key": "k-fresh"}))
        .await;
    assert_eq!(
        confirmed_ref(&rig.classify(DELETE_TICKET, &report)),
        "1",
        "the second look finds the ticket, which is deleted, not presumed gone"
    );
    assert_eq!(rig.effects("ticket.deleted"), 1);
}

#[tokio::test]
async fn the_simulator_refuses_bad_credentials_in_zendesks_shape() {
    let rig = rig().await;
    let client = reqwest::Client::new();
    let base = rig.running.base_url();
    for request in [
        client.get(format!("{base}/api/v2/tickets.json")),
        client
            .get(format!("{base}/api/v2/tickets.json"))
            .basic_auth(EMAIL, Some("a-password")),
    ] {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body, json!({"error": "Couldn't authenticate you"}));
    }
    let closed_update = {
        let mut args = ticket_args();
        args["status"] = "closed".into();
        rig.zendesk.execute(CREATE_TICKET, "k-closed", &args).await;
        rig.raw(reqwest::Method::PUT, "/api/v2/tickets/1.json")
            .json(&json!({"ticket": {"status": "open"}}))
            .send()
            .await
            .unwrap()
    };
    assert_eq!(closed_update.status(), 422);
    let body: Value = closed_update.json().await.unwrap();
    assert_eq!(body["error"], "RecordInvalid");
}

#[tokio::test]
async fn settings_mistakes_name_the_connector_and_the_field() {
    let mut table = toml::Table::new();
    table.insert("base_url".into(), "not a url".into());
    table.insert("email_env".into(), "SAGA_TEST_ZENDESK_UNSET".into());
    table.insert("api_token".into(), SECRET.into());
    table.insert("settle_ms".into(), "soon".into());
    let mistakes =
        ZendeskConnector::from_settings(&table, Wire::new(&Timeouts::default())).unwrap_err();
    let all = mistakes.join("\n");
    for expected in [
        "connector `zendesk`, field `base_url`",
        "connector `zendesk`, field `email_env`: the environment variable SAGA_TEST_ZENDESK_UNSET is not set",
        "connector `zendesk`: field `api_token_env` is missing",
        "connector `zendesk`: unknown field `api_token`",
        "connector `zendesk`, field `settle_ms`",
    ] {
        assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
    }
    assert!(!all.contains(SECRET), "{all}");
}

#[tokio::test]
async fn the_connector_set_routes_the_zendesk_operations() {
    let mut set = toml::Table::new();
    set.insert(
        "zendesk".into(),
        toml::Value::Table(settings("http://127.0.0.1:1")),
    );
    let connectors = ConnectorSet::from_settings(&set, &Wire::new(&Timeouts::default())).unwrap();
    let operations: Vec<&str> = connectors.operations().collect();
    assert_eq!(operations, vec![CLOSE_TICKET, CREATE_TICKET, DELETE_TICKET]);
}

#[tokio::test]
async fn a_credential_never_appears_in_errors_reports_or_debug_output() {
    let rig = rig().await;
    assert!(!format!("{:?}", rig.zendesk).contains(SECRET));
    rig.inject(
        "POST",
        "/api/v2/tickets.json",
        Fault::Reject {
            status: 401,
            message: "Couldn't authenticate you".into(),
        },
    );
    let refused = rig.create("k-auth").await;
    let closed = rig
        .zendesk
        .execute(CLOSE_TICKET, "k-c", &json!({"ticket_key": "k-none"}))
        .await;
    for report in [&refused, &closed] {
        assert!(!format!("{report:?}").contains(SECRET));
        assert!(!format!("{:?}", rig.classify(CREATE_TICKET, report)).contains(SECRET));
    }
}
