//! Who may do what (DESIGN.md §5, §6), against the real binary: every agent
//! API route, every dashboard page and every server function, tried as
//! anonymous, as an agent token, and as a signed-in viewer, approver and
//! admin. People's decisions (approve, reject, answer, unwind, sign off)
//! are never possible with an agent token or without a session, and never
//! from another site's page; refused attempts change nothing. Secrets stay
//! secret: tokens and passwords are stored hashed, the session cookie is
//! HttpOnly and SameSite, and a debug-level log of a whole run — sign-ins,
//! calls through every credentialed connector — shows none of them.

use crate::common;

use common::process::{provision, tools_file, Dashboard, Launch, TestProcess, PASSWORD};
use saga_harness::sim::bundle::{Simulators, CREDENTIALS};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::time::Duration;

const AGENT: &str = "support-bot";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Anonymous,
    Agent,
    Viewer,
    Approver,
    Admin,
}

const EVERYONE: [Who; 5] = [
    Who::Anonymous,
    Who::Agent,
    Who::Viewer,
    Who::Approver,
    Who::Admin,
];

/// The five principals, each with its own client (and cookie jar).
struct Principals {
    base: String,
    token: String,
    other_token: String,
    plain: reqwest::Client,
    viewer: Dashboard,
    approver: Dashboard,
    admin: Dashboard,
}

impl Principals {
    async fn sign_in(base: &str, token: String, other_token: String) -> Principals {
        let (viewer, approver, admin) = (Dashboard::new(), Dashboard::new(), Dashboard::new());
        viewer.sign_in(base, "vic", PASSWORD).await;
        approver.sign_in(base, "lead", PASSWORD).await;
        admin.sign_in(base, "root", PASSWORD).await;
        Principals {
            base: base.to_owned(),
            token,
            other_token,
            plain: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            viewer,
            approver,
            admin,
        }
    }

    fn client(&self, who: Who) -> &reqwest::Client {
        match who {
            Who::Anonymous | Who::Agent => &self.plain,
            Who::Viewer => &self.viewer.http,
            Who::Approver => &self.approver.http,
            Who::Admin => &self.admin.http,
        }
    }

    fn request(&self, who: Who, method: &str, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{path}", self.base);
        let client = self.client(who);
        let request = match method {
            "GET" => client.get(url),
            "POST" => client.post(url),
            other => panic!("{other}"),
        };
        match who {
            Who::Agent => request.bearer_auth(&self.token),
            _ => request,
        }
    }

    /// The agent's own API call; panics unless it succeeds.
    async fn agent(&self, path: &str, body: Value) -> Value {
        let response = self
            .request(Who::Agent, "POST", &format!("/api/v1{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {body}");
        body
    }

    async fn agent_get(&self, path: &str) -> Value {
        let response = self
            .request(Who::Agent, "GET", &format!("/api/v1{path}"))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        response.json().await.unwrap()
    }

    /// A server function posted as the dashboard's form would be (no JS).
    async fn form(&self, who: Who, endpoint: &str, form: &[(&str, &str)]) -> (u16, String) {
        let response = self
            .request(who, "POST", &format!("/api/{endpoint}"))
            .header("accept", "text/html")
            .form(form)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        (status, location)
    }

    /// A server function read as JSON, as the hydrated page does.
    async fn read(&self, who: Who, endpoint: &str, form: &[(&str, &str)]) -> (u16, Value) {
        let response = self
            .request(who, "POST", &format!("/api/{endpoint}"))
            .header("accept", "application/json")
            .form(form)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// The matrix as it was observed, printed at the end of the test.
#[derive(Default)]
struct Matrix {
    rows: Vec<(String, Vec<u16>)>,
}

impl Matrix {
    fn record(&mut self, what: &str, who: Who, status: u16) {
        let column = EVERYONE.iter().position(|w| *w == who).unwrap();
        match self.rows.iter_mut().find(|(w, _)| w == what) {
            Some((_, row)) => row[column] = status,
            None => {
                let mut row = vec![0; EVERYONE.len()];
                row[column] = status;
                self.rows.push((what.to_owned(), row));
            }
        }
    }

    fn print(&self) {
        let mut out = format!(
            "{:<44} {:>5} {:>5} {:>6} {:>8} {:>5}\n",
            "route / action", "anon", "agent", "viewer", "approver", "admin"
        );
        for (what, row) in &self.rows {
            let cell = |s: u16| {
                if s == 0 {
                    "-".to_owned()
                } else {
                    s.to_string()
                }
            };
            let _ = writeln!(
                out,
                "{what:<44} {:>5} {:>5} {:>6} {:>8} {:>5}",
                cell(row[0]),
                cell(row[1]),
                cell(row[2]),
                cell(row[3]),
                cell(row[4])
            );
        }
        eprintln!("{out}");
    }
}

/// What one deciding person (approver or admin) gets to decide.
struct Targets {
    pivot_run: String,
    approval: String,
    digest: String,
    held_run: String,
    held_approval: String,
    held_digest: String,
    unwind_run: String,
    correction_send: String,
    correction_dismiss: String,
}

async fn seed(p: &Principals, sims: &Simulators, tag: &str) -> Targets {
    // A staged hold and a pivot that captures it.
    let run = p
        .agent(
            "/runs",
            json!({"purpose": format!("{tag}: capture the hold")}),
        )
        .await["run"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let hold = p
        .agent(
            &format!("/runs/{run}/calls"),
            json!({"tool": "authorize_payment", "step": 0,
            "args": {"customer": "cus_grace", "amount": 3200, "currency": "usd"}}),
        )
        .await;
    assert_eq!(hold["outcome"], "confirmed", "{hold}");
    let proposed = p
        .agent(
            &format!("/runs/{run}/pivot"),
            json!({"summary": "capture", "commit": [
            {"tool": "capture_payment", "args": {"intent_key": hold["key"], "amount": 3200}}]}),
        )
        .await;
    // An email held for its own approval.
    let held_run = p
        .agent(
            "/runs",
            json!({"purpose": format!("{tag}: tell the customer")}),
        )
        .await["run"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let held = p
        .agent(&format!("/runs/{held_run}/calls"), json!({"tool": "send_email", "step": 0,
            "args": {"to": "ada@example.com", "subject": "Your refund", "body": "It is on its way."}}))
        .await;
    assert_eq!(held["outcome"], "awaiting_approval", "{held}");
    let (status, sheet) = p
        .read(Who::Approver, "run_detail", &[("id", &held_run)])
        .await;
    assert_eq!(status, 200, "{sheet}");
    // A run a person may unwind: one draft.
    let unwind_run = p
        .agent("/runs", json!({"purpose": format!("{tag}: draft only")}))
        .await["run"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    p.agent(
        &format!("/runs/{unwind_run}/calls"),
        json!({"tool": "create_email_draft", "step": 0,
        "args": {"to": "ada@example.com", "subject": "Draft", "body": "Draft."}}),
    )
    .await;
    // Two charges with receipts, unwound: two corrections to sign off.
    let charged = p
        .agent("/runs", json!({"purpose": format!("{tag}: charged twice")}))
        .await["run"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for step in 0..2 {
        let out = p
            .agent(
                &format!("/runs/{charged}/calls"),
                json!({"tool": "charge_card", "step": step,
                "args": {"customer": "cus_ada", "amount": 1000 + step, "currency": "usd",
                         "email": "ada@example.com", "receipt": true}}),
            )
            .await;
        assert_eq!(out["outcome"], "confirmed", "{out}");
    }
    let unwound = p
        .agent(
            &format!("/runs/{charged}/unwind"),
            json!({"reason": "charged in error"}),
        )
        .await;
    assert_eq!(unwound["status"], "UNWOUND", "{unwound}");
    let (_, inbox) = p.read(Who::Approver, "corrections_inbox", &[]).await;
    let ids: Vec<String> = inbox["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["run_id"] == charged.as_str())
        .map(|i| i["id"].to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{inbox}");
    let _ = sims;
    Targets {
        pivot_run: run,
        approval: proposed["approval_id"].to_string(),
        digest: proposed["digest"].as_str().unwrap().to_owned(),
        held_run,
        held_approval: sheet["held"][0]["approval_id"].to_string(),
        held_digest: sheet["held"][0]["digest"].as_str().unwrap().to_owned(),
        unwind_run,
        correction_send: ids[0].clone(),
        correction_dismiss: ids[1].clone(),
    }
}

/// Every decision a person makes, as the form that makes it.
fn decisions(t: &Targets) -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    vec![
        (
            "decide_pivot",
            vec![
                ("run", t.pivot_run.clone()),
                ("approval", t.approval.clone()),
                ("digest", t.digest.clone()),
                ("decision", "approve".into()),
            ],
        ),
        (
            "decide_step",
            vec![
                ("run", t.held_run.clone()),
                ("approval", t.held_approval.clone()),
                ("digest", t.held_digest.clone()),
                ("decision", "approve".into()),
            ],
        ),
        (
            "answer_question",
            vec![
                ("run", t.held_run.clone()),
                ("step", "0".into()),
                ("asked", "2026-01-01T00:00:00Z".into()),
                ("happened", "yes".into()),
            ],
        ),
        (
            "answer_compensation",
            vec![
                ("run", t.unwind_run.clone()),
                ("step", "0".into()),
                ("asked", "2026-01-01T00:00:00Z".into()),
                ("undone", "yes".into()),
            ],
        ),
        (
            "unwind_run",
            vec![
                ("run", t.unwind_run.clone()),
                ("reason", "the customer withdrew".into()),
            ],
        ),
        (
            "send_correction",
            vec![
                ("id", t.correction_send.clone()),
                ("message", "We refunded the charge made in error.".into()),
            ],
        ),
        (
            "answer_correction_send",
            vec![
                ("id", t.correction_send.clone()),
                ("went_out", "yes".into()),
            ],
        ),
        (
            "dismiss_correction",
            vec![
                ("id", t.correction_dismiss.clone()),
                ("reason", "the customer already knows".into()),
            ],
        ),
    ]
}

fn pairs<'a>(form: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    form.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The state every decision would change, read as the agent and an
/// approver see it.
async fn snapshot(p: &Principals, t: &Targets) -> Value {
    let run = |id: &str| format!("/runs/{id}");
    let (_, inbox) = p.read(Who::Approver, "corrections_inbox", &[]).await;
    let corrections: Vec<Value> = inbox["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| {
            let id = i["id"].to_string();
            id == t.correction_send || id == t.correction_dismiss
        })
        .map(|i| json!([i["id"], i["status"], i["send_status"], i["message"]]))
        .collect();
    json!({
        "pivot": p.agent_get(&run(&t.pivot_run)).await["run"]["status"],
        "held": p.agent_get(&run(&t.held_run)).await["steps"],
        "unwind": p.agent_get(&run(&t.unwind_run)).await["run"]["status"],
        "corrections": corrections,
    })
}

async fn the_matrix(db: common::TestDb) {
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 50);
    let people = [("vic", "viewer"), ("lead", "approver"), ("root", "admin")];
    let token = provision(&db.url, AGENT, &people).await;
    let other_token = provision(&db.url, "billing-bot", &[]).await;
    let mut harness =
        TestProcess::start(&Launch::new(&db.url, Some(&tools)).rust_log("debug")).await;
    let p = Principals::sign_in(&harness.base, token.clone(), other_token.clone()).await;
    let mut matrix = Matrix::default();

    // --- The agent API: only the agent's token opens it. ---
    let own = p.agent("/runs", json!({"purpose": "matrix"})).await["run"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Every connector with credentials is used, so the log has a chance
    // to show them.
    for (step, tool, args) in [
        (
            0,
            "create_ticket",
            json!({"summary": "Kettle arrived broken"}),
        ),
        (
            1,
            "create_ticket_draft",
            json!({"subject": "Kettle", "body": "Broken on arrival."}),
        ),
        (
            2,
            "post_team_update",
            json!({"channel": "#support", "text": "Kettle case opened."}),
        ),
    ] {
        let out = p
            .agent(
                &format!("/runs/{own}/calls"),
                json!({"tool": tool, "args": args, "step": step}),
            )
            .await;
        assert_eq!(out["outcome"], "confirmed", "{tool}: {out}");
    }
    let fresh = || async {
        p.agent("/runs", json!({"purpose": "matrix, fresh"})).await["run"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    struct Route {
        method: &'static str,
        path: String,
        body: Option<Value>,
        /// What the agent's own token gets.
        agent: u16,
    }
    let mut routes = vec![
        Route {
            method: "POST",
            path: "/api/v1/runs".into(),
            body: Some(json!({"purpose": "p"})),
            agent: 201,
        },
        Route {
            method: "GET",
            path: format!("/api/v1/runs/{own}"),
            body: None,
            agent: 200,
        },
        Route {
            method: "POST",
            path: format!("/api/v1/runs/{own}/calls"),
            body: Some(json!({"tool": "search_orders", "args": {"customer": "cus_ada"}})),
            agent: 200,
        },
        Route {
            method: "GET",
            path: "/api/v1/tools".into(),
            body: None,
            agent: 200,
        },
        Route {
            method: "GET",
            path: format!("/api/v1/runs/{own}/events"),
            body: None,
            agent: 200,
        },
    ];
    routes.push(Route {
        method: "POST",
        path: format!("/api/v1/runs/{}/pivot", fresh().await),
        body: Some(json!({"summary": "s", "commit": [{"tool": "send_email",
            "args": {"to": "a@example.com", "subject": "s", "body": "b"}}]})),
        agent: 200,
    });
    routes.push(Route {
        method: "POST",
        path: format!("/api/v1/runs/{}/unwind", fresh().await),
        body: Some(json!({"reason": "r"})),
        agent: 200,
    });
    routes.push(Route {
        method: "POST",
        path: format!("/api/v1/runs/{}/complete", fresh().await),
        body: None,
        agent: 200,
    });
    // Everyone but the agent is turned away before the body is read, so
    // they go first and the agent's own request acts once.
    for route in &routes {
        let what = format!("{} {}", route.method, route.path.replace(&own, "{run}"));
        let what = what
            .split('/')
            .map(|seg| if seg.len() == 36 { "{run}" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        for who in [
            Who::Anonymous,
            Who::Viewer,
            Who::Approver,
            Who::Admin,
            Who::Agent,
        ] {
            let mut request = p.request(who, route.method, &route.path);
            if let Some(body) = &route.body {
                request = request.json(body);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            matrix.record(&what, who, status);
            let expected = if who == Who::Agent { route.agent } else { 401 };
            assert_eq!(status, expected, "{what} as {who:?}");
            if status == 401 {
                let body: Value = response.json().await.unwrap();
                assert_eq!(body["code"], "unauthorized", "{what} as {who:?}");
            }
        }
        // Another agent's token finds no such run.
        if route.path.contains("/runs/") {
            let mut request = p
                .plain
                .request(
                    route.method.parse().unwrap(),
                    format!("{}{}", p.base, route.path),
                )
                .bearer_auth(&p.other_token);
            if let Some(body) = &route.body {
                request = request.json(body);
            }
            let status = request.send().await.unwrap().status().as_u16();
            assert_eq!(status, 404, "{what} with another agent's token");
        }
    }
    for who in EVERYONE {
        let status = p
            .request(who, "GET", "/api/v1/openapi.json")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        matrix.record("GET /api/v1/openapi.json", who, status);
        assert_eq!(status, 200);
    }
    // No route lets anyone approve through the agent API.
    let (pivot_run, _) = (fresh().await, ());
    for path in [
        format!("/api/v1/runs/{pivot_run}/approve"),
        format!("/api/v1/runs/{pivot_run}/pivot/approve"),
        format!("/api/v1/runs/{pivot_run}/answer"),
        "/api/v1/approvals/1".to_owned(),
        "/api/v1/corrections/1/send".to_owned(),
    ] {
        let status = p
            .request(Who::Agent, "POST", &path)
            .json(&json!({"approve": true, "digest": "x"}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        assert!(matches!(status, 404 | 405), "{path}: {status}");
    }

    // --- Dashboard pages: a session opens them; a token does not. ---
    for (page, what) in [
        ("/".to_owned(), "GET / (runs)"),
        (format!("/runs/{own}"), "GET /runs/{run}"),
        ("/corrections".to_owned(), "GET /corrections"),
        ("/audit".to_owned(), "GET /audit"),
    ] {
        for who in EVERYONE {
            let response = p.request(who, "GET", &page).send().await.unwrap();
            let status = response.status().as_u16();
            matrix.record(what, who, status);
            match who {
                Who::Anonymous | Who::Agent => {
                    assert!(
                        response.status().is_redirection(),
                        "{what} as {who:?}: {status}"
                    );
                    assert_eq!(response.headers()["location"], "/login");
                }
                _ => assert_eq!(status, 200, "{what} as {who:?}"),
            }
        }
    }
    for who in EVERYONE {
        let status = p
            .request(who, "GET", "/dashboard/events")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        matrix.record("GET /dashboard/events", who, status);
        let expected = if matches!(who, Who::Anonymous | Who::Agent) {
            401
        } else {
            200
        };
        assert_eq!(status, expected, "the live stream as {who:?}");
        let login = p
            .request(who, "GET", "/login")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        matrix.record("GET /login", who, login);
        assert_eq!(login, 200);
    }

    // --- Reading server functions: a session, any role. ---
    let reads: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("runs", vec![("page", "1")]),
        ("run_detail", vec![("id", own.as_str())]),
        ("corrections_inbox", vec![]),
        ("audit_trail", vec![("everything", "true")]),
        ("nav_counts", vec![]),
    ];
    for (endpoint, form) in &reads {
        for who in EVERYONE {
            let (status, body) = p.read(who, endpoint, form).await;
            matrix.record(&format!("POST /api/{endpoint}"), who, status);
            let expected = if matches!(who, Who::Anonymous | Who::Agent) {
                401
            } else {
                200
            };
            assert_eq!(status, expected, "{endpoint} as {who:?}: {body}");
        }
    }
    for who in EVERYONE {
        let (status, body) = p.read(who, "me", &[]).await;
        matrix.record("POST /api/me", who, status);
        assert_eq!(status, 200);
        let expected = match who {
            Who::Anonymous | Who::Agent => Value::Null,
            Who::Viewer => json!("vic"),
            Who::Approver => json!("lead"),
            Who::Admin => json!("root"),
        };
        assert_eq!(body["username"], expected, "me as {who:?}");
    }

    // --- Decisions: approver and admin only, never a token. ---
    let mut mailbox_before = sims.smtp.ledger().of("email.received").len();
    for decider in [Who::Approver, Who::Admin] {
        let targets = seed(&p, &sims, &format!("{decider:?}")).await;
        let before = snapshot(&p, &targets).await;
        for (endpoint, form) in decisions(&targets) {
            for who in [Who::Anonymous, Who::Agent, Who::Viewer] {
                let (status, _) = p.form(who, endpoint, &pairs(&form)).await;
                matrix.record(&format!("POST /api/{endpoint}"), who, status);
                let expected = if who == Who::Viewer { 403 } else { 401 };
                assert_eq!(status, expected, "{endpoint} as {who:?}");
            }
            // A signed-in approver's browser, on another site's page.
            for origin in ["https://evil.example", "null"] {
                let response = p
                    .request(decider, "POST", &format!("/api/{endpoint}"))
                    .header("origin", origin)
                    .header("accept", "text/html")
                    .form(&pairs(&form))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 403, "{endpoint} from {origin}");
            }
        }
        assert_eq!(
            snapshot(&p, &targets).await,
            before,
            "a refused decision changed something"
        );
        assert_eq!(
            sims.smtp.ledger().of("email.received").len(),
            mailbox_before
        );

        // Now the person decides, from the dashboard's own page.
        let base = p.base.clone();
        let decide = |endpoint: &'static str, form: Vec<(&'static str, String)>| {
            let p = &p;
            let base = base.clone();
            async move {
                let response = p
                    .request(decider, "POST", &format!("/api/{endpoint}"))
                    .header("origin", &base)
                    .header("accept", "text/html")
                    .form(&pairs(&form))
                    .send()
                    .await
                    .unwrap();
                let status = response.status().as_u16();
                let location = response.headers()["location"].to_str().unwrap().to_owned();
                // What the page it leads to will say.
                let said = common::process::flash(p.client(decider), &base).await;
                (status, format!("{location} {said}"))
            }
        };
        let forms = decisions(&targets);
        let form_of = |name: &str| forms.iter().find(|(e, _)| *e == name).unwrap().1.clone();
        let mut allowed = |endpoint: &str, (status, location): (u16, String)| {
            matrix.record(&format!("POST /api/{endpoint}"), decider, status);
            assert_eq!(status, 302, "{endpoint} as {decider:?}");
            assert!(!location.contains("login"), "{endpoint}: {location}");
            location
        };
        let location = allowed(
            "decide_pivot",
            decide("decide_pivot", form_of("decide_pivot")).await,
        );
        assert!(!location.contains("error="), "{location}");
        // The email the held step sends is handed over, then the line drops:
        // its outcome is unknown and a person is asked.
        sims.smtp.drop_after_data(1);
        allowed(
            "decide_step",
            decide("decide_step", form_of("decide_step")).await,
        );
        let held = p.agent_get(&format!("/runs/{}", targets.held_run)).await;
        assert_eq!(held["run"]["status"], "NEEDS_ATTENTION", "{held}");
        for who in [Who::Anonymous, Who::Agent, Who::Viewer] {
            let (status, _) = p
                .form(who, "answer_question", &pairs(&form_of("answer_question")))
                .await;
            assert_eq!(status, if who == Who::Viewer { 403 } else { 401 });
        }
        // The answer names the question it answers: the step as the
        // person read it.
        let mut answer = form_of("answer_question");
        for (field, value) in answer.iter_mut() {
            if *field == "asked" {
                *value = held["steps"][0]["updated_at"].as_str().unwrap().to_owned();
            }
        }
        let location = allowed("answer_question", decide("answer_question", answer).await);
        assert!(!location.contains("error="), "{location}");
        // Nothing to answer about a compensation: allowed, refused by state.
        let location = allowed(
            "answer_compensation",
            decide("answer_compensation", form_of("answer_compensation")).await,
        );
        assert!(location.contains("error="), "{location}");
        allowed(
            "unwind_run",
            decide("unwind_run", form_of("unwind_run")).await,
        );
        // The correction's email is handed over and the line drops: SMTP
        // has no lookup, so only a person can say it went out.
        sims.smtp.drop_after_data(1);
        let location = allowed(
            "send_correction",
            decide("send_correction", form_of("send_correction")).await,
        );
        assert!(location.contains("its send is unknown"), "{location}");
        let location = allowed(
            "answer_correction_send",
            decide("answer_correction_send", form_of("answer_correction_send")).await,
        );
        assert!(!location.contains("error="), "{location}");
        allowed(
            "dismiss_correction",
            decide("dismiss_correction", form_of("dismiss_correction")).await,
        );
        let after = snapshot(&p, &targets).await;
        assert_eq!(after["pivot"], "COMPLETED", "{after}");
        assert_eq!(after["held"][0]["status"], "CONFIRMED", "{after}");
        assert_eq!(after["unwind"], "UNWOUND", "{after}");
        // Both corrections left the inbox: one sent (by a person's word),
        // one dismissed.
        assert_eq!(after["corrections"], json!([]), "{after}");
        // The held email and one correction went out; nothing else did.
        mailbox_before += 2;
        assert_eq!(
            sims.smtp.ledger().of("email.received").len(),
            mailbox_before
        );
        // The audit trail names the person, never an agent, for each decision.
        let (_, audit) = p
            .read(decider, "audit_trail", &[("everything", "false")])
            .await;
        let name = if decider == Who::Approver {
            "lead"
        } else {
            "root"
        };
        assert!(
            audit["lines"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l["actor"] == name),
            "{audit}"
        );
        assert!(
            audit["lines"]
                .as_array()
                .unwrap()
                .iter()
                .all(|l| !l["actor"].as_str().unwrap_or_default().contains(AGENT)),
            "{audit}"
        );
    }
    // A token planted as the session cookie is no session.
    let planted = reqwest::Client::new()
        .post(format!("{}/api/runs", p.base))
        .header("cookie", format!("saga_session={}", p.token))
        .header("accept", "application/json")
        .form(&[("page", "1")])
        .send()
        .await
        .unwrap();
    assert_eq!(planted.status(), 401);
    matrix.print();

    // --- Secrets: hashed at rest, absent from the log. ---
    harness.kill();
    let log = harness.log_text();
    assert!(log.contains("DEBUG"), "the log was not at debug level");
    let mut secrets: Vec<(String, String)> = vec![
        ("the agent token".into(), token.clone()),
        ("the other agent token".into(), other_token.clone()),
        ("the password".into(), PASSWORD.into()),
    ];
    for (name, value) in CREDENTIALS {
        if name.ends_with("_EMAIL") {
            continue;
        }
        secrets.push((name.to_string(), value.to_string()));
        // As HTTP Basic would carry it.
        let basic = base64(&format!("agent@example.com:{value}"));
        secrets.push((format!("{name} in a Basic header"), basic));
        let basic = base64(&format!("agent@example.com/token:{value}"));
        secrets.push((format!("{name} in a Basic header"), basic));
    }
    for (what, secret) in &secrets {
        assert!(!log.contains(secret.as_str()), "{what} appears in the log");
    }
    if let Some(password) = db_password(&db.url) {
        assert!(
            !log.contains(&format!(":{password}@")),
            "the database password appears in the log"
        );
    }
    eprintln!(
        "authorisation: {} log lines at debug level checked for {} secrets",
        log.lines().count(),
        secrets.len()
    );
    let at_rest = database_bytes(&db.url).await;
    for (what, secret) in secrets.iter().take(3) {
        assert!(
            !contains(&at_rest, secret.as_bytes()),
            "{what} is stored in the clear"
        );
    }
    assert!(contains(
        &at_rest,
        saga_harness::auth::token_hash(&token).as_bytes()
    ));
    assert!(
        contains(&at_rest, b"$argon2id$"),
        "passwords are not Argon2id hashes"
    );
}

fn db_password(url: &str) -> Option<String> {
    let credentials = url.split("://").nth(1)?.split('@').next()?;
    credentials.split_once(':').map(|(_, p)| p.to_owned())
}

fn contains(haystack: &[Vec<u8>], needle: &[u8]) -> bool {
    haystack
        .iter()
        .any(|value| value.windows(needle.len()).any(|w| w == needle))
}

/// Every value of every column of every table, as bytes.
async fn database_bytes(url: &str) -> Vec<Vec<u8>> {
    use sqlx::{Connection, Row};
    let mut values = Vec::new();
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        for table in tables {
            let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info(?)")
                .bind(&table)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            for column in columns {
                let rows = sqlx::query(&format!(
                    "SELECT CAST(\"{column}\" AS BLOB) FROM \"{table}\""
                ))
                .fetch_all(&mut conn)
                .await
                .unwrap();
                values.extend(rows.iter().filter_map(|r| r.get::<Option<Vec<u8>>, _>(0)));
            }
        }
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        let tables: Vec<(String, String)> = sqlx::query_as(
            "SELECT table_schema::text, table_name::text FROM information_schema.tables
             WHERE table_schema NOT IN ('pg_catalog', 'information_schema') AND table_type = 'BASE TABLE'",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        for (schema, table) in tables {
            let rows = sqlx::query(&format!("SELECT t::text FROM \"{schema}\".\"{table}\" t"))
                .fetch_all(&mut conn)
                .await
                .unwrap();
            values.extend(rows.iter().map(|r| r.get::<String, _>(0).into_bytes()));
        }
    }
    assert!(!values.is_empty());
    values
}

fn base64(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn sqlite_every_route_and_action_for_every_principal() {
    the_matrix(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_every_route_and_action_for_every_principal() {
    let db = crate::common::postgres_or_skip!();
    the_matrix(db).await;
}

#[tokio::test]
async fn the_session_cookie_is_http_only_same_site_and_secure_behind_tls() {
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("lead", "approver")]).await;
    for secure in [false, true] {
        let launch = Launch::new(&db.url, None).env("SAGA_SECURE_COOKIES", &secure.to_string());
        let harness = TestProcess::start(&launch).await;
        let response = Dashboard::new()
            .post(
                &harness.base,
                "login",
                &[("username", "lead"), ("password", PASSWORD)],
            )
            .await
            .unwrap();
        assert_eq!(response.headers()["location"], "/");
        let cookie = response.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .to_owned();
        let name = if secure {
            "__Host-saga_session="
        } else {
            "saga_session="
        };
        assert!(cookie.starts_with(name), "{cookie}");
        assert!(cookie.contains("HttpOnly"), "{cookie}");
        assert!(cookie.contains("SameSite=Lax"), "{cookie}");
        assert_eq!(cookie.contains("Secure"), secure, "{cookie}");
        drop(harness);
    }
}
