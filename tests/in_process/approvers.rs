//! Approvers per tool: a tool's `approvers` groups decide its pivots and
//! held steps, whoever else has an approver's role. The run page says who
//! may, the button is offered to them only, a hand-made request from anyone
//! else is a 403 that decides nothing and is written to the audit trail,
//! and each decision's audit line says how the person signed in and which
//! group gave the right.

use crate::common;

use common::app::{Spawn, TestApp};
use common::identity::{Browser, IdentityProvider, CLIENT_ID, CLIENT_SECRET};
use common::world::{World, TOOLS};
use saga_harness::auth::{hash_password, token_hash};
use saga_harness::connectors::ConnectorSet;
use saga_harness::saga::class::Role;
use serde_json::{json, Value};
use std::sync::Arc;

const PASSWORD: &str = "correct horse battery";

struct Setup {
    app: TestApp,
    world: Arc<World>,
    token: String,
    _db: common::TestDb,
    _tools: tempfile::TempDir,
}

/// The model world's tools, with charging a card decided by billing
/// leads only; two approvers, one of them in that group.
async fn start(db: common::TestDb, sign_in: Option<saga_harness::config::SignIn>) -> Setup {
    let tools = tempfile::tempdir().unwrap();
    let path = tools.path().join("tools.toml");
    let text = TOOLS.replacen(
        "name = \"charge_card\"\n",
        "name = \"charge_card\"\napprovers = [\"billing-leads\"]\n",
        1,
    );
    assert_ne!(text, TOOLS);
    std::fs::write(&path, text).unwrap();
    let world = Arc::new(World::new());
    let connectors = ConnectorSet::new().serve(common::world::OPERATIONS, world.clone());
    let app = Spawn::on(&db)
        .tools(path)
        .connectors(connectors)
        .with(|args| {
            if let Some(sign_in) = sign_in {
                args.sign_in = sign_in;
            }
        })
        .start()
        .await;
    let store = app.state().store.clone();
    let hash = hash_password(PASSWORD).unwrap();
    store.add_user("bea", &hash, Role::Approver).await.unwrap();
    store.add_user("sam", &hash, Role::Approver).await.unwrap();
    let bea = store.set_group("bea", "billing-leads", true).await.unwrap();
    assert_eq!(bea.groups, ["billing-leads"]);
    store.set_group("sam", "support-leads", true).await.unwrap();
    let token = saga_harness::auth::new_api_token();
    store
        .add_api_token("support-bot", &token_hash(&token), None)
        .await
        .unwrap();
    Setup {
        app,
        world,
        token,
        _db: db,
        _tools: tools,
    }
}

impl Setup {
    async fn agent(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = reqwest::Client::new()
            .request(method, format!("{}{path}", self.app.api()))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        response.json().await.unwrap()
    }

    /// A run whose pivot charges a card: (run id, approval id, digest).
    async fn pivot(&self) -> (String, String, String) {
        let run = self
            .agent(
                reqwest::Method::POST,
                "/runs",
                Some(json!({"purpose": "charge for the repair"})),
            )
            .await["run"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let proposed = self
            .agent(
                reqwest::Method::POST,
                &format!("/runs/{run}/pivot"),
                Some(json!({"summary": "charge the repair", "commit": [
                    {"tool": "charge_card", "args": {"amount": 4900, "currency": "usd", "customer": "cus_ada"}}
                ]})),
            )
            .await;
        assert_eq!(proposed["outcome"], "awaiting_approval", "{proposed}");
        let view = self
            .agent(reqwest::Method::GET, &format!("/runs/{run}"), None)
            .await;
        (
            run,
            view["pivot"]["id"].to_string(),
            view["pivot"]["digest"].as_str().unwrap().to_owned(),
        )
    }

    async fn run_status(&self, run: &str) -> String {
        self.agent(reqwest::Method::GET, &format!("/runs/{run}"), None)
            .await["run"]["status"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn audit_lines(&self, run: &str) -> Vec<String> {
        let run: uuid::Uuid = run.parse().unwrap();
        self.app
            .state()
            .store
            .events(Some(run), 1000)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| e.detail.map(|d| format!("{}: {d}", e.actor.name())))
            .collect()
    }
}

async fn signed_in_locally(base: &str, who: &str) -> Browser {
    let browser = Browser::new();
    let response = browser
        .http
        .post(format!("{base}/api/login"))
        .header("accept", "text/html")
        .form(&[("username", who), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some("/"),
        "{who} signs in"
    );
    browser
}

async fn run_page_text(browser: &Browser, base: &str, run: &str) -> (String, String) {
    let page = browser.page(&format!("{base}/runs/{run}")).await;
    (common::visible_text(&page), page)
}

async fn decide(browser: &Browser, base: &str, run: &str, approval: &str, digest: &str) -> u16 {
    browser
        .http
        .post(format!("{base}/api/decide_pivot"))
        .header("accept", "text/html")
        .form(&[
            ("run", run),
            ("approval", approval),
            ("digest", digest),
            ("decision", "approve"),
        ])
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn only_a_tools_approver_groups_decide_its_pivot(db: common::TestDb) {
    let setup = start(db, None).await;
    let base = setup.app.base.clone();
    let (run, approval, digest) = setup.pivot().await;

    // Sam is an approver, but not a billing lead.
    let sam = signed_in_locally(&base, "sam").await;
    let (text, html) = run_page_text(&sam, &base, &run).await;
    assert!(
        text.contains("Only members of billing-leads may decide this."),
        "{text}"
    );
    assert!(
        !html.contains("value=\"approve\""),
        "Approve is offered to sam"
    );
    assert_eq!(decide(&sam, &base, &run, &approval, &digest).await, 403);
    assert_eq!(setup.run_status(&run).await, "AWAITING_APPROVAL");
    assert!(
        setup.world.effects("payments.charge").is_empty(),
        "the card was charged"
    );
    let lines = setup.audit_lines(&run).await;
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("sam: refused a decision")
                && l.contains("signed in with a local password")
                && l.contains("in support-leads")
                && l.contains("billing-leads")),
        "{lines:#?}"
    );

    // Bea is.
    let bea = signed_in_locally(&base, "bea").await;
    let (text, html) = run_page_text(&bea, &base, &run).await;
    assert!(
        text.contains("Only members of billing-leads may decide this."),
        "{text}"
    );
    assert!(
        html.contains("value=\"approve\""),
        "Approve is not offered to bea"
    );
    assert_eq!(decide(&bea, &base, &run, &approval, &digest).await, 302);
    common::until("the charge to be made", || async {
        (setup.world.effects("payments.charge").len() == 1).then_some(())
    })
    .await;
    let lines = setup.audit_lines(&run).await;
    assert!(
        lines.iter().any(|l| l
            == "bea: decided having signed in with a local password; the right from group billing-leads"),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn sqlite_only_a_tools_approver_groups_decide_its_pivot() {
    only_a_tools_approver_groups_decide_its_pivot(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_only_a_tools_approver_groups_decide_its_pivot() {
    let db = common::postgres_or_skip!();
    only_a_tools_approver_groups_decide_its_pivot(db).await;
}

#[tokio::test]
async fn a_group_taken_away_applies_from_the_persons_next_request() {
    let setup = start(common::sqlite(), None).await;
    let base = setup.app.base.clone();
    let (run, approval, digest) = setup.pivot().await;
    let bea = signed_in_locally(&base, "bea").await;
    setup
        .app
        .state()
        .store
        .set_group("bea", "billing-leads", false)
        .await
        .unwrap();
    assert_eq!(decide(&bea, &base, &run, &approval, &digest).await, 403);
    assert!(setup.world.effects("payments.charge").is_empty());
}

#[tokio::test]
async fn the_providers_groups_give_the_right_and_the_audit_names_issuer_and_subject() {
    let port = common::process::free_port();
    let issuer = format!("http://127.0.0.1:{port}");
    let sign_in = saga_harness::config::SignIn {
        oidc_issuer: Some(issuer.parse().unwrap()),
        oidc_client_id: Some(CLIENT_ID.into()),
        oidc_client_secret: Some(CLIENT_SECRET.to_owned().into()),
        oidc_roles: Some(
            "approver=billing-leads,approver=support-leads"
                .parse()
                .unwrap(),
        ),
        ..Default::default()
    };
    let setup = start(common::sqlite(), Some(sign_in)).await;
    let base = setup.app.base.clone();
    let _provider = IdentityProvider::start(port, &format!("{base}/auth/oidc/callback"), &[]).await;
    let (run, approval, digest) = setup.pivot().await;

    // Ada leads support, not billing.
    let ada = Browser::new();
    assert_eq!(ada.sign_in(&base, "ada").await.landed, format!("{base}/"));
    assert_eq!(decide(&ada, &base, &run, &approval, &digest).await, 403);
    let bea = Browser::new();
    assert_eq!(bea.sign_in(&base, "bea").await.landed, format!("{base}/"));
    assert_eq!(decide(&bea, &base, &run, &approval, &digest).await, 302);
    let lines = setup.audit_lines(&run).await;
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ada@example.com: refused a decision")),
        "{lines:#?}"
    );
    let right = format!(
        "bea@example.com: decided having signed in through {issuer} as bea; the right from group billing-leads"
    );
    assert!(lines.contains(&right), "{lines:#?}");
}

/// What the agent asked for and was refused is on its run's page, in the
/// words the agent got, for whoever reads the run.
#[tokio::test]
async fn the_run_page_lists_the_calls_the_harness_refused_the_agent() {
    let setup = start(common::sqlite(), None).await;
    let base = setup.app.base.clone();
    let run = setup
        .agent(
            reqwest::Method::POST,
            "/runs",
            Some(json!({"purpose": "open a ticket"})),
        )
        .await["run"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let refused = reqwest::Client::new()
        .post(format!("{}/runs/{run}/calls", setup.app.api()))
        .bearer_auth(&setup.token)
        .json(&json!({"tool": "create_ticket", "args": {}, "step": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 409);
    let sam = signed_in_locally(&base, "sam").await;
    let (text, _) = run_page_text(&sam, &base, &run).await;
    assert!(text.contains("Calls the harness refused"), "{text}");
    assert!(
        text.contains("step 3 is beyond the run's next step 0 step_out_of_order"),
        "{text}"
    );
    assert!(setup.world.effects("tickets.create").is_empty());
}
