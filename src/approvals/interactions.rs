//! `POST /slack/interactions`: a person pressed Approve or Reject in a
//! Slack message. The request is Slack's only if its signature is the
//! signing secret's HMAC of its timestamp and raw body, the timestamp is
//! within five minutes, and that signature was never seen before (a
//! replay gets 401 like a forgery). The Slack user must map to a dashboard
//! user who may decide; anyone else is told privately that they cannot.
//! The decision itself (which may run the commit) happens after the
//! answer, since Slack wants one within three seconds; its outcome shows
//! in the message, rewritten in place.

use super::message::{parse_button_value, APPROVE, REJECT};
use super::SlackApprovals;
use crate::connectors::slack::signature_matches;
use crate::saga::engine::{Engine, Refusal};
use crate::saga::model::{Actor, ApprovalKind, Via};
use crate::saga::store::StoreError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::Arc;

/// How far a request's timestamp may be from the harness's clock.
const WINDOW_SECS: i64 = 5 * 60;

fn unauthorised(why: &str) -> Response {
    tracing::warn!(why, "a request to /slack/interactions was refused");
    (StatusCode::UNAUTHORIZED, why.to_owned()).into_response()
}

pub async fn handle(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(slack) = state.slack_approvals.clone() else {
        return (
            StatusCode::NOT_FOUND,
            "Slack approvals are not configured ([approvals.slack] in the tools file)",
        )
            .into_response();
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(timestamp), Some(signature)) = (
        header("x-slack-request-timestamp"),
        header("x-slack-signature"),
    ) else {
        return unauthorised("the request is not signed");
    };
    let now = chrono::Utc::now();
    let Ok(sent_at) = timestamp.parse::<i64>() else {
        return unauthorised("the request's timestamp is not a number");
    };
    if (now.timestamp() - sent_at).abs() > WINDOW_SECS {
        return unauthorised("the request's timestamp is more than five minutes off");
    }
    if !signature_matches(slack.signing_secret(), timestamp, &body, signature) {
        return unauthorised("the request's signature is not the signing secret's");
    }
    let forget_before = now - chrono::Duration::seconds(2 * WINDOW_SECS);
    match state
        .store
        .first_sighting(signature, now, forget_before)
        .await
    {
        Ok(true) => {}
        Ok(false) => return unauthorised("the request was seen before (a replay)"),
        Err(err) => {
            tracing::error!(%err, "remembering a Slack request");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database does not answer",
            )
                .into_response();
        }
    }
    let payload = url::form_urlencoded::parse(&body)
        .find(|(name, _)| name == "payload")
        .and_then(|(_, payload)| serde_json::from_str::<Value>(&payload).ok());
    let Some(payload) = payload else {
        return (
            StatusCode::BAD_REQUEST,
            "the body has no JSON `payload` field",
        )
            .into_response();
    };
    if payload["type"] != "block_actions" {
        // Other interactions (shortcuts, view submissions) are not ours.
        return StatusCode::OK.into_response();
    }
    let press = Press::of(&payload);
    tokio::spawn(decide(state.engine.clone(), slack, press));
    StatusCode::OK.into_response()
}

/// A button press, as far as the harness reads it.
#[derive(Debug)]
struct Press {
    slack_user: String,
    action_id: String,
    value: String,
    response_url: Option<String>,
}

impl Press {
    fn of(payload: &Value) -> Press {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let action = &payload["actions"][0];
        Press {
            slack_user: text(&payload["user"]["id"]),
            action_id: text(&action["action_id"]),
            value: text(&action["value"]),
            response_url: payload["response_url"].as_str().map(str::to_owned),
        }
    }
}

/// Decides as the person the press maps to; whatever stops it is said to
/// them privately.
async fn decide(engine: Arc<Engine>, slack: Arc<SlackApprovals>, press: Press) {
    let said = decision(&engine, &slack, &press).await.err();
    slack.nudged.notify_one();
    if let (Some(why), Some(url)) = (said, &press.response_url) {
        if let Err(err) = slack.slack.respond(url, &why).await {
            tracing::warn!(%err, "answering a Slack user privately");
        }
    }
}

async fn decision(engine: &Engine, slack: &SlackApprovals, press: &Press) -> Result<(), String> {
    let approve = match press.action_id.as_str() {
        APPROVE => true,
        REJECT => false,
        _ => return Err("That button is not one of the harness's.".into()),
    };
    let Some((approval_id, digest)) = parse_button_value(&press.value) else {
        return Err("That button does not name an approval.".into());
    };
    let cannot = "You cannot approve this";
    let username = match slack.dashboard_user(&press.slack_user).await {
        Ok(Some(username)) => username,
        Ok(None) if slack.users_by_email => {
            return Err(format!(
                "{cannot}: your Slack account is not linked to a dashboard user, and no dashboard user is named by the email your Slack profile shows."
            ))
        }
        Ok(None) => {
            return Err(format!(
                "{cannot}: your Slack account is not linked to a dashboard user."
            ))
        }
        Err(why) => {
            return Err(format!(
                "{cannot} now: Slack did not say who you are ({why}). Nothing was decided; try again."
            ))
        }
    };
    let username = username.as_str();
    let user = match engine.store().credentials(username).await {
        Ok(Some(credentials)) => credentials.user,
        Ok(None) => return Err(format!("{cannot}: the dashboard has no user {username}.")),
        Err(err) => return Err(crate::incident::Incident::record("Slack decision", &err).message()),
    };
    if !user.role.can_decide() {
        return Err(format!(
            "{cannot}: {} is {}; only an approver or an admin may decide.",
            user.username,
            user.role.with_article()
        ));
    }
    let approval = match engine.store().approval(approval_id).await {
        Ok(Some(approval)) => approval,
        Ok(None) => return Err("That approval no longer exists.".into()),
        Err(err) => return Err(crate::incident::Incident::record("Slack decision", &err).message()),
    };
    let person = Actor::User(user.username.clone());
    let how = crate::saga::rights::SignedIn::Slack {
        user: press.slack_user.clone(),
    };
    let judged = crate::saga::rights::judge(
        engine.registry(),
        &approval,
        &user.username,
        &how,
        &user.groups,
    );
    let right = match judged {
        Ok(right) => right,
        Err(no) => {
            if let Err(err) = engine
                .store()
                .note(approval.run_id, &person, &no.audit)
                .await
            {
                return Err(crate::incident::Incident::record("Slack decision", &err).message());
            }
            return Err(format!("{cannot}: {}", no.words));
        }
    };
    let decided = match approval.kind {
        ApprovalKind::Pivot => engine
            .decide_pivot(approval_id, digest, approve, &person, Via::Slack)
            .await
            .map(|_| ()),
        ApprovalKind::Step => engine
            .decide_step(approval_id, digest, approve, &person, Via::Slack)
            .await
            .map(|_| ()),
    };
    if decided.is_ok() {
        if let Err(err) = engine.store().note(approval.run_id, &person, &right).await {
            tracing::error!(%err, "writing a decision's right to the audit trail");
        }
    }
    decided.map_err(|refusal| match refusal {
        Refusal::Store(StoreError::PlanChanged) => {
            "The plan was replaced or edited after this button was drawn, so nothing was decided; decide on the plan as its message now reads.".to_owned()
        }
        Refusal::Store(StoreError::IllegalTransition(_)) => {
            "This approval was already decided; the message shows how.".to_owned()
        }
        other => format!(
            "The decision did not go through: {}",
            crate::incident::refusal_words("Slack decision", &other)
        ),
    })
}
