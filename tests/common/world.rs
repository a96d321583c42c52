//! An in-process model of the outside world for engine tests: a payments
//! system with native idempotency, a ticket system without it (searched by
//! label), a mail sender with no lookup at all, and a warehouse. Every
//! effect is recorded with its key, so tests check what really happened,
//! independently of the saga log. Faults are queued per operation.
#![allow(dead_code)]

use async_trait::async_trait;
use saga_harness::saga::connector::{CallReport, Connector, Lookup, LookupError};
use saga_harness::saga::status::StepStatus;
use saga_harness::saga::store::SagaStore;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use uuid::Uuid;

/// What goes wrong on the next call of an operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The effect happens, then the gateway answers 504.
    EffectThen504,
    /// The effect happens, then no answer comes in time.
    EffectThenTimeout,
    /// The effect happens, then the connection drops.
    EffectThenReset,
    /// The effect happens, then a proxy answers 200 with a blank page.
    EffectThenBlank,
    /// Nothing happens and nothing answers.
    TimeoutWithoutEffect,
    /// Nothing happens; the system answers this status.
    Status(u16),
    /// The request never leaves.
    Refused,
    /// Nothing happens; the system refuses for now (a 429, an SMTP 4xx),
    /// asking the caller to wait this long when given.
    Deferred(Option<std::time::Duration>),
}

/// One effect that really happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Effect {
    pub operation: String,
    pub key: String,
    pub args: Value,
    pub id: String,
}

#[derive(Default)]
struct State {
    effects: Vec<Effect>,
    /// Ticket id → closed?
    tickets: HashMap<String, bool>,
    /// Charge id → refunded?
    charges: HashMap<String, bool>,
    /// Authorisation id → released?
    holds: HashMap<String, bool>,
    faults: HashMap<String, VecDeque<Fault>>,
    /// Lookups that answer "not found" before the search index catches up.
    lookup_lag: HashMap<String, usize>,
    lookup_down: bool,
    next_id: u64,
    /// Compensations aimed at something that never existed.
    ghosts: usize,
    /// Every call that reached the world, effect or not: operation and when.
    sends: Vec<(String, std::time::Instant)>,
}

#[derive(Default)]
pub struct World {
    state: Mutex<State>,
}

impl World {
    pub fn new() -> Self {
        World::default()
    }

    pub fn fail_next(&self, operation: &str, fault: Fault) {
        self.lock()
            .faults
            .entry(operation.into())
            .or_default()
            .push_back(fault);
    }

    pub fn lag_lookups(&self, operation: &str, times: usize) {
        self.lock().lookup_lag.insert(operation.into(), times);
    }

    pub fn lookups_down(&self, down: bool) {
        self.lock().lookup_down = down;
    }

    pub fn effects(&self, operation: &str) -> Vec<Effect> {
        self.lock()
            .effects
            .iter()
            .filter(|e| e.operation == operation)
            .cloned()
            .collect()
    }

    /// Every effect, in the order it happened.
    pub fn all_effects(&self) -> Vec<Effect> {
        self.lock().effects.clone()
    }

    /// When each call of `operation` reached the world, whatever came of it.
    pub fn sent_at(&self, operation: &str) -> Vec<std::time::Instant> {
        self.lock()
            .sends
            .iter()
            .filter(|(op, _)| op == operation)
            .map(|(_, at)| *at)
            .collect()
    }

    pub fn ghosts(&self) -> usize {
        self.lock().ghosts
    }

    pub fn open_tickets(&self) -> usize {
        self.lock()
            .tickets
            .values()
            .filter(|closed| !**closed)
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn find(state: &State, operation: &str, key: &str) -> Option<Effect> {
        state
            .effects
            .iter()
            .find(|e| e.operation == operation && e.key == key)
            .cloned()
    }

    /// Applies the effect of a call; `Err` is the system's refusal.
    fn apply(
        state: &mut State,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Value, (u16, Value)> {
        fn new_id(state: &mut State, prefix: &str) -> String {
            state.next_id += 1;
            format!("{prefix}_{}", state.next_id)
        }
        let (id, body) = match operation {
            "tickets.create" => {
                // No native idempotency: the same key twice is two tickets.
                let id = new_id(state, "T");
                state.tickets.insert(id.clone(), false);
                (id.clone(), json!({"id": id, "key": key}))
            }
            "tickets.close" => {
                let target = args["ticket_key"].as_str().unwrap_or_default();
                let Some(ticket) = Self::find(state, "tickets.create", target) else {
                    state.ghosts += 1;
                    return Err((404, json!({"errorMessages": ["Issue does not exist"]})));
                };
                let closed = state.tickets.get_mut(&ticket.id).expect("ticket recorded");
                if *closed {
                    // Already closed: a second close changes nothing.
                    return Ok(json!({"id": ticket.id, "status": "closed"}));
                }
                *closed = true;
                (
                    ticket.id.clone(),
                    json!({"id": ticket.id, "status": "closed"}),
                )
            }
            "payments.authorize" => {
                if let Some(existing) = Self::find(state, operation, key) {
                    return Ok(json!({"id": existing.id, "status": "requires_capture"}));
                }
                let id = new_id(state, "pi");
                state.holds.insert(id.clone(), false);
                (id.clone(), json!({"id": id, "status": "requires_capture"}))
            }
            "payments.cancel" => {
                let target = args["intent_key"].as_str().unwrap_or_default();
                let Some(hold) = Self::find(state, "payments.authorize", target) else {
                    state.ghosts += 1;
                    return Err((404, json!({"error": {"message": "No such payment_intent"}})));
                };
                if let Some(done) = Self::find(state, operation, key) {
                    return Ok(json!({"id": done.id, "status": "canceled"}));
                }
                state.holds.insert(hold.id.clone(), true);
                (
                    hold.id.clone(),
                    json!({"id": hold.id, "status": "canceled"}),
                )
            }
            "payments.charge" | "payments.refund" => {
                // Native idempotency: the same key returns the first result.
                if let Some(existing) = Self::find(state, operation, key) {
                    return Ok(json!({"id": existing.id}));
                }
                if operation == "payments.refund" {
                    let target = args["charge_key"].as_str().unwrap_or_default();
                    let Some(charge) = Self::find(state, "payments.charge", target) else {
                        state.ghosts += 1;
                        return Err((404, json!({"error": {"message": "No such charge"}})));
                    };
                    let refunded = state.charges.get_mut(&charge.id).expect("charge recorded");
                    if *refunded {
                        return Err((
                            400,
                            json!({"error": {"code": "charge_already_refunded", "message": "already refunded"}}),
                        ));
                    }
                    *refunded = true;
                    (new_id(state, "re"), Value::Null)
                } else {
                    let id = new_id(state, "ch");
                    state.charges.insert(id.clone(), false);
                    (id, Value::Null)
                }
            }
            "mail.send" => (new_id(state, "msg"), Value::Null),
            "warehouse.reship" => (new_id(state, "ship"), Value::Null),
            "warehouse.cancel" => {
                let target = args["shipment_key"].as_str().unwrap_or_default();
                if Self::find(state, "warehouse.reship", target).is_none() {
                    state.ghosts += 1;
                    return Err((404, json!({"message": "no such shipment"})));
                }
                if let Some(done) = Self::find(state, "warehouse.cancel", key) {
                    return Ok(json!({"id": done.id}));
                }
                (new_id(state, "cancel"), Value::Null)
            }
            "crm.lookup" => {
                return Ok(json!({"id": "", "customer": args["customer"].clone(), "orders": 2}))
            }
            other => return Err((404, json!({"message": format!("no operation {other}")}))),
        };
        state.effects.push(Effect {
            operation: operation.into(),
            key: key.into(),
            args: args.clone(),
            id: id.clone(),
        });
        Ok(if body.is_null() {
            json!({"id": id})
        } else {
            body
        })
    }
}

#[async_trait]
impl Connector for World {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        let mut state = self.lock();
        state
            .sends
            .push((operation.to_owned(), std::time::Instant::now()));
        let fault = state
            .faults
            .get_mut(operation)
            .and_then(VecDeque::pop_front);
        match fault {
            Some(Fault::TimeoutWithoutEffect) => return CallReport::TimedOut,
            Some(Fault::Deferred(retry_after)) => {
                return CallReport::Deferred {
                    reason: "HTTP 429: rate limited".into(),
                    retry_after,
                }
            }
            Some(Fault::Refused) => {
                return CallReport::NotSent {
                    reason: "connection refused".into(),
                }
            }
            Some(Fault::Status(status)) => {
                return CallReport::Answered {
                    status,
                    body: Some(json!({"message": "refused by the model world"})),
                    idempotency_conflict: false,
                }
            }
            _ => {}
        }
        let applied = Self::apply(&mut state, operation, key, args);
        match (fault, applied) {
            (Some(Fault::EffectThen504), _) => CallReport::Answered {
                status: 504,
                body: None,
                idempotency_conflict: false,
            },
            (Some(Fault::EffectThenReset), _) => CallReport::ResetAfterSend,
            (Some(Fault::EffectThenTimeout), _) => CallReport::TimedOut,
            (Some(Fault::EffectThenBlank), _) => CallReport::Answered {
                status: 200,
                body: None,
                idempotency_conflict: false,
            },
            (_, Ok(body)) => CallReport::Answered {
                status: 200,
                body: Some(body),
                idempotency_conflict: false,
            },
            (_, Err((status, body))) => CallReport::Answered {
                status,
                body: Some(body),
                idempotency_conflict: false,
            },
        }
    }

    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        _args: &Value,
    ) -> Result<Lookup, LookupError> {
        if !self.has_lookup(operation) {
            return Err(LookupError::Unsupported);
        }
        let mut state = self.lock();
        if state.lookup_down {
            return Err(LookupError::Unavailable("search is down".into()));
        }
        if let Some(lag) = state.lookup_lag.get_mut(operation) {
            if *lag > 0 {
                *lag -= 1;
                return Ok(Lookup::NotFound);
            }
        }
        Ok(match Self::find(&state, operation, key) {
            Some(effect) => Lookup::FoundSucceeded {
                external_ref: effect.id.clone(),
                result: json!({"id": effect.id}),
            },
            None => Lookup::NotFound,
        })
    }

    fn has_lookup(&self, operation: &str) -> bool {
        operation != "mail.send"
    }

    fn external_ref(&self, _operation: &str, body: &Value) -> Option<String> {
        body.get("id").and_then(Value::as_str).map(str::to_owned)
    }
}

/// Records, at the moment of every call, whether its intent row was already
/// committed (R2: no row, no call), then lets the world act.
pub struct Witness {
    pub world: Arc<World>,
    pub store: Arc<dyn SagaStore>,
    /// The run whose compensation rows count as intent rows too.
    pub run: Mutex<Option<Uuid>>,
    pub calls: Mutex<usize>,
    pub violations: Mutex<Vec<String>>,
}

impl Witness {
    pub fn new(world: Arc<World>, store: Arc<dyn SagaStore>) -> Self {
        Witness {
            world,
            store,
            run: Mutex::new(None),
            calls: Mutex::new(0),
            violations: Mutex::new(Vec::new()),
        }
    }

    async fn intent_committed(&self, key: &str) -> bool {
        if let Ok(Some(step)) = self.store.step_by_key(key).await {
            return step.status == StepStatus::Intended;
        }
        let Some(run) = *self.run.lock().unwrap() else {
            return false;
        };
        let compensations = self.store.compensations(run).await.unwrap_or_default();
        compensations
            .iter()
            .any(|c| c.idempotency_key == key && c.status == StepStatus::Intended)
    }
}

#[async_trait]
impl Connector for Witness {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        if operation != "crm.lookup" {
            *self.calls.lock().unwrap() += 1;
            if !self.intent_committed(key).await {
                self.violations.lock().unwrap().push(format!(
                    "{operation} with key {key} ran without a committed INTENDED row"
                ));
            }
        }
        self.world.execute(operation, key, args).await
    }
    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        self.world.lookup(operation, key, args).await
    }
    fn has_lookup(&self, operation: &str) -> bool {
        self.world.has_lookup(operation)
    }
    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        self.world.external_ref(operation, body)
    }
}

/// The tools the engine tests register, over the model world.
/// Every operation the model world serves (what `TOOLS` calls).
pub const OPERATIONS: &[&str] = &[
    "crm.lookup",
    "tickets.create",
    "tickets.close",
    "payments.authorize",
    "payments.cancel",
    "payments.charge",
    "payments.refund",
    "mail.send",
    "warehouse.reship",
    "warehouse.cancel",
];

pub const TOOLS: &str = r#"
[[tool]]
name = "crm.lookup"
class = "pure"
connector = "crm.lookup"

[[tool]]
name = "authorize_card"
class = "reversible"
connector = "payments.authorize"
audience = "internal"
settle_ms = 0
undo = { tool = "cancel_authorization", args = { intent_key = "{key}" } }

[[tool]]
name = "cancel_authorization"
class = "compensatable"
connector = "payments.cancel"
settle_ms = 0
compensation = { tool = "authorize_card", args = {} }

[[tool]]
name = "release_hold"
class = "compensatable"
connector = "payments.cancel"
way_back_only = true

[[tool]]
name = "create_ticket"
class = "compensatable"
connector = "tickets.create"
settle_ms = 0
compensation = { tool = "close_ticket", args = { ticket_key = "{key}" } }

[[tool]]
name = "close_ticket"
class = "compensatable"
connector = "tickets.close"
settle_ms = 0
compensation = { tool = "create_ticket", args = { summary = "reopened" } }

[[tool]]
name = "charge_card"
class = "compensatable"
connector = "payments.charge"
audience = "finance"
audience_when = [{ arg = "receipt", equals = true, audience = "customer" }]
settle_ms = 0
compensation = { tool = "refund", args = { charge_key = "{key}", amount = "{args.amount}" } }
correction.customer = { template = "We have refunded the charge on your card.", recipients = ["{args.email}"], via = "mail.send" }
correction.finance = { template = "A charge without a receipt was refunded.", recipients = ["finance@example.com"], via = "mail.send" }

[[tool]]
name = "email_customer"
class = "irreversible"
connector = "mail.send"
audience = "customer"
correction = { template = "Please disregard our last message.", recipients = ["{args.to}"] }

[[tool]]
name = "announce"
class = "irreversible"
connector = "mail.send"
audience = "public"
gated = true
correction = { template = "Correction to our announcement.", recipients = ["all-customers"] }

[[tool]]
name = "refund"
class = "irreversible"
connector = "payments.refund"
audience = "finance"
settle_ms = 0
correction = { template = "A refund was issued in error.", recipients = ["finance@example.com"] }

[[tool]]
name = "cancel_shipment"
class = "irreversible"
connector = "warehouse.cancel"
settle_ms = 0
correction = { template = "Shipment cancelled.", recipients = ["warehouse@example.com"] }

[[tool]]
name = "reship"
class = "compensatable"
connector = "warehouse.reship"
settle_ms = 0
compensation = { tool = "cancel_shipment", args = { shipment_key = "{key}" } }
"#;

/// A new run of `agent`'s, without a label.
pub async fn new_run(
    store: &dyn SagaStore,
    agent: &str,
    purpose: &str,
) -> saga_harness::saga::model::Run {
    store
        .create_run(saga_harness::saga::model::NewRun {
            agent: agent.into(),
            label: None,
            purpose: purpose.into(),
        })
        .await
        .expect("a run")
        .0
}
