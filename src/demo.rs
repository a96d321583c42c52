//! `saga-harness demo`: the whole story in one command. It starts the
//! simulators and the server on a fresh SQLite file, creates an admin login
//! and an agent token, and drives a scripted agent through the HTTP API the
//! way a real model behaves — it retries at once after errors, rewords its
//! arguments on every retry, and takes an empty answer for success. What it
//! leaves behind is what a support lead meets on a normal morning:
//!
//! - the seed's incident unwound: one Jira ticket closed, one charge
//!   refunded, no apology sent; and the same again by the agent's twin
//!   that speaks MCP (through `/mcp`, no step numbers);
//! - a refund-and-reship run waiting at its pivot;
//! - a run whose customer email went out and was then unwound, its
//!   correction waiting for sign-off;
//! - a run in NEEDS_ATTENTION: an email whose connection dropped after the
//!   message was handed over, which no system can confirm.

use crate::auth;
use crate::config::{DatabaseArgs, DemoArgs, ServeArgs};
use crate::connectors::wire::{Timeouts, Wire};
use crate::connectors::ConnectorSet;
use crate::saga::class::Role;
use crate::saga::model::{Actor, Via};
use crate::saga::registry::Registry;
use crate::server::Application;
use crate::sim::bundle::{use_simulated_credentials, Simulators};
use crate::sim::{Fault, FaultRule};
use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use std::time::Duration;

/// The support tools file shipped with the project, pointed at the demo's
/// simulators at start.
pub const SUPPORT_TOOLS: &str = include_str!("../tools/support.toml");

/// The run labels the demo leaves, so anyone (and the tests) can find them
/// again through the API: `POST /api/v1/runs` with the same label returns
/// the run.
pub const INCIDENT: &str = "demo-incident-kettle";
pub const INCIDENT_OVER_MCP: &str = "demo-incident-kettle-mcp";
pub const AT_PIVOT: &str = "demo-reship-lamp";
/// The lead's Slack user in the simulated workspace.
pub const DEMO_LEAD_IN_SLACK: &str = "U0LEAD0001";

/// The demo asks for approvals in the Slack simulator too.
const SLACK_APPROVALS: &str = r##"
[approvals.slack]
channel = "#support"
signing_secret_env = "SLACK_SIGNING_SECRET"

[approvals.slack.users]
U0ADMIN001 = "admin"
U0LEAD0001 = "lead"
U0VIEW0001 = "viewer"
"##;
pub const CORRECTION: &str = "demo-email-correction";
pub const ATTENTION: &str = "demo-needs-attention";

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    use_simulated_credentials();
    let sims = Simulators::start(args.sim_ip, args.first_port)
        .await
        .context("starting the simulators (pick other ports with --first-port)")?;
    let tools = sims.point(SUPPORT_TOOLS).map_err(|e| anyhow!(e))?;
    let registry = Registry::from_toml(&format!("{tools}\n{SLACK_APPROVALS}"))?;
    let connectors = ConnectorSet::from_settings(
        registry.connector_settings(),
        &Wire::new(&Timeouts::default()),
    )
    .map_err(|mistakes| anyhow!(mistakes.join("\n")))?;

    fresh_database(&args.database)?;
    let serve = ServeArgs {
        bind: args.bind,
        database: DatabaseArgs {
            database_url: format!("sqlite://{}", args.database.display()),
            store: Default::default(),
        },
        tools: None,
        secure_cookies: None,
        public_url: None,
        limits: Default::default(),
        operations: Default::default(),
        sign_in: args.sign_in.clone(),
    };
    let app = Application::build_from(serve, registry, connectors).await?;
    let state = app.state().clone();
    // Scripts and the browser tests may fix the password and the token.
    let password = std::env::var("SAGA_DEMO_PASSWORD").unwrap_or_else(|_| auth::new_password());
    let hash = auth::hash_password(&password)?;
    for (name, role) in [
        ("admin", Role::Admin),
        ("lead", Role::Approver),
        ("viewer", Role::Viewer),
    ] {
        state.store.add_user(name, &hash, role).await?;
    }
    let token = std::env::var("SAGA_DEMO_TOKEN").unwrap_or_else(|_| auth::new_api_token());
    state
        .store
        .add_api_token("demo-agent", &auth::token_hash(&token), Some("demo"))
        .await?;
    let site = format!("http://{}", app.local_addr());
    let slack = sims.slack.base_url();
    reqwest::Client::new()
        .post(format!("{slack}/_sim/slack/app"))
        .json(&json!({
            "request_url": format!("{site}/slack/interactions"),
            "signing_secret": std::env::var("SLACK_SIGNING_SECRET")?,
        }))
        .send()
        .await?
        .error_for_status()
        .context("pointing the Slack simulator's buttons at the harness")?;
    let server = tokio::spawn(app.serve(async {
        let _ = tokio::signal::ctrl_c().await;
    }));

    let agent = ScriptedAgent::new(&format!("{site}/api/v1"), &token);
    let people = People {
        engine: state.engine.clone(),
    };
    let runs = stage(&agent, &people, &sims).await?;

    println!("saga-harness demo is serving at {site}");
    println!(
        "  dashboard: {site}/  sign in as admin, lead (approver) or viewer, password {password}"
    );
    println!("  agent API: {site}/api/v1  token {token}");
    println!(
        "  MCP:       {site}/mcp/runs/<label>  (or {site}/mcp with the header X-Saga-Run: <label>)"
    );
    println!("  an MCP client's configuration (the run is named in the URL):");
    println!(
        r#"    {{ "mcpServers": {{ "support": {{ "url": "{site}/mcp/runs/my-first-case", "headers": {{ "Authorization": "Bearer {token}" }} }} }} }}"#
    );
    for (label, run) in &runs {
        println!("  run {label:<24} {run}");
    }
    for (name, url) in sims.addresses() {
        println!("  simulator {name:<10} {url}");
    }
    println!(
        "  Slack:     waiting approvals are posted to #support on the Slack simulator ({slack});"
    );
    println!(
        "             press a button as the lead: curl -s {slack}/_sim/slack/press -H 'content-type: application/json' -d '{{\"saga_key\": \"KEY\", \"action_id\": \"saga_approve\", \"user_id\": \"{DEMO_LEAD_IN_SLACK}\"}}'"
    );
    println!("             (each message's KEY is in {slack}/_sim/ledger)");
    println!("stop with Ctrl-C");
    server.await??;
    Ok(())
}

/// The demo always starts from an empty log: it removes the file it owns.
fn fresh_database(path: &std::path::Path) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let file = std::path::PathBuf::from(format!("{}{suffix}", path.display()));
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!(
                "removing the previous demo database {}: {e}",
                file.display()
            ),
        }
    }
    Ok(())
}

/// What the demo's support lead does in the dashboard, done in-process:
/// approving a pivot and unwinding a run after it.
struct People {
    engine: std::sync::Arc<crate::saga::engine::Engine>,
}

impl People {
    async fn approve(&self, pivot: &Value) -> anyhow::Result<()> {
        let id = pivot["approval_id"]
            .as_i64()
            .ok_or_else(|| anyhow!("the pivot answer has no approval_id: {pivot}"))?;
        let digest = pivot["digest"].as_str().unwrap_or_default();
        self.engine
            .decide_pivot(
                id,
                digest,
                true,
                &Actor::User("admin".into()),
                Via::Dashboard,
            )
            .await?;
        Ok(())
    }

    async fn unwind(&self, run: &str, reason: &str) -> anyhow::Result<()> {
        self.engine
            .unwind(run.parse()?, &Actor::User("admin".into()), reason)
            .await?;
        Ok(())
    }
}

/// Drives the four stories; returns each run's label and id.
async fn stage(
    agent: &ScriptedAgent,
    people: &People,
    sims: &Simulators,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut runs = Vec::new();

    // 1. The seed's incident: a ticket whose creation timed out at the
    //    gateway, a charge answered by a blank page, a replacement the
    //    warehouse refuses, and the agent unwinding; then the same again
    //    by an agent that speaks MCP.
    let run = agent
        .start_run(INCIDENT, "Ada's kettle arrived broken: replace it")
        .await?;
    seed_incident(&ApiRun { agent, run: &run }, sims).await?;
    runs.push((INCIDENT, run));
    let twin = McpRun::connect(&agent.site(), &agent.token, INCIDENT_OVER_MCP).await?;
    seed_incident(&twin, sims).await?;
    runs.push((INCIDENT_OVER_MCP, twin.run_id().await?));
    twin.close().await;

    // 2. Refund and reship, staged and waiting for a person at the pivot.
    let run = agent
        .start_run(AT_PIVOT, "Grace's lamp was lost in transit")
        .await?;
    agent
        .read("search_orders", &run, json!({"customer": "cus_grace"}))
        .await?;
    agent
        .read("lookup_policy", &run, json!({"topic": "reshipping"}))
        .await?;
    agent
        .act(&run, "create_ticket_draft", json!({"subject": "Lost desk lamp (ord_1002)", "body": "Parcel lost in transit; reship and refund the shipping fee."}))
        .await?;
    agent
        .act(&run, "create_email_draft", json!({"to": "grace@example.com", "subject": "Your replacement lamp", "body": "Your lamp was lost on the way; a new one ships today and we refunded the shipping fee."}))
        .await?;
    let charge = agent
        .act(&run, "authorize_payment", json!({"customer": "cus_grace", "amount": 3200, "currency": "usd", "description": "Hold for the replacement lamp"}))
        .await?;
    let hold_key = charge["key"].as_str().unwrap_or_default().to_owned();
    agent
        .pivot(&run, "Reship Grace's lamp, capture the hold, refund the shipping fee and tell her", json!([
            {"tool": "reship", "args": {"order_id": "ord_1002", "items": ["LAMP-7"], "email": "grace@example.com"}},
            {"tool": "capture_payment", "args": {"intent_key": hold_key, "amount": 3200}},
            {"tool": "refund", "args": {"charge_key": hold_key, "amount": 500}},
            {"tool": "send_email", "args": {"to": "grace@example.com", "subject": "Your replacement lamp", "body": "A new lamp ships today; the shipping fee is refunded."}}
        ]))
        .await?;
    runs.push((AT_PIVOT, run));

    // 3. An email that went out, then the run was unwound by a person: the
    //    correction waits for sign-off.
    let run = agent
        .start_run(CORRECTION, "Tell Alan his mugs are refunded")
        .await?;
    agent
        .act(&run, "create_email_draft", json!({"to": "alan@example.com", "subject": "Your mugs", "body": "We refunded your four mugs in full."}))
        .await?;
    let pivot = agent
        .pivot(&run, "Email Alan that his mugs are refunded", json!([
            {"tool": "send_email", "args": {"to": "alan@example.com", "subject": "Your mugs are refunded", "body": "We refunded your four mugs in full."}}
        ]))
        .await?;
    people.approve(&pivot).await?;
    people
        .unwind(
            &run,
            "no refund was made for these mugs: the email promised one",
        )
        .await?;
    runs.push((CORRECTION, run));

    // 4. An email whose connection dropped after the message was handed
    //    over: SMTP has no lookup, so a person must say whether it went.
    let run = agent
        .start_run(ATTENTION, "Confirm the kettle replacement to Ada")
        .await?;
    let pivot = agent
        .pivot(&run, "Email Ada that the replacement is on its way", json!([
            {"tool": "send_email", "args": {"to": "ada@example.com", "subject": "Your replacement kettle", "body": "A new kettle is on its way."}}
        ]))
        .await?;
    sims.smtp.drop_after_data(1);
    people.approve(&pivot).await?;
    runs.push((ATTENTION, run));
    Ok(runs)
}

/// What the seed's agent does, through whichever door it uses.
trait IncidentAgent {
    async fn read(&self, tool: &str, args: Value) -> anyhow::Result<Value>;
    async fn act(&self, tool: &str, args: Value) -> anyhow::Result<Value>;
    async fn unwind(&self, reason: &str) -> anyhow::Result<Value>;
}

/// The seed's incident, with its faults arranged in the simulators: the
/// ticket's creation answered by a 504 after it was made, the charge by a
/// blank 200, the replacement refused; the agent unwinds.
async fn seed_incident(agent: &impl IncidentAgent, sims: &Simulators) -> anyhow::Result<()> {
    agent
        .read("search_orders", json!({"customer": "cus_ada"}))
        .await?;
    sims.jira.state.faults.inject(FaultRule::new(
        "POST",
        "/rest/api/3/issue",
        Fault::CommitThen504,
    ));
    agent
        .act("create_ticket", json!({"summary": "Ada's kettle arrived broken", "description": "Order ord_1001; customer asks for a replacement."}))
        .await?;
    sims.stripe.state.faults.inject(FaultRule::new(
        "POST",
        "/v1/payment_intents",
        Fault::CommitThenBlank,
    ));
    agent
        .act("charge_card", json!({"customer": "cus_ada", "amount": 900, "currency": "usd", "email": "ada@example.com", "receipt": false, "description": "Express shipping for the replacement kettle"}))
        .await?;
    sims.warehouse.state.faults.inject(FaultRule::new(
        "POST",
        "/v1/shipments",
        Fault::Reject {
            status: 422,
            message: "KETTLE-2 is out of stock".into(),
        },
    ));
    agent
        .act(
            "reship",
            json!({"order_id": "ord_1001", "items": ["KETTLE-2"], "email": "ada@example.com"}),
        )
        .await?;
    agent
        .unwind("the replacement kettle is out of stock")
        .await?;
    Ok(())
}

/// The scripted agent on one run of the agent API.
struct ApiRun<'a> {
    agent: &'a ScriptedAgent,
    run: &'a str,
}

impl IncidentAgent for ApiRun<'_> {
    async fn read(&self, tool: &str, args: Value) -> anyhow::Result<Value> {
        self.agent.read(tool, self.run, args).await
    }

    async fn act(&self, tool: &str, args: Value) -> anyhow::Result<Value> {
        self.agent.act(self.run, tool, args).await
    }

    async fn unwind(&self, reason: &str) -> anyhow::Result<Value> {
        self.agent.unwind(self.run, reason).await
    }
}

/// The scripted agent's twin that speaks MCP (the official Rust SDK's
/// client): no steps, no run ids, the run named once in its URL. Like a
/// model it calls a tool again, reworded, until the answer is final.
struct McpRun {
    client: rmcp::service::RunningService<rmcp::RoleClient, ()>,
}

impl McpRun {
    async fn connect(site: &str, token: &str, label: &str) -> anyhow::Result<McpRun> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::ServiceExt as _;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = format!("{site}/mcp/runs/{label}");
        let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).auth_header(token);
        let client =
            ().serve(StreamableHttpClientTransport::from_config(config))
                .await
                .with_context(|| format!("connecting to {url}"))?;
        Ok(McpRun { client })
    }

    async fn call(&self, tool: &str, args: Value) -> anyhow::Result<Value> {
        let Value::Object(args) = args else {
            bail!("{tool}: arguments are an object")
        };
        let answer = self
            .client
            .call_tool(
                rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(args),
            )
            .await
            .with_context(|| format!("calling {tool} over MCP"))?;
        Ok(answer.structured_content.unwrap_or(Value::Null))
    }

    async fn run_id(&self) -> anyhow::Result<String> {
        let log = self.call(crate::mcp::RUN_TOOL, json!({})).await?;
        log["run"]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("saga_run named no run: {log}"))
    }

    async fn close(self) {
        let _ = self.client.cancel().await;
    }
}

impl IncidentAgent for McpRun {
    async fn read(&self, tool: &str, args: Value) -> anyhow::Result<Value> {
        self.call(tool, args).await
    }

    async fn act(&self, tool: &str, args: Value) -> anyhow::Result<Value> {
        let mut last = Value::Null;
        for attempt in 0..3 {
            last = self.call(tool, reword(&args, attempt)).await?;
            tracing::info!(tool, attempt, outcome = %last["outcome"], "demo MCP agent call");
            if matches!(
                last["outcome"].as_str(),
                Some("confirmed" | "failed" | "rejected")
            ) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(last)
    }

    async fn unwind(&self, reason: &str) -> anyhow::Result<Value> {
        self.call(crate::mcp::UNWIND_TOOL, json!({"reason": reason}))
            .await
    }
}

/// An agent as a language model drives the API: eager, wordy, trusting.
pub struct ScriptedAgent {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl ScriptedAgent {
    pub fn new(base: &str, token: &str) -> Self {
        ScriptedAgent {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .pool_idle_timeout(crate::serving::CLIENT_POOL_IDLE)
                .build()
                .expect("a client with static settings builds"),
            base: base.to_owned(),
            token: token.to_owned(),
        }
    }

    /// The server's own address, without the API's path.
    fn site(&self) -> String {
        self.base.trim_end_matches("/api/v1").to_owned()
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        // A model takes an empty answer for success.
        let body = if text.trim().is_empty() {
            json!({"outcome": "confirmed"})
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, body))
    }

    pub async fn start_run(&self, label: &str, purpose: &str) -> anyhow::Result<String> {
        let (status, body) = self
            .post("/runs", json!({"label": label, "purpose": purpose}))
            .await?;
        match body["run"]["id"].as_str() {
            Some(id) if status < 300 => Ok(id.to_owned()),
            _ => bail!("creating run {label}: HTTP {status} {body}"),
        }
    }

    async fn new_step(&self, run: &str) -> anyhow::Result<i64> {
        let response = self
            .http
            .get(format!("{}/runs/{run}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?;
        let body: Value = response.json().await?;
        body["new_step"]
            .as_i64()
            .ok_or_else(|| anyhow!("run {run} has no new_step: {body}"))
    }

    /// A read: no step number.
    pub async fn read(&self, tool: &str, run: &str, args: Value) -> anyhow::Result<Value> {
        let (_, body) = self
            .post(
                &format!("/runs/{run}/calls"),
                json!({"tool": tool, "args": args}),
            )
            .await?;
        Ok(body)
    }

    /// A call with an effect at the run's next step. Like a model, it
    /// retries straight away when the answer is not a clean success, and
    /// words its arguments differently each time; the step number keeps
    /// the harness from doing anything twice.
    pub async fn act(&self, run: &str, tool: &str, args: Value) -> anyhow::Result<Value> {
        let step = self.new_step(run).await?;
        let mut last = Value::Null;
        for attempt in 0..3 {
            let (status, body) = self
                .post(
                    &format!("/runs/{run}/calls"),
                    json!({"tool": tool, "args": reword(&args, attempt), "step": step}),
                )
                .await?;
            tracing::info!(run, tool, step, attempt, status, outcome = %body["outcome"], "demo agent call");
            if body["outcome"] == "confirmed" {
                return Ok(body);
            }
            last = body;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(last)
    }

    pub async fn pivot(&self, run: &str, summary: &str, commit: Value) -> anyhow::Result<Value> {
        let (status, body) = self
            .post(
                &format!("/runs/{run}/pivot"),
                json!({"summary": summary, "commit": commit}),
            )
            .await?;
        if status >= 300 {
            bail!("proposing the pivot of {run}: HTTP {status} {body}");
        }
        Ok(body)
    }

    pub async fn unwind(&self, run: &str, reason: &str) -> anyhow::Result<Value> {
        let (status, body) = self
            .post(&format!("/runs/{run}/unwind"), json!({"reason": reason}))
            .await?;
        if status >= 300 {
            bail!("unwinding {run}: HTTP {status} {body}");
        }
        Ok(body)
    }
}

/// The same request in other words, as a model rephrases on a retry.
fn reword(args: &Value, attempt: usize) -> Value {
    const OPENERS: [&str; 3] = ["", "To be clear: ", "Retrying — "];
    match args {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(field, value)| {
                    let worded = matches!(
                        field.as_str(),
                        "summary" | "description" | "subject" | "body" | "text"
                    );
                    match value {
                        Value::String(text) if worded && attempt > 0 => (
                            field.clone(),
                            Value::String(format!("{}{text}", OPENERS[attempt % OPENERS.len()])),
                        ),
                        other => (field.clone(), other.clone()),
                    }
                })
                .collect(),
        ),
        other => other.clone(),
    }
}
