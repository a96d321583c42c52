//! `saga-harness demo`, as a newcomer runs it: the binary starts the
//! simulators and the server, its scripted agent works through the API, and
//! what it leaves is checked through the API and the simulators' ledgers.

use serde_json::Value;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "sh_demo_test_token";

#[tokio::test]
async fn the_demo_leaves_the_four_stories_visible_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_saga-harness"))
        .args([
            "demo",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--first-port",
            "0",
        ])
        .arg("--database")
        .arg(dir.path().join("demo.db"))
        .env("SAGA_DEMO_TOKEN", TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the demo starts");
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let done = line.starts_with("stop with Ctrl-C");
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    });
    let lines = tokio::time::timeout(Duration::from_secs(120), lines)
        .await
        .expect("the demo finishes staging within two minutes")
        .unwrap();
    let text = lines.join("\n");
    assert!(text.contains("sign in as admin"), "{text}");
    // "  run LABEL ID" and "  simulator NAME URL"
    let mut runs = HashMap::new();
    let mut sims = HashMap::new();
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["run", label, id] => {
                runs.insert(label.to_string(), id.to_string());
            }
            ["simulator", name, url] => {
                sims.insert(name.to_string(), url.to_string());
            }
            _ => {}
        }
    }
    let http = reqwest::Client::new();
    let run = |label: &str| {
        let id = runs[label].clone();
        let http = http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{port}/api/v1/runs/{id}"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let ledger = |name: &str| {
        let url = format!("{}/_sim/ledger", sims[name]);
        let http = http.clone();
        async move {
            let effects: Vec<Value> = http.get(url).send().await.unwrap().json().await.unwrap();
            effects
        }
    };
    let count =
        |effects: &[Value], action: &str| effects.iter().filter(|e| e["action"] == action).count();

    // The seed's incident, unwound: one ticket closed, one refund, no
    // apology; and the same again by the agent's twin that speaks MCP.
    assert!(
        text.contains("/mcp/runs/"),
        "the MCP address is printed: {text}"
    );
    for label in ["demo-incident-kettle", "demo-incident-kettle-mcp"] {
        let incident = run(label).await;
        assert_eq!(incident["run"]["status"], "UNWOUND", "{label}: {incident}");
    }
    let jira = ledger("jira").await;
    assert_eq!(count(&jira, "issue.created"), 2);
    assert_eq!(count(&jira, "issue.transitioned"), 2);
    let stripe = ledger("stripe").await;
    assert_eq!(
        count(&stripe, "payment_intent.created"),
        2 + 1,
        "two charges and the lamp's hold"
    );
    assert_eq!(count(&stripe, "refund.created"), 2);
    assert!(
        ledger("warehouse").await.is_empty(),
        "the reship was refused"
    );
    // A refund-and-reship run waiting at the pivot.
    let at_pivot = run("demo-reship-lamp").await;
    assert_eq!(at_pivot["run"]["status"], "AWAITING_APPROVAL");
    assert_eq!(at_pivot["pivot"]["status"], "pending");
    // A sent email whose correction waits for sign-off (it is the only
    // email besides the one whose connection dropped).
    let corrected = run("demo-email-correction").await;
    assert_eq!(corrected["run"]["status"], "UNWOUND");
    assert_eq!(corrected["steps"][1]["tool"], "send_email");
    assert_eq!(corrected["steps"][1]["status"], "CONFIRMED");
    // A run that needs a person.
    let attention = run("demo-needs-attention").await;
    assert_eq!(attention["run"]["status"], "NEEDS_ATTENTION");
    assert_eq!(attention["steps"][0]["status"], "UNKNOWN");
    let mails = ledger("mailbox").await;
    assert_eq!(
        mails.len(),
        2,
        "the corrected email and the dropped one; no apology: {mails:?}"
    );

    let _ = child.kill();
    let _ = child.wait();

    // The inbox the demo leaves, by who each letter is addressed to: the
    // kettle's charge was made without a receipt, so finance hears of its
    // refund and Ada, who never saw it, gets nothing.
    let url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let opened = saga_harness::store::open(&url).await.unwrap();
    let store = opened.saga_store();
    let addressed = |label: &str| {
        let id: uuid::Uuid = runs[label].parse().unwrap();
        let store = store.clone();
        async move {
            store
                .corrections(id)
                .await
                .unwrap()
                .into_iter()
                .map(|c| c.recipients)
                .collect::<Vec<_>>()
        }
    };
    for label in ["demo-incident-kettle", "demo-incident-kettle-mcp"] {
        assert_eq!(
            addressed(label).await,
            vec![vec!["finance@example.com".to_owned()]],
            "{label}"
        );
    }
    assert_eq!(
        addressed("demo-email-correction").await,
        vec![vec!["alan@example.com".to_owned()]]
    );
    for queued in store.correction_queue().await.unwrap() {
        assert!(
            !queued.recipients.iter().any(|r| r == "ada@example.com"),
            "a letter to a customer who never saw the charge: {queued:?}"
        );
    }
}
