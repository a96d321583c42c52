//! `/healthz` (the process answers) and `/readyz` (it can take calls: the
//! database answers, its migrations are current, the tools file is
//! loaded, and the server is not shutting down), plus the metrics
//! listener's router.

use super::metrics::Metrics;
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readiness))
}

/// How long `/readyz` waits for the database: a probe must get an answer
/// promptly, never wait its turn behind the pool.
const READINESS_WAIT: std::time::Duration = std::time::Duration::from_millis(800);

/// Whether the database answers and is current, waiting at most
/// `READINESS_WAIT`; why not, for the log.
pub async fn database_answers(state: &AppState) -> Result<(), String> {
    tokio::time::timeout(READINESS_WAIT, state.opened.readiness())
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {READINESS_WAIT:?}")))
}

async fn readiness(State(state): State<AppState>) -> Response {
    let tools = state.registry.len();
    let database = database_answers(&state).await;
    let draining = state.draining.is_draining();
    let ready = database.is_ok() && !draining;
    // Why not is for the operator's log; whoever asks only learns whether.
    if let Err(reason) = &database {
        tracing::warn!(%reason, "not ready: the database does not answer");
    }
    let body = json!({
        "ready": ready,
        "database": if database.is_ok() { "ok" } else { "unavailable" },
        "tools": tools,
        "shutting_down": draining,
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The metrics listener: `GET /metrics` and nothing else.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn metrics(State(state): State<AppState>) -> Response {
    let metrics: &Metrics = &state.metrics;
    match metrics.render(state.metric_sources()).await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(err) => {
            tracing::error!(%err, "reading the figures for /metrics");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database does not answer",
            )
                .into_response()
        }
    }
}
