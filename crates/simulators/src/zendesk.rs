//! A simulated Zendesk Support (the Ticketing API), speaking the paths,
//! fields, status codes and error bodies the Zendesk connector meets in
//! life.
//!
//! What it speaks (each path with or without `.json`):
//! - `POST /api/v2/tickets` — create; `{"ticket": {subject, comment: {body},
//!   external_id, tags, status, requester}}` → 201 `{"ticket": {…}}`.
//!   Honours `Idempotency-Key` as Zendesk documents it: the first use
//!   answers with `x-idempotency-lookup: miss`; a repeat with the same body
//!   replays the stored answer with `x-idempotency-lookup: hit` and creates
//!   nothing; a repeat with another body is 400 `IdempotentRequestError`.
//! - `GET /api/v2/tickets?external_id=K` — `{tickets, count, next_page,
//!   previous_page}`; new tickets stay invisible here for the simulator's
//!   search lag; deleted tickets are never listed.
//! - `GET|PUT|DELETE /api/v2/tickets/{id}` — show, update (status, comment,
//!   `additional_tags`; a closed ticket refuses updates), delete (204; the
//!   ticket is gone from listings and shows 404 after).
//!
//! Credentials: HTTP Basic `{email}/token:{api_token}` (or an OAuth bearer
//! token); anything else is 401 `{"error": "Couldn't authenticate you"}`.
//! Errors use Zendesk's shapes: `{"error": "RecordNotFound", "description":
//! "Not found"}`, `{"error": "RecordInvalid", "description": "Record
//! validation errors", "details": {…}}`.
//!
//! Ledger: `ticket.created` (key: the Idempotency-Key, else the
//! external_id), `ticket.updated` (detail: status from, to; key: a
//! `saga-<K>` tag the update adds), `ticket.deleted`.

use super::{credentials, mount, SimState};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SYSTEM: &str = "zendesk";

/// The tag prefix that carries a saga key on updates (R5).
const SAGA_TAG: &str = "saga-";

/// The header Zendesk answers an idempotent create with.
pub const IDEMPOTENCY_LOOKUP: &str = "x-idempotency-lookup";

const STATUSES: [&str; 6] = ["new", "open", "pending", "hold", "solved", "closed"];

/// The agent every API credential acts as.
const AGENT_ID: u64 = 1;

/// Serves the simulated Zendesk with the shared fault layer and `/_sim`
/// routes.
pub fn router(sim: &SimState) -> Router {
    let desk = Desk {
        sim: sim.clone(),
        state: Arc::new(Mutex::new(Tickets::default())),
    };
    let routes = Router::new()
        .route("/api/v2/tickets", get(list_tickets).post(create_ticket))
        .route(
            "/api/v2/tickets.json",
            get(list_tickets).post(create_ticket),
        )
        .route(
            "/api/v2/tickets/{ticket}",
            get(show_ticket).put(update_ticket).delete(delete_ticket),
        )
        .with_state(desk);
    mount(routes, sim, error_shape)
}

/// A refusal in Zendesk's shape (`{"error": …, "description": …}`).
struct Refusal {
    status: StatusCode,
    body: Value,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// Zendesk's error bodies, by status.
fn refusal(status: StatusCode, message: &str) -> Refusal {
    let body = match status {
        StatusCode::UNAUTHORIZED => json!({"error": "Couldn't authenticate you"}),
        StatusCode::NOT_FOUND => json!({"error": "RecordNotFound", "description": message}),
        StatusCode::UNPROCESSABLE_ENTITY => {
            json!({"error": "RecordInvalid", "description": message})
        }
        StatusCode::TOO_MANY_REQUESTS => {
            json!({"error": "APIRateLimitExceeded", "description": message})
        }
        other => json!({
            "error": other.canonical_reason().unwrap_or("Error"),
            "description": message,
        }),
    };
    Refusal { status, body }
}

/// How faults injected through `/_sim/faults` answer.
fn error_shape(status: StatusCode, message: &str) -> Response {
    refusal(status, message).into_response()
}

fn not_found() -> Refusal {
    refusal(StatusCode::NOT_FOUND, "Not found")
}

/// A 422 with Zendesk's per-field `details`.
fn invalid(field: &str, description: &str, error: &str) -> Refusal {
    Refusal {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        body: json!({
            "error": "RecordInvalid",
            "description": "Record validation errors",
            "details": {field: [{"description": description, "error": error}]},
        }),
    }
}

fn authenticated(headers: &HeaderMap) -> Result<(), Refusal> {
    let api_token = credentials::basic(headers).is_some_and(|(user, _)| user.ends_with("/token"));
    if api_token || credentials::bearer(headers).is_some() {
        Ok(())
    } else {
        Err(refusal(StatusCode::UNAUTHORIZED, ""))
    }
}

struct Ticket {
    id: u64,
    external_id: Option<String>,
    subject: String,
    description: String,
    status: String,
    tags: Vec<String>,
    requester_id: u64,
    assignee_id: Option<u64>,
    comments: Vec<(String, bool)>,
    /// When it was created, on the simulator's clock (for search lag).
    born: Duration,
    created_at: String,
    updated_at: String,
    deleted: bool,
}

/// What an idempotent create answered, to replay.
struct Replay {
    request: Value,
    status: StatusCode,
    body: Value,
}

#[derive(Default)]
struct Tickets {
    tickets: Vec<Ticket>,
    users: HashMap<String, u64>,
    replays: HashMap<String, Replay>,
}

impl Tickets {
    fn live_mut(&mut self, id: &str) -> Option<&mut Ticket> {
        let id: u64 = id.trim_end_matches(".json").parse().ok()?;
        self.tickets.iter_mut().find(|t| t.id == id && !t.deleted)
    }

    fn requester(&mut self, email: &str) -> u64 {
        let next = 1_000 + self.users.len() as u64 + 1;
        *self.users.entry(email.to_ascii_lowercase()).or_insert(next)
    }
}

#[derive(Clone)]
struct Desk {
    sim: SimState,
    state: Arc<Mutex<Tickets>>,
}

impl Desk {
    fn tickets(&self) -> std::sync::MutexGuard<'_, Tickets> {
        self.state.lock().expect("zendesk simulator lock")
    }
}

fn timestamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn origin(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}")
}

fn render(ticket: &Ticket, origin: &str) -> Value {
    json!({
        "id": ticket.id,
        "url": format!("{origin}/api/v2/tickets/{}.json", ticket.id),
        "external_id": ticket.external_id,
        "subject": ticket.subject,
        "raw_subject": ticket.subject,
        "description": ticket.description,
        "status": ticket.status,
        "priority": null,
        "type": null,
        "tags": ticket.tags,
        "requester_id": ticket.requester_id,
        "submitter_id": AGENT_ID,
        "assignee_id": ticket.assignee_id,
        "created_at": ticket.created_at,
        "updated_at": ticket.updated_at,
        "via": {"channel": "api"},
    })
}

fn parse_ticket(bytes: &Bytes) -> Result<(Value, Value), Refusal> {
    let body: Value = serde_json::from_slice(bytes).map_err(|_| {
        refusal(
            StatusCode::BAD_REQUEST,
            "The request body is not valid JSON",
        )
    })?;
    match body.get("ticket") {
        Some(ticket) if ticket.is_object() => Ok((ticket.clone(), body)),
        _ => Err(invalid(
            "base",
            "Ticket: a `ticket` object is required",
            "BlankValue",
        )),
    }
}

/// Tags as Zendesk stores them: lower case, no duplicates.
fn tags(value: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for tag in value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let tag = tag.trim().to_ascii_lowercase();
        if !tag.is_empty() && !out.contains(&tag) {
            out.push(tag);
        }
    }
    out
}

fn with_header(mut response: Response, name: &'static str, value: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
    response
}

async fn create_ticket(
    State(desk): State<Desk>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Refusal> {
    authenticated(&headers)?;
    let (ticket, request) = parse_ticket(&bytes)?;
    let idempotency_key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut state = desk.tickets();
    if let Some(key) = &idempotency_key {
        if let Some(replay) = state.replays.get(key) {
            if replay.request != request {
                return Err(Refusal {
                    status: StatusCode::BAD_REQUEST,
                    body: json!({
                        "error": "IdempotentRequestError",
                        "description": "Request parameters don't match the given idempotency key",
                    }),
                });
            }
            let replayed = (replay.status, Json(replay.body.clone())).into_response();
            return Ok(with_header(replayed, IDEMPOTENCY_LOOKUP, "hit"));
        }
    }

    let body = ticket
        .pointer("/comment/body")
        .or_else(|| ticket.get("description"))
        .and_then(Value::as_str)
        .map(str::trim)
        .unwrap_or_default()
        .to_owned();
    if body.is_empty() {
        return Err(invalid(
            "base",
            "Description: cannot be blank",
            "BlankValue",
        ));
    }
    let status = ticket["status"].as_str().unwrap_or("new").to_owned();
    if !STATUSES.contains(&status.as_str()) {
        return Err(invalid("status", "Status: is not valid", "InvalidValue"));
    }
    let requester_id = match ticket.pointer("/requester/email").and_then(Value::as_str) {
        Some(email) if email.contains('@') => state.requester(email),
        Some(_) => {
            return Err(invalid(
                "requester",
                "Requester: Email is invalid",
                "InvalidValue",
            ))
        }
        None => AGENT_ID,
    };
    let external_id = ticket["external_id"].as_str().map(str::to_owned);
    let subject = ticket["subject"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| body.chars().take(80).collect());
    let now = timestamp();
    let id = state.tickets.len() as u64 + 1;
    let created = Ticket {
        id,
        external_id: external_id.clone(),
        subject: subject.clone(),
        description: body.clone(),
        status: status.clone(),
        tags: tags(&ticket["tags"]),
        requester_id,
        assignee_id: None,
        comments: vec![(
            body,
            ticket
                .pointer("/comment/public")
                .and_then(Value::as_bool)
                .unwrap_or(true),
        )],
        born: desk.sim.clock.now(),
        created_at: now.clone(),
        updated_at: now,
        deleted: false,
    };
    let origin = origin(&headers);
    let answer = json!({"ticket": render(&created, &origin)});
    state.tickets.push(created);
    if let Some(key) = &idempotency_key {
        state.replays.insert(
            key.clone(),
            Replay {
                request,
                status: StatusCode::CREATED,
                body: answer.clone(),
            },
        );
    }
    drop(state);
    desk.sim.ledger.record(
        SYSTEM,
        "ticket.created",
        idempotency_key.as_deref().or(external_id.as_deref()),
        &id.to_string(),
        json!({"external_id": external_id, "subject": subject, "status": status}),
    );
    let mut response = (StatusCode::CREATED, Json(answer)).into_response();
    response = with_header(
        response,
        "location",
        &format!("{origin}/api/v2/tickets/{id}.json"),
    );
    if idempotency_key.is_some() {
        response = with_header(response, IDEMPOTENCY_LOOKUP, "miss");
    }
    Ok(response)
}

async fn list_tickets(
    State(desk): State<Desk>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, Refusal> {
    authenticated(&headers)?;
    let origin = origin(&headers);
    let now = desk.sim.clock.now();
    let lag = desk.sim.faults.search_lag();
    let wanted = query.get("external_id");
    let state = desk.tickets();
    let tickets: Vec<Value> = state
        .tickets
        .iter()
        .filter(|t| !t.deleted && now.saturating_sub(t.born) >= lag)
        .filter(|t| wanted.is_none() || t.external_id.as_ref() == wanted)
        .map(|t| render(t, &origin))
        .collect();
    Ok(Json(json!({
        "count": tickets.len(),
        "tickets": tickets,
        "next_page": null,
        "previous_page": null,
    }))
    .into_response())
}

async fn show_ticket(
    State(desk): State<Desk>,
    Path(ticket): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    authenticated(&headers)?;
    let mut state = desk.tickets();
    let found = state.live_mut(&ticket).ok_or_else(not_found)?;
    Ok(Json(json!({"ticket": render(found, &origin(&headers))})).into_response())
}

async fn update_ticket(
    State(desk): State<Desk>,
    Path(ticket): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Refusal> {
    authenticated(&headers)?;
    let (changes, _) = parse_ticket(&bytes)?;
    let mut state = desk.tickets();
    let Some(found) = state.live_mut(&ticket) else {
        return Err(not_found());
    };
    if found.status == "closed" {
        return Err(invalid(
            "status",
            "Status: closed prevents ticket update",
            "ClosedPreventsUpdate",
        ));
    }
    let status = changes["status"]
        .as_str()
        .unwrap_or(&found.status)
        .to_owned();
    if !STATUSES.contains(&status.as_str()) {
        return Err(invalid("status", "Status: is not valid", "InvalidValue"));
    }
    let comment = changes
        .pointer("/comment/body")
        .and_then(Value::as_str)
        .map(|body| {
            let public = changes
                .pointer("/comment/public")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            (body.to_owned(), public)
        });
    let added = tags(&changes["additional_tags"]);
    let removed = tags(&changes["remove_tags"]);
    let key = added
        .iter()
        .find_map(|t| t.strip_prefix(SAGA_TAG).filter(|k| !k.is_empty()))
        .map(str::to_owned);

    let from = std::mem::replace(&mut found.status, status.clone());
    if changes.get("tags").is_some() {
        found.tags = tags(&changes["tags"]);
    }
    for tag in added {
        if !found.tags.contains(&tag) {
            found.tags.push(tag);
        }
    }
    found.tags.retain(|t| !removed.contains(t));
    if let Some(subject) = changes["subject"].as_str() {
        found.subject = subject.to_owned();
    }
    // Solving needs an assignee; the agent who solves becomes it.
    if matches!(status.as_str(), "solved" | "closed") && found.assignee_id.is_none() {
        found.assignee_id = Some(AGENT_ID);
    }
    if let Some(comment) = &comment {
        found.comments.push(comment.clone());
    }
    found.updated_at = timestamp();
    let id = found.id;
    let rendered = render(found, &origin(&headers));
    let audit = json!({
        "id": 50_000 + id * 100 + found.comments.len() as u64,
        "ticket_id": id,
        "created_at": found.updated_at,
        "author_id": AGENT_ID,
        "events": [{"type": "Change", "field_name": "status", "previous_value": from, "value": status}],
    });
    drop(state);
    desk.sim.ledger.record(
        SYSTEM,
        "ticket.updated",
        key.as_deref(),
        &id.to_string(),
        json!({"from": from, "to": status, "comment": comment.map(|(body, public)| json!({"body": body, "public": public}))}),
    );
    Ok(Json(json!({"ticket": rendered, "audit": audit})).into_response())
}

async fn delete_ticket(
    State(desk): State<Desk>,
    Path(ticket): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    authenticated(&headers)?;
    let mut state = desk.tickets();
    let Some(found) = state.live_mut(&ticket) else {
        return Err(not_found());
    };
    found.deleted = true;
    let (id, external_id) = (found.id, found.external_id.clone());
    drop(state);
    desk.sim.ledger.record(
        SYSTEM,
        "ticket.deleted",
        None,
        &id.to_string(),
        json!({"external_id": external_id}),
    );
    Ok(StatusCode::NO_CONTENT.into_response())
}
