//! A warehouse's shipping API: replacement shipments created with an
//! `Idempotency-Key`, found by their reference, cancelled while they have
//! not left. Reached through the generic HTTP connector.

use super::{mount, searchable, Replay, Replays, SimState};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SYSTEM: &str = "warehouse";

#[derive(Clone)]
struct Warehouse {
    sim: SimState,
    shipments: Arc<Mutex<Vec<(Value, Duration)>>>,
    replays: Replays,
}

pub fn router(sim: &SimState) -> Router {
    let state = Warehouse {
        sim: sim.clone(),
        shipments: Arc::default(),
        replays: Replays::default(),
    };
    let routes = Router::new()
        .route("/v1/shipments", post(create).get(find))
        .route(
            "/v1/shipments/by-reference/{reference}/cancel",
            post(cancel),
        )
        .with_state(state);
    mount(routes, sim, super::orders::error)
}

#[derive(Deserialize)]
struct NewShipment {
    order_id: String,
    reference: String,
    #[serde(default)]
    items: Value,
}

async fn create(
    State(state): State<Warehouse>,
    headers: HeaderMap,
    Json(params): Json<Value>,
) -> Response {
    let shipment: NewShipment = match serde_json::from_value(params.clone()) {
        Ok(shipment) => shipment,
        Err(e) => return super::orders::error(StatusCode::UNPROCESSABLE_ENTITY, &e.to_string()),
    };
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return super::orders::error(
            StatusCode::BAD_REQUEST,
            "an Idempotency-Key header is required to create a shipment",
        );
    };
    match state.replays.check(key, &params) {
        Replay::Again(status, body) => return (status, Json(body)).into_response(),
        Replay::Conflict => {
            return super::orders::error(
                StatusCode::CONFLICT,
                "this Idempotency-Key was used with other parameters",
            )
        }
        Replay::Fresh => {}
    }
    let mut shipments = state.shipments.lock().expect("shipments lock");
    let id = format!("shp_{}", shipments.len() + 1);
    let body = json!({"id": id, "order_id": shipment.order_id, "items": shipment.items,
                      "reference": shipment.reference, "status": "pending"});
    shipments.push((body.clone(), state.sim.clock.now()));
    drop(shipments);
    state
        .sim
        .ledger
        .record(SYSTEM, "shipment.created", Some(key), &id, body.clone());
    state
        .replays
        .remember(key, &params, StatusCode::CREATED, &body);
    (StatusCode::CREATED, Json(body)).into_response()
}

#[derive(Deserialize)]
struct ByReference {
    reference: String,
}

async fn find(State(state): State<Warehouse>, Query(query): Query<ByReference>) -> Json<Value> {
    let shipments = state.shipments.lock().expect("shipments lock");
    let data: Vec<Value> = shipments
        .iter()
        .filter(|(s, created)| {
            s["reference"] == query.reference.as_str() && searchable(&state.sim, *created)
        })
        .map(|(s, _)| s.clone())
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn cancel(State(state): State<Warehouse>, Path(reference): Path<String>) -> Response {
    let mut shipments = state.shipments.lock().expect("shipments lock");
    let Some((shipment, _)) = shipments
        .iter_mut()
        .find(|(s, _)| s["reference"] == reference.as_str())
    else {
        return super::orders::error(
            StatusCode::NOT_FOUND,
            &format!("no shipment with reference {reference:?}"),
        );
    };
    if shipment["status"] == "pending" {
        shipment["status"] = json!("cancelled");
        let id = shipment["id"].as_str().unwrap_or_default().to_owned();
        state.sim.ledger.record(
            SYSTEM,
            "shipment.cancelled",
            Some(&reference),
            &id,
            shipment.clone(),
        );
    }
    Json(shipment.clone()).into_response()
}
