//! The Stripe connector against the Stripe simulator over real HTTP: every
//! R4 row Stripe can produce, the key carried natively (R5), lookups by key
//! with and without the Search API (R7), and the ways back — capture,
//! cancel, refund — found by the original step's key (R8). What happened is
//! checked in the simulator's ledger, not in what the connector reported.

use saga_harness::connectors::stripe::StripeConnector;
use saga_harness::connectors::wire::{Timeouts, Wire};
use saga_harness::connectors::ConnectorSet;
use saga_harness::saga::connector::{
    classify, CallReport, Classified, Connector, Lookup, LookupError,
};
use saga_harness::sim::{self, stripe, Fault, FaultRule, Running, SimState};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A simulator on a loopback port and a connector built from settings
/// pointing at it.
struct Stripe {
    sim: SimState,
    running: Running,
    connector: StripeConnector,
    secret: String,
    http: reqwest::Client,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A credential variable no other test uses, set to `secret`.
fn credential(secret: &str) -> String {
    let variable = format!(
        "SAGA_TEST_STRIPE_KEY_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    std::env::set_var(&variable, secret);
    variable
}

fn settings(base_url: &str, variable: &str) -> toml::Table {
    toml::from_str(&format!(
        "base_url = {base_url:?}\nsecret_key_env = {variable:?}\napi_version = \"2024-06-20\"\n"
    ))
    .unwrap()
}

async fn start() -> Stripe {
    start_with(Timeouts::default(), "sk_test_4eC39HqLyjWDarjtT1zdp7dc").await
}

async fn start_with(timeouts: Timeouts, secret: &str) -> Stripe {
    let sim = SimState::default();
    let running = sim::serve(stripe::router(&sim), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let table = settings(&running.base_url(), &credential(secret));
    let connector = StripeConnector::from_settings(&table, Wire::new(&timeouts)).unwrap();
    Stripe {
        sim,
        running,
        connector,
        secret: secret.to_owned(),
        http: reqwest::Client::new(),
    }
}

/// A fresh step key, shaped like the harness's (32 hex characters).
fn key() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn payment(amount: i64) -> Value {
    json!({"customer": "cus_ana", "amount": amount, "currency": "usd"})
}

impl Stripe {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        self.connector.execute(operation, key, args).await
    }

    fn classify(&self, operation: &str, report: &CallReport) -> Classified {
        classify(report, |body| self.connector.external_ref(operation, body))
    }

    /// Executes and classifies.
    async fn call(&self, operation: &str, key: &str, args: &Value) -> Classified {
        let report = self.execute(operation, key, args).await;
        self.classify(operation, &report)
    }

    async fn confirmed(&self, operation: &str, key: &str, args: &Value) -> (String, Value) {
        match self.call(operation, key, args).await {
            Classified::Confirmed {
                external_ref,
                result,
            } => (external_ref, result),
            other => panic!("{operation} was not confirmed: {other:?}"),
        }
    }

    async fn lookup(&self, operation: &str, key: &str, args: &Value) -> Lookup {
        self.connector.lookup(operation, key, args).await.unwrap()
    }

    fn inject(&self, method: &str, path: &str, fault: Fault) {
        self.sim.faults.inject(FaultRule::new(method, path, fault));
    }

    fn effects(&self, action: &str) -> Vec<sim::Effect> {
        self.sim.ledger.of(action)
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.running.base_url()))
            .bearer_auth(&self.secret)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        form: &[(&str, &str)],
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.running.base_url()))
            .bearer_auth(&self.secret)
            .form(form);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (status, headers, response.json().await.unwrap())
    }
}

fn found_ref(found: &Lookup) -> &str {
    match found {
        Lookup::FoundSucceeded { external_ref, .. } => external_ref,
        other => panic!("expected found-succeeded, got {other:?}"),
    }
}

fn is_unknown(outcome: &Classified) -> bool {
    matches!(outcome, Classified::Unknown { .. })
}

// ---- R4 and R5: the call ------------------------------------------------

#[tokio::test]
async fn r4_an_authorization_is_confirmed_with_the_payment_intent_id() {
    let s = start().await;
    let k = key();
    let (id, body) = s
        .confirmed(
            "stripe.authorize",
            &k,
            &json!({"customer": "cus_ana", "amount": 4200, "currency": "USD", "order_id": "ord_7"}),
        )
        .await;
    assert!(id.starts_with("pi_"), "{id}");
    assert_eq!(body["status"], "requires_capture");
    assert_eq!(body["capture_method"], "manual");
    assert_eq!(body["amount_capturable"], 4200);
    assert_eq!(body["currency"], "usd");
    assert_eq!(body["metadata"]["order_id"], "ord_7");
    let created = s.effects("payment_intent.created");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].object, id);
}

#[tokio::test]
async fn r5_key_travels_as_idempotency_key_and_metadata() {
    let s = start().await;
    let k = key();
    let (id, _) = s.confirmed("stripe.charge", &k, &payment(1500)).await;
    let created = s.effects("payment_intent.created");
    assert_eq!(
        created[0].key.as_deref(),
        Some(k.as_str()),
        "the Idempotency-Key header"
    );
    let (status, intent) = s.get(&format!("/v1/payment_intents/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(intent["metadata"]["saga_key"], k.as_str());
    assert_eq!(intent["status"], "succeeded");
    assert_eq!(intent["amount_received"], 1500);
}

#[tokio::test]
async fn r5_a_repeated_call_with_its_key_replays_and_makes_no_second_effect() {
    let s = start().await;
    let k = key();
    let (first, _) = s.confirmed("stripe.charge", &k, &payment(900)).await;
    let (second, _) = s.confirmed("stripe.charge", &k, &payment(900)).await;
    assert_eq!(first, second);
    assert_eq!(s.effects("payment_intent.created").len(), 1);
}

#[tokio::test]
async fn r4_an_idempotency_error_is_unknown_and_lookup_finds_the_first_effect() {
    let s = start().await;
    let k = key();
    let (first, _) = s.confirmed("stripe.charge", &k, &payment(1000)).await;
    let report = s.execute("stripe.charge", &k, &payment(2000)).await;
    let CallReport::Answered {
        status,
        body,
        idempotency_conflict,
    } = &report
    else {
        panic!("expected an answer, got {report:?}");
    };
    assert_eq!(*status, 400);
    assert!(idempotency_conflict);
    assert_eq!(body.as_ref().unwrap()["error"]["type"], "idempotency_error");
    assert!(is_unknown(&s.classify("stripe.charge", &report)));
    let found = s.lookup("stripe.charge", &k, &payment(2000)).await;
    assert_eq!(found_ref(&found), first);
    assert_eq!(s.effects("payment_intent.created").len(), 1);
}

async fn unknown_then_found(fault: Fault, timeouts: Timeouts) {
    let s = start_with(timeouts, "sk_test_4eC39HqLyjWDarjtT1zdp7dc").await;
    s.inject("POST", "/v1/payment_intents", fault.clone());
    let k = key();
    let report = s.execute("stripe.authorize", &k, &payment(3100)).await;
    let outcome = s.classify("stripe.authorize", &report);
    assert!(is_unknown(&outcome), "{fault:?}: {report:?} → {outcome:?}");
    let found = s.lookup("stripe.authorize", &k, &payment(3100)).await;
    let created = s.effects("payment_intent.created");
    assert_eq!(created.len(), 1, "{fault:?}: exactly one effect");
    assert_eq!(found_ref(&found), created[0].object);
    assert_eq!(created[0].key.as_deref(), Some(k.as_str()));
}

#[tokio::test]
async fn r4_commit_then_504_is_unknown_and_lookup_finds_it() {
    unknown_then_found(Fault::CommitThen504, Timeouts::default()).await;
}

#[tokio::test]
async fn r4_reset_after_commit_is_unknown_and_lookup_finds_it() {
    unknown_then_found(Fault::ResetAfterCommit, Timeouts::default()).await;
}

#[tokio::test]
async fn r4_commit_then_blank_page_is_unknown_and_lookup_finds_it() {
    unknown_then_found(Fault::CommitThenBlank, Timeouts::default()).await;
}

#[tokio::test]
async fn r4_a_timeout_after_sending_is_unknown_and_lookup_finds_it() {
    let short = Timeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_millis(300),
        ..Timeouts::default()
    };
    unknown_then_found(Fault::Delay { ms: 1200 }, short).await;
}

#[tokio::test]
async fn r4_a_5xx_is_unknown_and_lookup_says_it_did_not_happen() {
    let s = start().await;
    s.inject(
        "POST",
        "/v1/payment_intents",
        Fault::Reject {
            status: 500,
            message: "An unknown error occurred".into(),
        },
    );
    let k = key();
    let report = s.execute("stripe.charge", &k, &payment(700)).await;
    assert!(is_unknown(&s.classify("stripe.charge", &report)));
    let CallReport::Answered { body, .. } = &report else {
        panic!("{report:?}")
    };
    assert_eq!(body.as_ref().unwrap()["error"]["type"], "api_error");
    assert_eq!(
        s.lookup("stripe.charge", &k, &payment(700)).await,
        Lookup::NotFound
    );
    assert!(s.effects("payment_intent.created").is_empty());
}

#[tokio::test]
async fn r4_a_4xx_is_failed_with_stripes_message_and_nothing_happened() {
    let s = start().await;
    s.inject(
        "POST",
        "/v1/payment_intents",
        Fault::Reject {
            status: 400,
            message: "No such customer: 'cus_ana'".into(),
        },
    );
    let k = key();
    let outcome = s.call("stripe.charge", &k, &payment(700)).await;
    assert_eq!(
        outcome,
        Classified::Failed {
            error: "HTTP 400: No such customer: 'cus_ana'".into()
        }
    );
    assert!(s.effects("payment_intent.created").is_empty());
    assert_eq!(
        s.lookup("stripe.charge", &k, &payment(700)).await,
        Lookup::NotFound
    );
}

#[tokio::test]
async fn r4_stripes_own_refusal_of_bad_input_is_failed() {
    let s = start().await;
    let outcome = s
        .call(
            "stripe.charge",
            &key(),
            &json!({"customer": "ana", "amount": 700, "currency": "usd"}),
        )
        .await;
    let Classified::Failed { error } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.contains("No such customer: 'ana'"), "{error}");
    assert!(s.effects("payment_intent.created").is_empty());
}

#[tokio::test]
async fn r4_429_is_not_executed_and_nothing_happened() {
    let s = start().await;
    s.inject("POST", "/v1/payment_intents", Fault::RateLimit);
    let k = key();
    let report = s.execute("stripe.charge", &k, &payment(700)).await;
    let CallReport::Deferred {
        reason,
        retry_after,
    } = &report
    else {
        panic!("{report:?}")
    };
    assert!(reason.starts_with("HTTP 429: rate limited"), "{reason}");
    assert_eq!(
        *retry_after,
        Some(std::time::Duration::from_secs(1)),
        "the wait Stripe's Retry-After asked"
    );
    assert!(matches!(
        s.classify("stripe.charge", &report),
        Classified::NotExecuted { .. }
    ));
    assert!(s.effects("payment_intent.created").is_empty());
    // Retrying after a 429 with the same key runs the call once.
    s.confirmed("stripe.charge", &k, &payment(700)).await;
    assert_eq!(s.effects("payment_intent.created").len(), 1);
}

#[tokio::test]
async fn r4_a_request_that_never_left_is_not_executed() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let table = settings(
        &format!("http://127.0.0.1:{port}"),
        &credential("sk_test_nowhere123"),
    );
    let connector =
        StripeConnector::from_settings(&table, Wire::new(&Timeouts::default())).unwrap();
    let report = connector
        .execute("stripe.charge", &key(), &payment(700))
        .await;
    assert!(
        matches!(
            classify(&report, |b| connector.external_ref("stripe.charge", b)),
            Classified::NotExecuted { .. }
        ),
        "{report:?}"
    );
    assert!(matches!(
        connector
            .lookup("stripe.charge", &key(), &payment(700))
            .await,
        Err(LookupError::Unavailable(_))
    ));
}

#[tokio::test]
async fn r4_arguments_stripe_cannot_take_are_not_sent() {
    let s = start().await;
    for args in [
        json!({"customer": "cus_ana", "amount": 12.5, "currency": "usd"}),
        json!({"customer": "cus_ana", "currency": "usd"}),
        json!({"amount": 100, "currency": "usd"}),
        json!({"customer": "cus_ana", "amount": 100, "currency": "dollars"}),
    ] {
        let report = s.execute("stripe.authorize", &key(), &args).await;
        let CallReport::NotSent { reason } = &report else {
            panic!("{args}: {report:?}")
        };
        assert!(
            reason.starts_with("stripe.authorize: argument `"),
            "{reason}"
        );
    }
    assert!(s.sim.ledger.effects().is_empty());
}

#[tokio::test]
async fn r4_a_declined_card_is_failed_and_lookup_finds_it_failed() {
    let s = start().await;
    let k = key();
    let args = json!({"customer": "cus_ana", "amount": 5000, "currency": "usd", "payment_method": "pm_card_chargeDeclined"});
    let report = s.execute("stripe.charge", &k, &args).await;
    let CallReport::Answered { status, body, .. } = &report else {
        panic!("{report:?}")
    };
    assert_eq!(*status, 402);
    let error = &body.as_ref().unwrap()["error"];
    assert_eq!(error["type"], "card_error");
    assert_eq!(error["code"], "card_declined");
    assert_eq!(error["decline_code"], "generic_decline");
    assert_eq!(error["payment_intent"]["status"], "requires_payment_method");
    assert_eq!(
        s.classify("stripe.charge", &report),
        Classified::Failed {
            error: "HTTP 402: Your card was declined.".into()
        }
    );
    assert_eq!(
        s.lookup("stripe.charge", &k, &args).await,
        Lookup::FoundFailed {
            error: "Your card was declined. (card_declined: generic_decline)".into()
        }
    );
    let created = s.effects("payment_intent.created");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].detail["status"], "requires_payment_method");
}

// ---- R7: lookup by key --------------------------------------------------

#[tokio::test]
async fn r7_under_search_lag_the_list_fallback_still_finds_it() {
    let s = start().await;
    s.sim.faults.set_search_lag(Duration::from_secs(60));
    let k = key();
    let (id, _) = s.confirmed("stripe.authorize", &k, &payment(2500)).await;
    let query = format!("metadata['saga_key']:'{k}'");
    let search = format!(
        "/v1/payment_intents/search?query={}",
        percent_encoding::utf8_percent_encode(&query, percent_encoding::NON_ALPHANUMERIC)
    );
    let (status, lagging) = s.get(&search).await;
    assert_eq!(status, 200);
    assert_eq!(lagging["object"], "search_result");
    assert_eq!(lagging["data"], json!([]), "search has not seen it yet");
    let found = s.lookup("stripe.authorize", &k, &payment(2500)).await;
    assert_eq!(found_ref(&found), id);
    // Without the customer, the fallback reads the account's recent intents.
    let cancel = s
        .lookup("stripe.cancel", &key(), &json!({"intent_key": k}))
        .await;
    assert_eq!(cancel, Lookup::NotFound, "found, but not canceled");
    s.sim.faults.set_search_lag(Duration::ZERO);
    let (_, indexed) = s.get(&search).await;
    assert_eq!(indexed["data"][0]["id"], id.as_str());
}

#[tokio::test]
async fn r7_search_finds_it_where_the_customers_list_would_not() {
    let s = start().await;
    let k = key();
    let (id, _) = s.confirmed("stripe.charge", &k, &payment(800)).await;
    // The step's arguments name another customer: listing that customer's
    // intents cannot find it, the Search API by key does.
    let elsewhere = json!({"customer": "cus_bob", "amount": 800, "currency": "usd"});
    let (_, bobs) = s.get("/v1/payment_intents?customer=cus_bob").await;
    assert_eq!(bobs["data"], json!([]));
    let found = s.lookup("stripe.charge", &k, &elsewhere).await;
    assert_eq!(found_ref(&found), id);
}

#[tokio::test]
async fn r7_lookup_of_something_never_done_is_not_found() {
    let s = start().await;
    s.confirmed("stripe.charge", &key(), &payment(100)).await;
    let never = key();
    assert_eq!(
        s.lookup("stripe.authorize", &never, &payment(100)).await,
        Lookup::NotFound
    );
    assert_eq!(
        s.lookup("stripe.charge", &never, &payment(100)).await,
        Lookup::NotFound
    );
    for (operation, args) in [
        ("stripe.capture", json!({"intent_key": never})),
        ("stripe.cancel", json!({"intent_key": never})),
        ("stripe.refund", json!({"charge_key": never})),
    ] {
        assert_eq!(
            s.lookup(operation, &key(), &args).await,
            Lookup::NotFound,
            "{operation}"
        );
    }
}

#[tokio::test]
async fn r7_a_lookup_that_cannot_reach_stripe_is_unavailable_not_not_found() {
    let s = start().await;
    s.sim.faults.inject(
        FaultRule::new(
            "GET",
            "/v1/payment_intents",
            Fault::Reject {
                status: 500,
                message: "down".into(),
            },
        )
        .times(10),
    );
    let err = s
        .connector
        .lookup("stripe.charge", &key(), &payment(100))
        .await
        .unwrap_err();
    assert!(matches!(err, LookupError::Unavailable(_)), "{err:?}");
}

// ---- R8: the ways back, by the original key -----------------------------

#[tokio::test]
async fn r8_capture_finds_the_authorization_by_its_key_and_a_second_capture_is_confirmed() {
    let s = start().await;
    let authorize = key();
    let (id, _) = s
        .confirmed("stripe.authorize", &authorize, &payment(6000))
        .await;
    let args = json!({"intent_key": authorize});
    let capture = key();
    assert_eq!(
        s.lookup("stripe.capture", &capture, &args).await,
        Lookup::NotFound
    );
    let (captured, body) = s.confirmed("stripe.capture", &capture, &args).await;
    assert_eq!(captured, id);
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["amount_received"], 6000);
    assert_eq!(
        body["metadata"]["saga_key"],
        authorize.as_str(),
        "still findable by the authorize key"
    );
    assert_eq!(body["metadata"]["saga_capture_key"], capture.as_str());
    let (again, _) = s.confirmed("stripe.capture", &key(), &args).await;
    assert_eq!(again, id);
    let effects = s.effects("payment_intent.captured");
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].key.as_deref(), Some(capture.as_str()));
    assert_eq!(
        found_ref(&s.lookup("stripe.capture", &capture, &args).await),
        id
    );
}

#[tokio::test]
async fn r8_a_capture_lost_in_a_504_is_unknown_and_lookup_finds_it() {
    let s = start().await;
    let authorize = key();
    let (id, _) = s
        .confirmed("stripe.authorize", &authorize, &payment(6000))
        .await;
    s.inject(
        "POST",
        "/v1/payment_intents/*/capture",
        Fault::CommitThen504,
    );
    let args = json!({"intent_key": authorize, "customer": "cus_ana"});
    let capture = key();
    let report = s.execute("stripe.capture", &capture, &args).await;
    assert!(
        is_unknown(&s.classify("stripe.capture", &report)),
        "{report:?}"
    );
    assert_eq!(
        found_ref(&s.lookup("stripe.capture", &capture, &args).await),
        id
    );
    assert_eq!(s.effects("payment_intent.captured").len(), 1);
}

#[tokio::test]
async fn r8_cancel_twice_both_confirmed_one_cancel_effect() {
    let s = start().await;
    let authorize = key();
    let (id, _) = s
        .confirmed("stripe.authorize", &authorize, &payment(3000))
        .await;
    let args = json!({"intent_key": authorize, "reason": "requested_by_customer"});
    let first = key();
    assert_eq!(
        s.lookup("stripe.cancel", &first, &args).await,
        Lookup::NotFound
    );
    let (canceled, body) = s.confirmed("stripe.cancel", &first, &args).await;
    assert_eq!(canceled, id);
    assert_eq!(body["status"], "canceled");
    assert_eq!(body["cancellation_reason"], "requested_by_customer");
    let (again, _) = s.confirmed("stripe.cancel", &key(), &args).await;
    assert_eq!(again, id);
    let effects = s.effects("payment_intent.canceled");
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].key.as_deref(), Some(first.as_str()));
    assert_eq!(
        found_ref(&s.lookup("stripe.cancel", &first, &args).await),
        id
    );
    // The canceled authorization was real: its own lookup still finds it.
    assert_eq!(
        found_ref(
            &s.lookup("stripe.authorize", &authorize, &payment(3000))
                .await
        ),
        id
    );
}

#[tokio::test]
async fn r8_refund_of_a_charge_end_to_end() {
    let s = start().await;
    let charge = key();
    let (pi, _) = s
        .confirmed(
            "stripe.charge",
            &charge,
            &json!({"customer": "cus_ana", "amount": 5000, "currency": "usd", "receipt_email": "ana@example.com"}),
        )
        .await;
    // The compensation as the harness pre-writes it: the charge's key.
    let args = json!({"charge_key": charge, "amount": 1200});
    let compensation = key();
    assert_eq!(
        s.lookup("stripe.refund", &compensation, &args).await,
        Lookup::NotFound
    );
    let (refund, body) = s.confirmed("stripe.refund", &compensation, &args).await;
    assert!(refund.starts_with("re_"), "{refund}");
    assert_eq!(body["payment_intent"], pi.as_str());
    assert_eq!(body["amount"], 1200);
    assert_eq!(body["metadata"]["saga_key"], compensation.as_str());
    // Sent again (a resumed unwind): the same refund, no second one.
    let (again, _) = s.confirmed("stripe.refund", &compensation, &args).await;
    assert_eq!(again, refund);
    let refunds = s.effects("refund.created");
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0].key.as_deref(), Some(compensation.as_str()));
    assert_eq!(refunds[0].detail["amount"], 1200);
    assert_eq!(
        found_ref(&s.lookup("stripe.refund", &compensation, &args).await),
        refund
    );
    let (_, listed) = s.get(&format!("/v1/refunds?payment_intent={pi}")).await;
    assert_eq!(listed["object"], "list");
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
}

/// A charge tool compensated by a refund, as a tools file declares them.
const TOOLS: &str = r#"
[[tool]]
name = "charge_card"
class = "compensatable"
connector = "stripe.charge"
audience = "internal"
settle_ms = 0
compensation = { tool = "refund", args = { charge_key = "{key}", amount = "{args.amount}" } }

[[tool]]
name = "refund"
class = "irreversible"
connector = "stripe.refund"
audience = "internal"
settle_ms = 0
correction = { template = "A refund was issued in error.", recipients = ["finance@example.com"] }
"#;

#[tokio::test]
async fn r8_an_unwind_refunds_a_charge_through_stripe_by_the_charge_key() {
    use saga_harness::saga::engine::{Engine, OutcomeKind};
    use saga_harness::saga::model::{Actor, NewRun};
    use saga_harness::saga::registry::Registry;
    use saga_harness::saga::status::RunStatus;
    use std::sync::Arc;

    let s = start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("saga.db").display());
    let store = saga_harness::store::open(&url).await.unwrap().saga_store();
    let connectors = ConnectorSet::new().serve(
        &["stripe.charge", "stripe.refund"],
        Arc::new(s.connector.clone()),
    );
    let engine = Engine::new(
        store.clone(),
        Arc::new(Registry::from_toml(TOOLS).unwrap()),
        Arc::new(connectors),
    );
    let (run, _) = store
        .create_run(NewRun {
            agent: "support-bot".into(),
            label: None,
            purpose: "charge the replacement".into(),
        })
        .await
        .unwrap();
    let charged = engine
        .call("support-bot", run.id, "charge_card", payment(5000), Some(0))
        .await
        .unwrap();
    assert_eq!(
        charged.outcome,
        OutcomeKind::Confirmed,
        "{}",
        charged.message
    );
    let intent = charged.external_ref.unwrap();
    let unwound = engine
        .unwind(
            run.id,
            &Actor::Agent("support-bot".into()),
            "wrong customer",
        )
        .await
        .unwrap();
    assert_eq!(unwound.status, RunStatus::Unwound);
    let refunds = s.effects("refund.created");
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0].detail["payment_intent"], intent.as_str());
    assert_eq!(refunds[0].detail["amount"], 5000);
    assert_ne!(
        refunds[0].key, charged.key,
        "the refund carries its own key"
    );
    // Unwinding again sends nothing more.
    let _ = engine.continue_unwind(run.id).await;
    assert_eq!(s.effects("refund.created").len(), 1);
}

#[tokio::test]
async fn r8_a_refund_lost_in_a_504_is_unknown_and_lookup_finds_it() {
    let s = start().await;
    let charge = key();
    s.confirmed("stripe.charge", &charge, &payment(5000)).await;
    s.inject("POST", "/v1/refunds", Fault::CommitThen504);
    let args = json!({"charge_key": charge, "amount": 5000});
    let compensation = key();
    let report = s.execute("stripe.refund", &compensation, &args).await;
    assert!(
        is_unknown(&s.classify("stripe.refund", &report)),
        "{report:?}"
    );
    let found = s.lookup("stripe.refund", &compensation, &args).await;
    let refunds = s.effects("refund.created");
    assert_eq!(refunds.len(), 1);
    assert_eq!(found_ref(&found), refunds[0].object);
}

#[tokio::test]
async fn r8_a_charge_already_refunded_in_full_counts_as_refunded() {
    let s = start().await;
    let charge = key();
    let (pi, _) = s.confirmed("stripe.charge", &charge, &payment(2000)).await;
    // Someone refunded it by hand in the dashboard.
    let (status, _, by_hand) = s
        .post(
            "/v1/refunds",
            Some("by-hand"),
            &[("payment_intent", pi.as_str())],
        )
        .await;
    assert_eq!(status, 200);
    let args = json!({"charge_key": charge});
    let (refund, _) = s.confirmed("stripe.refund", &key(), &args).await;
    assert_eq!(refund, by_hand["id"].as_str().unwrap());
    assert_eq!(s.effects("refund.created").len(), 1);
}

#[tokio::test]
async fn r8_a_refund_of_more_than_was_captured_fails() {
    let s = start().await;
    let charge = key();
    s.confirmed("stripe.charge", &charge, &payment(1000)).await;
    let outcome = s
        .call(
            "stripe.refund",
            &key(),
            &json!({"charge_key": charge, "amount": 5000}),
        )
        .await;
    let Classified::Failed { error } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        error.contains("Refund amount ($50.00) is greater than charge amount ($10.00)"),
        "{error}"
    );
    assert!(s.effects("refund.created").is_empty());
}

#[tokio::test]
async fn r8_acting_on_a_key_that_matches_nothing_fails_and_sends_nothing() {
    let s = start().await;
    let nothing = key();
    for (operation, args) in [
        ("stripe.capture", json!({"intent_key": nothing})),
        ("stripe.cancel", json!({"intent_key": nothing})),
        ("stripe.refund", json!({"charge_key": nothing})),
    ] {
        let report = s.execute(operation, &key(), &args).await;
        let CallReport::Answered { status, body, .. } = &report else {
            panic!("{operation}: {report:?}")
        };
        assert_eq!(*status, 404, "{operation}");
        assert_eq!(body.as_ref().unwrap()["error"]["code"], "resource_missing");
        let Classified::Failed { error } = s.classify(operation, &report) else {
            panic!("{operation}")
        };
        assert!(error.contains(&nothing), "{error}");
    }
    assert!(s.sim.ledger.effects().is_empty());
}

#[tokio::test]
async fn r8_when_the_object_cannot_be_looked_up_nothing_is_sent() {
    let s = start().await;
    let authorize = key();
    s.confirmed("stripe.authorize", &authorize, &payment(900))
        .await;
    s.sim.faults.inject(
        FaultRule::new(
            "GET",
            "/v1/payment_intents",
            Fault::Reject {
                status: 500,
                message: "down".into(),
            },
        )
        .times(10),
    );
    let report = s
        .execute("stripe.capture", &key(), &json!({"intent_key": authorize}))
        .await;
    assert!(matches!(report, CallReport::NotSent { .. }), "{report:?}");
    assert!(matches!(
        s.classify("stripe.capture", &report),
        Classified::NotExecuted { .. }
    ));
    assert!(s.effects("payment_intent.captured").is_empty());
}

// ---- The simulator speaks Stripe --------------------------------------

#[tokio::test]
async fn sim_replays_the_first_answer_and_refuses_other_parameters() {
    let s = start().await;
    let form = [
        ("amount", "1000"),
        ("currency", "usd"),
        ("customer", "cus_ana"),
        ("payment_method", "pm_card_chargeDeclined"),
        ("confirm", "true"),
    ];
    let (first, headers, declined) = s.post("/v1/payment_intents", Some("k-1"), &form).await;
    assert_eq!(first, 402);
    assert!(headers.get("idempotent-replayed").is_none());
    let (again, headers, replayed) = s.post("/v1/payment_intents", Some("k-1"), &form).await;
    assert_eq!(again, 402, "the saved status comes back too");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replayed, declined);
    let (other, _, refused) = s
        .post(
            "/v1/payment_intents",
            Some("k-1"),
            &[("amount", "2000"), ("currency", "usd")],
        )
        .await;
    assert_eq!(other, 400);
    assert_eq!(refused["error"]["type"], "idempotency_error");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Keys for idempotent requests can only be used with the same parameters"));
    assert_eq!(s.effects("payment_intent.created").len(), 1);
}

#[tokio::test]
async fn sim_answers_stripes_errors() {
    let s = start().await;
    let base = s.running.base_url();
    // No key, and a malformed key.
    let anonymous = s
        .http
        .get(format!("{base}/v1/payment_intents"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let body: Value = anonymous.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("You did not provide an API key"));
    // A query the Search API cannot parse.
    let (status, body) = s.get("/v1/payment_intents/search?query=amount%3E100").await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["param"], "query");
    // Capturing what is not awaiting capture.
    let (id, _) = s.confirmed("stripe.charge", &key(), &payment(100)).await;
    let (status, _, body) = s
        .post(&format!("/v1/payment_intents/{id}/capture"), None, &[])
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["code"], "payment_intent_unexpected_state");
    assert_eq!(body["error"]["payment_intent"]["id"], id.as_str());
    // Unknown parameters, unknown objects, unknown URLs.
    let (status, _, body) = s
        .post(
            "/v1/payment_intents",
            None,
            &[("amount", "100"), ("currency", "usd"), ("colour", "red")],
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["code"], "parameter_unknown");
    let (status, body) = s.get("/v1/payment_intents/pi_missing").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "resource_missing");
    let (status, body) = s.get("/v1/charges_typo").await;
    assert_eq!(status, 404);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Unrecognized request URL (GET: /v1/charges_typo)"));
    // A redirect-capable intent confirmed without a return_url.
    let (status, _, body) = s
        .post(
            "/v1/payment_intents",
            None,
            &[
                ("amount", "100"),
                ("currency", "usd"),
                ("payment_method", "pm_card_visa"),
                ("confirm", "true"),
                ("automatic_payment_methods[enabled]", "true"),
            ],
        )
        .await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("return_url"));
}

// ---- Settings and secrets ----------------------------------------------

#[tokio::test]
async fn settings_mistakes_name_the_connector_and_field() {
    let wire = Wire::new(&Timeouts::default());
    let unset = format!("SAGA_TEST_STRIPE_UNSET_{}", std::process::id());
    let publishable = credential("pk_test_TYooMQauvdEDq54NiTphI7jx");
    let api = "base_url = \"https://api.stripe.com\"";
    let cases = [
        (
            format!("secret_key_env = {unset:?}"),
            "field `base_url` is missing".to_owned(),
        ),
        (
            api.to_owned(),
            "field `secret_key_env` is missing".to_owned(),
        ),
        (
            format!("{api}\nsecret_key_env = {unset:?}"),
            format!("field `secret_key_env`: the environment variable {unset} is not set"),
        ),
        (
            format!("base_url = \"api.stripe.com\"\nsecret_key_env = {publishable:?}"),
            "field `base_url`: \"api.stripe.com\" is not an http(s) URL".to_owned(),
        ),
        (
            format!("{api}\nsecret_key_env = {publishable:?}"),
            "does not hold a Stripe secret or restricted key".to_owned(),
        ),
        (
            format!("{api}\nsecret_key = \"sk_test_x\"\nsecret_key_env = {publishable:?}"),
            "field `secret_key`: not a setting of this connector".to_owned(),
        ),
    ];
    for (text, expected) in cases {
        let table: toml::Table = toml::from_str(&format!("[stripe]\n{text}\n")).unwrap();
        let Err(mistakes) = ConnectorSet::from_settings(&table, &wire) else {
            panic!("{text}: accepted")
        };
        let all = mistakes.join("\n");
        assert!(all.contains("connector `stripe`"), "{all}");
        assert!(
            all.contains(&expected),
            "{text}\nexpected {expected:?} in:\n{all}"
        );
        assert!(!all.contains("TYooMQauvdEDq54NiTphI7jx"), "{all}");
    }
    let good = credential("sk_test_ok123");
    let table: toml::Table =
        toml::from_str(&format!("[stripe]\n{api}\nsecret_key_env = {good:?}\n")).unwrap();
    let set = ConnectorSet::from_settings(&table, &wire).unwrap_or_else(|e| panic!("{e:?}"));
    let operations: Vec<&str> = set.operations().collect();
    assert_eq!(
        operations,
        [
            "stripe.authorize",
            "stripe.cancel",
            "stripe.capture",
            "stripe.charge",
            "stripe.refund"
        ]
    );
}

#[tokio::test]
async fn a_credential_never_appears_in_any_error_text() {
    // Well-formed enough for the connector, refused by Stripe.
    let secret = "sk_test_Wr0ngKey-7Hq2xZ9pLm";
    let s = start_with(Timeouts::default(), secret).await;
    let report = s.execute("stripe.charge", &key(), &payment(100)).await;
    let CallReport::Answered { status, .. } = &report else {
        panic!("{report:?}")
    };
    assert_eq!(*status, 401);
    let outcome = s.classify("stripe.charge", &report);
    assert!(matches!(outcome, Classified::Failed { .. }), "{outcome:?}");
    let lookup = s
        .connector
        .lookup("stripe.charge", &key(), &payment(100))
        .await;
    let capture = s
        .execute("stripe.capture", &key(), &json!({"intent_key": key()}))
        .await;
    for text in [
        format!("{report:?}"),
        format!("{outcome:?}"),
        format!("{lookup:?}"),
        format!("{capture:?}"),
        format!("{:?}", s.connector),
    ] {
        assert!(!text.contains(secret), "the key leaked: {text}");
        assert!(!text.contains("Wr0ngKey"), "part of the key leaked: {text}");
    }
}

#[tokio::test]
async fn r8_releasing_a_hold_that_was_captured_is_done_and_sends_nothing() {
    let s = start().await;
    let authorize = key();
    let (id, _) = s
        .confirmed("stripe.authorize", &authorize, &payment(3200))
        .await;
    let args = json!({"intent_key": authorize});
    s.confirmed("stripe.capture", &key(), &args).await;
    // The unwind releases the hold after the capture's refund: no hold is
    // left, so the release is already done.
    let release = key();
    let (released, body) = s.confirmed("stripe.cancel", &release, &args).await;
    assert_eq!(released, id);
    assert_eq!(body["status"], "succeeded");
    assert!(s.effects("payment_intent.canceled").is_empty());
    assert_eq!(
        found_ref(&s.lookup("stripe.cancel", &release, &args).await),
        id
    );
}
