//! The server over real HTTP on port 0: sign-in, the runs list behind it,
//! the cross-site guard, and the start-up errors an operator would hit.

use crate::common;

use common::app::{Spawn, TestApp};
use saga_harness::auth::hash_password;
use saga_harness::saga::class::Role;
use saga_harness::server::ServerError;

struct Running {
    base: String,
    _app: TestApp,
    _db: common::TestDb,
}

async fn start(db: common::TestDb) -> Running {
    let app = Spawn::on(&db).start().await;
    let hash = hash_password("correct horse battery").unwrap();
    app.state()
        .store
        .add_user("dana", &hash, Role::Approver)
        .await
        .unwrap();
    Running {
        base: app.base.clone(),
        _app: app,
        _db: db,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn sign_in(client: &reqwest::Client, base: &str, password: &str) -> reqwest::Response {
    client
        .post(format!("{base}/api/login"))
        // What a browser sends when it submits the form without JavaScript.
        .header("accept", "text/html,application/xhtml+xml")
        .form(&[("username", "dana"), ("password", password)])
        .send()
        .await
        .unwrap()
}

async fn sign_in_flow(server: Running) {
    let base = &server.base;
    let client = client();
    let health = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);

    let runs = client.get(format!("{base}/")).send().await.unwrap();
    assert!(runs.status().is_redirection(), "{}", runs.status());
    assert_eq!(runs.headers()["location"], "/login");

    let page = client.get(format!("{base}/login")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("name=\"username\""), "{html}");
    assert!(html.contains("Sign in"));

    let refused = sign_in(&client, base, "wrong password").await;
    assert!(refused.status().is_redirection(), "{}", refused.status());
    assert_eq!(refused.headers()["location"], "/login?error=1");
    let again = client
        .get(format!("{base}/login?error=1"))
        .send()
        .await
        .unwrap();
    assert!(again
        .text()
        .await
        .unwrap()
        .contains("Wrong username or password."));
    assert!(client
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .status()
        .is_redirection());

    let accepted = sign_in(&client, base, "correct horse battery").await;
    assert!(accepted.status().is_redirection(), "{}", accepted.status());
    assert_eq!(accepted.headers()["location"], "/");
    let cookie = accepted.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );

    let runs = client.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(runs.status(), 200);
    let html = runs.text().await.unwrap();
    assert!(html.contains("No runs yet"), "{html}");
    assert!(html.contains("dana"), "{html}");

    let signed_out = client
        .post(format!("{base}/api/logout"))
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert!(signed_out.status().is_redirection());
    assert!(client
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .status()
        .is_redirection());
}

#[tokio::test]
async fn sqlite_sign_in_then_the_runs_list() {
    sign_in_flow(start(common::sqlite()).await).await;
}

#[tokio::test]
async fn postgres_sign_in_then_the_runs_list() {
    let db = crate::common::postgres_or_skip!();
    sign_in_flow(start(db).await).await;
}

#[tokio::test]
async fn runs_list_lists_runs_awaiting_approval_first() {
    use saga_harness::saga::model::NewRun;
    use saga_harness::saga::status::RunStatus;
    let db = common::sqlite();
    let app = Spawn::on(&db).start().await;
    let store = app.state().store.clone();
    store
        .add_user(
            "dana",
            &hash_password("correct horse battery").unwrap(),
            Role::Viewer,
        )
        .await
        .unwrap();
    let new = |purpose: &str| NewRun {
        agent: "support-bot".into(),
        label: None,
        purpose: purpose.into(),
    };
    let (waiting, _) = store
        .create_run(new("close duplicate ticket"))
        .await
        .unwrap();
    store.create_run(new("newer, still running")).await.unwrap();
    let actor = saga_harness::saga::model::Actor::Agent("support-bot".into());
    store
        .move_run(
            waiting.id,
            RunStatus::Running,
            RunStatus::AwaitingApproval,
            &actor,
            None,
        )
        .await
        .unwrap();
    // A running run with one call held for its own approval counts too.
    let (held, _) = store
        .create_run(new("email held for approval"))
        .await
        .unwrap();
    store
        .record_held_step(
            saga_harness::saga::model::NewStep {
                run_id: held.id,
                step_idx: 0,
                tool: "email_customer".into(),
                tool_class: saga_harness::saga::class::ToolClass::Irreversible,
                idempotency_key: saga_harness::saga::key::step_key(held.id, 0, "email_customer"),
                args: serde_json::json!({"to": "ana@example.com"}),
                status: saga_harness::saga::status::StepStatus::AwaitingApproval,
                compensation: None,
                audience: saga_harness::saga::class::Audience::Customer,
                phase: saga_harness::saga::class::Phase::BeforePivot,
                limits: Default::default(),
            },
            saga_harness::saga::model::NewApproval {
                run_id: held.id,
                kind: saga_harness::saga::model::ApprovalKind::Step,
                step_idx: Some(0),
                summary: "an irreversible call before the pivot".into(),
                plan: serde_json::json!({}),
                digest: "d".into(),
                expires_at: None,
                approvers_needed: 1,
            },
            &actor,
        )
        .await
        .unwrap();
    store.create_run(new("newest, nothing held")).await.unwrap();
    let base = app.base.clone();
    let client = client();
    sign_in(&client, &base, "correct horse battery").await;
    let html = client
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let position = |text: &str| {
        html.find(text)
            .unwrap_or_else(|| panic!("{text} not listed"))
    };
    let waiting_at = position("close duplicate ticket");
    let held_at = position("email held for approval");
    let running_at = position("newer, still running");
    let newest_at = position("newest, nothing held");
    assert!(
        waiting_at < running_at && held_at < running_at,
        "awaiting approval is not first"
    );
    assert!(
        held_at < newest_at,
        "a held step counts as awaiting approval"
    );
    assert!(html.contains("AWAITING_APPROVAL"));
}

#[tokio::test]
async fn cross_site_form_posts_are_refused() {
    let server = start(common::sqlite()).await;
    let response = client()
        .post(format!("{}/api/login", server.base))
        .header("origin", "https://evil.example")
        .form(&[("username", "dana"), ("password", "correct horse battery")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert!(response.text().await.unwrap().contains("cross-site"));
}

#[tokio::test]
async fn a_port_in_use_is_a_clear_error() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap();
    let db = common::sqlite();
    let Err(err) = Spawn::on(&db).with(|args| args.bind = taken).build().await else {
        panic!("bound a port in use");
    };
    assert!(matches!(err, ServerError::Bind { .. }));
    let message = err.to_string();
    assert!(
        message.contains(&taken.to_string()) && message.contains("--bind"),
        "{message}"
    );
}

#[tokio::test]
async fn an_unreachable_postgres_is_a_clear_error() {
    // Port 9 on loopback: nothing listens there.
    let unreachable = "postgres://saga:secret@127.0.0.1:9/saga";
    let Err(err) = Spawn::on_url(unreachable).build().await else {
        panic!("connected to nothing");
    };
    let message = err.to_string();
    assert!(
        message.contains("cannot reach PostgreSQL at 127.0.0.1:9/saga"),
        "{message}"
    );
    assert!(!message.contains("secret"), "{message}");
}

#[tokio::test]
async fn r1_a_bad_tools_file_stops_start_up_naming_tool_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, "[[tool]]\nname = \"stripe.charge\"\nclass = \"compensatable\"\nconnector = \"stripe.charge\"\n").unwrap();
    let db = common::sqlite();
    let Err(err) = Spawn::on(&db).tools(path).build().await else {
        panic!("accepted a compensatable tool without compensation");
    };
    let message = err.to_string();
    assert!(
        message.contains("tool `stripe.charge`, field `compensation`"),
        "{message}"
    );
}

#[tokio::test]
async fn after_five_sign_in_attempts_the_account_waits_at_that_address_even_with_the_right_password(
) {
    let server = start(common::sqlite()).await;
    let base = &server.base;
    let client = client();
    for attempt in 1..=5 {
        let refused = sign_in(&client, base, "guess").await;
        assert_eq!(
            refused.headers()["location"],
            "/login?error=1",
            "attempt {attempt}"
        );
    }
    let throttled = sign_in(&client, base, "correct horse battery").await;
    let location = throttled.headers()["location"].to_str().unwrap().to_owned();
    assert!(
        location.starts_with("/login?error=throttled&wait=1"),
        "{location}"
    );
    let page = client
        .get(format!("{base}{location}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Too many sign-in attempts"), "{page}");
    assert!(client
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .status()
        .is_redirection());
}

#[tokio::test]
async fn a_decision_or_answer_that_is_neither_choice_is_refused_not_taken_as_no() {
    let server = start(common::sqlite()).await;
    let base = &server.base;
    let client = client();
    sign_in(&client, base, "correct horse battery").await;
    let run = "6f1c2a4e-3b7d-4c1e-9a2f-0d5e8b7c6a11";
    for (endpoint, form) in [
        (
            "decide_pivot",
            vec![
                ("run", run),
                ("approval", "1"),
                ("digest", "d"),
                ("decision", "Approve"),
            ],
        ),
        (
            "decide_step",
            vec![
                ("run", run),
                ("approval", "1"),
                ("digest", "d"),
                ("decision", "maybe"),
            ],
        ),
        (
            "answer_question",
            vec![
                ("run", run),
                ("step", "0"),
                ("asked", "2026-01-01T00:00:00Z"),
                ("happened", "true"),
            ],
        ),
        (
            "answer_compensation",
            vec![
                ("run", run),
                ("step", "0"),
                ("asked", "2026-01-01T00:00:00Z"),
                ("undone", ""),
            ],
        ),
    ] {
        let response = client
            .post(format!("{base}/api/{endpoint}"))
            .header("accept", "text/html")
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{endpoint}");
        let body = response.text().await.unwrap();
        assert!(body.contains("must be"), "{endpoint}: {body}");
    }
}
