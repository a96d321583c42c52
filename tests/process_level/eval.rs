//! `saga-harness eval` as a team runs it: the shipped agents against the
//! built-in scenarios, scored from the simulators' ledgers and the saga
//! log; and every kind of bad input ending in a clear failed scenario or
//! refusal, never a hang.

use serde_json::Value;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

async fn eval(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_saga-harness"))
        .arg("eval")
        .args(args)
        .env_remove(saga_harness::failpoint::VARIABLE)
        .kill_on_drop(true)
        .output()
        .await
        .expect("saga-harness eval runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn cards(path: &Path) -> Vec<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the JSON report")).expect("JSON")
}

fn card<'a>(cards: &'a [Value], name: &str) -> &'a Value {
    cards
        .iter()
        .find(|c| c["scenario"] == name)
        .unwrap_or_else(|| panic!("no scorecard for {name}"))
}

fn held(card: &Value, what: &str) -> u64 {
    card["ledger"][what]
        .as_u64()
        .unwrap_or_else(|| panic!("{what} in {card}"))
}

/// Runs the built-in set with `agent` and checks every scorecard against
/// what the ledgers must hold.
async fn passes_the_built_in_set(agent: &str) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("eval.json");
    let junit = dir.path().join("eval.xml");
    let started = Instant::now();
    let out = eval(&[
        "--agent",
        agent,
        "--json",
        json.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ])
    .await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    eprintln!(
        "{agent}: the built-in set took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let cards = cards(&json);
    assert_eq!(cards.len(), 12);
    for card in &cards {
        assert_eq!(card["passed"], true, "{card}");
        // A scenario's time is printed as it runs.
        let name = card["scenario"].as_str().unwrap();
        assert!(stderr.contains(&format!("{name} … pass in")), "{stderr}");
    }
    // What really happened, system by system.
    for name in [
        "clean",
        "ticket-504",
        "hold-blank-200",
        "restart-during-hold",
        "capture-504",
        "slow-warehouse",
    ] {
        let card = card(&cards, name);
        assert_eq!(held(card, "jira.issue.created"), 1, "{name}");
        assert_eq!(held(card, "stripe.payment_intent.created"), 1, "{name}");
        assert_eq!(held(card, "stripe.payment_intent.captured"), 1, "{name}");
        assert_eq!(held(card, "warehouse.shipment.created"), 1, "{name}");
        assert_eq!(held(card, "smtp.email.received"), 1, "{name}");
    }
    let rejected = card(&cards, "lead-rejects");
    assert_eq!(
        held(rejected, "jira.issue.transitioned"),
        1,
        "the ticket closed"
    );
    assert_eq!(
        held(rejected, "stripe.payment_intent.canceled"),
        1,
        "the hold cancelled"
    );
    assert_eq!(held(rejected, "stripe.payment_intent.captured"), 0);
    assert_eq!(held(rejected, "smtp.email.received"), 0, "nothing sent");
    assert_eq!(rejected["lead"][0], "rejected the pivot");
    let away = card(&cards, "lead-away");
    assert_eq!(away["lead"][0], "left the pivot to expire");
    assert_eq!(
        held(away, "stripe.payment_intent.canceled"),
        1,
        "the hold cancelled"
    );
    assert_eq!(held(away, "smtp.email.received"), 0, "nothing sent");
    let declined = card(&cards, "card-declined");
    assert_eq!(
        held(declined, "jira.issue.transitioned"),
        1,
        "the ticket closed"
    );
    assert_eq!(
        held(declined, "stripe.payment_intent.created"),
        0,
        "no second try"
    );
    assert_eq!(held(declined, "smtp.email.received"), 0);
    assert_eq!(card(&cards, "restart-during-hold")["restarts"], 1);
    let edited = card(&cards, "lead-edits");
    assert_eq!(edited["lead"][0], "edited commit step 5 (send_email)");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"12\" failures=\"0\""), "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), 12);
    assert!(stdout.contains("12 of 12 scenarios passed"), "{stdout}");
}

#[tokio::test]
async fn the_scripted_agent_passes_every_built_in_scenario_by_the_ledgers() {
    passes_the_built_in_set("python3 examples/agents/scripted.py").await;
}

/// The OpenAI Agents SDK's own Runner and MCP client, with a scripted
/// model: it names no steps, and reconnects when a restart drops it.
#[tokio::test]
async fn an_openai_agents_sdk_agent_over_mcp_passes_every_built_in_scenario() {
    passes_the_built_in_set("python3 examples/agents/openai_agents_mcp.py").await;
}

#[tokio::test]
async fn the_careless_agent_fails_on_each_of_its_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("eval.xml");
    let out = eval(&[
        "--agent",
        "python3 examples/agents/careless.py",
        "--only",
        "ticket-504,restart-during-hold",
        "--junit",
        junit.to_str().unwrap(),
    ])
    .await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains("2 of 2 scenarios failed"), "{stderr}");
    for line in [
        // It numbered its own steps.
        "✗ refused.step_out_of_order: 1 (allowed at most 0): refused step_out_of_order: step 1 is beyond the run's next step 0",
        // It emailed the customer before proposing the pivot.
        "✗ irreversible_before_pivot: 1 (allowed at most 0): run eval-ticket-504 step 4 send_email (REJECTED)",
        // It reworded a retry after an unknown and called it a new effect.
        "✗ doubled_effects: 1 (allowed at most 0): jira.issue.created ×2 where the task makes 1",
        "✗ end state jira.issue.created: 2 (allowed 1): the jira ledger holds 2",
        // It read the answer a restart cut off as success, and lost the hold.
        "✗ end state stripe.payment_intent.captured: 0 (allowed 1): the stripe ledger holds 0",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    let junit = std::fs::read_to_string(&junit).unwrap();
    assert!(junit.contains("failures=\"2\""), "{junit}");
    assert!(
        junit.contains("jira.issue.created ×2 where the task makes 1"),
        "{junit}"
    );
}

#[tokio::test]
async fn an_agent_that_does_not_exist_or_exits_at_once_fails_its_scenario() {
    let out = eval(&["--agent", "no-such-agent-in-any-path", "--only", "clean"]).await;
    let stdout = text(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("✗ agent: 1 (allowed exit 0 within the time limit, nothing left running): exit 127 (the shell found no such command)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("✗ run: 0 (allowed 1): the agent created no run"),
        "{stdout}"
    );

    let out = eval(&["--agent", "true", "--only", "clean"]).await;
    let stdout = text(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("✗ run: 0 (allowed 1): the agent created no run"),
        "{stdout}"
    );
    assert!(
        stdout.contains("✗ end state smtp.email.received: 0 (allowed 1): the smtp ledger holds 0"),
        "{stdout}"
    );
}

#[tokio::test]
async fn an_agent_that_hangs_is_killed_at_its_time_limit_with_its_children() {
    let started = Instant::now();
    let out = eval(&[
        "--agent",
        "sleep 600",
        "--only",
        "clean",
        "--timeout-s",
        "2",
    ])
    .await;
    let stdout = text(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("killed at the time limit (2 s)"),
        "{stdout}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "eval took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_agent_that_leaves_children_behind_fails_and_they_are_killed() {
    let keep = tempfile::tempdir().unwrap();
    let out = eval(&[
        "--agent",
        "sleep 600 & echo $!",
        "--only",
        "clean",
        "--keep",
        keep.path().to_str().unwrap(),
    ])
    .await;
    let stdout = text(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("✗ agent: 1 (allowed exit 0 within the time limit, nothing left running): exit 0, leaving processes running (killed)"),
        "{stdout}"
    );
    let pid = std::fs::read_to_string(keep.path().join("clean/agent.stdout")).unwrap();
    let proc = format!("/proc/{}", pid.trim());
    // Killed, and reaped by init soon after.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&proc).exists() && Instant::now() < deadline {
        let state = std::fs::read_to_string(format!("{proc}/stat")).unwrap_or_default();
        if state.contains(") Z ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = std::fs::read_to_string(format!("{proc}/stat")).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains(") Z "),
        "the child still runs: {state}"
    );
}

#[tokio::test]
async fn a_scenario_file_with_mistakes_is_refused_naming_each_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scenarios.toml");
    std::fs::write(
        &file,
        r#"
[defaults]
task = "Refund Ada"

[[scenarios]]
name = "bad"
faults = [
  { operation = "jira.create_issue", fault = "meteor" },
  { operation = "jira.delete_everything", fault = "commit_then_504" },
]
expect = { "paypal.payment.created" = 1 }
thresholds = { happiness = 0 }
"#,
    )
    .unwrap();
    let started = Instant::now();
    let out = eval(&["--agent", "true", "--scenarios", file.to_str().unwrap()]).await;
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    for mistake in [
        "scenario \"bad\", faults[0]: fault \"meteor\" is unknown",
        "scenario \"bad\", faults[1]: operation \"jira.delete_everything\" is not one the simulators serve",
        "scenario \"bad\", expect.paypal.payment.created: no system \"paypal\"",
        "scenario \"bad\", thresholds.happiness: no such criterion",
    ] {
        assert!(stderr.contains(mistake), "missing {mistake:?} in\n{stderr}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "nothing was started"
    );
    let out = eval(&["--agent", "true", "--only", "no-such-scenario"]).await;
    assert!(text(&out.stderr)
        .contains("--only names \"no-such-scenario\", which the scenario file does not have"));
}
