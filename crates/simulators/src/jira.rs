//! A simulated Jira: Cloud's REST API v3 and Data Center's REST API v2 on one
//! server, so both flavours of the connector meet the paths, fields, status
//! codes and error bodies they would meet in life.
//!
//! What it keeps: issues (`PROJECT-N` keys) with a summary, description,
//! labels, comments and a status in Jira's default simplified workflow
//! (To Do → In Progress → Done, every status reachable from every other).
//!
//! What it speaks:
//! - `POST /rest/api/{2|3}/issue` — create (v3 descriptions are Atlassian
//!   Document Format, v2 descriptions plain strings; each refuses the
//!   other's shape as Jira does);
//! - `GET|PUT /rest/api/{2|3}/issue/{key}` — read, edit (labels, comments);
//! - `GET|POST /rest/api/{2|3}/issue/{key}/transitions` — list, transition
//!   (204, no body; an unknown id is 400);
//! - `GET|POST /rest/api/3/search/jql` — Cloud's enhanced search
//!   (`{issues, nextPageToken?, isLast}`; only `id` unless fields are asked);
//! - `GET|POST /rest/api/2/search` — Data Center's search
//!   (`{startAt, maxResults, total, issues}`); Cloud's removed
//!   `/rest/api/3/search` answers 410.
//!
//! JQL is a small subset: `labels = x`, `labels = "x"`, `labels in (…)`,
//! `project = X` (and `in`), joined by `AND`. Anything else is a 400 naming
//! what was not understood, in Jira's `{"errorMessages": […], "errors": {}}`
//! shape. New issues stay invisible to search for the simulator's search
//! lag, as Jira's index lags its database; reading an issue by key never
//! lags.
//!
//! v3 requires HTTP Basic (email + API token); v2 accepts a bearer personal
//! access token (or Basic). Without either: 401.
//!
//! Ledger: `issue.created` (key: the `saga-<K>` label's K), `issue.updated`
//! (labels changed), `issue.commented`, `issue.transitioned` (detail: from,
//! to). An edit or transition carries a key only when it adds a `saga-<K>`
//! label.

use super::{credentials, mount, SimState};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SYSTEM: &str = "jira";

/// The label prefix that carries a saga key (R5).
const SAGA_LABEL: &str = "saga-";

/// Serves the simulated Jira with the shared fault layer and `/_sim` routes.
pub fn router(sim: &SimState) -> Router {
    let jira = Jira {
        sim: sim.clone(),
        tracker: Arc::new(Mutex::new(Tracker::default())),
    };
    let routes = Router::new()
        .route(
            "/rest/api/{version}/issue",
            axum::routing::post(create_issue),
        )
        .route(
            "/rest/api/{version}/issue/{issue}",
            get(show_issue).put(edit_issue),
        )
        .route(
            "/rest/api/{version}/issue/{issue}/transitions",
            get(list_transitions).post(transition_issue),
        )
        .route(
            "/rest/api/{version}/search/jql",
            get(enhanced_search_get).post(enhanced_search_post),
        )
        .route(
            "/rest/api/{version}/search",
            get(classic_search_get).post(classic_search_post),
        )
        .with_state(jira);
    mount(routes, sim, error_shape)
}

/// A refusal in Jira's shape: `{"errorMessages": [...], "errors": {...}}`.
struct Refusal {
    status: StatusCode,
    messages: Vec<String>,
    errors: Map<String, Value>,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = json!({"errorMessages": self.messages, "errors": self.errors});
        (self.status, Json(body)).into_response()
    }
}

/// How faults injected through `/_sim/faults` answer.
fn error_shape(status: StatusCode, message: &str) -> Response {
    problem(status, message).into_response()
}

fn problem(status: StatusCode, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        messages: vec![message.into()],
        errors: Map::new(),
    }
}

/// Jira's answer to invalid fields: no messages, one error per field.
fn field_errors(errors: Map<String, Value>) -> Refusal {
    Refusal {
        status: StatusCode::BAD_REQUEST,
        messages: Vec::new(),
        errors,
    }
}

fn no_such_issue() -> Refusal {
    problem(
        StatusCode::NOT_FOUND,
        "Issue does not exist or you do not have permission to see it.",
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Api {
    /// Data Center / Server.
    V2,
    /// Cloud.
    V3,
}

impl Api {
    fn number(self) -> u8 {
        match self {
            Api::V2 => 2,
            Api::V3 => 3,
        }
    }
}

/// The API version in the path, and whether the request may use it.
fn guard(version: &str, headers: &HeaderMap) -> Result<Api, Refusal> {
    let api = match version {
        "2" => Api::V2,
        "3" => Api::V3,
        _ => {
            return Err(problem(
                StatusCode::NOT_FOUND,
                "No REST API of this version",
            ))
        }
    };
    let authenticated = match api {
        Api::V3 => credentials::basic(headers).is_some(),
        Api::V2 => credentials::bearer(headers).is_some() || credentials::basic(headers).is_some(),
    };
    if authenticated {
        Ok(api)
    } else {
        Err(problem(
            StatusCode::UNAUTHORIZED,
            "Client must be authenticated to access this resource.",
        ))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Category {
    New,
    Indeterminate,
    Done,
}

impl Category {
    /// Jira's status categories, with their fixed ids.
    fn json(self) -> Value {
        match self {
            Category::New => {
                json!({"id": 2, "key": "new", "name": "To Do", "colorName": "blue-gray"})
            }
            Category::Indeterminate => {
                json!({"id": 4, "key": "indeterminate", "name": "In Progress", "colorName": "yellow"})
            }
            Category::Done => json!({"id": 3, "key": "done", "name": "Done", "colorName": "green"}),
        }
    }
}

struct Status {
    id: &'static str,
    name: &'static str,
    category: Category,
}

/// Jira's default simplified workflow.
const WORKFLOW: [Status; 3] = [
    Status {
        id: "10000",
        name: "To Do",
        category: Category::New,
    },
    Status {
        id: "3",
        name: "In Progress",
        category: Category::Indeterminate,
    },
    Status {
        id: "10001",
        name: "Done",
        category: Category::Done,
    },
];

/// Transition id → the status it leads to (named after that status).
const TRANSITIONS: [(&str, usize); 3] = [("11", 0), ("21", 1), ("31", 2)];

struct Issue {
    id: u64,
    key: String,
    project: String,
    issue_type: String,
    summary: String,
    description: Option<String>,
    labels: Vec<String>,
    status: usize,
    comments: Vec<Comment>,
    /// When it was created, on the simulator's clock (for search lag).
    born: Duration,
    created_at: String,
    updated_at: String,
}

struct Comment {
    id: u64,
    body: String,
    created_at: String,
}

#[derive(Default)]
struct Tracker {
    issues: Vec<Issue>,
    next_id: u64,
    next_number: HashMap<String, u64>,
}

impl Tracker {
    fn issue_mut(&mut self, key_or_id: &str) -> Option<&mut Issue> {
        self.issues
            .iter_mut()
            .find(|i| i.key.eq_ignore_ascii_case(key_or_id) || i.id.to_string() == key_or_id)
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        10_000 + self.next_id
    }
}

#[derive(Clone)]
struct Jira {
    sim: SimState,
    tracker: Arc<Mutex<Tracker>>,
}

impl Jira {
    fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker.lock().expect("jira simulator lock")
    }
}

fn timestamp() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.3f%z")
        .to_string()
}

/// Where this server is, as the client addressed it (for `self` links).
fn origin(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}")
}

fn saga_key(label: &str) -> Option<&str> {
    label.strip_prefix(SAGA_LABEL).filter(|k| !k.is_empty())
}

/// A one-paragraph-per-block Atlassian Document.
fn adf(text: &str) -> Value {
    let paragraphs: Vec<Value> = text
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(|p| json!({"type": "paragraph", "content": [{"type": "text", "text": p}]}))
        .collect();
    json!({"type": "doc", "version": 1, "content": paragraphs})
}

/// The plain text of an Atlassian Document, or `None` when `doc` is not one.
fn adf_text(doc: &Value) -> Option<String> {
    if doc.get("type")?.as_str()? != "doc" || doc.get("version")?.as_u64()? != 1 {
        return None;
    }
    fn collect(node: &Value, out: &mut String) {
        if let Some(text) = node.get("text").and_then(Value::as_str) {
            out.push_str(text);
        }
        for child in node
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            collect(child, out);
        }
    }
    let blocks: Vec<String> = doc
        .get("content")?
        .as_array()?
        .iter()
        .map(|block| {
            let mut text = String::new();
            collect(block, &mut text);
            text
        })
        .collect();
    Some(blocks.join("\n\n"))
}

/// A rich-text value (description, comment body) in this API's shape.
fn rich_text(api: Api, value: &Value) -> Result<String, &'static str> {
    match api {
        Api::V3 => adf_text(value).ok_or(
            "Operation value must be an Atlassian Document (see the Atlassian Document Format)",
        ),
        Api::V2 => value
            .as_str()
            .map(str::to_owned)
            .ok_or("Operation value must be a string"),
    }
}

fn render_rich(api: Api, text: &str) -> Value {
    match api {
        Api::V3 => adf(text),
        Api::V2 => Value::String(text.to_owned()),
    }
}

/// Which fields a search returns.
enum Fields {
    All,
    Only(Vec<String>),
}

impl Fields {
    /// Reads a `fields` list; `default` applies when none is given.
    fn parse(names: Vec<String>, default: Fields) -> Fields {
        let names: Vec<String> = names
            .into_iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            default
        } else if names.iter().any(|n| n == "*all" || n == "*navigable") {
            Fields::All
        } else {
            Fields::Only(names)
        }
    }
}

fn render(issue: &Issue, api: Api, origin: &str, fields: &Fields) -> Value {
    let v = api.number();
    let status = &WORKFLOW[issue.status];
    let comments: Vec<Value> = issue
        .comments
        .iter()
        .map(|c| {
            json!({
                "id": c.id.to_string(),
                "self": format!("{origin}/rest/api/{v}/issue/{}/comment/{}", issue.id, c.id),
                "body": render_rich(api, &c.body),
                "created": c.created_at,
                "updated": c.created_at,
            })
        })
        .collect();
    let all = json!({
        "summary": issue.summary,
        "description": issue.description.as_deref().map(|d| render_rich(api, d)),
        "labels": issue.labels,
        "status": {
            "self": format!("{origin}/rest/api/{v}/status/{}", status.id),
            "description": "",
            "name": status.name,
            "id": status.id,
            "statusCategory": status.category.json(),
        },
        "resolution": (status.category == Category::Done)
            .then(|| json!({"name": "Done", "id": "10000"})),
        "project": {"key": issue.project, "name": issue.project},
        "issuetype": {"name": issue.issue_type},
        "created": issue.created_at,
        "updated": issue.updated_at,
        "comment": {
            "comments": comments,
            "maxResults": issue.comments.len(),
            "total": issue.comments.len(),
            "startAt": 0,
        },
    });
    let chosen = match fields {
        Fields::All => all,
        Fields::Only(names) => {
            let map = all.as_object().cloned().unwrap_or_default();
            Value::Object(
                map.into_iter()
                    .filter(|(name, _)| names.contains(name))
                    .collect(),
            )
        }
    };
    let mut body = json!({
        "expand": "renderedFields,names,schema,operations,editmeta,changelog,versionedRepresentations",
        "id": issue.id.to_string(),
        "self": format!("{origin}/rest/api/{v}/issue/{}", issue.id),
        "key": issue.key,
    });
    // Cloud's enhanced search returns only the id unless fields are asked.
    if !matches!(fields, Fields::Only(names) if names.iter().all(|n| n == "id")) {
        body["fields"] = chosen;
    }
    body
}

fn parse_body(bytes: &Bytes) -> Result<Value, Refusal> {
    serde_json::from_slice(bytes).map_err(|_| {
        problem(
            StatusCode::BAD_REQUEST,
            "The request body is not valid JSON.",
        )
    })
}

fn check_label(label: &str) -> Result<(), String> {
    if label.is_empty() || label.chars().any(char::is_whitespace) {
        Err(format!(
            "The label '{label}' contains spaces which is invalid."
        ))
    } else {
        Ok(())
    }
}

async fn create_issue(
    State(jira): State<Jira>,
    Path(version): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Refusal> {
    let api = guard(&version, &headers)?;
    let body = parse_body(&bytes)?;
    let fields = body.get("fields").cloned().unwrap_or(Value::Null);
    let mut errors = Map::new();
    let summary = fields["summary"]
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    if summary.is_none() {
        errors.insert(
            "summary".into(),
            "You must specify a summary of the issue.".into(),
        );
    }
    let project = fields["project"]["key"]
        .as_str()
        .filter(|p| !p.is_empty())
        .map(str::to_ascii_uppercase);
    if project.is_none() {
        errors.insert("project".into(), "Specify a valid project ID or key".into());
    }
    let issue_type = fields["issuetype"]["name"]
        .as_str()
        .or_else(|| fields["issuetype"]["id"].as_str())
        .filter(|t| !t.is_empty());
    if issue_type.is_none() {
        errors.insert("issuetype".into(), "Specify an issue type".into());
    }
    let description = match fields.get("description") {
        None | Some(Value::Null) => None,
        Some(value) => match rich_text(api, value) {
            Ok(text) => Some(text),
            Err(e) => {
                errors.insert("description".into(), e.into());
                None
            }
        },
    };
    let labels: Vec<String> = match &fields["labels"] {
        Value::Array(items) => items
            .iter()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    for label in &labels {
        if let Err(e) = check_label(label) {
            errors.insert("labels".into(), e.into());
        }
    }
    let (Some(summary), Some(project), Some(issue_type), true) =
        (summary, project, issue_type, errors.is_empty())
    else {
        return Err(field_errors(errors));
    };

    let origin = origin(&headers);
    let now = timestamp();
    let (id, key) = {
        let mut tracker = jira.tracker();
        let id = tracker.next_id();
        let number = tracker.next_number.entry(project.clone()).or_insert(0);
        *number += 1;
        let key = format!("{project}-{number}");
        tracker.issues.push(Issue {
            id,
            key: key.clone(),
            project: project.clone(),
            issue_type: issue_type.to_owned(),
            summary: summary.to_owned(),
            description,
            labels: labels.clone(),
            status: 0,
            comments: Vec::new(),
            born: jira.sim.clock.now(),
            created_at: now.clone(),
            updated_at: now,
        });
        (id, key)
    };
    jira.sim.ledger.record(
        SYSTEM,
        "issue.created",
        labels.iter().find_map(|l| saga_key(l)),
        &key,
        json!({"project": project, "summary": summary, "labels": labels}),
    );
    let created = json!({
        "id": id.to_string(),
        "key": key,
        "self": format!("{origin}/rest/api/{}/issue/{id}", api.number()),
    });
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

async fn show_issue(
    State(jira): State<Jira>,
    Path((version, issue)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let api = guard(&version, &headers)?;
    let mut tracker = jira.tracker();
    let found = tracker.issue_mut(&issue).ok_or_else(no_such_issue)?;
    Ok(Json(render(found, api, &origin(&headers), &Fields::All)).into_response())
}

/// The comments an `update.comment` list adds.
fn comments_to_add(api: Api, update: &Value) -> Result<Vec<String>, &'static str> {
    let mut bodies = Vec::new();
    for operation in update["comment"].as_array().into_iter().flatten() {
        match operation.pointer("/add/body") {
            Some(body) => bodies.push(rich_text(api, body)?),
            None => return Err("Comment body can not be empty!"),
        }
    }
    Ok(bodies)
}

async fn edit_issue(
    State(jira): State<Jira>,
    Path((version, issue)): Path<(String, String)>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Refusal> {
    let api = guard(&version, &headers)?;
    let body = parse_body(&bytes)?;
    let mut tracker = jira.tracker();
    let Some(found) = tracker.issue_mut(&issue) else {
        return Err(no_such_issue());
    };
    let mut errors = Map::new();
    let mut labels = found.labels.clone();
    if let Some(set) = body.pointer("/fields/labels").and_then(Value::as_array) {
        labels = set
            .iter()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect();
    }
    for operation in body
        .pointer("/update/labels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(label) = operation["add"].as_str() {
            if !labels.iter().any(|l| l == label) {
                labels.push(label.to_owned());
            }
        }
        if let Some(label) = operation["remove"].as_str() {
            labels.retain(|l| l != label);
        }
    }
    for label in &labels {
        if let Err(e) = check_label(label) {
            errors.insert("labels".into(), e.into());
        }
    }
    let summary = body.pointer("/fields/summary").and_then(Value::as_str);
    if summary.is_some_and(|s| s.trim().is_empty()) {
        errors.insert(
            "summary".into(),
            "You must specify a summary of the issue.".into(),
        );
    }
    let comments = match comments_to_add(api, &body["update"]) {
        Ok(comments) => comments,
        Err(e) => {
            errors.insert("comment".into(), e.into());
            Vec::new()
        }
    };
    if !errors.is_empty() {
        return Err(field_errors(errors));
    }

    let added: Vec<String> = labels
        .iter()
        .filter(|l| !found.labels.contains(l))
        .cloned()
        .collect();
    let key = added.iter().find_map(|l| saga_key(l)).map(str::to_owned);
    let now = timestamp();
    let issue_key = found.key.clone();
    if labels != found.labels {
        found.labels = labels.clone();
        jira.sim.ledger.record(
            SYSTEM,
            "issue.updated",
            key.as_deref(),
            &issue_key,
            json!({"labels": labels}),
        );
    }
    if let Some(summary) = summary {
        found.summary = summary.to_owned();
    }
    for body in comments {
        let id = 20_000 + found.comments.len() as u64 + 1;
        found.comments.push(Comment {
            id,
            body: body.clone(),
            created_at: now.clone(),
        });
        jira.sim.ledger.record(
            SYSTEM,
            "issue.commented",
            key.as_deref(),
            &issue_key,
            json!({"body": body}),
        );
    }
    found.updated_at = now;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn transition_json(id: &str, target: usize, origin: &str, api: Api) -> Value {
    let status = &WORKFLOW[target];
    json!({
        "id": id,
        "name": status.name,
        "to": {
            "self": format!("{origin}/rest/api/{}/status/{}", api.number(), status.id),
            "description": "",
            "name": status.name,
            "id": status.id,
            "statusCategory": status.category.json(),
        },
        "hasScreen": false,
        "isGlobal": true,
        "isInitial": false,
        "isAvailable": true,
        "isConditional": false,
        "isLooped": false,
    })
}

async fn list_transitions(
    State(jira): State<Jira>,
    Path((version, issue)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let api = guard(&version, &headers)?;
    let mut tracker = jira.tracker();
    let Some(found) = tracker.issue_mut(&issue) else {
        return Err(no_such_issue());
    };
    let origin = origin(&headers);
    let transitions: Vec<Value> = TRANSITIONS
        .iter()
        .filter(|(_, target)| *target != found.status)
        .map(|(id, target)| transition_json(id, *target, &origin, api))
        .collect();
    Ok(Json(json!({"expand": "transitions", "transitions": transitions})).into_response())
}

async fn transition_issue(
    State(jira): State<Jira>,
    Path((version, issue)): Path<(String, String)>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Refusal> {
    let api = guard(&version, &headers)?;
    let body = parse_body(&bytes)?;
    let mut tracker = jira.tracker();
    let Some(found) = tracker.issue_mut(&issue) else {
        return Err(no_such_issue());
    };
    let Some(id) = body.pointer("/transition/id").and_then(|v| {
        v.as_str()
            .map(str::to_owned)
            .or_else(|| v.as_u64().map(|n| n.to_string()))
    }) else {
        return Err(problem(
            StatusCode::BAD_REQUEST,
            "Missing 'transition' identifier",
        ));
    };
    let Some(target) = TRANSITIONS
        .iter()
        .find(|(tid, target)| *tid == id && *target != found.status)
        .map(|(_, target)| *target)
    else {
        let message = format!("Transition id '{id}' is not valid for this issue.");
        return Err(problem(StatusCode::BAD_REQUEST, message.as_str()));
    };
    // The default transitions have no screen: only a comment may ride along.
    let mut errors = Map::new();
    let screenless = |section: &str, errors: &mut Map<String, Value>| {
        for name in body[section].as_object().into_iter().flat_map(|m| m.keys()) {
            if name != "comment" {
                errors.insert(
                    name.clone(),
                    format!("Field '{name}' cannot be set. It is not on the appropriate screen, or unknown.").into(),
                );
            }
        }
    };
    screenless("fields", &mut errors);
    screenless("update", &mut errors);
    let comments = match comments_to_add(api, &body["update"]) {
        Ok(comments) => comments,
        Err(e) => {
            errors.insert("comment".into(), e.into());
            Vec::new()
        }
    };
    if !errors.is_empty() {
        return Err(field_errors(errors));
    }

    let from = WORKFLOW[found.status].name;
    found.status = target;
    let now = timestamp();
    found.updated_at = now.clone();
    let issue_key = found.key.clone();
    jira.sim.ledger.record(
        SYSTEM,
        "issue.transitioned",
        None,
        &issue_key,
        json!({"from": from, "to": WORKFLOW[target].name, "transition": id}),
    );
    for body in comments {
        let comment_id = 20_000 + found.comments.len() as u64 + 1;
        found.comments.push(Comment {
            id: comment_id,
            body: body.clone(),
            created_at: now.clone(),
        });
        jira.sim.ledger.record(
            SYSTEM,
            "issue.commented",
            None,
            &issue_key,
            json!({"body": body}),
        );
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// One `field = value` / `field in (…)` clause of the JQL subset.
#[derive(Debug, PartialEq)]
enum Clause {
    Labels(Vec<String>),
    Project(Vec<String>),
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Equals,
    Open,
    Close,
    Comma,
}

fn tokenize(jql: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = jql.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '=' => {
                chars.next();
                tokens.push(Token::Equals);
            }
            '(' => {
                chars.next();
                tokens.push(Token::Open);
            }
            ')' => {
                chars.next();
                tokens.push(Token::Close);
            }
            ',' => {
                chars.next();
                tokens.push(Token::Comma);
            }
            '"' | '\'' => {
                let quote = c;
                chars.next();
                let mut text = String::new();
                loop {
                    match chars.next() {
                        Some('\\') => match chars.next() {
                            Some(escaped) => text.push(escaped),
                            None => return Err("The quoted string is not closed.".into()),
                        },
                        Some(ch) if ch == quote => break,
                        Some(ch) => text.push(ch),
                        None => return Err("The quoted string is not closed.".into()),
                    }
                }
                tokens.push(Token::Quoted(text));
            }
            c if c.is_alphanumeric() || "-_.@".contains(c) => {
                let mut word = String::new();
                while let Some(&ch) = chars.peek() {
                    if ch.is_alphanumeric() || "-_.@".contains(ch) {
                        word.push(ch);
                        chars.next();
                    } else {
                        break;
                    }
                }
                tokens.push(Token::Word(word));
            }
            other => {
                return Err(format!(
                    "The character '{other}' is not understood here (the simulator supports `=` and `in`)."
                ))
            }
        }
    }
    Ok(tokens)
}

/// Parses the JQL subset: clauses joined by `AND`.
fn parse_jql(jql: &str) -> Result<Vec<Clause>, String> {
    let tokens = tokenize(jql)?;
    let mut clauses = Vec::new();
    let mut at = 0;
    let value = |token: Option<&Token>| match token {
        Some(Token::Word(w)) | Some(Token::Quoted(w)) => Some(w.clone()),
        _ => None,
    };
    while at < tokens.len() {
        if !clauses.is_empty() {
            match &tokens[at] {
                Token::Word(w) if w.eq_ignore_ascii_case("and") => at += 1,
                Token::Word(w) if w.eq_ignore_ascii_case("order") => {
                    return Err("ORDER BY is not supported by this simulator.".into())
                }
                other => {
                    return Err(format!(
                    "Expecting 'AND' but got {other:?}; the simulator joins clauses with AND only."
                ))
                }
            }
        }
        let field = match tokens.get(at) {
            Some(Token::Word(w)) => w.to_ascii_lowercase(),
            _ => return Err("Expecting a field name (labels or project).".into()),
        };
        if field != "labels" && field != "project" {
            return Err(format!(
                "Field '{field}' is not supported by this simulator (use labels or project)."
            ));
        }
        at += 1;
        let values = match tokens.get(at) {
            Some(Token::Equals) => {
                at += 1;
                let v = value(tokens.get(at))
                    .ok_or_else(|| format!("Expecting a value after '{field} ='."))?;
                at += 1;
                vec![v]
            }
            Some(Token::Word(w)) if w.eq_ignore_ascii_case("in") => {
                at += 1;
                if tokens.get(at) != Some(&Token::Open) {
                    return Err(format!("Expecting '(' after '{field} in'."));
                }
                at += 1;
                let mut values = Vec::new();
                loop {
                    let v = value(tokens.get(at))
                        .ok_or_else(|| format!("Expecting a value in the list of '{field} in'."))?;
                    values.push(v);
                    at += 1;
                    match tokens.get(at) {
                        Some(Token::Comma) => at += 1,
                        Some(Token::Close) => {
                            at += 1;
                            break;
                        }
                        _ => {
                            return Err(format!(
                                "Expecting ',' or ')' in the list of '{field} in'."
                            ))
                        }
                    }
                }
                values
            }
            _ => {
                return Err(format!(
                "Expecting '=' or 'in' after '{field}'; the simulator supports no other operator."
            ))
            }
        };
        clauses.push(match field.as_str() {
            "labels" => Clause::Labels(values),
            _ => Clause::Project(values),
        });
    }
    Ok(clauses)
}

fn matches(issue: &Issue, clauses: &[Clause]) -> bool {
    clauses.iter().all(|clause| match clause {
        Clause::Labels(wanted) => issue.labels.iter().any(|l| wanted.contains(l)),
        Clause::Project(wanted) => wanted
            .iter()
            .any(|p| p.eq_ignore_ascii_case(&issue.project)),
    })
}

fn jql_error(message: &str) -> Refusal {
    let text = format!("Error in the JQL Query: {message}");
    problem(StatusCode::BAD_REQUEST, text.as_str())
}

/// One page of search results.
struct Page {
    issues: Vec<Value>,
    total: usize,
}

/// The issues a JQL query finds now, oldest first, skipping those the index
/// has not caught up with.
fn search(
    jira: &Jira,
    api: Api,
    origin: &str,
    jql: &str,
    fields: &Fields,
    start: usize,
    max: usize,
) -> Result<Page, Refusal> {
    let clauses = parse_jql(jql).map_err(|e| jql_error(&e))?;
    let now = jira.sim.clock.now();
    let lag = jira.sim.faults.search_lag();
    let tracker = jira.tracker();
    let hits: Vec<&Issue> = tracker
        .issues
        .iter()
        .filter(|i| now.saturating_sub(i.born) >= lag)
        .filter(|i| matches(i, &clauses))
        .collect();
    Ok(Page {
        total: hits.len(),
        issues: hits
            .into_iter()
            .skip(start)
            .take(max)
            .map(|i| render(i, api, origin, fields))
            .collect(),
    })
}

const DEFAULT_MAX_RESULTS: usize = 50;

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Value::String(text) => text.split(',').map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

fn number(value: &Value) -> Option<usize> {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .map(|n| n as usize)
}

/// Cloud's enhanced search, from a query string or a body.
fn enhanced_search(
    jira: &Jira,
    version: &str,
    headers: &HeaderMap,
    request: &Value,
) -> Result<Response, Refusal> {
    let api = guard(version, headers)?;
    if api != Api::V3 {
        return Err(problem(
            StatusCode::NOT_FOUND,
            "The enhanced search is a Jira Cloud (REST v3) resource.",
        ));
    }
    let jql = request["jql"].as_str().unwrap_or_default();
    if jql.trim().is_empty() {
        return Err(problem(StatusCode::BAD_REQUEST, "Unbounded JQL queries are not allowed here. Please add a search restriction to your query."));
    }
    let fields = Fields::parse(strings(&request["fields"]), Fields::Only(vec!["id".into()]));
    let max = number(&request["maxResults"])
        .unwrap_or(DEFAULT_MAX_RESULTS)
        .clamp(1, 5000);
    let start = match request["nextPageToken"].as_str() {
        None => 0,
        Some(token) => match token.parse::<usize>() {
            Ok(offset) => offset,
            Err(_) => {
                return Err(problem(
                    StatusCode::BAD_REQUEST,
                    "The nextPageToken is not valid.",
                ))
            }
        },
    };
    let page = search(jira, api, &origin(headers), jql, &fields, start, max)?;
    let next = start + page.issues.len();
    let mut body = json!({"issues": page.issues, "isLast": next >= page.total});
    if next < page.total {
        body["nextPageToken"] = Value::String(next.to_string());
    }
    Ok(Json(body).into_response())
}

async fn enhanced_search_get(
    State(jira): State<Jira>,
    Path(version): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, Refusal> {
    let request = serde_json::to_value(query).unwrap_or_default();
    enhanced_search(&jira, &version, &headers, &request)
}

async fn enhanced_search_post(
    State(jira): State<Jira>,
    Path(version): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Refusal> {
    enhanced_search(&jira, &version, &headers, &parse_body(&bytes)?)
}

/// Data Center's search (and Cloud's, which is gone).
fn classic_search(
    jira: &Jira,
    version: &str,
    headers: &HeaderMap,
    request: &Value,
) -> Result<Response, Refusal> {
    let api = guard(version, headers)?;
    if api == Api::V3 {
        return Err(problem(
            StatusCode::GONE,
            "The requested API has been removed. Please migrate to the /rest/api/3/search/jql API.",
        ));
    }
    let jql = request["jql"].as_str().unwrap_or_default();
    let fields = Fields::parse(strings(&request["fields"]), Fields::All);
    let start = number(&request["startAt"]).unwrap_or(0);
    let max = number(&request["maxResults"])
        .unwrap_or(DEFAULT_MAX_RESULTS)
        .clamp(1, 1000);
    let page = search(jira, api, &origin(headers), jql, &fields, start, max)?;
    Ok(Json(json!({
        "expand": "schema,names",
        "startAt": start,
        "maxResults": max,
        "total": page.total,
        "issues": page.issues,
    }))
    .into_response())
}

async fn classic_search_get(
    State(jira): State<Jira>,
    Path(version): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, Refusal> {
    let request = serde_json::to_value(query).unwrap_or_default();
    classic_search(&jira, &version, &headers, &request)
}

async fn classic_search_post(
    State(jira): State<Jira>,
    Path(version): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Refusal> {
    classic_search(&jira, &version, &headers, &parse_body(&bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jql_subset_parses_labels_and_project_clauses() {
        assert_eq!(
            parse_jql(r#"labels = "saga-abc""#).unwrap(),
            vec![Clause::Labels(vec!["saga-abc".into()])]
        );
        assert_eq!(
            parse_jql("labels = saga-abc AND project = SUP").unwrap(),
            vec![
                Clause::Labels(vec!["saga-abc".into()]),
                Clause::Project(vec!["SUP".into()])
            ]
        );
        assert_eq!(
            parse_jql(r#"labels in ("a", b) and PROJECT in (SUP)"#).unwrap(),
            vec![
                Clause::Labels(vec!["a".into(), "b".into()]),
                Clause::Project(vec!["SUP".into()])
            ]
        );
        assert_eq!(parse_jql("").unwrap(), vec![]);
    }

    #[test]
    fn jql_outside_the_subset_is_refused_naming_the_problem() {
        assert!(parse_jql("status = Done").unwrap_err().contains("status"));
        assert!(parse_jql("labels = a OR labels = b")
            .unwrap_err()
            .contains("AND"));
        assert!(parse_jql("labels != a").unwrap_err().contains('!'));
        assert!(parse_jql("labels = a ORDER BY created")
            .unwrap_err()
            .contains("ORDER BY"));
        assert!(parse_jql(r#"labels = "open"#)
            .unwrap_err()
            .contains("quoted"));
    }

    #[test]
    fn adf_round_trips_plain_paragraphs() {
        let doc = adf("first\n\nsecond");
        assert_eq!(adf_text(&doc).as_deref(), Some("first\n\nsecond"));
        assert_eq!(adf_text(&json!("plain")), None);
    }
}
