//! The generic HTTP connector against the back-office and warehouse
//! simulators, over real sockets: R4 for every failure shape those APIs
//! produce, R5 (the key travels as `Idempotency-Key` and as the reference),
//! R7 (lookup by key), and the ways back declared in tools/support.toml.

use crate::common;

use saga_harness::connectors::http::HttpConnector;
use saga_harness::connectors::wire::{Timeouts, Wire};
use saga_harness::saga::connector::{classify, CallReport, Classified, Connector, Lookup};
use saga_harness::sim::{self, Fault, FaultRule, Running, SimState};
use serde_json::{json, Value};
use std::time::Duration;

struct Backoffice {
    orders: SimState,
    warehouse: SimState,
    _servers: (Running, Running),
    connector: HttpConnector,
}

/// The simulators on port 0 and the connector built from the shipped tools
/// file, its base URLs pointed at them.
async fn backoffice(request_timeout: Duration) -> Backoffice {
    let orders = SimState::default();
    let warehouse = SimState::default();
    let loopback = "127.0.0.1:0".parse().unwrap();
    let orders_server = sim::serve(sim::orders::router(&orders), loopback)
        .await
        .unwrap();
    let warehouse_server = sim::serve(sim::warehouse::router(&warehouse), loopback)
        .await
        .unwrap();
    let text = std::fs::read_to_string("tools/support.toml").unwrap();
    let mut file: toml::Table = toml::from_str(&text).unwrap();
    let http = file["connectors"]["http"].as_table_mut().unwrap().clone();
    let mut http = http;
    http["orders"]["base_url"] = toml::Value::String(orders_server.base_url());
    http["warehouse"]["base_url"] = toml::Value::String(warehouse_server.base_url());
    file.clear();
    let wire = Wire::new(&Timeouts {
        connect: Duration::from_secs(2),
        request: request_timeout,
        ..Timeouts::default()
    });
    let connector = HttpConnector::from_settings(&http, wire).unwrap();
    Backoffice {
        orders,
        warehouse,
        _servers: (orders_server, warehouse_server),
        connector,
    }
}

fn draft_args() -> Value {
    json!({"to": "ada@example.com", "subject": "Your kettle", "body": "We are sorry."})
}

fn judged(connector: &HttpConnector, operation: &str, report: &CallReport) -> Classified {
    classify(report, |body| connector.external_ref(operation, body))
}

#[tokio::test]
async fn a_pure_read_returns_the_systems_answer() {
    let b = backoffice(Duration::from_secs(5)).await;
    let report = b
        .connector
        .execute("orders.search_orders", "", &json!({"customer": "cus_ada"}))
        .await;
    let CallReport::Answered {
        status: 200,
        body: Some(body),
        ..
    } = report
    else {
        panic!("{report:?}");
    };
    assert_eq!(body["data"][0]["id"], "ord_1001");
    assert!(b.orders.ledger.effects().is_empty(), "a read has no effect");
}

#[tokio::test]
async fn r5_the_key_travels_as_idempotency_key_and_reference_and_a_retry_is_replayed() {
    let b = backoffice(Duration::from_secs(5)).await;
    let first = b
        .connector
        .execute("orders.create_draft", "k-draft-1", &draft_args())
        .await;
    let Classified::Confirmed {
        external_ref,
        result,
    } = judged(&b.connector, "orders.create_draft", &first)
    else {
        panic!("{first:?}");
    };
    assert_eq!(external_ref, "dr_1");
    assert_eq!(result["reference"], "k-draft-1");
    let again = b
        .connector
        .execute("orders.create_draft", "k-draft-1", &draft_args())
        .await;
    assert_eq!(again, first, "the system replays the first answer");
    let created = b.orders.ledger.of("draft.created");
    assert_eq!(created.len(), 1, "one effect for one key");
    assert_eq!(created[0].key.as_deref(), Some("k-draft-1"));
}

#[tokio::test]
async fn r4_commit_then_504_is_unknown_and_r7_lookup_finds_it() {
    let b = backoffice(Duration::from_secs(5)).await;
    b.orders
        .faults
        .inject(FaultRule::new("POST", "/v1/drafts", Fault::CommitThen504));
    let report = b
        .connector
        .execute("orders.create_draft", "k-504", &draft_args())
        .await;
    assert!(matches!(
        judged(&b.connector, "orders.create_draft", &report),
        Classified::Unknown { .. }
    ));
    let found = b
        .connector
        .lookup("orders.create_draft", "k-504", &draft_args())
        .await
        .unwrap();
    assert!(
        matches!(&found, Lookup::FoundSucceeded { external_ref, .. } if external_ref == "dr_1"),
        "{found:?}"
    );
    assert_eq!(b.orders.ledger.of("draft.created").len(), 1);
}

#[tokio::test]
async fn r4_reset_after_commit_and_a_blank_page_are_unknown_and_the_effect_exists() {
    let b = backoffice(Duration::from_secs(5)).await;
    b.warehouse.faults.inject(FaultRule::new(
        "POST",
        "/v1/shipments",
        Fault::ResetAfterCommit,
    ));
    let args = json!({"order_id": "ord_1001", "items": ["KETTLE-2"]});
    let reset = b
        .connector
        .execute("warehouse.reship", "k-reset", &args)
        .await;
    assert!(
        matches!(reset, CallReport::ResetAfterSend),
        "a dropped connection after the request is a reset: {reset:?}"
    );
    b.warehouse.faults.inject(FaultRule::new(
        "POST",
        "/v1/shipments",
        Fault::CommitThenBlank,
    ));
    let blank = b
        .connector
        .execute("warehouse.reship", "k-blank", &args)
        .await;
    assert!(matches!(
        judged(&b.connector, "warehouse.reship", &blank),
        Classified::Unknown { .. }
    ));
    for key in ["k-reset", "k-blank"] {
        let found = b
            .connector
            .lookup("warehouse.reship", key, &args)
            .await
            .unwrap();
        assert!(
            matches!(found, Lookup::FoundSucceeded { .. }),
            "{key}: {found:?}"
        );
    }
    assert_eq!(b.warehouse.ledger.of("shipment.created").len(), 2);
}

#[tokio::test]
async fn r4_a_timeout_is_unknown_never_failed() {
    let b = backoffice(Duration::from_millis(300)).await;
    b.orders.faults.inject(FaultRule::new(
        "POST",
        "/v1/drafts",
        Fault::Delay { ms: 1500 },
    ));
    let report = b
        .connector
        .execute("orders.create_draft", "k-slow", &draft_args())
        .await;
    assert_eq!(report, CallReport::TimedOut);
    assert!(matches!(
        judged(&b.connector, "orders.create_draft", &report),
        Classified::Unknown { .. }
    ));
    // The effect landed although the answer never came.
    common::until("the draft the timed-out call made", || async {
        (!b.orders.ledger.of("draft.created").is_empty()).then_some(())
    })
    .await;
    assert_eq!(b.orders.ledger.of("draft.created").len(), 1);
}

#[tokio::test]
async fn r4_a_4xx_is_failed_a_429_and_a_refused_connection_are_not_executed() {
    let b = backoffice(Duration::from_secs(5)).await;
    b.orders.faults.inject(FaultRule::new(
        "POST",
        "/v1/drafts",
        Fault::Reject {
            status: 422,
            message: "subject too long".into(),
        },
    ));
    let rejected = b
        .connector
        .execute("orders.create_draft", "k-422", &draft_args())
        .await;
    assert_eq!(
        judged(&b.connector, "orders.create_draft", &rejected),
        Classified::Failed {
            error: "HTTP 422: subject too long".into()
        }
    );
    b.orders
        .faults
        .inject(FaultRule::new("POST", "/v1/drafts", Fault::RateLimit));
    let limited = b
        .connector
        .execute("orders.create_draft", "k-429", &draft_args())
        .await;
    assert!(matches!(
        judged(&b.connector, "orders.create_draft", &limited),
        Classified::NotExecuted { .. }
    ));
    assert!(b.orders.ledger.effects().is_empty(), "nothing happened");

    // A port nobody listens on: the request never left.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let settings: toml::Table = toml::from_str(&format!(
        r#"[orders]
        base_url = "http://127.0.0.1:{port}"
        [orders.operations.create_draft]
        method = "POST"
        path = "/v1/drafts"
        ref = "/id""#
    ))
    .unwrap();
    let nowhere = HttpConnector::from_settings(&settings, Wire::new(&Timeouts::default())).unwrap();
    let report = nowhere
        .execute("orders.create_draft", "k-refused", &draft_args())
        .await;
    assert!(matches!(report, CallReport::NotSent { .. }), "{report:?}");
}

#[tokio::test]
async fn r7_search_lag_hides_a_new_effect_until_it_settles_and_never_done_is_not_found() {
    let b = backoffice(Duration::from_secs(5)).await;
    b.orders.faults.set_search_lag(Duration::from_millis(400));
    b.connector
        .execute("orders.create_draft", "k-lag", &draft_args())
        .await;
    let early = b
        .connector
        .lookup("orders.create_draft", "k-lag", &draft_args())
        .await
        .unwrap();
    assert_eq!(early, Lookup::NotFound, "the index has not caught up");
    common::until("the index to catch up", || async {
        let later = b
            .connector
            .lookup("orders.create_draft", "k-lag", &draft_args())
            .await
            .unwrap();
        matches!(later, Lookup::FoundSucceeded { .. }).then_some(())
    })
    .await;
    let never = b
        .connector
        .lookup("orders.create_draft", "k-never", &draft_args())
        .await
        .unwrap();
    assert_eq!(never, Lookup::NotFound);
}

#[tokio::test]
async fn r6_the_undo_finds_the_draft_by_the_original_key_and_twice_is_still_done() {
    let b = backoffice(Duration::from_secs(5)).await;
    b.connector
        .execute("orders.create_draft", "k-step", &draft_args())
        .await;
    let undo_args = json!({"draft_key": "k-step"});
    let before = b
        .connector
        .lookup("orders.delete_draft", "k-undo", &undo_args)
        .await
        .unwrap();
    assert_eq!(before, Lookup::NotFound, "not deleted yet");
    for _ in 0..2 {
        let report = b
            .connector
            .execute("orders.delete_draft", "k-undo", &undo_args)
            .await;
        assert!(
            matches!(
                judged(&b.connector, "orders.delete_draft", &report),
                Classified::Confirmed { .. }
            ),
            "{report:?}"
        );
    }
    assert_eq!(b.orders.ledger.of("draft.deleted").len(), 1);
    let after = b
        .connector
        .lookup("orders.delete_draft", "k-undo", &undo_args)
        .await
        .unwrap();
    assert!(matches!(after, Lookup::FoundSucceeded { .. }));
    let missing = b
        .connector
        .execute(
            "orders.delete_draft",
            "k-undo2",
            &json!({"draft_key": "nope"}),
        )
        .await;
    assert!(matches!(
        judged(&b.connector, "orders.delete_draft", &missing),
        Classified::Failed { .. }
    ));
}

#[test]
fn settings_mistakes_are_each_named_and_a_token_is_never_echoed() {
    std::env::set_var("SAGA_TEST_HTTP_TOKEN", "tok_s3cr3t_value");
    let settings: toml::Table = toml::from_str(
        r#"
        [desk]
        base_url = "ftp://desk.example"
        [crm]
        base_url = "http://crm.example"
        token_env = "SAGA_TEST_HTTP_TOKEN"
        [crm.operations.note]
        method = "FETCH"
        path = "notes"
        [crm.operations.log]
        method = "POST"
        path = "/log"
        lookup = { path = "/log", found = "data", ref = "/id" }
        [crm.operations.vanish]
        method = "POST"
        path = "/x"
        ref = "/id"
        surprise = true
        [ghost]
        base_url = "http://ghost.example"
        token_env = "SAGA_TEST_HTTP_TOKEN_UNSET"
        [ghost.operations.boo]
        method = "GET"
        path = "/boo"
        "#,
    )
    .unwrap();
    let mistakes =
        HttpConnector::from_settings(&settings, Wire::new(&Timeouts::default())).unwrap_err();
    let all = mistakes.join("\n");
    for expected in [
        "connector `http.desk`, field `base_url`",
        "operation `crm.note`, field `method`",
        "operation `crm.note`, field `path`",
        "operation `crm.log`, field `ref`",
        "operation `crm.log`, field `lookup.found`",
        "operation `crm.log`, field `lookup.path`",
        "surprise",
        "SAGA_TEST_HTTP_TOKEN_UNSET is not set",
    ] {
        assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
    }
    assert!(!all.contains("tok_s3cr3t_value"));

    let good: toml::Table = toml::from_str(
        r#"
        [crm]
        base_url = "http://crm.example"
        token_env = "SAGA_TEST_HTTP_TOKEN"
        [crm.operations.note]
        method = "GET"
        path = "/notes"
        "#,
    )
    .unwrap();
    let connector = HttpConnector::from_settings(&good, Wire::new(&Timeouts::default())).unwrap();
    assert!(!format!("{connector:?}").contains("tok_s3cr3t_value"));
}

/// A stub service that records every request it gets: answers each
/// `/svc/items/{id}` with that id, redirects `/svc/moved` to another host,
/// and answers `/svc/huge` with `size` bytes, declaring the length or not.
mod stub {
    use axum::body::Body;
    use axum::extract::{Path, State};
    use axum::http::{header, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::any;
    use axum::{Json, Router};
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    pub struct Seen(pub Arc<Mutex<Vec<String>>>);

    impl Seen {
        pub fn paths(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    pub const HUGE: usize = 50 * 1024 * 1024;

    /// Serves on port 0; returns its base URL.
    pub async fn serve(seen: Seen, redirect_to: Option<String>) -> String {
        let record = |seen: &Seen, uri: &axum::http::Uri| {
            let path = percent_encoding::percent_decode_str(uri.path()).decode_utf8_lossy();
            seen.0.lock().unwrap().push(path.into_owned());
        };
        let app = Router::new()
            .route(
                "/svc/items/{id}",
                any(
                    move |State(seen): State<Seen>,
                          uri: axum::http::Uri,
                          Path(id): Path<String>| async move {
                        record(&seen, &uri);
                        Json(json!({"id": id}))
                    },
                ),
            )
            .route(
                "/svc/moved",
                any(
                    move |State(seen): State<Seen>, uri: axum::http::Uri| async move {
                        record(&seen, &uri);
                        let to = redirect_to.clone().unwrap_or_default();
                        (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, to)]).into_response()
                    },
                ),
            )
            .route(
                "/svc/huge/{declared}",
                any(
                    move |State(seen): State<Seen>,
                          uri: axum::http::Uri,
                          Path(declared): Path<String>| async move {
                        record(&seen, &uri);
                        let chunk = axum::body::Bytes::from(vec![b'x'; 64 * 1024]);
                        let chunks = HUGE / chunk.len();
                        let stream = futures::stream::iter(
                            (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
                        );
                        let mut response = Response::new(Body::from_stream(stream));
                        if declared == "declared" {
                            response
                                .headers_mut()
                                .insert(header::CONTENT_LENGTH, HUGE.into());
                        }
                        response
                    },
                ),
            )
            .fallback(any(
                move |State(seen): State<Seen>, uri: axum::http::Uri| async move {
                    record(&seen, &uri);
                    Json(json!({"id": "outside"}))
                },
            ))
            .with_state(seen);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }
}

/// The connector over the stub, base URL `{stub}/svc`, with a 1 MiB answer
/// limit.
fn stub_connector(base: &str) -> HttpConnector {
    let settings: toml::Table = toml::from_str(&format!(
        r#"
[svc]
base_url = "{base}/svc"

[svc.operations.touch]
method = "POST"
path = "/items/{{args.id}}"
ref = "/id"

[svc.operations.moved]
method = "POST"
path = "/moved"
body = {{ note = "{{args.note}}" }}
idempotency_header = "Idempotency-Key"
ref = "/id"

[svc.operations.huge]
method = "POST"
path = "/huge/{{args.declared}}"
ref = "/id"
"#
    ))
    .unwrap();
    let wire = Wire::new(&Timeouts {
        max_answer_bytes: 1024 * 1024,
        ..Timeouts::default()
    });
    HttpConnector::from_settings(&settings, wire).unwrap()
}

#[tokio::test]
async fn an_argument_cannot_climb_out_of_the_services_path() {
    let seen = stub::Seen::default();
    let base = stub::serve(seen.clone(), None).await;
    let connector = stub_connector(&base);
    for id in ["..", ".", "../../secret", "..\\secret"] {
        let report = connector
            .execute("svc.touch", "k-climb", &json!({ "id": id }))
            .await;
        assert!(
            matches!(&report, CallReport::NotSent { reason } if reason.contains("segment")),
            "{id:?}: {report:?}"
        );
    }
    assert!(seen.paths().is_empty(), "reached: {:?}", seen.paths());
    // An ordinary value, dots inside it included, goes where it should.
    let report = connector
        .execute("svc.touch", "k-fine", &json!({ "id": "v1.2..3" }))
        .await;
    assert!(
        matches!(&report, CallReport::Answered { status: 200, .. }),
        "{report:?}"
    );
    assert_eq!(seen.paths(), vec!["/svc/items/v1.2..3".to_owned()]);
}

#[tokio::test]
async fn a_redirect_is_an_answer_and_is_never_followed() {
    let elsewhere = stub::Seen::default();
    let other = stub::serve(elsewhere.clone(), None).await;
    let seen = stub::Seen::default();
    let base = stub::serve(seen.clone(), Some(format!("{other}/stolen"))).await;
    let connector = stub_connector(&base);
    let report = connector
        .execute("svc.moved", "k-moved", &json!({"note": "refund"}))
        .await;
    assert!(
        matches!(&report, CallReport::Answered { status: 307, .. }),
        "{report:?}"
    );
    assert!(
        matches!(
            judged(&connector, "svc.moved", &report),
            Classified::Unknown { .. }
        ),
        "the request arrived, so its effect is unknown until looked up"
    );
    assert_eq!(seen.paths(), vec!["/svc/moved".to_owned()]);
    assert!(
        elsewhere.paths().is_empty(),
        "the body and key went to another host: {:?}",
        elsewhere.paths()
    );
}

#[tokio::test]
async fn an_answer_past_the_limit_is_cut_and_says_so() {
    let seen = stub::Seen::default();
    let base = stub::serve(seen.clone(), None).await;
    let connector = stub_connector(&base);
    for declared in ["declared", "streamed"] {
        let report = connector
            .execute("svc.huge", "k-huge", &json!({ "declared": declared }))
            .await;
        let CallReport::Answered {
            status: 200,
            body: Some(body),
            ..
        } = &report
        else {
            panic!("{declared}: {report:?}");
        };
        let said = body["answer_cut"].as_str().unwrap_or_default();
        assert!(said.contains("1048576-byte limit"), "{declared}: {body}");
        let kept = serde_json::to_string(body).unwrap().len();
        assert!(kept < 4096, "{declared}: {kept} bytes kept");
        if declared == "declared" {
            assert!(said.contains(&stub::HUGE.to_string()), "{said}");
        }
        assert!(
            matches!(
                judged(&connector, "svc.huge", &report),
                Classified::Unknown { .. }
            ),
            "a 2xx whose reference was cut off is unknown: {declared}"
        );
    }
}
