//! Process-level crashes (R2, R7, R8, R11, §4): the real binary, armed with
//! one failpoint (`SAGA_FAILPOINT`), dies by abort at a dispatch boundary,
//! in the middle of an unwind or in the middle of a pivot commit. A new
//! process starts on the same database, resume runs, the agent re-sends
//! its step, and the simulators' ledgers — not the saga log — say what
//! really happened: every effect the log calls confirmed exists exactly
//! once, no effect exists that the log does not know, and every
//! compensation undoes an effect that happened, once.
//!
//! Every schedule runs on SQLite, on PostgreSQL, and on PostgreSQL behind
//! a transaction-pooling PgBouncer. `SAGA_CRASH_REPEAT=N` runs each
//! schedule N times (default 1).

use crate::common;

use common::process::{provision, tools_file, Dashboard, Launch, TestProcess, PASSWORD};
use saga_harness::saga::key::compensation_key;
use saga_harness::saga::model::{Compensation, Step};
use saga_harness::saga::status::StepStatus;
use saga_harness::sim::bundle::Simulators;
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const AGENT: &str = "support-bot";
const LEAD: &str = "lead";
const DISPATCH: [&str; 3] = [
    "dispatch.before_intent",
    "dispatch.before_call",
    "dispatch.before_outcome",
];
const UNWIND: [&str; 3] = [
    "unwind.before_compensation_intent",
    "unwind.before_compensation_call",
    "unwind.before_compensation_outcome",
];

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
    PgBouncer,
}

impl Backend {
    async fn database(self) -> Option<common::TestDb> {
        match self {
            Backend::Sqlite => Some(common::sqlite()),
            Backend::Postgres => common::postgres().await,
            Backend::PgBouncer => common::postgres_via_pgbouncer().await,
        }
    }
}

/// What one schedule found, summed over a test.
#[derive(Default, Debug)]
struct Tally {
    schedules: usize,
    crashes: usize,
    effects_checked: usize,
    duplicates: usize,
    /// "Did this happen?" questions a person answered after a crash.
    questions: usize,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.schedules += other.schedules;
        self.crashes += other.crashes;
        self.effects_checked += other.effects_checked;
        self.duplicates += other.duplicates;
        self.questions += other.questions;
    }

    fn report(&self, what: &str, backend: Backend) {
        eprintln!(
            "crash_kill {what} on {backend:?}: {} schedules, {} crashes by failpoint, {} effects checked, \
             {} duplicates, {} questions answered by a person",
            self.schedules, self.crashes, self.effects_checked, self.duplicates, self.questions
        );
    }
}

fn repeat() -> usize {
    std::env::var("SAGA_CRASH_REPEAT")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// One schedule: simulators, a database, the tools file, and a harness
/// process that may be armed with a failpoint.
struct Schedule {
    sims: Simulators,
    db: common::TestDb,
    plain: Launch,
    harness: TestProcess,
    token: String,
    http: reqwest::Client,
    /// The failpoint this schedule expects to fire, once.
    armed: Option<String>,
    crashes: usize,
    _dir: tempfile::TempDir,
}

impl Schedule {
    async fn new(backend: Backend, failpoint: Option<&str>) -> Option<Schedule> {
        let db = backend.database().await?;
        let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tools = tools_file(&sims, dir.path(), 50);
        let token = provision(&db.direct_url, AGENT, &[(LEAD, "approver")]).await;
        // One name across the schedule's restarts: each new process takes
        // back at once what the one that crashed held.
        let mut plain =
            Launch::new(&db.url, Some(&tools)).env("SAGA_INSTANCE_ID", "crash-schedule");
        for (name, value) in db.env() {
            plain = plain.env(&name, &value);
        }
        let launch = match failpoint {
            Some(spec) => plain.clone().failpoint(spec),
            None => plain.clone(),
        };
        let harness = TestProcess::start(&launch).await;
        Some(Schedule {
            sims,
            db,
            plain,
            harness,
            token,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            armed: failpoint.map(|s| s.split(':').next().unwrap().to_owned()),
            crashes: 0,
            _dir: dir,
        })
    }

    /// Replaces the running harness with one armed with `failpoint`.
    async fn arm(&mut self, failpoint: &str) {
        self.harness.kill();
        self.armed = Some(failpoint.split(':').next().unwrap().to_owned());
        self.harness = TestProcess::start(&self.plain.clone().failpoint(failpoint)).await;
    }

    /// The request failed because the process is gone: it must have died
    /// at the armed failpoint. A new, unarmed process takes over.
    async fn crashed(&mut self, err: &reqwest::Error) {
        let status = self
            .harness
            .wait_for_exit(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("a request failed ({err}) but the harness still runs"));
        let log = self.harness.log_text();
        let armed = self.armed.take().unwrap_or_else(|| {
            panic!("the harness died ({status}) with no failpoint armed:\n{log}")
        });
        assert_eq!(
            status.signal(),
            Some(6),
            "the harness should abort at {armed}:\n{log}"
        );
        assert!(
            log.contains(&format!("failpoint {armed} fired")),
            "the harness died elsewhere than at {armed}:\n{log}"
        );
        self.crashes += 1;
        self.harness = TestProcess::start(&self.plain).await;
    }

    /// An agent's request; `None` when the harness died under it (a new
    /// one is then running).
    async fn agent(&mut self, path: &str, body: Option<Value>) -> Option<(u16, Value)> {
        let url = format!("{}/api/v1{path}", self.harness.base);
        let request = match body {
            Some(body) => self.http.post(url).json(&body),
            None => self.http.get(url),
        };
        match request.bearer_auth(&self.token).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                Some((status, response.json().await.unwrap_or(Value::Null)))
            }
            Err(err) => {
                self.crashed(&err).await;
                None
            }
        }
    }

    async fn new_run(&mut self, purpose: &str) -> String {
        let label = format!("crash-{purpose}");
        loop {
            if let Some((status, body)) = self
                .agent("/runs", Some(json!({"label": label, "purpose": purpose})))
                .await
            {
                assert!(status == 201 || status == 200, "{status} {body}");
                return body["run"]["id"].as_str().unwrap().to_owned();
            }
        }
    }

    /// A step as a model-driven agent sends it: re-sent unchanged after a
    /// crash or an unknown outcome until the harness says it is confirmed.
    async fn step(&mut self, run: &str, step: i64, tool: &str, args: Value) -> Value {
        let body = json!({"tool": tool, "args": args, "step": step});
        for _ in 0..30 {
            let Some((status, out)) = self
                .agent(&format!("/runs/{run}/calls"), Some(body.clone()))
                .await
            else {
                continue;
            };
            assert_eq!(status, 200, "step {step} ({tool}): {out}");
            match out["outcome"].as_str() {
                Some("confirmed") => return out,
                Some("unknown" | "not_executed") => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                _ => panic!("step {step} ({tool}): {out}"),
            }
        }
        panic!("step {step} ({tool}) never settled");
    }

    async fn run_status(&mut self, run: &str) -> (String, Value) {
        loop {
            if let Some((status, body)) = self.agent(&format!("/runs/{run}"), None).await {
                assert_eq!(status, 200, "{body}");
                return (body["run"]["status"].as_str().unwrap().to_owned(), body);
            }
        }
    }

    /// Stops the harness and reads the saga log directly: the steps, the
    /// compensations, and the keys of the corrections' sends.
    async fn log(&mut self, run: &str) -> (Vec<Step>, Vec<Compensation>, Vec<String>) {
        self.harness.kill();
        let opened = saga_harness::store::open(&self.db.direct_url)
            .await
            .unwrap();
        let store = opened.saga_store();
        let run = run.parse().unwrap();
        (
            store.steps(run).await.unwrap(),
            store.compensations(run).await.unwrap(),
            store
                .corrections(run)
                .await
                .unwrap()
                .into_iter()
                .map(|c| c.idempotency_key)
                .collect(),
        )
    }
}

/// What the ledgers must show for one step, by the tool that made it.
struct Expect {
    /// The effect of the step itself and who records it.
    action: &'static str,
    /// The effect of its way back, found by the original's key, by the
    /// compensation's key, or (Jira) by the issue the original created.
    undo: Option<(&'static str, UndoKey)>,
}

#[derive(Clone, Copy)]
enum UndoKey {
    Original,
    Compensation,
    Issue,
}

fn expect(tool: &str) -> Expect {
    let (action, undo) = match tool {
        "create_ticket" => (
            "issue.created",
            Some(("issue.transitioned", UndoKey::Issue)),
        ),
        "charge_card" => (
            "payment_intent.created",
            Some(("refund.created", UndoKey::Compensation)),
        ),
        "authorize_payment" => (
            "payment_intent.created",
            Some(("payment_intent.canceled", UndoKey::Compensation)),
        ),
        "capture_payment" => (
            "payment_intent.captured",
            Some(("refund.created", UndoKey::Compensation)),
        ),
        "reship" => (
            "shipment.created",
            Some(("shipment.cancelled", UndoKey::Original)),
        ),
        "create_email_draft" => ("draft.created", Some(("draft.deleted", UndoKey::Original))),
        "send_email" => ("email.received", None),
        other => panic!("no ledger expectation for {other}"),
    };
    Expect { action, undo }
}

/// Compares the saga log with the ledgers. Each step's effect must exist
/// exactly once if the log says it happened (CONFIRMED or COMPENSATED) and
/// not at all otherwise; its way back exactly once if COMPENSATED and not
/// at all otherwise (a ghost compensation); and no effect may carry a key
/// the log does not know.
fn check_ledgers(
    sims: &Simulators,
    steps: &[Step],
    compensations: &[Compensation],
    corrections: &[String],
) -> Tally {
    let effects = sims.effects();
    let mut tally = Tally::default();
    let count = |action: &str, key: &str| {
        effects
            .iter()
            .filter(|e| e.action == action && e.key.as_deref() == Some(key))
            .count()
    };
    for step in steps {
        let Expect { action, undo } = expect(&step.tool);
        let happened = matches!(step.status, StepStatus::Confirmed | StepStatus::Compensated);
        let found = count(action, &step.idempotency_key);
        tally.effects_checked += 1;
        tally.duplicates += found.saturating_sub(1);
        assert_eq!(
            found,
            usize::from(happened),
            "step {} ({}) is {} in the log, and the ledger has {found} {action}",
            step.step_idx,
            step.tool,
            step.status
        );
        if let Some((undo_action, by)) = undo {
            let undone = step.status == StepStatus::Compensated;
            let found = match by {
                UndoKey::Original => count(undo_action, &step.idempotency_key),
                UndoKey::Compensation => count(
                    undo_action,
                    &compensation_key(step.run_id, step.step_idx, &step.tool),
                ),
                UndoKey::Issue => {
                    let issue = step.external_ref.clone().unwrap_or_default();
                    effects
                        .iter()
                        .filter(|e| {
                            e.action == undo_action && e.object == issue && e.detail["to"] == "Done"
                        })
                        .count()
                }
            };
            tally.effects_checked += 1;
            tally.duplicates += found.saturating_sub(1);
            assert_eq!(
                found,
                usize::from(undone),
                "step {} ({}) is {}, and the ledger has {found} {undo_action}",
                step.step_idx,
                step.tool,
                step.status
            );
        }
    }
    for row in compensations {
        let step = steps.iter().find(|s| s.step_idx == row.step_idx).unwrap();
        assert!(
            matches!(step.status, StepStatus::Confirmed | StepStatus::Compensated),
            "a compensation row for step {} which is {}",
            row.step_idx,
            step.status
        );
    }
    // No effect with a key the log does not know (a send under a key no
    // step or compensation owns).
    let known: Vec<String> = steps
        .iter()
        .map(|s| s.idempotency_key.clone())
        .chain(compensations.iter().map(|c| c.idempotency_key.clone()))
        .chain(corrections.iter().cloned())
        .collect();
    for effect in &effects {
        if let Some(key) = &effect.key {
            assert!(
                known.contains(key),
                "{} {} carries key {key}, which no step in the log owns",
                effect.system,
                effect.action
            );
        }
    }
    tally
}

/// POSTs to exactly `path` (not to paths below it).
fn posts_to(sim: &saga_harness::sim::bundle::Sim, path: &str) -> usize {
    let faults = &sim.state.faults;
    faults.requests_to("POST", path) - faults.requests_to("POST", &format!("{path}/"))
}

fn ticket() -> Value {
    json!({"summary": "Kettle arrived broken"})
}

fn charge() -> Value {
    json!({"customer": "cus_ada", "amount": 4900, "currency": "usd",
           "email": "ada@example.com", "receipt": false})
}

fn reship() -> Value {
    json!({"order_id": "ord_1001", "items": ["KETTLE-2"], "email": "ada@example.com"})
}

/// Three steps that reach three systems — one with no idempotency of its
/// own (Jira) — crashing at `failpoint`, then an unwind.
async fn dispatch_then_unwind(backend: Backend, failpoint: &str) -> Option<Tally> {
    let mut s = Schedule::new(backend, Some(failpoint)).await?;
    let run = s.new_run("dispatch").await;
    s.step(&run, 0, "create_ticket", ticket()).await;
    s.step(&run, 1, "charge_card", charge()).await;
    s.step(&run, 2, "reship", reship()).await;
    assert_eq!(s.crashes, 1, "{failpoint} never fired");
    let (status, body) = s
        .agent(
            &format!("/runs/{run}/unwind"),
            Some(json!({"reason": "the customer cancelled"})),
        )
        .await
        .unwrap();
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("UNWOUND")),
        "{body}"
    );
    let (steps, compensations, corrections) = s.log(&run).await;
    assert!(steps.iter().all(|s| s.status == StepStatus::Compensated));
    let mut tally = check_ledgers(&s.sims, &steps, &compensations, &corrections);
    // Each effect was asked for once: a reconcile found what the crash hid.
    assert_eq!(posts_to(&s.sims.jira, "/rest/api/3/issue"), 1);
    assert_eq!(posts_to(&s.sims.warehouse, "/v1/shipments"), 1);
    tally.schedules = 1;
    tally.crashes = s.crashes;
    Some(tally)
}

/// Three confirmed steps; the unwind dies at `failpoint`; resume finishes it.
async fn unwind_crash(backend: Backend, failpoint: &str) -> Option<Tally> {
    let mut s = Schedule::new(backend, None).await?;
    let run = s.new_run("unwind").await;
    s.step(&run, 0, "create_ticket", ticket()).await;
    s.step(&run, 1, "charge_card", charge()).await;
    s.step(&run, 2, "reship", reship()).await;
    s.arm(failpoint).await;
    let answered = s
        .agent(
            &format!("/runs/{run}/unwind"),
            Some(json!({"reason": "the customer cancelled"})),
        )
        .await;
    assert!(answered.is_none(), "{failpoint} never fired: {answered:?}");
    // Resume, in the new process, finished the unwind before serving.
    let (status, body) = s.run_status(&run).await;
    assert_eq!(status, "UNWOUND", "{body}");
    let (steps, compensations, corrections) = s.log(&run).await;
    assert!(steps.iter().all(|s| s.status == StepStatus::Compensated));
    let mut tally = check_ledgers(&s.sims, &steps, &compensations, &corrections);
    tally.schedules = 1;
    tally.crashes = s.crashes;
    Some(tally)
}

/// The last step dies at `failpoint`; the agent never re-sends it and
/// unwinds instead. A step that did not happen is not compensated (no
/// ghost); one that happened is (nothing lost).
async fn crash_then_unwind_without_resending(backend: Backend, failpoint: &str) -> Option<Tally> {
    let mut s = Schedule::new(backend, Some(&format!("{failpoint}:3"))).await?;
    let run = s.new_run("ghost").await;
    s.step(&run, 0, "create_ticket", ticket()).await;
    s.step(&run, 1, "charge_card", charge()).await;
    let body = json!({"tool": "reship", "args": reship(), "step": 2});
    assert!(s
        .agent(&format!("/runs/{run}/calls"), Some(body))
        .await
        .is_none());
    let (status, body) = s
        .agent(
            &format!("/runs/{run}/unwind"),
            Some(json!({"reason": "the agent gave up"})),
        )
        .await
        .unwrap();
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("UNWOUND")),
        "{body}"
    );
    let (steps, compensations, corrections) = s.log(&run).await;
    let last = &steps[2];
    let cancels = s
        .sims
        .warehouse
        .state
        .faults
        .requests_to("POST", "/v1/shipments/by-reference");
    match failpoint {
        "dispatch.before_call" => {
            assert_eq!(last.status, StepStatus::NotExecuted);
            assert_eq!(cancels, 0, "a ghost shipment was cancelled");
        }
        _ => {
            assert_eq!(last.status, StepStatus::Compensated);
            assert_eq!(cancels, 1);
        }
    }
    let mut tally = check_ledgers(&s.sims, &steps, &compensations, &corrections);
    tally.schedules = 1;
    tally.crashes = s.crashes;
    Some(tally)
}

/// A staged run (an authorisation and a draft) whose approved pivot
/// commits four steps — a capture, a Jira ticket, a shipment and an email
/// (no lookup) — and dies at `failpoint` during the approval's commit.
async fn pivot_commit_crash(backend: Backend, failpoint: &str) -> Option<Tally> {
    let mut s = Schedule::new(backend, None).await?;
    let run = s.new_run("pivot").await;
    let hold = s
        .step(
            &run,
            0,
            "authorize_payment",
            json!({"customer": "cus_grace", "amount": 3200,
            "currency": "usd", "description": "Hold for the replacement lamp"}),
        )
        .await;
    let hold_key = hold["key"].as_str().unwrap().to_owned();
    s.step(
        &run,
        1,
        "create_email_draft",
        json!({"to": "grace@example.com",
        "subject": "Your replacement lamp", "body": "A new lamp ships today."}),
    )
    .await;
    let (status, proposed) = s
        .agent(
            &format!("/runs/{run}/pivot"),
            Some(json!({"summary": "Reship the lamp, capture the hold, tell Grace", "commit": [
                {"tool": "capture_payment", "args": {"intent_key": hold_key, "amount": 3200, "customer": "cus_grace"}},
                {"tool": "create_ticket", "args": {"summary": "Reship lamp for ord_1002"}},
                {"tool": "reship", "args": {"order_id": "ord_1002", "items": ["LAMP-7"], "email": "grace@example.com"}},
                {"tool": "send_email", "args": {"to": "grace@example.com", "subject": "Your replacement lamp",
                                                "body": "A new lamp ships today."}}
            ]})),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{proposed}");
    s.arm(failpoint).await;
    let dashboard = Dashboard::new();
    dashboard.sign_in(&s.harness.base, LEAD, PASSWORD).await;
    let approval = proposed["approval_id"].to_string();
    let digest = proposed["digest"].as_str().unwrap().to_owned();
    let decided = dashboard
        .post(
            &s.harness.base,
            "decide_pivot",
            &[
                ("run", &run),
                ("approval", &approval),
                ("digest", &digest),
                ("decision", "approve"),
            ],
        )
        .await;
    match decided {
        Err(err) => s.crashed(&err).await,
        Ok(response) => panic!("{failpoint} never fired: {}", response.status()),
    }
    // Resume carries the commit on. Only the email has no lookup: if the
    // crash hid its outcome, a person checks the mailbox and answers.
    let mut answered = false;
    loop {
        let (status, body) = s.run_status(&run).await;
        match status.as_str() {
            "COMPLETED" => break,
            "NEEDS_ATTENTION" if !answered => {
                let email = body["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|st| st["status"] == "UNKNOWN")
                    .unwrap_or_else(|| panic!("a question with no unknown step: {body}"))
                    .clone();
                assert_eq!(email["tool"], "send_email", "{body}");
                let key = email["idempotency_key"].as_str().unwrap();
                let in_mailbox = s
                    .sims
                    .smtp
                    .ledger()
                    .effects()
                    .iter()
                    .any(|e| e.key.as_deref() == Some(key));
                let dashboard = Dashboard::new();
                dashboard.sign_in(&s.harness.base, LEAD, PASSWORD).await;
                let step = email["step_idx"].to_string();
                let asked = email["updated_at"].as_str().unwrap_or_default();
                let response = dashboard
                    .post(
                        &s.harness.base,
                        "answer_question",
                        &[
                            ("run", &run),
                            ("step", &step),
                            ("asked", asked),
                            ("happened", if in_mailbox { "yes" } else { "no" }),
                        ],
                    )
                    .await
                    .unwrap();
                assert!(response.status().is_redirection(), "{}", response.status());
                answered = true;
            }
            other => panic!("the commit stopped at {other}: {body}"),
        }
    }
    let (steps, compensations, corrections) = s.log(&run).await;
    assert_eq!(steps.len(), 6);
    assert!(
        steps.iter().all(|s| s.status == StepStatus::Confirmed),
        "{steps:#?}"
    );
    let mut tally = check_ledgers(&s.sims, &steps, &compensations, &corrections);
    assert_eq!(s.sims.smtp.ledger().of("email.received").len(), 1);
    assert_eq!(posts_to(&s.sims.jira, "/rest/api/3/issue"), 1);
    tally.schedules = 1;
    tally.crashes = s.crashes;
    tally.questions = usize::from(answered);
    Some(tally)
}

/// A correction goes out and the process dies before its outcome is
/// written (R10): the person who sends it again gets a question, never a
/// second letter.
async fn correction_send_crash(backend: Backend) -> Option<Tally> {
    let mut s = Schedule::new(backend, None).await?;
    let run = s.new_run("correction").await;
    let mut receipt = charge();
    receipt["receipt"] = json!(true);
    s.step(&run, 0, "charge_card", receipt).await;
    let (status, body) = s
        .agent(
            &format!("/runs/{run}/unwind"),
            Some(json!({"reason": "charged in error"})),
        )
        .await
        .unwrap();
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("UNWOUND")),
        "{body}"
    );
    s.arm("correction.before_outcome").await;
    let dashboard = Dashboard::new();
    dashboard.sign_in(&s.harness.base, LEAD, PASSWORD).await;
    let inbox = |base: String| {
        let http = dashboard.http.clone();
        async move {
            let response = http
                .post(format!("{base}/api/corrections_inbox"))
                .header("accept", "application/json")
                .send()
                .await
                .unwrap();
            let inbox: Value = response.json().await.unwrap();
            inbox["items"][0].clone()
        }
    };
    let item = inbox(s.harness.base.clone()).await;
    let (id, key) = (
        item["id"].to_string(),
        item["key"].as_str().unwrap().to_owned(),
    );
    let form = [
        ("id", id.as_str()),
        ("message", "We refunded the charge made in error."),
    ];
    match dashboard
        .post(&s.harness.base, "send_correction", &form)
        .await
    {
        Err(err) => s.crashed(&err).await,
        Ok(response) => panic!("the failpoint never fired: {}", response.status()),
    }
    // The lead clicks Send again on the new process.
    dashboard.sign_in(&s.harness.base, LEAD, PASSWORD).await;
    let again = dashboard
        .post(&s.harness.base, "send_correction", &form)
        .await
        .unwrap();
    assert!(again.status().is_redirection(), "{}", again.status());
    let item = inbox(s.harness.base.clone()).await;
    assert_eq!(item["send_status"], "UNKNOWN", "{item}");
    let letters = s
        .sims
        .smtp
        .ledger()
        .effects()
        .iter()
        .filter(|e| e.key.as_deref() == Some(key.as_str()))
        .count();
    let mut tally = Tally {
        schedules: 1,
        crashes: s.crashes,
        effects_checked: 1,
        duplicates: letters.saturating_sub(1),
        ..Tally::default()
    };
    assert_eq!(letters, 1, "the correction went out {letters} times");
    let (steps, compensations, corrections) = s.log(&run).await;
    let checked = check_ledgers(&s.sims, &steps, &compensations, &corrections);
    tally.add(Tally {
        schedules: 0,
        crashes: 0,
        ..checked
    });
    Some(tally)
}

async fn each_dispatch_boundary(backend: Backend) {
    let mut tally = Tally::default();
    for _ in 0..repeat() {
        for point in DISPATCH {
            for nth in 1..=3 {
                let Some(t) = dispatch_then_unwind(backend, &format!("{point}:{nth}")).await else {
                    eprintln!("skipped: SAGA_TEST_POSTGRES_URL is not set");
                    return;
                };
                tally.add(t);
            }
        }
        for point in ["dispatch.before_call", "dispatch.before_outcome"] {
            if let Some(t) = crash_then_unwind_without_resending(backend, point).await {
                tally.add(t);
            }
        }
    }
    tally.report("dispatch", backend);
    assert_eq!(tally.duplicates, 0);
    assert_eq!(tally.crashes, tally.schedules);
}

async fn each_unwind_point(backend: Backend) {
    let mut tally = Tally::default();
    for _ in 0..repeat() {
        for point in UNWIND {
            for nth in 1..=3 {
                let Some(t) = unwind_crash(backend, &format!("{point}:{nth}")).await else {
                    eprintln!("skipped: SAGA_TEST_POSTGRES_URL is not set");
                    return;
                };
                tally.add(t);
            }
        }
    }
    tally.report("unwind", backend);
    assert_eq!(tally.duplicates, 0);
    assert_eq!(tally.crashes, tally.schedules);
}

async fn each_commit_point(backend: Backend) {
    let mut points = vec!["pivot.after_approval".to_owned()];
    points.extend((1..=3).map(|n| format!("pivot.between_commit_steps:{n}")));
    for point in DISPATCH {
        points.extend((1..=4).map(|n| format!("{point}:{n}")));
    }
    let mut tally = Tally::default();
    for _ in 0..repeat() {
        for point in &points {
            let Some(t) = pivot_commit_crash(backend, point).await else {
                eprintln!("skipped: SAGA_TEST_POSTGRES_URL is not set");
                return;
            };
            tally.add(t);
        }
    }
    for _ in 0..repeat() {
        if let Some(t) = correction_send_crash(backend).await {
            tally.add(t);
        }
    }
    tally.report("pivot commit and correction", backend);
    assert_eq!(tally.duplicates, 0);
    assert_eq!(tally.crashes, tally.schedules);
}

#[tokio::test]
async fn sqlite_a_crash_at_each_dispatch_boundary_doubles_and_loses_nothing() {
    each_dispatch_boundary(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_a_crash_at_each_dispatch_boundary_doubles_and_loses_nothing() {
    each_dispatch_boundary(Backend::Postgres).await;
}

#[tokio::test]
async fn sqlite_a_crash_in_the_middle_of_an_unwind_compensates_each_effect_once() {
    each_unwind_point(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_a_crash_in_the_middle_of_an_unwind_compensates_each_effect_once() {
    each_unwind_point(Backend::Postgres).await;
}

#[tokio::test]
async fn sqlite_a_crash_in_a_pivot_commit_or_a_correction_send_doubles_nothing() {
    each_commit_point(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_a_crash_in_a_pivot_commit_or_a_correction_send_doubles_nothing() {
    each_commit_point(Backend::Postgres).await;
}

#[tokio::test]
async fn pgbouncer_a_crash_at_each_dispatch_boundary_doubles_and_loses_nothing() {
    each_dispatch_boundary(Backend::PgBouncer).await;
}

#[tokio::test]
async fn pgbouncer_a_crash_in_the_middle_of_an_unwind_compensates_each_effect_once() {
    each_unwind_point(Backend::PgBouncer).await;
}

#[tokio::test]
async fn pgbouncer_a_crash_in_a_pivot_commit_or_a_correction_send_doubles_nothing() {
    each_commit_point(Backend::PgBouncer).await;
}
