//! `saga-harness demo`, as a newcomer runs it: the binary starts the
//! simulators and the server, its scripted agent works through the API, and
//! what it leaves is checked through the API and the simulators' ledgers.

use serde_json::Value;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "sh_demo_test_token";
const PASSWORD: &str = "correct horse battery";

/// A demo started on free ports, with what it printed.
struct Demo {
    child: std::process::Child,
    port: u16,
    text: String,
    /// Each story's run id, by label.
    runs: HashMap<String, String>,
    /// Each simulator's address, by name.
    sims: HashMap<String, String>,
}

impl Demo {
    async fn start(dir: &std::path::Path) -> Demo {
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
            .arg(dir.join("demo.db"))
            .env("SAGA_DEMO_TOKEN", TOKEN)
            .env("SAGA_DEMO_PASSWORD", PASSWORD)
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
        Demo {
            child,
            port,
            text: lines.join("\n"),
            runs,
            sims,
        }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_demo_leaves_the_four_stories_visible_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let demo = Demo::start(dir.path()).await;
    let (port, text, runs, sims) = (
        demo.port,
        demo.text.clone(),
        demo.runs.clone(),
        demo.sims.clone(),
    );
    assert!(text.contains("sign in as admin"), "{text}");
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

    drop(demo);

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

/// What a lead reads: the page's visible text with the technical-details
/// disclosures (exact arguments and keys, the arguments' editor) and the
/// constants folded under each status's words taken out.
fn lead_reads(html: &str) -> String {
    let mut kept = String::with_capacity(html.len());
    let mut rest = html;
    const TECHNICAL: [&str; 3] = [
        r#"<details class="exact">"#,
        r#"<details class="edit-step">"#,
        r#"</summary><code>"#,
    ];
    while let Some(cut) = TECHNICAL.iter().filter_map(|o| rest.find(o)).min() {
        kept.push_str(&rest[..cut]);
        let Some(end) = rest[cut..].find("</details>") else {
            break;
        };
        rest = &rest[cut + end + "</details>".len()..];
    }
    kept.push_str(rest);
    crate::common::visible_text(&kept)
}

/// Whether the text shows a run or step status constant or a key (32
/// hex characters, or 8 and an ellipsis as a sentence once cut one).
fn shows_constant_or_key(text: &str) -> Option<String> {
    use saga_harness::saga::status::{RunStatus, StepStatus};
    for constant in RunStatus::ALL
        .iter()
        .map(|s| s.as_str())
        .chain(StepStatus::ALL.iter().map(|s| s.as_str()))
        .filter(|c| c.contains('_') || c.len() > 6)
    {
        if text.contains(constant) {
            return Some(constant.to_owned());
        }
    }
    let hex = |c: char| c.is_ascii_hexdigit() && !c.is_ascii_uppercase();
    let chars: Vec<char> = text.chars().collect();
    for start in 0..chars.len() {
        let run = chars[start..].iter().take_while(|c| hex(**c)).count();
        let cut_key = run == 8 && chars.get(start + 8) == Some(&'…');
        if (run >= 32 || cut_key) && (start == 0 || !hex(chars[start - 1])) {
            return Some(chars[start..start + run.max(8)].iter().collect());
        }
    }
    None
}

#[tokio::test]
async fn a_lead_reads_each_demo_run_in_words_without_constants_or_keys() {
    let dir = tempfile::tempdir().unwrap();
    let demo = Demo::start(dir.path()).await;
    let base = demo.base();
    let lead = crate::common::process::Dashboard::new();
    lead.sign_in(&base, "lead", PASSWORD).await;

    // The pivot: the money, the people, the systems, both consequences,
    // and the customer's email as they will read it; opened by its label.
    let page = lead.page(&base, "/runs/demo-reship-lamp").await;
    let read = lead_reads(&page);
    for said in [
        "Waiting for your decision",
        "+$32.00 captured",
        "−$5.00 refunded",
        "+$27.00 net",
        "$32.00 held on the card now",
        "grace@example.com",
        "Stripe",
        "If you approve, in this order:",
        "If you reject: nothing in the plan is sent; what the run staged is taken back (delete the ticket draft; delete the email draft; release the card hold)",
        "What the customer will read",
        "Your replacement lamp",
        "A new lamp ships today; the shipping fee is refunded.",
    ] {
        assert!(read.contains(said), "the pivot page lacks {said:?}: {read}");
    }
    // The hold is named by what it is, never by its key.
    assert!(
        read.contains("Capture $32.00 from the card hold pi_"),
        "{read}"
    );
    assert_eq!(shows_constant_or_key(&read), None, "{read}");
    // Approve comes before the plan's details, right after the summary.
    let approve = page.find(">Approve<").expect("an Approve button");
    assert!(approve < page.find("What approval runs").unwrap());

    // Needs a person: what is uncertain, how to check, what each answer does.
    let page = lead.page(&base, "/runs/demo-needs-attention").await;
    let read = lead_reads(&page);
    for said in [
        "Needs a person",
        "Nobody can tell whether this happened: Email ada@example.com: “Your replacement kettle”. Connection reset after the request was sent.",
        "How to check: Search the sent mail for the subject “Your replacement kettle” to ada@example.com",
        "It happened: It is recorded as done, and the rest of the approved plan runs.",
        "It did not happen: It is sent again under the same key",
    ] {
        assert!(read.contains(said), "the question lacks {said:?}: {read}");
    }
    assert!(
        page.find("Needs a person").unwrap() < page.find("The plan:").unwrap(),
        "the question comes before the finished pivot"
    );

    // An unwound run says why at the top; so does the runs list.
    let page = lead.page(&base, "/runs/demo-email-correction").await;
    let read = lead_reads(&page);
    assert!(
        read.contains("Taken back: no refund was made for these mugs: the email promised one"),
        "{read}"
    );
    assert!(read.contains("Started by admin"), "{read}");
    assert_eq!(shows_constant_or_key(&read), None, "{read}");
    let incident = lead_reads(&lead.page(&base, "/runs/demo-incident-kettle").await);
    assert!(incident.contains("Taken back:"), "{incident}");
    assert!(incident.contains("taken back"), "{incident}");
    assert!(
        incident.contains("the harness looked it up in Jira by its key: it had happened (SUP-"),
        "the ticket's account says how the harness found out: {incident}"
    );
    assert_eq!(shows_constant_or_key(&incident), None, "{incident}");

    let list = lead_reads(&lead.page(&base, "/").await);
    assert!(list.contains("waiting for approval"), "{list}");
    assert!(list.contains("needs a person"), "{list}");
    assert!(
        list.contains("Taken back: no refund was made for these mugs"),
        "{list}"
    );
    assert_eq!(shows_constant_or_key(&list), None, "{list}");
    assert!(
        list.contains("cus_grace"),
        "the lamp's run names its customer: {list}"
    );
    // Search by customer: only the lamp's run holds cus_grace.
    let found = lead_reads(&lead.page(&base, "/?q=cus_grace").await);
    assert!(
        found.contains("Grace's lamp was lost in transit"),
        "{found}"
    );
    assert!(!found.contains("Tell Alan"), "{found}");

    // The inbox, grouped by who saw the original, each card with its why.
    let inbox = lead_reads(&lead.page(&base, "/corrections").await);
    assert!(inbox.contains("Customers · 1 correction"), "{inbox}");
    assert!(inbox.contains("Finance · 2 corrections"), "{inbox}");
    assert!(
        inbox.find("Customers ·").unwrap() < inbox.find("Finance ·").unwrap(),
        "customers rank above finance: {inbox}"
    );
    assert!(
        inbox.contains("Why: the run was taken back: no refund was made for these mugs"),
        "{inbox}"
    );
    assert!(
        inbox.contains("Subject: A correction to our earlier message"),
        "{inbox}"
    );
    assert!(
        inbox.contains(
            "Email alan@example.com: “Your mugs are refunded”: done, and it cannot be undone"
        ),
        "{inbox}"
    );

    // The audit trail names the run of each line.
    let audit = lead_reads(&lead.page(&base, "/audit").await);
    assert!(audit.contains("demo-email-correction"), "{audit}");
    assert!(
        audit.contains("waiting for approval → carrying out the approved plan"),
        "{audit}"
    );
}
