//! The engine against the in-process model world: every check of what
//! happened is made in the world, not in the log. Each test runs on SQLite
//! and, when configured, on PostgreSQL.

use crate::common;

use common::world::{Fault, Witness, World, TOOLS};
use saga_harness::saga::connector::Connector;
use saga_harness::saga::engine::{Engine, OutcomeKind, Refusal};
use saga_harness::saga::model::{Actor, NewStep, Run, Via};
use saga_harness::saga::pivot::PlannedCall;
use saga_harness::saga::registry::Registry;
use saga_harness::saga::status::{ApprovalStatus, RunStatus, StepStatus};
use saga_harness::saga::store::SagaStore;
use serde_json::{json, Value};
use std::sync::Arc;

const AGENT: &str = "support-bot";

struct Setup {
    store: Arc<dyn SagaStore>,
    world: Arc<World>,
    engine: Engine,
}

impl Setup {
    fn new(store: Arc<dyn SagaStore>) -> Self {
        let world = Arc::new(World::new());
        let engine = Engine::new(store.clone(), registry(), world.clone());
        Setup {
            store,
            world,
            engine,
        }
    }

    /// A fresh engine on the same database and world: what a restart after
    /// a crash sees.
    fn restarted(&self) -> Engine {
        Engine::new(self.store.clone(), registry(), self.world.clone())
    }

    /// A run with one ticket opened, whose unwind began and went no
    /// further (the process stopped).
    async fn run_left_unwinding(&self) -> Run {
        let run = self.run().await;
        self.engine
            .call(AGENT, run.id, "create_ticket", json!({}), Some(0))
            .await
            .unwrap();
        self.store
            .move_run(
                run.id,
                RunStatus::Running,
                RunStatus::Unwinding,
                &lead(),
                Some("wrong"),
            )
            .await
            .unwrap()
    }

    async fn run(&self) -> Run {
        common::world::new_run(&*self.store, AGENT, "refund a double charge").await
    }
}

fn registry() -> Arc<Registry> {
    Arc::new(Registry::from_toml(TOOLS).unwrap())
}

fn lead() -> Actor {
    Actor::User("dana".into())
}

async fn r2_pure_calls_take_no_step_and_write_nothing(s: Setup) {
    let run = s.run().await;
    let events_before = s.store.events(Some(run.id), 100).await.unwrap().len();
    let out = s
        .engine
        .call(
            AGENT,
            run.id,
            "crm.lookup",
            json!({"customer": "ana"}),
            Some(7),
        )
        .await
        .unwrap();
    assert_eq!(out.outcome, OutcomeKind::Confirmed);
    assert_eq!(out.step, None);
    assert_eq!(out.next_step, 0);
    assert_eq!(out.result.unwrap()["orders"], 2);
    assert!(s.store.steps(run.id).await.unwrap().is_empty());
    assert_eq!(
        s.store.events(Some(run.id), 100).await.unwrap().len(),
        events_before
    );
}

async fn r2_no_intended_row_no_call(s: Setup) {
    let witness = Arc::new(Witness::new(s.world.clone(), s.store.clone()));
    let engine = Engine::new(s.store.clone(), registry(), witness.clone());
    let run = s.run().await;
    engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "double charge"}),
            Some(0),
        )
        .await
        .unwrap();
    engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 1200}),
            Some(1),
        )
        .await
        .unwrap();
    assert_eq!(*witness.calls.lock().unwrap(), 2);
    assert_eq!(*witness.violations.lock().unwrap(), Vec::<String>::new());
}

/// A client that names no step (the MCP gateway): a call of a tool goes to
/// the oldest step of that tool still owed to the agent, so a reworded
/// retry reads its outcome; another tool, or the same tool once its outcome
/// was given, takes a new step.
async fn r12_a_call_without_a_step_goes_to_the_tools_oldest_owed_step(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("tickets.create", Fault::EffectThen504);
    let first = ticket_without_a_step(&s, run.id, "charged twice", true).await;
    assert_eq!((first.outcome, first.step), (OutcomeKind::Unknown, Some(0)));
    the_retry_reads_step_0_and_then_a_call_is_new(&s, run.id).await;
}

/// R12 for a client that names no step: a final outcome reached after the
/// client gave up (its request timed out) was never given to it, so the
/// step stays owed and the retry reads it; no second effect.
async fn r12_a_final_outcome_the_client_gave_up_on_stays_owed_to_its_retry(s: Setup) {
    let run = s.run().await;
    let unheard = ticket_without_a_step(&s, run.id, "charged twice", false).await;
    assert_eq!(
        (unheard.outcome, unheard.step),
        (OutcomeKind::Confirmed, Some(0))
    );
    the_retry_reads_step_0_and_then_a_call_is_new(&s, run.id).await;
}

/// A client that names no step (the MCP gateway) takes the same hot path
/// as one that does: once this process has answered on the run, a new
/// step on a ready run is claimed and written in one statement, without
/// reading the run first. Where a step is owed, the store refuses the
/// guess and the call reads the run, so the owed step is answered.
async fn a_call_without_a_step_on_a_ready_run_is_claimed_and_recorded_at_once(s: Setup) {
    let counted = Arc::new(common::crash::CrashingStore::new(
        s.store.clone(),
        None,
        false,
    ));
    let s = Setup::new(counted.clone());
    let reads = || {
        counted
            .claims_read
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let run = s.run().await;
    let first = ticket_without_a_step(&s, run.id, "one", true).await;
    assert_eq!(
        (first.outcome, first.step),
        (OutcomeKind::Confirmed, Some(0))
    );
    let read_for_the_first = reads();
    assert_eq!(
        read_for_the_first, 1,
        "nothing known of the run yet: read it"
    );
    for (n, summary) in ["two", "three"].into_iter().enumerate() {
        let next = ticket_without_a_step(&s, run.id, summary, true).await;
        assert_eq!(
            (next.outcome, next.step),
            (OutcomeKind::Confirmed, Some(n as i64 + 1))
        );
    }
    assert_eq!(
        reads(),
        read_for_the_first,
        "new steps on a ready run read nothing first"
    );
    assert_eq!(s.world.effects("tickets.create").len(), 3);

    // Step 3's answer is not heard: it is owed, and the next call reads it
    // instead of taking step 4.
    let unheard = ticket_without_a_step(&s, run.id, "four", false).await;
    assert_eq!(unheard.step, Some(3));
    let retry = ticket_without_a_step(&s, run.id, "four, reworded", true).await;
    assert_eq!(
        (retry.outcome, retry.step),
        (OutcomeKind::Confirmed, Some(3))
    );
    assert_eq!(reads(), read_for_the_first + 1);
    assert_eq!(s.world.effects("tickets.create").len(), 4);
    let steps = s.store.steps(run.id).await.unwrap();
    assert_eq!(steps.len(), 4, "{steps:?}");
}

/// Step 0's answer was not had: a reworded retry reads it (one ticket);
/// once had, the next call is a new effect at step 1.
async fn the_retry_reads_step_0_and_then_a_call_is_new(s: &Setup, run_id: uuid::Uuid) {
    let retry = ticket_without_a_step(s, run_id, "double charge!!", true).await;
    assert_eq!(
        (retry.outcome, retry.step),
        (OutcomeKind::Confirmed, Some(0))
    );
    assert_eq!(s.world.effects("tickets.create").len(), 1);
    let next = ticket_without_a_step(s, run_id, "another", true).await;
    assert_eq!((next.outcome, next.step), (OutcomeKind::Confirmed, Some(1)));
    assert_eq!(s.world.effects("tickets.create").len(), 2);
}

/// When the question about step 0's compensation was asked.
async fn compensation_asked(s: &Setup, run_id: uuid::Uuid) -> chrono::DateTime<chrono::Utc> {
    s.store.compensations(run_id).await.unwrap()[0].updated_at
}

/// `create_ticket` as a client that names no step calls it (the MCP
/// gateway), still listening for the answer or not.
async fn ticket_without_a_step(
    s: &Setup,
    run_id: uuid::Uuid,
    summary: &str,
    listening: bool,
) -> saga_harness::saga::engine::CallOutcome {
    s.engine
        .call_choosing_step(
            AGENT,
            run_id,
            "create_ticket",
            json!({ "summary": summary }),
            &move || listening,
        )
        .await
        .unwrap()
}

async fn r3_a_reworded_retry_gets_the_recorded_outcome_not_a_second_effect(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("tickets.create", Fault::EffectThen504);
    let first = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "Customer charged twice"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(first.outcome, OutcomeKind::Unknown);
    assert!(
        first.message.contains("Do not retry with new arguments"),
        "{}",
        first.message
    );
    let retry = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "Duplicate charge for customer"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(retry.outcome, OutcomeKind::Confirmed);
    assert_eq!(retry.key, first.key);
    assert_eq!(
        s.world.effects("tickets.create").len(),
        1,
        "exactly one ticket"
    );
    let logged = s.store.step(run.id, 0).await.unwrap().unwrap();
    assert_eq!(
        logged.args["summary"], "Customer charged twice",
        "the logged intent wins"
    );
    assert_eq!(logged.external_ref, retry.external_ref);
}

async fn r4_not_executed_is_retried_under_the_same_key(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("payments.charge", Fault::Status(429));
    let first = s
        .engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 500}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(first.outcome, OutcomeKind::NotExecuted);
    assert!(s.world.effects("payments.charge").is_empty());
    let again = s
        .engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 999}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(again.outcome, OutcomeKind::Confirmed);
    let charges = s.world.effects("payments.charge");
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].key, first.key.unwrap());
    assert_eq!(
        charges[0].args["amount"], 500,
        "re-executed with the logged arguments"
    );
}

async fn r4_a_refusal_is_failed_and_final(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("warehouse.reship", Fault::Status(422));
    let out = s
        .engine
        .call(AGENT, run.id, "reship", json!({"sku": "A1"}), Some(0))
        .await
        .unwrap();
    assert_eq!(out.outcome, OutcomeKind::Failed);
    assert!(out.error.unwrap().contains("422"));
    let again = s
        .engine
        .call(AGENT, run.id, "reship", json!({"sku": "A1"}), Some(0))
        .await
        .unwrap();
    assert_eq!(again.outcome, OutcomeKind::Failed);
    assert!(s.world.effects("warehouse.reship").is_empty());
}

async fn r6_a_call_whose_way_back_cannot_be_built_waits_for_a_person(s: Setup) {
    let run = s.run().await;
    let held = s
        .engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"currency": "eur"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(held.outcome, OutcomeKind::AwaitingApproval);
    assert!(
        s.world.effects("payments.charge").is_empty(),
        "nothing is sent while held"
    );
    let approvals = s.store.pending_approvals().await.unwrap();
    assert_eq!(approvals.len(), 1);
    assert!(
        approvals[0].summary.contains("`amount`"),
        "{}",
        approvals[0].summary
    );
    let step = s
        .engine
        .decide_step(
            approvals[0].id,
            &approvals[0].digest,
            true,
            &lead(),
            Via::Dashboard,
        )
        .await
        .unwrap();
    assert_eq!(step.status, StepStatus::Confirmed);
    assert_eq!(s.world.effects("payments.charge").len(), 1);
    let read = s
        .engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"currency": "eur"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(read.outcome, OutcomeKind::Confirmed);
}

/// A held step's approval has a deadline (here one second, from the
/// tools file's `[approvals]`): an approval that arrives after it is not
/// taken. The step ends as expired and nothing is sent.
async fn r9_a_held_step_cannot_be_approved_after_its_deadline(s: Setup) {
    let tools = format!("{TOOLS}\n[approvals]\ndeadline = \"1s\"\n");
    let engine = Engine::new(
        s.store.clone(),
        Arc::new(Registry::from_toml(&tools).unwrap()),
        s.world.clone(),
    );
    let run = s.run().await;
    let held = engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"currency": "eur"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(held.outcome, OutcomeKind::AwaitingApproval);
    let approval = s.store.pending_approvals().await.unwrap().remove(0);
    let deadline = approval.expires_at.expect("the tools file sets a deadline");
    while chrono::Utc::now() <= deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let step = engine
        .decide_step(approval.id, &approval.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(step.status, StepStatus::Rejected, "{step:?}");
    assert!(
        step.error
            .as_deref()
            .is_some_and(|e| e.contains("deadline")),
        "{step:?}"
    );
    assert!(
        s.world.effects("payments.charge").is_empty(),
        "a late approval sent the charge"
    );
    let decided = s.store.approval(approval.id).await.unwrap().unwrap();
    assert_eq!(decided.status, ApprovalStatus::Expired);
    // The agent reads the step again: expired, which nobody rejected.
    let read = engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"currency": "eur"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(read.outcome, OutcomeKind::Expired, "{read:?}");
    assert!(read.message.contains("Nobody rejected it"), "{read:?}");
}

async fn r6_the_compensation_is_written_before_the_call_and_names_the_key(s: Setup) {
    let run = s.run().await;
    let out = s
        .engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 1200}),
            Some(0),
        )
        .await
        .unwrap();
    let step = s.store.step(run.id, 0).await.unwrap().unwrap();
    let way_back = step.compensation.unwrap();
    assert_eq!(way_back["tool"], "refund");
    assert_eq!(way_back["args"]["charge_key"], out.key.unwrap().as_str());
    assert_eq!(way_back["args"]["amount"], 1200);
}

async fn r9_irreversible_calls_before_the_pivot_are_held_and_counted(s: Setup) {
    let run = s.run().await;
    let held = s
        .engine
        .call(
            AGENT,
            run.id,
            "email_customer",
            json!({"to": "ana@example.com", "body": "refund coming"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(held.outcome, OutcomeKind::AwaitingApproval);
    assert!(s.world.effects("mail.send").is_empty());
    let blocked = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(1))
        .await
        .unwrap_err();
    assert_eq!(blocked.code(), "step_unresolved");
    let approval = s.store.pending_approvals().await.unwrap().remove(0);
    let rejected = s
        .engine
        .decide_step(
            approval.id,
            &approval.digest,
            false,
            &lead(),
            Via::Dashboard,
        )
        .await
        .unwrap();
    assert_eq!(rejected.status, StepStatus::Rejected);
    let read = s
        .engine
        .call(AGENT, run.id, "email_customer", json!({"to": "x"}), Some(0))
        .await
        .unwrap();
    assert_eq!(read.outcome, OutcomeKind::Rejected);
    assert_eq!(
        s.store
            .run(run.id)
            .await
            .unwrap()
            .unwrap()
            .irreversible_before_pivot,
        0
    );

    s.engine
        .call(
            AGENT,
            run.id,
            "email_customer",
            json!({"to": "ana@example.com"}),
            Some(1),
        )
        .await
        .unwrap();
    let approval = s.store.pending_approvals().await.unwrap().remove(0);
    let err = s
        .engine
        .decide_step(
            approval.id,
            "a digest of another plan",
            true,
            &lead(),
            Via::Dashboard,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("plan changed"), "{err}");
    let sent = s
        .engine
        .decide_step(approval.id, &approval.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(sent.status, StepStatus::Confirmed);
    assert!(sent.approved_individually);
    assert_eq!(s.world.effects("mail.send").len(), 1);
    assert_eq!(
        s.store
            .run(run.id)
            .await
            .unwrap()
            .unwrap()
            .irreversible_before_pivot,
        1
    );
    let decided = s.store.approval(approval.id).await.unwrap().unwrap();
    assert_eq!(decided.status, ApprovalStatus::Approved);
    assert_eq!(decided.decided_by, Some(Actor::User("dana".into())));
}

async fn r9_gated_tools_are_refused_outside_a_pivot(s: Setup) {
    let run = s.run().await;
    let err = s
        .engine
        .call(
            AGENT,
            run.id,
            "announce",
            json!({"text": "we doubled your refund"}),
            Some(0),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "gated_tool");
    assert!(s.world.effects("mail.send").is_empty());
    assert_eq!(s.store.run(run.id).await.unwrap().unwrap().next_step, 0);
}

async fn r6_a_tool_reserved_for_ways_back_is_not_an_agent_step(s: Setup) {
    let run = s.run().await;
    let err = s
        .engine
        .call(
            AGENT,
            run.id,
            "release_hold",
            json!({"intent_key": "someone-elses-key"}),
            Some(0),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "way_back_only");
    let plan = vec![PlannedCall {
        tool: "release_hold".into(),
        args: json!({"intent_key": "k"}),
    }];
    let err = s
        .engine
        .propose_pivot(AGENT, run.id, "release", plan)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "way_back_only");
    assert!(s.world.effects("payments.cancel").is_empty());
    assert_eq!(s.store.run(run.id).await.unwrap().unwrap().next_step, 0);
}

async fn r7_lookup_lag_is_waited_out_once(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("tickets.create", Fault::EffectThenBlank);
    s.world.lag_lookups("tickets.create", 1);
    let out = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "s"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(out.outcome, OutcomeKind::Unknown);
    let read = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "s"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(read.outcome, OutcomeKind::Confirmed);
    assert_eq!(s.world.effects("tickets.create").len(), 1);
}

async fn r7_not_found_twice_is_not_executed_and_the_retry_uses_the_key(s: Setup) {
    let run = s.run().await;
    s.world
        .fail_next("tickets.create", Fault::TimeoutWithoutEffect);
    let out = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "s"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(out.outcome, OutcomeKind::Unknown);
    let read = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "s"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(read.outcome, OutcomeKind::Confirmed);
    let tickets = s.world.effects("tickets.create");
    assert_eq!(tickets.len(), 1);
    assert_eq!(Some(tickets[0].key.clone()), out.key);
    let history: Vec<_> = s
        .store
        .events(Some(run.id), 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.entity.as_str() == "step")
        .map(|e| e.to_status.unwrap_or_default())
        .collect();
    assert_eq!(
        history,
        [
            "INTENDED",
            "UNKNOWN",
            "NOT_EXECUTED",
            "INTENDED",
            "CONFIRMED"
        ]
    );
}

/// R7: a person's answer is bound to the question they read. Told "it did
/// not happen", the harness sends the step again; that send is lost too,
/// so the step is asked about again. The first answer, given a second time
/// (a resubmitted form), is refused: it never saw the second send, which
/// did happen. One letter.
async fn r7_an_answer_given_again_does_not_settle_a_later_question(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "email_customer",
            json!({"to": "ana@example.com"}),
            Some(0),
        )
        .await
        .unwrap();
    let approval = s.store.pending_approvals().await.unwrap().remove(0);
    s.world.fail_next("mail.send", Fault::TimeoutWithoutEffect);
    s.engine
        .decide_step(approval.id, &approval.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap();
    let first_question = s.store.step(run.id, 0).await.unwrap().unwrap();
    assert_eq!(first_question.status, StepStatus::Unknown);
    assert!(s.world.effects("mail.send").is_empty());
    // "It did not happen": true. The harness sends it again; this time the
    // letter goes out and the answer is lost.
    s.world.fail_next("mail.send", Fault::EffectThenTimeout);
    s.engine
        .answer(run.id, 0, false, None, first_question.updated_at, &lead())
        .await
        .unwrap();
    let run_now = s.store.run(run.id).await.unwrap().unwrap();
    if run_now.status == RunStatus::Running {
        // The agent re-sends the step, which sends it again.
        s.engine
            .call(
                AGENT,
                run.id,
                "email_customer",
                json!({"to": "ana@example.com"}),
                Some(0),
            )
            .await
            .unwrap();
    }
    assert_eq!(s.world.effects("mail.send").len(), 1);
    let second_question = s.store.step(run.id, 0).await.unwrap().unwrap();
    assert_eq!(second_question.status, StepStatus::Unknown);
    let replayed = s
        .engine
        .answer(run.id, 0, false, None, first_question.updated_at, &lead())
        .await;
    assert!(
        matches!(replayed, Err(Refusal::QuestionAskedAgain { step: 0 })),
        "{replayed:?}"
    );
    assert_eq!(
        s.world.effects("mail.send").len(),
        1,
        "never a second letter"
    );
    let answered = s
        .engine
        .answer(run.id, 0, true, None, second_question.updated_at, &lead())
        .await
        .unwrap();
    assert_eq!(answered.status, StepStatus::Confirmed);
}

async fn r7_without_a_lookup_a_person_answers(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "email_customer",
            json!({"to": "ana@example.com"}),
            Some(0),
        )
        .await
        .unwrap();
    let approval = s.store.pending_approvals().await.unwrap().remove(0);
    s.world.fail_next("mail.send", Fault::EffectThen504);
    let step = s
        .engine
        .decide_step(approval.id, &approval.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(step.status, StepStatus::Unknown);
    let read = s
        .engine
        .call(
            AGENT,
            run.id,
            "email_customer",
            json!({"to": "ana@example.com"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(read.outcome, OutcomeKind::Unknown);
    assert_eq!(
        s.world.effects("mail.send").len(),
        1,
        "never a second letter"
    );
    let waiting = s.store.run(run.id).await.unwrap().unwrap();
    assert_eq!(waiting.status, RunStatus::NeedsAttention);
    assert_eq!(waiting.resume_to, Some(RunStatus::Running));
    let asked = s.store.step(run.id, 0).await.unwrap().unwrap().updated_at;
    let answered = s
        .engine
        .answer(run.id, 0, true, Some("<msg-1@mail>".into()), asked, &lead())
        .await
        .unwrap();
    assert_eq!(answered.status, StepStatus::Confirmed);
    assert_eq!(answered.external_ref.as_deref(), Some("<msg-1@mail>"));
    assert_eq!(
        s.store.run(run.id).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let trail = s.store.events(Some(run.id), 100).await.unwrap();
    assert!(trail
        .iter()
        .any(|e| e.actor == Actor::User("dana".into())
            && e.to_status.as_deref() == Some("CONFIRMED")));
}

async fn step_rules_of_the_agent_api(s: Setup) {
    let run = s.run().await;
    let err = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "step_required");
    assert!(err.to_string().contains("next step is 0"), "{err}");
    let err = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(3))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "step_out_of_order");
    s.engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(0))
        .await
        .unwrap();
    let err = s
        .engine
        .call(AGENT, run.id, "charge_card", json!({"amount": 1}), Some(0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "step_mismatch");
    let err = s
        .engine
        .call(AGENT, run.id, "teleport", json!({}), Some(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unknown_tool");
    let err = s
        .engine
        .call("billing-bot", run.id, "create_ticket", json!({}), Some(1))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        "run_not_found",
        "another agent's run does not exist for it"
    );

    s.world.fail_next("payments.charge", Fault::EffectThenReset);
    s.world.lookups_down(true);
    let out = s
        .engine
        .call(AGENT, run.id, "charge_card", json!({"amount": 1}), Some(1))
        .await
        .unwrap();
    assert_eq!(out.outcome, OutcomeKind::Unknown);
    let err = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(2))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "step_unresolved");
    s.world.lookups_down(false);
    let out = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(2))
        .await
        .unwrap();
    assert_eq!(
        out.outcome,
        OutcomeKind::Confirmed,
        "reconciled inline, then the new step ran"
    );
    assert_eq!(
        s.store.step(run.id, 1).await.unwrap().unwrap().status,
        StepStatus::Confirmed
    );
    // Each refusal the agent caused is on its run's audit trail, under the
    // agent's name; another agent's attempt says nothing about this run.
    let refused: Vec<(Actor, String)> = s
        .store
        .events(Some(run.id), 100)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| {
            let code = saga_harness::saga::refusal::refused_code(e.detail.as_deref()?)?.to_owned();
            Some((e.actor, code))
        })
        .collect();
    let agent = || Actor::Agent(AGENT.into());
    assert_eq!(
        refused,
        vec![
            (agent(), "step_required".into()),
            (agent(), "step_out_of_order".into()),
            (agent(), "step_mismatch".into()),
            (agent(), "unknown_tool".into()),
            (agent(), "step_unresolved".into()),
        ]
    );
    assert_eq!(s.world.effects("payments.charge").len(), 1);
}

async fn r11_a_crash_before_the_outcome_commit_is_recovered_from_the_real_system(s: Setup) {
    let run = s.run().await;
    // The first part of the incident: a ticket whose create timed out after
    // it was made, retried with other wording.
    s.world.fail_next("tickets.create", Fault::EffectThen504);
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "charged twice"}),
            Some(0),
        )
        .await
        .unwrap();
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "double charge"}),
            Some(0),
        )
        .await
        .unwrap();
    // The charge: the row is committed and the card charged, then the
    // process dies before the outcome commit.
    let key = saga_harness::saga::key::step_key(run.id, 1, "charge_card");
    s.store
        .record_step(
            NewStep {
                run_id: run.id,
                step_idx: 1,
                tool: "charge_card".into(),
                tool_class: saga_harness::saga::class::ToolClass::Compensatable,
                idempotency_key: key.clone(),
                args: json!({"amount": 4200}),
                status: StepStatus::Intended,
                compensation: None,
                audience: saga_harness::saga::class::Audience::Finance,
                phase: saga_harness::saga::class::Phase::BeforePivot,
                limits: Default::default(),
            },
            &Actor::Agent(AGENT.into()),
        )
        .await
        .unwrap();
    s.world
        .execute("payments.charge", &key, &json!({"amount": 4200}))
        .await;
    // A fresh engine; the agent, resumed from the log, re-sends step 1.
    let engine = s.restarted();
    let out = engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 4200}),
            Some(1),
        )
        .await
        .unwrap();
    assert_eq!(out.outcome, OutcomeKind::Confirmed);
    assert_eq!(
        s.world.effects("payments.charge").len(),
        1,
        "exactly one charge"
    );
    assert_eq!(
        s.world.effects("tickets.create").len(),
        1,
        "exactly one ticket"
    );
    assert_eq!(s.world.open_tickets(), 1);
}

fn plan(calls: &[(&str, Value)]) -> Vec<PlannedCall> {
    calls
        .iter()
        .map(|(tool, args)| PlannedCall {
            tool: (*tool).into(),
            args: args.clone(),
        })
        .collect()
}

async fn r9_the_pivot_runs_exactly_the_approved_steps_in_order(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "refund"}),
            Some(0),
        )
        .await
        .unwrap();
    let first = s
        .engine
        .propose_pivot(
            AGENT,
            run.id,
            "charge and tell the customer",
            plan(&[("charge_card", json!({"amount": 100}))]),
        )
        .await
        .unwrap();
    let err = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "run_awaiting_approval");
    let second = s
        .engine
        .propose_pivot(
            AGENT,
            run.id,
            "charge and tell the customer",
            plan(&[
                ("charge_card", json!({"amount": 4200})),
                (
                    "announce",
                    json!({"to": ["a@example.com", "b@example.com"]}),
                ),
            ]),
        )
        .await
        .unwrap();
    assert_ne!(first.digest, second.digest);
    assert_eq!(second.plan["commit"][1]["reach"]["recipients"], 2);
    assert_eq!(second.plan["commit"][1]["gated"], true);
    let err = s
        .engine
        .decide_pivot(second.id, &first.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("plan changed"), "{err}");
    assert!(s.world.effects("payments.charge").is_empty());
    let done = s
        .engine
        .decide_pivot(second.id, &second.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    let charges = s.world.effects("payments.charge");
    assert_eq!(charges.len(), 1);
    assert_eq!(
        charges[0].args["amount"], 4200,
        "the approved arguments, not the first plan's"
    );
    assert_eq!(
        s.world.effects("mail.send").len(),
        1,
        "the gated tool ran as a commit step"
    );
    let steps = s.store.steps(run.id).await.unwrap();
    assert_eq!(steps.len(), 3);
    assert!(steps[1..]
        .iter()
        .all(|st| st.phase == saga_harness::saga::class::Phase::AfterPivot));
    assert_eq!(
        s.store
            .run(run.id)
            .await
            .unwrap()
            .unwrap()
            .irreversible_before_pivot,
        0
    );
    // A replay of the approval finds it done and sends nothing more.
    let replay = s
        .engine
        .decide_pivot(second.id, &second.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(replay.status, RunStatus::Completed);
    assert_eq!(s.world.effects("payments.charge").len(), 1);
    let err = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(3))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "run_past_pivot");
}

async fn r9_a_failed_commit_step_waits_for_a_person(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("warehouse.reship", Fault::Status(422));
    let after = approve_reship(&s, &run).await;
    assert_eq!(after.status, RunStatus::NeedsAttention);
    assert_eq!(after.resume_to, Some(RunStatus::Committing));
}

async fn r8_reject_unwinds_the_staged_steps(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "s"}),
            Some(0),
        )
        .await
        .unwrap();
    s.engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 700, "receipt": true}),
            Some(1),
        )
        .await
        .unwrap();
    let pivot = s
        .engine
        .propose_pivot(
            AGENT,
            run.id,
            "ship it",
            plan(&[("reship", json!({"sku": "A1"}))]),
        )
        .await
        .unwrap();
    let after = s
        .engine
        .decide_pivot(pivot.id, &pivot.digest, false, &lead(), Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(after.status, RunStatus::Unwound);
    assert_eq!(s.world.effects("tickets.close").len(), 1);
    assert_eq!(s.world.effects("payments.refund").len(), 1);
    assert_eq!(s.world.open_tickets(), 0);
    assert!(s.world.effects("warehouse.reship").is_empty());
    // The charge's receipt reached the customer: its refund gets a letter,
    // queued for a person; the internal ticket gets none.
    let corrections = s.store.corrections(run.id).await.unwrap();
    assert_eq!(corrections.len(), 1);
    assert_eq!(corrections[0].step_idx, 1);
    assert_eq!(
        corrections[0].audience,
        saga_harness::saga::class::Audience::Customer
    );
    assert!(
        s.world.effects("mail.send").is_empty(),
        "an unwind never sends on its own"
    );
}

async fn r8_a_refused_compensation_waits_for_a_person_who_undoes_it_by_hand(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "x"}),
            Some(0),
        )
        .await
        .unwrap();
    s.world.fail_next("tickets.close", Fault::Status(422));
    let waiting = s
        .engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    assert_eq!(waiting.status, RunStatus::NeedsAttention);
    assert!(s.world.effects("tickets.close").is_empty());
    // Nothing to send again: the system refused it. A person closes the
    // ticket by hand and says so; the unwind finishes.
    let person = Actor::User("dana".into());
    let asked = compensation_asked(&s, run.id).await;
    let err = s
        .engine
        .answer_compensation(run.id, 0, false, asked, &person)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("undone by hand"), "{err}");
    let row = s
        .engine
        .answer_compensation(run.id, 0, true, asked, &person)
        .await
        .unwrap();
    assert_eq!(row.status, StepStatus::Confirmed);
    let run = s.store.run(run.id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Unwound);
    assert_eq!(
        s.store.step(run.id, 0).await.unwrap().unwrap().status,
        StepStatus::Compensated
    );
    assert!(
        s.world.effects("tickets.close").is_empty(),
        "closed by hand, not by us"
    );
}

/// A run with one ticket opened and `faults` waiting for its close.
async fn run_whose_close_meets(s: &Setup, faults: &[Fault]) -> Run {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "x"}),
            Some(0),
        )
        .await
        .unwrap();
    for fault in faults {
        s.world.fail_next("tickets.close", fault.clone());
    }
    run
}

/// What the run's latest move to NEEDS_ATTENTION asked a person.
async fn question_asked(s: &Setup, run_id: uuid::Uuid) -> String {
    s.store
        .events(Some(run_id), 1000)
        .await
        .unwrap()
        .into_iter()
        .rev()
        .find(|e| e.entity.as_str() == "run" && e.to_status.as_deref() == Some("NEEDS_ATTENTION"))
        .and_then(|e| e.detail)
        .unwrap_or_default()
}

/// Proposes a one-step pivot (reship A1) and approves it in the dashboard;
/// the run as the decision left it.
async fn approve_reship(s: &Setup, run: &Run) -> Run {
    let pivot = s
        .engine
        .propose_pivot(
            AGENT,
            run.id,
            "reship",
            plan(&[("reship", json!({"sku": "A1"}))]),
        )
        .await
        .unwrap();
    s.engine
        .decide_pivot(pivot.id, &pivot.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap()
}

/// The gaps between the calls of `operation` that reached the world.
fn gaps(s: &Setup, operation: &str) -> Vec<std::time::Duration> {
    s.world
        .sent_at(operation)
        .windows(2)
        .map(|w| w[1] - w[0])
        .collect()
}

async fn r8_a_compensation_refused_for_now_is_sent_again_after_the_wait_the_system_asked(s: Setup) {
    let wait = std::time::Duration::from_millis(1200);
    let run = run_whose_close_meets(&s, &[Fault::Deferred(Some(wait))]).await;
    let after = s
        .engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    assert_eq!(after.status, RunStatus::Unwound);
    assert_eq!(s.world.effects("tickets.close").len(), 1, "closed once");
    assert_eq!(s.world.open_tickets(), 0);
    let gaps = gaps(&s, "tickets.close");
    assert_eq!(gaps.len(), 1, "one refusal, one re-send");
    assert!(
        gaps[0] >= wait,
        "re-sent after {:?}, asked {wait:?}",
        gaps[0]
    );
}

async fn r8_a_compensation_still_refused_after_its_re_sends_asks_a_person(s: Setup) {
    let run = run_whose_close_meets(&s, &vec![Fault::Deferred(None); 5]).await;
    let after = s
        .engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    assert_eq!(after.status, RunStatus::NeedsAttention);
    assert!(s.world.effects("tickets.close").is_empty());
    assert_eq!(s.world.open_tickets(), 1, "the ticket is still open");
    let gaps = gaps(&s, "tickets.close");
    assert_eq!(gaps.len(), 4, "five sends in all: {gaps:?}");
    assert!(
        gaps.windows(2).all(|w| w[1] > w[0]) && gaps[0] >= std::time::Duration::from_millis(250),
        "each pause longer than the one before: {gaps:?}"
    );
    let question = question_asked(&s, run.id).await;
    assert!(
        question.contains("was refused for now 5 times") && question.contains("HTTP 429"),
        "{question}"
    );
}

async fn r9_a_commit_step_asked_to_wait_longer_than_the_engine_holds_goes_to_a_person_at_once(
    s: Setup,
) {
    let run = s.run().await;
    s.world.fail_next(
        "warehouse.reship",
        Fault::Deferred(Some(std::time::Duration::from_secs(120))),
    );
    let started = std::time::Instant::now();
    let after = approve_reship(&s, &run).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(after.status, RunStatus::NeedsAttention);
    assert_eq!(after.resume_to, Some(RunStatus::Committing));
    assert_eq!(
        s.world.sent_at("warehouse.reship").len(),
        1,
        "not sent again"
    );
    let question = question_asked(&s, run.id).await;
    assert!(question.contains("asked to wait 120 s"), "{question}");
}

async fn r9_a_commit_step_refused_for_now_is_sent_again_after_a_pause(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("warehouse.reship", Fault::Deferred(None));
    let after = approve_reship(&s, &run).await;
    assert_eq!(after.status, RunStatus::Completed);
    assert_eq!(
        s.world.effects("warehouse.reship").len(),
        1,
        "reshipped once"
    );
    let gaps = gaps(&s, "warehouse.reship");
    assert_eq!(gaps.len(), 1);
    assert!(gaps[0] >= std::time::Duration::from_millis(250), "{gaps:?}");
}

async fn r8_an_unknown_compensation_a_person_says_did_not_happen_is_sent_again_once(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "x"}),
            Some(0),
        )
        .await
        .unwrap();
    // The close times out without taking effect, and no lookup answers.
    s.world
        .fail_next("tickets.close", Fault::TimeoutWithoutEffect);
    s.world.lookups_down(true);
    let waiting = s
        .engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    assert_eq!(waiting.status, RunStatus::NeedsAttention);
    s.world.lookups_down(false);
    let asked = compensation_asked(&s, run.id).await;
    // An answer to an earlier asking of this question (a replayed form)
    // settles nothing and sends nothing.
    let replayed = s
        .engine
        .answer_compensation(
            run.id,
            0,
            false,
            asked - chrono::Duration::seconds(1),
            &Actor::User("dana".into()),
        )
        .await;
    assert!(
        matches!(replayed, Err(Refusal::QuestionAskedAgain { step: 0 })),
        "{replayed:?}"
    );
    s.engine
        .answer_compensation(run.id, 0, false, asked, &Actor::User("dana".into()))
        .await
        .unwrap();
    let run = s.store.run(run.id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Unwound);
    assert_eq!(s.world.effects("tickets.close").len(), 1, "closed once");
    assert_eq!(s.world.open_tickets(), 0);
}

async fn r9_a_person_may_unwind_a_run_whose_commit_waits_for_them(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "x"}),
            Some(0),
        )
        .await
        .unwrap();
    let plan = vec![PlannedCall {
        tool: "reship".into(),
        args: json!({"sku": "A1"}),
    }];
    let approval = s
        .engine
        .propose_pivot(AGENT, run.id, "reship", plan)
        .await
        .unwrap();
    s.world.fail_next("warehouse.reship", Fault::Status(422));
    let person = Actor::User("dana".into());
    let after = s
        .engine
        .decide_pivot(approval.id, &approval.digest, true, &person, Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(after.status, RunStatus::NeedsAttention);
    // An agent may not; a person may.
    let refused = s
        .engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "give up")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "run_needs_attention");
    assert!(
        refused.to_string().contains("only a person may unwind it"),
        "{refused}"
    );
    let unwound = s
        .engine
        .unwind(run.id, &person, "out of stock")
        .await
        .unwrap();
    assert_eq!(unwound.status, RunStatus::Unwound);
    assert_eq!(s.world.open_tickets(), 0);
}

async fn r7_an_unknown_nobody_comes_back_for_is_reconciled_by_the_sweep(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("tickets.create", Fault::EffectThen504);
    let out = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "x"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(out.outcome, OutcomeKind::Unknown);
    // Too fresh: left for the agent's own re-send.
    let fresh = s
        .engine
        .reconcile_stale(chrono::Duration::seconds(60))
        .await
        .unwrap();
    assert_eq!(fresh, 0);
    let settled = s
        .engine
        .reconcile_stale(chrono::Duration::zero())
        .await
        .unwrap();
    assert_eq!(settled, 1);
    let step = s.store.step(run.id, 0).await.unwrap().unwrap();
    assert_eq!(step.status, StepStatus::Confirmed);
    assert_eq!(s.world.effects("tickets.create").len(), 1);
}

async fn r8_compensations_run_internal_first_then_newest_first(s: Setup) {
    use saga_harness::saga::class::Audience;
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 1, "receipt": true}),
            Some(0),
        )
        .await
        .unwrap();
    s.engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(1))
        .await
        .unwrap();
    s.engine
        .call(AGENT, run.id, "charge_card", json!({"amount": 2}), Some(2))
        .await
        .unwrap();
    s.engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(3))
        .await
        .unwrap();
    let steps = s.store.steps(run.id).await.unwrap();
    assert_eq!(steps[0].audience, Audience::Customer);
    assert_eq!(Engine::compensation_order(&steps), vec![3, 1, 2, 0]);
    s.engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    let done: Vec<i64> = s
        .store
        .compensations(run.id)
        .await
        .unwrap()
        .iter()
        .map(|c| c.step_idx)
        .collect();
    assert_eq!(done, vec![3, 1, 2, 0]);
}

async fn r8_an_unwind_that_dies_halfway_resumes_without_doubling(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 900}),
            Some(0),
        )
        .await
        .unwrap();
    s.engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(1))
        .await
        .unwrap();
    // The refund's intent is written and sent, then the process dies.
    s.world
        .fail_next("tickets.close", Fault::TimeoutWithoutEffect);
    s.store
        .move_run(
            run.id,
            RunStatus::Running,
            RunStatus::Unwinding,
            &lead(),
            Some("test"),
        )
        .await
        .unwrap();
    let key = saga_harness::saga::key::compensation_key(run.id, 0, "charge_card");
    let charge_key = saga_harness::saga::key::step_key(run.id, 0, "charge_card");
    s.store
        .record_compensation(
            saga_harness::saga::model::NewCompensation {
                run_id: run.id,
                step_idx: 0,
                tool: "refund".into(),
                idempotency_key: key.clone(),
                args: json!({"charge_key": charge_key, "amount": 900}),
            },
            &Actor::System,
        )
        .await
        .unwrap();
    s.world
        .execute("payments.refund", &key, &json!({"charge_key": charge_key}))
        .await;
    let after = s.restarted().continue_unwind(run.id).await.unwrap();
    assert_eq!(after.status, RunStatus::Unwound);
    assert_eq!(
        s.world.effects("payments.refund").len(),
        1,
        "refunded exactly once"
    );
    assert_eq!(s.world.effects("tickets.close").len(), 1);
}

async fn the_seed_incident(s: Setup) {
    let run = s.run().await;
    // create_ticket: the ticket is made, the gateway answers 504.
    s.world.fail_next("tickets.create", Fault::EffectThen504);
    let out = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "Customer charged twice"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(out.outcome, OutcomeKind::Unknown);
    // The agent retries at the same step with other words.
    s.engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "Double charge, please refund"}),
            Some(0),
        )
        .await
        .unwrap();
    // The card is charged, and the engine dies before the outcome commit.
    let key = saga_harness::saga::key::step_key(run.id, 1, "charge_card");
    let args = json!({"amount": 4999, "receipt": false, "email": "ada@example.com"});
    s.store
        .record_step(
            NewStep {
                run_id: run.id,
                step_idx: 1,
                tool: "charge_card".into(),
                tool_class: saga_harness::saga::class::ToolClass::Compensatable,
                idempotency_key: key.clone(),
                args: args.clone(),
                status: StepStatus::Intended,
                compensation: registry()
                    .get("charge_card")
                    .unwrap()
                    .way_back(&key, &args)
                    .unwrap(),
                audience: saga_harness::saga::class::Audience::Finance,
                phase: saga_harness::saga::class::Phase::BeforePivot,
                limits: Default::default(),
            },
            &Actor::Agent(AGENT.into()),
        )
        .await
        .unwrap();
    s.world.execute("payments.charge", &key, &args).await;
    // A fresh engine; the agent re-sends the charge for that step.
    let engine = s.restarted();
    let charged = engine
        .call(AGENT, run.id, "charge_card", args.clone(), Some(1))
        .await
        .unwrap();
    assert_eq!(charged.outcome, OutcomeKind::Confirmed);
    // The warehouse rejects the reship.
    s.world.fail_next("warehouse.reship", Fault::Status(422));
    let reship = engine
        .call(AGENT, run.id, "reship", json!({"sku": "A1"}), Some(2))
        .await
        .unwrap();
    assert_eq!(reship.outcome, OutcomeKind::Failed);
    let after = engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "reship rejected")
        .await
        .unwrap();
    assert_eq!(after.status, RunStatus::Unwound);
    // Checked in the world, not in the log.
    assert_eq!(
        s.world.effects("tickets.create").len(),
        1,
        "exactly one ticket"
    );
    assert_eq!(s.world.effects("tickets.close").len(), 1, "closed once");
    assert_eq!(
        s.world.effects("payments.charge").len(),
        1,
        "exactly one charge"
    );
    assert_eq!(s.world.effects("payments.refund").len(), 1, "refunded once");
    assert!(
        s.world.effects("mail.send").is_empty(),
        "no customer email: receipts were off"
    );
    assert!(
        s.world.effects("warehouse.cancel").is_empty(),
        "nothing undone that never happened"
    );
    assert_eq!(s.world.open_tickets(), 0);
    // Who each correction is addressed to: the charge was seen by finance
    // only, so its correction goes to finance and never to the customer.
    let addressed: Vec<Vec<String>> = s
        .store
        .corrections(run.id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.recipients)
        .collect();
    assert_eq!(
        addressed,
        vec![vec!["finance@example.com".to_owned()]],
        "no letter to a customer who never saw the charge"
    );
}

async fn r10_a_refund_the_customer_saw_is_corrected_to_the_customer_only(s: Setup) {
    let run = s.run().await;
    let args = json!({"amount": 900, "receipt": true, "email": "ada@example.com"});
    let charged = s
        .engine
        .call(AGENT, run.id, "charge_card", args, Some(0))
        .await
        .unwrap();
    assert_eq!(charged.outcome, OutcomeKind::Confirmed);
    s.engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    let addressed: Vec<Vec<String>> = s
        .store
        .corrections(run.id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.recipients)
        .collect();
    assert_eq!(addressed, vec![vec!["ada@example.com".to_owned()]]);
}

/// A run whose first step opened a ticket behind a gateway that answered
/// 504: the ticket exists, the agent was told `unknown`.
async fn ticket_unknown_after_504(s: &Setup) -> (Run, saga_harness::saga::engine::CallOutcome) {
    let run = s.run().await;
    s.world.fail_next("tickets.create", Fault::EffectThen504);
    let first = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "Kettle broken"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(first.outcome, OutcomeKind::Unknown);
    (run, first)
}

async fn r12_an_unknown_step_stays_next_until_the_agent_has_its_outcome(s: Setup) {
    let (run, first) = ticket_unknown_after_504(&s).await;
    assert_eq!(
        (first.next_step, first.new_step),
        (0, 1),
        "the unknown step is the one to send next"
    );
    let (_, _, cursor) = s.engine.agents_view(AGENT, run.id).await.unwrap();
    assert_eq!(
        (cursor.next_step, cursor.new_step),
        (0, 1),
        "the run's view agrees"
    );
    // An agent that trusts next_step re-sends step 0, reworded, and gets
    // its real outcome: no second ticket.
    let retried = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "Please open a ticket: kettle"}),
            Some(first.next_step),
        )
        .await
        .unwrap();
    assert_eq!(retried.outcome, OutcomeKind::Confirmed);
    assert_eq!(
        (retried.next_step, retried.new_step),
        (1, 1),
        "given its outcome, the cursor advances"
    );
    assert_eq!(s.world.effects("tickets.create").len(), 1, "one ticket");
}

async fn r12_a_reworded_retry_at_a_new_step_is_refused_while_the_first_is_owed(s: Setup) {
    let (run, _) = ticket_unknown_after_504(&s).await;
    // The model rewords and takes a new step: refused, naming step 0.
    let refused = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "Open a ticket for the kettle"}),
            Some(1),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "retry_of_unresolved_step");
    let message = refused.to_string();
    assert!(message.contains("re-send step 0"), "{message}");
    assert!(message.contains("it is unknown now"), "{message}");
    assert_eq!(
        s.world.effects("tickets.create").len(),
        1,
        "still one ticket"
    );
    // Another tool at the new step is not a retry of step 0.
    let charged = s
        .engine
        .call(
            AGENT,
            run.id,
            "charge_card",
            json!({"amount": 100, "receipt": false}),
            Some(1),
        )
        .await
        .unwrap();
    assert_eq!(charged.outcome, OutcomeKind::Confirmed);
    assert_eq!(
        (charged.next_step, charged.new_step),
        (0, 2),
        "step 0 is still owed"
    );
    // A second ticket on purpose: allowed, and recorded.
    let second = s
        .engine
        .call_with(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "A second, separate ticket"}),
            Some(2),
            true,
        )
        .await
        .unwrap();
    assert_eq!(second.outcome, OutcomeKind::Confirmed);
    assert_eq!(s.world.effects("tickets.create").len(), 2);
    let events = s.store.events(Some(run.id), 100).await.unwrap();
    assert!(
        events.iter().any(|e| e.actor == Actor::Agent(AGENT.into())
            && e.detail
                .as_deref()
                .is_some_and(|d| d.contains("sent as a new effect while step 0"))),
        "the override is in the audit trail: {events:?}"
    );
}

async fn r12_reading_the_run_gives_the_agent_a_final_outcome(s: Setup) {
    let (run, _) = ticket_unknown_after_504(&s).await;
    // The sweep settles it while the agent is away.
    let step = s.store.step(run.id, 0).await.unwrap().unwrap();
    let settled = s.engine.reconcile(step).await.unwrap();
    assert_eq!(settled.status, StepStatus::Confirmed);
    assert!(
        settled.owed_to_agent,
        "settled, but the agent has not read it yet"
    );
    let (_, steps, cursor) = s.engine.agents_view(AGENT, run.id).await.unwrap();
    assert_eq!(steps[0].status, StepStatus::Confirmed);
    assert_eq!(
        (cursor.next_step, cursor.new_step),
        (1, 1),
        "read in the run, it is given"
    );
    let next = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "A follow-up ticket"}),
            Some(1),
        )
        .await
        .unwrap();
    assert_eq!(next.outcome, OutcomeKind::Confirmed);
}

async fn r12_a_step_waiting_for_a_person_says_so_to_a_new_step(s: Setup) {
    let run = s.run().await;
    let held = s
        .engine
        .call(
            AGENT,
            run.id,
            "email_customer",
            json!({"to": "ana@example.com", "body": "hi"}),
            Some(0),
        )
        .await
        .unwrap();
    assert_eq!(held.outcome, OutcomeKind::AwaitingApproval);
    assert_eq!((held.next_step, held.new_step), (0, 1));
    let refused = s
        .engine
        .call(
            AGENT,
            run.id,
            "create_ticket",
            json!({"summary": "x"}),
            Some(1),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "step_unresolved");
    let message = refused.to_string();
    assert!(
        message.contains("waits for a person's approval"),
        "{message}"
    );
    assert!(!message.contains("resolving"), "{message}");
}

/// An email approved before the pivot and sent, then the run unwound: the
/// correction it leaves behind.
async fn sent_email_then_unwound(s: &Setup) -> (Run, i64) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "email_customer",
            json!({"to": "ana@example.com", "body": "refund sent"}),
            Some(0),
        )
        .await
        .unwrap();
    let approval = s.store.pending_approvals().await.unwrap().remove(0);
    s.engine
        .decide_step(approval.id, &approval.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap();
    s.engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "wrong customer")
        .await
        .unwrap();
    assert_eq!(
        s.world.effects("mail.send").len(),
        1,
        "the unwind sent nothing"
    );
    let queued = s.store.correction_queue().await.unwrap();
    assert_eq!(queued.len(), 1);
    (run, queued[0].id)
}

async fn r10_a_correction_is_signed_off_then_sent_once(s: Setup) {
    use saga_harness::saga::status::CorrectionStatus;
    let (_, id) = sent_email_then_unwound(&s).await;
    let queued = s.store.correction(id).await.unwrap().unwrap();
    assert_eq!(queued.recipients, vec!["ana@example.com".to_owned()]);
    let sent = s
        .engine
        .send_correction(
            id,
            Some("Sorry, that refund note was not for you."),
            &lead(),
        )
        .await
        .unwrap();
    assert_eq!(sent.status, CorrectionStatus::Sent);
    let mails = s.world.effects("mail.send");
    assert_eq!(mails.len(), 2);
    assert_eq!(
        mails[1].args["body"],
        "Sorry, that refund note was not for you."
    );
    assert_eq!(mails[1].key, queued.idempotency_key);
    let again = s
        .engine
        .send_correction(id, Some("another text"), &lead())
        .await
        .unwrap();
    assert_eq!(again.status, CorrectionStatus::Sent);
    assert_eq!(
        again.message, "Sorry, that refund note was not for you.",
        "frozen once sent"
    );
    assert_eq!(
        s.world.effects("mail.send").len(),
        2,
        "never a second letter"
    );
}

async fn r10_an_unknown_send_is_a_question_not_a_second_letter(s: Setup) {
    use saga_harness::saga::status::CorrectionStatus;
    let (_, id) = sent_email_then_unwound(&s).await;
    s.world.fail_next("mail.send", Fault::EffectThen504);
    let unknown = s.engine.send_correction(id, None, &lead()).await.unwrap();
    assert_eq!(unknown.send_status, Some(StepStatus::Unknown));
    assert_eq!(unknown.status, CorrectionStatus::Approved);
    let clicked_again = s.engine.send_correction(id, None, &lead()).await.unwrap();
    assert_eq!(clicked_again.send_status, Some(StepStatus::Unknown));
    assert_eq!(
        s.world.effects("mail.send").len(),
        2,
        "one original, one correction"
    );
    let answered = s.engine.answer_correction(id, true, &lead()).await.unwrap();
    assert_eq!(answered.status, CorrectionStatus::Sent);
}

async fn r11_resume_continues_committing_and_unwinding_runs_from_the_log(s: Setup) {
    use saga_harness::saga::model::Decision;
    // A pivot approved just before a crash: nothing of the commit was sent.
    let committing = s.run().await;
    let pivot = s
        .engine
        .propose_pivot(
            AGENT,
            committing.id,
            "charge",
            plan(&[("charge_card", json!({"amount": 10}))]),
        )
        .await
        .unwrap();
    s.store
        .decide_approval(
            Decision {
                approval_id: pivot.id,
                digest: pivot.digest.clone(),
                to: ApprovalStatus::Approved,
                note: None,
                run_move: Some((RunStatus::AwaitingApproval, RunStatus::Committing)),
            },
            &lead(),
        )
        .await
        .unwrap();
    // An unwind started just before a crash.
    let unwinding = s.run_left_unwinding().await;
    let engine = s.restarted();
    let report = engine.resume().await.unwrap();
    assert_eq!((report.committed, report.unwound), (1, 1));
    assert_eq!(
        s.store.run(committing.id).await.unwrap().unwrap().status,
        RunStatus::Completed
    );
    assert_eq!(
        s.store.run(unwinding.id).await.unwrap().unwrap().status,
        RunStatus::Unwound
    );
    assert_eq!(s.world.effects("payments.charge").len(), 1);
    assert_eq!(s.world.effects("tickets.close").len(), 1);
    // A second resume (another crash and restart) does nothing more.
    let again = s.restarted().resume().await.unwrap();
    assert_eq!((again.committed, again.unwound), (0, 0));
    assert_eq!(s.world.effects("payments.charge").len(), 1);
    assert_eq!(s.world.effects("tickets.close").len(), 1);
}

/// R11 while serving: an unwind a stopped instance left behind is carried
/// on by the sweep of a live one, once nobody holds the run; a run some
/// instance holds now is left to it, and nothing is undone twice.
async fn r11_the_sweep_carries_on_an_unwind_left_behind_but_never_a_held_one(s: Setup) {
    let left = s.run_left_unwinding().await;
    let sweeper = s.restarted();
    // Held by an instance that is still working on it: left alone.
    let held = s.store.claim_run(left.id).await.unwrap();
    if s.store.backend() == saga_harness::saga::store::Backend::Postgres {
        let report = sweeper
            .resume_left_behind(chrono::Duration::zero())
            .await
            .unwrap();
        assert_eq!((report.unwound, report.busy), (0, 1));
        assert!(s.world.effects("tickets.close").is_empty());
    }
    drop(held);
    // Not yet old enough: an unwind in progress elsewhere may be between
    // two claims.
    let report = sweeper
        .resume_left_behind(chrono::Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(report.unwound, 0);
    let report = common::until("the released claim to reach the database", || async {
        let report = sweeper
            .resume_left_behind(chrono::Duration::zero())
            .await
            .unwrap();
        (report.unwound == 1).then_some(report)
    })
    .await;
    assert_eq!(report.unwound, 1);
    assert_eq!(
        s.store.run(left.id).await.unwrap().unwrap().status,
        RunStatus::Unwound
    );
    assert_eq!(s.world.effects("tickets.close").len(), 1);
    let again = sweeper
        .resume_left_behind(chrono::Duration::zero())
        .await
        .unwrap();
    assert_eq!(again.unwound, 0);
    assert_eq!(s.world.effects("tickets.close").len(), 1);
}

async fn r5_the_key_reaches_the_system_and_the_external_id_is_kept(s: Setup) {
    let run = s.run().await;
    let out = s
        .engine
        .call(
            AGENT,
            run.id,
            "authorize_card",
            json!({"amount": 300}),
            Some(0),
        )
        .await
        .unwrap();
    let key = saga_harness::saga::key::step_key(run.id, 0, "authorize_card");
    assert_eq!(out.key.as_deref(), Some(key.as_str()));
    let effect = s.world.effects("payments.authorize").remove(0);
    assert_eq!(effect.key, key, "the system received the step's key");
    let step = s.store.step(run.id, 0).await.unwrap().unwrap();
    assert_eq!(step.external_ref.as_deref(), Some(effect.id.as_str()));
    assert_eq!(out.external_ref.as_deref(), Some(effect.id.as_str()));
}

async fn complete_is_refused_while_an_authorisation_is_open(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "authorize_card",
            json!({"amount": 300}),
            Some(0),
        )
        .await
        .unwrap();
    let err = s.engine.complete(AGENT, run.id).await.unwrap_err();
    assert_eq!(err.code(), "run_has_open_effects");
    assert!(err.to_string().contains("authorize_card"), "{err}");
    let unwound = s
        .engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "not needed")
        .await
        .unwrap();
    assert_eq!(unwound.status, RunStatus::Unwound);
    assert_eq!(
        s.world.effects("payments.cancel").len(),
        1,
        "the hold was released"
    );
    let other = s.run().await;
    s.engine
        .call(AGENT, other.id, "create_ticket", json!({}), Some(0))
        .await
        .unwrap();
    assert_eq!(
        s.engine.complete(AGENT, other.id).await.unwrap().status,
        RunStatus::Completed
    );
}

async fn r9_a_pivot_left_pending_past_the_authorisations_is_rejected(s: Setup) {
    let run = s.run().await;
    s.engine
        .call(
            AGENT,
            run.id,
            "authorize_card",
            json!({"amount": 300}),
            Some(0),
        )
        .await
        .unwrap();
    let pivot = s
        .engine
        .propose_pivot(
            AGENT,
            run.id,
            "capture",
            plan(&[("charge_card", json!({"amount": 300}))]),
        )
        .await
        .unwrap();
    let deadline = pivot
        .expires_at
        .expect("a staged authorisation sets a deadline");
    let staged = s.store.step(run.id, 0).await.unwrap().unwrap();
    assert_eq!(
        deadline,
        staged.created_at + saga_harness::saga::pivot::AUTHORISATION_LIFETIME
    );
    // The same plan, as if proposed eight days ago: its deadline has passed.
    let stale = s
        .store
        .request_approval(
            saga_harness::saga::model::NewApproval {
                run_id: run.id,
                kind: saga_harness::saga::model::ApprovalKind::Pivot,
                step_idx: None,
                summary: pivot.summary.clone(),
                plan: pivot.plan.clone(),
                digest: pivot.digest.clone(),
                expires_at: Some(chrono::Utc::now() - chrono::Duration::days(1)),
                approvers_needed: 1,
            },
            None,
            &Actor::Agent(AGENT.into()),
        )
        .await
        .unwrap();
    let report = s.restarted().resume().await.unwrap();
    assert_eq!(report.expired_approvals, 1);
    assert_eq!(
        s.store.approval(stale.id).await.unwrap().unwrap().status,
        ApprovalStatus::Expired
    );
    assert_eq!(
        s.store.run(run.id).await.unwrap().unwrap().status,
        RunStatus::Unwound
    );
    assert_eq!(s.world.effects("payments.cancel").len(), 1);
    assert!(s.world.effects("payments.charge").is_empty());
}

async fn a_resent_step_of_a_finished_run_is_read_never_executed(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("tickets.create", Fault::Status(429));
    let first = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(0))
        .await
        .unwrap();
    assert_eq!(first.outcome, OutcomeKind::NotExecuted);
    s.engine
        .unwind(run.id, &Actor::Agent(AGENT.into()), "not needed")
        .await
        .unwrap();
    let read = s
        .engine
        .call(AGENT, run.id, "create_ticket", json!({}), Some(0))
        .await
        .unwrap();
    assert_eq!(read.outcome, OutcomeKind::NotExecuted);
    assert!(
        s.world.effects("tickets.create").is_empty(),
        "nothing new in an unwound run"
    );
}

async fn r7_an_answer_lets_the_waiting_commit_carry_on(s: Setup) {
    let run = s.run().await;
    s.world.fail_next("mail.send", Fault::EffectThen504);
    let pivot = s
        .engine
        .propose_pivot(
            AGENT,
            run.id,
            "announce, then open a follow-up ticket",
            plan(&[
                ("announce", json!({"to": ["a@example.com"]})),
                ("create_ticket", json!({"summary": "follow-up"})),
            ]),
        )
        .await
        .unwrap();
    let waiting = s
        .engine
        .decide_pivot(pivot.id, &pivot.digest, true, &lead(), Via::Dashboard)
        .await
        .unwrap();
    assert_eq!(waiting.status, RunStatus::NeedsAttention);
    assert!(s.world.effects("tickets.create").is_empty());
    let asked = s.store.step(run.id, 0).await.unwrap().unwrap().updated_at;
    s.engine
        .answer(run.id, 0, true, None, asked, &lead())
        .await
        .unwrap();
    assert_eq!(
        s.store.run(run.id).await.unwrap().unwrap().status,
        RunStatus::Completed
    );
    assert_eq!(
        s.world.effects("mail.send").len(),
        1,
        "the announcement went out once"
    );
    assert_eq!(s.world.effects("tickets.create").len(), 1);
}

/// The engine under test, over a fresh world.
fn setup(store: Arc<dyn SagaStore>) -> Setup {
    Setup::new(store)
}

common::on_both_backends!(
    setup;
    r2_pure_calls_take_no_step_and_write_nothing,
    r2_no_intended_row_no_call,
    r3_a_reworded_retry_gets_the_recorded_outcome_not_a_second_effect,
    r12_a_call_without_a_step_goes_to_the_tools_oldest_owed_step,
    r12_a_final_outcome_the_client_gave_up_on_stays_owed_to_its_retry,
    a_call_without_a_step_on_a_ready_run_is_claimed_and_recorded_at_once,
    r7_an_answer_given_again_does_not_settle_a_later_question,
    r4_not_executed_is_retried_under_the_same_key,
    r4_a_refusal_is_failed_and_final,
    r6_a_call_whose_way_back_cannot_be_built_waits_for_a_person,
    r9_a_held_step_cannot_be_approved_after_its_deadline,
    r6_the_compensation_is_written_before_the_call_and_names_the_key,
    r9_irreversible_calls_before_the_pivot_are_held_and_counted,
    r9_gated_tools_are_refused_outside_a_pivot,
    r6_a_tool_reserved_for_ways_back_is_not_an_agent_step,
    r7_lookup_lag_is_waited_out_once,
    r7_not_found_twice_is_not_executed_and_the_retry_uses_the_key,
    r7_without_a_lookup_a_person_answers,
    step_rules_of_the_agent_api,
    r11_a_crash_before_the_outcome_commit_is_recovered_from_the_real_system,
    r9_the_pivot_runs_exactly_the_approved_steps_in_order,
    r9_a_failed_commit_step_waits_for_a_person,
    r8_reject_unwinds_the_staged_steps,
    r8_compensations_run_internal_first_then_newest_first,
    r7_an_unknown_nobody_comes_back_for_is_reconciled_by_the_sweep,
    r8_a_refused_compensation_waits_for_a_person_who_undoes_it_by_hand,
    r8_an_unknown_compensation_a_person_says_did_not_happen_is_sent_again_once,
    r9_a_person_may_unwind_a_run_whose_commit_waits_for_them,
    r8_an_unwind_that_dies_halfway_resumes_without_doubling,
    the_seed_incident,
    r10_a_refund_the_customer_saw_is_corrected_to_the_customer_only,
    r12_an_unknown_step_stays_next_until_the_agent_has_its_outcome,
    r12_a_reworded_retry_at_a_new_step_is_refused_while_the_first_is_owed,
    r12_reading_the_run_gives_the_agent_a_final_outcome,
    r12_a_step_waiting_for_a_person_says_so_to_a_new_step,
    r10_a_correction_is_signed_off_then_sent_once,
    r10_an_unknown_send_is_a_question_not_a_second_letter,
    r11_resume_continues_committing_and_unwinding_runs_from_the_log,
    r11_the_sweep_carries_on_an_unwind_left_behind_but_never_a_held_one,
    r5_the_key_reaches_the_system_and_the_external_id_is_kept,
    complete_is_refused_while_an_authorisation_is_open,
    r9_a_pivot_left_pending_past_the_authorisations_is_rejected,
    a_resent_step_of_a_finished_run_is_read_never_executed,
    r7_an_answer_lets_the_waiting_commit_carry_on,
    r8_a_compensation_refused_for_now_is_sent_again_after_the_wait_the_system_asked,
    r8_a_compensation_still_refused_after_its_re_sends_asks_a_person,
    r9_a_commit_step_asked_to_wait_longer_than_the_engine_holds_goes_to_a_person_at_once,
    r9_a_commit_step_refused_for_now_is_sent_again_after_a_pause,
);

/// Holds every `tickets.create` until released, as a slow backend would.
struct Slow {
    world: Arc<World>,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Slow {
    fn over(world: Arc<World>) -> Arc<Slow> {
        Arc::new(Slow {
            world,
            entered: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        })
    }
}

#[async_trait::async_trait]
impl Connector for Slow {
    async fn execute(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> saga_harness::saga::connector::CallReport {
        if operation == "tickets.create" {
            self.entered.notify_one();
            self.release.notified().await;
        }
        self.world.execute(operation, key, args).await
    }
    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<saga_harness::saga::connector::Lookup, saga_harness::saga::connector::LookupError>
    {
        self.world.lookup(operation, key, args).await
    }
    fn has_lookup(&self, operation: &str) -> bool {
        self.world.has_lookup(operation)
    }
    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        self.world.external_ref(operation, body)
    }
}

/// Two harness processes on one PostgreSQL: while instance A's call is in
/// flight, the agent's retry lands on instance B. B must wait for A's claim
/// on the run and then read A's outcome, not reconcile a call that has not
/// landed yet and send it again.
#[tokio::test]
async fn postgres_two_instances_never_send_one_step_twice() {
    let db = crate::common::postgres_or_skip!();
    let store_a = saga_harness::store::open(&db.url)
        .await
        .unwrap()
        .saga_store();
    let store_b = saga_harness::store::open(&db.url)
        .await
        .unwrap()
        .saga_store();
    let world = Arc::new(World::new());
    let slow = Slow::over(world.clone());
    let a = Arc::new(Engine::new(store_a.clone(), registry(), slow.clone()));
    let b = Arc::new(Engine::new(store_b, registry(), world.clone()));
    let run = Setup::new(store_a).run().await;
    let first = tokio::spawn({
        let a = a.clone();
        async move {
            a.call(
                AGENT,
                run.id,
                "create_ticket",
                json!({"summary": "charged twice"}),
                Some(0),
            )
            .await
        }
    });
    slow.entered.notified().await;
    let second = tokio::spawn({
        let b = b.clone();
        async move {
            b.call(
                AGENT,
                run.id,
                "create_ticket",
                json!({"summary": "DOUBLE charge"}),
                Some(0),
            )
            .await
        }
    });
    // Time for B's retry to reach the run while A's call is in flight (the
    // race this test is about); what B did is read from the world below.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "instance B did not wait for A's claim on the run"
    );
    slow.release.notify_one();
    let a_outcome = first.await.unwrap().unwrap();
    let b_outcome = second.await.unwrap().unwrap();
    assert_eq!(a_outcome.outcome, OutcomeKind::Confirmed);
    assert_eq!(b_outcome.outcome, OutcomeKind::Confirmed);
    assert_eq!(a_outcome.external_ref, b_outcome.external_ref);
    assert_eq!(
        world.effects("tickets.create").len(),
        1,
        "one ticket, whoever answered"
    );
    assert_eq!(
        world.sent_at("tickets.create").len(),
        1,
        "B never sent the call again, not even under the same key"
    );
}

/// Another agent's calls on a run are refused without waiting for (or
/// holding) the owner's lock, and the per-run locks do not pile up with
/// every run the process has seen.
#[tokio::test]
async fn another_agents_calls_never_wait_for_the_owners_lock() {
    let db = common::sqlite();
    let store = saga_harness::store::open(&db.url)
        .await
        .unwrap()
        .saga_store();
    let world = Arc::new(World::new());
    let slow = Slow::over(world.clone());
    let engine = Arc::new(Engine::new(store.clone(), registry(), slow.clone()));
    let s = Setup {
        store: store.clone(),
        world,
        engine: Engine::new(store.clone(), registry(), slow.clone()),
    };
    let run = s.run().await;
    let owner = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .call(
                    AGENT,
                    run.id,
                    "create_ticket",
                    json!({"summary": "x"}),
                    Some(0),
                )
                .await
        })
    };
    // The owner's call is in flight, holding the run.
    slow.entered.notified().await;
    for _ in 0..3 {
        let refused = tokio::time::timeout(
            std::time::Duration::from_millis(500),
            engine.call("intruder", run.id, "create_ticket", json!({}), Some(0)),
        )
        .await
        .expect("refused without waiting for the owner's call")
        .unwrap_err();
        assert_eq!(refused.code(), "run_not_found");
    }
    slow.release.notify_one();
    assert_eq!(
        owner.await.unwrap().unwrap().outcome,
        OutcomeKind::Confirmed
    );
    for _ in 0..3000 {
        let run = s.run().await;
        engine
            .call(
                AGENT,
                run.id,
                "crm.lookup",
                json!({"customer": "ana"}),
                None,
            )
            .await
            .unwrap();
    }
    assert!(
        engine.run_locks_kept() <= 1024,
        "{} per-run locks kept after 3,001 runs",
        engine.run_locks_kept()
    );
}
