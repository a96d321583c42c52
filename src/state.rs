//! What every handler, server function and background task can reach: the
//! store, the registry, the engine and the operators' gauges. It sits below
//! the API, the dashboard and the server that builds them, so none of them
//! imports the module that imports it.

use crate::saga::engine::Engine;
use crate::saga::registry::Registry;
use crate::saga::store::SagaStore;
use crate::store::Opened;
use axum::extract::FromRef;
use leptos::prelude::LeptosOptions;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What every handler and server function can reach.
#[derive(Clone)]
pub struct AppState {
    pub leptos_options: LeptosOptions,
    pub store: Arc<dyn SagaStore>,
    pub registry: Arc<Registry>,
    pub engine: Arc<Engine>,
    pub sign_ins: Arc<crate::auth::SignInThrottle>,
    /// How people may sign in: passwords, the identity provider, or both.
    pub sign_in: Arc<crate::oidc::SignInPolicy>,
    /// Agents' tokens this instance has found valid (see `KnownTokens`).
    pub known_tokens: Arc<crate::auth::KnownTokens>,
    /// Reverse proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Arc<Vec<std::net::IpAddr>>,
    /// The database as opened: its readiness and its pool, for operators.
    pub opened: Opened,
    pub metrics: Arc<crate::ops::metrics::Metrics>,
    /// Set once shutdown has begun (`/readyz` then says so).
    pub draining: Draining,
    /// Approvals also asked for in Slack, when the tools file says so.
    pub slack_approvals: Option<Arc<crate::approvals::SlackApprovals>>,
    /// Open event streams and their one poller.
    pub streams: Arc<crate::streams::Streams>,
}

impl AppState {
    /// What the operators' figures read at scrape time: the server's own
    /// database and pool.
    pub fn metric_sources(&self) -> crate::ops::metrics::Sources<'_> {
        crate::ops::metrics::Sources {
            store: self.store.as_ref(),
            pool: self.opened.pool_use(),
        }
    }
}

/// Set when shutdown begins: a load balancer reading `/readyz` stops
/// sending calls while the ones in flight finish.
#[derive(Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    pub fn start(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}
