//! The Slack connector against the Slack simulator over real HTTP: the key
//! travels in message metadata (R5), every answer Slack can give is judged
//! by the R4 table, lookups find posts by key (R7), and a post is undone by
//! deleting it.
#![cfg(feature = "ssr")]

use crate::common;

use saga_harness::connectors::slack::SlackConnector;
use saga_harness::connectors::wire::{Timeouts, Wire};
use saga_harness::connectors::ConnectorSet;
use saga_harness::saga::connector::{classify, CallReport, Classified, Connector, Lookup};
use saga_harness::sim::{self, Fault, FaultRule, Running, SimState};
use serde_json::{json, Value};
use std::time::Duration;

const POST: &str = "slack.post";
const DELETE: &str = "slack.delete";

struct World {
    running: Running,
    sim: SimState,
    slack: SlackConnector,
    token: String,
}

fn settings(base_url: &str, token_var: &str) -> toml::Table {
    let mut table = toml::Table::new();
    table.insert("base_url".into(), base_url.into());
    table.insert("token_env".into(), token_var.into());
    table
}

/// A fresh simulator and a connector pointing at it, with a token in an
/// environment variable named for the test.
async fn world(test: &str) -> World {
    world_with(test, Timeouts::default(), None).await
}

async fn world_with(test: &str, timeouts: Timeouts, history_pages: Option<i64>) -> World {
    let sim = SimState::default();
    let running = sim::serve(sim::slack_app::router(&sim), "127.0.0.1:0".parse().unwrap())
        .await
        .expect("slack simulator starts");
    let variable = format!("SAGA_TEST_SLACK_TOKEN_{}", test.to_uppercase());
    let token = format!("xoxb-{test}-s3cr3t-t0ken");
    std::env::set_var(&variable, &token);
    let mut table = settings(&running.base_url(), &variable);
    if let Some(pages) = history_pages {
        table.insert("history_pages".into(), toml::Value::Integer(pages));
    }
    let slack =
        SlackConnector::from_settings(&table, Wire::new(&timeouts)).expect("valid slack settings");
    World {
        running,
        sim,
        slack,
        token,
    }
}

impl World {
    fn judge(&self, operation: &str, report: &CallReport) -> Classified {
        classify(report, |body| self.slack.external_ref(operation, body))
    }

    fn posted(&self) -> Vec<sim::Effect> {
        self.sim.ledger.of("message.posted")
    }

    /// The channel's history as Slack lists it, read with a plain client.
    async fn history(&self, channel: &str, with_metadata: bool) -> Value {
        reqwest::Client::new()
            .get(format!(
                "{}/api/conversations.history",
                self.running.base_url()
            ))
            .bearer_auth(&self.token)
            .query(&[
                ("channel", channel),
                (
                    "include_all_metadata",
                    if with_metadata { "true" } else { "false" },
                ),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Injects a fault on `chat.postMessage`.
    fn fault_on_post(&self, fault: Fault) {
        self.sim
            .faults
            .inject(FaultRule::new("POST", "/api/chat.postMessage", fault));
    }

    /// After an unknown post: the lookup finds it, and it happened once.
    async fn lookup_finds_exactly_one(&self, key: &str, args: &Value) {
        match self
            .slack
            .lookup(POST, key, args)
            .await
            .expect("lookup answers")
        {
            Lookup::FoundSucceeded {
                external_ref,
                result,
            } => {
                assert!(external_ref.starts_with("C0SUPPORT1:"), "{external_ref}");
                assert_eq!(
                    result["message"]["metadata"]["event_payload"]["saga_key"],
                    key
                );
            }
            other => panic!("expected the post to be found, got {other:?}"),
        }
        let posted = self.posted();
        assert_eq!(posted.len(), 1, "{posted:?}");
        assert_eq!(posted[0].key.as_deref(), Some(key));
    }
}

fn support_post(text: &str) -> Value {
    json!({"channel": "C0SUPPORT1", "text": text})
}

fn failed_with(classified: &Classified, code: &str) -> bool {
    matches!(classified, Classified::Failed { error } if error.contains(code))
}

#[tokio::test]
async fn r5_key_travels_in_message_metadata_and_the_ref_is_channel_and_ts() {
    let w = world("r5meta").await;
    let report = w
        .slack
        .execute(POST, "k-r5-1", &support_post("Refund issued"))
        .await;
    let Classified::Confirmed {
        external_ref,
        result,
    } = w.judge(POST, &report)
    else {
        panic!("{report:?}");
    };
    let ts = result["ts"].as_str().unwrap();
    assert_eq!(external_ref, format!("C0SUPPORT1:{ts}"));

    let posted = w.posted();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].key.as_deref(), Some("k-r5-1"));
    assert_eq!(posted[0].object, external_ref);

    // The metadata is stored with the message and listed only on request.
    let with = w.history("C0SUPPORT1", true).await;
    assert_eq!(with["messages"][0]["metadata"]["event_type"], "saga_step");
    assert_eq!(
        with["messages"][0]["metadata"]["event_payload"]["saga_key"],
        "k-r5-1"
    );
    let without = w.history("C0SUPPORT1", false).await;
    assert!(without["messages"][0].get("metadata").is_none());
}

#[tokio::test]
async fn a_correction_shaped_post_to_a_channel_name_lands_and_is_found_by_key() {
    let w = world("correction").await;
    let args = json!({"to": ["#support"], "body": "Correction: the refund was 12.00"});
    let report = w.slack.execute(POST, "k-corr-1", &args).await;
    let Classified::Confirmed { external_ref, .. } = w.judge(POST, &report) else {
        panic!("{report:?}");
    };
    assert!(external_ref.starts_with("C0SUPPORT1:"));
    let found = w.slack.lookup(POST, "k-corr-1", &args).await.unwrap();
    assert!(
        matches!(&found, Lookup::FoundSucceeded { external_ref: r, .. } if *r == external_ref),
        "{found:?}"
    );
}

#[tokio::test]
async fn r4_commit_then_504_is_unknown_and_lookup_finds_it() {
    let w = world("r4c504").await;
    w.fault_on_post(Fault::CommitThen504);
    let args = support_post("hello");
    let report = w.slack.execute(POST, "k-504", &args).await;
    assert!(
        matches!(w.judge(POST, &report), Classified::Unknown { .. }),
        "{report:?}"
    );
    w.lookup_finds_exactly_one("k-504", &args).await;
}

#[tokio::test]
async fn r4_reset_after_commit_is_unknown_and_lookup_finds_it() {
    let w = world("r4reset").await;
    w.fault_on_post(Fault::ResetAfterCommit);
    let args = support_post("hello");
    let report = w.slack.execute(POST, "k-reset", &args).await;
    assert!(
        matches!(w.judge(POST, &report), Classified::Unknown { .. }),
        "{report:?}"
    );
    w.lookup_finds_exactly_one("k-reset", &args).await;
}

#[tokio::test]
async fn r4_commit_then_blank_is_unknown_and_lookup_finds_it() {
    let w = world("r4blank").await;
    w.fault_on_post(Fault::CommitThenBlank);
    let args = support_post("hello");
    let report = w.slack.execute(POST, "k-blank", &args).await;
    assert!(
        matches!(w.judge(POST, &report), Classified::Unknown { .. }),
        "{report:?}"
    );
    w.lookup_finds_exactly_one("k-blank", &args).await;
}

#[tokio::test]
async fn r4_answer_slower_than_the_timeout_is_unknown_and_lookup_finds_it() {
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_millis(300),
        ..Timeouts::default()
    };
    let w = world_with("r4slow", timeouts, None).await;
    w.fault_on_post(Fault::Delay { ms: 1200 });
    let args = support_post("hello");
    let report = w.slack.execute(POST, "k-slow", &args).await;
    assert_eq!(report, CallReport::TimedOut);
    assert!(matches!(w.judge(POST, &report), Classified::Unknown { .. }));
    w.lookup_finds_exactly_one("k-slow", &args).await;
}

#[tokio::test]
async fn r4_slack_in_band_refusals_are_failed_and_nothing_is_posted() {
    let w = world("r4inband").await;
    let cases = [
        (
            json!({"channel": "C0NOSUCH01", "text": "x"}),
            "channel_not_found",
        ),
        (json!({"channel": "#random", "text": "x"}), "not_in_channel"),
        (json!({"channel": "C0ARCHIVE1", "text": "x"}), "is_archived"),
        (json!({"channel": "C0SUPPORT1", "text": ""}), "no_text"),
        (
            json!({"channel": "C0SUPPORT1", "text": "x".repeat(40_001)}),
            "msg_too_long",
        ),
    ];
    for (args, code) in cases {
        let report = w.slack.execute(POST, "k-refused", &args).await;
        assert!(
            failed_with(&w.judge(POST, &report), code),
            "{code}: {report:?}"
        );
    }
    assert!(w.posted().is_empty());
}

#[tokio::test]
async fn r4_a_wrong_token_is_invalid_auth_and_failed() {
    let w = world("r4auth").await;
    std::env::set_var("SAGA_TEST_SLACK_TOKEN_R4AUTH_WRONG", "not-a-slack-token");
    let table = settings(&w.running.base_url(), "SAGA_TEST_SLACK_TOKEN_R4AUTH_WRONG");
    let wrong = SlackConnector::from_settings(&table, Wire::new(&Timeouts::default())).unwrap();
    let report = wrong.execute(POST, "k-auth", &support_post("x")).await;
    let judged = classify(&report, |b| wrong.external_ref(POST, b));
    assert!(failed_with(&judged, "invalid_auth"), "{report:?}");
    assert!(matches!(report, CallReport::Answered { status: 401, .. }));

    // No token at all is `not_authed`, still in-band.
    let raw = reqwest::Client::new()
        .post(format!("{}/api/chat.postMessage", w.running.base_url()))
        .json(&support_post("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    let body: Value = raw.json().await.unwrap();
    assert_eq!(body, json!({"ok": false, "error": "not_authed"}));
    assert!(w.posted().is_empty());
}

#[tokio::test]
async fn r4_injected_4xx_comes_in_band_and_is_failed() {
    let w = world("r4reject").await;
    w.fault_on_post(Fault::Reject {
        status: 400,
        message: "invalid_arguments".into(),
    });
    let report = w.slack.execute(POST, "k-rej", &support_post("x")).await;
    assert!(
        failed_with(&w.judge(POST, &report), "invalid_arguments"),
        "{report:?}"
    );
    assert!(w.posted().is_empty());
}

#[tokio::test]
async fn r4_in_band_internal_and_fatal_errors_are_unknown_and_lookup_settles_them() {
    let w = world("r4maybe").await;
    for code in ["internal_error", "fatal_error"] {
        w.fault_on_post(Fault::Reject {
            status: 200,
            message: code.into(),
        });
        let args = support_post("x");
        let report = w.slack.execute(POST, "k-maybe", &args).await;
        assert!(
            matches!(report, CallReport::Answered { status: 503, .. }),
            "{report:?}"
        );
        assert!(matches!(w.judge(POST, &report), Classified::Unknown { .. }));
        // Here Slack had done nothing, and the lookup says so.
        assert_eq!(
            w.slack.lookup(POST, "k-maybe", &args).await.unwrap(),
            Lookup::NotFound
        );
    }
}

#[tokio::test]
async fn r4_http_429_ratelimited_is_not_executed() {
    let w = world("r4rate").await;
    w.fault_on_post(Fault::RateLimit);
    let report = w.slack.execute(POST, "k-rate", &support_post("x")).await;
    assert!(
        matches!(&report, CallReport::Deferred { reason, retry_after: Some(wait) }
            if reason.contains("ratelimited") && *wait == std::time::Duration::from_secs(1)),
        "{report:?}"
    );
    assert!(matches!(
        w.judge(POST, &report),
        Classified::NotExecuted { .. }
    ));

    // The simulator's 429 carries Retry-After, as Slack's does.
    w.fault_on_post(Fault::RateLimit);
    let raw = reqwest::Client::new()
        .post(format!("{}/api/chat.postMessage", w.running.base_url()))
        .bearer_auth(&w.token)
        .json(&support_post("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 429);
    assert!(raw.headers().contains_key("retry-after"));
    assert!(w.posted().is_empty());
}

#[tokio::test]
async fn r4_connection_refused_is_not_executed() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    std::env::set_var("SAGA_TEST_SLACK_TOKEN_REFUSED", "xoxb-refused-s3cr3t");
    let slack = SlackConnector::from_settings(
        &settings(&url, "SAGA_TEST_SLACK_TOKEN_REFUSED"),
        Wire::new(&Timeouts::default()),
    )
    .unwrap();
    let report = slack.execute(POST, "k-refused", &support_post("x")).await;
    let CallReport::NotSent { reason } = &report else {
        panic!("{report:?}");
    };
    assert!(!reason.contains("s3cr3t"));
    assert!(matches!(
        classify(&report, |b| slack.external_ref(POST, b)),
        Classified::NotExecuted { .. }
    ));
}

#[tokio::test]
async fn r7_lookup_under_search_lag_finds_the_post_on_the_second_look() {
    let w = world("r7lag").await;
    w.sim.faults.set_search_lag(Duration::from_millis(400));
    let args = support_post("lagging");
    w.fault_on_post(Fault::CommitThen504);
    let report = w.slack.execute(POST, "k-lag", &args).await;
    assert!(matches!(w.judge(POST, &report), Classified::Unknown { .. }));
    assert_eq!(
        w.slack.lookup(POST, "k-lag", &args).await.unwrap(),
        Lookup::NotFound
    );
    common::until("the history to catch up", || async {
        (w.slack.lookup(POST, "k-lag", &args).await.unwrap() != Lookup::NotFound).then_some(())
    })
    .await;
    w.lookup_finds_exactly_one("k-lag", &args).await;
}

#[tokio::test]
async fn r7_lookup_of_a_post_never_made_is_not_found() {
    let w = world("r7never").await;
    w.slack
        .execute(POST, "k-other", &support_post("another step's message"))
        .await;
    assert_eq!(
        w.slack
            .lookup(POST, "k-never", &support_post("x"))
            .await
            .unwrap(),
        Lookup::NotFound
    );
    // A channel that does not exist cannot hold the post either.
    assert_eq!(
        w.slack
            .lookup(
                POST,
                "k-never",
                &json!({"channel": "#nowhere", "text": "x"})
            )
            .await
            .unwrap(),
        Lookup::NotFound
    );
}

#[tokio::test]
async fn r7_lookup_pages_through_history_and_will_not_claim_absence_past_its_window() {
    let w = world_with("r7pages", Timeouts::default(), Some(2)).await;
    let args = support_post("the one we want");
    w.slack.execute(POST, "k-old", &args).await;
    for n in 0..230 {
        w.slack
            .execute(POST, &format!("k-noise-{n}"), &support_post("noise"))
            .await;
    }
    assert!(matches!(
        w.slack.lookup(POST, "k-old", &args).await.unwrap(),
        Lookup::FoundSucceeded { .. }
    ));

    // With a window of one page the message is out of sight: the lookup
    // says it cannot tell, never "not found".
    std::env::set_var("SAGA_TEST_SLACK_TOKEN_R7PAGES_ONE", &w.token);
    let mut table = settings(&w.running.base_url(), "SAGA_TEST_SLACK_TOKEN_R7PAGES_ONE");
    table.insert("history_pages".into(), toml::Value::Integer(1));
    let narrow = SlackConnector::from_settings(&table, Wire::new(&Timeouts::default())).unwrap();
    assert!(narrow.lookup(POST, "k-old", &args).await.is_err());
}

#[tokio::test]
async fn compensation_deletes_the_message_found_by_the_original_key() {
    let w = world("delete").await;
    let args = support_post("we will take this back");
    let posted = w.slack.execute(POST, "k-orig", &args).await;
    let Classified::Confirmed {
        external_ref: post_ref,
        ..
    } = w.judge(POST, &posted)
    else {
        panic!("{posted:?}");
    };
    let undo = json!({"message_key": "k-orig", "channel": "#support"});
    // Before the delete its lookup finds nothing done.
    assert_eq!(
        w.slack.lookup(DELETE, "k-undo", &undo).await.unwrap(),
        Lookup::NotFound
    );

    let report = w.slack.execute(DELETE, "k-undo", &undo).await;
    let Classified::Confirmed { external_ref, .. } = w.judge(DELETE, &report) else {
        panic!("{report:?}");
    };
    assert_eq!(external_ref, post_ref);
    let deleted = w.sim.ledger.of("message.deleted");
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].key.as_deref(), Some("k-orig"));
    assert_eq!(w.history("C0SUPPORT1", true).await["messages"], json!([]));

    assert!(matches!(
        w.slack.lookup(DELETE, "k-undo", &undo).await.unwrap(),
        Lookup::FoundSucceeded { .. }
    ));
    assert_eq!(
        w.slack.lookup(POST, "k-orig", &args).await.unwrap(),
        Lookup::NotFound
    );
}

#[tokio::test]
async fn compensation_of_a_message_already_gone_is_confirmed() {
    let w = world("deletedtwice").await;
    w.slack
        .execute(POST, "k-gone", &support_post("short-lived"))
        .await;
    let undo = json!({"message_key": "k-gone", "channel": "C0SUPPORT1"});
    let first = w.slack.execute(DELETE, "k-undo-1", &undo).await;
    assert!(matches!(
        w.judge(DELETE, &first),
        Classified::Confirmed { .. }
    ));

    // A second delete (its first answer was lost, say) finds nothing left.
    let again = w.slack.execute(DELETE, "k-undo-1", &undo).await;
    let Classified::Confirmed {
        external_ref,
        result,
    } = w.judge(DELETE, &again)
    else {
        panic!("{again:?}");
    };
    assert_eq!(external_ref, "C0SUPPORT1:absent:k-gone");
    assert_eq!(result["already_deleted"], true);
    assert_eq!(w.sim.ledger.of("message.deleted").len(), 1);

    // Slack's own `message_not_found` (deleted between look and call) is
    // success too, and keeps the message's ts.
    w.slack
        .execute(POST, "k-race", &support_post("racing"))
        .await;
    w.sim.faults.inject(FaultRule::new(
        "POST",
        "/api/chat.delete",
        Fault::Reject {
            status: 404,
            message: "message_not_found".into(),
        },
    ));
    let raced = w
        .slack
        .execute(
            DELETE,
            "k-undo-2",
            &json!({"message_key": "k-race", "channel": "C0SUPPORT1"}),
        )
        .await;
    let Classified::Confirmed { external_ref, .. } = w.judge(DELETE, &raced) else {
        panic!("{raced:?}");
    };
    assert!(!external_ref.contains("absent"), "{external_ref}");
}

#[tokio::test]
async fn r4_a_delete_whose_answer_is_lost_is_unknown_and_its_lookup_confirms_it() {
    let w = world("deletelost").await;
    w.slack.execute(POST, "k-lost", &support_post("x")).await;
    w.sim.faults.inject(FaultRule::new(
        "POST",
        "/api/chat.delete",
        Fault::CommitThen504,
    ));
    let undo = json!({"message_key": "k-lost", "channel": "C0SUPPORT1"});
    let report = w.slack.execute(DELETE, "k-undo", &undo).await;
    assert!(matches!(
        w.judge(DELETE, &report),
        Classified::Unknown { .. }
    ));
    assert!(matches!(
        w.slack.lookup(DELETE, "k-undo", &undo).await.unwrap(),
        Lookup::FoundSucceeded { .. }
    ));
    assert_eq!(w.sim.ledger.of("message.deleted").len(), 1);
}

#[tokio::test]
async fn settings_mistakes_name_the_field_and_never_show_the_token() {
    let wire = Wire::new(&Timeouts::default());
    let no_token = toml::toml! { base_url = "http://127.0.0.1:9" };
    let errors = SlackConnector::from_settings(&no_token, wire.clone()).unwrap_err();
    assert!(errors.iter().any(|e| e.contains("token_env")), "{errors:?}");

    let unset = toml::toml! { token_env = "SAGA_TEST_SLACK_TOKEN_NEVER_SET" };
    let errors = SlackConnector::from_settings(&unset, wire.clone()).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("token_env") && e.contains("SAGA_TEST_SLACK_TOKEN_NEVER_SET")),
        "{errors:?}"
    );

    std::env::set_var("SAGA_TEST_SLACK_TOKEN_SETTINGS", "xoxb-settings-s3cr3t");
    let bad_url = toml::toml! {
        base_url = "ftp://slack"
        token_env = "SAGA_TEST_SLACK_TOKEN_SETTINGS"
    };
    let errors = SlackConnector::from_settings(&bad_url, wire.clone()).unwrap_err();
    assert!(errors.iter().any(|e| e.contains("base_url")), "{errors:?}");
    assert!(errors.iter().all(|e| !e.contains("s3cr3t")));

    let unknown = toml::toml! {
        token_env = "SAGA_TEST_SLACK_TOKEN_SETTINGS"
        channel = "#general"
    };
    let errors = SlackConnector::from_settings(&unknown, wire.clone()).unwrap_err();
    assert!(errors.iter().any(|e| e.contains("channel")), "{errors:?}");

    // The default base URL is Slack's own; the token stays out of Debug.
    let fine = toml::toml! { token_env = "SAGA_TEST_SLACK_TOKEN_SETTINGS" };
    let connector = SlackConnector::from_settings(&fine, wire.clone()).unwrap();
    let shown = format!("{connector:?}");
    assert!(
        shown.contains("https://slack.com") && !shown.contains("s3cr3t"),
        "{shown}"
    );

    // The tools file's `[connectors.slack]` builds it, serving both operations.
    let mut connectors = toml::Table::new();
    connectors.insert("slack".into(), toml::Value::Table(fine));
    let set = ConnectorSet::from_settings(&connectors, &wire).unwrap();
    assert_eq!(set.operations().collect::<Vec<_>>(), vec![DELETE, POST]);
    assert!(set.has_lookup(POST) && set.has_lookup(DELETE));
}

#[tokio::test]
async fn the_token_never_appears_in_reports() {
    let w = world("tokenhidden").await;
    let bad_args = w
        .slack
        .execute(POST, "k", &json!({"text": "no channel"}))
        .await;
    let refused = w
        .slack
        .execute(POST, "k", &json!({"channel": "C0NOSUCH01", "text": "x"}))
        .await;
    for report in [bad_args, refused] {
        assert!(!format!("{report:?}").contains("s3cr3t"), "{report:?}");
    }
}
