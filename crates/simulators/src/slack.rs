//! A Slack Web API simulator: the methods the Slack connector calls
//! (`chat.postMessage`, `chat.update`, `chat.delete`,
//! `conversations.history`, `conversations.list`) under `/api/`, answering
//! the way Slack does, and the app's interactivity (a person pressing a
//! message's button, sent signed to the app's request URL: in
//! `super::slack_app`, whose `router` serves the whole simulator).
//!
//! Slack reports almost every failure in-band: HTTP 200 with
//! `{"ok": false, "error": "<code>"}`. Only rate limiting changes the status
//! (429 with `Retry-After` and `"error": "ratelimited"`). The simulator
//! keeps that shape, for its own refusals and for injected faults alike (see
//! [`slack_error`]).
//!
//! Authentication is a bearer token: none → `not_authed`; one that does not
//! look like a Slack token (`xoxb-…`, `xoxp-…`) → `invalid_auth`. The
//! workspace has a fixed set of channels (see [`seed_channels`]); the bot is
//! not a member of `#random` (→ `not_in_channel`) and `#old-announcements`
//! is archived (→ `is_archived`).
//!
//! Slack has no idempotency key, so a repeated post is a second message.
//! Message metadata (`metadata.event_payload`) is stored and shown by
//! `conversations.history` only with `include_all_metadata=true`; messages
//! younger than the search lag are not listed yet.

use super::{mount, ErrorShape, SimState};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest message text Slack takes (`msg_too_long` beyond it).
const MAX_TEXT_CHARS: usize = 40_000;
const BOT_USER: &str = "U0SAGABOT";
const BOT_ID: &str = "B0SAGABOT";
const APP_ID: &str = "A0SAGAAPP";
const TEAM_ID: &str = "T0SAGASIM";

/// The Slack Web API's routes, with the fault layer and `/_sim` routes,
/// and the workspace they share with the app's interactivity
/// ([`super::slack_app::router`] serves both).
pub(super) fn web_api(sim: &SimState) -> (Router, SlackSim) {
    let state = SlackSim {
        sim: sim.clone(),
        workspace: Arc::new(Mutex::new(Workspace::new())),
    };
    let routes = Router::new()
        .route("/api/chat.postMessage", post(post_message))
        .route("/api/chat.update", post(update_message))
        .route("/api/chat.delete", post(delete_message))
        .route(
            "/api/conversations.history",
            get(history).post(history_form),
        )
        .route(
            "/api/conversations.list",
            get(list_channels).post(list_channels_form),
        )
        .route("/api/users.info", get(user_info).post(user_info_form))
        .with_state(state.clone());
    (mount(routes, sim, slack_error as ErrorShape), state)
}

/// An error in Slack's shape. Slack says "no" in-band (HTTP 200,
/// `ok: false`); only rate limits (429) and server trouble (5xx) change the
/// status. `message` is used as the error code when it is one
/// (`channel_not_found`); otherwise a code is chosen from the status.
pub fn slack_error(status: StatusCode, message: &str) -> Response {
    let looks_like_code =
        !message.is_empty() && message.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    let code = if status == StatusCode::TOO_MANY_REQUESTS {
        "ratelimited"
    } else if looks_like_code {
        message
    } else {
        match status.as_u16() {
            401 => "invalid_auth",
            403 => "missing_scope",
            404 => "channel_not_found",
            503 => "service_unavailable",
            500..=599 => "internal_error",
            _ => "invalid_arguments",
        }
    };
    let status = if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        status
    } else {
        StatusCode::OK
    };
    (status, Json(json!({"ok": false, "error": code}))).into_response()
}

fn refuse(code: &str) -> Response {
    slack_error(StatusCode::OK, code)
}

#[derive(Clone)]
pub(super) struct SlackSim {
    pub(super) sim: SimState,
    workspace: Arc<Mutex<Workspace>>,
}

/// A posted message as a button press sees it.
pub(super) struct SeenMessage {
    pub channel_id: &'static str,
    pub channel_name: &'static str,
    pub message: Value,
    /// The blocks as first posted: what a client that has not redrawn
    /// the message still shows.
    pub first_blocks: Option<Value>,
}

impl SlackSim {
    /// The live message posted with `saga_key` in its metadata.
    pub(super) fn message_with_key(&self, saga_key: &str) -> Option<SeenMessage> {
        let workspace = self.workspace.lock().expect("slack workspace lock");
        workspace.channels.iter().find_map(|channel| {
            channel
                .messages
                .iter()
                .find(|m| m.saga_key() == Some(saga_key))
                .map(|m| SeenMessage {
                    channel_id: channel.id,
                    channel_name: channel.name,
                    message: m.to_json(true),
                    first_blocks: m.first_blocks.clone(),
                })
        })
    }
}

struct Workspace {
    members: Vec<Member>,
    channels: Vec<Channel>,
    /// The last `ts` handed out, in microseconds: every message gets a
    /// later one, as Slack's are unique per channel.
    last_ts_micros: u128,
}

struct Channel {
    id: &'static str,
    name: &'static str,
    is_private: bool,
    is_member: bool,
    is_archived: bool,
    /// Oldest first.
    messages: Vec<StoredMessage>,
}

struct StoredMessage {
    ts: String,
    text: String,
    /// Block Kit layout, as posted or last updated.
    blocks: Option<Value>,
    /// When it was last updated (`chat.update`).
    edited: Option<String>,
    first_blocks: Option<Value>,
    metadata: Option<Value>,
    /// When it was posted, on the simulator's clock (for search lag).
    posted_at: Duration,
}

impl StoredMessage {
    fn saga_key(&self) -> Option<&str> {
        self.metadata
            .as_ref()?
            .pointer("/event_payload/saga_key")?
            .as_str()
    }

    fn to_json(&self, with_metadata: bool) -> Value {
        let mut message = json!({
            "type": "message",
            "subtype": "bot_message",
            "text": self.text,
            "ts": self.ts,
            "user": BOT_USER,
            "bot_id": BOT_ID,
            "app_id": APP_ID,
            "team": TEAM_ID,
        });
        if let (true, Some(metadata)) = (with_metadata, &self.metadata) {
            message["metadata"] = metadata.clone();
        }
        if let Some(blocks) = &self.blocks {
            message["blocks"] = blocks.clone();
        }
        if let Some(ts) = &self.edited {
            message["edited"] = json!({"user": BOT_USER, "ts": ts});
        }
        message
    }
}

/// The channels every simulated workspace starts with.
/// A member of the simulated workspace, as `users.info` shows them.
struct Member {
    id: &'static str,
    name: &'static str,
    real_name: &'static str,
    /// What `profile.email` says; `None` as for a bot, or when the app
    /// lacks the `users:read.email` scope.
    email: Option<&'static str>,
    is_bot: bool,
}

/// The workspace's people: two whose email names a dashboard account in
/// the tests (`ana@example.com`, `lead@example.com`), one without an
/// email (a bot).
fn seed_members() -> Vec<Member> {
    vec![
        Member {
            id: "U0ANASIM01",
            name: "ana",
            real_name: "Ana Lima",
            email: Some("ana@example.com"),
            is_bot: false,
        },
        Member {
            id: "U0LEADSIM1",
            name: "lead",
            real_name: "Lee Adams",
            email: Some("lead@example.com"),
            is_bot: false,
        },
        Member {
            id: "U0NOMAIL01",
            name: "helper-bot",
            real_name: "Helper",
            email: None,
            is_bot: true,
        },
    ]
}

fn seed_channels() -> Vec<Channel> {
    let channel = |id, name, is_private, is_member, is_archived| Channel {
        id,
        name,
        is_private,
        is_member,
        is_archived,
        messages: Vec::new(),
    };
    vec![
        channel("C0GENERAL1", "general", false, true, false),
        channel("C0SUPPORT1", "support", false, true, false),
        channel("C0ALERTS01", "alerts", false, true, false),
        channel("G0FINANCE1", "finance", true, true, false),
        channel("C0RANDOM01", "random", false, false, false),
        channel("C0ARCHIVE1", "old-announcements", false, true, true),
    ]
}

impl Workspace {
    fn new() -> Self {
        Workspace {
            members: seed_members(),
            channels: seed_channels(),
            last_ts_micros: 0,
        }
    }

    /// A channel by ID, or by name (`#support` or `support`) when
    /// `by_name` (only `chat.postMessage` takes names).
    fn channel_mut(&mut self, wanted: &str, by_name: bool) -> Option<&mut Channel> {
        let name = wanted.trim_start_matches('#');
        self.channels
            .iter_mut()
            .find(|c| c.id == wanted || (by_name && c.name == name))
    }

    fn next_ts(&mut self) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0);
        let micros = now.max(self.last_ts_micros + 1);
        self.last_ts_micros = micros;
        format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
    }
}

/// A Slack error code (`channel_not_found`), answered with [`refuse`].
type Refusal = &'static str;

/// The bearer token check every method starts with.
fn authorised(headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err("not_authed");
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    if token.is_empty() {
        Err("not_authed")
    } else if (token.starts_with("xoxb-") || token.starts_with("xoxp-")) && token.len() > 8 {
        Ok(())
    } else {
        Err("invalid_auth")
    }
}

/// The arguments of a POST: Slack takes JSON or a form, so both are read.
/// Form values are strings; JSON keeps its types.
fn arguments(headers: &HeaderMap, body: &[u8]) -> Result<Map<String, Value>, Refusal> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if body.is_empty() {
        return Ok(Map::new());
    }
    if content_type.starts_with("application/json") {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(map),
            _ => Err("invalid_json"),
        }
    } else if content_type.starts_with("application/x-www-form-urlencoded") {
        Ok(form_fields(body)
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect())
    } else if content_type.is_empty() {
        Err("missing_post_type")
    } else {
        Err("invalid_post_type")
    }
}

fn form_fields(body: &[u8]) -> HashMap<String, String> {
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(&part.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(pair), String::new()),
        })
        .collect()
}

fn text_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    args.get(name).and_then(Value::as_str)
}

/// `blocks` may come as an array (JSON body) or as a JSON string (form);
/// Slack refuses anything else as `invalid_blocks`.
fn blocks_arg(args: &Map<String, Value>) -> Result<Option<Value>, Refusal> {
    let blocks = match args.get("blocks") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(text)) if text.is_empty() => return Ok(None),
        Some(Value::String(text)) => serde_json::from_str(text).map_err(|_| "invalid_blocks")?,
        Some(other) => other.clone(),
    };
    let well_formed = blocks.as_array().is_some_and(|blocks| {
        blocks.len() <= 50
            && blocks
                .iter()
                .all(|b| b.get("type").is_some_and(Value::is_string))
    });
    if well_formed {
        Ok(Some(blocks))
    } else {
        Err("invalid_blocks")
    }
}

/// `metadata` may come as an object (JSON body) or as a JSON string (form).
fn metadata_arg(args: &Map<String, Value>) -> Result<Option<Value>, Refusal> {
    let metadata = match args.get("metadata") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(text)) if text.is_empty() => return Ok(None),
        Some(Value::String(text)) => {
            serde_json::from_str(text).map_err(|_| "invalid_metadata_format")?
        }
        Some(other) => other.clone(),
    };
    let well_formed = metadata.get("event_type").is_some_and(Value::is_string)
        && metadata.get("event_payload").is_some_and(Value::is_object);
    if well_formed {
        Ok(Some(json!({
            "event_type": metadata["event_type"],
            "event_payload": metadata["event_payload"],
        })))
    } else {
        Err("invalid_metadata_format")
    }
}

async fn post_message(State(slack): State<SlackSim>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(code) = authorised(&headers) {
        return refuse(code);
    }
    let args = match arguments(&headers, &body) {
        Ok(args) => args,
        Err(code) => return refuse(code),
    };
    let metadata = match metadata_arg(&args) {
        Ok(metadata) => metadata,
        Err(code) => return refuse(code),
    };
    let blocks = match blocks_arg(&args) {
        Ok(blocks) => blocks,
        Err(code) => return refuse(code),
    };
    let text = text_arg(&args, "text").unwrap_or("").to_owned();
    let mut workspace = slack.workspace.lock().expect("slack workspace lock");
    let ts = workspace.next_ts();
    let Some(channel) = text_arg(&args, "channel").and_then(|c| workspace.channel_mut(c, true))
    else {
        return refuse("channel_not_found");
    };
    if channel.is_archived {
        return refuse("is_archived");
    }
    if !channel.is_member {
        return refuse("not_in_channel");
    }
    if text.trim().is_empty() {
        return refuse("no_text");
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return refuse("msg_too_long");
    }
    let message = StoredMessage {
        ts: ts.clone(),
        text,
        first_blocks: blocks.clone(),
        blocks,
        edited: None,
        metadata,
        posted_at: slack.sim.clock.now(),
    };
    let answer = json!({
        "ok": true,
        "channel": channel.id,
        "ts": ts,
        "message": message.to_json(true),
    });
    slack.sim.ledger.record(
        "slack",
        "message.posted",
        message.saga_key(),
        &format!("{}:{}", channel.id, ts),
        json!({"channel": channel.id, "ts": ts, "text": message.text, "blocks": message.blocks}),
    );
    channel.messages.push(message);
    Json(answer).into_response()
}

/// `chat.update`: rewrites a message's text and blocks, by channel ID and
/// `ts`, as Slack does (the metadata stays).
async fn update_message(
    State(slack): State<SlackSim>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(code) = authorised(&headers) {
        return refuse(code);
    }
    let args = match arguments(&headers, &body) {
        Ok(args) => args,
        Err(code) => return refuse(code),
    };
    let blocks = match blocks_arg(&args) {
        Ok(blocks) => blocks,
        Err(code) => return refuse(code),
    };
    let text = text_arg(&args, "text").unwrap_or("").to_owned();
    if text.trim().is_empty() && blocks.is_none() {
        return refuse("no_text");
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return refuse("msg_too_long");
    }
    let mut workspace = slack.workspace.lock().expect("slack workspace lock");
    let edited = workspace.next_ts();
    let Some(channel) = text_arg(&args, "channel").and_then(|c| workspace.channel_mut(c, false))
    else {
        return refuse("channel_not_found");
    };
    let ts = text_arg(&args, "ts").unwrap_or("");
    let Some(message) = channel.messages.iter_mut().find(|m| m.ts == ts) else {
        return refuse("message_not_found");
    };
    message.text = text;
    if blocks.is_some() {
        message.blocks = blocks;
    }
    message.edited = Some(edited);
    slack.sim.ledger.record(
        "slack",
        "message.updated",
        message.saga_key(),
        &format!("{}:{}", channel.id, message.ts),
        json!({"channel": channel.id, "ts": message.ts, "text": message.text, "blocks": message.blocks}),
    );
    Json(json!({
        "ok": true,
        "channel": channel.id,
        "ts": message.ts,
        "text": message.text,
        "message": message.to_json(false),
    }))
    .into_response()
}

async fn delete_message(
    State(slack): State<SlackSim>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(code) = authorised(&headers) {
        return refuse(code);
    }
    let args = match arguments(&headers, &body) {
        Ok(args) => args,
        Err(code) => return refuse(code),
    };
    let mut workspace = slack.workspace.lock().expect("slack workspace lock");
    let Some(channel) = text_arg(&args, "channel").and_then(|c| workspace.channel_mut(c, false))
    else {
        return refuse("channel_not_found");
    };
    let ts = text_arg(&args, "ts").unwrap_or("");
    let Some(position) = channel.messages.iter().position(|m| m.ts == ts) else {
        return refuse("message_not_found");
    };
    let message = channel.messages.remove(position);
    slack.sim.ledger.record(
        "slack",
        "message.deleted",
        message.saga_key(),
        &format!("{}:{}", channel.id, message.ts),
        json!({"channel": channel.id, "ts": message.ts}),
    );
    Json(json!({"ok": true, "channel": channel.id, "ts": message.ts})).into_response()
}

fn flag(args: &HashMap<String, String>, name: &str) -> bool {
    matches!(args.get(name).map(String::as_str), Some("true") | Some("1"))
}

/// A message `ts` (`"1712345678.000100"`) in microseconds, for ordering
/// and the `oldest` / `latest` bounds.
fn ts_value(ts: &str) -> u128 {
    let (seconds, fraction) = ts.split_once('.').unwrap_or((ts, ""));
    let fraction: String = fraction.chars().chain("000000".chars()).take(6).collect();
    let seconds: u128 = seconds.parse().unwrap_or(0);
    seconds * 1_000_000 + fraction.parse::<u128>().unwrap_or(0)
}

async fn history_form(State(slack): State<SlackSim>, headers: HeaderMap, body: Bytes) -> Response {
    history(State(slack), headers, Query(form_fields(&body))).await
}

async fn history(
    State(slack): State<SlackSim>,
    headers: HeaderMap,
    Query(args): Query<HashMap<String, String>>,
) -> Response {
    if let Err(code) = authorised(&headers) {
        return refuse(code);
    }
    let lag = slack.sim.faults.search_lag();
    let now = slack.sim.clock.now();
    let with_metadata = flag(&args, "include_all_metadata");
    let limit = args
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(100)
        .min(999);
    let inclusive = flag(&args, "inclusive");
    let oldest = args.get("oldest").map(|t| ts_value(t));
    let latest = args.get("latest").map(|t| ts_value(t));
    // The cursor names the last message of the previous page: the next
    // page starts just before it, so new messages do not shift pages.
    let before = args
        .get("cursor")
        .filter(|c| !c.is_empty())
        .map(|c| c.strip_prefix("next_ts:").map(str::to_owned));
    let before = match before {
        Some(None) => return refuse("invalid_cursor"),
        Some(Some(ts)) => Some(ts_value(&ts)),
        None => None,
    };
    let mut workspace = slack.workspace.lock().expect("slack workspace lock");
    let Some(channel) = args
        .get("channel")
        .and_then(|c| workspace.channel_mut(c, false))
    else {
        return refuse("channel_not_found");
    };
    if !channel.is_member {
        return refuse("not_in_channel");
    }
    let visible: Vec<&StoredMessage> = channel
        .messages
        .iter()
        .rev()
        .filter(|m| now.saturating_sub(m.posted_at) >= lag)
        .filter(|m| {
            let ts = ts_value(&m.ts);
            let after_oldest = oldest.is_none_or(|o| ts > o || (inclusive && ts == o));
            let before_latest = latest.is_none_or(|l| ts < l || (inclusive && ts == l));
            let before_cursor = before.is_none_or(|b| ts < b);
            after_oldest && before_latest && before_cursor
        })
        .collect();
    let has_more = visible.len() > limit;
    let page: Vec<Value> = visible
        .iter()
        .take(limit)
        .map(|m| m.to_json(with_metadata))
        .collect();
    let mut answer = json!({
        "ok": true,
        "messages": page,
        "has_more": has_more,
        "pin_count": 0,
        "channel_actions_ts": null,
        "channel_actions_count": 0,
    });
    if has_more {
        let last = &visible[limit - 1].ts;
        answer["response_metadata"] = json!({"next_cursor": format!("next_ts:{last}")});
    }
    Json(answer).into_response()
}

async fn user_info_form(
    State(slack): State<SlackSim>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    user_info(State(slack), headers, Query(form_fields(&body))).await
}

/// `users.info`: one member by ID, with `profile.email` when they have one.
async fn user_info(
    State(slack): State<SlackSim>,
    headers: HeaderMap,
    Query(args): Query<HashMap<String, String>>,
) -> Response {
    if let Err(code) = authorised(&headers) {
        return refuse(code);
    }
    let Some(wanted) = args.get("user").filter(|u| !u.is_empty()) else {
        return refuse("user_not_found");
    };
    let workspace = slack.workspace.lock().expect("slack workspace lock");
    let Some(member) = workspace.members.iter().find(|m| m.id == wanted) else {
        return refuse("user_not_found");
    };
    let mut profile = json!({
        "real_name": member.real_name,
        "display_name": member.name,
    });
    if let Some(email) = member.email {
        profile["email"] = json!(email);
    }
    Json(json!({
        "ok": true,
        "user": {
            "id": member.id,
            "team_id": TEAM_ID,
            "name": member.name,
            "deleted": false,
            "real_name": member.real_name,
            "is_bot": member.is_bot,
            "profile": profile,
        },
    }))
    .into_response()
}

async fn list_channels_form(
    State(slack): State<SlackSim>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    list_channels(State(slack), headers, Query(form_fields(&body))).await
}

async fn list_channels(
    State(slack): State<SlackSim>,
    headers: HeaderMap,
    Query(args): Query<HashMap<String, String>>,
) -> Response {
    if let Err(code) = authorised(&headers) {
        return refuse(code);
    }
    let types = args
        .get("types")
        .map(String::as_str)
        .unwrap_or("public_channel");
    let public = types.split(',').any(|t| t.trim() == "public_channel");
    let private = types.split(',').any(|t| t.trim() == "private_channel");
    let exclude_archived = flag(&args, "exclude_archived");
    let limit = args
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(100)
        .min(1000);
    let offset = match args.get("cursor").filter(|c| !c.is_empty()) {
        Some(cursor) => match cursor
            .strip_prefix("offset:")
            .and_then(|n| n.parse::<usize>().ok())
        {
            Some(offset) => offset,
            None => return refuse("invalid_cursor"),
        },
        None => 0,
    };
    let workspace = slack.workspace.lock().expect("slack workspace lock");
    let matching: Vec<Value> = workspace
        .channels
        .iter()
        .filter(|c| if c.is_private { private } else { public })
        .filter(|c| !(exclude_archived && c.is_archived))
        .map(|c| {
            json!({
                "id": c.id,
                "name": c.name,
                "is_channel": !c.is_private,
                "is_group": c.is_private,
                "is_im": false,
                "is_private": c.is_private,
                "is_archived": c.is_archived,
                "is_member": c.is_member,
            })
        })
        .collect();
    let next = offset + limit;
    let next_cursor = if next < matching.len() {
        format!("offset:{next}")
    } else {
        String::new()
    };
    let page: Vec<Value> = matching.into_iter().skip(offset).take(limit).collect();
    Json(json!({
        "ok": true,
        "channels": page,
        "response_metadata": {"next_cursor": next_cursor},
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_in_band_and_server_trouble_keeps_its_status() {
        assert_eq!(
            slack_error(StatusCode::BAD_REQUEST, "channel_not_found").status(),
            StatusCode::OK
        );
        assert_eq!(
            slack_error(StatusCode::TOO_MANY_REQUESTS, "Too many requests").status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            slack_error(StatusCode::SERVICE_UNAVAILABLE, "down").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn timestamps_only_grow() {
        let mut workspace = Workspace::new();
        let first = workspace.next_ts();
        let second = workspace.next_ts();
        assert!(ts_value(&second) > ts_value(&first), "{first} < {second}");
        assert_eq!(first.split('.').nth(1).map(str::len), Some(6));
    }

    #[test]
    fn form_fields_are_decoded() {
        let fields = form_fields(b"channel=%23support&text=hello+there");
        assert_eq!(fields["channel"], "#support");
        assert_eq!(fields["text"], "hello there");
    }
}
