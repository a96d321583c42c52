//! The HTTP client every connector uses, and the translation of what
//! happened on the socket into a [`CallReport`] (the facts R4 judges).
//!
//! What a system answers is untrusted: the client follows no redirect (a
//! 3xx is an answer like any other, so a service cannot point the harness,
//! its credentials or a request body at another host), and an answer is
//! read up to `max_answer_bytes` and no further (a longer one is cut, and
//! the step keeps its beginning and says so).

use crate::saga::connector::{CallReport, LookupError};
use serde_json::Value;
use std::time::Duration;

/// Explicit limits for every request a connector sends.
#[derive(Clone, Debug)]
pub struct Timeouts {
    /// Establishing the connection. A request that could not connect never
    /// left, so it is `NotSent`.
    pub connect: Duration,
    /// The whole request, answer included. Past it the call is `TimedOut`:
    /// unknown, never failed.
    pub request: Duration,
    /// The most bytes of an answer that are read.
    pub max_answer_bytes: usize,
}

/// The default for `max_answer_bytes`: far above any answer the systems'
/// APIs document, far below what would strain the harness.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// How much of a cut answer is kept, for the person reading the step.
const EXCERPT_BYTES: usize = 2048;

impl Timeouts {
    /// The longest a call may take before it is given up on: connecting,
    /// then the whole request.
    pub fn longest_call(&self) -> Duration {
        self.connect + self.request
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(3),
            request: Duration::from_secs(10),
            max_answer_bytes: MAX_ANSWER_BYTES,
        }
    }
}

/// A client with explicit timeouts, shared by the connectors of one harness.
#[derive(Clone, Debug)]
pub struct Wire {
    client: reqwest::Client,
    max_answer_bytes: usize,
}

/// An answer's body as read: whole, or cut at the limit.
enum Answer {
    Whole(Vec<u8>),
    Cut {
        /// Its first bytes, at most [`EXCERPT_BYTES`].
        excerpt: Vec<u8>,
        /// The length it declared, if it declared one.
        declared: Option<u64>,
    },
}

impl Wire {
    pub fn new(timeouts: &Timeouts) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .timeout(timeouts.request)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("saga-harness/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a client with static settings builds");
        Wire {
            client,
            max_answer_bytes: timeouts.max_answer_bytes.max(1),
        }
    }

    /// Reads an answer's body up to the limit: a declared length over it
    /// is not read at all, and a body that runs past it is cut there.
    async fn read_body(&self, mut response: reqwest::Response) -> Result<Answer, reqwest::Error> {
        let limit = self.max_answer_bytes;
        let declared = response.content_length();
        if declared.is_some_and(|length| length > limit as u64) {
            return Ok(Answer::Cut {
                excerpt: Vec::new(),
                declared,
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if body.len() + chunk.len() > limit {
                body.extend_from_slice(
                    &chunk[..EXCERPT_BYTES.saturating_sub(body.len()).min(chunk.len())],
                );
                body.truncate(EXCERPT_BYTES);
                return Ok(Answer::Cut {
                    excerpt: body,
                    declared,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Answer::Whole(body))
    }

    /// What a cut answer is kept as: its beginning and why it ends there.
    fn cut_answer(&self, excerpt: &[u8], declared: Option<u64>) -> Value {
        let limit = self.max_answer_bytes;
        let said = match declared {
            Some(length) => format!(
                "the answer was {length} bytes, over the {limit}-byte limit: only its beginning is kept"
            ),
            None => format!("the answer ran past the {limit}-byte limit: only its beginning is kept"),
        };
        serde_json::json!({
            "answer_cut": said,
            "excerpt": String::from_utf8_lossy(excerpt),
        })
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Sends a request that may have an effect and reports what happened.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> CallReport {
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => return report_of_error(&err),
        };
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers(), std::time::SystemTime::now());
        match self.read_body(response).await {
            // Refused for now, nothing kept: the caller may send it again,
            // after the wait the system asked for.
            Ok(Answer::Whole(bytes)) if status == 429 => CallReport::Deferred {
                reason: match serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .as_ref()
                    .and_then(said)
                {
                    Some(said) => format!("HTTP 429: rate limited ({said})"),
                    None => "HTTP 429: rate limited".into(),
                },
                retry_after,
            },
            Ok(Answer::Whole(bytes)) => CallReport::Answered {
                status,
                body: serde_json::from_slice(&bytes).ok(),
                idempotency_conflict: false,
            },
            // The system answered; what it said is too long to read. The
            // status stands, and a 2xx without its reference is an unknown
            // the lookup settles.
            Ok(Answer::Cut { excerpt, declared }) => CallReport::Answered {
                status,
                body: Some(self.cut_answer(&excerpt, declared)),
                idempotency_conflict: false,
            },
            // The answer started and broke off: the request had arrived.
            Err(err) if err.is_timeout() => CallReport::TimedOut,
            Err(_) => CallReport::ResetAfterSend,
        }
    }

    /// Sends a request that only reads (a lookup): any trouble means the
    /// system could not be asked this time.
    pub async fn read(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(u16, Option<Value>), LookupError> {
        let response = request
            .send()
            .await
            .map_err(|e| LookupError::Unavailable(describe(&e)))?;
        let status = response.status().as_u16();
        match self
            .read_body(response)
            .await
            .map_err(|e| LookupError::Unavailable(describe(&e)))?
        {
            Answer::Whole(bytes) => Ok((status, serde_json::from_slice(&bytes).ok())),
            Answer::Cut { .. } => Err(LookupError::Unavailable(format!(
                "the lookup's answer was longer than the {}-byte limit",
                self.max_answer_bytes
            ))),
        }
    }

    /// Reads, and insists on a 2xx JSON answer.
    pub async fn read_ok(&self, request: reqwest::RequestBuilder) -> Result<Value, LookupError> {
        match self.read(request).await? {
            (200..=299, Some(body)) => Ok(body),
            (status, _) => Err(LookupError::Unavailable(format!(
                "the lookup answered HTTP {status}"
            ))),
        }
    }
}

/// How long a `Retry-After` header asks the caller to wait: a number of
/// seconds, or an HTTP date (RFC 9110 §10.2.3). A date already past means
/// no wait; a header that is neither is ignored.
pub fn retry_after(
    headers: &reqwest::header::HeaderMap,
    now: std::time::SystemTime,
) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The words a rate-limit body carries, in the common shapes.
fn said(body: &Value) -> Option<String> {
    body.pointer("/error/message")
        .or_else(|| body.get("error").filter(|e| e.is_string()))
        .or_else(|| body.get("message"))
        .or_else(|| body.get("description"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn report_of_error(err: &reqwest::Error) -> CallReport {
    if err.is_connect() || err.is_builder() {
        // Could not connect, or the request could not even be built: it
        // never reached the system.
        CallReport::NotSent {
            reason: describe(err),
        }
    } else if err.is_timeout() {
        CallReport::TimedOut
    } else {
        CallReport::ResetAfterSend
    }
}

/// An error in words, without the URL (which may carry a token in a
/// query string).
fn describe(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect"
    } else {
        "the connection failed"
    };
    let mut source = std::error::Error::source(err);
    let mut detail = String::new();
    while let Some(cause) = source {
        detail = cause.to_string();
        source = cause.source();
    }
    if detail.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {detail}")
    }
}

/// A credential named in the tools file, read from the environment. It
/// stays a `SecretString` (redacted in `Debug`, zeroed when dropped) up to
/// the one place that sends it.
pub fn secret_from_env(
    connector: &str,
    field: &str,
    variable: &str,
) -> Result<secrecy::SecretString, String> {
    match std::env::var(variable) {
        Ok(value) if !value.trim().is_empty() => Ok(value.into()),
        _ => Err(format!(
            "connector `{connector}`, field `{field}`: the environment variable {variable} is not set"
        )),
    }
}

/// Reads a string field of a connector's settings.
pub fn setting<'a>(
    table: &'a toml::Table,
    connector: &str,
    field: &str,
) -> Result<&'a str, String> {
    match table.get(field) {
        Some(toml::Value::String(text)) if !text.trim().is_empty() => Ok(text),
        Some(_) => Err(format!(
            "connector `{connector}`, field `{field}`: must be a non-empty string"
        )),
        None => Err(format!(
            "connector `{connector}`: field `{field}` is missing"
        )),
    }
}

/// A base URL without its trailing slash, checked to be http(s).
pub fn base_url(table: &toml::Table, connector: &str) -> Result<String, String> {
    check_base_url(connector, setting(table, connector, "base_url")?)
}

/// `url` without its trailing slash, checked to be http(s).
pub fn check_base_url(connector: &str, url: &str) -> Result<String, String> {
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {
            Ok(url.trim_end_matches('/').to_owned())
        }
        _ => Err(format!(
            "connector `{connector}`, field `base_url`: {url:?} is not an http(s) URL"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_as_an_http_date() {
        // Sun, 06 Nov 1994 08:49:37 GMT, RFC 9110's example date.
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(
            retry_after(&with_retry_after("120"), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            retry_after(&with_retry_after("Sun, 06 Nov 1994 08:50:07 GMT"), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after(&with_retry_after("Sun, 06 Nov 1994 08:00:00 GMT"), now),
            Some(Duration::ZERO),
            "a date already past asks for no wait"
        );
        assert_eq!(retry_after(&with_retry_after("soon"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), SystemTime::now()), None);
    }
}
