//! The engine under random plans, faults and crashes, checked against the
//! model world (not the log). Each case is one run: a random mix of the
//! four tool classes, held calls approved or rejected, a pivot approved or
//! rejected, or an unwind; random faults on the calls and compensations;
//! and, in most cases, a crash at a random saga-log write (before or after
//! it commits), after which a fresh engine resumes from the database.
//!
//! Every choice a case makes is drawn from a tape of numbers that proptest
//! generates and, when a case fails, shrinks: a shorter tape of smaller
//! numbers is a simpler case (fewer calls, no fault, no crash), so what is
//! reported is the simplest failing case found, as the tape that replays it.
//!
//! Cases: `SAGA_PROPERTY_CASES` (default 2000 on SQLite, 300 on
//! PostgreSQL); `SAGA_PROPERTY_TAPE=3,0,41,…` replays one case.

use crate::common;

use common::crash::CrashingStore;
use common::world::{Fault, Witness, World, TOOLS};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use saga_harness::saga::class::Phase;
use saga_harness::saga::engine::{Engine, OutcomeKind, Refusal};
use saga_harness::saga::model::{Actor, NewRun, Via};
use saga_harness::saga::pivot::PlannedCall;
use saga_harness::saga::registry::Registry;
use saga_harness::saga::status::{RunStatus, StepStatus};

/// The properties are about effects, not timing: re-sends of refused
/// calls pause a millisecond instead of a quarter second.
const QUICK_RESENDS: std::time::Duration = std::time::Duration::from_millis(1);
use saga_harness::saga::store::SagaStore;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

const AGENT: &str = "prop-bot";

/// A case's choices, read from its tape: each draw takes the next number
/// (0 once the tape runs out), and 0 always means the simplest choice.
struct Choices {
    tape: Vec<u32>,
    at: usize,
}

impl Choices {
    fn new(tape: Vec<u32>) -> Choices {
        Choices { tape, at: 0 }
    }

    fn draw(&mut self) -> u32 {
        let value = self.tape.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        value
    }

    /// True about `percent` times in a hundred; never for a 0.
    fn chance(&mut self, percent: u32) -> bool {
        self.draw() % 100 >= 100 - percent
    }

    /// A number in `range`; its start for a 0.
    fn pick(&mut self, range: std::ops::Range<u32>) -> u32 {
        range.start + self.draw() % (range.end - range.start)
    }
}

struct Case {
    rng: Choices,
    inner: Arc<dyn SagaStore>,
    world: Arc<World>,
    witness: Arc<Witness>,
    registry: Arc<Registry>,
    engine: Engine,
    crashes: usize,
}

impl Case {
    fn new(inner: Arc<dyn SagaStore>, tape: Vec<u32>) -> Case {
        let mut rng = Choices::new(tape);
        let world = Arc::new(World::new());
        let witness = Arc::new(Witness::new(world.clone(), inner.clone()));
        let registry = Arc::new(Registry::from_toml(TOOLS).unwrap());
        let crash_at = rng.chance(80).then(|| i64::from(rng.pick(0..16)));
        let store = Arc::new(CrashingStore::new(inner.clone(), crash_at, rng.chance(50)));
        let engine = Engine::new(store, registry.clone(), witness.clone())
            .pausing_resends_from(QUICK_RESENDS);
        Case {
            rng,
            inner,
            world,
            witness,
            registry,
            engine,
            crashes: 0,
        }
    }

    /// The process died: a fresh engine (no crash armed) resumes from the log.
    async fn restart(&mut self) -> Result<(), String> {
        self.crashes += 1;
        let store = Arc::new(CrashingStore::new(self.inner.clone(), None, false));
        self.engine = Engine::new(store, self.registry.clone(), self.witness.clone())
            .pausing_resends_from(QUICK_RESENDS);
        self.engine
            .resume()
            .await
            .map_err(|e| format!("resume failed: {e}"))?;
        Ok(())
    }

    fn maybe_fault(&mut self, operation: &str) {
        if !self.rng.chance(35) {
            return;
        }
        let mut faults = vec![
            Fault::EffectThen504,
            Fault::EffectThenTimeout,
            Fault::EffectThenReset,
            Fault::EffectThenBlank,
            Fault::TimeoutWithoutEffect,
            Fault::Status(429),
            Fault::Status(500),
            Fault::Refused,
        ];
        if operation == "warehouse.reship" {
            faults.push(Fault::Status(422));
        }
        let fault = faults[self.rng.pick(0..faults.len() as u32) as usize].clone();
        self.world.fail_next(operation, fault);
    }
}

/// Re-runs an engine action after a crash, on the restarted engine.
macro_rules! surviving_crashes {
    ($case:ident, |$engine:ident| $action:expr) => {{
        loop {
            let $engine = &$case.engine;
            match $action {
                Err(Refusal::Store(err)) if CrashingStore::is_crash(&err) => {
                    $case.restart().await?
                }
                other => break other,
            }
        }
    }};
}

fn random_call(rng: &mut Choices) -> (&'static str, Value) {
    match rng.pick(0..6) {
        5 => ("authorize_card", json!({"amount": rng.pick(100..10_000)})),
        0 => (
            "create_ticket",
            json!({"summary": format!("ticket {}", rng.draw() as u16)}),
        ),
        1 => (
            "charge_card",
            json!({"amount": rng.pick(100..10_000), "receipt": rng.chance(50), "email": "ana@example.com"}),
        ),
        2 => ("reship", json!({"sku": "A1"})),
        3 => (
            "email_customer",
            json!({"to": "ana@example.com", "body": "about your order"}),
        ),
        _ => ("crm.lookup", json!({"customer": "ana"})),
    }
}

fn operation(tool: &str) -> &'static str {
    match tool {
        "create_ticket" => "tickets.create",
        "charge_card" => "payments.charge",
        "reship" => "warehouse.reship",
        "authorize_card" => "payments.authorize",
        "email_customer" | "announce" => "mail.send",
        _ => "crm.lookup",
    }
}

/// Runs one case; returns how many crashes it survived.
async fn run_case(inner: Arc<dyn SagaStore>, tape: Vec<u32>) -> Result<usize, String> {
    let purpose = format!("case {tape:?}");
    let mut case = Case::new(inner, tape);
    let (run, _) = case
        .inner
        .create_run(NewRun {
            agent: AGENT.into(),
            label: None,
            purpose,
        })
        .await
        .map_err(|e| e.to_string())?;
    *case.witness.run.lock().unwrap() = Some(run.id);
    let person = Actor::User("dana".into());

    // The agent's part: a few calls, each re-sent while its outcome is unknown.
    let mut next_step = 0;
    let mut gave_up = false;
    let calls = case.rng.pick(1..6);
    'calls: for _ in 0..calls {
        let (tool, args) = random_call(&mut case.rng);
        case.maybe_fault(operation(tool));
        let mut resends = 0;
        let mut rounds = 0;
        // This agent means each planned call as an effect of its own: told
        // that an earlier call of the same tool is still owed its outcome
        // (R12), it says so rather than re-sending the earlier step.
        let mut new_effect = false;
        loop {
            rounds += 1;
            if rounds > 12 {
                return Err(format!(
                    "{tool} at step {next_step} never settled for the agent"
                ));
            }
            let step = Some(next_step);
            let result = surviving_crashes!(case, |engine| engine
                .call_with(AGENT, run.id, tool, args.clone(), step, new_effect)
                .await);
            let outcome = match result {
                Ok(outcome) => outcome,
                Err(refusal) if refusal.code() == "retry_of_unresolved_step" && !new_effect => {
                    new_effect = true;
                    continue;
                }
                Err(refusal)
                    if refusal.code() == "step_unresolved" || refusal.code() == "run_closed" =>
                {
                    gave_up = true;
                    break 'calls;
                }
                Err(refusal) => {
                    return Err(format!("{tool} at step {next_step} refused: {refusal}"))
                }
            };
            if std::env::var("SAGA_PROPERTY_TRACE").is_ok() {
                eprintln!(
                    "step {next_step} {tool}: {:?} {:?} {}",
                    outcome.outcome, outcome.error, outcome.message
                );
            }
            match outcome.outcome {
                OutcomeKind::Unknown if resends < 3 => resends += 1,
                OutcomeKind::AwaitingApproval => {
                    let approval = case
                        .inner
                        .pending_approvals()
                        .await
                        .map_err(|e| e.to_string())?
                        .into_iter()
                        .find(|a| a.run_id == run.id);
                    if let Some(approval) = approval {
                        let approve = case.rng.chance(60);
                        surviving_crashes!(case, |engine| engine
                            .decide_step(
                                approval.id,
                                &approval.digest,
                                approve,
                                &person,
                                Via::Dashboard
                            )
                            .await)
                        .map_err(|e| format!("deciding step {next_step}: {e}"))?;
                    }
                }
                _ => {
                    if outcome.step.is_some() {
                        next_step += 1;
                    }
                    break;
                }
            }
            if resends >= 3 {
                gave_up = true;
                break 'calls;
            }
        }
    }

    // The ending: a pivot, an unwind, or completion.
    let ending = if gave_up { 1 } else { case.rng.pick(0..3) };
    if ending == 0 {
        let mut commit = Vec::new();
        for _ in 0..case.rng.pick(1..3) {
            let (tool, args) = match case.rng.pick(0..3) {
                0 => (
                    "charge_card",
                    json!({"amount": 4200, "receipt": false, "email": "ana@example.com"}),
                ),
                1 => (
                    "announce",
                    json!({"to": ["a@example.com", "b@example.com"]}),
                ),
                _ => ("create_ticket", json!({"summary": "follow-up"})),
            };
            case.maybe_fault(operation(tool));
            commit.push(PlannedCall {
                tool: tool.into(),
                args,
            });
        }
        let proposed = surviving_crashes!(case, |engine| engine
            .propose_pivot(AGENT, run.id, "commit", commit.clone())
            .await);
        match proposed {
            Ok(pivot) => {
                let approve = case.rng.chance(60);
                for op in [
                    "tickets.close",
                    "payments.refund",
                    "warehouse.cancel",
                    "payments.cancel",
                ] {
                    case.maybe_fault(op);
                }
                surviving_crashes!(case, |engine| engine
                    .decide_pivot(pivot.id, &pivot.digest, approve, &person, Via::Dashboard)
                    .await)
                .map_err(|e| format!("deciding the pivot: {e}"))?;
            }
            Err(refusal) if refusal.code() == "step_unresolved" => gave_up = true,
            Err(refusal) => return Err(format!("pivot refused: {refusal}")),
        }
    }
    let completed = ending == 2
        && surviving_crashes!(case, |engine| engine.complete(AGENT, run.id).await).is_ok();
    if ending == 1 || gave_up || (ending == 2 && !completed) {
        for op in [
            "tickets.close",
            "payments.refund",
            "warehouse.cancel",
            "payments.cancel",
        ] {
            case.maybe_fault(op);
        }
        let actor = Actor::Agent(AGENT.into());
        match surviving_crashes!(case, |engine| engine
            .unwind(run.id, &actor, "the agent unwinds")
            .await)
        {
            Ok(_) => {}
            Err(refusal)
                if matches!(
                    refusal.code(),
                    "run_past_pivot" | "run_needs_attention" | "run_closed"
                ) => {}
            Err(refusal) => return Err(format!("unwind refused: {refusal}")),
        }
    }

    // People answer what only people can, with the truth from the world,
    // until the run settles.
    for _ in 0..8 {
        surviving_crashes!(case, |engine| engine.resume().await)
            .map_err(|e| format!("resume: {e}"))?;
        let steps = case.inner.steps(run.id).await.map_err(|e| e.to_string())?;
        for step in steps.iter().filter(|s| s.status == StepStatus::Unknown) {
            let happened = case
                .world
                .all_effects()
                .iter()
                .any(|e| e.key == step.idempotency_key);
            match surviving_crashes!(case, |engine| engine
                .answer(
                    run.id,
                    step.step_idx,
                    happened,
                    None,
                    step.updated_at,
                    &person
                )
                .await)
            {
                // Settled meanwhile (a restart's resume reconciled it), or
                // asked again after a crash: the person looks again on the
                // next round.
                Ok(_)
                | Err(Refusal::QuestionAskedAgain { .. })
                | Err(Refusal::Store(saga_harness::saga::store::StoreError::Stale { .. })) => {}
                Err(e) => return Err(format!("answering step {}: {e}", step.step_idx)),
            }
        }
        let status = case
            .inner
            .run(run.id)
            .await
            .map_err(|e| e.to_string())?
            .map(|r| r.status);
        match status {
            Some(RunStatus::Committing) => {
                surviving_crashes!(case, |engine| engine.commit(run.id).await)
                    .map_err(|e| e.to_string())?;
            }
            Some(RunStatus::Unwinding) => {
                surviving_crashes!(case, |engine| engine.continue_unwind(run.id).await)
                    .map_err(|e| e.to_string())?;
            }
            _ => {}
        }
    }
    check_world(&case, run.id).await?;
    Ok(case.crashes)
}

/// The invariants, read from the world and compared with the log.
async fn check_world(case: &Case, run_id: Uuid) -> Result<(), String> {
    let violations = case.witness.violations.lock().unwrap().clone();
    if !violations.is_empty() {
        return Err(format!("R2: {violations:?}"));
    }
    let effects = case.world.all_effects();
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    for e in &effects {
        *seen
            .entry((e.operation.as_str(), e.key.as_str()))
            .or_default() += 1;
    }
    if let Some(((op, key), n)) = seen.iter().find(|(_, n)| **n > 1) {
        return Err(format!("{op} happened {n} times under key {key}"));
    }
    if case.world.ghosts() > 0 {
        return Err(format!(
            "{} compensation(s) aimed at effects that never existed",
            case.world.ghosts()
        ));
    }
    let run = case
        .inner
        .run(run_id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("run vanished")?;
    let steps = case.inner.steps(run_id).await.map_err(|e| e.to_string())?;
    let happened = |key: &str| effects.iter().any(|e| e.key == key);
    for step in &steps {
        let real = happened(&step.idempotency_key);
        let logged = match step.status {
            StepStatus::Confirmed | StepStatus::Compensated => Some(true),
            StepStatus::Failed
            | StepStatus::NotExecuted
            | StepStatus::Rejected
            | StepStatus::AwaitingApproval => Some(false),
            _ => None,
        };
        if run.status != RunStatus::NeedsAttention && logged.is_none() {
            return Err(format!(
                "step {} is still {} in a {} run",
                step.step_idx, step.status, run.status
            ));
        }
        if logged.is_some_and(|l| l != real) {
            return Err(format!(
                "the log says step {} ({}) is {}, the world says it {}",
                step.step_idx,
                step.tool,
                step.status,
                if real { "happened" } else { "did not happen" }
            ));
        }
        if step.tool_class == saga_harness::saga::class::ToolClass::Irreversible
            && real
            && !(step.approved_individually || step.phase == Phase::AfterPivot)
        {
            return Err(format!(
                "irreversible step {} ran without an approval",
                step.step_idx
            ));
        }
    }
    let compensations_of = |target_op: &str, field: &str, key: &str| {
        effects
            .iter()
            .filter(|e| e.operation == target_op && e.args[field].as_str() == Some(key))
            .count()
    };
    for step in &steps {
        if !happened(&step.idempotency_key) {
            continue;
        }
        let undone = match step.tool.as_str() {
            "create_ticket" => {
                compensations_of("tickets.close", "ticket_key", &step.idempotency_key)
            }
            "charge_card" => {
                compensations_of("payments.refund", "charge_key", &step.idempotency_key)
            }
            "reship" => compensations_of("warehouse.cancel", "shipment_key", &step.idempotency_key),
            "authorize_card" => {
                compensations_of("payments.cancel", "intent_key", &step.idempotency_key)
            }
            _ => continue,
        };
        let expected = usize::from(run.status == RunStatus::Unwound);
        if run.status != RunStatus::NeedsAttention && undone != expected {
            return Err(format!(
                "step {} ({}) was compensated {undone} time(s) in a {} run",
                step.step_idx, step.tool, run.status
            ));
        }
    }
    Ok(())
}

/// Where each case's run is stored.
enum Backing {
    /// A fresh SQLite file per case, so the cases stay independent and
    /// start-up resume never scans earlier cases' runs.
    SqliteFilePerCase,
    /// One shared PostgreSQL database (a fresh one per case would cost more
    /// than the case); each case is its own run in it.
    Shared(Arc<dyn SagaStore>),
}

/// One case on a store of its own (SQLite) or its own run in the shared
/// database (PostgreSQL): how many crashes it survived, or why it failed.
async fn one_case(
    backing: &Backing,
    scratch: &std::path::Path,
    tape: Vec<u32>,
) -> Result<usize, String> {
    let store = match backing {
        Backing::Shared(store) => store.clone(),
        Backing::SqliteFilePerCase => {
            // A name of its own: the last case's store may not have let go
            // of its file yet.
            static CASES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = CASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let url = format!(
                "sqlite://{}",
                scratch.join(format!("case-{n}.db")).display()
            );
            saga_harness::store::open(&url).await.unwrap().saga_store()
        }
    };
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(20), run_case(store, tape))
        .await
        .unwrap_or_else(|_| Err("hung for 20 s".to_owned()));
    if matches!(backing, Backing::SqliteFilePerCase) {
        // Each case starts on an empty file; memory-backed scratch space
        // stays small over thousands of cases.
        for entry in std::fs::read_dir(scratch).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    outcome
}

/// The tape `SAGA_PROPERTY_TAPE` names (`3,0,41,…`), to replay one case.
fn tape_to_replay() -> Option<Vec<u32>> {
    let text = std::env::var("SAGA_PROPERTY_TAPE").ok()?;
    Some(
        text.split(',')
            .filter(|n| !n.trim().is_empty())
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("SAGA_PROPERTY_TAPE: numbers, comma-separated")
            })
            .collect(),
    )
}

async fn property(backing: Backing, default_cases: u32) {
    let cases: u32 = std::env::var("SAGA_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    // The cases test the engine, not the disk: memory-backed /dev/shm,
    // where there is one, keeps thousands of fsyncs cheap.
    let scratch = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap(),
        false => tempfile::tempdir().unwrap(),
    };
    if let Some(tape) = tape_to_replay() {
        let outcome = one_case(&backing, scratch.path(), tape.clone()).await;
        assert!(outcome.is_ok(), "tape {tape:?}: {}", outcome.unwrap_err());
        return;
    }
    let started = Instant::now();
    let ran = std::sync::atomic::AtomicUsize::new(0);
    let crashed = std::sync::atomic::AtomicUsize::new(0);
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 500,
        ..Config::default()
    };
    // The same cases in every run, so CI is reproducible.
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let tapes = proptest::collection::vec(proptest::num::u32::ANY, 24..64);
    let runtime = tokio::runtime::Handle::current();
    let result = runner.run(&tapes, |tape| {
        let outcome = tokio::task::block_in_place(|| {
            runtime.block_on(one_case(&backing, scratch.path(), tape))
        });
        ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match outcome {
            Ok(crashes) => {
                if crashes > 0 {
                    crashed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(())
            }
            Err(why) => Err(TestCaseError::fail(why)),
        }
    });
    eprintln!(
        "{} cases on {} ({} with a crash and restart, shrinking included) in {:.1} s",
        ran.into_inner(),
        match backing {
            Backing::SqliteFilePerCase => "SQLite",
            Backing::Shared(_) => "PostgreSQL",
        },
        crashed.into_inner(),
        started.elapsed().as_secs_f64(),
    );
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, tape)) => {
            let replay: Vec<String> = tape.iter().map(u32::to_string).collect();
            panic!(
                "the simplest failing case found: {why}\nreplay it with SAGA_PROPERTY_TAPE={}",
                replay.join(",")
            );
        }
        Err(TestError::Abort(why)) => panic!("the property test stopped: {why}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_random_plans_faults_and_crashes_hold_every_invariant() {
    property(Backing::SqliteFilePerCase, 2000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_random_plans_faults_and_crashes_hold_every_invariant() {
    let db = crate::common::postgres_or_skip!();
    let store = saga_harness::store::open(&db.url)
        .await
        .unwrap()
        .saga_store();
    property(Backing::Shared(store), 300).await;
}
