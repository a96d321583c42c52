//! The Jira connector against the Jira simulator over real HTTP, on both
//! flavours (Cloud REST v3, Data Center REST v2): every R4 row Jira can
//! produce, the label that carries the key (R5), lookups by it (R7), and
//! the close / reopen compensations (R8).

use crate::common;

use saga_harness::connectors::jira::{saga_label, JiraConnector, CLOSE, CREATE_ISSUE, REOPEN};
use saga_harness::connectors::wire::{Timeouts, Wire};
use saga_harness::connectors::ConnectorSet;
use saga_harness::saga::connector::{classify, CallReport, Classified, Connector, Lookup};
use saga_harness::sim::{self, Fault, FaultRule, Running, SimState};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const FLAVOURS: [&str; 2] = ["cloud", "datacenter"];
const EMAIL: &str = "agent@example.com";
const SECRET: &str = "jira-secret-9f8e7d6c";

/// An environment variable with a name no other test uses.
fn env_var(value: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "SAGA_TEST_JIRA_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    std::env::set_var(&name, value);
    name
}

fn settings(flavour: &str, base_url: &str) -> toml::Table {
    let mut table = toml::Table::new();
    table.insert("base_url".into(), base_url.into());
    table.insert("flavour".into(), flavour.into());
    table.insert("project".into(), "SUP".into());
    table.insert("settle_ms".into(), 50.into());
    if flavour == "cloud" {
        table.insert("email_env".into(), env_var(EMAIL).into());
        table.insert("api_token_env".into(), env_var(SECRET).into());
    } else {
        table.insert("token_env".into(), env_var(SECRET).into());
    }
    table
}

struct Rig {
    sim: SimState,
    running: Running,
    jira: JiraConnector,
    api: &'static str,
}

async fn rig(flavour: &str) -> Rig {
    rig_with(flavour, Timeouts::default(), |_| {}).await
}

async fn rig_with(flavour: &str, timeouts: Timeouts, adjust: impl FnOnce(&mut toml::Table)) -> Rig {
    let sim = SimState::default();
    let running = sim::serve(sim::jira::router(&sim), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut table = settings(flavour, &running.base_url());
    adjust(&mut table);
    let jira = JiraConnector::from_settings(&table, Wire::new(&timeouts)).unwrap();
    let api = if flavour == "cloud" { "3" } else { "2" };
    Rig {
        sim,
        running,
        jira,
        api,
    }
}

impl Rig {
    fn path(&self, rest: &str) -> String {
        format!("/rest/api/{}{rest}", self.api)
    }

    fn inject(&self, method: &str, rest: &str, fault: Fault) {
        self.sim
            .faults
            .inject(FaultRule::new(method, &self.path(rest), fault));
    }

    fn classify(&self, operation: &str, report: &CallReport) -> Classified {
        classify(report, |body| self.jira.external_ref(operation, body))
    }

    async fn create(&self, key: &str) -> CallReport {
        self.jira
            .execute(
                CREATE_ISSUE,
                key,
                &json!({"summary": "Refund follow-up", "description": "Customer asked twice.\n\nCheck the order."}),
            )
            .await
    }

    /// A request to the simulator as an authorised client.
    fn raw(&self, method: reqwest::Method, rest: &str) -> reqwest::RequestBuilder {
        let request = reqwest::Client::new().request(
            method,
            format!("{}{}", self.running.base_url(), self.path(rest)),
        );
        if self.api == "3" {
            request.basic_auth(EMAIL, Some(SECRET))
        } else {
            request.bearer_auth(SECRET)
        }
    }

    async fn issue(&self, issue_key: &str) -> Value {
        self.raw(reqwest::Method::GET, &format!("/issue/{issue_key}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
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

fn status_name(issue: &Value) -> &str {
    issue
        .pointer("/fields/status/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

#[tokio::test]
async fn r5_key_travels_as_a_saga_label_and_the_create_confirms_with_the_issue_key() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        let report = rig.create("k-create").await;
        assert!(
            matches!(report, CallReport::Answered { status: 201, .. }),
            "{flavour}: {report:?}"
        );
        assert_eq!(confirmed_ref(&rig.classify(CREATE_ISSUE, &report)), "SUP-1");

        let issue = rig.issue("SUP-1").await;
        assert_eq!(issue["fields"]["labels"], json!([saga_label("k-create")]));
        assert_eq!(issue["fields"]["issuetype"]["name"], "Task");
        let description = &issue["fields"]["description"];
        if flavour == "cloud" {
            assert_eq!(description["type"], "doc", "v3 speaks ADF");
            assert_eq!(
                description["content"][1]["content"][0]["text"],
                "Check the order."
            );
        } else {
            assert_eq!(description, "Customer asked twice.\n\nCheck the order.");
        }
        let created = rig.sim.ledger.of("issue.created");
        assert_eq!(created.len(), 1);
        assert_eq!(created[0].key.as_deref(), Some("k-create"));
        assert_eq!(created[0].object, "SUP-1");
    }
}

#[tokio::test]
async fn r7_lookup_finds_the_created_issue_by_its_label_and_nothing_for_a_key_never_used() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.create("k-found").await;
        let found = rig
            .jira
            .lookup(CREATE_ISSUE, "k-found", &json!({}))
            .await
            .unwrap();
        assert_eq!(found_ref(&found), "SUP-1", "{flavour}");
        let never = rig
            .jira
            .lookup(CREATE_ISSUE, "k-never", &json!({}))
            .await
            .unwrap();
        assert_eq!(never, Lookup::NotFound, "{flavour}");
    }
}

/// After an unknown create, the lookup finds it and Jira holds one issue.
async fn unknown_then_found(rig: &Rig, report: &CallReport, key: &str) {
    assert!(
        matches!(
            rig.classify(CREATE_ISSUE, report),
            Classified::Unknown { .. }
        ),
        "{report:?}"
    );
    let found = rig
        .jira
        .lookup(CREATE_ISSUE, key, &json!({}))
        .await
        .unwrap();
    assert_eq!(found_ref(&found), "SUP-1");
    assert_eq!(rig.effects("issue.created"), 1);
}

#[tokio::test]
async fn r4_commit_then_504_is_unknown_and_lookup_finds_it() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.inject("POST", "/issue", Fault::CommitThen504);
        let report = rig.create("k-504").await;
        assert!(matches!(report, CallReport::Answered { status: 504, .. }));
        unknown_then_found(&rig, &report, "k-504").await;
    }
}

#[tokio::test]
async fn r4_reset_after_commit_is_unknown_and_lookup_finds_it() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.inject("POST", "/issue", Fault::ResetAfterCommit);
        let report = rig.create("k-reset").await;
        assert_eq!(report, CallReport::ResetAfterSend, "{flavour}");
        unknown_then_found(&rig, &report, "k-reset").await;
    }
}

#[tokio::test]
async fn r4_commit_then_blank_page_is_unknown_and_lookup_finds_it() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.inject("POST", "/issue", Fault::CommitThenBlank);
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
}

#[tokio::test]
async fn r4_a_delay_past_the_timeout_is_unknown_and_lookup_finds_it() {
    let short = Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_millis(300),
        ..Timeouts::default()
    };
    for flavour in FLAVOURS {
        let rig = rig_with(flavour, short.clone(), |_| {}).await;
        rig.inject("POST", "/issue", Fault::Delay { ms: 1_000 });
        let report = rig.create("k-slow").await;
        assert_eq!(report, CallReport::TimedOut, "{flavour}");
        unknown_then_found(&rig, &report, "k-slow").await;
    }
}

#[tokio::test]
async fn r4_a_refusal_is_failed_with_jiras_message_and_nothing_happened() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.inject(
            "POST",
            "/issue",
            Fault::Reject {
                status: 403,
                message: "You do not have permission to create issues in this project.".into(),
            },
        );
        let report = rig.create("k-403").await;
        assert_eq!(
            rig.classify(CREATE_ISSUE, &report),
            Classified::Failed {
                error: "HTTP 403: You do not have permission to create issues in this project."
                    .into()
            }
        );
        assert_eq!(rig.effects("issue.created"), 0);
    }
}

#[tokio::test]
async fn r4_a_missing_summary_is_failed_with_jiras_field_error() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        let report = rig
            .jira
            .execute(
                CREATE_ISSUE,
                "k-nosummary",
                &json!({"description": "no summary"}),
            )
            .await;
        let CallReport::Answered {
            status: 400,
            body: Some(body),
            ..
        } = &report
        else {
            panic!("{flavour}: {report:?}")
        };
        assert_eq!(
            body,
            &json!({"errorMessages": [], "errors": {"summary": "You must specify a summary of the issue."}})
        );
        match rig.classify(CREATE_ISSUE, &report) {
            Classified::Failed { error } => assert!(error.contains("You must specify a summary")),
            other => panic!("{other:?}"),
        }
        assert_eq!(rig.effects("issue.created"), 0);
    }
}

#[tokio::test]
async fn r4_429_is_not_executed_and_nothing_happened() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.inject("POST", "/issue", Fault::RateLimit);
        let report = rig.create("k-429").await;
        assert!(matches!(
            rig.classify(CREATE_ISSUE, &report),
            Classified::NotExecuted { .. }
        ));
        assert_eq!(rig.effects("issue.created"), 0);
    }
}

#[tokio::test]
async fn r4_a_request_that_never_left_is_not_executed() {
    // A port nothing listens on: bind one, note it, close it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let jira =
        JiraConnector::from_settings(&settings("cloud", &url), Wire::new(&Timeouts::default()))
            .unwrap();
    let report = jira
        .execute(CREATE_ISSUE, "k-refused", &json!({"summary": "x"}))
        .await;
    assert!(matches!(report, CallReport::NotSent { .. }), "{report:?}");
    assert!(matches!(
        classify(&report, |b| jira.external_ref(CREATE_ISSUE, b)),
        Classified::NotExecuted { .. }
    ));
}

#[tokio::test]
async fn r7_lookup_under_search_lag_misses_first_then_finds() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.sim.faults.set_search_lag(Duration::from_millis(300));
        let report = rig.create("k-lag").await;
        assert_eq!(confirmed_ref(&rig.classify(CREATE_ISSUE, &report)), "SUP-1");
        let first = rig
            .jira
            .lookup(CREATE_ISSUE, "k-lag", &json!({}))
            .await
            .unwrap();
        assert_eq!(
            first,
            Lookup::NotFound,
            "{flavour}: the index has not caught up"
        );
        let again = common::until("the search index to catch up", || async {
            let again = rig
                .jira
                .lookup(CREATE_ISSUE, "k-lag", &json!({}))
                .await
                .unwrap();
            (again != Lookup::NotFound).then_some(again)
        })
        .await;
        assert_eq!(found_ref(&again), "SUP-1", "{flavour}");
    }
}

#[tokio::test]
async fn r8_close_takes_the_done_transition_with_a_comment_and_its_own_label() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.create("k-issue").await;
        let args = json!({"ticket_key": "k-issue", "comment": "Undone: the refund was reversed."});
        let report = rig.jira.execute(CLOSE, "k-close", &args).await;
        assert!(
            matches!(report, CallReport::Answered { status: 204, .. }),
            "{flavour}: the transition answers 204, reported with the issue read back: {report:?}"
        );
        let Classified::Confirmed {
            external_ref,
            result,
        } = rig.classify(CLOSE, &report)
        else {
            panic!("{flavour}: {report:?}")
        };
        assert_eq!(external_ref, "SUP-1");
        assert_eq!(status_name(&result), "Done");

        let issue = rig.issue("SUP-1").await;
        assert_eq!(
            issue["fields"]["labels"],
            json!([saga_label("k-issue"), saga_label("k-close")])
        );
        let comment = &issue["fields"]["comment"]["comments"][0]["body"];
        if flavour == "cloud" {
            assert_eq!(
                comment["content"][0]["content"][0]["text"],
                "Undone: the refund was reversed."
            );
        } else {
            assert_eq!(comment, "Undone: the refund was reversed.");
        }
        let transitions = rig.sim.ledger.of("issue.transitioned");
        assert_eq!(transitions.len(), 1);
        assert_eq!(transitions[0].detail["to"], "Done");
        let labelled = rig.sim.ledger.of("issue.updated");
        assert_eq!(labelled[0].key.as_deref(), Some("k-close"));
        assert_eq!(rig.effects("issue.commented"), 1);

        let found = rig.jira.lookup(CLOSE, "k-close", &args).await.unwrap();
        assert_eq!(found_ref(&found), "SUP-1");
    }
}

#[tokio::test]
async fn r8_already_done_counts_as_compensated() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.create("k-done").await;
        // Someone closed it by hand first.
        let moved = rig
            .raw(reqwest::Method::POST, "/issue/SUP-1/transitions")
            .json(&json!({"transition": {"id": "31"}}))
            .send()
            .await
            .unwrap();
        assert_eq!(moved.status(), 204);

        let args = json!({"ticket_key": "k-done"});
        let report = rig.jira.execute(CLOSE, "k-close", &args).await;
        assert!(matches!(report, CallReport::Answered { status: 200, .. }));
        assert_eq!(confirmed_ref(&rig.classify(CLOSE, &report)), "SUP-1");
        assert_eq!(rig.effects("issue.transitioned"), 1, "no second transition");
        assert_eq!(rig.effects("issue.commented"), 0);
        // And the same close sent again is answered the same way.
        let again = rig.jira.execute(CLOSE, "k-close", &args).await;
        assert_eq!(confirmed_ref(&rig.classify(CLOSE, &again)), "SUP-1");
        assert_eq!(rig.effects("issue.transitioned"), 1);
    }
}

#[tokio::test]
async fn r8_reopen_takes_a_closed_issue_back_and_an_open_one_counts_as_reopened() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        rig.create("k-re").await;
        let args = json!({"ticket_key": "k-re"});
        let open = rig.jira.execute(REOPEN, "k-reopen-early", &args).await;
        assert_eq!(
            confirmed_ref(&rig.classify(REOPEN, &open)),
            "SUP-1",
            "{flavour}: an open issue is already where a reopen takes it"
        );
        rig.jira.execute(CLOSE, "k-close", &args).await;
        let report = rig.jira.execute(REOPEN, "k-reopen", &args).await;
        let Classified::Confirmed { result, .. } = rig.classify(REOPEN, &report) else {
            panic!("{flavour}: {report:?}")
        };
        assert_eq!(status_name(&result), "To Do");
        let transitions = rig.sim.ledger.of("issue.transitioned");
        assert_eq!(transitions.len(), 2);
        assert_eq!(transitions[1].detail["to"], "To Do");
        let found = rig.jira.lookup(REOPEN, "k-reopen", &args).await.unwrap();
        assert_eq!(found_ref(&found), "SUP-1");
    }
}

#[tokio::test]
async fn r4_a_close_whose_answer_is_lost_is_unknown_and_lookup_finds_it() {
    for (flavour, fault) in [
        ("cloud", Fault::CommitThen504),
        ("datacenter", Fault::ResetAfterCommit),
    ] {
        let rig = rig(flavour).await;
        rig.create("k-lost").await;
        rig.inject("POST", "/issue/*/transitions", fault);
        let args = json!({"ticket_key": "k-lost"});
        let report = rig.jira.execute(CLOSE, "k-close", &args).await;
        assert!(
            matches!(rig.classify(CLOSE, &report), Classified::Unknown { .. }),
            "{flavour}: {report:?}"
        );
        let found = rig.jira.lookup(CLOSE, "k-close", &args).await.unwrap();
        assert_eq!(found_ref(&found), "SUP-1");
        assert_eq!(rig.effects("issue.transitioned"), 1);
    }
}

#[tokio::test]
async fn r7_close_lookup_is_not_found_while_the_issue_is_open() {
    let rig = rig("cloud").await;
    rig.create("k-open").await;
    let found = rig
        .jira
        .lookup(CLOSE, "k-close", &json!({"ticket_key": "k-open"}))
        .await
        .unwrap();
    assert_eq!(found, Lookup::NotFound);
    let never = rig
        .jira
        .lookup(CLOSE, "k-close", &json!({"ticket_key": "k-never"}))
        .await
        .unwrap();
    assert_eq!(never, Lookup::NotFound);
}

#[tokio::test]
async fn r4_a_close_that_finds_no_issue_is_not_executed() {
    let rig = rig("datacenter").await;
    let report = rig
        .jira
        .execute(CLOSE, "k-close", &json!({"ticket_key": "k-never"}))
        .await;
    let Classified::NotExecuted { reason } = rig.classify(CLOSE, &report) else {
        panic!("{report:?}")
    };
    assert!(reason.contains(&saga_label("k-never")), "{reason}");
    assert!(rig.sim.ledger.effects().is_empty());
}

#[tokio::test]
async fn r4_a_close_finds_an_issue_the_index_had_not_caught_up_with() {
    let rig = rig_with("cloud", Timeouts::default(), |t| {
        t.insert("settle_ms".into(), 300.into());
    })
    .await;
    rig.sim.faults.set_search_lag(Duration::from_millis(200));
    rig.create("k-fresh").await;
    let report = rig
        .jira
        .execute(CLOSE, "k-close", &json!({"ticket_key": "k-fresh"}))
        .await;
    assert_eq!(
        confirmed_ref(&rig.classify(CLOSE, &report)),
        "SUP-1",
        "the second look after settle_ms finds it"
    );
}

#[tokio::test]
async fn a_done_transition_that_does_not_exist_is_not_executed_naming_the_setting() {
    let rig = rig_with("cloud", Timeouts::default(), |t| {
        t.insert("done_transition".into(), "Shipped".into());
    })
    .await;
    rig.create("k-ship").await;
    let report = rig
        .jira
        .execute(CLOSE, "k-close", &json!({"ticket_key": "k-ship"}))
        .await;
    let Classified::NotExecuted { reason } = rig.classify(CLOSE, &report) else {
        panic!("{report:?}")
    };
    assert!(reason.contains("\"Shipped\""), "{reason}");
    assert!(reason.contains("done_transition"), "{reason}");
    assert!(reason.contains("Done"), "lists what is available: {reason}");
    assert_eq!(rig.effects("issue.transitioned"), 0);
}

#[tokio::test]
async fn the_simulator_speaks_jiras_errors_and_auth_rules() {
    let rig = rig("cloud").await;
    let base = rig.running.base_url();
    let client = reqwest::Client::new();

    let anonymous = client
        .post(format!("{base}/rest/api/3/search/jql"))
        .json(&json!({"jql": "labels = x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let bearer_on_cloud = client
        .get(format!("{base}/rest/api/3/issue/SUP-1"))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(bearer_on_cloud.status(), 401, "v3 wants Basic");
    let bearer_on_v2 = client
        .get(format!("{base}/rest/api/2/issue/SUP-9"))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(bearer_on_v2.status(), 404, "v2 accepts a PAT");
    let missing: Value = bearer_on_v2.json().await.unwrap();
    assert_eq!(
        missing["errorMessages"][0],
        "Issue does not exist or you do not have permission to see it."
    );

    let unsupported = rig
        .raw(reqwest::Method::POST, "/search/jql")
        .json(&json!({"jql": "status = Done"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unsupported.status(), 400);
    let body: Value = unsupported.json().await.unwrap();
    assert!(body["errorMessages"][0]
        .as_str()
        .unwrap()
        .contains("status"));
    assert_eq!(body["errors"], json!({}));

    rig.create("k-sim").await;
    let invalid = rig
        .raw(reqwest::Method::POST, "/issue/SUP-1/transitions")
        .json(&json!({"transition": {"id": "99"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 400);
    let body: Value = invalid.json().await.unwrap();
    assert_eq!(
        body["errorMessages"][0],
        "Transition id '99' is not valid for this issue."
    );

    let v2_description = rig
        .raw(reqwest::Method::POST, "/issue")
        .json(&json!({"fields": {"project": {"key": "SUP"}, "summary": "x", "issuetype": {"name": "Task"}, "description": "plain"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        v2_description.status(),
        400,
        "v3 refuses a plain-string description"
    );

    let ids_only: Value = rig
        .raw(reqwest::Method::POST, "/search/jql")
        .json(&json!({"jql": "project = SUP"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        ids_only["issues"][0].get("fields"),
        None,
        "only ids unless fields are asked"
    );
    assert_eq!(ids_only["isLast"], true);
}

#[tokio::test]
async fn settings_mistakes_name_the_connector_and_the_field() {
    let mut table = toml::Table::new();
    table.insert("base_url".into(), "ftp://jira.example".into());
    table.insert("flavour".into(), "cloud".into());
    table.insert("email_env".into(), "SAGA_TEST_JIRA_UNSET_EMAIL".into());
    table.insert("api_token_env".into(), env_var(SECRET).into());
    table.insert("token_env".into(), env_var(SECRET).into());
    table.insert("transition".into(), "Done".into());
    let mistakes =
        JiraConnector::from_settings(&table, Wire::new(&Timeouts::default())).unwrap_err();
    let all = mistakes.join("\n");
    for expected in [
        "connector `jira`, field `base_url`",
        "connector `jira`: field `project` is missing",
        "connector `jira`, field `email_env`: the environment variable SAGA_TEST_JIRA_UNSET_EMAIL is not set",
        "connector `jira`, field `token_env`",
        "connector `jira`: unknown field `transition`",
    ] {
        assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
    }
    assert!(!all.contains(SECRET));

    let mut flavourless = settings("datacenter", "http://127.0.0.1:1");
    flavourless.insert("flavour".into(), "onprem".into());
    let mistakes =
        JiraConnector::from_settings(&flavourless, Wire::new(&Timeouts::default())).unwrap_err();
    assert!(mistakes[0].contains("field `flavour`"), "{mistakes:?}");

    let mut set = toml::Table::new();
    set.insert("jira".into(), toml::Value::Table(table));
    let Err(mistakes) = ConnectorSet::from_settings(&set, &Wire::new(&Timeouts::default())) else {
        panic!("a broken jira table must not build")
    };
    assert!(
        mistakes.iter().all(|m| m.contains("`jira`")),
        "{mistakes:?}"
    );
}

#[tokio::test]
async fn the_connector_set_routes_the_jira_operations() {
    let mut set = toml::Table::new();
    set.insert(
        "jira".into(),
        toml::Value::Table(settings("cloud", "http://127.0.0.1:1")),
    );
    let connectors = ConnectorSet::from_settings(&set, &Wire::new(&Timeouts::default())).unwrap();
    let operations: Vec<&str> = connectors.operations().collect();
    assert_eq!(operations, vec![CLOSE, CREATE_ISSUE, REOPEN]);
    assert!(connectors.has_lookup(CLOSE));
}

#[tokio::test]
async fn a_credential_never_appears_in_errors_reports_or_debug_output() {
    for flavour in FLAVOURS {
        let rig = rig(flavour).await;
        assert!(!format!("{:?}", rig.jira).contains(SECRET), "{flavour}");
        rig.inject(
            "POST",
            "/issue",
            Fault::Reject {
                status: 401,
                message: "Client must be authenticated to access this resource.".into(),
            },
        );
        let refused = rig.create("k-auth").await;
        let closed = rig
            .jira
            .execute(CLOSE, "k-c", &json!({"ticket_key": "k-none"}))
            .await;
        for report in [&refused, &closed] {
            assert!(!format!("{report:?}").contains(SECRET));
            let classified = rig.classify(CLOSE, report);
            assert!(!format!("{classified:?}").contains(SECRET));
        }
    }
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let jira =
        JiraConnector::from_settings(&settings("cloud", &url), Wire::new(&Timeouts::default()))
            .unwrap();
    let report = jira
        .execute(CREATE_ISSUE, "k", &json!({"summary": "x"}))
        .await;
    assert!(!format!("{report:?}").contains(SECRET));
    let lookup = jira.lookup(CREATE_ISSUE, "k", &json!({})).await;
    assert!(!format!("{lookup:?}").contains(SECRET));
}
