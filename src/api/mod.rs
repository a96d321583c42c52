//! The agent API under `/api/v1` (DESIGN.md §5): JSON over HTTP with bearer
//! tokens. Tool outcomes are 200 with `outcome`; harness refusals are HTTP
//! errors with a stable `code`; bad input says what is wrong. Handlers are
//! thin: authenticate, parse, call the engine.

use crate::auth::token_hash;
use crate::incident::Incident;
use crate::saga::engine::{CallOutcome, Refusal};
use crate::saga::input::{self, InputMistake, MAX_LABEL_CHARS, MAX_NESTING, MAX_TEXT_CHARS};
use crate::saga::model::{Actor, Approval, Bearer, NewRun, Run, Step};
use crate::saga::pivot::PlannedCall;
use crate::saga::store::StoreError;
use crate::state::AppState;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

mod schema;

/// The largest request body an agent may send. Tool arguments are small;
/// anything bigger is a mistake, refused before it is parsed.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Where the OpenAPI document of this API is served.
pub const OPENAPI_PATH: &str = "/api/v1/openapi.json";

/// The routes and their OpenAPI document, made from the same handler
/// annotations so the two cannot drift apart.
pub fn router() -> Router<AppState> {
    let (routes, document) = documented();
    routes
        .route(OPENAPI_PATH, get(move || async move { Json(document) }))
        // An agent's mistaken path or method is a refusal in the API's own
        // shape too, not an HTML page or an empty body.
        .route("/api/v1/{*rest}", any(no_such_route))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

async fn no_such_route(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        format!(
            "{} is not a route of the agent API; the routes are listed in {OPENAPI_PATH}",
            uri.path()
        ),
    )
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} does not take {method}; the methods each route takes are listed in {OPENAPI_PATH}",
            uri.path()
        ),
    )
}

/// The OpenAPI 3 document of the agent API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    documented().1
}

fn documented() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(create_run))
        .routes(routes!(read_run))
        .routes(routes!(call))
        .routes(routes!(propose_pivot))
        .routes(routes!(unwind))
        .routes(routes!(complete))
        .routes(routes!(events))
        .routes(routes!(tools))
        .split_for_parts()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Saga Harness agent API",
        version = "1",
        description = "Tool calls with side effects go through the harness: it logs an intent before each call, derives idempotency keys from run and step, and reports outcomes (confirmed, failed, unknown, not_executed, awaiting_approval, held_over_limit, rejected) as 200s. Refusals are 4xx with a stable `code`."
    ),
    modifiers(&BearerToken),
    security(("bearer" = [])),
    tags(
        (name = "runs", description = "Runs and their steps"),
        (name = "tools", description = "The tool registry")
    )
)]
struct ApiDoc;

struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An agent token from `saga-harness token create`".to_owned(),
                    ))
                    .build(),
            ),
        );
    }
}

/// The body of every error: a stable machine-readable code and a message
/// that says what is wrong and what to do.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// `unauthorized`, `run_not_found`, `step_unresolved`, `invalid_body` …
    code: String,
    message: String,
    /// For `step_unresolved` and `retry_of_unresolved_step`: the step to
    /// re-send unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<i64>,
    /// For `internal`: the id the harness's log holds the cause under.
    #[serde(skip_serializing_if = "Option::is_none")]
    incident: Option<String>,
}

/// Every error the API returns: a status, a stable code, a message that
/// says what to do. Internal causes are logged, never sent.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    step: Option<i64>,
    incident: Option<String>,
    /// Seconds to wait before sending the request again (`Retry-After`).
    retry_after: Option<u32>,
}

/// How long an agent is asked to wait while the database is unreachable.
const STORE_RETRY_AFTER_SECS: u32 = 2;

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            step: None,
            incident: None,
            retry_after: None,
        }
    }

    fn internal(err: impl std::fmt::Display) -> Self {
        let incident = Incident::record("agent API request", &err);
        ApiError {
            incident: Some(incident.id().to_owned()),
            ..ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                crate::incident::CODE,
                incident.message(),
            )
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code.to_owned(),
            message: self.message,
            step: self.step,
            incident: self.incident,
        };
        if let Some(seconds) = self.retry_after {
            return (
                self.status,
                [(header::RETRY_AFTER, seconds.to_string())],
                Json(body),
            )
                .into_response();
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        let status = match &refusal {
            Refusal::RunNotFound => StatusCode::NOT_FOUND,
            Refusal::TokenNotValid => StatusCode::UNAUTHORIZED,
            Refusal::UnknownTool(_)
            | Refusal::StepRequired { .. }
            | Refusal::InvalidPlan(_)
            | Refusal::InvalidArgs { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Refusal::GatedTool(_) | Refusal::WayBackOnly(_) => StatusCode::FORBIDDEN,
            Refusal::StepMismatch { .. }
            | Refusal::StepOutOfOrder { .. }
            | Refusal::StepUnresolved { .. }
            | Refusal::RetryOfUnresolvedStep { .. }
            | Refusal::RunAwaitingApproval
            | Refusal::RunPastPivot
            | Refusal::RunNeedsAttention
            | Refusal::RunClosed { .. }
            | Refusal::RunHasOpenEffects(_)
            | Refusal::QuestionAskedAgain { .. } => StatusCode::CONFLICT,
            Refusal::Store(StoreError::NotFound { .. }) => StatusCode::NOT_FOUND,
            Refusal::Store(StoreError::Invalid(_)) => StatusCode::UNPROCESSABLE_ENTITY,
            // Another instance moved the run or the step first: the agent
            // re-sends the step and reads what happened.
            Refusal::Store(StoreError::Stale { .. } | StoreError::StepExists { .. }) => {
                return ApiError::new(
                    StatusCode::CONFLICT,
                    "concurrent_change",
                    format!("{refusal}; re-send the same step to read its outcome"),
                );
            }
            // Another instance has a call of this run in flight: the agent
            // re-sends the same step shortly and reads its outcome.
            // The database cannot be reached: nothing was sent; the agent
            // sends the same request again after the wait.
            Refusal::Store(
                StoreError::Unavailable { cause } | StoreError::OutcomeUnrecorded { cause },
            ) => {
                tracing::warn!(%cause, "agent API: the database cannot be reached");
                return ApiError {
                    retry_after: Some(STORE_RETRY_AFTER_SECS),
                    ..ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "store_unavailable",
                        refusal.to_string(),
                    )
                };
            }
            Refusal::Store(StoreError::RunBusy { .. } | StoreError::LeaseLost) => {
                return ApiError::new(
                    StatusCode::CONFLICT,
                    "run_busy",
                    format!("{refusal}; re-send the same step shortly to read its outcome"),
                );
            }
            Refusal::Store(_) => return ApiError::internal(refusal),
        };
        let step = match &refusal {
            Refusal::StepUnresolved { step, .. } | Refusal::RetryOfUnresolvedStep { step, .. } => {
                Some(*step)
            }
            _ => None,
        };
        ApiError {
            step,
            ..ApiError::new(status, refusal.code(), refusal.to_string())
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        Refusal::Store(err).into()
    }
}

/// A JSON body whose rejections (malformed, wrong types, too large) use the
/// API's error shape.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        // Buffered here (within the limit) so the text can be checked for
        // what no database stores after it has been parsed.
        let (parts, body) = request.into_parts();
        let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("the body is over {} KiB", MAX_BODY_BYTES / 1024),
                )
            })?;
        // Measured on the text, before parsing: a deep body is refused
        // before it costs a parse.
        if nesting_depth(&bytes) > MAX_NESTING {
            return Err(invalid_body(InputMistake::TooDeep));
        }
        let request = Request::from_parts(parts, axum::body::Body::from(bytes.clone()));
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => {
                if serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| input::has_nul(&v)) {
                    return Err(invalid_body(InputMistake::Nul));
                }
                Ok(Body(value))
            }
            Err(rejection) => {
                let code = match &rejection {
                    JsonRejection::JsonSyntaxError(_) => "malformed_json",
                    JsonRejection::JsonDataError(_) => "invalid_body",
                    JsonRejection::MissingJsonContentType(_) => "expected_json",
                    _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
                    _ => "bad_request",
                };
                Err(ApiError::new(
                    rejection.status(),
                    code,
                    rejection.body_text(),
                ))
            }
        }
    }
}

/// The deepest nesting of `[` and `{` in a JSON text, outside strings.
fn nesting_depth(json: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &byte in json {
        match (in_string, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, _, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Refuses a text field over its length with a 422 naming the field.
fn within(field: &str, text: &str, max: usize) -> Result<(), ApiError> {
    input::within(field, text, max).map_err(invalid_body)
}

fn invalid_body(mistake: InputMistake) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_body",
        mistake.to_string(),
    )
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// The hash of the request's bearer token.
fn bearer_hash(parts: &Parts) -> Result<String, ApiError> {
    let header = parts
        .headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("send the agent's token as `Authorization: Bearer <token>`"))?;
    let token = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
    Ok(token_hash(token))
}

/// The agent of a token, looked up now (and remembered as seen valid).
async fn look_up_agent(state: &AppState, hash: String) -> Result<String, ApiError> {
    match state.store.agent_for_token(&hash).await? {
        Some(agent) => {
            state.known_tokens.remember(hash, agent.clone());
            Ok(agent)
        }
        None => Err(unauthorized(crate::auth::TOKEN_NOT_VALID)),
    }
}

/// The agent behind the request's bearer token, looked up.
pub struct Agent(pub String);

impl FromRequestParts<AppState> for Agent {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        look_up_agent(state, bearer_hash(parts)?).await.map(Agent)
    }
}

impl Agent {
    /// The agent behind the request's token; while the database cannot be
    /// reached, a token this instance found valid before still names its
    /// agent (nothing can be written then, so the call that follows is
    /// refused by the engine in its own words, which the MCP gateway
    /// answers as a tool error the model can act on).
    pub async fn through_outage(parts: &mut Parts, state: &AppState) -> Result<Agent, ApiError> {
        let hash = bearer_hash(parts)?;
        match look_up_agent(state, hash.clone()).await {
            Err(unreachable) if unreachable.code == "store_unavailable" => state
                .known_tokens
                .agent(&hash)
                .map(Agent)
                .ok_or(unreachable),
            found => found.map(Agent),
        }
    }
}

/// An agent opening an event stream, with its token's hash: the stream is
/// counted against the token and ends when the token is revoked.
pub struct StreamingAgent {
    agent: String,
    token_hash: String,
}

impl FromRequestParts<AppState> for StreamingAgent {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token_hash = bearer_hash(parts)?;
        let agent = look_up_agent(state, token_hash.clone()).await?;
        Ok(StreamingAgent { agent, token_hash })
    }
}

/// The agent behind a tool call's bearer token. A token this instance has
/// found valid before is not looked up again here: its hash goes with the
/// call, whose intent checks it in the same statement (or which looks it
/// up off the hot path), so the call costs no extra round trip and a
/// revocation still refuses the next call.
struct CallingAgent {
    agent: String,
    token_to_check: Option<String>,
}

impl CallingAgent {
    /// What a request that cannot be read is told: `refused`, unless its
    /// token, not looked up yet, is no longer valid, which is said first,
    /// as to any request with that token.
    async fn refuse(&self, state: &AppState, refused: ApiError) -> ApiError {
        let token = self.token_to_check.as_deref();
        match state.engine.check_token(&self.agent, token).await {
            Ok(()) => refused,
            Err(not_valid) => not_valid.into(),
        }
    }
}

impl FromRequestParts<AppState> for CallingAgent {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let hash = bearer_hash(parts)?;
        Ok(match state.known_tokens.agent(&hash) {
            Some(agent) => CallingAgent {
                agent,
                token_to_check: Some(hash),
            },
            None => CallingAgent {
                agent: look_up_agent(state, hash).await?,
                token_to_check: None,
            },
        })
    }
}

/// The `{run}` segment of a path, as text. A segment that is not even text
/// (percent-encoded bytes that are not UTF-8) is refused in the API's shape.
pub struct RunPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for RunPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(raw)) => Ok(RunPath(raw)),
            Err(rejection) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_run_id",
                format!(
                    "the run id in the path cannot be read ({}): run ids are UUIDs, as returned by POST /api/v1/runs",
                    rejection.body_text()
                ),
            )),
        }
    }
}

fn run_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_run_id",
            format!("{raw:?} is not a run id: run ids are UUIDs, as returned by POST /api/v1/runs"),
        )
    })
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateRun {
    /// The client's own name for the run: the same label twice returns the
    /// same run. It never enters a key.
    label: Option<String>,
    #[serde(default)]
    purpose: String,
}

#[derive(Debug, Serialize, ToSchema)]
struct RunCreated {
    #[schema(value_type = schema::Run)]
    run: Run,
    /// The step index the run's first call with an effect must name.
    next_step: i64,
}

/// What a resuming agent reads: the run, its log and its next step.
#[derive(Debug, Serialize, ToSchema)]
struct RunView {
    #[schema(value_type = schema::Run)]
    run: Run,
    /// The step to send next (R12): the oldest step whose final outcome the
    /// agent has not been given, to re-send unchanged; else a new step.
    next_step: i64,
    /// The index a new effect takes.
    new_step: i64,
    #[schema(value_type = Vec<schema::Step>)]
    steps: Vec<Step>,
    #[schema(value_type = Option<schema::Approval>)]
    pivot: Option<Approval>,
    /// What an approver changed in the pivot's plan before deciding, oldest
    /// first: each edit's step, tool, the changed fields, the arguments
    /// before and after, who and when. The commit runs the edited
    /// arguments, which `pivot.plan` holds.
    #[schema(value_type = Vec<Object>)]
    pivot_edits: Vec<crate::saga::model::PlanEdit>,
}

#[utoipa::path(post, path = "/api/v1/runs", tag = "runs",
    request_body = CreateRun,
    responses(
        (status = 201, description = "A new run", body = RunCreated),
        (status = 200, description = "The run this agent already created with this label", body = RunCreated),
        (status = 400, description = "Malformed JSON or run id", body = ErrorBody), (status = 413, description = "Body over 256 KiB", body = ErrorBody), (status = 415, description = "Not JSON", body = ErrorBody), (status = 422, description = "Wrong fields or types", body = ErrorBody), (status = 401, description = "Missing or wrong token", body = ErrorBody)))]
async fn create_run(
    State(state): State<AppState>,
    Agent(agent): Agent,
    Body(body): Body<CreateRun>,
) -> Result<Response, ApiError> {
    within(
        "label",
        body.label.as_deref().unwrap_or_default(),
        MAX_LABEL_CHARS,
    )?;
    within("purpose", &body.purpose, MAX_TEXT_CHARS)?;
    if body.label.as_deref().is_some_and(|l| l.trim().is_empty()) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "label, when given, cannot be empty",
        ));
    }
    let (run, created) = state
        .store
        .create_run(NewRun {
            agent,
            label: body.label,
            purpose: body.purpose,
        })
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let next_step = run.next_step;
    Ok((status, Json(RunCreated { run, next_step })).into_response())
}

#[utoipa::path(get, path = "/api/v1/runs/{run}", tag = "runs", params(("run" = String, Path, description = "The run id (a UUID) from POST /api/v1/runs")),
    responses(
        (status = 200, description = "The run, its log and its next step", body = RunView),
        (status = 400, description = "Not a run id", body = ErrorBody), (status = 401, description = "Missing or wrong token", body = ErrorBody), (status = 404, description = "No such run for this agent", body = ErrorBody)))]
async fn read_run(
    State(state): State<AppState>,
    Agent(agent): Agent,
    RunPath(raw): RunPath,
) -> Result<Json<RunView>, ApiError> {
    let (run, steps, cursor) = state.engine.agents_view(&agent, run_id(&raw)?).await?;
    let pivot = match run.pivot_approval_id {
        Some(id) => state.store.approval(id).await?,
        None => None,
    };
    let pivot_edits = pivot
        .as_ref()
        .map(|p| crate::saga::model::plan_edits(&p.plan))
        .unwrap_or_default();
    Ok(Json(RunView {
        pivot_edits,
        next_step: cursor.next_step,
        new_step: cursor.new_step,
        run,
        steps,
        pivot,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CallRequest {
    tool: String,
    #[serde(default)]
    args: Value,
    /// Required for tools with side effects: the run's `new_step` for a new
    /// step, or an existing step to read (or resolve) its outcome.
    step: Option<i64>,
    /// A new step of a tool whose earlier step is still owed its outcome is
    /// refused as a likely retry (`retry_of_unresolved_step`); `true` says a
    /// second effect is meant, and is recorded.
    #[serde(default)]
    new_effect: bool,
}

#[utoipa::path(post, path = "/api/v1/runs/{run}/calls", tag = "runs", params(("run" = String, Path, description = "The run id (a UUID) from POST /api/v1/runs")),
    request_body = CallRequest,
    responses(
        (status = 200, description = "The tool's outcome (confirmed, failed, unknown, not_executed, awaiting_approval, held_over_limit, rejected); never an HTTP error", body = schema::CallOutcome),
        (status = 400, description = "Malformed JSON or run id", body = ErrorBody), (status = 413, description = "Body over 256 KiB", body = ErrorBody), (status = 415, description = "Not JSON", body = ErrorBody), (status = 422, description = "Wrong fields or types", body = ErrorBody), (status = 401, description = "Missing or wrong token", body = ErrorBody), (status = 404, description = "No such run for this agent", body = ErrorBody), (status = 403, description = "Refused: gated_tool, way_back_only", body = ErrorBody), (status = 409, description = "Refused by the run's state: step_unresolved, retry_of_unresolved_step, step_mismatch, step_out_of_order, run_awaiting_approval, run_past_pivot, run_needs_attention, run_closed, irreversible_before_pivot, run_has_open_effects, concurrent_change, run_busy (another instance holds the run, or this one lost it while paused: nothing was sent)", body = ErrorBody), (status = 503, description = "store_unavailable: the database cannot be reached; nothing was sent; send the same request again after Retry-After", body = ErrorBody)))]
async fn call(
    State(state): State<AppState>,
    caller: CallingAgent,
    raw: Result<RunPath, ApiError>,
    body: Result<Body<CallRequest>, ApiError>,
) -> Result<Json<CallOutcome>, ApiError> {
    let read = || {
        let (RunPath(raw), Body(body)) = (raw?, body?);
        if body.step.is_some_and(|s| s < 0) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_body",
                "step cannot be negative",
            ));
        }
        Ok((run_id(&raw)?, body))
    };
    let (run, body) = match read() {
        Ok(read) => read,
        Err(refused) => return Err(caller.refuse(&state, refused).await),
    };
    let bearer = Bearer {
        agent: &caller.agent,
        token_to_check: caller.token_to_check.as_deref(),
    };
    let outcome = state
        .engine
        .call_from(
            bearer,
            run,
            &body.tool,
            body.args,
            body.step,
            body.new_effect,
        )
        .await?;
    Ok(Json(outcome))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PivotRequest {
    summary: String,
    #[schema(value_type = Vec<schema::PlannedCall>)]
    commit: Vec<PlannedCall>,
}

#[utoipa::path(post, path = "/api/v1/runs/{run}/pivot", tag = "runs", params(("run" = String, Path, description = "The run id (a UUID) from POST /api/v1/runs")),
    request_body = PivotRequest,
    responses(
        (status = 200, description = "The plan waits for a person's approval", body = PivotProposed),
        (status = 400, description = "Malformed JSON or run id", body = ErrorBody), (status = 413, description = "Body over 256 KiB", body = ErrorBody), (status = 415, description = "Not JSON", body = ErrorBody), (status = 422, description = "Wrong fields or types", body = ErrorBody), (status = 401, description = "Missing or wrong token", body = ErrorBody), (status = 404, description = "No such run for this agent", body = ErrorBody), (status = 403, description = "Refused: gated_tool, way_back_only", body = ErrorBody), (status = 409, description = "Refused by the run's state: step_unresolved, retry_of_unresolved_step, step_mismatch, step_out_of_order, run_awaiting_approval, run_past_pivot, run_needs_attention, run_closed, irreversible_before_pivot, run_has_open_effects, concurrent_change", body = ErrorBody)))]
async fn propose_pivot(
    State(state): State<AppState>,
    Agent(agent): Agent,
    RunPath(raw): RunPath,
    Body(body): Body<PivotRequest>,
) -> Result<Json<PivotProposed>, ApiError> {
    within("summary", &body.summary, MAX_TEXT_CHARS)?;
    let approval = state
        .engine
        .propose_pivot(&agent, run_id(&raw)?, &body.summary, body.commit)
        .await?;
    Ok(Json(PivotProposed {
        outcome: "awaiting_approval",
        approval_id: approval.id,
        digest: approval.digest,
        expires_at: approval.expires_at,
        approvers_needed: approval.approvers_needed,
        plan: approval.plan,
        message: "the plan waits for a person's approval; the run takes no other calls until then",
    }))
}

#[derive(Debug, Serialize, ToSchema)]
struct PivotProposed {
    /// Always `awaiting_approval`.
    outcome: &'static str,
    approval_id: i64,
    /// What the approver signs: a digest of the plan exactly as shown.
    digest: String,
    /// When the pivot expires if nobody decides (the tools file's
    /// deadline, or when the authorisations it builds on lapse).
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// How many different people must approve it (2 under the
    /// two-person rule).
    approvers_needed: i64,
    plan: Value,
    message: &'static str,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UnwindRequest {
    reason: String,
}

#[utoipa::path(post, path = "/api/v1/runs/{run}/unwind", tag = "runs", params(("run" = String, Path, description = "The run id (a UUID) from POST /api/v1/runs")),
    request_body = UnwindRequest,
    responses(
        (status = 200, description = "The run after its unwind (UNWOUND, or NEEDS_ATTENTION when a compensation needs a person)", body = schema::Run),
        (status = 400, description = "Malformed JSON or run id", body = ErrorBody), (status = 413, description = "Body over 256 KiB", body = ErrorBody), (status = 415, description = "Not JSON", body = ErrorBody), (status = 422, description = "Wrong fields or types", body = ErrorBody), (status = 401, description = "Missing or wrong token", body = ErrorBody), (status = 404, description = "No such run for this agent", body = ErrorBody), (status = 403, description = "Refused: gated_tool, way_back_only", body = ErrorBody), (status = 409, description = "Refused by the run's state: step_unresolved, retry_of_unresolved_step, step_mismatch, step_out_of_order, run_awaiting_approval, run_past_pivot, run_needs_attention, run_closed, irreversible_before_pivot, run_has_open_effects, concurrent_change", body = ErrorBody)))]
async fn unwind(
    State(state): State<AppState>,
    Agent(agent): Agent,
    RunPath(raw): RunPath,
    Body(body): Body<UnwindRequest>,
) -> Result<Json<Run>, ApiError> {
    within("reason", &body.reason, MAX_TEXT_CHARS)?;
    if body.reason.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "say why the run is unwound: `reason` cannot be empty",
        ));
    }
    let run = state.engine.agents_run(&agent, run_id(&raw)?).await?;
    let run = state
        .engine
        .unwind(run.id, &Actor::Agent(agent), &body.reason)
        .await?;
    Ok(Json(run))
}

#[utoipa::path(post, path = "/api/v1/runs/{run}/complete", tag = "runs", params(("run" = String, Path, description = "The run id (a UUID) from POST /api/v1/runs")),
    responses(
        (status = 200, description = "The completed run", body = schema::Run),
        (status = 400, description = "Not a run id", body = ErrorBody), (status = 401, description = "Missing or wrong token", body = ErrorBody), (status = 404, description = "No such run for this agent", body = ErrorBody), (status = 403, description = "Refused: gated_tool, way_back_only", body = ErrorBody), (status = 409, description = "Refused by the run's state: step_unresolved, retry_of_unresolved_step, step_mismatch, step_out_of_order, run_awaiting_approval, run_past_pivot, run_needs_attention, run_closed, irreversible_before_pivot, run_has_open_effects, concurrent_change", body = ErrorBody)))]
async fn complete(
    State(state): State<AppState>,
    Agent(agent): Agent,
    RunPath(raw): RunPath,
) -> Result<Json<Run>, ApiError> {
    Ok(Json(state.engine.complete(&agent, run_id(&raw)?).await?))
}

#[utoipa::path(get, path = "/api/v1/tools", tag = "tools",
    responses(
        (status = 200, description = "Every registered tool", body = ToolList), (status = 401, description = "Missing or wrong token", body = ErrorBody)))]
async fn tools(State(state): State<AppState>, Agent(_): Agent) -> Json<ToolList> {
    let tools = state
        .registry
        .tools()
        .map(|spec| ToolView {
            name: spec.name.clone(),
            class: spec.class,
            audience: spec.audience,
            gated: spec.gated,
            way_back_only: spec.way_back_only,
            needs_step: spec.class != crate::saga::class::ToolClass::Pure,
            schema: spec.schema.clone(),
        })
        .collect();
    Json(ToolList { tools })
}

#[derive(Debug, Serialize, ToSchema)]
struct ToolList {
    tools: Vec<ToolView>,
}

#[derive(Debug, Serialize, ToSchema)]
struct ToolView {
    name: String,
    #[schema(value_type = schema::ToolClass)]
    class: crate::saga::class::ToolClass,
    /// Who sees the effect at least; some arguments widen it.
    #[schema(value_type = schema::Audience)]
    audience: crate::saga::class::Audience,
    /// Runs only as a commit step of an approved pivot.
    gated: bool,
    /// Runs only to undo another step; agents cannot call it.
    way_back_only: bool,
    /// Whether calls must name a step (every tool with an effect).
    needs_step: bool,
    /// The JSON Schema every new call's `args` are checked against (422
    /// `invalid_args`, naming the argument); none: any object.
    #[schema(value_type = Option<Object>)]
    schema: Option<Value>,
}

/// Server-sent events: the run's audit trail as it grows, for agents that
/// wait on an approval and for the dashboard. `Last-Event-ID` resumes after
/// a reconnect.
#[utoipa::path(get, path = "/api/v1/runs/{run}/events", tag = "runs", params(("run" = String, Path, description = "The run id (a UUID) from POST /api/v1/runs")),
    responses(
        (status = 200, description = "Server-sent events: the run's audit trail as it grows; each event's id resumes the stream through Last-Event-ID", content_type = "text/event-stream", body = String),
        (status = 400, description = "Not a run id", body = ErrorBody), (status = 401, description = "Missing or wrong token", body = ErrorBody), (status = 404, description = "No such run for this agent", body = ErrorBody)))]
async fn events(
    State(state): State<AppState>,
    caller: StreamingAgent,
    RunPath(raw): RunPath,
    headers: axum::http::HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    use crate::streams::Holder;
    use axum::response::sse::{Event, KeepAlive, Sse};
    let run = state
        .engine
        .agents_run(&caller.agent, run_id(&raw)?)
        .await?;
    let slot = state.streams.open(Holder::Token(caller.token_hash));
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    // Subscribed before the backlog is read, so no line falls between.
    let lines = RunLines {
        run: run.id,
        last: after,
        pending: Vec::new(),
        catching_up: true,
        batches: state.streams.subscribe(),
        store: state.store.clone(),
        slot,
    };
    let stream = futures::stream::unfold(lines, |mut lines| async move {
        let event = lines.next().await?;
        let sse = Event::default()
            .id(event.id.to_string())
            .event(event.entity.as_str())
            .json_data(&event)
            .unwrap_or_else(|_| Event::default().comment("unserialisable event"));
        Some((Ok::<_, std::convert::Infallible>(sse), lines))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// One run's audit lines for its agent's stream: the backlog from the
/// database, then the poller's batches (the database again if the stream
/// fell too far behind). Ends when the agent's token is revoked.
struct RunLines {
    run: Uuid,
    last: i64,
    /// Newest last, so the next line is `pop`ped.
    pending: Vec<crate::saga::model::Event>,
    catching_up: bool,
    batches: tokio::sync::broadcast::Receiver<std::sync::Arc<Vec<crate::saga::model::Event>>>,
    store: std::sync::Arc<dyn crate::saga::store::SagaStore>,
    slot: crate::streams::StreamSlot,
}

impl RunLines {
    const PAGE: i64 = 100;

    async fn next(&mut self) -> Option<crate::saga::model::Event> {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            if self.slot.ended.is_cancelled() {
                return None;
            }
            if let Some(event) = self.pending.pop() {
                self.last = event.id;
                return Some(event);
            }
            if self.catching_up {
                let mut page = match self
                    .store
                    .events_after(self.run, self.last, Self::PAGE)
                    .await
                {
                    Ok(page) => page,
                    Err(err) => {
                        tracing::error!(%err, "reading events for a stream");
                        return None;
                    }
                };
                self.catching_up = page.len() as i64 == Self::PAGE;
                page.reverse();
                self.pending = page;
                continue;
            }
            tokio::select! {
                () = self.slot.ended.cancelled() => return None,
                batch = self.batches.recv() => match batch {
                    Ok(batch) => {
                        let (run, last) = (self.run, self.last);
                        self.pending = batch
                            .iter()
                            .rev()
                            .filter(|e| e.run_id == Some(run) && e.id > last)
                            .cloned()
                            .collect();
                    }
                    Err(RecvError::Lagged(_)) => self.catching_up = true,
                    Err(RecvError::Closed) => return None,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nesting_is_counted_outside_strings_only() {
        assert_eq!(super::nesting_depth(br#"{"a": [1, {"b": "[[[{{{"}]}"#), 3);
        assert_eq!(super::nesting_depth(br#""\"[""#), 0);
        assert_eq!(super::nesting_depth(b"[[[[]]]]"), 4);
    }
}
