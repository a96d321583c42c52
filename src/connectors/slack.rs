//! The Slack connector: posts messages with the step's key in their message
//! metadata, finds them again by that key, and deletes them as a
//! compensation.
//!
//! ```toml
//! [connectors.slack]
//! base_url = "https://slack.com"      # optional; the default
//! token_env = "SLACK_BOT_TOKEN"       # a bot token (scopes: chat:write,
//!                                     # channels:history, groups:history,
//!                                     # channels:read, groups:read)
//! history_pages = 5                   # optional: pages of 200 messages a
//!                                     # lookup reads, newest first
//! ```
//!
//! Operations:
//! - `slack.post` `{channel, text}` (or a correction's `{to: [channel], body}`):
//!   `chat.postMessage` with `metadata = {event_type: "saga_step",
//!   event_payload: {saga_key}}` (R5: Slack has no idempotency header, so the
//!   metadata is the only place the key travels). The external ref is
//!   `"<channel id>:<ts>"`, since a `ts` is unique only within its channel.
//! - `slack.delete` `{message_key, channel}`: finds the message posted with
//!   `message_key` and deletes it with `chat.delete`. A message already gone
//!   counts as deleted; its ref is `"<channel id>:<ts>"`, or
//!   `"<channel id>:absent:<message_key>"` when its `ts` can no longer be seen.
//!
//! Lookups (R7) read `conversations.history` with `include_all_metadata`
//! and match `metadata.event_payload.saga_key`. Channel names (`#support`)
//! are resolved to IDs with `conversations.list`, because the history
//! and delete methods take IDs only.
//!
//! Slack answers errors in-band (HTTP 200, `ok: false`); see
//! [`status_of_slack_error`] for how each becomes a status R4 can judge.

use super::wire::{self, Wire};
use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use async_trait::async_trait;
use reqwest::header::CONTENT_TYPE;
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;
use serde_json::{json, Value};

const POST: &str = "slack.post";
const DELETE: &str = "slack.delete";
const DEFAULT_BASE_URL: &str = "https://slack.com";
/// Slack recommends pages of no more than 200 for history.
const HISTORY_PAGE: u32 = 200;
const DEFAULT_HISTORY_PAGES: u32 = 5;
/// The `event_type` of the metadata every post carries.
pub const EVENT_TYPE: &str = "saga_step";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    base_url: Option<String>,
    token_env: String,
    history_pages: Option<u32>,
}

/// Posts and deletes Slack messages through the Web API.
#[derive(Clone, Debug)]
pub struct SlackConnector {
    wire: Wire,
    base_url: String,
    token: SecretString,
    history_pages: u32,
}

/// The signature Slack puts in `X-Slack-Signature` on every request it
/// sends an app: `v0=` and the hex HMAC-SHA256, keyed with the app's
/// signing secret, of `v0:TIMESTAMP:BODY` (the raw body, as sent).
pub fn request_signature(signing_secret: &str, timestamp: &str, body: &[u8]) -> String {
    use hmac::Mac;
    let mac = signing_mac(signing_secret, timestamp, body);
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

/// Whether `signature` (the `X-Slack-Signature` header) is Slack's for this
/// timestamp and body, compared in constant time.
pub fn signature_matches(
    signing_secret: &str,
    timestamp: &str,
    body: &[u8],
    signature: &str,
) -> bool {
    use hmac::Mac;
    let Some(given) = signature
        .strip_prefix("v0=")
        .and_then(|hex| hex::decode(hex).ok())
    else {
        return false;
    };
    signing_mac(signing_secret, timestamp, body)
        .verify_slice(&given)
        .is_ok()
}

fn signing_mac(signing_secret: &str, timestamp: &str, body: &[u8]) -> hmac::Hmac<sha2::Sha256> {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(signing_secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(format!("v0:{timestamp}:").as_bytes());
    mac.update(body);
    mac
}

/// What Slack's in-band `error` code means, as the HTTP status R4 judges.
///
/// | Slack error | status | R4 |
/// |---|---|---|
/// | `ratelimited`, `rate_limited`, `message_limit_exceeded` | 429 | not executed |
/// | `internal_error`, `fatal_error`, `request_timeout`, `service_unavailable` | 503 | unknown: Slack says part of the operation may have happened |
/// | `not_authed`, `invalid_auth`, `account_inactive`, `token_revoked`, `token_expired`, `org_login_required` | 401 | failed |
/// | `missing_scope`, `no_permission`, `not_allowed_token_type`, `access_denied`, `ekm_access_denied`, `not_in_channel`, `is_archived`, `cant_delete_message`, `restricted_action…`, `team_access_not_granted`, `compliance_exports_prevent_deletion` | 403 | failed |
/// | `channel_not_found`, `message_not_found`, `user_not_found` | 404 | failed |
/// | anything else (`msg_too_long`, `no_text`, `invalid_arguments`, `invalid_metadata_format` …) | 400 | failed |
///
/// Every listed "failed" code is Slack refusing before doing anything;
/// the 503 group is the one Slack documents as "it's possible some aspect
/// of the operation succeeded".
pub fn status_of_slack_error(code: &str) -> u16 {
    match code {
        "ratelimited" | "rate_limited" | "message_limit_exceeded" => 429,
        "internal_error" | "fatal_error" | "request_timeout" | "service_unavailable" => 503,
        "not_authed" | "invalid_auth" | "account_inactive" | "token_revoked" | "token_expired"
        | "org_login_required" => 401,
        "missing_scope"
        | "no_permission"
        | "not_allowed_token_type"
        | "access_denied"
        | "ekm_access_denied"
        | "not_in_channel"
        | "is_archived"
        | "cant_delete_message"
        | "team_access_not_granted"
        | "compliance_exports_prevent_deletion" => 403,
        code if code.starts_with("restricted_action") => 403,
        "channel_not_found" | "message_not_found" | "user_not_found" => 404,
        _ => 400,
    }
}

/// Turns an in-band refusal (`200 {"ok": false}`) into the status it
/// means; every other answer is reported as it came.
fn in_band(report: CallReport) -> CallReport {
    match report {
        CallReport::Answered {
            status: 200..=299,
            body: Some(body),
            idempotency_conflict,
        } if body.get("ok") == Some(&Value::Bool(false)) => {
            let code = body.get("error").and_then(Value::as_str).unwrap_or("");
            CallReport::Answered {
                status: status_of_slack_error(code),
                body: Some(body),
                idempotency_conflict,
            }
        }
        other => other,
    }
}

/// A channel ID (`C…` public, `G…` private, `D…` direct) rather than a name.
fn is_channel_id(channel: &str) -> bool {
    let mut chars = channel.chars();
    matches!(chars.next(), Some('C' | 'G' | 'D'))
        && channel.len() >= 9
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// Where the message with a key stands in a channel's history.
enum Found {
    Message(Value),
    /// The whole history was read and no live message carries the key.
    Absent,
}

/// What `slack.post` sends.
struct PostArgs {
    channel: String,
    text: String,
    /// Block Kit layout; `text` is then the notification's fallback.
    blocks: Option<Value>,
}

fn post_args(args: &Value) -> Result<PostArgs, String> {
    let text_field = |name: &str| args.get(name).and_then(Value::as_str).map(str::to_owned);
    if let Some(channel) = text_field("channel") {
        let text =
            text_field("text").ok_or("slack.post: argument `text` is missing or not a string")?;
        let blocks = match args.get("blocks") {
            None | Some(Value::Null) => None,
            Some(blocks @ Value::Array(_)) => Some(blocks.clone()),
            Some(_) => {
                return Err("slack.post: argument `blocks` must be an array of blocks".into())
            }
        };
        return Ok(PostArgs {
            channel,
            text,
            blocks,
        });
    }
    // The correction shape: `{to: [channel], body}`.
    let channels: Vec<&str> = match args.get("to") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => return Err("slack.post: argument `channel` (or `to`) is missing".into()),
    };
    let [channel] = channels.as_slice() else {
        return Err(format!(
            "slack.post: a message goes to exactly one channel; `to` names {}",
            channels.len()
        ));
    };
    let text = text_field("body")
        .or_else(|| text_field("text"))
        .ok_or("slack.post: argument `body` is missing or not a string")?;
    Ok(PostArgs {
        channel: (*channel).to_owned(),
        text,
        blocks: None,
    })
}

fn delete_args(args: &Value) -> Result<(String, String), String> {
    let field = |name: &str| {
        args.get(name)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or(format!(
                "slack.delete: argument `{name}` is missing or not a string"
            ))
    };
    Ok((field("message_key")?, field("channel")?))
}

/// A channel that could not be resolved to an ID.
enum ChannelTrouble {
    /// Slack has no such channel (or the bot cannot see it).
    NotFound,
    /// Slack could not be asked.
    Unavailable(String),
}

impl SlackConnector {
    pub fn from_settings(table: &toml::Table, wire: Wire) -> Result<Self, Vec<String>> {
        let settings: Settings =
            toml::Value::Table(table.clone())
                .try_into()
                .map_err(|e: toml::de::Error| {
                    vec![format!("connector `slack`: {}", e.to_string().trim())]
                })?;
        let mut mistakes = Vec::new();
        let base_url = wire::check_base_url(
            "slack",
            settings.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL),
        )
        .map_err(|e| mistakes.push(e))
        .unwrap_or_default();
        let token = wire::secret_from_env("slack", "token_env", &settings.token_env)
            .map_err(|e| mistakes.push(e))
            .unwrap_or_else(|()| SecretString::from(""));
        let history_pages = settings.history_pages.unwrap_or(DEFAULT_HISTORY_PAGES);
        if history_pages == 0 {
            mistakes
                .push("connector `slack`, field `history_pages`: must be at least 1".to_owned());
        }
        if mistakes.is_empty() {
            Ok(SlackConnector {
                wire,
                base_url,
                token,
                history_pages,
            })
        } else {
            Err(mistakes)
        }
    }

    pub fn operations(&self) -> Vec<String> {
        vec![POST.to_owned(), DELETE.to_owned()]
    }

    fn get(&self, method: &str) -> reqwest::RequestBuilder {
        self.wire
            .client()
            .get(format!("{}/api/{method}", self.base_url))
            .bearer_auth(self.token.expose_secret())
    }

    fn post_json(&self, method: &str, body: &Value) -> reqwest::RequestBuilder {
        self.wire
            .client()
            .post(format!("{}/api/{method}", self.base_url))
            .bearer_auth(self.token.expose_secret())
            .header(CONTENT_TYPE, "application/json; charset=utf-8")
            .body(body.to_string())
    }

    /// A Web API read: `ok: true` or the reason it could not answer.
    async fn read(
        &self,
        request: reqwest::RequestBuilder,
        method: &str,
    ) -> Result<Result<Value, String>, LookupError> {
        match self.wire.read(request).await? {
            (200, Some(body)) if body.get("ok") == Some(&Value::Bool(true)) => Ok(Ok(body)),
            (200, Some(body)) => Ok(Err(body
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("unknown_error")
                .to_owned())),
            (status, _) => Err(LookupError::Unavailable(format!(
                "{method} answered HTTP {status}"
            ))),
        }
    }

    /// The channel's ID: as given when it is one, else found by name.
    async fn channel_id(&self, channel: &str) -> Result<String, ChannelTrouble> {
        if is_channel_id(channel) {
            return Ok(channel.to_owned());
        }
        let name = channel.trim_start_matches('#');
        let mut cursor = String::new();
        loop {
            let mut query = vec![
                ("types", "public_channel,private_channel".to_owned()),
                ("exclude_archived", "false".to_owned()),
                ("limit", "1000".to_owned()),
            ];
            if !cursor.is_empty() {
                query.push(("cursor", cursor.clone()));
            }
            let body = match self
                .read(
                    self.get("conversations.list").query(&query),
                    "conversations.list",
                )
                .await
            {
                Ok(Ok(body)) => body,
                Ok(Err(code)) => {
                    return Err(ChannelTrouble::Unavailable(format!(
                        "conversations.list said {code}"
                    )))
                }
                Err(e) => return Err(ChannelTrouble::Unavailable(e.to_string())),
            };
            let channels = body.get("channels").and_then(Value::as_array);
            let found = channels
                .into_iter()
                .flatten()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(name));
            if let Some(id) = found.and_then(|c| c.get("id")).and_then(Value::as_str) {
                return Ok(id.to_owned());
            }
            cursor = next_cursor(&body);
            if cursor.is_empty() {
                return Err(ChannelTrouble::NotFound);
            }
        }
    }

    /// Reads the channel's history, newest first, for the live message that
    /// carries `key` in its metadata. `Ok(None)` when Slack says the
    /// channel does not exist.
    async fn find(&self, channel_id: &str, key: &str) -> Result<Option<Found>, LookupError> {
        let mut cursor = String::new();
        for _ in 0..self.history_pages {
            let mut query = vec![
                ("channel", channel_id.to_owned()),
                ("include_all_metadata", "true".to_owned()),
                ("limit", HISTORY_PAGE.to_string()),
            ];
            if !cursor.is_empty() {
                query.push(("cursor", cursor.clone()));
            }
            let body = match self
                .read(
                    self.get("conversations.history").query(&query),
                    "conversations.history",
                )
                .await?
            {
                Ok(body) => body,
                Err(code) if code == "channel_not_found" => return Ok(None),
                Err(code) => {
                    return Err(LookupError::Unavailable(format!(
                        "conversations.history said {code}"
                    )))
                }
            };
            let messages = body.get("messages").and_then(Value::as_array);
            let found = messages.into_iter().flatten().find(|m| {
                m.pointer("/metadata/event_payload/saga_key")
                    .and_then(Value::as_str)
                    == Some(key)
                    && m.get("subtype").and_then(Value::as_str) != Some("tombstone")
            });
            if let Some(message) = found {
                return Ok(Some(Found::Message(message.clone())));
            }
            cursor = next_cursor(&body);
            let has_more = body.get("has_more").and_then(Value::as_bool) == Some(true);
            if !has_more || cursor.is_empty() {
                return Ok(Some(Found::Absent));
            }
        }
        // Older messages remain unread: absence cannot be claimed.
        Err(LookupError::Unavailable(format!(
            "no message with this key among the newest {} messages of {channel_id}, and older ones were not read (raise history_pages)",
            self.history_pages * HISTORY_PAGE
        )))
    }

    async fn post(&self, key: &str, args: &Value) -> CallReport {
        let args = match post_args(args) {
            Ok(args) => args,
            Err(reason) => return CallReport::NotSent { reason },
        };
        let mut body = json!({
            "channel": args.channel,
            "text": args.text,
            "metadata": {"event_type": EVENT_TYPE, "event_payload": {"saga_key": key}},
        });
        if let Some(blocks) = args.blocks {
            body["blocks"] = blocks;
        }
        in_band(
            self.wire
                .send(self.post_json("chat.postMessage", &body))
                .await,
        )
    }

    /// Rewrites a message this connector posted (`chat.update`), found by
    /// its reference (`CHANNEL_ID:TS`). Rewriting with the same content
    /// again changes nothing, so a retry is safe.
    pub async fn update(
        &self,
        message_ref: &str,
        text: &str,
        blocks: &Value,
    ) -> Result<(), String> {
        let (channel, ts) = message_ref
            .split_once(':')
            .ok_or_else(|| format!("`{message_ref}` is not a Slack message reference"))?;
        let body = json!({"channel": channel, "ts": ts, "text": text, "blocks": blocks});
        match self
            .read(self.post_json("chat.update", &body), "chat.update")
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(code)) => Err(format!("chat.update said {code}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A Slack user's email address (`users.info`; Slack shows it only to
    /// an app with the `users:read.email` scope): `Ok(None)` for a user
    /// with none, or one Slack does not know.
    pub async fn user_email(&self, user: &str) -> Result<Option<String>, String> {
        let request = self.get("users.info").query(&[("user", user)]);
        match self.read(request, "users.info").await {
            Ok(Ok(body)) => Ok(body
                .pointer("/user/profile/email")
                .and_then(Value::as_str)
                .filter(|email| !email.is_empty())
                .map(str::to_owned)),
            Ok(Err(code)) if code == "user_not_found" => Ok(None),
            Ok(Err(code)) => Err(format!("users.info said {code}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Answers a person privately through an interaction's `response_url`
    /// (an ephemeral message only they see).
    pub async fn respond(&self, response_url: &str, text: &str) -> Result<(), String> {
        let body = json!({"response_type": "ephemeral", "replace_original": false, "text": text});
        let request = self
            .wire
            .client()
            .post(response_url)
            .header(CONTENT_TYPE, "application/json; charset=utf-8")
            .body(body.to_string());
        match self.wire.read(request).await {
            Ok((200..=299, _)) => Ok(()),
            Ok((status, _)) => Err(format!("the response URL answered HTTP {status}")),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn delete(&self, args: &Value) -> CallReport {
        let (message_key, channel) = match delete_args(args) {
            Ok(args) => args,
            Err(reason) => return CallReport::NotSent { reason },
        };
        let channel_id = match self.channel_id(&channel).await {
            Ok(id) => id,
            Err(ChannelTrouble::NotFound) => return channel_not_found(),
            Err(ChannelTrouble::Unavailable(why)) => {
                return CallReport::NotSent {
                    reason: format!("could not find channel {channel}: {why}"),
                }
            }
        };
        let ts = match self.find(&channel_id, &message_key).await {
            Ok(Some(Found::Message(message))) => {
                message.get("ts").and_then(Value::as_str).map(str::to_owned)
            }
            Ok(Some(Found::Absent)) => None,
            Ok(None) => return channel_not_found(),
            Err(e) => {
                return CallReport::NotSent {
                    reason: format!("could not look for the message to delete: {e}"),
                }
            }
        };
        let Some(ts) = ts else {
            return already_deleted(&channel_id, None, &message_key);
        };
        let request = self.post_json("chat.delete", &json!({"channel": channel_id, "ts": ts}));
        match in_band(self.wire.send(request).await) {
            // Deleted between our look and the call: the goal holds.
            CallReport::Answered {
                status: 404,
                body: Some(body),
                ..
            } if body.get("error").and_then(Value::as_str) == Some("message_not_found") => {
                already_deleted(&channel_id, Some(&ts), &message_key)
            }
            other => other,
        }
    }

    async fn look_up(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        let (wanted, channel) = match operation {
            POST => {
                let args = post_args(args).map_err(LookupError::Unavailable)?;
                (key.to_owned(), args.channel)
            }
            DELETE => delete_args(args).map_err(LookupError::Unavailable)?,
            _ => return Err(LookupError::Unsupported),
        };
        let channel_id = match self.channel_id(&channel).await {
            Ok(id) => Some(id),
            Err(ChannelTrouble::NotFound) => None,
            Err(ChannelTrouble::Unavailable(why)) => return Err(LookupError::Unavailable(why)),
        };
        let found = match &channel_id {
            Some(id) => self.find(id, &wanted).await?,
            None => None,
        };
        Ok(match (operation, found) {
            (POST, Some(Found::Message(message))) => {
                let channel_id = channel_id.unwrap_or_default();
                let ts = message.get("ts").and_then(Value::as_str).unwrap_or("");
                Lookup::FoundSucceeded {
                    external_ref: format!("{channel_id}:{ts}"),
                    result: json!({"ok": true, "channel": channel_id, "ts": ts, "message": message}),
                }
            }
            // No such channel: the post cannot have landed.
            (POST, _) => Lookup::NotFound,
            (_, Some(Found::Message(_))) => Lookup::NotFound,
            (_, Some(Found::Absent)) => {
                let channel_id = channel_id.unwrap_or_default();
                let body = already_deleted_body(&channel_id, None, &wanted);
                Lookup::FoundSucceeded {
                    external_ref: delete_ref(&body).unwrap_or_default(),
                    result: body,
                }
            }
            (_, None) => Lookup::FoundFailed {
                error: format!("channel {channel} does not exist"),
            },
        })
    }
}

fn next_cursor(body: &Value) -> String {
    body.pointer("/response_metadata/next_cursor")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

fn channel_not_found() -> CallReport {
    CallReport::Answered {
        status: status_of_slack_error("channel_not_found"),
        body: Some(json!({"ok": false, "error": "channel_not_found"})),
        idempotency_conflict: false,
    }
}

fn already_deleted_body(channel_id: &str, ts: Option<&str>, message_key: &str) -> Value {
    json!({
        "ok": true,
        "channel": channel_id,
        "ts": ts,
        "message_key": message_key,
        "already_deleted": true,
    })
}

/// "Already gone" is what a delete wants: report it as done.
fn already_deleted(channel_id: &str, ts: Option<&str>, message_key: &str) -> CallReport {
    CallReport::Answered {
        status: 200,
        body: Some(already_deleted_body(channel_id, ts, message_key)),
        idempotency_conflict: false,
    }
}

fn post_ref(body: &Value) -> Option<String> {
    if body.get("ok") != Some(&Value::Bool(true)) {
        return None;
    }
    let channel = body.get("channel").and_then(Value::as_str)?;
    let ts = body.get("ts").and_then(Value::as_str)?;
    (!channel.is_empty() && !ts.is_empty()).then(|| format!("{channel}:{ts}"))
}

fn delete_ref(body: &Value) -> Option<String> {
    if let Some(reference) = post_ref(body) {
        return Some(reference);
    }
    let absent = body.get("ok") == Some(&Value::Bool(true))
        && body.get("already_deleted") == Some(&Value::Bool(true));
    let channel = body.get("channel").and_then(Value::as_str)?;
    let key = body.get("message_key").and_then(Value::as_str)?;
    absent.then(|| format!("{channel}:absent:{key}"))
}

#[async_trait]
impl Connector for SlackConnector {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        match operation {
            POST => self.post(key, args).await,
            DELETE => self.delete(args).await,
            other => CallReport::NotSent {
                reason: format!("the Slack connector has no operation {other}"),
            },
        }
    }

    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        self.look_up(operation, key, args).await
    }

    fn has_lookup(&self, operation: &str) -> bool {
        matches!(operation, POST | DELETE)
    }

    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        match operation {
            POST => post_ref(body),
            DELETE => delete_ref(body),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_signature_is_the_v0_hmac_of_timestamp_and_body() {
        // Computed independently (Python's hmac module) for these inputs.
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&command=%2Fweather";
        assert_eq!(
            request_signature("8f742231b10e8888abcd99yyyzzz85a5", "1531420618", body),
            "v0=6b8b0b4cff7baf56906b6a54056df891b9cc8292bc01770e0e1d6dd9bc623977"
        );
        let right = "v0=6b8b0b4cff7baf56906b6a54056df891b9cc8292bc01770e0e1d6dd9bc623977";
        assert!(signature_matches(
            "8f742231b10e8888abcd99yyyzzz85a5",
            "1531420618",
            body,
            right
        ));
        assert!(!signature_matches(
            "another secret",
            "1531420618",
            body,
            right
        ));
        assert!(!signature_matches(
            "8f742231b10e8888abcd99yyyzzz85a5",
            "1531420619",
            body,
            right
        ));
        assert!(!signature_matches(
            "8f742231b10e8888abcd99yyyzzz85a5",
            "1531420618",
            body,
            "6b8b0b"
        ));
    }

    #[test]
    fn in_band_errors_become_the_status_they_mean() {
        let refusal = |code: &str| CallReport::Answered {
            status: 200,
            body: Some(json!({"ok": false, "error": code})),
            idempotency_conflict: false,
        };
        let status = |report: CallReport| match report {
            CallReport::Answered { status, .. } => status,
            other => panic!("{other:?}"),
        };
        assert_eq!(status(in_band(refusal("channel_not_found"))), 404);
        assert_eq!(status(in_band(refusal("invalid_auth"))), 401);
        assert_eq!(status(in_band(refusal("not_in_channel"))), 403);
        assert_eq!(status(in_band(refusal("msg_too_long"))), 400);
        assert_eq!(status(in_band(refusal("ratelimited"))), 429);
        assert_eq!(status(in_band(refusal("internal_error"))), 503);
        assert_eq!(status(in_band(refusal("fatal_error"))), 503);
        let fine = CallReport::Answered {
            status: 200,
            body: Some(json!({"ok": true, "channel": "C0GENERAL1", "ts": "1.000001"})),
            idempotency_conflict: false,
        };
        assert_eq!(in_band(fine.clone()), fine);
    }

    #[test]
    fn channel_ids_are_told_from_names() {
        assert!(is_channel_id("C0SUPPORT1"));
        assert!(is_channel_id("G0FINANCE1"));
        assert!(!is_channel_id("#support"));
        assert!(!is_channel_id("support"));
        assert!(!is_channel_id("Cats"));
    }

    #[test]
    fn a_post_takes_the_correction_shape_with_one_channel() {
        let args = post_args(&json!({"to": ["#support"], "body": "Sorry"})).unwrap();
        assert_eq!(
            (args.channel.as_str(), args.text.as_str()),
            ("#support", "Sorry")
        );
        assert!(post_args(&json!({"to": ["#a", "#b"], "body": "x"})).is_err());
        assert!(post_args(&json!({"channel": "C0SUPPORT1"})).is_err());
    }

    #[test]
    fn the_ref_needs_ok_channel_and_ts() {
        assert_eq!(
            post_ref(&json!({"ok": true, "channel": "C1", "ts": "2.000001"})),
            Some("C1:2.000001".into())
        );
        assert_eq!(post_ref(&json!({"ok": true})), None);
        assert_eq!(
            post_ref(&json!({"ok": false, "channel": "C1", "ts": "2"})),
            None
        );
        assert_eq!(
            delete_ref(&already_deleted_body("C1", None, "k1")),
            Some("C1:absent:k1".into())
        );
    }
}
