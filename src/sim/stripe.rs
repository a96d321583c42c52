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

#[derive(Default)]
struct Account {
    /// In creation order; lists answer newest first.
    intents: Vec<Intent>,
    refunds: Vec<Refund>,
    idempotency: HashMap<String, Saved>,
}

struct Saved {
    endpoint: String,
    params: Vec<(String, String)>,
    status: StatusCode,
    body: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IntentStatus {
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresCapture,
    Succeeded,
    Canceled,
}

impl IntentStatus {
    fn as_str(self) -> &'static str {
        match self {
            IntentStatus::RequiresPaymentMethod => "requires_payment_method",
            IntentStatus::RequiresConfirmation => "requires_confirmation",
            IntentStatus::RequiresCapture => "requires_capture",
            IntentStatus::Succeeded => "succeeded",
            IntentStatus::Canceled => "canceled",
        }
    }
}

struct Intent {
    id: String,
    client_secret: String,
    amount: i64,
    amount_capturable: i64,
    amount_received: i64,
    /// Not a PaymentIntent field (it lives on the Charge); kept to refuse
    /// refunding more than was captured.
    amount_refunded: i64,
    capture_method: String,
    currency: String,
    customer: Option<String>,
    description: Option<String>,
    receipt_email: Option<String>,
    metadata: BTreeMap<String, String>,
    payment_method: Option<String>,
    payment_method_types: Vec<String>,
    automatic_payment_methods: Option<Value>,
    status: IntentStatus,
    last_payment_error: Option<Value>,
    latest_charge: Option<String>,
    canceled_at: Option<i64>,
    cancellation_reason: Option<String>,
    created: i64,
    /// When it was created, on the simulator's clock: the Search API sees
    /// it only once the search lag has passed. (Later changes are not
    /// modelled as stale in the index; the connector re-reads what search
    /// finds anyway.)
    created_on_clock: Duration,
}

impl Intent {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "payment_intent",
            "amount": self.amount,
            "amount_capturable": self.amount_capturable,
            "amount_details": {"tip": {}},
            "amount_received": self.amount_received,
            "application": null,
            "application_fee_amount": null,
            "automatic_payment_methods": self.automatic_payment_methods,
            "canceled_at": self.canceled_at,
            "cancellation_reason": self.cancellation_reason,
            "capture_method": self.capture_method,
            "client_secret": self.client_secret,
            "confirmation_method": "automatic",
            "created": self.created,
            "currency": self.currency,
            "customer": self.customer,
            "description": self.description,
            "last_payment_error": self.last_payment_error,
            "latest_charge": self.latest_charge,
            "livemode": false,
            "metadata": self.metadata,
            "next_action": null,
            "on_behalf_of": null,
            "payment_method": self.payment_method,
            "payment_method_types": self.payment_method_types,
            "processing": null,
            "receipt_email": self.receipt_email,
            "review": null,
            "setup_future_usage": null,
            "shipping": null,
            "statement_descriptor": null,
            "statement_descriptor_suffix": null,
            "status": self.status.as_str(),
            "transfer_data": null,
            "transfer_group": null,
        })
    }
}

struct Refund {
    id: String,
    amount: i64,
    charge: Option<String>,
    currency: String,
    metadata: BTreeMap<String, String>,
    payment_intent: String,
    reason: Option<String>,
    created: i64,
}

impl Refund {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "refund",
            "amount": self.amount,
            "balance_transaction": format!("txn_{}", &self.id[3..]),
            "charge": self.charge,
            "created": self.created,
            "currency": self.currency,
            "destination_details": {"type": "card", "card": {"type": "refund"}},
            "metadata": self.metadata,
            "payment_intent": self.payment_intent,
            "reason": self.reason,
            "receipt_number": null,
            "source_transfer_reversal": null,
            "status": "succeeded",
            "transfer_reversal": null,
        })
    }
}

/// A Stripe API error, and whether the idempotency layer saves it.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    fields: Map<String, Value>,
    saved: bool,
}

impl ApiError {
    fn new(status: StatusCode, kind: &str, code: Option<&str>, message: &str) -> Self {
        let mut fields = Map::new();
        if let Some(code) = code {
            fields.insert("code".into(), json!(code));
            fields.insert(
                "doc_url".into(),
                json!(format!(
                    "https://stripe.com/docs/error-codes/{}",
                    code.replace('_', "-")
                )),
            );
        }
        fields.insert("message".into(), json!(message));
        fields.insert("type".into(), json!(kind));
        ApiError {
            status,
            fields,
            saved: false,
        }
    }

    /// A 400 `invalid_request_error` without a code.
    fn invalid(message: &str) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            message,
        )
    }

    fn with(mut self, field: &str, value: Value) -> Self {
        self.fields.insert(field.to_owned(), value);
        self
    }

    fn param(self, name: &str) -> Self {
        self.with("param", json!(name))
    }

    /// The endpoint ran and this is its answer: a retry with the same key
    /// gets it again.
    fn saved(mut self) -> Self {
        self.saved = true;
        self
    }

    fn missing(param: &str) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("parameter_missing"),
            &format!("Missing required param: {param}."),
        )
        .param(param)
    }

    fn no_such(object: &str, id: &str, param: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("resource_missing"),
            &format!("No such {object}: '{id}'"),
        )
        .param(param)
    }

    fn body(&self) -> Value {
        json!({"error": self.fields})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// Form or query parameters in Stripe's bracket notation
/// (`metadata[saga_key]=…`, `payment_method_types[]=card`).
#[derive(Debug, Default)]
struct Params(Vec<(String, String)>);

impl Params {
    fn from_form(body: &Bytes) -> Result<Self, ApiError> {
        let text = std::str::from_utf8(body)
            .map_err(|_| ApiError::invalid("Invalid request: the body is not UTF-8."))?;
        Params::from_text(text)
    }

    fn from_text(text: &str) -> Result<Self, ApiError> {
        let mut pairs = Vec::new();
        for part in text.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').unwrap_or((part, ""));
            pairs.push((decode(name)?, decode(value)?));
        }
        Ok(Params(pairs))
    }

    /// The last value given for `name`, as Stripe takes it.
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::missing(name))
    }

    fn integer(&self, name: &str) -> Result<Option<i64>, ApiError> {
        let Some(text) = self.get(name) else {
            return Ok(None);
        };
        let value: i64 = text.parse().map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("parameter_invalid_integer"),
                &format!("Invalid integer: {text}"),
            )
            .param(name)
        })?;
        if value < 1 {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("parameter_invalid_integer"),
                "This value must be greater than or equal to 1.",
            )
            .param(name));
        }
        Ok(Some(value))
    }

    fn boolean(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("parameter_invalid_boolean"),
                &format!("Invalid boolean: {other}"),
            )
            .param(name)),
        }
    }

    fn one_of(&self, name: &str, allowed: &[&str]) -> Result<Option<String>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(value) if allowed.contains(&value) => Ok(Some(value.to_owned())),
            Some(value) => Err(ApiError::invalid(&format!(
                "Invalid {name}: must be one of {}; got {value:?}",
                allowed.join(", ")
            ))
            .param(name)),
        }
    }

    /// `metadata[k]=v` pairs; an empty value unsets the key.
    fn metadata(&self) -> BTreeMap<String, String> {
        let mut metadata = BTreeMap::new();
        for (name, value) in &self.0 {
            if let Some(key) = name
                .strip_prefix("metadata[")
                .and_then(|k| k.strip_suffix(']'))
            {
                metadata.insert(key.to_owned(), value.clone());
            }
        }
        metadata
    }

    fn check_metadata(&self) -> Result<(), ApiError> {
        for (key, value) in self.metadata() {
            if key.is_empty() || key.len() > 40 || key.contains(['[', ']']) {
                return Err(ApiError::invalid(&format!(
                    "Invalid metadata key {key:?}: keys are 1 to 40 characters without square brackets."
                ))
                .param(&format!("metadata[{key}]")));
            }
            if value.len() > 500 {
                return Err(ApiError::invalid(&format!(
                    "Invalid metadata[{key}]: values can be at most 500 characters."
                ))
                .param(&format!("metadata[{key}]")));
            }
        }
        Ok(())
    }

    /// Stripe refuses parameters an endpoint does not know.
    fn check_known(&self, known: &[&str]) -> Result<(), ApiError> {
        for (name, _) in &self.0 {
            let top = name.split('[').next().unwrap_or(name);
            if !known.contains(&top) && top != "expand" {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    Some("parameter_unknown"),
                    &format!("Received unknown parameter: {name}"),
                )
                .param(name));
            }
        }
        Ok(())
    }

    fn list_values(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(n, _)| {
                n.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('['))
            })
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The parameters in a canonical order, for comparing a retry with the
    /// request its key was first used with.
    fn sorted(&self) -> Vec<(String, String)> {
        let mut pairs = self.0.clone();
        pairs.sort();
        pairs
    }

    fn limit(&self) -> Result<usize, ApiError> {
        match self.integer("limit")? {
            None => Ok(10),
            Some(n) if n <= 100 => Ok(n as usize),
            Some(_) => Err(
                ApiError::invalid("This value must be less than or equal to 100.").param("limit"),
            ),
        }
    }
}

fn decode(text: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(&text.replace('+', " "))
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| ApiError::invalid("Invalid request: a parameter is not valid UTF-8."))
}

fn random_id(len: usize) -> String {
    rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(len)
        .map(char::from)
        .collect()
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// An amount in major units for messages, as Stripe words them.
fn money(amount: i64, currency: &str) -> String {
    let major = format!("{}.{:02}", amount / 100, amount % 100);
    match currency {
        "usd" => format!("${major}"),
        "eur" => format!("€{major}"),
        "gbp" => format!("£{major}"),
        other => format!("{major} {}", other.to_uppercase()),
    }
}

/// The test payment methods that decline, with Stripe's decline codes and
/// messages.
fn decline_for(payment_method: &str) -> Option<(&'static str, &'static str)> {
    match payment_method {
        "pm_card_chargeDeclined" | "pm_card_visa_chargeDeclined" => {
            Some(("generic_decline", "Your card was declined."))
        }
        "pm_card_chargeDeclinedInsufficientFunds" => {
            Some(("insufficient_funds", "Your card has insufficient funds."))
        }
        "pm_card_chargeDeclinedLostCard" => Some(("lost_card", "Your card was declined.")),
        "pm_card_chargeDeclinedStolenCard" => Some(("stolen_card", "Your card was declined.")),
        _ => None,
    }
}

const CREATE_PARAMS: &[&str] = &[
    "amount",
    "currency",
    "customer",
    "payment_method",
    "payment_method_types",
    "payment_method_options",
    "automatic_payment_methods",
    "confirm",
    "capture_method",
    "confirmation_method",
    "description",
    "receipt_email",
    "metadata",
    "return_url",
    "off_session",
    "setup_future_usage",
    "statement_descriptor",
    "statement_descriptor_suffix",
    "shipping",
    "error_on_requires_action",
    "mandate_data",
    "on_behalf_of",
    "transfer_data",
    "transfer_group",
    "application_fee_amount",
    "use_stripe_sdk",
    "radar_options",
];

impl Account {
    fn intent_mut(&mut self, id: &str) -> Result<&mut Intent, ApiError> {
        self.intents
            .iter_mut()
            .find(|i| i.id == id)
            .ok_or_else(|| ApiError::no_such("payment_intent", id, "intent"))
    }

    fn create_intent(&mut self, write: &Write) -> Result<Value, ApiError> {
        let params = write.params;
        params.check_known(CREATE_PARAMS)?;
        let amount = params
            .integer("amount")?
            .ok_or_else(|| ApiError::missing("amount"))?;
        let currency = params.required("currency")?.to_ascii_lowercase();
        if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_lowercase()) {
            return Err(
                ApiError::invalid(&format!("Invalid currency: {currency}.")).param("currency")
            );
        }
        let customer = params.get("customer").filter(|c| !c.is_empty());
        if let Some(customer) = customer {
            if !customer.starts_with("cus_") {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    Some("resource_missing"),
                    &format!("No such customer: '{customer}'"),
                )
                .param("customer"));
            }
        }
        let capture_method = params
            .one_of(
                "capture_method",
                &["automatic", "automatic_async", "manual"],
            )?
            .unwrap_or_else(|| "automatic_async".into());
        let confirm = params.boolean("confirm")?;
        params.check_metadata()?;
        let payment_method = params.get("payment_method").filter(|p| !p.is_empty());
        if let Some(pm) = payment_method {
            if !pm.starts_with("pm_") {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    Some("resource_missing"),
                    &format!("No such PaymentMethod: '{pm}'"),
                )
                .param("payment_method"));
            }
        }
        let mut payment_method_types = params.list_values("payment_method_types");
        let automatic = params.boolean("automatic_payment_methods[enabled]")?;
        let allow_redirects = params
            .get("automatic_payment_methods[allow_redirects]")
            .unwrap_or("always");
        if automatic && !payment_method_types.is_empty() {
            return Err(ApiError::invalid(
                "You may only specify one of these parameters: automatic_payment_methods, payment_method_types.",
            ));
        }
        if confirm && payment_method.is_none() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("payment_intent_unexpected_state"),
                "You cannot confirm this PaymentIntent because it's missing a payment method. To confirm the PaymentIntent with a payment method, pass one in `payment_method`.",
            ));
        }
        if confirm && automatic && allow_redirects != "never" && params.get("return_url").is_none()
        {
            return Err(ApiError::invalid(
                "A `return_url` must be specified because this Payment Intent is configured to automatically accept the payment methods enabled in the Dashboard, some of which may require a full page redirect to succeed. If you do not want to accept redirect-based payment methods, set `automatic_payment_methods[enabled]` to `true` and `automatic_payment_methods[allow_redirects]` to `never` when creating Setup Intents and Payment Intents.",
            ));
        }
        let automatic_payment_methods = if automatic {
            Some(json!({"allow_redirects": allow_redirects, "enabled": true}))
        } else {
            None
        };
        if payment_method_types.is_empty() {
            payment_method_types.push("card".into());
        }

        // The endpoint runs from here: what follows is saved for the key.
        let id = format!("pi_{}", random_id(24));
        let mut intent = Intent {
            client_secret: format!("{id}_secret_{}", random_id(25)),
            id,
            amount,
            amount_capturable: 0,
            amount_received: 0,
            amount_refunded: 0,
            capture_method,
            currency,
            customer: customer.map(str::to_owned),
            description: params.get("description").map(str::to_owned),
            receipt_email: params.get("receipt_email").map(str::to_owned),
            metadata: params
                .metadata()
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .collect(),
            payment_method: payment_method.map(str::to_owned),
            payment_method_types,
            automatic_payment_methods,
            status: if payment_method.is_some() {
                IntentStatus::RequiresConfirmation
            } else {
                IntentStatus::RequiresPaymentMethod
            },
            last_payment_error: None,
            latest_charge: None,
            canceled_at: None,
            cancellation_reason: None,
            created: unix_now(),
            created_on_clock: write.sim.clock.now(),
        };
        let mut declined = None;
        if confirm {
            let pm = payment_method.unwrap_or_default();
            let charge = format!("ch_{}", random_id(24));
            intent.latest_charge = Some(charge.clone());
            match decline_for(pm) {
                Some((decline_code, message)) => {
                    let error = json!({
                        "charge": charge,
                        "code": "card_declined",
                        "decline_code": decline_code,
                        "doc_url": "https://stripe.com/docs/error-codes/card-declined",
                        "message": message,
                        "payment_method": {"id": pm, "object": "payment_method", "type": "card"},
                        "type": "card_error",
                    });
                    intent.status = IntentStatus::RequiresPaymentMethod;
                    intent.last_payment_error = Some(error);
                    declined = Some((charge, decline_code, message));
                }
                None if intent.capture_method == "manual" => {
                    intent.status = IntentStatus::RequiresCapture;
                    intent.amount_capturable = amount;
                }
                None => {
                    intent.status = IntentStatus::Succeeded;
                    intent.amount_received = amount;
                }
            }
        }
        let body = intent.to_json();
        write.sim.ledger.record(
            SYSTEM,
            "payment_intent.created",
            write.ledger_key().as_deref(),
            &intent.id,
            json!({
                "amount": intent.amount,
                "currency": intent.currency,
                "status": intent.status.as_str(),
                "capture_method": intent.capture_method,
            }),
        );
        self.intents.push(intent);
        match declined {
            Some((charge, decline_code, message)) => Err(ApiError::new(
                StatusCode::PAYMENT_REQUIRED,
                "card_error",
                Some("card_declined"),
                message,
            )
            .with("decline_code", json!(decline_code))
            .with("charge", json!(charge))
            .with("payment_intent", body)
            .saved()),
            None => Ok(body),
        }
    }

    fn capture_intent(&mut self, id: &str, write: &Write) -> Result<Value, ApiError> {
        let params = write.params;
        params.check_known(&[
            "amount_to_capture",
            "metadata",
            "final_capture",
            "statement_descriptor",
            "statement_descriptor_suffix",
            "application_fee_amount",
            "transfer_data",
            "amount_details",
            "payment_details",
        ])?;
        let to_capture = params.integer("amount_to_capture")?;
        params.check_metadata()?;
        let intent = self.intent_mut(id)?;
        if intent.status != IntentStatus::RequiresCapture {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("payment_intent_unexpected_state"),
                &format!(
                    "This PaymentIntent could not be captured because it has a status of {}. Only a PaymentIntent with one of the following statuses may be captured: requires_capture.",
                    intent.status.as_str()
                ),
            )
            .with("payment_intent", intent.to_json())
            .saved());
        }
        let amount = to_capture.unwrap_or(intent.amount_capturable);
        if amount > intent.amount_capturable {
            return Err(ApiError::invalid(&format!(
                "The amount to capture ({amount}) must be less than or equal to the amount capturable ({}).",
                intent.amount_capturable
            ))
            .param("amount_to_capture")
            .saved());
        }
        for (key, value) in params.metadata() {
            if value.is_empty() {
                intent.metadata.remove(&key);
            } else {
                intent.metadata.insert(key, value);
            }
        }
        intent.status = IntentStatus::Succeeded;
        intent.amount_received = amount;
        intent.amount_capturable = 0;
        let body = intent.to_json();
        write.sim.ledger.record(
            SYSTEM,
            "payment_intent.captured",
            write.key,
            id,
            json!({"amount_received": amount, "status": "succeeded"}),
        );
        Ok(body)
    }

    fn cancel_intent(&mut self, id: &str, write: &Write) -> Result<Value, ApiError> {
        let params = write.params;
        params.check_known(&["cancellation_reason"])?;
        let reason = params.one_of(
            "cancellation_reason",
            &[
                "duplicate",
                "fraudulent",
                "requested_by_customer",
                "abandoned",
            ],
        )?;
        let intent = self.intent_mut(id)?;
        if matches!(
            intent.status,
            IntentStatus::Succeeded | IntentStatus::Canceled
        ) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("payment_intent_unexpected_state"),
                &format!(
                    "You cannot cancel this PaymentIntent because it has a status of {}. Only a PaymentIntent with one of the following statuses may be canceled: {CANCELABLE}.",
                    intent.status.as_str()
                ),
            )
            .with("payment_intent", intent.to_json())
            .saved());
        }
        intent.status = IntentStatus::Canceled;
        intent.canceled_at = Some(unix_now());
        intent.cancellation_reason = reason;
        intent.amount_capturable = 0;
        let body = intent.to_json();
        write.sim.ledger.record(
            SYSTEM,
            "payment_intent.canceled",
            write.key,
            id,
            json!({"status": "canceled"}),
        );
        Ok(body)
    }

    fn create_refund(&mut self, write: &Write) -> Result<Value, ApiError> {
        let params = write.params;
        params.check_known(&[
            "amount",
            "charge",
            "payment_intent",
            "metadata",
            "reason",
            "refund_application_fee",
            "reverse_transfer",
            "instructions_email",
        ])?;
        let amount = params.integer("amount")?;
        let reason = params.one_of(
            "reason",
            &["duplicate", "fraudulent", "requested_by_customer"],
        )?;
        params.check_metadata()?;
        let position = match (params.get("payment_intent"), params.get("charge")) {
            (Some(pi), _) => self
                .intents
                .iter()
                .position(|i| i.id == pi)
                .ok_or_else(|| ApiError::no_such("payment_intent", pi, "payment_intent"))?,
            (None, Some(charge)) => self
                .intents
                .iter()
                .position(|i| i.latest_charge.as_deref() == Some(charge))
                .ok_or_else(|| ApiError::no_such("charge", charge, "charge"))?,
            (None, None) => {
                return Err(ApiError::invalid(
                    "One of the following params should be provided for this request: payment_intent or charge.",
                ))
            }
        };
        let intent = &mut self.intents[position];
        if intent.status != IntentStatus::Succeeded {
            return Err(ApiError::invalid(&format!(
                "This PaymentIntent ({}) does not have a successful charge to refund.",
                intent.id
            ))
            .saved());
        }
        let charge = intent.latest_charge.clone().unwrap_or_default();
        let remaining = intent.amount_received - intent.amount_refunded;
        if remaining <= 0 {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("charge_already_refunded"),
                &format!("Charge {charge} has already been refunded."),
            )
            .saved());
        }
        let amount = amount.unwrap_or(remaining);
        if amount > remaining {
            let message = if intent.amount_refunded == 0 {
                format!(
                    "Refund amount ({}) is greater than charge amount ({})",
                    money(amount, &intent.currency),
                    money(intent.amount_received, &intent.currency)
                )
            } else {
                format!(
                    "Refund amount ({}) is greater than unrefunded amount on charge ({})",
                    money(amount, &intent.currency),
                    money(remaining, &intent.currency)
                )
            };
            return Err(ApiError::invalid(&message).param("amount").saved());
        }
        intent.amount_refunded += amount;
        let refund = Refund {
            id: format!("re_{}", random_id(24)),
            amount,
            charge: intent.latest_charge.clone(),
            currency: intent.currency.clone(),
            metadata: params
                .metadata()
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .collect(),
            payment_intent: intent.id.clone(),
            reason,
            created: unix_now(),
        };
        let body = refund.to_json();
        write.sim.ledger.record(
            SYSTEM,
            "refund.created",
            write.ledger_key().as_deref(),
            &refund.id,
            json!({"amount": amount, "payment_intent": refund.payment_intent, "charge": refund.charge}),
        );
        self.refunds.push(refund);
        Ok(body)
    }
}

/// A page of a list, newest first, after `starting_after` when given.
fn page<'a, T>(
    items: impl DoubleEndedIterator<Item = &'a T>,
    id_of: impl Fn(&T) -> &str,
    params: &Params,
    url: &str,
    render: impl Fn(&T) -> Value,
) -> Result<Value, ApiError>
where
    T: 'a,
{
    let limit = params.limit()?;
    let mut newest_first: Vec<&T> = items.rev().collect();
    if let Some(after) = params.get("starting_after") {
        let position = newest_first
            .iter()
            .position(|item| id_of(item) == after)
            .ok_or_else(|| ApiError::no_such("object", after, "starting_after"))?;
        newest_first.drain(..=position);
    }
    let has_more = newest_first.len() > limit;
    let data: Vec<Value> = newest_first.into_iter().take(limit).map(render).collect();
    Ok(json!({"object": "list", "data": data, "has_more": has_more, "url": url}))
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

/// The subset of Stripe's search query language the simulator understands:
/// `field:value` clauses on `metadata['key']`, `status`, `customer`,
/// `currency` and `amount`, joined by spaces / `AND`, or by `OR`, each
/// optionally negated with `-`. Anything else is refused as Stripe refuses
/// a query it cannot parse.
#[derive(Debug, PartialEq)]
struct SearchQuery {
    clauses: Vec<Clause>,
    any: bool,
}

#[derive(Debug, PartialEq)]
struct Clause {
    negated: bool,
    field: Field,
    value: String,
}

#[derive(Debug, PartialEq)]
enum Field {
    Metadata(String),
    Status,
    Customer,
    Currency,
    Amount,
}

impl SearchQuery {
    fn parse(text: &str) -> Result<Self, ApiError> {
        let refuse = |why: &str| {
            ApiError::invalid(&format!(
                "Invalid search query {text:?}: {why}. See https://stripe.com/docs/search#search-query-language."
            ))
            .param("query")
        };
        let mut parser = Cursor {
            chars: text.chars().collect(),
            at: 0,
        };
        let mut clauses = Vec::new();
        let mut joiners = Vec::new();
        loop {
            parser.skip_spaces();
            if parser.done() {
                break;
            }
            if !clauses.is_empty() {
                let word = parser.peek_word();
                if word.eq_ignore_ascii_case("and") || word.eq_ignore_ascii_case("or") {
                    joiners.push(word.to_ascii_lowercase());
                    parser.at += word.chars().count();
                    parser.skip_spaces();
                } else {
                    joiners.push("and".into());
                }
            }
            let negated = parser.eat('-');
            let name = parser.identifier();
            let field = match name.as_str() {
                "metadata" => {
                    if !parser.eat('[') {
                        return Err(refuse(
                            "metadata needs a key in brackets, as metadata['key']",
                        ));
                    }
                    let key = parser
                        .quoted()
                        .ok_or_else(|| refuse("a metadata key must be quoted"))?;
                    if !parser.eat(']') {
                        return Err(refuse("unclosed metadata key"));
                    }
                    Field::Metadata(key)
                }
                "status" => Field::Status,
                "customer" => Field::Customer,
                "currency" => Field::Currency,
                "amount" => Field::Amount,
                "" => return Err(refuse("expected a field")),
                other => {
                    return Err(refuse(&format!(
                        "the field `{other}` is not supported for payment_intents"
                    )))
                }
            };
            if !parser.eat(':') {
                return Err(refuse("only the `:` operator is supported here"));
            }
            let value = match field {
                Field::Amount => parser
                    .number()
                    .ok_or_else(|| refuse("amount takes a number"))?,
                _ => parser
                    .quoted()
                    .ok_or_else(|| refuse("string values must be quoted"))?,
            };
            clauses.push(Clause {
                negated,
                field,
                value,
            });
        }
        if clauses.is_empty() {
            return Err(refuse("the query is empty"));
        }
        let any = joiners.iter().any(|j| j == "or");
        if any && joiners.iter().any(|j| j == "and") {
            return Err(refuse("AND and OR cannot be combined in one query"));
        }
        Ok(SearchQuery { clauses, any })
    }

    fn matches(&self, intent: &Intent) -> bool {
        let hit = |clause: &Clause| {
            let found = match &clause.field {
                Field::Metadata(key) => intent
                    .metadata
                    .get(key)
                    .is_some_and(|v| v.eq_ignore_ascii_case(&clause.value)),
                Field::Status => intent.status.as_str() == clause.value,
                Field::Customer => intent.customer.as_deref() == Some(clause.value.as_str()),
                Field::Currency => intent.currency.eq_ignore_ascii_case(&clause.value),
                Field::Amount => intent.amount.to_string() == clause.value,
            };
            found != clause.negated
        };
        if self.any {
            self.clauses.iter().any(hit)
        } else {
            self.clauses.iter().all(hit)
        }
    }
}

struct Cursor {
    chars: Vec<char>,
    at: usize,
}

impl Cursor {
    fn done(&self) -> bool {
        self.at >= self.chars.len()
    }

    fn skip_spaces(&mut self) {
        while self.chars.get(self.at).is_some_and(|c| c.is_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, wanted: char) -> bool {
        if self.chars.get(self.at) == Some(&wanted) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn peek_word(&self) -> String {
        self.chars[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect()
    }

    fn identifier(&mut self) -> String {
        let word: String = self.chars[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == '_' || **c == '.')
            .collect();
        self.at += word.chars().count();
        word
    }

    fn number(&mut self) -> Option<String> {
        let digits: String = self.chars[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        self.at += digits.chars().count();
        (!digits.is_empty()).then_some(digits)
    }

    /// A string in single or double quotes; a backslash escapes the next
    /// character.
    fn quoted(&mut self) -> Option<String> {
        let quote = *self
            .chars
            .get(self.at)
            .filter(|c| **c == '\'' || **c == '"')?;
        self.at += 1;
        let mut out = String::new();
        loop {
            let c = *self.chars.get(self.at)?;
            self.at += 1;
            match c {
                '\\' => {
                    out.push(*self.chars.get(self.at)?);
                    self.at += 1;
                }
                c if c == quote => return Some(out),
                c => out.push(c),
            }
        }
    }
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
