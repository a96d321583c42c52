//! The two addresses of signing in through the identity provider:
//! `/auth/oidc/start` sends the browser there with a new `state`, `nonce`
//! and PKCE challenge kept in its session; `/auth/oidc/callback` takes the
//! answer, lets `oidc` check it, and signs the person in with a new session
//! id. A refusal sends the browser to the sign-in page with its code and
//! leaves no signed-in session.

use crate::oidc::Pending;
use crate::state::AppState;
use crate::ui::sign_in::SignInRefusal;
use crate::ui::{Federated, SessionUser, SESSION_USER_KEY};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tower_sessions::{Expiry, Session};

pub const START_PATH: &str = "/auth/oidc/start";
pub const CALLBACK_PATH: &str = "/auth/oidc/callback";

/// Where the sign-ins a browser has started wait for the provider's answer.
const PENDING_KEY: &str = "oidc_pending";

/// Sign-ins one browser may have started at once (tabs); the oldest is
/// dropped for a newer one, so a browser can never fill its session.
const MAX_PENDING: usize = 3;

/// How long a browser that started a sign-in and is not signed in keeps its
/// session: long enough to type a password at the provider, short enough
/// that sessions made by following the start link and never coming back
/// are soon deleted.
const PENDING_FOR: time::Duration = time::Duration::minutes(10);

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(START_PATH, get(start))
        .route(CALLBACK_PATH, get(callback))
}

async fn start(State(state): State<AppState>, session: Session) -> Response {
    let Some(provider) = state.sign_in.provider.as_ref() else {
        return (StatusCode::NOT_FOUND, "No identity provider is configured.").into_response();
    };
    let (url, pending) = match provider.start().await {
        Ok(started) => started,
        Err(refusal) => return refused(refusal),
    };
    let mut waiting = pending_sign_ins(&session).await;
    waiting.push(pending);
    let excess = waiting.len().saturating_sub(MAX_PENDING);
    waiting.drain(..excess);
    if let Err(err) = session.insert(PENDING_KEY, waiting).await {
        return failed(&err);
    }
    if !signed_in(&session).await {
        session.set_expiry(Some(Expiry::OnInactivity(PENDING_FOR)));
    }
    Redirect::to(url.as_str()).into_response()
}

/// The provider's answer (RFC 6749 §4.1.2, RFC 9207).
#[derive(Deserialize)]
struct Answer {
    code: Option<String>,
    state: Option<String>,
    iss: Option<String>,
    error: Option<String>,
}

async fn callback(
    State(state): State<AppState>,
    session: Session,
    Query(answer): Query<Answer>,
) -> Response {
    let Some(provider) = state.sign_in.provider.as_ref() else {
        return (StatusCode::NOT_FOUND, "No identity provider is configured.").into_response();
    };
    // The answer's state names one sign-in this browser started; it is
    // used up now, whatever happens next.
    let mut waiting = pending_sign_ins(&session).await;
    let Some(at) = answer
        .state
        .as_deref()
        .and_then(|s| waiting.iter().position(|p| p.state == s))
    else {
        return refused_in(&session, SignInRefusal::State).await;
    };
    let pending = waiting.remove(at);
    if let Err(err) = session.insert(PENDING_KEY, waiting).await {
        return failed(&err);
    }
    if answer.error.is_some() {
        return refused_in(&session, SignInRefusal::Denied).await;
    }
    let Some(code) = answer.code else {
        return refused_in(&session, SignInRefusal::Token).await;
    };
    let identity = match provider.finish(pending, code, answer.iss.as_deref()).await {
        Ok(identity) => identity,
        Err(refusal) => return refused_in(&session, refusal).await,
    };
    tracing::info!(
        person = %identity.name,
        issuer = %identity.issuer,
        subject = %identity.subject,
        role = %identity.role,
        group = %identity.granted_by,
        "signed in through the identity provider"
    );
    // A new id, so a session id planted before the sign-in is worthless.
    if let Err(err) = session.cycle_id().await {
        return failed(&err);
    }
    let _ = session.remove_value(PENDING_KEY).await;
    let user = SessionUser {
        username: identity.name,
        role: identity.role,
        groups: identity.groups,
        federated: Some(Federated {
            issuer: identity.issuer,
            subject: identity.subject,
            granted_by: identity.granted_by,
        }),
    };
    if let Err(err) = session.insert(SESSION_USER_KEY, user).await {
        return failed(&err);
    }
    session.set_expiry(Some(crate::ui::ssr::ends_after(state.sign_in.max_age)));
    Redirect::to("/").into_response()
}

async fn pending_sign_ins(session: &Session) -> Vec<Pending> {
    session
        .get::<Vec<Pending>>(PENDING_KEY)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

async fn signed_in(session: &Session) -> bool {
    matches!(
        session.get::<SessionUser>(SESSION_USER_KEY).await,
        Ok(Some(_))
    )
}

/// To the sign-in page with the refusal's code. A browser that was not
/// signed in keeps nothing of the attempt.
async fn refused_in(session: &Session, refusal: SignInRefusal) -> Response {
    if !signed_in(session).await {
        let _ = session.flush().await;
    }
    refused(refusal)
}

fn refused(refusal: SignInRefusal) -> Response {
    Redirect::to(&format!("/login?error={}", refusal.code())).into_response()
}

fn failed(err: &dyn std::fmt::Display) -> Response {
    let incident = crate::incident::Incident::record("signing in", err);
    (StatusCode::INTERNAL_SERVER_ERROR, incident.message()).into_response()
}
