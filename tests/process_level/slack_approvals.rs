//! Approvals in Slack, against the Slack simulator: a waiting pivot is
//! posted once, with its calls in words and two buttons; a press comes back
//! signed and is refused unless fresh, new and Slack's; only a mapped
//! approver decides; a button from a replaced plan decides nothing; and the
//! message is rewritten in place after a decision, from Slack or from the
//! dashboard. What is checked is what people see: the channel's messages,
//! the private answers, the mailbox, the audit trail.

use crate::common;
use common::app::{Spawn, TestApp};

use common::process::{provision, tools_file, Dashboard, PASSWORD};
use saga_harness::connectors::slack::request_signature;
use saga_harness::demo::ScriptedAgent;
use saga_harness::saga::key::notice_key;
use saga_harness::saga::model::{Actor, NoticeStatus};
use saga_harness::sim::bundle::{use_simulated_credentials, Simulators};
use saga_harness::sim::{Effect, Fault as SimFault, FaultRule};
use saga_harness::state::AppState;
use serde_json::{json, Value};
use std::time::Duration;
use uuid::Uuid;

const AGENT: &str = "support-bot";
const SECRET_ENV: &str = "SAGA_TEST_SLACK_SIGNING_SECRET";
const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const LEAD: &str = "U0LEAD0001";
const VIEWER: &str = "U0VIEW0001";
const STRANGER: &str = "U0NOBODY01";
const ADMIN: &str = "U0ADMIN001";

struct Setup {
    sims: Simulators,
    state: AppState,
    base: String,
    agent: ScriptedAgent,
    token: String,
    http: reqwest::Client,
    _app: TestApp,
    _dir: tempfile::TempDir,
    _db: common::TestDb,
}

async fn setup(db: common::TestDb) -> Setup {
    setup_with(db, "", "", |_| {}).await
}

/// `policy`: `[approvals]` settings (deadline, escalate_after);
/// `slack`: more `[approvals.slack]` settings.
/// `tweak` changes the rest of the tools file.
async fn setup_with(
    db: common::TestDb,
    policy: &str,
    slack: &str,
    tweak: impl FnOnce(&mut toml::Table),
) -> Setup {
    use_simulated_credentials();
    std::env::set_var(SECRET_ENV, SECRET);
    let sims = Simulators::start([127, 0, 0, 1].into(), 0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 0);
    let mut file: toml::Table = toml::from_str(&std::fs::read_to_string(&tools).unwrap()).unwrap();
    let approvals: toml::Table = toml::from_str(&format!(
        r##"
        {policy}
        [slack]
        channel = "#support"
        signing_secret_env = "{SECRET_ENV}"
        {slack}
        [slack.users]
        {LEAD} = "lead"
        {VIEWER} = "viewer"
        {ADMIN} = "admin"
        "##
    ))
    .unwrap();
    file.insert("approvals".into(), toml::Value::Table(approvals));
    tweak(&mut file);
    std::fs::write(&tools, toml::to_string(&file).unwrap()).unwrap();
    let token = provision(
        &db.url,
        AGENT,
        &[
            ("lead", "approver"),
            ("viewer", "viewer"),
            ("admin", "admin"),
        ],
    )
    .await;
    let app = Spawn::on(&db).tools(tools).start().await;
    let base = app.base.clone();
    let state = app.state().clone();
    let http = reqwest::Client::new();
    let configured = http
        .post(format!("{}/_sim/slack/app", sims.slack.base_url()))
        .json(
            &json!({"request_url": format!("{base}/slack/interactions"), "signing_secret": SECRET}),
        )
        .send()
        .await
        .unwrap();
    assert!(configured.status().is_success());
    Setup {
        agent: ScriptedAgent::new(&format!("{base}/api/v1"), &token),
        token,
        sims,
        state,
        base,
        http,
        _app: app,
        _dir: dir,
        _db: db,
    }
}

use common::until;

impl Setup {
    fn agent_token(&self) -> &str {
        &self.token
    }

    fn slack(&self, action: &str, key: &str) -> Vec<Effect> {
        self.sims
            .slack
            .ledger()
            .of(action)
            .into_iter()
            .filter(|e| e.key.as_deref() == Some(key))
            .collect()
    }

    /// A run waiting at a pivot whose one commit step emails Grace; its
    /// id, the pivot's approval id and the key of its Slack message.
    async fn waiting_pivot(&self, label: &str) -> (Uuid, i64, String) {
        let run = self
            .agent
            .start_run(label, "Tell Grace her lamp ships")
            .await
            .unwrap();
        self.agent
            .act(&run, "create_email_draft", json!({"to": "grace@example.com", "subject": "Your lamp", "body": "A new lamp ships today."}))
            .await
            .unwrap();
        self.propose(&run, "Tell Grace her new lamp ships today")
            .await
    }

    async fn propose(&self, run: &str, summary: &str) -> (Uuid, i64, String) {
        let pivot = self
            .agent
            .pivot(run, summary, json!([
                {"tool": "send_email", "args": {"to": "grace@example.com", "subject": "Your lamp", "body": "A new lamp ships today."}}
            ]))
            .await
            .unwrap();
        let run: Uuid = run.parse().unwrap();
        let approval = pivot["approval_id"].as_i64().unwrap();
        (
            run,
            approval,
            notice_key(
                run,
                approval,
                saga_harness::saga::model::NoticePlace::Primary,
            ),
        )
    }

    /// The message posted with `key`, once it is.
    async fn posted(&self, key: &str) -> Value {
        until("the approval's Slack post", || async {
            self.slack("message.posted", key)
                .first()
                .map(|e| e.detail.clone())
        })
        .await
    }

    /// The message as last updated, once an update says `wanted`.
    async fn updated_to_say(&self, key: &str, wanted: &str) -> Value {
        until(&format!("the Slack message to say {wanted:?}"), || async {
            self.slack("message.updated", key)
                .last()
                .map(|e| e.detail.clone())
                .filter(|d| d.to_string().contains(wanted))
        })
        .await
    }

    /// Presses a button of the message posted with `key`, as `user`.
    async fn press(&self, key: &str, action_id: &str, user: &str) -> Value {
        self.press_as_drawn(key, action_id, user, false).await
    }

    /// Presses Approve as `user` on the message posted with `key` as it
    /// was first posted: a client that has not redrawn it since an update
    /// still shows those buttons, carrying the plan of then.
    async fn press_stale_approve(&self, key: &str, user: &str) -> Value {
        self.press_as_drawn(key, "saga_approve", user, true).await
    }

    async fn press_as_drawn(&self, key: &str, action_id: &str, user: &str, stale: bool) -> Value {
        let answer: Value = self
            .http
            .post(format!("{}/_sim/slack/press", self.sims.slack.base_url()))
            .json(
                &json!({"saga_key": key, "action_id": action_id, "user_id": user, "stale": stale}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], 200, "{answer}");
        answer
    }

    /// The private answer the harness gave `user`, once it did.
    async fn told(&self, user: &str) -> String {
        until(&format!("a private answer to {user}"), || async {
            let responses: Vec<Value> = self
                .http
                .get(format!(
                    "{}/_sim/slack/responses",
                    self.sims.slack.base_url()
                ))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            responses.iter().rev().find(|r| r["user"] == user).map(|r| {
                assert_eq!(r["body"]["response_type"], "ephemeral", "{r}");
                r["body"]["text"].as_str().unwrap_or_default().to_owned()
            })
        })
        .await
    }

    /// `person` approves the pivot on its run page, as the form posts it.
    async fn approve_in_dashboard(&self, person: &Dashboard, run: Uuid, approval: i64) {
        let digest = self.digest(approval).await;
        person
            .post(
                &self.base,
                "decide_pivot",
                &[
                    ("run", &run.to_string()),
                    ("approval", &approval.to_string()),
                    ("digest", &digest),
                    ("decision", "approve"),
                ],
            )
            .await
            .unwrap();
    }

    /// The digest of the plan approval `approval` waits on now, as its
    /// forms carry it.
    async fn digest(&self, approval: i64) -> String {
        self.state
            .store
            .approval(approval)
            .await
            .unwrap()
            .unwrap()
            .digest
    }

    async fn run_status(&self, run: Uuid) -> String {
        let run = self.state.store.run(run).await.unwrap().unwrap();
        run.status.as_str().to_owned()
    }

    fn emails_to_grace(&self) -> usize {
        self.sims
            .smtp
            .ledger()
            .of("email.received")
            .iter()
            .filter(|e| e.detail.to_string().contains("grace@example.com"))
            .count()
    }
}

fn button_labels(message: &Value) -> Vec<String> {
    message["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "actions")
        .flat_map(|b| b["elements"].as_array().cloned().unwrap_or_default())
        .map(|e| e["text"]["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn a_waiting_pivot_is_posted_once_and_a_lead_approves_it_from_slack(db: common::TestDb) {
    let s = setup(db).await;
    let (run, _, key) = s.waiting_pivot("slack-approve").await;
    let message = s.posted(&key).await;
    assert_eq!(message["channel"], "C0SUPPORT1", "{message}");
    let text = message["blocks"].to_string();
    assert!(
        text.contains("Tell Grace her new lamp ships today"),
        "{text}"
    );
    assert!(
        text.contains("grace@example.com"),
        "the call in words: {text}"
    );
    assert!(
        text.contains(&format!("{}/runs/{run}", s.base)),
        "the run link: {text}"
    );
    assert_eq!(button_labels(&message), ["Approve", "Reject"]);

    // Neither someone Slack knows but the map does not, nor a viewer, decides.
    s.press(&key, "saga_approve", STRANGER).await;
    assert!(s.told(STRANGER).await.contains("You cannot approve this"));
    s.press(&key, "saga_approve", VIEWER).await;
    let told = s.told(VIEWER).await;
    assert!(
        told.contains("You cannot approve this") && told.contains("viewer is a viewer"),
        "{told}"
    );
    assert_eq!(s.run_status(run).await, "AWAITING_APPROVAL");
    assert_eq!(s.emails_to_grace(), 0);

    s.press(&key, "saga_approve", LEAD).await;
    let updated = s
        .updated_to_say(&key, "Commit: 1 of 1 steps confirmed")
        .await;
    let shown = updated["blocks"].to_string();
    assert!(
        shown.contains("Approved") && shown.contains("*lead*"),
        "{shown}"
    );
    assert!(shown.contains("decided in Slack"), "{shown}");
    assert!(
        button_labels(&updated).is_empty(),
        "no buttons once decided: {shown}"
    );
    assert_eq!(s.run_status(run).await, "COMPLETED");
    assert_eq!(s.emails_to_grace(), 1);
    assert_eq!(s.slack("message.posted", &key).len(), 1, "posted once");

    let events = s.state.store.events(Some(run), 100).await.unwrap();
    let decision = events
        .iter()
        .find(|e| e.entity.as_str() == "approval" && e.to_status.as_deref() == Some("approved"))
        .expect("the approval's audit line");
    assert_eq!(decision.actor, Actor::User("lead".into()));
    assert_eq!(decision.detail.as_deref(), Some("decided in Slack"));
}

#[tokio::test]
async fn sqlite_a_waiting_pivot_is_posted_once_and_a_lead_approves_it_from_slack() {
    a_waiting_pivot_is_posted_once_and_a_lead_approves_it_from_slack(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_a_waiting_pivot_is_posted_once_and_a_lead_approves_it_from_slack() {
    let db = crate::common::postgres_or_skip!();
    a_waiting_pivot_is_posted_once_and_a_lead_approves_it_from_slack(db).await;
}

/// A signed press, as Slack would send it, for a button of approval 999.
fn press_body() -> String {
    let payload = json!({
        "type": "block_actions",
        "user": {"id": LEAD},
        "actions": [{"action_id": "saga_approve", "value": "999:0000", "type": "button"}],
    });
    format!(
        "payload={}",
        percent_encoding::utf8_percent_encode(
            &payload.to_string(),
            percent_encoding::NON_ALPHANUMERIC
        )
    )
}

#[tokio::test]
async fn slack_requests_are_refused_unless_signed_fresh_and_new() {
    let s = setup(common::sqlite()).await;
    let url = format!("{}/slack/interactions", s.base);
    let send = |timestamp: String, signature: Option<String>, body: String| {
        let mut request = s
            .http
            .post(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", timestamp)
            .body(body);
        if let Some(signature) = signature {
            request = request.header("x-slack-signature", signature);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let now = chrono::Utc::now().timestamp().to_string();
    let body = press_body();
    assert_eq!(send(now.clone(), None, body.clone()).await, 401, "unsigned");
    let wrong = request_signature("not the signing secret", &now, body.as_bytes());
    assert_eq!(
        send(now.clone(), Some(wrong), body.clone()).await,
        401,
        "wrong secret"
    );
    let old = (chrono::Utc::now().timestamp() - 6 * 60).to_string();
    let signed_old = request_signature(SECRET, &old, body.as_bytes());
    assert_eq!(
        send(old, Some(signed_old), body.clone()).await,
        401,
        "too old"
    );
    let tampered = request_signature(SECRET, &now, body.as_bytes());
    let other_body = body.replace("999", "998");
    assert_eq!(
        send(now.clone(), Some(tampered.clone()), other_body).await,
        401,
        "another body"
    );
    assert_eq!(
        send(now.clone(), Some(tampered.clone()), body.clone()).await,
        200,
        "Slack's own"
    );
    assert_eq!(
        send(now, Some(tampered), body).await,
        401,
        "the same request again"
    );
}

async fn a_button_from_a_replaced_plan_decides_nothing_and_its_message_says_so(db: common::TestDb) {
    let s = setup(db).await;
    let (run, first, first_key) = s.waiting_pivot("slack-replaced").await;
    s.posted(&first_key).await;
    let (_, second, second_key) = s
        .propose(&run.to_string(), "Tell Grace the lamp ships tomorrow")
        .await;
    assert_ne!(first, second);
    let replaced = s.updated_to_say(&first_key, "Replaced").await;
    assert!(button_labels(&replaced).is_empty(), "{replaced}");
    let new = s.posted(&second_key).await;
    assert_eq!(button_labels(&new), ["Approve", "Reject"]);

    // A client that has not redrawn the old message still shows its buttons.
    s.press_stale_approve(&first_key, LEAD).await;
    let told = s.told(LEAD).await;
    assert!(told.contains("The plan was replaced or edited"), "{told}");
    assert_eq!(s.run_status(run).await, "AWAITING_APPROVAL");
    assert_eq!(s.emails_to_grace(), 0);
    let second_approval = s.state.store.approval(second).await.unwrap().unwrap();
    assert_eq!(second_approval.status.as_str(), "pending");
}

#[tokio::test]
async fn sqlite_a_button_from_a_replaced_plan_decides_nothing_and_its_message_says_so() {
    a_button_from_a_replaced_plan_decides_nothing_and_its_message_says_so(common::sqlite()).await;
}

#[tokio::test]
async fn a_dashboard_approval_rewrites_the_slack_message() {
    let s = setup(common::sqlite()).await;
    let (run, approval, key) = s.waiting_pivot("slack-dashboard").await;
    s.posted(&key).await;
    let lead = Dashboard::new();
    lead.sign_in(&s.base, "lead", PASSWORD).await;
    s.approve_in_dashboard(&lead, run, approval).await;
    let updated = s.updated_to_say(&key, "decided in the dashboard").await;
    let shown = updated["blocks"].to_string();
    assert!(
        shown.contains("Approved") && shown.contains("*lead*"),
        "{shown}"
    );
    s.updated_to_say(&key, "Commit: 1 of 1 steps confirmed")
        .await;
    assert_eq!(s.emails_to_grace(), 1);
    assert_eq!(s.slack("message.posted", &key).len(), 1);
}

#[tokio::test]
async fn a_post_whose_answer_was_lost_is_found_by_its_key_not_posted_again() {
    let s = setup(common::sqlite()).await;
    // Slack posts the message, then the gateway answers 504.
    s.sims.slack.state.faults.inject(FaultRule::new(
        "POST",
        "/api/chat.postMessage",
        SimFault::CommitThen504,
    ));
    let (_, approval, key) = s.waiting_pivot("slack-lost-answer").await;
    s.posted(&key).await;
    let notice = until("the notice to be settled by its lookup", || async {
        let notices = s.state.store.notices(approval).await.unwrap();
        notices
            .into_iter()
            .find(|n| n.status == NoticeStatus::Posted)
    })
    .await;
    let posted = &s.slack("message.posted", &key)[0];
    assert_eq!(notice.message_ref.as_deref(), Some(posted.object.as_str()));
    // A few more rounds: still the one message.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(s.slack("message.posted", &key).len(), 1);
}

#[tokio::test]
async fn a_held_step_nobody_decides_expires_as_its_own_outcome_never_a_rejection() {
    let s = setup_with(common::sqlite(), r#"deadline = "5s""#, "", |_| {}).await;
    let run = s
        .agent
        .start_run("slack-expiry", "Tell Grace her lamp ships")
        .await
        .unwrap();
    let email = json!({"to": "grace@example.com", "subject": "Your lamp", "body": "A new lamp ships today."});
    let held = s.agent.act(&run, "send_email", email).await.unwrap();
    assert_eq!(held["outcome"], "awaiting_approval", "{held}");
    let step = held["step"].as_i64().unwrap();
    let approval = s.state.store.pending_approvals().await.unwrap()[0].clone();
    assert!(
        approval.expires_at.is_some(),
        "the tools file's deadline applies"
    );
    let key = notice_key(
        approval.run_id,
        approval.id,
        saga_harness::saga::model::NoticePlace::Primary,
    );
    let posted = s.posted(&key).await;
    assert!(
        posted["blocks"].to_string().contains("decide by"),
        "{posted}"
    );
    let lead = Dashboard::new();
    lead.sign_in(&s.base, "lead", PASSWORD).await;
    let page = lead.page(&s.base, &format!("/runs/{run}")).await;
    assert!(
        page.contains("if nobody decides"),
        "the deadline on the run page"
    );
    let list = lead.page(&s.base, "/").await;
    assert!(list.contains("expires "), "the deadline on the runs list");

    let expired = s.updated_to_say(&key, "Expired").await;
    assert!(button_labels(&expired).is_empty(), "{expired}");
    let decided = s.state.store.approval(approval.id).await.unwrap().unwrap();
    assert_eq!(decided.status.as_str(), "expired");
    assert_eq!(decided.decided_by, Some(Actor::System));
    // The agent reads it again: expired, and nobody said no.
    let read = s
        .http
        .post(format!("{}/api/v1/runs/{run}/calls", s.base))
        .bearer_auth(s.agent_token())
        .json(&json!({"tool": "send_email", "args": {"to": "grace@example.com", "subject": "Your lamp", "body": "A new lamp ships today."}, "step": step}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(read["outcome"], "rejected", "{read}");
    let message = read["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("nobody decided before the deadline"),
        "{read}"
    );
    assert!(message.contains("Nobody rejected it"), "{read}");
    assert!(!message.contains("a person rejected"), "{read}");
    assert_eq!(s.emails_to_grace(), 0);
}

#[tokio::test]
async fn an_approval_nobody_decides_is_escalated_once_to_the_second_channel() {
    let s = setup_with(
        common::sqlite(),
        r#"escalate_after = "1s""#,
        r##"escalate_channel = "#alerts""##,
        |_| {},
    )
    .await;
    let (_, approval, key) = s.waiting_pivot("slack-escalation").await;
    let first = s.posted(&key).await;
    assert_eq!(first["channel"], "C0SUPPORT1");
    let run = s
        .state
        .store
        .approval(approval)
        .await
        .unwrap()
        .unwrap()
        .run_id;
    let escalation = notice_key(
        run,
        approval,
        saga_harness::saga::model::NoticePlace::Escalation,
    );
    let second = s.posted(&escalation).await;
    assert_eq!(second["channel"], "C0ALERTS01", "{second}");
    assert!(
        second["blocks"].to_string().contains("Escalated"),
        "{second}"
    );
    assert_eq!(button_labels(&second), ["Approve", "Reject"]);
    // The run page says where the approval was asked for.
    let lead = Dashboard::new();
    lead.sign_in(&s.base, "lead", PASSWORD).await;
    let page = until("the run page to show the escalation", || async {
        let page = lead.page(&s.base, &format!("/runs/{run}")).await;
        page.contains("escalated to #alerts in Slack")
            .then_some(page)
    })
    .await;
    assert!(page.contains("posted to #support in Slack"), "{page}");
    let list = lead.page(&s.base, "/").await;
    assert!(
        list.contains("escalated"),
        "the escalation on the runs list"
    );

    // Decided from the escalation: both messages say so, each posted once.
    s.press(&escalation, "saga_approve", LEAD).await;
    s.updated_to_say(&escalation, "Commit: 1 of 1 steps confirmed")
        .await;
    s.updated_to_say(&key, "Commit: 1 of 1 steps confirmed")
        .await;
    assert_eq!(s.slack("message.posted", &key).len(), 1);
    assert_eq!(s.slack("message.posted", &escalation).len(), 1);
    assert_eq!(s.emails_to_grace(), 1);
    let events = s.state.store.events(Some(run), 100).await.unwrap();
    assert!(
        events.iter().any(|e| e
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("escalated to #alerts"))),
        "the escalation is in the audit trail"
    );
}

#[tokio::test]
async fn under_the_two_person_rule_one_person_cannot_approve_twice() {
    let s = setup_with(common::sqlite(), "", "", |file| {
        let tools = file["tool"].as_array_mut().unwrap();
        let email = tools
            .iter_mut()
            .find(|t| t["name"].as_str() == Some("send_email"))
            .unwrap();
        email
            .as_table_mut()
            .unwrap()
            .insert("two_people".into(), toml::Value::Boolean(true));
    })
    .await;
    let (run, approval, key) = s.waiting_pivot("slack-two-people").await;
    let posted = s.posted(&key).await;
    assert!(
        posted["blocks"]
            .to_string()
            .contains("Needs 2 different approvers"),
        "{posted}"
    );

    s.press(&key, "saga_approve", LEAD).await;
    let first = s.updated_to_say(&key, "1 of 2").await;
    assert!(
        first["blocks"].to_string().contains("approved by *lead*"),
        "{first}"
    );
    assert_eq!(
        button_labels(&first),
        ["Approve", "Reject"],
        "it still waits"
    );
    assert_eq!(s.run_status(run).await, "AWAITING_APPROVAL");
    assert_eq!(s.emails_to_grace(), 0);
    let lead = Dashboard::new();
    lead.sign_in(&s.base, "lead", PASSWORD).await;
    let page = lead.page(&s.base, &format!("/runs/{run}")).await;
    assert!(
        page.contains("1 of 2 approvals: lead approved"),
        "the panel says 1 of 2"
    );

    // The same person again, from Slack or the dashboard: refused.
    s.press(&key, "saga_approve", LEAD).await;
    let told = s.told(LEAD).await;
    assert!(told.contains("second, different approver"), "{told}");
    s.approve_in_dashboard(&lead, run, approval).await;
    let flash = common::process::flash(&lead.http, &s.base).await;
    assert!(flash.contains("second, different approver"), "{flash}");
    assert_eq!(s.run_status(run).await, "AWAITING_APPROVAL");
    assert_eq!(s.emails_to_grace(), 0);

    // A second person approves: the commit runs, once.
    s.press(&key, "saga_approve", ADMIN).await;
    let done = s
        .updated_to_say(&key, "Commit: 1 of 1 steps confirmed")
        .await;
    assert!(done["blocks"].to_string().contains("*admin*"), "{done}");
    assert_eq!(s.run_status(run).await, "COMPLETED");
    assert_eq!(s.emails_to_grace(), 1);
    let events = s.state.store.events(Some(run), 100).await.unwrap();
    let approvals: Vec<_> = events
        .iter()
        .filter(|e| e.entity.as_str() == "approval")
        .collect();
    assert!(approvals.iter().any(
        |e| e.actor == Actor::User("lead".into()) && e.to_status.as_deref() == Some("pending")
    ));
    assert!(approvals
        .iter()
        .any(|e| e.actor == Actor::User("admin".into())
            && e.to_status.as_deref() == Some("approved")));
}

#[tokio::test]
async fn a_slack_press_from_someone_outside_the_tools_approver_groups_decides_nothing() {
    let s = setup_with(common::sqlite(), "", "", |file| {
        let tools = file["tool"].as_array_mut().unwrap();
        let email = tools
            .iter_mut()
            .find(|t| t["name"].as_str() == Some("send_email"))
            .unwrap();
        email.as_table_mut().unwrap().insert(
            "approvers".into(),
            toml::Value::Array(vec![toml::Value::String("support-leads".into())]),
        );
    })
    .await;
    let (run, _approval, key) = s.waiting_pivot("slack-approver-groups").await;
    s.posted(&key).await;

    // The lead is an approver, but in no group the email asks for.
    s.press(&key, "saga_approve", LEAD).await;
    let told = s.told(LEAD).await;
    assert!(
        told.contains("Only members of support-leads may decide this."),
        "{told}"
    );
    assert_eq!(s.run_status(run).await, "AWAITING_APPROVAL");
    assert_eq!(s.emails_to_grace(), 0);
    let refused = s.state.store.events(Some(run), 100).await.unwrap();
    assert!(
        refused.iter().any(|e| e.actor == Actor::User("lead".into())
            && e.detail
                .as_deref()
                .is_some_and(|d| d.starts_with("refused a decision")
                    && d.contains(&format!("pressed in Slack as {LEAD}")))),
        "{refused:#?}"
    );

    // In the group, the same press decides.
    s.state
        .store
        .set_group("lead", "support-leads", true)
        .await
        .unwrap();
    s.press(&key, "saga_approve", LEAD).await;
    s.updated_to_say(&key, "Commit: 1 of 1 steps confirmed")
        .await;
    assert_eq!(s.emails_to_grace(), 1);
    let events = s.state.store.events(Some(run), 100).await.unwrap();
    assert!(
        events.iter().any(|e| e.detail.as_deref()
            == Some(&*format!(
                "decided having pressed in Slack as {LEAD}; the right from group support-leads"
            ))),
        "{events:#?}"
    );
}

#[tokio::test]
async fn a_slack_user_the_map_does_not_name_is_linked_by_the_email_slack_gives() {
    let s = setup_with(common::sqlite(), "", "users_by_email = true", |_| {}).await;
    let hash = saga_harness::auth::hash_password(PASSWORD).unwrap();
    s.state
        .store
        .add_user(
            "ana@example.com",
            &hash,
            saga_harness::saga::class::Role::Approver,
        )
        .await
        .unwrap();
    let (run, _approval, key) = s.waiting_pivot("slack-by-email").await;
    s.posted(&key).await;

    // A bot without an email, and someone Slack does not know: refused.
    for nobody in ["U0NOMAIL01", "U0UNKNOWN9"] {
        s.press(&key, "saga_approve", nobody).await;
        let told = s.told(nobody).await;
        assert!(
            told.contains("no dashboard user is named by the email"),
            "{nobody}: {told}"
        );
    }
    assert_eq!(s.run_status(run).await, "AWAITING_APPROVAL");

    // Ana's Slack profile says ana@example.com, a dashboard approver.
    s.press(&key, "saga_approve", "U0ANASIM01").await;
    s.updated_to_say(&key, "Commit: 1 of 1 steps confirmed")
        .await;
    assert_eq!(s.emails_to_grace(), 1);
    let events = s.state.store.events(Some(run), 100).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.actor == Actor::User("ana@example.com".into())
                && e.to_status.as_deref() == Some("approved")),
        "{events:#?}"
    );
}

/// `person` saves an edit of step `step`'s arguments on the run page, as the
/// form posts it; the answer's status and the flash the next page shows.
async fn edit_in_dashboard(
    s: &Setup,
    person: &Dashboard,
    run: Uuid,
    approval: i64,
    step: i64,
    args: &str,
) -> (u16, String) {
    let digest = s.digest(approval).await;
    let answer = person
        .post(
            &s.base,
            "edit_pivot_step",
            &[
                ("run", &run.to_string()),
                ("approval", &approval.to_string()),
                ("digest", &digest),
                ("step", &step.to_string()),
                ("args", args),
            ],
        )
        .await
        .unwrap();
    let flash = common::process::flash(&person.http, &s.base).await;
    (answer.status().as_u16(), flash)
}

async fn an_approver_edits_a_commit_step_and_the_commit_sends_the_edited_arguments(
    db: common::TestDb,
) {
    let s = setup(db).await;
    let (run, approval, key) = s.waiting_pivot("slack-edit").await;
    let posted = s.posted(&key).await;
    let step = s
        .state
        .store
        .approval(approval)
        .await
        .unwrap()
        .unwrap()
        .plan["commit"][0]["step"]
        .as_i64()
        .unwrap();
    let before = s.state.store.approval(approval).await.unwrap().unwrap();
    let lead = Dashboard::new();
    lead.sign_in(&s.base, "lead", PASSWORD).await;

    // Bad input is refused with a reason, and the plan is as it was.
    let (_, not_json) = edit_in_dashboard(&s, &lead, run, approval, step, "{\"to\": ").await;
    assert!(
        not_json.starts_with("error=") && not_json.contains("not JSON"),
        "{not_json}"
    );
    let (_, off_schema) = edit_in_dashboard(
        &s,
        &lead,
        run,
        approval,
        step,
        r#"{"to": 42, "subject": "Your lamp", "body": "x"}"#,
    )
    .await;
    assert!(
        off_schema.starts_with("error=") && off_schema.contains("nothing was changed"),
        "{off_schema}"
    );
    let viewer = Dashboard::new();
    viewer.sign_in(&s.base, "viewer", PASSWORD).await;
    let (status, _) = edit_in_dashboard(
        &s,
        &viewer,
        run,
        approval,
        step,
        r#"{"to": "grace@example.com", "subject": "Your lamp", "body": "Free lamps for all."}"#,
    )
    .await;
    assert_eq!(status, 403, "a viewer cannot edit a plan");
    assert_eq!(
        s.state.store.approval(approval).await.unwrap().unwrap(),
        before,
        "refused edits change nothing"
    );

    // The lead fixes a sentence of the email.
    let fixed = r#"{"to": "grace@example.com", "subject": "Your lamp", "body": "Your new lamp ships tomorrow, not today."}"#;
    let (_, saved) = edit_in_dashboard(&s, &lead, run, approval, step, fixed).await;
    assert!(
        saved.starts_with("notice=Saved: lead changed body of step"),
        "{saved}"
    );
    let edited = s.state.store.approval(approval).await.unwrap().unwrap();
    assert_eq!(edited.status.as_str(), "pending", "saving does not approve");
    assert_ne!(edited.digest, before.digest);

    // A button drawn before the edit decides nothing; the message is
    // redrawn to show the edit and the edited call.
    s.press_stale_approve(&key, LEAD).await;
    assert!(s.told(LEAD).await.contains("replaced or edited"));
    assert_eq!(s.run_status(run).await, "AWAITING_APPROVAL");
    let redrawn = s.updated_to_say(&key, "Edited before deciding").await;
    assert!(
        redrawn["blocks"]
            .to_string()
            .contains("lead changed body of step"),
        "{redrawn}"
    );
    assert_ne!(redrawn, posted);
    let page = lead.page(&s.base, &format!("/runs/{run}")).await;
    assert!(page.contains("Edited before deciding"), "the run page");
    assert!(page.contains("ships tomorrow, not today"), "the run page");

    // Approved on the redrawn message: the email sent is the edited one, once.
    s.press(&key, "saga_approve", LEAD).await;
    s.updated_to_say(&key, "Commit: 1 of 1 steps confirmed")
        .await;
    assert_eq!(s.run_status(run).await, "COMPLETED");
    let mails = s.sims.smtp.ledger().of("email.received");
    let to_grace: Vec<_> = mails
        .iter()
        .filter(|e| e.detail.to_string().contains("grace@example.com"))
        .collect();
    assert_eq!(to_grace.len(), 1, "{to_grace:?}");
    let body = to_grace[0].detail.to_string();
    assert!(body.contains("ships tomorrow, not today"), "{body}");
    assert!(!body.contains("A new lamp ships today"), "{body}");

    // The audit trail keeps both versions; the agent reads what changed.
    let events = s.state.store.events(Some(run), 100).await.unwrap();
    let line = events
        .iter()
        .find(|e| {
            e.entity.as_str() == "approval"
                && e.detail.as_deref().is_some_and(|d| d.starts_with("edited"))
        })
        .expect("the edit's audit line");
    assert_eq!(line.actor, Actor::User("lead".into()));
    let detail = line.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("A new lamp ships today.") && detail.contains("ships tomorrow, not today"),
        "{detail}"
    );
    let view: Value = s
        .http
        .get(format!("{}/api/v1/runs/{run}", s.base))
        .bearer_auth(s.agent_token())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let edits = view["pivot_edits"].as_array().cloned().unwrap_or_default();
    assert_eq!(edits.len(), 1, "{view}");
    assert_eq!(edits[0]["changed"], json!(["body"]));
    assert_eq!(edits[0]["by"], "user:lead");
    assert_eq!(
        edits[0]["after"]["body"],
        "Your new lamp ships tomorrow, not today."
    );
}

#[tokio::test]
async fn sqlite_an_approver_edits_a_commit_step_and_the_commit_sends_the_edited_arguments() {
    an_approver_edits_a_commit_step_and_the_commit_sends_the_edited_arguments(common::sqlite())
        .await;
}

#[tokio::test]
async fn postgres_an_approver_edits_a_commit_step_and_the_commit_sends_the_edited_arguments() {
    let db = crate::common::postgres_or_skip!();
    an_approver_edits_a_commit_step_and_the_commit_sends_the_edited_arguments(db).await;
}

/// A charge that would cross a limit is held and posted to Slack with the
/// reason in words; a lead's Approve there makes it, once, past the limit
/// by their decision, and the audit line says so.
#[tokio::test]
async fn a_call_over_a_limit_is_posted_with_its_reason_and_approved_from_slack() {
    let s = setup_with(common::sqlite(), "", "", |file| {
        let limits: toml::Table = toml::from_str(
            r#"
            [[money]]
            name = "daily charges"
            per = "agent/day"
            max = 10000
            currency = "usd"
            tools = ["charge_card"]
            "#,
        )
        .unwrap();
        file.insert("limits".into(), toml::Value::Table(limits));
    })
    .await;
    let run = s
        .agent
        .start_run("slack-limit", "Charge Lena for twelve kettles")
        .await
        .unwrap();
    let charge = json!({"customer": "cus_lena", "amount": 12000, "currency": "usd"});
    let held = s.agent.act(&run, "charge_card", charge).await.unwrap();
    assert_eq!(held["outcome"], "held_over_limit", "{held}");
    let approval = s.state.store.pending_approvals().await.unwrap()[0].clone();
    let key = notice_key(
        approval.run_id,
        approval.id,
        saga_harness::saga::model::NoticePlace::Primary,
    );
    let posted = s.posted(&key).await;
    let text = posted["blocks"].to_string();
    assert!(
        text.contains(&format!(
            "This would take {AGENT}'s daily charges in the last 24 hours to $120.00 of $100.00"
        )),
        "{text}"
    );
    assert_eq!(button_labels(&posted), ["Approve", "Reject"]);
    s.press(&key, "saga_approve", LEAD).await;
    s.updated_to_say(&key, "Approved").await;
    let charged = s.sims.stripe.ledger().of("payment_intent.created");
    assert_eq!(charged.len(), 1, "{charged:?}");
    assert_eq!(charged[0].detail["amount"], 12000);
    let events = s
        .state
        .store
        .events(Some(run.parse().unwrap()), 100)
        .await
        .unwrap();
    assert!(
        events.iter().any(|e| e.entity.as_str() == "approval"
            && e.to_status.as_deref() == Some("approved")
            && e.actor == Actor::User("lead".into())),
        "{events:?}"
    );
}

/// A pivot whose commit steps would cross a limit says so in its Slack
/// message before anyone approves, as on its panel.
#[tokio::test]
async fn a_pivot_that_would_cross_a_limit_says_so_in_slack_and_on_its_panel() {
    let s = setup_with(common::sqlite(), "", "", |file| {
        let limits: toml::Table = toml::from_str(
            r#"
            [[calls]]
            name = "emails per run"
            per = "run"
            max = 1
            tools = ["create_email_draft", "send_email"]
            "#,
        )
        .unwrap();
        file.insert("limits".into(), toml::Value::Table(limits));
    })
    .await;
    let (run, _, key) = s.waiting_pivot("slack-pivot-limit").await;
    let posted = s.posted(&key).await;
    let text = posted["blocks"].to_string();
    let sentence = "Over a limit: This would take this run's emails per run to 2 calls of 1 call";
    assert!(text.contains(sentence), "{text}");
    let lead = Dashboard::new();
    lead.sign_in(&s.base, "lead", PASSWORD).await;
    let page = lead.page(&s.base, &format!("/runs/{run}")).await;
    // (The page escapes the apostrophe.)
    assert!(
        page.contains("Over a limit: ") && page.contains("emails per run to 2 calls of 1 call"),
        "the panel says it too"
    );
    assert!(
        page.contains("emails per run")
            && page.contains("1 call of 1 call")
            && page.contains("used so far"),
        "the run's spending on its page"
    );
    let list = lead.page(&s.base, "/").await;
    assert!(
        list.contains("emails per run at 100 %"),
        "the runs list marks a run at its limit"
    );
}
