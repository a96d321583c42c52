//! `saga-harness eval`: a team's own agent against the simulators, under
//! the incident's faults, scored from what the systems' ledgers and the
//! saga log say happened.
//!
//! For each scenario: fresh simulators on free loopback ports with the
//! scenario's faults armed, a harness (this binary's `serve`) on a fresh
//! SQLite file with the shipped tools file pointed at them, an agent token,
//! a lead signed in to the dashboard, and the agent command, given only
//! `SAGA_API_URL`, `SAGA_TOKEN`, `SAGA_MCP_URL`, `SAGA_RUN_LABEL`,
//! `SAGA_TASK` and `SAGA_SCENARIO`.

mod person;
mod processes;
mod report;
pub mod scenario;
mod score;

use crate::auth;
use crate::config::EvalArgs;
use crate::saga::class::Role;
use crate::sim::bundle::{use_simulated_credentials, Simulators};
use crate::sim::FaultRule;
use anyhow::{anyhow, bail, Context};
use scenario::{Decision, Scenario};
use score::{Card, Log};
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// The agent every scenario's token is issued to.
const AGENT: &str = "eval-agent";
/// The lead who decides in the dashboard.
const LEAD: &str = "eval-lead";

pub async fn run(args: EvalArgs) -> anyhow::Result<()> {
    let text = match &args.scenarios {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the scenario file {}", path.display()))?,
        None => scenario::BUILT_IN.to_owned(),
    };
    let mut scenarios = scenario::read(&text).map_err(|mistakes| anyhow!(mistakes.join("\n")))?;
    if let Some(only) = &args.only {
        let wanted: Vec<&str> = only
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        for name in &wanted {
            if !scenarios.iter().any(|s| s.name == *name) {
                bail!(
                    "--only names {name:?}, which the scenario file does not have; it has {}",
                    scenarios
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        scenarios.retain(|s| wanted.contains(&s.name.as_str()));
    }
    if let Some(limit) = args.timeout_s {
        if limit == 0 {
            bail!("--timeout-s must be at least 1");
        }
        for scenario in &mut scenarios {
            scenario.timeout_s = limit;
        }
    }
    if args.agent.trim().is_empty() {
        bail!("--agent is empty: give the command that runs your agent");
    }
    use_simulated_credentials();
    let work = match &args.keep {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("saga-eval-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    let mut cards = Vec::new();
    let total = scenarios.len();
    for (i, scenario) in scenarios.iter().enumerate() {
        eprint!("[{}/{total}] {} … ", i + 1, scenario.name);
        let _ = std::io::stderr().flush();
        let dir = work.join(&scenario.name);
        let card = match play(scenario, &args.agent, &dir).await {
            Ok(card) => card,
            Err(err) => {
                let why = format!("{err:#}");
                eprintln!("could not run: {why}");
                bail!("scenario {} could not be run: {why}", scenario.name);
            }
        };
        eprintln!(
            "{} in {:.1} s",
            if card.passed { "pass" } else { "FAIL" },
            card.seconds
        );
        cards.push(card);
    }
    if args.keep.is_none() {
        let _ = std::fs::remove_dir_all(&work);
    }

    print!("{}", report::table(&cards));
    if let Some(path) = &args.junit {
        std::fs::write(path, report::junit(&cards))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&cards)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let failed = cards.iter().filter(|c| !c.passed).count();
    if failed > 0 {
        bail!("{failed} of {} scenarios failed", cards.len());
    }
    Ok(())
}

/// One scenario, start to scorecard.
async fn play(scenario: &Scenario, agent: &str, dir: &Path) -> anyhow::Result<Card> {
    let started = Instant::now();
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    let sims = Simulators::start(std::net::Ipv4Addr::LOCALHOST.into(), 0)
        .await
        .context("starting the simulators")?;
    arm(scenario, &sims);
    let tools = dir.join("tools.toml");
    std::fs::write(&tools, tools_file(scenario, &sims)?)?;
    let database = dir.join("saga.db");
    let database_url = format!("sqlite://{}", database.display());
    let (token, password) = accounts(&database_url).await?;

    let launch = processes::HarnessLaunch {
        port: processes::free_port()?,
        database_url: database_url.clone(),
        tools,
        log: dir.join("harness.log"),
    };
    let site = launch.site();
    let first = launch.start(scenario.restarts.first().copied()).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let keeper = tokio::spawn(keep_harness(
        launch.clone(),
        first,
        scenario.restarts.iter().skip(1).copied().collect(),
        scenario.restarts.len() as u32,
        stopped.clone(),
    ));
    let label = format!("eval-{}", scenario.name);
    let lead = person::Lead::new(&site, LEAD, &password, scenario.person.clone());
    let watching = tokio::spawn(lead.watch(label.clone(), stopped));

    let env = [
        ("SAGA_API_URL", format!("{site}/api/v1")),
        ("SAGA_TOKEN", token),
        ("SAGA_MCP_URL", format!("{site}/mcp/runs/{label}")),
        ("SAGA_RUN_LABEL", label.clone()),
        ("SAGA_TASK", scenario.task.trim().to_owned()),
        ("SAGA_SCENARIO", scenario.name.clone()),
    ];
    let end = processes::run_agent(
        agent,
        &env,
        Duration::from_secs(scenario.timeout_s),
        &dir.join("agent.stdout"),
        &dir.join("agent.stderr"),
    )
    .await;

    // What the harness settles by itself once the agent is gone (a commit
    // rolling forward, an unknown reconciled) counts for it.
    let checker = person::Lead::new(&site, LEAD, &password, scenario.person.clone());
    checker.wait_settled(&label, Duration::from_secs(20)).await;
    let _ = stop.send(true);
    let lead_acts = watching.await.unwrap_or_default();
    let restarts = keeper
        .await
        .map_err(|e| anyhow!("the harness keeper failed: {e}"))??;

    let log = read_log(&database_url).await?;
    let effects = sims.effects();
    std::fs::write(
        dir.join("ledger.json"),
        serde_json::to_string_pretty(&effects)?,
    )?;
    Ok(score::score(
        scenario,
        &effects,
        &log,
        end,
        lead_acts,
        restarts,
        started.elapsed().as_secs_f64(),
    ))
}

/// Arms the scenario's faults and search lag in the simulators.
fn arm(scenario: &Scenario, sims: &Simulators) {
    for fault in &scenario.faults {
        let sim = match fault.system.as_str() {
            "stripe" => &sims.stripe,
            "jira" => &sims.jira,
            "zendesk" => &sims.zendesk,
            "slack" => &sims.slack,
            "orders" => &sims.orders,
            "warehouse" => &sims.warehouse,
            // Only one fault is valid for SMTP (checked when read).
            _ => {
                sims.smtp.drop_after_data(fault.times);
                continue;
            }
        };
        let mut rule =
            FaultRule::new(&fault.method, &fault.path, fault.fault.clone()).times(fault.times);
        rule.skip = fault.occurrence - 1;
        rule.exact = true;
        sim.state.faults.inject(rule);
    }
    for (system, ms) in &scenario.search_lag_ms {
        let lag = Duration::from_millis(*ms);
        match system.as_str() {
            "stripe" => sims.stripe.state.faults.set_search_lag(lag),
            _ => sims.jira.state.faults.set_search_lag(lag),
        }
    }
}

/// The shipped tools file pointed at these simulators, with the approval
/// deadline the scenario's person needs.
fn tools_file(scenario: &Scenario, sims: &Simulators) -> anyhow::Result<String> {
    let pointed = sims
        .point(crate::demo::SUPPORT_TOOLS)
        .map_err(|e| anyhow!(e))?;
    let expires =
        scenario.person.pivot == Decision::Expire || scenario.person.held == Decision::Expire;
    let Some(seconds) = scenario.person.deadline_s.or(expires.then_some(5)) else {
        return Ok(pointed);
    };
    let mut file: toml::Table = toml::from_str(&pointed)?;
    let approvals = file
        .entry("approvals")
        .or_insert_with(|| toml::Value::Table(Default::default()));
    if let Some(table) = approvals.as_table_mut() {
        table.insert(
            "deadline".into(),
            toml::Value::String(format!("{seconds}s")),
        );
        table.remove("escalate_after");
    }
    Ok(toml::to_string(&file)?)
}

/// The agent's token and the lead's password, written before the harness
/// starts (a SQLite saga log has one process at a time).
async fn accounts(database_url: &str) -> anyhow::Result<(String, String)> {
    let opened = crate::store::open_with(database_url, &Default::default()).await?;
    let store = opened.saga_store();
    let password = auth::new_password();
    store
        .add_user(LEAD, &auth::hash_password(&password)?, Role::Approver)
        .await?;
    let token = auth::new_api_token();
    store
        .add_api_token(AGENT, &auth::token_hash(&token), Some("eval"))
        .await?;
    drop(store);
    drop(opened);
    Ok((token, password))
}

/// Keeps the harness up: each time it dies at its failpoint, starts it
/// again on the same database (armed for the next restart, if any); stops
/// it when told. Returns how many times it was started again.
async fn keep_harness(
    launch: processes::HarnessLaunch,
    mut child: tokio::process::Child,
    mut later: std::collections::VecDeque<u32>,
    mut crashes_left: u32,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<u32> {
    let mut restarted = 0;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status?;
                if crashes_left == 0 {
                    bail!("the harness exited by itself ({status}); its log is {}", launch.log.display());
                }
                crashes_left -= 1;
                restarted += 1;
                child = launch.start(later.pop_front()).await?;
            }
            _ = stop.changed() => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Ok(restarted);
            }
        }
    }
}

/// Everything the saga log holds, read once the harness has stopped.
async fn read_log(database_url: &str) -> anyhow::Result<Log> {
    let opened = crate::store::open_with(database_url, &Default::default()).await?;
    let store = opened.saga_store();
    let mut runs = Vec::new();
    let mut events = Vec::new();
    let mut corrections = Vec::new();
    for run in store.list_runs(1_000).await? {
        let steps = store.steps(run.id).await?;
        events.extend(store.events(Some(run.id), 100_000).await?);
        corrections.extend(store.corrections(run.id).await?);
        runs.push((run, steps));
    }
    Ok(Log {
        runs,
        events,
        corrections,
    })
}
