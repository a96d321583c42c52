//! The SMTP connector against two real SMTP servers: the in-process sink
//! (`saga_harness::sim::smtp`) and an aiosmtpd server
//! (`scripts/smtp-server.py`). The key travels in `X-Saga-Key` and the
//! Message-ID (R5); how far the conversation got decides the R4 outcome;
//! SMTP has no lookup, so an unknown send is a question for a person (R7).
//!
//! The aiosmtpd tests need `pip install aiosmtpd`; without it they fail
//! and say so.
#![cfg(feature = "ssr")]

use saga_harness::connectors::smtp::SmtpConnector;
use saga_harness::connectors::wire::{Timeouts, Wire};
use saga_harness::connectors::ConnectorSet;
use saga_harness::saga::connector::{classify, CallReport, Classified, Connector, LookupError};
use saga_harness::sim::smtp::{self, SmtpSink};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SEND: &str = "smtp.send";
const KEY: &str = "0123456789abcdef0123456789abcdef";

fn settings(addr: SocketAddr) -> toml::Table {
    let mut table = toml::Table::new();
    table.insert("host".into(), addr.ip().to_string().into());
    table.insert("port".into(), i64::from(addr.port()).into());
    table.insert("from".into(), "Support <support@example.com>".into());
    table.insert("tls".into(), "none".into());
    table.insert("timeout_ms".into(), 5_000.into());
    table
}

fn connector(table: &toml::Table) -> SmtpConnector {
    SmtpConnector::from_settings(table).expect("valid smtp settings")
}

async fn sink() -> SmtpSink {
    smtp::start("127.0.0.1:0".parse().unwrap())
        .await
        .expect("smtp sink starts")
}

fn judge(smtp: &SmtpConnector, report: &CallReport) -> Classified {
    classify(report, |body| smtp.external_ref(SEND, body))
}

fn email(to: Value) -> Value {
    json!({"to": to, "subject": "Your refund", "body": "We refunded 12.00.\nThanks."})
}

/// A port nothing listens on.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn r5_accepted_mail_is_confirmed_with_the_key_in_x_saga_key_and_message_id() {
    let sink = sink().await;
    let smtp = connector(&settings(sink.addr()));
    let report = smtp
        .execute(SEND, KEY, &email(json!("customer@example.com")))
        .await;
    let Classified::Confirmed {
        external_ref,
        result,
    } = judge(&smtp, &report)
    else {
        panic!("{report:?}");
    };
    assert_eq!(external_ref, format!("<{KEY}@saga-harness>"));
    assert_eq!(result["accepted"], json!(["customer@example.com"]));
    assert!(result["reply"].as_str().unwrap().starts_with("250"));

    let received = sink.ledger().of("email.received");
    assert_eq!(received.len(), 1);
    let mail = &received[0];
    assert_eq!(mail.key.as_deref(), Some(KEY));
    assert_eq!(mail.object, external_ref);
    assert_eq!(mail.detail["headers"]["X-Saga-Key"], KEY);
    assert_eq!(mail.detail["from"], "support@example.com");
    assert_eq!(mail.detail["to"], json!(["customer@example.com"]));
    assert_eq!(mail.detail["subject"], "Your refund");
    assert!(mail.detail["body"]
        .as_str()
        .unwrap()
        .contains("We refunded 12.00."));
}

#[tokio::test]
async fn a_correction_goes_to_every_recipient_with_the_default_subject() {
    let sink = sink().await;
    let mut table = settings(sink.addr());
    table.insert("subject".into(), "A correction to our last message".into());
    let smtp = connector(&table);
    let args = json!({
        "to": ["a@example.com", "B <b@example.com>"],
        "cc": "c@example.com",
        "body": "Please ignore the previous message."
    });
    let report = smtp.execute(SEND, KEY, &args).await;
    let Classified::Confirmed { result, .. } = judge(&smtp, &report) else {
        panic!("{report:?}");
    };
    assert_eq!(
        result["accepted"],
        json!(["a@example.com", "b@example.com", "c@example.com"])
    );
    let received = sink.ledger().of("email.received");
    assert_eq!(received.len(), 1, "one message, three recipients");
    assert_eq!(
        received[0].detail["subject"],
        "A correction to our last message"
    );
}

#[tokio::test]
async fn r4_rejected_recipient_is_failed_and_nothing_is_delivered() {
    let sink = sink().await;
    sink.reject_recipient("gone@example.com");
    let smtp = connector(&settings(sink.addr()));
    let report = smtp
        .execute(
            SEND,
            KEY,
            &email(json!(["ok@example.com", "gone@example.com"])),
        )
        .await;
    let judged = judge(&smtp, &report);
    assert!(
        matches!(&judged, Classified::Failed { error } if error.contains("550")),
        "{judged:?}"
    );
    assert!(sink.ledger().of("email.received").is_empty());
}

#[tokio::test]
async fn r4_transient_451_before_data_is_not_executed() {
    let sink = sink().await;
    sink.fail_transiently(1);
    let smtp = connector(&settings(sink.addr()));
    let report = smtp
        .execute(SEND, KEY, &email(json!("a@example.com")))
        .await;
    assert!(
        matches!(&report, CallReport::Deferred { reason, retry_after: None } if reason.contains("451")),
        "{report:?}"
    );
    assert!(matches!(
        judge(&smtp, &report),
        Classified::NotExecuted { .. }
    ));
    assert!(sink.ledger().of("email.received").is_empty());

    // Retried, it goes through once.
    let again = smtp
        .execute(SEND, KEY, &email(json!("a@example.com")))
        .await;
    assert!(matches!(judge(&smtp, &again), Classified::Confirmed { .. }));
    assert_eq!(sink.ledger().of("email.received").len(), 1);
}

#[tokio::test]
async fn r4_connection_dropped_after_data_is_unknown_and_the_mail_was_received() {
    let sink = sink().await;
    sink.drop_after_data(1);
    let smtp = connector(&settings(sink.addr()));
    let report = smtp
        .execute(SEND, KEY, &email(json!("a@example.com")))
        .await;
    assert_eq!(report, CallReport::ResetAfterSend);
    assert!(matches!(judge(&smtp, &report), Classified::Unknown { .. }));
    // The effect happened: a person asked "did this go out?" must say yes.
    let received = sink.ledger().of("email.received");
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].key.as_deref(), Some(KEY));
}

#[tokio::test]
async fn r4_final_reply_slower_than_the_timeout_is_unknown_and_the_mail_was_received() {
    let sink = sink().await;
    sink.delay_final_reply(Duration::from_millis(1500), 1);
    let mut table = settings(sink.addr());
    table.insert("timeout_ms".into(), 300.into());
    let smtp = connector(&table);
    let report = smtp
        .execute(SEND, KEY, &email(json!("a@example.com")))
        .await;
    assert_eq!(report, CallReport::TimedOut);
    assert!(matches!(judge(&smtp, &report), Classified::Unknown { .. }));
    assert_eq!(sink.ledger().of("email.received").len(), 1);
}

#[tokio::test]
async fn r4_connection_refused_is_not_executed() {
    let smtp = connector(&settings(closed_port()));
    let report = smtp
        .execute(SEND, KEY, &email(json!("a@example.com")))
        .await;
    assert!(matches!(report, CallReport::NotSent { .. }), "{report:?}");
    assert!(matches!(
        judge(&smtp, &report),
        Classified::NotExecuted { .. }
    ));
}

#[tokio::test]
async fn r4_starttls_demanded_but_not_offered_sends_nothing() {
    let sink = sink().await;
    let mut table = settings(sink.addr());
    table.insert("tls".into(), "starttls".into());
    table.insert("host".into(), "localhost".into());
    let smtp = connector(&table);
    let report = smtp
        .execute(SEND, KEY, &email(json!("a@example.com")))
        .await;
    assert!(
        matches!(&report, CallReport::NotSent { reason } if reason.contains("STARTTLS")),
        "{report:?}"
    );
    assert!(sink.ledger().of("email.received").is_empty());
}

#[tokio::test]
async fn arguments_that_make_no_email_are_not_sent() {
    let sink = sink().await;
    let smtp = connector(&settings(sink.addr()));
    for args in [
        json!({"to": "not an address", "body": "x"}),
        json!({"to": [], "body": "x"}),
        json!({"to": "a@example.com"}),
        json!({"body": "x"}),
    ] {
        let report = smtp.execute(SEND, KEY, &args).await;
        assert!(
            matches!(report, CallReport::NotSent { .. }),
            "{args}: {report:?}"
        );
    }
    let report = smtp
        .execute(SEND, "not a key", &email(json!("a@example.com")))
        .await;
    assert!(matches!(report, CallReport::NotSent { .. }), "{report:?}");
    assert!(sink.ledger().of("email.received").is_empty());
}

#[tokio::test]
async fn r7_smtp_has_no_lookup_so_a_person_answers() {
    let sink = sink().await;
    let smtp = connector(&settings(sink.addr()));
    assert!(!smtp.has_lookup(SEND));
    assert_eq!(
        smtp.lookup(SEND, KEY, &email(json!("a@example.com"))).await,
        Err(LookupError::Unsupported)
    );
    // A blank or foreign body names no message: the send stays unknown.
    assert_eq!(smtp.external_ref(SEND, &json!({})), None);
    assert_eq!(smtp.external_ref(SEND, &json!({"message_id": ""})), None);
}

#[tokio::test]
async fn settings_mistakes_name_the_field_and_never_show_the_password() {
    let mut missing = toml::Table::new();
    missing.insert("from".into(), "support@example.com".into());
    let errors = SmtpConnector::from_settings(&missing).unwrap_err();
    assert!(errors.iter().any(|e| e.contains("host")), "{errors:?}");

    let mut bad = settings(closed_port());
    bad.insert("from".into(), "not an address".into());
    bad.insert("tls".into(), "sometimes".into());
    let errors = SmtpConnector::from_settings(&bad).unwrap_err();
    assert!(errors.iter().any(|e| e.contains("tls")), "{errors:?}");
    bad.insert("tls".into(), "none".into());
    let errors = SmtpConnector::from_settings(&bad).unwrap_err();
    assert!(errors.iter().any(|e| e.contains("`from`")), "{errors:?}");

    let mut half = settings(closed_port());
    half.insert("username_env".into(), "SAGA_TEST_SMTP_USER_HALF".into());
    let errors = SmtpConnector::from_settings(&half).unwrap_err();
    assert!(
        errors.iter().any(|e| e.contains("password_env")),
        "{errors:?}"
    );

    half.insert(
        "password_env".into(),
        "SAGA_TEST_SMTP_PASSWORD_NEVER_SET".into(),
    );
    std::env::set_var("SAGA_TEST_SMTP_USER_HALF", "mailer");
    let errors = SmtpConnector::from_settings(&half).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("password_env") && e.contains("SAGA_TEST_SMTP_PASSWORD_NEVER_SET")),
        "{errors:?}"
    );

    // With credentials set, the password shows nowhere: not in Debug, not
    // in the report of a server that cannot take them.
    std::env::set_var("SAGA_TEST_SMTP_PASSWORD_SET", "p4ssw0rd-s3cr3t");
    let sink = sink().await;
    let mut with_auth = settings(sink.addr());
    with_auth.insert("username_env".into(), "SAGA_TEST_SMTP_USER_HALF".into());
    with_auth.insert("password_env".into(), "SAGA_TEST_SMTP_PASSWORD_SET".into());
    let smtp = connector(&with_auth);
    assert!(!format!("{smtp:?}").contains("s3cr3t"));
    let report = smtp
        .execute(SEND, KEY, &email(json!("a@example.com")))
        .await;
    assert!(matches!(report, CallReport::NotSent { .. }), "{report:?}");
    assert!(!format!("{report:?}").contains("s3cr3t"));

    // `[connectors.smtp]` in the tools file builds it.
    let mut connectors = toml::Table::new();
    connectors.insert("smtp".into(), toml::Value::Table(settings(sink.addr())));
    let set = ConnectorSet::from_settings(&connectors, &Wire::new(&Timeouts::default())).unwrap();
    assert_eq!(set.operations().collect::<Vec<_>>(), vec![SEND]);
    assert!(!set.has_lookup(SEND));
}

// --- Against a real SMTP server: aiosmtpd -------------------------------

/// `scripts/smtp-server.py`, running until dropped.
struct RealServer {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for RealServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RealServer {
    fn start(extra: &[&str]) -> RealServer {
        let has_aiosmtpd = Command::new("python3")
            .args(["-c", "import aiosmtpd"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            has_aiosmtpd,
            "these tests need a real SMTP server: run `pip install aiosmtpd` (python3 with aiosmtpd)"
        );
        let dir = tempfile::tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/smtp-server.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .args(["--host", "127.0.0.1", "--port", "0", "--dir"])
            .arg(dir.path())
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs scripts/smtp-server.py");
        let mut first_line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first_line)
            .unwrap();
        let addr = first_line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("smtp-server.py did not start: {first_line:?}"));
        RealServer { child, addr, dir }
    }

    /// The messages written so far: (envelope JSON, raw message).
    fn received(&self) -> Vec<(Value, String)> {
        let mut numbers: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "eml"))
            .collect();
        numbers.sort();
        numbers
            .into_iter()
            .map(|eml| {
                let envelope = std::fs::read_to_string(eml.with_extension("json")).unwrap();
                (
                    serde_json::from_str(&envelope).unwrap(),
                    std::fs::read_to_string(&eml).unwrap(),
                )
            })
            .collect()
    }
}

#[tokio::test]
async fn aiosmtpd_accepts_and_the_key_is_in_x_saga_key_and_message_id() {
    let server = RealServer::start(&[]);
    let smtp = connector(&settings(server.addr));
    let report = smtp
        .execute(SEND, KEY, &email(json!("customer@example.com")))
        .await;
    let Classified::Confirmed { external_ref, .. } = judge(&smtp, &report) else {
        panic!("{report:?}");
    };
    assert_eq!(external_ref, format!("<{KEY}@saga-harness>"));
    let received = server.received();
    assert_eq!(received.len(), 1);
    let (envelope, raw) = &received[0];
    assert_eq!(envelope["mail_from"], "support@example.com");
    assert_eq!(envelope["rcpt_tos"], json!(["customer@example.com"]));
    assert!(raw.contains(&format!("X-Saga-Key: {KEY}")), "{raw}");
    assert!(
        raw.contains(&format!("Message-ID: <{KEY}@saga-harness>")),
        "{raw}"
    );
}

#[tokio::test]
async fn aiosmtpd_rejected_recipient_is_failed() {
    let server = RealServer::start(&["--reject-recipient", "gone@example.com"]);
    let smtp = connector(&settings(server.addr));
    let report = smtp
        .execute(SEND, KEY, &email(json!("gone@example.com")))
        .await;
    assert!(
        matches!(judge(&smtp, &report), Classified::Failed { error } if error.contains("550")),
        "{report:?}"
    );
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn aiosmtpd_drop_after_data_is_unknown_and_the_mail_was_written() {
    let server = RealServer::start(&["--drop-after-data"]);
    let smtp = connector(&settings(server.addr));
    let report = smtp
        .execute(SEND, KEY, &email(json!("a@example.com")))
        .await;
    assert_eq!(report, CallReport::ResetAfterSend);
    assert!(matches!(judge(&smtp, &report), Classified::Unknown { .. }));
    let received = server.received();
    assert_eq!(received.len(), 1, "the server kept the message");
    assert!(received[0].1.contains(&format!("X-Saga-Key: {KEY}")));
}
