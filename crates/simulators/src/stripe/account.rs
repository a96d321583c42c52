//! The simulated account: PaymentIntents and Refunds, their state
//! machines, and the idempotency layer's saved answers.

use super::*;

#[derive(Default)]
pub(super) struct Account {
    /// In creation order; lists answer newest first.
    pub(super) intents: Vec<Intent>,
    pub(super) refunds: Vec<Refund>,
    pub(super) idempotency: HashMap<String, Saved>,
}

pub(super) struct Saved {
    pub(super) endpoint: String,
    pub(super) params: Vec<(String, String)>,
    pub(super) status: StatusCode,
    pub(super) body: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IntentStatus {
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresCapture,
    Succeeded,
    Canceled,
}

impl IntentStatus {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            IntentStatus::RequiresPaymentMethod => "requires_payment_method",
            IntentStatus::RequiresConfirmation => "requires_confirmation",
            IntentStatus::RequiresCapture => "requires_capture",
            IntentStatus::Succeeded => "succeeded",
            IntentStatus::Canceled => "canceled",
        }
    }
}

pub(super) struct Intent {
    pub(super) id: String,
    pub(super) client_secret: String,
    pub(super) amount: i64,
    pub(super) amount_capturable: i64,
    pub(super) amount_received: i64,
    /// Not a PaymentIntent field (it lives on the Charge); kept to refuse
    /// refunding more than was captured.
    pub(super) amount_refunded: i64,
    pub(super) capture_method: String,
    pub(super) currency: String,
    pub(super) customer: Option<String>,
    pub(super) description: Option<String>,
    pub(super) receipt_email: Option<String>,
    pub(super) metadata: BTreeMap<String, String>,
    pub(super) payment_method: Option<String>,
    pub(super) payment_method_types: Vec<String>,
    pub(super) automatic_payment_methods: Option<Value>,
    pub(super) status: IntentStatus,
    pub(super) last_payment_error: Option<Value>,
    pub(super) latest_charge: Option<String>,
    pub(super) canceled_at: Option<i64>,
    pub(super) cancellation_reason: Option<String>,
    pub(super) created: i64,
    /// When it was created, on the simulator's clock: the Search API sees
    /// it only once the search lag has passed. (Later changes are not
    /// modelled as stale in the index; the connector re-reads what search
    /// finds anyway.)
    pub(super) created_on_clock: Duration,
}

impl Intent {
    pub(super) fn to_json(&self) -> Value {
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

pub(super) struct Refund {
    pub(super) id: String,
    pub(super) amount: i64,
    pub(super) charge: Option<String>,
    pub(super) currency: String,
    pub(super) metadata: BTreeMap<String, String>,
    pub(super) payment_intent: String,
    pub(super) reason: Option<String>,
    pub(super) created: i64,
}

impl Refund {
    pub(super) fn to_json(&self) -> Value {
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

pub(super) fn random_id(len: usize) -> String {
    rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(len)
        .map(char::from)
        .collect()
}

pub(super) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// An amount in major units for messages, as Stripe words them.
pub(super) fn money(amount: i64, currency: &str) -> String {
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
pub(super) fn decline_for(payment_method: &str) -> Option<(&'static str, &'static str)> {
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

impl Account {
    pub(super) fn intent_mut(&mut self, id: &str) -> Result<&mut Intent, ApiError> {
        self.intents
            .iter_mut()
            .find(|i| i.id == id)
            .ok_or_else(|| ApiError::no_such("payment_intent", id, "intent"))
    }

    pub(super) fn create_intent(&mut self, write: &Write) -> Result<Value, ApiError> {
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

    pub(super) fn capture_intent(&mut self, id: &str, write: &Write) -> Result<Value, ApiError> {
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

    pub(super) fn cancel_intent(&mut self, id: &str, write: &Write) -> Result<Value, ApiError> {
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

    pub(super) fn create_refund(&mut self, write: &Write) -> Result<Value, ApiError> {
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
pub(super) fn page<'a, T>(
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
