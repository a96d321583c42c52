//! The simulated Slack's side of an app's interactivity: a person pressing
//! a button in a message the app posted. Slack sends the app a
//! `block_actions` payload, form-encoded as `payload=<JSON>`, signed with
//! the app's signing secret (`X-Slack-Signature`, `X-Slack-Request-Timestamp`),
//! to the app's request URL; the app answers a person privately by posting
//! to the payload's `response_url`.
//!
//! Test routes (no Slack equivalent: on Slack a person clicks):
//! - `POST /_sim/slack/app` `{request_url, signing_secret}`: the app's
//!   interactivity settings.
//! - `POST /_sim/slack/press` `{saga_key, action_id, user_id, user_name?, stale?}`:
//!   presses the button `action_id` of the message posted with `saga_key`,
//!   as that user; answers `{status, body}` of the app's answer. With
//!   `stale: true` the button is pressed as the message was first posted,
//!   as a client that has not redrawn it since an update still shows it.
//! - `GET /_sim/slack/responses`: what the app posted to response URLs,
//!   oldest first, each with the user it answered.

use super::slack::SlackSim;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone, Default)]
struct App {
    settings: Arc<Mutex<Option<AppSettings>>>,
    /// Who pressed, by press number (the number in its response URL).
    presses: Arc<Mutex<Vec<String>>>,
    responses: Arc<Mutex<Vec<Value>>>,
}

#[derive(Clone, Deserialize)]
struct AppSettings {
    request_url: String,
    signing_secret: String,
}

#[derive(Clone)]
struct AppState {
    slack: SlackSim,
    app: App,
}

/// The Slack simulator's routes: the Web API and the app's interactivity
/// over one workspace.
pub fn router(sim: &super::SimState) -> Router {
    let (web_api, slack) = super::slack::web_api(sim);
    Router::new()
        .route("/_sim/slack/app", post(configure))
        .route("/_sim/slack/press", post(press))
        .route("/_sim/slack/responses", get(responses))
        .route("/_sim/slack/responses/{press}", post(respond))
        .with_state(AppState {
            slack,
            app: App::default(),
        })
        .merge(web_api)
}

async fn configure(State(state): State<AppState>, Json(settings): Json<AppSettings>) -> StatusCode {
    *state.app.settings.lock().expect("app settings lock") = Some(settings);
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct Press {
    saga_key: String,
    action_id: String,
    user_id: String,
    user_name: Option<String>,
    #[serde(default)]
    stale: bool,
}

fn refused(status: StatusCode, why: &str) -> Response {
    (status, Json(json!({"error": why}))).into_response()
}

/// The button `action_id` among the message's `actions` blocks.
fn button(message: &Value, action_id: &str) -> Option<(String, Value)> {
    message["blocks"]
        .as_array()?
        .iter()
        .filter(|block| block["type"] == "actions")
        .find_map(|block| {
            block["elements"]
                .as_array()?
                .iter()
                .find(|e| e["action_id"] == action_id)
                .map(|e| {
                    (
                        block["block_id"].as_str().unwrap_or("").to_owned(),
                        e.clone(),
                    )
                })
        })
}

async fn press(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Json(press): Json<Press>,
) -> Response {
    let Some(settings) = state
        .app
        .settings
        .lock()
        .expect("app settings lock")
        .clone()
    else {
        return refused(
            StatusCode::CONFLICT,
            "the app has no request URL: POST /_sim/slack/app first",
        );
    };
    let Some(seen) = state.slack.message_with_key(&press.saga_key) else {
        return refused(StatusCode::NOT_FOUND, "no message was posted with that key");
    };
    let mut shown = seen.message.clone();
    if press.stale {
        shown["blocks"] = seen.first_blocks.clone().unwrap_or(Value::Null);
    }
    let Some((block_id, element)) = button(&shown, &press.action_id) else {
        return refused(
            StatusCode::NOT_FOUND,
            "the message has no button with that action_id",
        );
    };
    let number = {
        let mut presses = state.app.presses.lock().expect("presses lock");
        presses.push(press.user_id.clone());
        presses.len() - 1
    };
    // Response URLs point back here, at the address the press came to.
    let own_base = match headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
    {
        Some(host) => format!("http://{host}"),
        None => return refused(StatusCode::BAD_REQUEST, "the press needs a Host header"),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let user_name = press
        .user_name
        .unwrap_or_else(|| press.user_id.to_lowercase());
    let payload = json!({
        "type": "block_actions",
        "user": {"id": press.user_id, "username": user_name, "name": user_name, "team_id": TEAM},
        "api_app_id": "A0SAGAAPP",
        "token": "sim-verification-token",
        "container": {
            "type": "message",
            "message_ts": seen.message["ts"],
            "channel_id": seen.channel_id,
            "is_ephemeral": false
        },
        "trigger_id": format!("{}.{}", now.as_secs(), now.subsec_micros()),
        "team": {"id": TEAM, "domain": "saga-sim"},
        "enterprise": null,
        "is_enterprise_install": false,
        "channel": {"id": seen.channel_id, "name": seen.channel_name},
        "message": shown,
        "state": {"values": {}},
        "response_url": format!("{own_base}/_sim/slack/responses/{number}"),
        "actions": [{
            "action_id": press.action_id,
            "block_id": block_id,
            "text": element["text"],
            "value": element["value"],
            "style": element["style"],
            "type": "button",
            "action_ts": format!("{}.{:06}", now.as_secs(), now.subsec_micros()),
        }],
    });
    let body = format!(
        "payload={}",
        percent_encoding::utf8_percent_encode(
            &payload.to_string(),
            percent_encoding::NON_ALPHANUMERIC
        )
    );
    let timestamp = now.as_secs().to_string();
    let signature = request_signature(&settings.signing_secret, &timestamp, body.as_bytes());
    let sent = reqwest::Client::new()
        .post(&settings.request_url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", &timestamp)
        .header("x-slack-signature", &signature)
        .body(body)
        .send()
        .await;
    match sent {
        Ok(answer) => {
            let status = answer.status().as_u16();
            let text = answer.text().await.unwrap_or_default();
            Json(json!({"status": status, "body": text})).into_response()
        }
        Err(err) => refused(
            StatusCode::BAD_GATEWAY,
            &format!("the app did not answer: {err}"),
        ),
    }
}

const TEAM: &str = "T0SAGASIM";

async fn respond(
    State(state): State<AppState>,
    Path(press): Path<usize>,
    Json(body): Json<Value>,
) -> StatusCode {
    let Some(user) = state
        .app
        .presses
        .lock()
        .expect("presses lock")
        .get(press)
        .cloned()
    else {
        return StatusCode::NOT_FOUND;
    };
    state
        .app
        .responses
        .lock()
        .expect("responses lock")
        .push(json!({"press": press, "user": user, "body": body}));
    StatusCode::OK
}

async fn responses(State(state): State<AppState>) -> Json<Vec<Value>> {
    Json(state.app.responses.lock().expect("responses lock").clone())
}

/// What Slack puts in `X-Slack-Signature`: `v0=` and the hex HMAC-SHA256,
/// keyed with the app's signing secret, of `v0:TIMESTAMP:BODY`. Written
/// here from Slack's documentation rather than taken from the app's own
/// verifier, so that a mistake in one is caught by the other.
fn request_signature(signing_secret: &str, timestamp: &str, body: &[u8]) -> String {
    use hmac::{Mac, SimpleHmac};
    let mut mac = SimpleHmac::<sha2::Sha256>::new_from_slice(signing_secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulator_signs_as_slacks_documentation_does() {
        // The example in Slack's "Verifying requests from Slack".
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&command=%2Fweather";
        assert_eq!(
            request_signature("8f742231b10e8888abcd99yyyzzz85a5", "1531420618", body),
            "v0=6b8b0b4cff7baf56906b6a54056df891b9cc8292bc01770e0e1d6dd9bc623977"
        );
    }
}
