//! Limits on the sum of correct calls (README "Limits"): checked and counted
//! in the commit of each intent, so agents racing at a limit never take it
//! past its maximum on the real system's ledger; over a limit a call is held
//! for a person with the reason in words; a step counts while its effect
//! stands or may stand, and gives its amount back once it is compensated.

use crate::common;

use common::app::{Spawn, TestApp};
use saga_harness::auth::token_hash;
use saga_harness::saga::limits::{Charge, StepLimits};
use saga_harness::saga::model::{Actor, NewRun, NewStep, Outcome, Via};
use saga_harness::saga::status::{ApprovalStatus, StepStatus};
use saga_harness::sim::bundle::{use_simulated_credentials, Simulators};
use saga_harness::sim::{Fault, FaultRule};
use serde_json::{json, Value};

const AGENT: &str = "billing-bot";

struct Setup {
    app: TestApp,
    sims: Simulators,
    token: String,
    http: reqwest::Client,
    _db: common::TestDb,
    _dir: tempfile::TempDir,
}

/// The shipped tools file pointed at fresh simulators, with `limits`
/// (TOML) added to its own.
async fn start(db: common::TestDb, limits: &str) -> Setup {
    use_simulated_credentials();
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    let shipped = std::fs::read_to_string("tools/support.toml").unwrap();
    let text = format!("{}\n{limits}\n", sims.point(&shipped).unwrap());
    std::fs::write(&path, text).unwrap();
    let app = Spawn::on(&db).tools(path).start().await;
    let token = saga_harness::auth::new_api_token();
    app.state()
        .store
        .add_api_token(AGENT, &token_hash(&token), None)
        .await
        .unwrap();
    Setup {
        app,
        sims,
        token,
        http: reqwest::Client::new(),
        _db: db,
        _dir: dir,
    }
}

impl Setup {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.app.api()))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn new_run(&self) -> String {
        let (status, created) = self.post("/runs", json!({"purpose": "refund"})).await;
        assert_eq!(status, 201, "{created}");
        created["run"]["id"].as_str().unwrap().to_owned()
    }

    async fn charge(&self, run: &str, step: i64, amount: Value) -> (u16, Value) {
        self.post(
            &format!("/runs/{run}/calls"),
            json!({"tool": "charge_card", "step": step,
                "args": {"customer": "cus_ada", "amount": amount, "currency": "usd"}}),
        )
        .await
    }

    /// The card payments Stripe's ledger holds, in cents.
    fn charged(&self) -> Vec<i64> {
        self.sims
            .stripe
            .ledger()
            .of("payment_intent.created")
            .iter()
            .map(|e| e.detail["amount"].as_i64().unwrap())
            .collect()
    }
}

const FIVE_HUNDRED_A_DAY: &str = r#"
[[limits.money]]
name = "test charges"
per = "agent/day"
max = 50000
currency = "usd"
tools = ["charge_card"]
"#;

/// 64 calls of $49.00 from one agent at once, each in its own run, against
/// $500.00 a day: ten fit, and Stripe's ledger never holds more than ten.
async fn racing_calls_never_sum_above_the_limit_on_the_ledger(db: common::TestDb) {
    let s = start(db, FIVE_HUNDRED_A_DAY).await;
    let mut runs = Vec::new();
    for _ in 0..64 {
        runs.push(s.new_run().await);
    }
    let answers =
        futures::future::join_all(runs.iter().map(|run| s.charge(run, 0, json!(4900)))).await;
    let mut confirmed = 0;
    let mut held = 0;
    for (status, answer) in &answers {
        assert_eq!(*status, 200, "{answer}");
        match answer["outcome"].as_str().unwrap() {
            "confirmed" => confirmed += 1,
            "held_over_limit" => {
                held += 1;
                assert_eq!(answer["limit"]["limit"], "test charges", "{answer}");
                assert_eq!(answer["limit"]["max"], 50000, "{answer}");
                assert_eq!(answer["limit"]["amount"], 4900, "{answer}");
                assert_eq!(answer["limit"]["used"], 49000, "{answer}");
                assert_eq!(
                    answer["limit"]["words"],
                    "this would take billing-bot's test charges in the last 24 hours to $539.00 of $500.00",
                    "{answer}"
                );
                let message = answer["message"].as_str().unwrap();
                assert!(message.contains("$539.00 of $500.00"), "{message}");
            }
            other => panic!("unexpected outcome {other}: {answer}"),
        }
    }
    let charged = s.charged();
    assert_eq!(charged.len(), 10, "Stripe's ledger: {charged:?}");
    assert_eq!(charged.iter().sum::<i64>(), 49000);
    assert_eq!((confirmed, held), (10, 54));
    // The gauge: the busiest scope has used 98 % of the limit.
    let state = s.app.state();
    let exposition = state.metrics.render(state.metric_sources()).await.unwrap();
    assert!(
        exposition.contains("saga_limit_used_ratio{limit=\"test charges\"} 0.98"),
        "{exposition}"
    );
    // Each held call waits for a person, with the reason as its summary.
    let pending = s.app.state().store.pending_approvals().await.unwrap();
    assert_eq!(pending.len(), 54);
    assert!(pending.iter().all(|a| {
        a.summary
        == "This would take billing-bot's test charges in the last 24 hours to $539.00 of $500.00"
    }));
}

#[tokio::test]
async fn sqlite_racing_calls_never_sum_above_the_limit_on_the_ledger() {
    racing_calls_never_sum_above_the_limit_on_the_ledger(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_racing_calls_never_sum_above_the_limit_on_the_ledger() {
    if let Some(db) = common::postgres().await {
        racing_calls_never_sum_above_the_limit_on_the_ledger(db).await;
    }
}

/// A declined card (failed) never counts; a charge taken back by an unwind
/// gives its amount back once its refund is confirmed; a held call is
/// made when a person approves it, and counted from then on; a rejected
/// one is settled as rejected and never made.
async fn failed_and_compensated_effects_give_their_amount_back(db: common::TestDb) {
    let s = start(db, FIVE_HUNDRED_A_DAY).await;
    // Declined: nothing happened, nothing counts.
    s.sims.stripe.state.faults.inject(FaultRule::new(
        "POST",
        "/v1/payment_intents",
        Fault::Reject {
            status: 402,
            message: "Your card was declined.".into(),
        },
    ));
    let declined_run = s.new_run().await;
    let (_, declined) = s.charge(&declined_run, 0, json!(40000)).await;
    assert_eq!(declined["outcome"], "failed", "{declined}");
    let first = s.new_run().await;
    let (_, taken) = s.charge(&first, 0, json!(40000)).await;
    assert_eq!(taken["outcome"], "confirmed", "{taken}");
    // $400 + $200 would cross $500: held.
    let second = s.new_run().await;
    let (_, held) = s.charge(&second, 0, json!(20000)).await;
    assert_eq!(held["outcome"], "held_over_limit", "{held}");
    assert_eq!(held["limit"]["used"], 40000, "{held}");
    // Re-sent, it reads the same hold.
    let (_, again) = s.charge(&second, 0, json!(20000)).await;
    assert_eq!(again["outcome"], "held_over_limit", "{again}");
    // The first run is unwound: its charge is refunded.
    let engine = &s.app.state().engine;
    let first_id = first.parse().unwrap();
    engine
        .unwind(first_id, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    let refunds = s.sims.stripe.ledger().of("refund.created");
    assert_eq!(refunds.len(), 1, "one refund");
    let third = s.new_run().await;
    let (_, after) = s.charge(&third, 0, json!(40000)).await;
    assert_eq!(after["outcome"], "confirmed", "{after}");
    // A person approves the held $200: it is made, past the limit, by
    // their decision, and audited.
    let store = &s.app.state().store;
    let pending = store.pending_approvals().await.unwrap();
    assert_eq!(pending.len(), 1);
    let approved = engine
        .decide_step(
            pending[0].id,
            &pending[0].digest,
            true,
            &Actor::User("lead".into()),
            Via::Dashboard,
        )
        .await
        .unwrap();
    assert_eq!(approved.status, StepStatus::Confirmed);
    assert_eq!(s.charged(), vec![40000, 40000, 20000]);
    let events = store
        .events(Some(second.parse().unwrap()), 100)
        .await
        .unwrap();
    assert!(
        events.iter().any(|e| e.actor == Actor::User("lead".into())),
        "the approval is audited: {events:?}"
    );
    // Counted now: a fourth charge is held, and rejecting it settles it.
    let fourth = s.new_run().await;
    let (_, held) = s.charge(&fourth, 0, json!(100)).await;
    assert_eq!(held["outcome"], "held_over_limit", "{held}");
    assert_eq!(held["limit"]["used"], 60000, "{held}");
    let pending = store.pending_approvals().await.unwrap();
    let rejected = engine
        .decide_step(
            pending[0].id,
            &pending[0].digest,
            false,
            &Actor::User("lead".into()),
            Via::Dashboard,
        )
        .await
        .unwrap();
    assert_eq!(rejected.status, StepStatus::Rejected);
    let (_, told) = s.charge(&fourth, 0, json!(100)).await;
    assert_eq!(told["outcome"], "rejected", "{told}");
    assert_eq!(s.charged().len(), 3, "the rejected charge was never made");
    let decided = store.approvals(fourth.parse().unwrap()).await.unwrap();
    assert_eq!(decided[0].status, ApprovalStatus::Rejected);
}

#[tokio::test]
async fn sqlite_failed_and_compensated_effects_give_their_amount_back() {
    failed_and_compensated_effects_give_their_amount_back(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_failed_and_compensated_effects_give_their_amount_back() {
    if let Some(db) = common::postgres().await {
        failed_and_compensated_effects_give_their_amount_back(db).await;
    }
}

/// A money argument that is not a whole number of cents is refused with
/// 422 and nothing is written or sent.
async fn a_money_argument_that_is_not_an_integer_is_refused(db: common::TestDb) {
    let s = start(db, FIVE_HUNDRED_A_DAY).await;
    let run = s.new_run().await;
    for amount in [json!(49.5), json!("4900")] {
        let (status, refused) = s.charge(&run, 0, amount).await;
        assert_eq!(status, 422, "{refused}");
        assert_eq!(refused["code"], "invalid_args", "{refused}");
    }
    let steps = s
        .app
        .state()
        .store
        .steps(run.parse().unwrap())
        .await
        .unwrap();
    assert!(steps.is_empty(), "{steps:?}");
    assert!(s.charged().is_empty());
}

#[tokio::test]
async fn sqlite_a_money_argument_that_is_not_an_integer_is_refused() {
    a_money_argument_that_is_not_an_integer_is_refused(common::sqlite()).await;
}

/// One email to more people than a per-call limit allows is held, not
/// sent; recipients are counted once each across to, cc and bcc.
async fn a_bulk_send_is_held_for_a_person(db: common::TestDb) {
    let s = start(db, "").await;
    let run = s.new_run().await;
    let to: Vec<String> = (0..40).map(|i| format!("c{i}@example.com")).collect();
    let cc: Vec<String> = (30..60).map(|i| format!("c{i}@example.com")).collect();
    let (status, held) = s
        .post(
            &format!("/runs/{run}/calls"),
            json!({"tool": "send_email", "step": 0, "args": {"to": to, "cc": cc,
                "subject": "Your order", "body": "Sorry"}}),
        )
        .await;
    assert_eq!(status, 200, "{held}");
    assert_eq!(held["outcome"], "held_over_limit", "{held}");
    assert_eq!(
        held["limit"]["words"],
        "this would take this call's recipients of one email to 60 recipients of 50 recipients"
    );
    let mail = s.sims.smtp.ledger().effects();
    assert!(mail.is_empty(), "{mail:?}");
}

#[tokio::test]
async fn sqlite_a_bulk_send_is_held_for_a_person() {
    a_bulk_send_is_held_for_a_person(common::sqlite()).await;
}

fn charge(scope: &str, amount: i64, max: i64) -> Charge {
    Charge {
        limit: "charges".into(),
        scope: scope.into(),
        amount,
        max,
        window_s: Some(86_400),
    }
}

/// A charge of step `idx` of `run`, counted against `charges`.
fn charging(run: uuid::Uuid, idx: i64, charges: Vec<Charge>) -> NewStep {
    NewStep {
        run_id: run,
        step_idx: idx,
        tool: "charge_card".into(),
        tool_class: saga_harness::saga::class::ToolClass::Compensatable,
        idempotency_key: format!("k-{idx}-{run}"),
        args: json!({"amount": charges.first().map_or(0, |c| c.amount)}),
        status: StepStatus::Intended,
        compensation: None,
        audience: saga_harness::saga::class::Audience::Finance,
        phase: saga_harness::saga::class::Phase::BeforePivot,
        limits: StepLimits {
            enforce: true,
            charges,
        },
    }
}

/// A pruned run takes out of the totals what it still counted (rows no
/// sweep has reached yet), and its per-run totals go with it; another
/// run's usage stays.
async fn removing_a_run_takes_its_usage_out_of_the_totals(db: common::TestDb) {
    let opened = saga_harness::store::open_with(&db.url, &db.settings())
        .await
        .unwrap();
    let store = opened.saga_store();
    let agent = Actor::Agent(AGENT.into());
    let mut runs = Vec::new();
    for purpose in ["pruned", "kept"] {
        let (run, _) = store
            .create_run(NewRun {
                agent: AGENT.into(),
                label: None,
                purpose: purpose.into(),
            })
            .await
            .unwrap();
        runs.push(run.id);
    }
    let daily = "charges|agent:billing-bot";
    let per_run = format!("charges per run|run:{}", runs[0]);
    let mut per_run_charge = charge(&per_run, 600, 1000);
    per_run_charge.window_s = None;
    store
        .record_step(
            charging(runs[0], 0, vec![charge(daily, 600, 1000), per_run_charge]),
            &agent,
        )
        .await
        .unwrap();
    store
        .record_step(charging(runs[1], 0, vec![charge(daily, 200, 1000)]), &agent)
        .await
        .unwrap();
    let used = || {
        let store = store.clone();
        let per_run = per_run.clone();
        async move {
            store
                .limit_usage(&[(daily.to_owned(), Some(86_400)), (per_run, None)])
                .await
                .unwrap()
        }
    };
    assert_eq!(used().await, vec![800, 600]);
    let seen = store.run(runs[0]).await.unwrap().unwrap().updated_at;
    let removed = store.remove_run(runs[0], seen).await.unwrap().unwrap();
    assert_eq!(removed.by_table["limit_usage"], 2);
    assert_eq!(removed.by_table["limit_totals"], 1, "the per-run total");
    assert_eq!(used().await, vec![200, 0]);
    opened.close().await;
}

#[tokio::test]
async fn sqlite_removing_a_run_takes_its_usage_out_of_the_totals() {
    removing_a_run_takes_its_usage_out_of_the_totals(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_removing_a_run_takes_its_usage_out_of_the_totals() {
    let db = common::postgres_or_skip!();
    removing_a_run_takes_its_usage_out_of_the_totals(db).await;
}

/// The store counts a step while it is INTENDED, UNKNOWN or CONFIRMED, and
/// not once it failed, was not executed or was compensated.
async fn a_step_counts_while_its_effect_stands_or_may(db: common::TestDb) {
    let opened = saga_harness::store::open_with(&db.url, &db.settings())
        .await
        .unwrap();
    let store = opened.saga_store();
    let (run, _) = store
        .create_run(NewRun {
            agent: AGENT.into(),
            label: None,
            purpose: "counting".into(),
        })
        .await
        .unwrap();
    let scope = "charges|agent:billing-bot";
    let used = |store: std::sync::Arc<dyn saga_harness::saga::store::SagaStore>| async move {
        store
            .limit_usage(&[(scope.to_owned(), Some(86_400))])
            .await
            .unwrap()[0]
    };
    let new = |idx: i64, amount: i64| charging(run.id, idx, vec![charge(scope, amount, 1000)]);
    let agent = Actor::Agent(AGENT.into());
    store.record_step(new(0, 600), &agent).await.unwrap();
    assert_eq!(used(store.clone()).await, 600, "intended counts");
    let over = store.record_step(new(1, 500), &agent).await.unwrap_err();
    assert!(
        matches!(
            over,
            saga_harness::saga::store::StoreError::OverLimit {
                charge: 0,
                used: 600
            }
        ),
        "{over:?}"
    );
    let settle = |from, to| Outcome {
        from,
        to,
        external_ref: None,
        result: None,
        error: None,
    };
    store
        .settle_step(
            run.id,
            0,
            settle(StepStatus::Intended, StepStatus::Unknown),
            saga_harness::saga::model::Durability::Durable,
            &agent,
        )
        .await
        .unwrap();
    assert_eq!(used(store.clone()).await, 600, "unknown counts");
    store
        .settle_step(
            run.id,
            0,
            settle(StepStatus::Unknown, StepStatus::Failed),
            saga_harness::saga::model::Durability::Durable,
            &agent,
        )
        .await
        .unwrap();
    assert_eq!(used(store.clone()).await, 0, "failed gives it back");
    store.record_step(new(1, 900), &agent).await.unwrap();
    assert_eq!(used(store.clone()).await, 900);
    opened.close().await;
}

#[tokio::test]
async fn sqlite_a_step_counts_while_its_effect_stands_or_may() {
    a_step_counts_while_its_effect_stands_or_may(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_a_step_counts_while_its_effect_stands_or_may() {
    if let Some(db) = common::postgres().await {
        a_step_counts_while_its_effect_stands_or_may(db).await;
    }
}

/// A rolling window lets usage go once it is older than the window, and
/// each row leaves the sum once: a step that fails after its row left the
/// window gives nothing back twice.
async fn a_rolling_window_lets_old_usage_go_each_row_once(db: common::TestDb) {
    let opened = saga_harness::store::open_with(&db.url, &db.settings())
        .await
        .unwrap();
    let store = opened.saga_store();
    let (run, _) = store
        .create_run(NewRun {
            agent: AGENT.into(),
            label: None,
            purpose: "windows".into(),
        })
        .await
        .unwrap();
    let scope = "per second|agent:billing-bot";
    let new = |idx: i64, amount: i64| NewStep {
        run_id: run.id,
        step_idx: idx,
        tool: "charge_card".into(),
        tool_class: saga_harness::saga::class::ToolClass::Compensatable,
        idempotency_key: format!("w-{idx}-{}", run.id),
        args: json!({"amount": amount}),
        status: StepStatus::Intended,
        compensation: None,
        audience: saga_harness::saga::class::Audience::Finance,
        phase: saga_harness::saga::class::Phase::BeforePivot,
        limits: StepLimits {
            enforce: true,
            charges: vec![Charge {
                window_s: Some(1),
                ..charge(scope, amount, 1000)
            }],
        },
    };
    let agent = Actor::Agent(AGENT.into());
    let used = || async {
        store
            .limit_usage(&[(scope.to_owned(), Some(1))])
            .await
            .unwrap()[0]
    };
    store.record_step(new(0, 800), &agent).await.unwrap();
    assert_eq!(used().await, 800);
    assert!(store.record_step(new(1, 300), &agent).await.is_err());
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    assert_eq!(used().await, 0, "out of the window");
    // The next check sweeps the old row out and fits.
    store.record_step(new(1, 900), &agent).await.unwrap();
    assert_eq!(used().await, 900);
    // The old step fails now: its row already left the sum.
    store
        .settle_step(
            run.id,
            0,
            Outcome {
                from: StepStatus::Intended,
                to: StepStatus::Failed,
                external_ref: None,
                result: None,
                error: None,
            },
            saga_harness::saga::model::Durability::Durable,
            &agent,
        )
        .await
        .unwrap();
    assert_eq!(used().await, 900, "given back once, not twice");
    opened.close().await;
}

#[tokio::test]
async fn sqlite_a_rolling_window_lets_old_usage_go_each_row_once() {
    a_rolling_window_lets_old_usage_go_each_row_once(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_a_rolling_window_lets_old_usage_go_each_row_once() {
    if let Some(db) = common::postgres().await {
        a_rolling_window_lets_old_usage_go_each_row_once(db).await;
    }
}

/// On PostgreSQL, an intent whose scope another transaction is counting
/// waits for that transaction and then reads what it committed: it never
/// fits under a sum it read before the other's commit.
#[tokio::test]
async fn postgres_an_intent_waits_for_the_commit_counting_its_scope() {
    use sqlx::Connection as _;
    let Some(db) = common::postgres().await else {
        return;
    };
    let opened = saga_harness::store::open_with(&db.url, &db.settings())
        .await
        .unwrap();
    let store = opened.saga_store();
    let (run, _) = store
        .create_run(NewRun {
            agent: AGENT.into(),
            label: None,
            purpose: "waiting".into(),
        })
        .await
        .unwrap();
    let scope = "charges|agent:billing-bot";
    let mut other = sqlx::PgConnection::connect(&db.direct_url).await.unwrap();
    sqlx::query("INSERT INTO limit_totals (scope, used, swept_at) VALUES ($1, 0, now())")
        .bind(scope)
        .execute(&mut other)
        .await
        .unwrap();
    // Another writer counts 600 against the scope and has not committed.
    let mut counting = other.begin().await.unwrap();
    sqlx::query("UPDATE limit_totals SET used = used + 600 WHERE scope = $1")
        .bind(scope)
        .execute(&mut *counting)
        .await
        .unwrap();
    let intent = tokio::spawn({
        let store = store.clone();
        let run_id = run.id;
        async move {
            store
                .record_step(
                    NewStep {
                        run_id,
                        step_idx: 0,
                        tool: "charge_card".into(),
                        tool_class: saga_harness::saga::class::ToolClass::Compensatable,
                        idempotency_key: format!("wait-{run_id}"),
                        args: json!({"amount": 500}),
                        status: StepStatus::Intended,
                        compensation: None,
                        audience: saga_harness::saga::class::Audience::Finance,
                        phase: saga_harness::saga::class::Phase::BeforePivot,
                        limits: StepLimits {
                            enforce: true,
                            charges: vec![Charge {
                                window_s: None,
                                ..charge(scope, 500, 1000)
                            }],
                        },
                    },
                    &Actor::Agent(AGENT.into()),
                )
                .await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert!(
        !intent.is_finished(),
        "the intent waits for the other commit"
    );
    counting.commit().await.unwrap();
    let refused = intent.await.unwrap().unwrap_err();
    assert!(
        matches!(
            refused,
            saga_harness::saga::store::StoreError::OverLimit { used: 600, .. }
        ),
        "{refused:?}"
    );
    assert!(store.steps(run.id).await.unwrap().is_empty());
    opened.close().await;
}

/// An irreversible call is held for its own approval anyway; when it
/// would also cross a limit, the person deciding reads that too.
#[tokio::test]
async fn an_irreversible_call_held_anyway_also_says_the_limit_it_would_cross() {
    let s = start(common::sqlite(), "").await;
    let run = s.new_run().await;
    let (status, held) = s
        .post(
            &format!("/runs/{run}/calls"),
            json!({"tool": "refund", "step": 0, "args": {"charge_key": "pi_x", "amount": 60000}}),
        )
        .await;
    assert_eq!(status, 200, "{held}");
    assert_eq!(held["outcome"], "awaiting_approval", "{held}");
    let pending = s.app.state().store.pending_approvals().await.unwrap();
    assert_eq!(
        pending[0].summary,
        "an irreversible call before the pivot needs its own approval. This would take billing-bot's refunds in the last 24 hours to $600.00 of $500.00"
    );
    assert!(s.sims.stripe.ledger().of("refund.created").is_empty());
}
