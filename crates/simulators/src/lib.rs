//! Simulators of the systems the support tools touch: real HTTP servers on
//! loopback that speak the real APIs' paths, fields and error shapes, with
//! fault injection and a ledger of what really happened.
//!
//! The ledger is the simulator's own record, kept apart from the saga log:
//! tests and the demo read it to check that an effect happened once, that a
//! compensation landed, that no email left.
//!
//! Every simulator also serves, under `/_sim`:
//! - `GET /_sim/ledger` — every effect, with its key;
//! - `POST /_sim/faults` — inject a [`FaultRule`];
//! - `DELETE /_sim/faults` — clear all faults.

pub mod bundle;
pub mod credentials;
pub mod jira;
pub mod orders;
pub mod slack;
pub mod slack_app;
pub mod smtp;
pub mod stripe;
pub mod warehouse;
pub mod zendesk;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// One thing that really happened in a simulated system.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// `stripe`, `jira`, `zendesk`, `slack`, `smtp`, `warehouse`, `backend`.
    pub system: String,
    /// What happened: `payment_intent.created`, `refund.created`,
    /// `issue.transitioned`, `email.received` …
    pub action: String,
    /// The idempotency / saga key the request carried, when it carried one.
    pub key: Option<String>,
    /// The id of the object affected (`pi_…`, `PROJ-7`, a Message-ID).
    pub object: String,
    pub detail: Value,
}

/// The record of effects, shared between a simulator and whoever reads it.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<Vec<Effect>>>);

impl Ledger {
    pub fn record(
        &self,
        system: &str,
        action: &str,
        key: Option<&str>,
        object: &str,
        detail: Value,
    ) {
        self.0.lock().expect("ledger lock").push(Effect {
            system: system.to_owned(),
            action: action.to_owned(),
            key: key.map(str::to_owned),
            object: object.to_owned(),
            detail,
        });
    }

    pub fn effects(&self) -> Vec<Effect> {
        self.0.lock().expect("ledger lock").clone()
    }

    /// The effects with this action.
    pub fn of(&self, action: &str) -> Vec<Effect> {
        self.effects()
            .into_iter()
            .filter(|e| e.action == action)
            .collect()
    }
}

/// What a simulator does to a request that matches a fault rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// The effect happens, then the client gets a gateway's 504 page.
    #[serde(rename = "commit_then_504")]
    CommitThen504,
    /// The effect happens, then the connection drops before the answer.
    ResetAfterCommit,
    /// The effect happens, then the client gets 200 with an empty body.
    CommitThenBlank,
    /// The effect happens, and the answer comes `ms` later.
    Delay { ms: u64 },
    /// Nothing happens; the client gets this status in the system's own
    /// error shape.
    Reject { status: u16, message: String },
    /// Nothing happens; the client gets 429 with `Retry-After`.
    RateLimit,
}

/// Applies `fault` to the next `times` requests whose method and path match.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// `POST`, `GET` …; any method when absent.
    #[serde(default)]
    pub method: Option<String>,
    /// Matches paths that start with it; `*` inside matches one segment
    /// (`/v1/payment_intents/*/capture`).
    pub path: String,
    pub fault: Fault,
    #[serde(default = "one")]
    pub times: u32,
    /// Lets this many matching requests through untouched first: the
    /// fault falls on the next one (the third charge, not the first).
    #[serde(default)]
    pub skip: u32,
    /// The path matches only itself (and `*` one segment), not the paths
    /// under it: `/rest/api/3/issue` without its transitions.
    #[serde(default)]
    pub exact: bool,
}

fn one() -> u32 {
    1
}

impl FaultRule {
    pub fn new(method: &str, path: &str, fault: Fault) -> Self {
        FaultRule {
            method: Some(method.to_owned()),
            path: path.to_owned(),
            fault,
            times: 1,
            skip: 0,
            exact: false,
        }
    }

    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        if let Some(wanted) = &self.method {
            if !wanted.eq_ignore_ascii_case(method.as_str()) {
                return false;
            }
        }
        let pattern: Vec<&str> = self.path.trim_end_matches('/').split('/').collect();
        let actual: Vec<&str> = path.split('/').collect();
        let long_enough = if self.exact {
            actual.len() == pattern.len()
        } else {
            actual.len() >= pattern.len()
        };
        long_enough
            && pattern
                .iter()
                .zip(&actual)
                .all(|(p, a)| *p == "*" || p == a)
    }
}

/// Standing conditions and one-shot fault rules of one simulator.
#[derive(Clone, Default)]
pub struct Faults(Arc<Mutex<FaultState>>);

#[derive(Default)]
struct FaultState {
    rules: Vec<FaultRule>,
    search_lag: Duration,
    /// Every request that reached the simulator, as (method, path): tests
    /// count attempts, not only effects (an idempotent replay hides a
    /// second attempt from the ledger).
    seen: Vec<(Method, String)>,
}

impl Faults {
    pub fn inject(&self, rule: FaultRule) {
        self.0.lock().expect("faults lock").rules.push(rule);
    }

    pub fn clear(&self) {
        let mut state = self.0.lock().expect("faults lock");
        state.rules.clear();
        state.search_lag = Duration::ZERO;
    }

    /// How long a new object stays invisible to search (Stripe's Search API
    /// is eventually consistent; so is Jira's JQL index).
    pub fn set_search_lag(&self, lag: Duration) {
        self.0.lock().expect("faults lock").search_lag = lag;
    }

    pub fn search_lag(&self) -> Duration {
        self.0.lock().expect("faults lock").search_lag
    }

    /// How many requests with this method reached a path starting with
    /// `path`.
    pub fn requests_to(&self, method: &str, path: &str) -> usize {
        let state = self.0.lock().expect("faults lock");
        state
            .seen
            .iter()
            .filter(|(m, p)| m.as_str().eq_ignore_ascii_case(method) && p.starts_with(path))
            .count()
    }

    /// The fault for this request, used up by one.
    fn take(&self, method: &Method, path: &str) -> Option<Fault> {
        let mut state = self.0.lock().expect("faults lock");
        state.seen.push((method.clone(), path.to_owned()));
        let position = state
            .rules
            .iter()
            .position(|rule| rule.times > 0 && rule.matches(method, path))?;
        let rule = &mut state.rules[position];
        if rule.skip > 0 {
            rule.skip -= 1;
            return None;
        }
        rule.times -= 1;
        let fault = rule.fault.clone();
        if rule.times == 0 {
            state.rules.remove(position);
        }
        Some(fault)
    }
}

/// How a system writes an error: each simulator answers faults in the shape
/// the real API uses, so the connector meets what it would meet in life.
pub type ErrorShape = fn(StatusCode, &str) -> Response;

/// The pieces every simulator shares.
#[derive(Clone, Default)]
pub struct SimState {
    pub ledger: Ledger,
    pub faults: Faults,
    /// When the simulator started; search lag is measured against it.
    pub clock: Clock,
}

/// Milliseconds since the simulator started (monotonic).
#[derive(Clone)]
pub struct Clock(Instant);

impl Default for Clock {
    fn default() -> Self {
        Clock(Instant::now())
    }
}

impl Clock {
    pub fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// Wraps a simulator's routes with the fault layer and the `/_sim` routes.
pub fn mount(routes: Router, sim: &SimState, shape: ErrorShape) -> Router {
    let control = Router::new()
        .route("/_sim/ledger", get(ledger))
        .route("/_sim/faults", axum::routing::post(inject).delete(clear))
        .route("/_sim/search_lag", axum::routing::post(search_lag))
        .with_state(sim.clone());
    routes
        .layer(middleware::from_fn_with_state(
            (sim.faults.clone(), shape),
            apply_fault,
        ))
        .merge(control)
}

async fn ledger(State(sim): State<SimState>) -> Json<Vec<Effect>> {
    Json(sim.ledger.effects())
}

async fn inject(State(sim): State<SimState>, Json(rule): Json<FaultRule>) -> StatusCode {
    sim.faults.inject(rule);
    StatusCode::NO_CONTENT
}

async fn clear(State(sim): State<SimState>) -> StatusCode {
    sim.faults.clear();
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct Lag {
    ms: u64,
}

async fn search_lag(State(sim): State<SimState>, Json(lag): Json<Lag>) -> StatusCode {
    sim.faults.set_search_lag(Duration::from_millis(lag.ms));
    StatusCode::NO_CONTENT
}

async fn apply_fault(
    State((faults, shape)): State<(Faults, ErrorShape)>,
    request: Request,
    next: Next,
) -> Response {
    let Some(fault) = faults.take(request.method(), request.uri().path()) else {
        return next.run(request).await;
    };
    match fault {
        Fault::Reject { status, message } => shape(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            &message,
        ),
        Fault::RateLimit => {
            let mut response = shape(StatusCode::TOO_MANY_REQUESTS, "Too many requests");
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            response
        }
        Fault::CommitThen504 => {
            let _ = next.run(request).await;
            (
                StatusCode::GATEWAY_TIMEOUT,
                [(header::CONTENT_TYPE, "text/html")],
                "<html><body><h1>504 Gateway Time-out</h1></body></html>",
            )
                .into_response()
        }
        Fault::CommitThenBlank => {
            let _ = next.run(request).await;
            (StatusCode::OK, [(header::CONTENT_TYPE, "text/html")], "").into_response()
        }
        Fault::ResetAfterCommit => {
            let _ = next.run(request).await;
            // A body that fails makes the server abort the connection
            // before an answer is complete.
            let broken = futures::stream::once(async {
                Err::<Bytes, std::io::Error>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "simulated reset after commit",
                ))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::CONTENT_LENGTH, "64")
                .body(Body::from_stream(broken))
                .expect("static response")
        }
        Fault::Delay { ms } => {
            let response = next.run(request).await;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            response
        }
    }
}

/// A simulator serving on a loopback port until dropped.
pub struct Running {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `router` on `addr` (port 0 picks a free port).
pub async fn serve(router: Router, addr: SocketAddr) -> std::io::Result<Running> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(Running { addr, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_matches_by_method_and_path_pattern() {
        let rule = FaultRule::new(
            "POST",
            "/v1/payment_intents/*/capture",
            Fault::CommitThen504,
        );
        assert!(rule.matches(&Method::POST, "/v1/payment_intents/pi_1/capture"));
        assert!(!rule.matches(&Method::GET, "/v1/payment_intents/pi_1/capture"));
        assert!(!rule.matches(&Method::POST, "/v1/payment_intents/pi_1"));
        let prefix = FaultRule::new("POST", "/v1/payment_intents", Fault::RateLimit);
        assert!(prefix.matches(&Method::POST, "/v1/payment_intents"));
        assert!(prefix.matches(&Method::POST, "/v1/payment_intents/pi_1/cancel"));
    }

    #[test]
    fn fault_rules_read_as_the_control_endpoint_takes_them() {
        let rule: FaultRule = serde_json::from_str(
            r#"{"method": "POST", "path": "/v1/refunds", "fault": {"kind": "commit_then_504"}}"#,
        )
        .unwrap();
        assert_eq!(rule.fault, Fault::CommitThen504);
        assert_eq!(rule.times, 1);
        let delay: Fault = serde_json::from_str(r#"{"kind": "delay", "ms": 250}"#).unwrap();
        assert_eq!(delay, Fault::Delay { ms: 250 });
    }

    #[test]
    fn a_rule_is_used_up_after_its_times() {
        let faults = Faults::default();
        faults.inject(FaultRule::new("GET", "/x", Fault::RateLimit).times(2));
        assert!(faults.take(&Method::GET, "/x").is_some());
        assert!(faults.take(&Method::GET, "/x").is_some());
        assert!(faults.take(&Method::GET, "/x").is_none());
    }

    #[test]
    fn a_rule_that_skips_falls_on_a_later_request_and_an_exact_one_not_below_its_path() {
        let faults = Faults::default();
        let mut rule = FaultRule::new("POST", "/rest/api/3/issue", Fault::CommitThen504);
        rule.skip = 1;
        rule.exact = true;
        faults.inject(rule);
        assert!(faults
            .take(&Method::POST, "/rest/api/3/issue/P-1/transitions")
            .is_none());
        assert!(
            faults.take(&Method::POST, "/rest/api/3/issue").is_none(),
            "the first passes"
        );
        assert_eq!(
            faults.take(&Method::POST, "/rest/api/3/issue"),
            Some(Fault::CommitThen504)
        );
        assert!(
            faults.take(&Method::POST, "/rest/api/3/issue").is_none(),
            "used up"
        );
    }
}

/// What an idempotency key was first used for, so a retry replays the first
/// answer instead of acting twice (how Stripe, Zendesk and most internal
/// APIs with an `Idempotency-Key` header behave).
#[derive(Clone, Default)]
pub struct Replays(Arc<Mutex<std::collections::HashMap<String, FirstUse>>>);

/// The parameters a key was first used with, and the answer then given.
type FirstUse = (Value, StatusCode, Value);

/// What to do with a request carrying an idempotency key.
pub enum Replay {
    /// First use: act, then [`Replays::remember`] the answer.
    Fresh,
    /// Seen with the same parameters: answer this again.
    Again(StatusCode, Value),
    /// Seen with other parameters.
    Conflict,
}

impl Replays {
    pub fn check(&self, key: &str, params: &Value) -> Replay {
        match self.0.lock().expect("replays lock").get(key) {
            None => Replay::Fresh,
            Some((first, status, body)) if first == params => Replay::Again(*status, body.clone()),
            Some(_) => Replay::Conflict,
        }
    }

    pub fn remember(&self, key: &str, params: &Value, status: StatusCode, body: &Value) {
        self.0
            .lock()
            .expect("replays lock")
            .insert(key.to_owned(), (params.clone(), status, body.clone()));
    }
}

/// Whether an object stamped at `created` is old enough to be searchable.
pub fn searchable(sim: &SimState, created: Duration) -> bool {
    sim.clock.now().saturating_sub(created) >= sim.faults.search_lag()
}
