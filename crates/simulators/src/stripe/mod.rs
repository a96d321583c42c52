//! A Stripe simulator: PaymentIntents (create, retrieve, list, search,
//! capture, cancel) and Refunds (create, retrieve, list) over Stripe's
//! form-encoded v1 API, so the connector that talks to it is the connector
//! that talks to `api.stripe.com`.
//!
//! It keeps Stripe's semantics that matter to a saga: an `Idempotency-Key`
//! replays the first answer (status and body, `Idempotent-Replayed: true`)
//! and refuses other parameters with an `idempotency_error`; the Search API
//! lags behind writes while the list endpoints do not; the test payment
//! methods decline the way Stripe's do (`pm_card_chargeDeclined` → 402 with
//! the PaymentIntent left in `requires_payment_method`); errors have
//! Stripe's `{"error": {"type", "code", "message", "param"}}` shape.

use super::{mount, SimState};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::distributions::Alphanumeric;
use rand::Rng;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod account;
mod error;
mod params;
mod search;

use account::*;
use error::*;
use params::*;
use search::*;

const SYSTEM: &str = "stripe";

/// The API version the simulator answers with when the request names none.
const DEFAULT_VERSION: &str = "2024-06-20";

/// Statuses from which Stripe lets a PaymentIntent be canceled.
const CANCELABLE: &str =
    "requires_payment_method, requires_capture, requires_confirmation, requires_action, processing";

/// The simulated Stripe API, with the fault layer and `/_sim` routes.
pub fn router(sim: &SimState) -> Router {
    let app = App {
        sim: sim.clone(),
        account: Arc::new(Mutex::new(Account::default())),
    };
    let routes = Router::new()
        .route("/v1/payment_intents", post(create_intent).get(list_intents))
        .route("/v1/payment_intents/search", get(search_intents))
        .route("/v1/payment_intents/{id}", get(retrieve_intent))
        .route("/v1/payment_intents/{id}/capture", post(capture_intent))
        .route("/v1/payment_intents/{id}/cancel", post(cancel_intent))
        .route("/v1/refunds", post(create_refund).get(list_refunds))
        .route("/v1/refunds/{id}", get(retrieve_refund))
        .fallback(unrecognized_url)
        .method_not_allowed_fallback(unrecognized_url)
        .layer(middleware::from_fn(authenticate))
        .with_state(app);
    mount(routes, sim, error_shape)
}

/// Stripe's error body for a status and message: the shape faults use.
pub fn error_shape(status: StatusCode, message: &str) -> Response {
    let (kind, code) = match status.as_u16() {
        429 => ("invalid_request_error", Some("rate_limit")),
        402 => ("card_error", None),
        500..=599 => ("api_error", None),
        _ => ("invalid_request_error", None),
    };
    ApiError::new(status, kind, code, message).into_response()
}

#[derive(Clone)]
struct App {
    sim: SimState,
    account: Arc<Mutex<Account>>,
}

impl App {
    fn account(&self) -> std::sync::MutexGuard<'_, Account> {
        // A panic inside a handler leaves the account as it was before the
        // write that panicked began; carrying on is safe for a simulator.
        self.account.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a write under Stripe's idempotency rules: a key seen before with
    /// the same endpoint and parameters replays the saved answer; with
    /// others it is an `idempotency_error`. Answers are saved once the
    /// endpoint began executing; parameter validation errors are not.
    fn write(
        &self,
        headers: &HeaderMap,
        endpoint: String,
        body: &Bytes,
        run: impl FnOnce(&mut Account, &Write) -> Result<Value, ApiError>,
    ) -> Response {
        let params = match Params::from_form(body) {
            Ok(params) => params,
            Err(err) => return err.into_response(),
        };
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if key.as_ref().is_some_and(|k| k.len() > 255) {
            return ApiError::invalid(
                "Invalid idempotency key: keys for idempotent requests can be at most 255 characters long.",
            )
            .into_response();
        }
        let mut account = self.account();
        if let Some(key) = &key {
            if let Some(saved) = account.idempotency.get(key) {
                if saved.endpoint == endpoint && saved.params == params.sorted() {
                    let mut response = (saved.status, Json(saved.body.clone())).into_response();
                    response
                        .headers_mut()
                        .insert("idempotent-replayed", HeaderValue::from_static("true"));
                    return stamp(response, headers, Some(key));
                }
                let err = ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "idempotency_error",
                    None,
                    &format!(
                        "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{key}' if you meant to execute a different request."
                    ),
                );
                return stamp(err.into_response(), headers, Some(key));
            }
        }
        let write = Write {
            params: &params,
            key: key.as_deref(),
            sim: &self.sim,
        };
        let (status, body, saved) = match run(&mut account, &write) {
            Ok(body) => (StatusCode::OK, body, true),
            Err(err) => (err.status, err.body(), err.saved),
        };
        if let (Some(key), true) = (&key, saved) {
            account.idempotency.insert(
                key.clone(),
                Saved {
                    endpoint,
                    params: params.sorted(),
                    status,
                    body: body.clone(),
                },
            );
        }
        stamp(
            (status, Json(body)).into_response(),
            headers,
            key.as_deref(),
        )
    }

    fn read(
        &self,
        headers: &HeaderMap,
        query: Option<String>,
        run: impl FnOnce(&Account, &Params, Duration) -> Result<Value, ApiError>,
    ) -> Response {
        let params = match Params::from_text(query.as_deref().unwrap_or("")) {
            Ok(params) => params,
            Err(err) => return err.into_response(),
        };
        let lag = self.sim.faults.search_lag();
        let now = self.sim.clock.now();
        let visible_since = now.saturating_sub(lag);
        let account = self.account();
        let response = match run(&account, &params, visible_since) {
            Ok(body) => Json(body).into_response(),
            Err(err) => err.into_response(),
        };
        stamp(response, headers, None)
    }
}

/// What a write handler gets besides the account.
struct Write<'a> {
    params: &'a Params,
    key: Option<&'a str>,
    sim: &'a SimState,
}

impl Write<'_> {
    /// The key the ledger records: the idempotency key, else the saga key
    /// in metadata.
    fn ledger_key(&self) -> Option<String> {
        self.key
            .map(str::to_owned)
            .or_else(|| self.params.metadata().get("saga_key").cloned())
    }
}

/// Headers every Stripe answer carries.
fn stamp(mut response: Response, request: &HeaderMap, key: Option<&str>) -> Response {
    let headers = response.headers_mut();
    let version = request
        .get("stripe-version")
        .cloned()
        .unwrap_or(HeaderValue::from_static(DEFAULT_VERSION));
    headers.insert("stripe-version", version);
    if let Ok(id) = HeaderValue::from_str(&format!("req_{}", random_id(14))) {
        headers.insert("request-id", id);
    }
    if let Some(key) = key.and_then(|k| HeaderValue::from_str(k).ok()) {
        headers.insert("idempotency-key", key);
    }
    response
}

async fn create_intent(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    app.write(
        &headers,
        "POST /v1/payment_intents".into(),
        &body,
        |account, write| account.create_intent(write),
    )
}

async fn capture_intent(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    app.write(
        &headers,
        format!("POST /v1/payment_intents/{id}/capture"),
        &body,
        |account, write| account.capture_intent(&id, write),
    )
}

async fn cancel_intent(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    app.write(
        &headers,
        format!("POST /v1/payment_intents/{id}/cancel"),
        &body,
        |account, write| account.cancel_intent(&id, write),
    )
}

async fn create_refund(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    app.write(
        &headers,
        "POST /v1/refunds".into(),
        &body,
        |account, write| account.create_refund(write),
    )
}

async fn retrieve_intent(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    app.read(&headers, None, |account, _, _| {
        account
            .intents
            .iter()
            .find(|i| i.id == id)
            .map(Intent::to_json)
            .ok_or_else(|| ApiError::no_such("payment_intent", &id, "intent"))
    })
}

/// The list endpoint reads the primary store: no search lag.
async fn list_intents(
    State(app): State<App>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    app.read(&headers, query, |account, params, _| {
        let customer = params.get("customer");
        page(
            account
                .intents
                .iter()
                .filter(|i| customer.is_none() || i.customer.as_deref() == customer),
            |i| &i.id,
            params,
            "/v1/payment_intents",
            Intent::to_json,
        )
    })
}

/// The Search API: only objects written longer ago than the search lag.
async fn search_intents(
    State(app): State<App>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    app.read(&headers, query, |account, params, visible_since| {
        let text = params.get("query").ok_or_else(|| ApiError::missing("query"))?;
        let query = SearchQuery::parse(text)?;
        let limit = params.limit()?;
        let offset = match params.get("page") {
            None => 0,
            Some(token) => token
                .strip_prefix("page_")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| ApiError::invalid("Invalid page token.").param("page"))?,
        };
        let hits: Vec<&Intent> = account
            .intents
            .iter()
            .rev()
            .filter(|i| i.created_on_clock <= visible_since && query.matches(i))
            .collect();
        let has_more = hits.len() > offset + limit;
        let data: Vec<Value> = hits
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(Intent::to_json)
            .collect();
        Ok(json!({
            "object": "search_result",
            "data": data,
            "has_more": has_more,
            "next_page": if has_more { json!(format!("page_{}", offset + limit)) } else { Value::Null },
            "url": "/v1/payment_intents/search",
        }))
    })
}

async fn retrieve_refund(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    app.read(&headers, None, |account, _, _| {
        account
            .refunds
            .iter()
            .find(|r| r.id == id)
            .map(Refund::to_json)
            .ok_or_else(|| ApiError::no_such("refund", &id, "id"))
    })
}

async fn list_refunds(
    State(app): State<App>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    app.read(&headers, query, |account, params, _| {
        let intent = params.get("payment_intent");
        let charge = params.get("charge");
        page(
            account.refunds.iter().filter(|r| {
                intent.is_none_or(|pi| r.payment_intent == pi)
                    && charge.is_none_or(|ch| r.charge.as_deref() == Some(ch))
            }),
            |r| &r.id,
            params,
            "/v1/refunds",
            Refund::to_json,
        )
    })
}

async fn unrecognized_url(method: Method, uri: axum::http::Uri) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        None,
        &format!(
            "Unrecognized request URL ({method}: {}). Please see https://stripe.com/docs or we can help at https://support.stripe.com/.",
            uri.path()
        ),
    )
    .into_response()
}

/// Secret or restricted keys, as bearer tokens.
async fn authenticate(request: Request, next: Next) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let token = header
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim);
    match token {
        Some(token) if is_api_key(token) => next.run(request).await,
        Some(token) if !token.is_empty() => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            None,
            &format!("Invalid API Key provided: {}", mask(token)),
        )
        .into_response(),
        _ => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            None,
            "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY'). See https://stripe.com/docs/api#authentication for details, or we can help at https://support.stripe.com/.",
        )
        .into_response(),
    }
}

fn is_api_key(token: &str) -> bool {
    ["sk_test_", "sk_live_", "rk_test_", "rk_live_"]
        .iter()
        .any(|prefix| {
            token.strip_prefix(prefix).is_some_and(|rest| {
                !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        })
}

/// A key as Stripe echoes it in errors: the last four characters only.
fn mask(token: &str) -> String {
    let chars: Vec<char> = token.chars().collect();
    if chars.len() <= 8 {
        return "*".repeat(chars.len());
    }
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{}{tail}", "*".repeat(chars.len() - 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_query_parses_in_either_quote_style() {
        for text in [
            "metadata['saga_key']:'abc'",
            "metadata[\"saga_key\"]:\"abc\"",
        ] {
            let query = SearchQuery::parse(text).unwrap();
            assert_eq!(
                query.clauses,
                vec![Clause {
                    negated: false,
                    field: Field::Metadata("saga_key".into()),
                    value: "abc".into()
                }]
            );
        }
        let both = SearchQuery::parse("status:'succeeded' AND metadata['k']:'v'").unwrap();
        assert_eq!(both.clauses.len(), 2);
        assert!(!both.any);
    }

    #[test]
    fn queries_the_simulator_cannot_answer_are_refused_in_stripes_shape() {
        for text in [
            "",
            "metadata['k']",
            "amount>100",
            "email:'a@b.c'",
            "status:'a' AND status:'b' OR status:'c'",
            "metadata['k']:'unclosed",
        ] {
            let err = SearchQuery::parse(text).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{text}");
            assert_eq!(err.body()["error"]["type"], "invalid_request_error");
            assert_eq!(err.body()["error"]["param"], "query");
        }
    }

    #[test]
    fn form_parameters_decode_brackets_and_plus() {
        let params =
            Params::from_text("metadata%5Bsaga_key%5D=k1&description=two+words&amount=5").unwrap();
        assert_eq!(params.metadata().get("saga_key").unwrap(), "k1");
        assert_eq!(params.get("description"), Some("two words"));
        assert_eq!(params.integer("amount").unwrap(), Some(5));
    }

    #[test]
    fn keys_are_masked_to_their_last_four_characters() {
        assert_eq!(mask("sk_test_abcdef123456"), "****************3456");
        assert!(is_api_key("sk_test_abc123"));
        assert!(!is_api_key("sk_test_"));
        assert!(!is_api_key("pk_test_abc"));
    }
}
