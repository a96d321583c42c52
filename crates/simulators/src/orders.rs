//! The support team's own back office, as internal APIs usually are: orders
//! and refund policies to read, and email drafts written with an
//! `Idempotency-Key` and found again by their reference. The generic HTTP
//! connector talks to it through operations declared in the tools file.

use super::{mount, searchable, Replay, Replays, SimState};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SYSTEM: &str = "orders";

#[derive(Clone)]
struct Orders {
    sim: SimState,
    drafts: Arc<Mutex<Vec<Draft>>>,
    replays: Replays,
}

#[derive(Clone)]
struct Draft {
    body: Value,
    created: Duration,
}

/// The error shape of this API: `{"error": {"code", "message"}}`.
pub fn error(status: StatusCode, message: &str) -> Response {
    let code = match status.as_u16() {
        404 => "not_found",
        409 => "conflict",
        422 => "invalid",
        429 => "rate_limited",
        401 => "unauthenticated",
        _ => "error",
    };
    (
        status,
        Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

pub fn router(sim: &SimState) -> Router {
    let state = Orders {
        sim: sim.clone(),
        drafts: Arc::default(),
        replays: Replays::default(),
    };
    let routes = Router::new()
        .route("/v1/orders", get(list_orders))
        .route("/v1/policies/{topic}", get(policy))
        .route("/v1/drafts", post(create_draft).get(find_drafts))
        .route(
            "/v1/drafts/by-reference/{reference}/delete",
            post(delete_draft),
        )
        .with_state(state);
    mount(routes, sim, error)
}

/// A few customers' orders, the same on every start, so the demo and the
/// tests can refer to them.
fn catalogue() -> Vec<Value> {
    vec![
        json!({"id": "ord_1001", "customer": "cus_ada", "email": "ada@example.com",
               "items": [{"sku": "KETTLE-2", "name": "Kettle", "quantity": 1}],
               "total": 4900, "currency": "usd", "status": "delivered_damaged"}),
        json!({"id": "ord_1002", "customer": "cus_grace", "email": "grace@example.com",
               "items": [{"sku": "LAMP-7", "name": "Desk lamp", "quantity": 1}],
               "total": 3200, "currency": "usd", "status": "lost_in_transit"}),
        json!({"id": "ord_1003", "customer": "cus_alan", "email": "alan@example.com",
               "items": [{"sku": "MUG-1", "name": "Mug", "quantity": 4}],
               "total": 2400, "currency": "usd", "status": "delivered"}),
    ]
}

#[derive(Deserialize)]
struct OrderQuery {
    customer: Option<String>,
    email: Option<String>,
}

async fn list_orders(Query(query): Query<OrderQuery>) -> Response {
    if query.customer.is_none() && query.email.is_none() {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "give `customer` or `email` to search orders",
        );
    }
    let data: Vec<Value> = catalogue()
        .into_iter()
        .filter(|order| {
            query
                .customer
                .as_deref()
                .is_none_or(|c| order["customer"] == c)
                && query.email.as_deref().is_none_or(|e| order["email"] == e)
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn policy(Path(topic): Path<String>) -> Response {
    let text = match topic.as_str() {
        "refunds" => "Damaged or lost items are refunded in full to the original payment method within 5 business days. A replacement may be shipped instead at the customer's choice.",
        "reshipping" => "Replacements ship free by standard post. One replacement per order; after that, refund.",
        "apologies" => "Apologise once, in the ticket's language, and never promise a date the warehouse has not confirmed.",
        _ => return error(StatusCode::NOT_FOUND, &format!("no policy on {topic:?}")),
    };
    Json(json!({"topic": topic, "text": text, "version": 3})).into_response()
}

#[derive(Deserialize)]
struct NewDraft {
    to: String,
    subject: String,
    body: String,
    reference: String,
}

async fn create_draft(
    State(state): State<Orders>,
    headers: HeaderMap,
    Json(params): Json<Value>,
) -> Response {
    let draft: NewDraft = match serde_json::from_value(params.clone()) {
        Ok(draft) => draft,
        Err(e) => return error(StatusCode::UNPROCESSABLE_ENTITY, &e.to_string()),
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(key) = &key {
        match state.replays.check(key, &params) {
            Replay::Again(status, body) => return (status, Json(body)).into_response(),
            Replay::Conflict => {
                return error(
                    StatusCode::CONFLICT,
                    "this Idempotency-Key was used with other parameters",
                )
            }
            Replay::Fresh => {}
        }
    }
    let mut drafts = state.drafts.lock().expect("drafts lock");
    let id = format!("dr_{}", drafts.len() + 1);
    let body = json!({"id": id, "to": draft.to, "subject": draft.subject, "body": draft.body,
                      "reference": draft.reference, "status": "draft"});
    drafts.push(Draft {
        body: body.clone(),
        created: state.sim.clock.now(),
    });
    drop(drafts);
    state.sim.ledger.record(
        SYSTEM,
        "draft.created",
        Some(&draft.reference),
        &id,
        body.clone(),
    );
    if let Some(key) = &key {
        state
            .replays
            .remember(key, &params, StatusCode::CREATED, &body);
    }
    (StatusCode::CREATED, Json(body)).into_response()
}

#[derive(Deserialize)]
struct DraftQuery {
    reference: String,
}

async fn find_drafts(State(state): State<Orders>, Query(query): Query<DraftQuery>) -> Json<Value> {
    let drafts = state.drafts.lock().expect("drafts lock");
    let data: Vec<Value> = drafts
        .iter()
        .filter(|d| d.body["reference"] == query.reference.as_str())
        .filter(|d| searchable(&state.sim, d.created))
        .map(|d| d.body.clone())
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// Deleting twice answers the same: the draft is gone either way.
async fn delete_draft(State(state): State<Orders>, Path(reference): Path<String>) -> Response {
    let mut drafts = state.drafts.lock().expect("drafts lock");
    let Some(draft) = drafts
        .iter_mut()
        .find(|d| d.body["reference"] == reference.as_str())
    else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("no draft with reference {reference:?}"),
        );
    };
    if draft.body["status"] != "deleted" {
        draft.body["status"] = json!("deleted");
        let id = draft.body["id"].as_str().unwrap_or_default().to_owned();
        state.sim.ledger.record(
            SYSTEM,
            "draft.deleted",
            Some(&reference),
            &id,
            draft.body.clone(),
        );
    }
    Json(draft.body.clone()).into_response()
}
