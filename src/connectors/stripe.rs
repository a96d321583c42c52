//! The Stripe connector: payments as PaymentIntents, and the ways back
//! (capture, cancel, refund), each carrying the step's key natively.
//!
//! ```toml
//! [connectors.stripe]
//! base_url = "https://api.stripe.com"
//! secret_key_env = "STRIPE_SECRET_KEY"   # sent as `Authorization: Bearer sk_…`
//! api_version = "2024-06-20"             # optional: sent as `Stripe-Version`
//! ```
//!
//! | operation          | arguments                                                                   |
//! |--------------------|-----------------------------------------------------------------------------|
//! | `stripe.authorize` | customer, amount (minor units), currency, payment_method?, description?, order_id? |
//! | `stripe.charge`    | customer, amount, currency, payment_method?, receipt_email?, description?   |
//! | `stripe.capture`   | intent_key (the authorize step's key), amount?, customer?                   |
//! | `stripe.cancel`    | intent_key, reason?, customer?                                              |
//! | `stripe.refund`    | charge_key (the charge or captured authorize step's key), amount?, reason?, customer? |
//!
//! R5: every write sends `Idempotency-Key: <key>`, and what it creates
//! carries the key in metadata: `saga_key` on PaymentIntents and Refunds,
//! `saga_capture_key` on a captured PaymentIntent (writing `saga_key` there
//! would overwrite the authorize step's key, which later steps look up).
//!
//! R7: a PaymentIntent is found by its `saga_key` through the Search API
//! and, because search lags writes by up to a minute, also through the list
//! endpoint (the customer's recent PaymentIntents), which does not lag.
//! Refunds are not searchable: they are found in the PaymentIntent's list
//! of refunds. Capture, cancel and refund find their PaymentIntent the same
//! way, by the original step's key, before they act; "already captured /
//! canceled / refunded" answers with the object as it is, so a repeated
//! compensation is confirmed rather than refused.

use super::wire::{self, Wire};
use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use async_trait::async_trait;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::RequestBuilder;
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{json, Value};

const NAME: &str = "stripe";
const FIELDS: &[&str] = &["base_url", "secret_key_env", "api_version"];
const DEFAULT_PAYMENT_METHOD: &str = "pm_card_visa";
/// Pages of 100 recent objects read when looking without search.
const LIST_PAGES: usize = 3;
/// Characters left as they are in an object id put into a path.
const ID_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'-');

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    Authorize,
    Charge,
    Capture,
    Cancel,
    Refund,
}

impl Operation {
    const ALL: [Operation; 5] = [
        Operation::Authorize,
        Operation::Charge,
        Operation::Capture,
        Operation::Cancel,
        Operation::Refund,
    ];

    fn name(self) -> &'static str {
        match self {
            Operation::Authorize => "stripe.authorize",
            Operation::Charge => "stripe.charge",
            Operation::Capture => "stripe.capture",
            Operation::Cancel => "stripe.cancel",
            Operation::Refund => "stripe.refund",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Operation::ALL.into_iter().find(|op| op.name() == name)
    }

    /// The object a successful answer is, and the statuses it may have.
    fn expected(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Operation::Authorize => ("payment_intent", &["requires_capture", "succeeded"]),
            Operation::Charge => ("payment_intent", &["succeeded", "processing"]),
            Operation::Capture => ("payment_intent", &["succeeded"]),
            // A captured intent holds nothing any more: see `cancel`.
            Operation::Cancel => ("payment_intent", &["canceled", "succeeded"]),
            Operation::Refund => ("refund", &["succeeded", "pending", "requires_action"]),
        }
    }
}

/// Stripe's PaymentIntents and Refunds, by the `[connectors.stripe]` table.
#[derive(Clone, Debug)]
pub struct StripeConnector {
    wire: Wire,
    base_url: String,
    secret_key: SecretString,
    api_version: Option<String>,
}

impl StripeConnector {
    pub fn from_settings(table: &toml::Table, wire: Wire) -> Result<Self, Vec<String>> {
        let mut mistakes = Vec::new();
        for field in table.keys().filter(|f| !FIELDS.contains(&f.as_str())) {
            mistakes.push(format!(
                "connector `{NAME}`, field `{field}`: not a setting of this connector (it takes {})",
                FIELDS.join(", ")
            ));
        }
        let base_url = wire::base_url(table, NAME)
            .map_err(|e| mistakes.push(e))
            .ok();
        let secret_key = wire::setting(table, NAME, "secret_key_env")
            .and_then(|variable| {
                let key = wire::secret_from_env(NAME, "secret_key_env", variable)?;
                if key.expose_secret().starts_with("sk_") || key.expose_secret().starts_with("rk_") {
                    Ok(key)
                } else {
                    Err(format!(
                        "connector `{NAME}`, field `secret_key_env`: the environment variable {variable} does not hold a Stripe secret or restricted key (one starting sk_ or rk_)"
                    ))
                }
            })
            .map_err(|e| mistakes.push(e))
            .ok();
        let api_version = match table.get("api_version") {
            None => None,
            Some(_) => wire::setting(table, NAME, "api_version")
                .map(str::to_owned)
                .map_err(|e| mistakes.push(e))
                .ok(),
        };
        match (base_url, secret_key) {
            (Some(base_url), Some(secret_key)) if mistakes.is_empty() => Ok(StripeConnector {
                wire,
                base_url,
                secret_key,
                api_version,
            }),
            _ => Err(mistakes),
        }
    }

    pub fn operations(&self) -> Vec<String> {
        Operation::ALL
            .iter()
            .map(|op| op.name().to_owned())
            .collect()
    }

    fn authorised(&self, request: RequestBuilder) -> RequestBuilder {
        let request = request.bearer_auth(self.secret_key.expose_secret());
        match &self.api_version {
            Some(version) => request.header("Stripe-Version", version),
            None => request,
        }
    }

    fn get(&self, path: &str, query: &[(&str, &str)]) -> RequestBuilder {
        self.authorised(
            self.wire
                .client()
                .get(format!("{}{path}", self.base_url))
                .query(query),
        )
    }

    fn post(&self, path: &str, key: &str, form: &[(String, String)]) -> RequestBuilder {
        self.authorised(self.wire.client().post(format!("{}{path}", self.base_url)))
            .header("Idempotency-Key", key)
            .form(form)
    }

    /// Sends a write and marks Stripe's `idempotency_error` (R4: unknown).
    async fn send(&self, request: RequestBuilder) -> CallReport {
        match self.wire.send(request).await {
            CallReport::Answered { status, body, .. } => {
                let idempotency_conflict = body
                    .as_ref()
                    .and_then(|b| b.pointer("/error/type"))
                    .and_then(Value::as_str)
                    == Some("idempotency_error");
                CallReport::Answered {
                    status,
                    body,
                    idempotency_conflict,
                }
            }
            other => other,
        }
    }

    // ---- execute -------------------------------------------------------

    async fn pay(&self, op: Operation, key: &str, args: &Value) -> CallReport {
        match Payment::from_args(op, args) {
            Ok(payment) => {
                let form = payment.form(op, key);
                self.send(self.post("/v1/payment_intents", key, &form))
                    .await
            }
            Err(reason) => CallReport::NotSent { reason },
        }
    }

    async fn capture(&self, key: &str, args: &Value) -> CallReport {
        let op = Operation::Capture;
        let amount = match amount_arg(op, args, "amount") {
            Ok(amount) => amount,
            Err(reason) => return CallReport::NotSent { reason },
        };
        let intent = match self.target(op, args, "intent_key").await {
            Ok(intent) => intent,
            Err(report) => return report,
        };
        if status_of(&intent) == "succeeded" {
            return already_done(intent);
        }
        let mut form = vec![("metadata[saga_capture_key]".to_owned(), key.to_owned())];
        if let Some(amount) = amount {
            form.push(("amount_to_capture".into(), amount.to_string()));
        }
        let path = format!("/v1/payment_intents/{}/capture", segment(&intent));
        self.send(self.post(&path, key, &form)).await
    }

    async fn cancel(&self, key: &str, args: &Value) -> CallReport {
        let op = Operation::Cancel;
        let reason = match text_arg(op, args, "reason") {
            Ok(reason) => reason,
            Err(reason) => return CallReport::NotSent { reason },
        };
        let intent = match self.target(op, args, "intent_key").await {
            Ok(intent) => intent,
            Err(report) => return report,
        };
        // Releasing a hold is done once no hold remains: cancelled, or
        // captured (the money then moved under the capture step, whose own
        // compensation, a refund, takes it back).
        if matches!(status_of(&intent), "canceled" | "succeeded") {
            return already_done(intent);
        }
        let form: Vec<(String, String)> = reason
            .map(|r| ("cancellation_reason".to_owned(), r.to_owned()))
            .into_iter()
            .collect();
        let path = format!("/v1/payment_intents/{}/cancel", segment(&intent));
        self.send(self.post(&path, key, &form)).await
    }

    async fn refund(&self, key: &str, args: &Value) -> CallReport {
        let op = Operation::Refund;
        let (amount, reason) = match (amount_arg(op, args, "amount"), text_arg(op, args, "reason"))
        {
            (Ok(amount), Ok(reason)) => (amount, reason),
            (Err(reason), _) | (_, Err(reason)) => return CallReport::NotSent { reason },
        };
        let intent = match self.target(op, args, "charge_key").await {
            Ok(intent) => intent,
            Err(report) => return report,
        };
        let intent_id = id_of(&intent).unwrap_or_default();
        let refunds = match self.refunds_of(&intent_id).await {
            Ok(refunds) => refunds,
            Err(e) => {
                return CallReport::NotSent {
                    reason: format!(
                    "{}: could not read the refunds of {intent_id}, so no refund was sent ({e})",
                    op.name()
                ),
                }
            }
        };
        if let Some(done) = refunds.iter().find(|r| carries(r, "saga_key", key)) {
            return already_done(done.clone());
        }
        if let Some(latest) = fully_refunded(&intent, &refunds) {
            return already_done(latest);
        }
        let mut form = vec![
            ("payment_intent".to_owned(), intent_id),
            ("metadata[saga_key]".to_owned(), key.to_owned()),
        ];
        if let Some(charge_key) = args.get("charge_key").and_then(Value::as_str) {
            form.push(("metadata[charge_key]".into(), charge_key.to_owned()));
        }
        if let Some(amount) = amount {
            form.push(("amount".into(), amount.to_string()));
        }
        if let Some(reason) = reason {
            form.push(("reason".into(), reason.to_owned()));
        }
        self.send(self.post("/v1/refunds", key, &form)).await
    }

    /// The PaymentIntent an operation acts on, found by the original step's
    /// key in `field`. Not found is Stripe-shaped 404 (the call fails: there
    /// is nothing to act on); a lookup that could not be made sends nothing.
    async fn target(&self, op: Operation, args: &Value, field: &str) -> Result<Value, CallReport> {
        let not_sent = |reason: String| CallReport::NotSent { reason };
        let original = required_text(op, args, field).map_err(not_sent)?;
        let customer = text_arg(op, args, "customer").map_err(not_sent)?;
        match self.find_intent(original, customer).await {
            Ok(Some(intent)) => Ok(intent),
            Ok(None) => Err(CallReport::Answered {
                status: 404,
                body: Some(json!({"error": {
                    "type": "invalid_request_error",
                    "code": "resource_missing",
                    "param": field,
                    "message": format!(
                        "No PaymentIntent carries metadata saga_key '{original}' (searched, then listed recent PaymentIntents): there is nothing to {}.",
                        op.name().trim_start_matches("stripe.")
                    ),
                }})),
                idempotency_conflict: false,
            }),
            Err(e) => Err(CallReport::NotSent {
                reason: format!(
                    "{}: could not look up the PaymentIntent with saga key {original}, so nothing was sent ({e})",
                    op.name()
                ),
            }),
        }
    }

    // ---- finding by key (R7) --------------------------------------------

    /// The PaymentIntent whose `metadata.saga_key` is `key`, as it is now.
    async fn find_intent(
        &self,
        key: &str,
        customer: Option<&str>,
    ) -> Result<Option<Value>, LookupError> {
        let searched = self.search_intent(key).await;
        if let Ok(Some(id)) = &searched {
            let path = format!(
                "/v1/payment_intents/{}",
                utf8_percent_encode(id, ID_SEGMENT)
            );
            let intent = self.wire.read_ok(self.get(&path, &[])).await?;
            return Ok(Some(intent));
        }
        let listed = self.list_intent(key, customer).await;
        match (searched, listed) {
            (_, Ok(Listing::Found(intent))) => Ok(Some(intent)),
            (Ok(_), Ok(_)) | (Err(_), Ok(Listing::AllRead)) => Ok(None),
            (Err(e), Ok(Listing::Truncated)) => Err(LookupError::Unavailable(format!(
                "the Search API failed ({e}) and the recent PaymentIntents listed did not include the key"
            ))),
            (_, Err(e)) => Err(e),
        }
    }

    /// The Search API: fast, but it lags writes.
    async fn search_intent(&self, key: &str) -> Result<Option<String>, LookupError> {
        let query = format!("metadata['saga_key']:'{}'", escape_query(key));
        let body = self
            .wire
            .read_ok(self.get("/v1/payment_intents/search", &[("query", &query)]))
            .await?;
        Ok(data(&body)?
            .iter()
            // Search matches case-insensitively; the key must match exactly.
            .find(|intent| carries(intent, "saga_key", key))
            .and_then(id_of))
    }

    /// The list endpoint, newest first: it does not lag.
    async fn list_intent(&self, key: &str, customer: Option<&str>) -> Result<Listing, LookupError> {
        let mut after: Option<String> = None;
        for _ in 0..LIST_PAGES {
            let mut query = vec![("limit", "100")];
            if let Some(customer) = customer {
                query.push(("customer", customer));
            }
            if let Some(after) = after.as_deref() {
                query.push(("starting_after", after));
            }
            let body = self
                .wire
                .read_ok(self.get("/v1/payment_intents", &query))
                .await?;
            let page = data(&body)?;
            if let Some(found) = page.iter().find(|i| carries(i, "saga_key", key)) {
                return Ok(Listing::Found(found.clone()));
            }
            match (has_more(&body), page.last().and_then(id_of)) {
                (true, Some(last)) => after = Some(last),
                _ => return Ok(Listing::AllRead),
            }
        }
        Ok(Listing::Truncated)
    }

    /// The refunds of one PaymentIntent, newest first.
    async fn refunds_of(&self, intent_id: &str) -> Result<Vec<Value>, LookupError> {
        let mut refunds = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..LIST_PAGES {
            let mut query = vec![("payment_intent", intent_id), ("limit", "100")];
            if let Some(after) = after.as_deref() {
                query.push(("starting_after", after));
            }
            let body = self.wire.read_ok(self.get("/v1/refunds", &query)).await?;
            let page = data(&body)?;
            refunds.extend(page.iter().cloned());
            match (has_more(&body), page.last().and_then(id_of)) {
                (true, Some(last)) => after = Some(last),
                _ => return Ok(refunds),
            }
        }
        Err(LookupError::Unavailable(format!(
            "{intent_id} has more refunds than this connector reads"
        )))
    }
}

/// What listing recent PaymentIntents found.
enum Listing {
    Found(Value),
    /// Every page was read and the key was on none.
    AllRead,
    /// The pages read did not include the key, and there were more.
    Truncated,
}

/// The arguments of `stripe.authorize` and `stripe.charge`.
struct Payment<'a> {
    customer: &'a str,
    amount: i64,
    currency: String,
    payment_method: &'a str,
    description: Option<&'a str>,
    receipt_email: Option<&'a str>,
    order_id: Option<&'a str>,
}

impl<'a> Payment<'a> {
    fn from_args(op: Operation, args: &'a Value) -> Result<Self, String> {
        let amount = amount_arg(op, args, "amount")?
            .ok_or_else(|| format!("{}: argument `amount` is missing", op.name()))?;
        let currency = required_text(op, args, "currency")?;
        if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(format!(
                "{}: argument `currency` must be a three-letter ISO code such as \"usd\", got {currency:?}",
                op.name()
            ));
        }
        Ok(Payment {
            customer: required_text(op, args, "customer")?,
            amount,
            currency: currency.to_ascii_lowercase(),
            payment_method: text_arg(op, args, "payment_method")?.unwrap_or(DEFAULT_PAYMENT_METHOD),
            description: text_arg(op, args, "description")?,
            receipt_email: text_arg(op, args, "receipt_email")?,
            order_id: text_arg(op, args, "order_id")?,
        })
    }

    /// The form Stripe takes: confirmed at once, cards only (no redirect
    /// methods, so no `return_url`), the key in metadata.
    fn form(&self, op: Operation, key: &str) -> Vec<(String, String)> {
        let capture_method = match op {
            Operation::Authorize => "manual",
            _ => "automatic",
        };
        let mut form: Vec<(String, String)> = [
            ("amount", self.amount.to_string()),
            ("currency", self.currency.clone()),
            ("customer", self.customer.to_owned()),
            ("payment_method", self.payment_method.to_owned()),
            ("confirm", "true".into()),
            ("capture_method", capture_method.into()),
            ("automatic_payment_methods[enabled]", "true".into()),
            ("automatic_payment_methods[allow_redirects]", "never".into()),
            ("metadata[saga_key]", key.to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        if let Some(order_id) = self.order_id {
            form.push(("metadata[order_id]".into(), order_id.to_owned()));
        }
        if let Some(description) = self.description {
            form.push(("description".into(), description.to_owned()));
        }
        if let Some(email) = self.receipt_email {
            form.push(("receipt_email".into(), email.to_owned()));
        }
        form
    }
}

fn text_arg<'a>(op: Operation, args: &'a Value, field: &str) -> Result<Option<&'a str>, String> {
    match args.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if !text.trim().is_empty() => Ok(Some(text)),
        Some(other) => Err(format!(
            "{}: argument `{field}` must be a non-empty string, got {other}",
            op.name()
        )),
    }
}

fn required_text<'a>(op: Operation, args: &'a Value, field: &str) -> Result<&'a str, String> {
    text_arg(op, args, field)?
        .ok_or_else(|| format!("{}: argument `{field}` is missing", op.name()))
}

/// A positive whole number of minor units (1250 for 12.50); a string of
/// digits is taken too, as templates may render one.
fn amount_arg(op: Operation, args: &Value, field: &str) -> Result<Option<i64>, String> {
    let amount = match args.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(text)) => text.trim().parse().ok(),
        Some(_) => None,
    };
    match amount {
        Some(amount) if amount > 0 => Ok(Some(amount)),
        _ => Err(format!(
            "{}: argument `{field}` must be a positive whole number of minor units (1250 for 12.50), got {}",
            op.name(),
            args[field]
        )),
    }
}

/// The status of a PaymentIntent after a lookup, as an R7 answer.
fn settled_payment(op: Operation, intent: &Value) -> Result<Lookup, LookupError> {
    let id = id_of(intent).unwrap_or_default();
    let found = || Lookup::FoundSucceeded {
        external_ref: id.clone(),
        result: intent.clone(),
    };
    let declined = intent
        .get("last_payment_error")
        .is_some_and(|e| !e.is_null());
    match status_of(intent) {
        "succeeded" | "requires_capture" => Ok(found()),
        // An authorization later released: the hold existed; its undo is
        // confirmed as already done.
        "canceled" if op == Operation::Authorize && !declined => Ok(found()),
        "canceled" => Ok(Lookup::FoundFailed {
            error: format!("the PaymentIntent {id} was canceled before any payment"),
        }),
        "requires_payment_method" => Ok(Lookup::FoundFailed {
            error: failure_of(intent),
        }),
        "requires_action" => Ok(Lookup::FoundFailed {
            error: format!(
                "the PaymentIntent {id} needs the customer to authenticate the card; no payment was taken"
            ),
        }),
        other => Err(LookupError::Unavailable(format!(
            "the PaymentIntent {id} is {other}: not settled yet"
        ))),
    }
}

/// Why a PaymentIntent holds no payment, in Stripe's words.
fn failure_of(intent: &Value) -> String {
    let error = intent.get("last_payment_error").filter(|e| !e.is_null());
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("the PaymentIntent has no successful payment");
    let codes: Vec<&str> = ["code", "decline_code"]
        .iter()
        .filter_map(|f| error.and_then(|e| e.get(*f)).and_then(Value::as_str))
        .collect();
    if codes.is_empty() {
        message.to_owned()
    } else {
        format!("{message} ({})", codes.join(": "))
    }
}

/// The newest live refund when refunds already cover everything received.
fn fully_refunded(intent: &Value, refunds: &[Value]) -> Option<Value> {
    let received = intent.get("amount_received").and_then(Value::as_i64)?;
    let live: Vec<&Value> = refunds
        .iter()
        .filter(|r| matches!(status_of(r), "succeeded" | "pending" | "requires_action"))
        .collect();
    let refunded: i64 = live
        .iter()
        .filter_map(|r| r.get("amount").and_then(Value::as_i64))
        .sum();
    (received > 0 && refunded >= received)
        .then(|| live.first().map(|r| (*r).clone()))
        .flatten()
}

/// The object as Stripe holds it now: the effect is already in place.
fn already_done(object: Value) -> CallReport {
    CallReport::Answered {
        status: 200,
        body: Some(object),
        idempotency_conflict: false,
    }
}

fn data(body: &Value) -> Result<&Vec<Value>, LookupError> {
    body.get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| LookupError::Unavailable("Stripe answered a list without `data`".into()))
}

fn has_more(body: &Value) -> bool {
    body.get("has_more")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn id_of(object: &Value) -> Option<String> {
    object
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

fn status_of(object: &Value) -> &str {
    object
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn carries(object: &Value, field: &str, key: &str) -> bool {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        == Some(key)
}

/// An object's id, encoded for a path.
fn segment(object: &Value) -> String {
    utf8_percent_encode(&id_of(object).unwrap_or_default(), ID_SEGMENT).to_string()
}

/// A value inside a quoted search string: quotes and backslashes escaped.
fn escape_query(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

#[async_trait]
impl Connector for StripeConnector {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        match Operation::from_name(operation) {
            Some(op @ (Operation::Authorize | Operation::Charge)) => self.pay(op, key, args).await,
            Some(Operation::Capture) => self.capture(key, args).await,
            Some(Operation::Cancel) => self.cancel(key, args).await,
            Some(Operation::Refund) => self.refund(key, args).await,
            None => CallReport::NotSent {
                reason: format!("the Stripe connector has no operation {operation}"),
            },
        }
    }

    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        let op = Operation::from_name(operation).ok_or(LookupError::Unsupported)?;
        let customer = text_arg(op, args, "customer").map_err(LookupError::Unavailable)?;
        let original =
            |field: &str| required_text(op, args, field).map_err(LookupError::Unavailable);
        match op {
            Operation::Authorize | Operation::Charge => {
                match self.find_intent(key, customer).await? {
                    Some(intent) => settled_payment(op, &intent),
                    None => Ok(Lookup::NotFound),
                }
            }
            Operation::Capture | Operation::Cancel => {
                let wanted: &[&str] = if op == Operation::Capture {
                    &["succeeded"]
                } else {
                    &["canceled", "succeeded"]
                };
                match self.find_intent(original("intent_key")?, customer).await? {
                    Some(intent) if wanted.contains(&status_of(&intent)) => {
                        Ok(Lookup::FoundSucceeded {
                            external_ref: id_of(&intent).unwrap_or_default(),
                            result: intent,
                        })
                    }
                    _ => Ok(Lookup::NotFound),
                }
            }
            Operation::Refund => {
                let Some(intent) = self.find_intent(original("charge_key")?, customer).await?
                else {
                    return Ok(Lookup::NotFound);
                };
                let refunds = self.refunds_of(&id_of(&intent).unwrap_or_default()).await?;
                let found = refunds
                    .iter()
                    .find(|r| carries(r, "saga_key", key))
                    .cloned()
                    .or_else(|| fully_refunded(&intent, &refunds));
                Ok(match found {
                    None => Lookup::NotFound,
                    Some(refund) => match status_of(&refund) {
                        "failed" | "canceled" => Lookup::FoundFailed {
                            error: format!(
                                "the refund {} is {}",
                                id_of(&refund).unwrap_or_default(),
                                status_of(&refund)
                            ),
                        },
                        _ => Lookup::FoundSucceeded {
                            external_ref: id_of(&refund).unwrap_or_default(),
                            result: refund,
                        },
                    },
                })
            }
        }
    }

    fn has_lookup(&self, operation: &str) -> bool {
        Operation::from_name(operation).is_some()
    }

    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        let (object, statuses) = Operation::from_name(operation)?.expected();
        let fits = body.get("object").and_then(Value::as_str) == Some(object)
            && statuses.contains(&status_of(body));
        if fits {
            id_of(body)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str) -> Operation {
        Operation::from_name(name).unwrap()
    }

    #[test]
    fn amounts_are_whole_minor_units() {
        let authorize = op("stripe.authorize");
        assert_eq!(
            amount_arg(authorize, &json!({"amount": 1250}), "amount"),
            Ok(Some(1250))
        );
        assert_eq!(
            amount_arg(authorize, &json!({"amount": "1250"}), "amount"),
            Ok(Some(1250))
        );
        for bad in [
            json!(12.5),
            json!(0),
            json!(-3),
            json!("12.50"),
            json!(true),
        ] {
            let err = amount_arg(authorize, &json!({ "amount": bad }), "amount").unwrap_err();
            assert!(err.contains("stripe.authorize: argument `amount`"), "{err}");
        }
    }

    #[test]
    fn a_declined_intent_is_found_failed_with_stripes_reason() {
        let intent = json!({
            "id": "pi_1", "object": "payment_intent", "status": "requires_payment_method",
            "last_payment_error": {"message": "Your card was declined.", "code": "card_declined", "decline_code": "generic_decline"}
        });
        assert_eq!(
            settled_payment(op("stripe.charge"), &intent),
            Ok(Lookup::FoundFailed {
                error: "Your card was declined. (card_declined: generic_decline)".into()
            })
        );
    }

    #[test]
    fn a_search_value_escapes_its_quotes() {
        assert_eq!(escape_query(r"a'b\c"), r"a\'b\\c");
    }

    #[test]
    fn the_secret_key_never_prints() {
        let connector = StripeConnector {
            wire: Wire::new(&Default::default()),
            base_url: "http://127.0.0.1:1".into(),
            secret_key: "sk_test_very_secret".into(),
            api_version: None,
        };
        let shown = format!("{connector:?}");
        assert!(
            shown.contains("127.0.0.1") && !shown.contains("very_secret"),
            "{shown}"
        );
    }
}
