//! The SMTP connector: sends one email per step, with the step's key in an
//! `X-Saga-Key` header and in the Message-ID `<key@saga-harness>` (R5), and
//! tells precisely how far the SMTP conversation got, because that decides
//! whether the mail may exist.
//!
//! ```toml
//! [connectors.smtp]
//! host = "smtp.example.com"
//! port = 587                      # optional: 465 with tls = "tls", else 587
//! from = "Support <support@example.com>"
//! tls = "starttls"                # "none" | "starttls" (default) | "tls"
//! username_env = "SMTP_USERNAME"  # optional, together with password_env
//! password_env = "SMTP_PASSWORD"
//! timeout_ms = 30000              # optional: per exchange with the server
//! subject = "A correction"        # optional: when the arguments have none
//! ```
//!
//! Operation `smtp.send` `{to: "a@x" | ["a@x", …], subject?, body, cc?}`.
//!
//! SMTP has no way to ask a server what it delivered, so `smtp.send` has no
//! lookup: an unknown send goes to a person (R7). A provider's own message
//! search (by Message-ID) could be added as a lookup; it is not here.
//!
//! # How an SMTP conversation becomes a [`CallReport`]
//!
//! The server takes responsibility for a message only when it answers 250
//! to the end of the data (RFC 5321 §4.1.1.4, §6.1). So:
//!
//! | what happened | report | R4 |
//! |---|---|---|
//! | 250 after the data | `Accepted {message_id, accepted, reply}` | confirmed, ref = Message-ID |
//! | a 5xx reply to MAIL, RCPT, DATA or to the end of the data (530/534/535: authentication) | `Refused`, in the server's words | failed |
//! | a 4xx reply to any of those (451, 452, 421 …) | `Deferred` | not executed: the server kept nothing |
//! | could not connect, TLS or EHLO or AUTH trouble, a dropped connection or a timeout *before* the data went out | `NotSent` | not executed |
//! | the connection dropped, or no reply came in time, once the data was being sent | `ResetAfterSend` / `TimedOut` | unknown: the server may have taken the message |
//!
//! The conversation is driven step by step (lettre's connection-level
//! client, the one its `AsyncSmtpTransport` uses) so that the moment the
//! data starts to leave is known exactly; anything uncertain after it is
//! unknown, never failed. With several recipients, one refusal ends the
//! whole transaction before the data: all get the mail or none.

use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use async_trait::async_trait;
use lettre::address::Envelope;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{self, Data, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Response;
use lettre::Message;
use secrecy::ExposeSecret as _;
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt;
use std::future::Future;
use std::time::Duration;

const SEND: &str = "smtp.send";
/// The domain of every Message-ID this connector writes.
pub const MESSAGE_ID_DOMAIN: &str = "saga-harness";
/// The header that carries the step's key.
pub const KEY_HEADER: &str = "X-Saga-Key";
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum TlsMode {
    /// Plain text (a local relay or a test server).
    None,
    /// Plain connection upgraded with STARTTLS; refused if not offered.
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    host: String,
    port: Option<u16>,
    from: String,
    tls: Option<TlsMode>,
    username_env: Option<String>,
    password_env: Option<String>,
    timeout_ms: Option<u64>,
    subject: Option<String>,
}

/// Sends email over SMTP.
#[derive(Clone)]
pub struct SmtpConnector {
    host: String,
    port: u16,
    from: Mailbox,
    tls: TlsMode,
    tls_parameters: Option<TlsParameters>,
    credentials: Option<Credentials>,
    timeout: Duration,
    default_subject: Option<String>,
}

impl fmt::Debug for SmtpConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmtpConnector")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("from", &self.from.to_string())
            .field("tls", &self.tls)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<hidden>"),
            )
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// One email as the arguments describe it.
struct Mail {
    to: Vec<Mailbox>,
    cc: Vec<Mailbox>,
    subject: Option<String>,
    body: String,
}

/// How far a conversation got before it stopped.
enum Stop {
    /// Nothing of the message left: `NotSent`.
    BeforeData(String),
    /// The server answered with a refusal (any stage).
    Refused {
        stage: &'static str,
        response: String,
        code: u16,
    },
}

impl SmtpConnector {
    /// Reads `[connectors.smtp]`. Every mistake is one message naming the
    /// field; credentials are read from the environment variables named.
    pub fn from_settings(table: &toml::Table) -> Result<Self, Vec<String>> {
        let settings: Settings =
            toml::Value::Table(table.clone())
                .try_into()
                .map_err(|e: toml::de::Error| {
                    vec![format!("connector `smtp`: {}", e.to_string().trim())]
                })?;
        let mut mistakes = Vec::new();
        let tls = settings.tls.unwrap_or(TlsMode::Starttls);
        if settings.host.trim().is_empty() {
            mistakes.push("connector `smtp`, field `host`: must not be empty".to_owned());
        }
        let from = settings
            .from
            .parse::<Mailbox>()
            .map_err(|e| {
                mistakes.push(format!(
                    "connector `smtp`, field `from`: {:?} is not an email address ({e})",
                    settings.from
                ))
            })
            .ok();
        let tls_parameters = match tls {
            TlsMode::None => None,
            TlsMode::Starttls | TlsMode::Tls => TlsParameters::new(settings.host.clone())
                .map_err(|e| {
                    mistakes.push(format!(
                        "connector `smtp`, field `tls`: cannot set up TLS for {}: {e}",
                        settings.host
                    ))
                })
                .ok(),
        };
        let credentials = match (&settings.username_env, &settings.password_env) {
            (None, None) => None,
            (Some(user), Some(password)) => {
                let user = super::wire::secret_from_env("smtp", "username_env", user)
                    .map_err(|e| mistakes.push(e));
                let password = super::wire::secret_from_env("smtp", "password_env", password)
                    .map_err(|e| mistakes.push(e));
                match (user, password) {
                    (Ok(user), Ok(password)) => Some(Credentials::new(
                        user.expose_secret().to_owned(),
                        password.expose_secret().to_owned(),
                    )),
                    _ => None,
                }
            }
            (Some(_), None) => {
                mistakes.push(
                    "connector `smtp`: field `password_env` is missing (username_env is set)"
                        .to_owned(),
                );
                None
            }
            (None, Some(_)) => {
                mistakes.push(
                    "connector `smtp`: field `username_env` is missing (password_env is set)"
                        .to_owned(),
                );
                None
            }
        };
        let timeout_ms = settings.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if timeout_ms == 0 {
            mistakes.push("connector `smtp`, field `timeout_ms`: must be at least 1".to_owned());
        }
        let port = settings.port.unwrap_or(match tls {
            TlsMode::Tls => 465,
            TlsMode::None | TlsMode::Starttls => 587,
        });
        match from {
            Some(from) if mistakes.is_empty() => Ok(SmtpConnector {
                host: settings.host,
                port,
                from,
                tls,
                tls_parameters,
                credentials,
                timeout: Duration::from_millis(timeout_ms),
                default_subject: settings.subject,
            }),
            _ => Err(mistakes),
        }
    }

    pub fn operations(&self) -> Vec<String> {
        vec![SEND.to_owned()]
    }

    fn mail(&self, args: &Value) -> Result<Mail, String> {
        let to = mailboxes(args.get("to"), "to")?;
        if to.is_empty() {
            return Err("smtp.send: argument `to` names no recipient".into());
        }
        let cc = match args.get("cc") {
            None | Some(Value::Null) => Vec::new(),
            some => mailboxes(some, "cc")?,
        };
        let subject = match args.get("subject") {
            None | Some(Value::Null) => self.default_subject.clone(),
            Some(Value::String(subject)) => Some(subject.clone()),
            Some(_) => return Err("smtp.send: argument `subject` must be a string".into()),
        };
        let body = args
            .get("body")
            .and_then(Value::as_str)
            .ok_or("smtp.send: argument `body` is missing or not a string")?
            .to_owned();
        Ok(Mail {
            to,
            cc,
            subject,
            body,
        })
    }

    fn message(&self, key: &str, mail: Mail) -> Result<Message, String> {
        let mut builder = Message::builder()
            .from(self.from.clone())
            .message_id(Some(message_id(key)))
            .raw_header(HeaderValue::new(
                HeaderName::new_from_ascii_str(KEY_HEADER),
                key.to_owned(),
            ));
        for to in mail.to {
            builder = builder.to(to);
        }
        for cc in mail.cc {
            builder = builder.cc(cc);
        }
        if let Some(subject) = mail.subject {
            builder = builder.subject(subject);
        }
        builder
            .body(mail.body)
            .map_err(|e| format!("smtp.send: the message cannot be built: {e}"))
    }

    /// Runs `step` with the per-exchange time limit.
    async fn in_time<T>(
        &self,
        step: impl Future<Output = Result<T, lettre::transport::smtp::Error>>,
    ) -> Result<Result<T, lettre::transport::smtp::Error>, ()> {
        tokio::time::timeout(self.timeout, step)
            .await
            .map_err(|_| ())
    }

    /// Connects, says EHLO, upgrades to TLS and authenticates: nothing of
    /// any message has left yet, whatever goes wrong here.
    async fn open(&self) -> Result<AsyncSmtpConnection, Stop> {
        let hello = ClientId::default();
        let implicit_tls = match self.tls {
            TlsMode::Tls => self.tls_parameters.clone(),
            TlsMode::None | TlsMode::Starttls => None,
        };
        let connecting = AsyncSmtpConnection::connect_tokio1(
            (self.host.as_str(), self.port),
            Some(self.timeout),
            &hello,
            implicit_tls,
            None,
        );
        let mut connection = self.before_data("connect", connecting).await?;
        if let (TlsMode::Starttls, Some(parameters)) = (self.tls, &self.tls_parameters) {
            if !connection
                .server_info()
                .supports_feature(Extension::StartTls)
            {
                connection.abort().await;
                return Err(Stop::BeforeData(
                    "the server does not offer STARTTLS and tls = \"starttls\" forbids sending in the clear".into(),
                ));
            }
            let upgrading = connection.starttls(parameters.clone(), &hello);
            self.before_data("STARTTLS", upgrading).await?;
        }
        if let Some(credentials) = &self.credentials {
            let mechanisms = [Mechanism::Plain, Mechanism::Login];
            let result = self
                .before_data("AUTH", connection.auth(&mechanisms, credentials))
                .await;
            if let Err(stop) = result {
                connection.abort().await;
                return Err(stop);
            }
        }
        Ok(connection)
    }

    /// One exchange before the data: a refusal is the server's word; any
    /// other trouble means nothing was handed over.
    async fn before_data<T>(
        &self,
        stage: &'static str,
        step: impl Future<Output = Result<T, lettre::transport::smtp::Error>>,
    ) -> Result<T, Stop> {
        match self.in_time(step).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(match error.status() {
                Some(code) => Stop::Refused {
                    stage,
                    code: code.into(),
                    response: error.to_string(),
                },
                None => Stop::BeforeData(format!("{stage}: {}", describe(&error))),
            }),
            Err(()) => Err(Stop::BeforeData(format!(
                "{stage}: no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    async fn deliver(&self, message_id: &str, envelope: &Envelope, data: &[u8]) -> CallReport {
        let mut connection = match self.open().await {
            Ok(connection) => connection,
            Err(stop) => return report_of_stop(stop),
        };
        let report = self
            .transaction(&mut connection, message_id, envelope, data)
            .await;
        if matches!(
            report,
            CallReport::Accepted { .. } | CallReport::Deferred { .. } | CallReport::Refused { .. }
        ) {
            // The outcome is settled; QUIT is a courtesy to a server that
            // is still talking.
            let _ = tokio::time::timeout(self.timeout, connection.quit()).await;
        }
        report
    }

    async fn transaction(
        &self,
        connection: &mut AsyncSmtpConnection,
        message_id: &str,
        envelope: &Envelope,
        data: &[u8],
    ) -> CallReport {
        let mut parameters = Vec::new();
        let non_ascii_address = envelope
            .to()
            .iter()
            .chain(envelope.from())
            .any(|address| !AsRef::<str>::as_ref(address).is_ascii());
        if non_ascii_address {
            if !connection
                .server_info()
                .supports_feature(Extension::SmtpUtfEight)
            {
                return CallReport::NotSent {
                    reason: "an address is not ASCII and the server does not offer SMTPUTF8".into(),
                };
            }
            parameters.push(MailParameter::SmtpUtfEight);
        }
        if !data.is_ascii() {
            if !connection
                .server_info()
                .supports_feature(Extension::EightBitMime)
            {
                return CallReport::NotSent {
                    reason: "the message is not ASCII and the server does not offer 8BITMIME"
                        .into(),
                };
            }
            parameters.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        let mail_from = commands::Mail::new(envelope.from().cloned(), parameters);
        if let Err(stop) = self
            .before_data("MAIL FROM", connection.command(mail_from))
            .await
        {
            return report_of_stop(stop);
        }
        for recipient in envelope.to() {
            let rcpt = Rcpt::new(recipient.clone(), Vec::new());
            if let Err(stop) = self.before_data("RCPT TO", connection.command(rcpt)).await {
                return report_of_stop(stop);
            }
        }
        if let Err(stop) = self.before_data("DATA", connection.command(Data)).await {
            return report_of_stop(stop);
        }
        // From here on the message is leaving: a break is unknown.
        match self.in_time(connection.message(data)).await {
            Ok(Ok(reply)) => accepted(message_id, envelope, &reply),
            Ok(Err(error)) => match error.status() {
                Some(code) => report_of_stop(Stop::Refused {
                    stage: "end of data",
                    code: code.into(),
                    response: error.to_string(),
                }),
                None => CallReport::ResetAfterSend,
            },
            Err(()) => CallReport::TimedOut,
        }
    }
}

/// `<key@saga-harness>`.
pub fn message_id(key: &str) -> String {
    format!("<{key}@{MESSAGE_ID_DOMAIN}>")
}

/// Whether `key` can stand left of the `@` in a Message-ID (RFC 5322
/// `dot-atom-text`) and in a header unchanged.
fn key_fits_message_id(key: &str) -> bool {
    const SPECIALS: &str = "!#$%&'*+-/=?^_`{|}~.";
    !key.is_empty()
        && !key.starts_with('.')
        && !key.ends_with('.')
        && !key.contains("..")
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || SPECIALS.contains(c))
}

fn mailboxes(value: Option<&Value>, field: &str) -> Result<Vec<Mailbox>, String> {
    let texts: Vec<&str> = match value {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or(format!("smtp.send: argument `{field}` must hold strings"))
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(format!(
                "smtp.send: argument `{field}` must be an address or a list of addresses"
            ))
        }
    };
    texts
        .into_iter()
        .map(|text| {
            text.parse::<Mailbox>().map_err(|e| {
                format!("smtp.send: argument `{field}`: {text:?} is not an email address ({e})")
            })
        })
        .collect()
}

fn accepted(message_id: &str, envelope: &Envelope, reply: &Response) -> CallReport {
    let accepted: Vec<String> = envelope.to().iter().map(ToString::to_string).collect();
    let code: u16 = reply.code().into();
    let text: Vec<&str> = reply.message().collect();
    CallReport::Accepted {
        body: json!({
            "message_id": message_id,
            "accepted": accepted,
            "reply": format!("{code} {}", text.join(" ")),
        }),
    }
}

fn report_of_stop(stop: Stop) -> CallReport {
    match stop {
        Stop::BeforeData(reason) => CallReport::NotSent { reason },
        Stop::Refused {
            stage,
            code: 400..=499,
            response,
        } => CallReport::Deferred {
            reason: format!("the SMTP server deferred the message at {stage}: {response}"),
            retry_after: None,
        },
        Stop::Refused {
            stage, response, ..
        } => CallReport::Refused {
            reason: format!("the SMTP server refused at {stage}: {response}"),
        },
    }
}

/// An SMTP client error in words. Lettre's errors name the failing step
/// and the server's reply, never the credentials.
fn describe(error: &lettre::transport::smtp::Error) -> String {
    if error.is_timeout() {
        "timed out".into()
    } else {
        error.to_string()
    }
}

#[async_trait]
impl Connector for SmtpConnector {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        if operation != SEND {
            return CallReport::NotSent {
                reason: format!("the SMTP connector has no operation {operation}"),
            };
        }
        if !key_fits_message_id(key) {
            return CallReport::NotSent {
                reason: format!("the key {key:?} cannot be written into a Message-ID"),
            };
        }
        let message = match self.mail(args).and_then(|mail| self.message(key, mail)) {
            Ok(message) => message,
            Err(reason) => return CallReport::NotSent { reason },
        };
        let data = message.formatted();
        self.deliver(&message_id(key), message.envelope(), &data)
            .await
    }

    /// SMTP cannot be asked what it delivered: a person answers (R7).
    async fn lookup(
        &self,
        _operation: &str,
        _key: &str,
        _args: &Value,
    ) -> Result<Lookup, LookupError> {
        Err(LookupError::Unsupported)
    }

    fn has_lookup(&self, _operation: &str) -> bool {
        false
    }

    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        if operation != SEND {
            return None;
        }
        body.get("message_id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_5xx_refusal_fails_and_a_4xx_reply_defers_the_message() {
        for code in [535, 550, 554] {
            assert_eq!(
                report_of_stop(Stop::Refused {
                    stage: "RCPT TO",
                    response: format!("{code} 5.1.1 no"),
                    code,
                }),
                CallReport::Refused {
                    reason: format!("the SMTP server refused at RCPT TO: {code} 5.1.1 no"),
                },
                "{code}"
            );
        }
        for code in [421, 451, 452] {
            let report = report_of_stop(Stop::Refused {
                stage: "RCPT TO",
                response: format!("{code} 4.7.1 try again later"),
                code,
            });
            assert_eq!(
                report,
                CallReport::Deferred {
                    reason: format!(
                        "the SMTP server deferred the message at RCPT TO: {code} 4.7.1 try again later"
                    ),
                    retry_after: None,
                },
                "{code}"
            );
        }
    }

    #[test]
    fn keys_that_fit_a_message_id() {
        assert!(key_fits_message_id("0123456789abcdef0123456789abcdef"));
        assert!(!key_fits_message_id("has space"));
        assert!(!key_fits_message_id("a@b"));
        assert!(!key_fits_message_id(".lead"));
        assert!(!key_fits_message_id(""));
    }

    #[test]
    fn recipients_are_one_address_or_a_list() {
        assert_eq!(
            mailboxes(Some(&json!("a@example.com")), "to")
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            mailboxes(Some(&json!(["a@example.com", "B <b@example.com>"])), "to")
                .unwrap()
                .len(),
            2
        );
        assert!(mailboxes(Some(&json!("not an address")), "to").is_err());
        assert!(mailboxes(None, "to").is_err());
    }
}
