//! The server: opens the store, loads the tools file, builds the router
//! (dashboard, server functions, health check) with sessions, and serves
//! until a shutdown signal. Tests build it on port 0.

use crate::config::ServeArgs;
use crate::connectors::wire::{Timeouts, Wire};
use crate::connectors::ConnectorSet;
use crate::saga::engine::Engine;
use crate::saga::registry::{Registry, RegistryError};
use crate::saga::store::StoreError;
use crate::state::AppState;
use crate::store::pooled_sessions::PooledSessions;
use crate::store::{self, Opened};
use crate::ui::{self, ScriptNonce, SessionUser, SESSION_USER_KEY};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use leptos::prelude::*;
use leptos_axum::{generate_route_list, LeptosRoutes};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, Session, SessionManagerLayer};
use tower_sessions_sqlx_store::{PostgresStore as PgSessions, SqliteStore as SqliteSessions};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("signing in: {0}")]
    SignIn(String),
    #[error("opening the database {url}: {source}")]
    Store { url: String, source: StoreError },
    #[error("reading the tools file {path}: {source}")]
    ToolsUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the tools file {path} is refused: {source}")]
    Tools {
        path: PathBuf,
        source: RegistryError,
    },
    #[error("cannot listen on {addr}: {source}. Another program may be using it: pick another address with --bind or SAGA_BIND")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the tools file {path} names operations this build cannot perform:\n  - {}", .missing.join("\n  - "))]
    NoConnector { path: PathBuf, missing: Vec<String> },
    #[error("the tools file {path} configures its connectors wrongly:\n  - {}", .mistakes.join("\n  - "))]
    Connectors {
        path: PathBuf,
        mistakes: Vec<String>,
    },
    #[error("preparing the session table: {0}")]
    Sessions(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("resuming from the saga log: {0}")]
    Resume(#[source] crate::saga::engine::Refusal),
    #[error("serving: {0}")]
    Serve(std::io::Error),
}

pub struct Application {
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    router: Router,
    state: AppState,
    limits: crate::serving::ConnectionLimits,
}

impl Application {
    /// Builds the server with the connectors the tools file configures.
    pub async fn build(args: ServeArgs) -> Result<Self, ServerError> {
        let registry = load_registry(&args)?;
        let wire = Wire::new(&Timeouts {
            max_answer_bytes: args.limits.max_answer_bytes,
            ..Timeouts::default()
        });
        let connectors = ConnectorSet::from_settings(registry.connector_settings(), &wire)
            .map_err(|mistakes| ServerError::Connectors {
                path: args.tools.clone().unwrap_or_default(),
                mistakes,
            })?;
        Self::build_from(args, registry, connectors).await
    }

    /// Builds the server over the given connectors (tests pass in-process
    /// systems here).
    pub async fn build_with(
        args: ServeArgs,
        connectors: ConnectorSet,
    ) -> Result<Self, ServerError> {
        let registry = load_registry(&args)?;
        Self::build_from(args, registry, connectors).await
    }

    /// Builds the server over a registry and connectors made elsewhere (the
    /// demo points the shipped tools file at its simulators).
    pub async fn build_from(
        args: ServeArgs,
        mut registry: Registry,
        connectors: ConnectorSet,
    ) -> Result<Self, ServerError> {
        let connectors = crate::mcp::upstream::attach(&mut registry, connectors)
            .await
            .map_err(|mistakes| ServerError::Connectors {
                path: args.tools.clone().unwrap_or_default(),
                mistakes,
            })?;
        let missing = connectors.missing_for(&registry);
        if !missing.is_empty() {
            return Err(ServerError::NoConnector {
                path: args.tools.clone().unwrap_or_default(),
                missing,
            });
        }
        let listener = TcpListener::bind(args.bind)
            .await
            .map_err(|source| ServerError::Bind {
                addr: args.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(ServerError::Serve)?;
        let metrics_listener = match args.operations.metrics_bind {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| ServerError::Bind { addr, source })?,
            ),
            None => None,
        };
        let public_url = args.public_url.clone().unwrap_or_else(|| {
            format!("http://{addr}")
                .parse()
                .expect("an address is a URL")
        });
        let sign_in = crate::oidc::SignInPolicy::from_settings(&args.sign_in, &public_url)
            .map_err(ServerError::SignIn)?;
        let longest_call = Timeouts::default().longest_call();
        let opened = open_store(&args, addr, longest_call).await?;
        let slack_approvals = crate::approvals::SlackApprovals::from_registry(
            &registry,
            &Wire::new(&Timeouts::default()),
            &format!("http://{addr}"),
        )
        .map_err(|mistakes| ServerError::Connectors {
            path: args.tools.clone().unwrap_or_default(),
            mistakes,
        })?;
        let store = opened.saga_store();
        let registry = Arc::new(registry);
        let metrics = Arc::new(crate::ops::metrics::Metrics::new().with_known_labels(&registry));
        let engine = Arc::new(
            Engine::new(store.clone(), registry.clone(), Arc::new(connectors))
                .observed_by(metrics.clone())
                .calls_answered_within(longest_call),
        );
        // R11: the log says what was in flight when the last process
        // stopped; settle it before taking new calls. (Runs another live
        // instance holds are left to it; the sweep below carries on any
        // that a stopped instance left, once their leases run out.)
        let resumed = engine.resume().await.map_err(ServerError::Resume)?;
        tracing::info!(?resumed, "resumed from the saga log");
        let state = AppState {
            leptos_options: leptos_options(addr),
            streams: crate::streams::Streams::new(store.clone()),
            store,
            registry,
            engine,
            sign_ins: Arc::new(crate::auth::SignInThrottle::standard()),
            sign_in: Arc::new(sign_in),
            known_tokens: Default::default(),
            trusted_proxies: Arc::new(args.limits.trusted_proxies.clone()),
            opened: opened.clone(),
            metrics,
            draining: Default::default(),
            slack_approvals,
        };
        let timeout = std::time::Duration::from_secs(args.limits.request_timeout_secs.max(1));
        let browsers = BrowserPolicy::of(args.public_url.as_ref(), addr, args.secure_cookies);
        let router = router(state.clone(), &opened, browsers).await?;
        Ok(Application {
            listener,
            metrics_listener,
            router,
            state,
            limits: crate::serving::ConnectionLimits {
                max_connections: args.limits.max_connections,
                max_per_client: args.limits.max_connections_per_client,
                unlimited: Arc::new(args.limits.trusted_proxies.clone()),
                header_timeout: timeout,
                body_timeout: timeout,
                idle_timeout: std::time::Duration::from_secs(args.limits.idle_timeout_secs.max(1)),
                shutdown_grace: std::time::Duration::from_secs(args.operations.shutdown_grace_secs),
            },
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.state.leptos_options.site_addr
    }

    /// Where `/metrics` is served, when `--metrics-bind` asked for it.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then finishes in-flight requests.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        // While serving: approvals left pending past their deadline
        // expire, and unknowns nobody came back for are looked up (R7), not
        // only at the next start.
        let engine = self.state.engine.clone();
        let sign_ins = self.state.sign_ins.clone();
        let expiring = self.state.engine.clone();
        let expirer = tokio::spawn(async move {
            let mut every = tokio::time::interval(EXPIRE_EVERY);
            let mut outage = Outage::new("expiring approvals past their deadline");
            loop {
                every.tick().await;
                outage.after(expiring.expire_approvals().await);
            }
        });
        let sweeper = tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            let mut reconciling = Outage::new("reconciling steps left unknown");
            let mut resuming = Outage::new("carrying on runs left behind");
            loop {
                every.tick().await;
                sign_ins.forget_old();
                if let Some(settled) = reconciling.after(engine.reconcile_stale(STALE_AFTER).await)
                {
                    if settled > 0 {
                        tracing::info!(settled, "reconciled steps left unknown");
                    }
                }
                // Commits and unwinds an instance that stopped left behind,
                // once their leases have run out.
                if let Some(report) = resuming.after(engine.resume_left_behind(STALE_AFTER).await) {
                    if report.committed + report.unwound > 0 {
                        tracing::info!(?report, "carried on runs another instance left behind");
                    }
                }
            }
        });
        let pruner = self
            .state
            .registry
            .retention()
            .cloned()
            .map(|policy| tokio::spawn(prune_daily(self.state.clone(), policy)));
        let metrics_server = self.metrics_listener.map(|listener| {
            let router = crate::ops::health::metrics_router(self.state.clone());
            tokio::spawn(async move {
                if let Err(err) = axum::serve(listener, router).await {
                    tracing::error!(%err, "serving /metrics");
                }
            })
        });
        // The first reading before the first request, so the operators'
        // page counts everything this instance does.
        record_minute(&self.state).await;
        let recorder = tokio::spawn(record_each_minute(self.state.clone()));
        let streams = tokio::spawn(self.state.streams.clone().poll());
        let notifier = self.state.slack_approvals.clone().map(|slack| {
            tokio::spawn(
                crate::approvals::notifier::Notifier {
                    slack,
                    engine: self.state.engine.clone(),
                    registry: self.state.registry.clone(),
                }
                .run(),
            )
        });
        let draining = self.state.draining.clone();
        let shutdown = async move {
            shutdown.await;
            draining.start();
            tracing::info!("shutting down: no new calls; the ones in flight may finish");
        };
        let served = crate::serving::serve(self.listener, self.router, self.limits, shutdown)
            .await
            .map_err(ServerError::Serve);
        // Stopped and gone before returning: whoever opens the saga log
        // next (a restart in the same process) finds it let go.
        let background = [
            Some(sweeper),
            Some(expirer),
            Some(recorder),
            Some(streams),
            notifier,
            pruner,
            metrics_server,
        ];
        for task in background.into_iter().flatten() {
            task.abort();
            let _ = task.await;
        }
        served
    }

    /// Serves until Ctrl-C or SIGTERM.
    pub async fn serve_until_signal(self) -> anyhow::Result<()> {
        Ok(self.serve(shutdown_signal()).await?)
    }
}

/// A reading of every figure a minute, from the start, for the operators'
/// page's last hour.
/// `[retention]`: a pass a minute after start (once resume is done), then
/// one a day; each appends to that day's archive file when a directory is
/// set.
async fn prune_daily(state: AppState, policy: crate::saga::registry::RetentionPolicy) {
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    let mut every = tokio::time::interval(std::time::Duration::from_secs(24 * 60 * 60));
    loop {
        every.tick().await;
        let archive = match &policy.archive_dir {
            Some(dir) => {
                if let Err(err) = std::fs::create_dir_all(dir) {
                    tracing::error!(%err, dir = %dir.display(), "the retention pass cannot create its archive directory; nothing pruned");
                    continue;
                }
                Some(dir.join(format!(
                    "saga-archive-{}.jsonl",
                    chrono::Utc::now().format("%Y-%m-%d")
                )))
            }
            None => None,
        };
        let done = crate::ops::retention::prune(
            &*state.store,
            chrono::Utc::now(),
            policy.older_than,
            archive.as_deref(),
            false,
            policy.share,
            |_| {},
        )
        .await;
        match done {
            Ok(pass) => {
                state.metrics.pruned(&pass);
                tracing::info!(summary = %pass.summary(false), "retention pass");
            }
            Err(err) => tracing::error!(error = %format!("{err:#}"), "the retention pass stopped"),
        }
    }
}

/// What a background task logs: an unreachable database once when the
/// outage begins and once when it ends (not once a tick), anything else
/// each time it happens.
struct Outage {
    task: &'static str,
    down: bool,
}

impl Outage {
    fn new(task: &'static str) -> Self {
        Outage { task, down: false }
    }

    /// The value of a tick's work, having logged what needs logging.
    fn after<T>(&mut self, done: Result<T, crate::saga::engine::Refusal>) -> Option<T> {
        let task = self.task;
        match done {
            Ok(value) => {
                if std::mem::take(&mut self.down) {
                    tracing::info!("{task}: the database answers again");
                }
                Some(value)
            }
            Err(refusal) if refusal.is_unavailable() => {
                if !std::mem::replace(&mut self.down, true) {
                    tracing::error!(%refusal, "{task}: the database cannot be reached; trying again each tick, quietly, until it answers");
                }
                None
            }
            Err(refusal) => {
                tracing::error!(%refusal, "{task}");
                None
            }
        }
    }
}

async fn record_each_minute(state: AppState) {
    let start = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut minute = tokio::time::interval_at(start, std::time::Duration::from_secs(60));
    minute.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        minute.tick().await;
        record_minute(&state).await;
    }
}

async fn record_minute(state: &AppState) {
    let sources = state.metric_sources();
    if let Err(err) = state.metrics.record_minute(sources).await {
        tracing::warn!(%err, "reading the figures for the operators' page");
    }
}

/// How often the server sweeps for expired pivots and stale unknowns.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(15);
/// How often approvals are checked against their deadlines: a deadline is
/// kept to the second.
const EXPIRE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a step may stay unknown before the sweep looks it up (the
/// agent's own re-send usually settles it sooner).
const STALE_AFTER: chrono::Duration = chrono::Duration::seconds(30);

/// The dashboard's live stream: one `change` event per batch of new audit
/// lines (its id resumes the stream). Pages refetch what they show when it
/// fires. Counted against the signed-in person (`crate::streams`).
async fn live_changes(
    axum::extract::State(state): axum::extract::State<AppState>,
    session: Session,
    headers: axum::http::HeaderMap,
) -> Response {
    use crate::streams::Holder;
    use axum::response::sse::{KeepAlive, Sse};
    let holder = match session.get::<SessionUser>(SESSION_USER_KEY).await {
        Ok(Some(user)) if user.federated.is_some() => Holder::Federated(user.username),
        Ok(Some(user)) => Holder::Person(user.username),
        Ok(None) => return StatusCode::UNAUTHORIZED.into_response(),
        Err(err) => {
            tracing::error!(%err, "reading the session for the dashboard stream");
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    };
    let slot = state.streams.open(holder);
    let batches = state.streams.subscribe();
    let start = match headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
    {
        Some(id) => id,
        // A new listener wants changes from now on.
        None => match state.store.recent_events(1).await {
            Ok(events) => events.first().map(|e| e.id).unwrap_or(0),
            Err(err) => {
                tracing::error!(%err, "starting the dashboard stream");
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
        },
    };
    let changes = Changes {
        last: start,
        // A new listener is told of a change at once: whatever was written
        // between the page's first read and this stream's start (the page
        // refetches once) is not missed.
        greet: !headers.contains_key("last-event-id"),
        catching_up: true,
        batches,
        store: state.store.clone(),
        slot,
    };
    let stream = futures::stream::unfold(changes, |mut changes| async move {
        let event = changes.next().await?;
        Some((Ok::<_, std::convert::Infallible>(event), changes))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The dashboard's changes: how many audit lines arrived since the last
/// event, from the poller's batches (from the database when behind).
struct Changes {
    last: i64,
    greet: bool,
    catching_up: bool,
    batches: tokio::sync::broadcast::Receiver<Arc<Vec<crate::saga::model::Event>>>,
    store: Arc<dyn crate::saga::store::SagaStore>,
    slot: crate::streams::StreamSlot,
}

impl Changes {
    async fn next(&mut self) -> Option<axum::response::sse::Event> {
        use tokio::sync::broadcast::error::RecvError;
        if std::mem::take(&mut self.greet) {
            return Some(
                axum::response::sse::Event::default()
                    .id(self.last.to_string())
                    .event("change")
                    .data("0"),
            );
        }
        loop {
            let fresh: Vec<i64> = if self.catching_up {
                match self.store.all_events_after(self.last, 200).await {
                    Ok(events) => {
                        self.catching_up = events.len() == 200;
                        events.iter().map(|e| e.id).collect()
                    }
                    Err(err) => {
                        tracing::error!(%err, "reading the saga log for the dashboard");
                        return None;
                    }
                }
            } else {
                tokio::select! {
                    () = self.slot.ended.cancelled() => return None,
                    batch = self.batches.recv() => match batch {
                        Ok(batch) => batch.iter().map(|e| e.id).filter(|id| *id > self.last).collect(),
                        Err(RecvError::Lagged(_)) => {
                            self.catching_up = true;
                            continue;
                        }
                        Err(RecvError::Closed) => return None,
                    },
                }
            };
            if let Some(newest) = fresh.iter().max() {
                self.last = *newest;
                return Some(
                    axum::response::sse::Event::default()
                        .id(newest.to_string())
                        .event("change")
                        .data(fresh.len().to_string()),
                );
            }
        }
    }
}

/// The tools file named by `--tools`, validated; none means no tools.
fn load_registry(args: &ServeArgs) -> Result<Registry, ServerError> {
    let Some(path) = &args.tools else {
        return Ok(Registry::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| ServerError::ToolsUnreadable {
        path: path.clone(),
        source,
    })?;
    Registry::from_toml(&text).map_err(|source| ServerError::Tools {
        path: path.clone(),
        source,
    })
}

/// Leptos settings: cargo-leptos sets these at build time and the
/// `LEPTOS_*` variables may override them; the address is ours.
pub(crate) fn leptos_options(addr: SocketAddr) -> LeptosOptions {
    // Without cargo-leptos (plain `cargo test`) there is no bundle to name.
    let mut options = match option_env!("LEPTOS_OUTPUT_NAME") {
        Some(_) => get_configuration(None).map(|conf| conf.leptos_options).ok(),
        None => None,
    }
    .unwrap_or_else(|| LeptosOptions::builder().output_name("saga-harness").build());
    options.site_addr = addr;
    options
}

/// The most a server function (a dashboard form) may send: far more than
/// any correction a person writes, far less than what exhausts memory.
const SERVER_FN_BODY_LIMIT: usize = 64 * 1024;

/// What browsers are told, from where they reach the harness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrowserPolicy {
    /// The session cookie is `Secure` and named with the `__Host-` prefix.
    pub secure_cookies: bool,
    /// Pages carry `Strict-Transport-Security` (served over HTTPS).
    pub hsts: bool,
}

impl BrowserPolicy {
    /// Secure cookies unless browsers reach the harness over plain HTTP
    /// on a loopback address (a developer's machine, the demo), or the
    /// operator says otherwise; HSTS when the public URL is HTTPS.
    pub fn of(public_url: Option<&url::Url>, bind: SocketAddr, secure: Option<bool>) -> Self {
        let (https, loopback) = match public_url {
            Some(url) => (
                url.scheme() == "https",
                match url.host() {
                    Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    None => false,
                },
            ),
            None => (false, bind.ip().is_loopback()),
        };
        BrowserPolicy {
            secure_cookies: secure.unwrap_or(https || !loopback),
            hsts: https,
        }
    }

    fn cookie_name(self) -> &'static str {
        // `__Host-`: the browser keeps it only if Secure, for this host
        // alone and the whole site, so no subdomain can set or shadow it.
        if self.secure_cookies {
            "__Host-saga_session"
        } else {
            "saga_session"
        }
    }
}

async fn router(
    state: AppState,
    opened: &Opened,
    browsers: BrowserPolicy,
) -> Result<Router, ServerError> {
    let routes = generate_route_list(ui::App);
    let app = Router::new()
        .merge(crate::ops::health::routes())
        .merge(crate::api::router())
        .merge(crate::mcp::router(&state))
        .merge(crate::sign_in::routes())
        .route(ui::LIVE_PATH, get(live_changes))
        .route(
            "/slack/interactions",
            axum::routing::post(crate::approvals::interactions::handle),
        )
        .leptos_routes_with_context(&state, routes, || {}, {
            let options = state.leptos_options.clone();
            move || ui::shell(options.clone())
        })
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(
            ui::shell,
        ))
        .with_state(state.clone())
        .layer(middleware::from_fn(undecodable_forms_are_bad_requests))
        .layer(middleware::from_fn_with_state(state, require_sign_in))
        .layer(middleware::from_fn(limit_server_fn_bodies))
        .layer(middleware::from_fn(refuse_cross_site_posts))
        .layer(middleware::from_fn_with_state(browsers, security_headers));
    let expiry = Expiry::OnInactivity(tower_sessions::cookie::time::Duration::hours(8));
    let app = match opened {
        Opened::Sqlite(store) => {
            let sessions = SqliteSessions::new(store.session_pool());
            let migrated = sessions.migrate().await;
            with_sessions(app, sessions, migrated, expiry, browsers)
        }
        Opened::Postgres(store) if store.behind_pooler() => {
            let sessions = PooledSessions::new(store.session_pool());
            let migrated = sessions.migrate().await;
            with_sessions(app, sessions, migrated, expiry, browsers)
        }
        Opened::Postgres(store) => {
            let sessions = PgSessions::new(store.session_pool());
            let migrated = sessions.migrate().await;
            with_sessions(app, sessions, migrated, expiry, browsers)
        }
    }?;
    // Outermost, so a request's span is the root of everything it causes.
    Ok(app.layer(
        tower_http::trace::TraceLayer::new_for_http()
            .make_span_with(request_span)
            .on_request(())
            .on_response(record_status),
    ))
}

/// The dashboard's sessions in `sessions`, once its table is migrated;
/// expired ones are deleted in the background.
/// The saga log this instance serves from. Unnamed, an instance is its
/// host and port: unique among live instances, and the same again when it
/// restarts in place.
async fn open_store(
    args: &ServeArgs,
    addr: SocketAddr,
    longest_call: std::time::Duration,
) -> Result<store::Opened, ServerError> {
    let mut settings = args.database.store.clone();
    settings
        .instance_id
        .get_or_insert_with(|| format!("{}:{}", store::host_name(), addr.port()));
    let lease = std::time::Duration::from_millis(settings.run_lease_ms);
    if args.database.database_url.starts_with("postgres")
        && lease < longest_call + crate::store::postgres::CALL_MARGIN
    {
        tracing::warn!(
            lease_ms = settings.run_lease_ms,
            longest_call_ms = longest_call.as_millis() as u64,
            "the run lease is shorter than a call's longest time plus a second: each call \
             renews it in the database before it is sent, one statement more per call"
        );
    }
    store::open_with(&args.database.database_url, &settings)
        .await
        .map_err(|source| ServerError::Store {
            url: store::redact(&args.database.database_url),
            source,
        })
}

fn with_sessions<S>(
    app: Router,
    sessions: S,
    migrated: Result<(), impl std::error::Error + Send + Sync + 'static>,
    expiry: Expiry,
    browsers: BrowserPolicy,
) -> Result<Router, ServerError>
where
    S: tower_sessions::SessionStore + tower_sessions::session_store::ExpiredDeletion + Clone,
{
    migrated.map_err(|e| ServerError::Sessions(Box::new(e)))?;
    delete_expired_sessions(sessions.clone());
    Ok(app.layer(session_layer(sessions, expiry, browsers)))
}

/// Expired sessions are deleted from the table every few minutes, not
/// only when their cookie comes back.
fn delete_expired_sessions<S>(sessions: S)
where
    S: tower_sessions::session_store::ExpiredDeletion + Clone + 'static,
{
    tokio::spawn(async move {
        // At start-up too: the store's own loop first waits a period.
        if let Err(err) = sessions.delete_expired().await {
            tracing::error!(%err, "deleting expired sessions");
        }
        if let Err(err) = sessions
            .continuously_delete_expired(std::time::Duration::from_secs(300))
            .await
        {
            tracing::error!(%err, "deleting expired sessions stopped");
        }
    });
}

fn session_layer<S: tower_sessions::SessionStore + Clone>(
    store: S,
    expiry: Expiry,
    browsers: BrowserPolicy,
) -> SessionManagerLayer<S> {
    SessionManagerLayer::new(store)
        .with_name(browsers.cookie_name())
        .with_expiry(expiry)
        .with_same_site(SameSite::Lax)
        .with_http_only(true)
        .with_path("/")
        .with_secure(browsers.secure_cookies)
}

/// One span per request: its method and route (the router's pattern, so
/// a run's label or id never becomes a span name), and, once answered, its
/// status. Saga steps and system requests are its children.
fn request_span(request: &Request<Body>) -> tracing::Span {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| request.uri().path().to_owned());
    tracing::info_span!(
        "request",
        method = %request.method(),
        route,
        status = tracing::field::Empty,
    )
}

fn record_status(response: &Response, latency: std::time::Duration, span: &tracing::Span) {
    span.record("status", response.status().as_u16());
    tracing::info!(
        parent: span,
        status = response.status().as_u16(),
        took_ms = latency.as_millis() as u64,
        "answered"
    );
}

/// Paths anyone may fetch: the sign-in page, static files, the health
/// checks, and server functions (each checks the session itself).
fn is_public(path: &str) -> bool {
    path == "/login"
        || path == crate::sign_in::START_PATH
        || path == crate::sign_in::CALLBACK_PATH
        || path == "/healthz"
        || path == "/readyz"
        || path == "/favicon.svg"
        || path.starts_with("/pkg/")
        || path.starts_with("/api/")
        || path == "/mcp"
        || path.starts_with("/mcp/")
}

/// Server functions read their whole body: cap it before they do.
async fn limit_server_fn_bodies(request: Request<Body>, next: Next) -> Response {
    let path = request.uri().path();
    if !path.starts_with("/api/") || path.starts_with("/api/v1/") {
        return next.run(request).await;
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > SERVER_FN_BODY_LIMIT) {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "a dashboard form may send at most 64 KiB",
        )
            .into_response();
    }
    let (parts, body) = request.into_parts();
    let limited = http_body_util::Limited::new(body, SERVER_FN_BODY_LIMIT);
    next.run(Request::from_parts(parts, Body::new(limited)))
        .await
}

/// Headers on every response: no framing (the one-click Approve page must
/// not be clickjacked), no MIME sniffing, no referrer to other sites, and
/// nothing signed-in kept in caches.
async fn security_headers(
    axum::extract::State(browsers): axum::extract::State<BrowserPolicy>,
    mut request: Request<Body>,
    next: Next,
) -> Response {
    let is_static =
        request.uri().path().starts_with("/pkg/") || request.uri().path() == "/favicon.svg";
    // A fresh nonce per page: the page's own inline scripts carry it (the
    // shell hands it to Leptos), and no other inline script runs.
    let nonce = ScriptNonce::new();
    request.extensions_mut().insert(nonce.clone());
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let set =
        |headers: &mut axum::http::HeaderMap, name: header::HeaderName, value: &'static str| {
            headers.insert(name, axum::http::HeaderValue::from_static(value));
        };
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::REFERRER_POLICY, "same-origin");
    // Scripts come from this site, or inline with this page's nonce; the
    // dashboard's wasm may be compiled. Framing, plugins, foreign form
    // targets and base rewrites are refused.
    let policy = format!(
        "script-src 'self' 'nonce-{}' 'wasm-unsafe-eval'; frame-ancestors 'none'; \
         object-src 'none'; base-uri 'self'; form-action 'self'",
        nonce.0
    );
    if let Ok(value) = axum::http::HeaderValue::from_str(&policy) {
        headers.insert(header::CONTENT_SECURITY_POLICY, value);
    }
    if browsers.hsts {
        set(
            headers,
            header::STRICT_TRANSPORT_SECURITY,
            "max-age=31536000",
        );
    }
    if !is_static {
        set(headers, header::CACHE_CONTROL, "no-store");
    }
    response
}

/// Dashboard pages need a signed-in support lead; others go to sign in.
/// The role is read from the database on every request, so a changed role
/// or a removed user takes effect at once, not when the session expires.
async fn require_sign_in(
    axum::extract::State(state): axum::extract::State<AppState>,
    session: Session,
    request: Request<Body>,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let asset = path.starts_with("/pkg/") || path == "/favicon.svg";
    if !asset {
        if let Err(response) = refresh_session_user(&state, &session).await {
            return response;
        }
    }
    if request.method() != Method::GET || is_public(request.uri().path()) {
        return next.run(request).await;
    }
    match session.get::<SessionUser>(SESSION_USER_KEY).await {
        Ok(Some(_)) => next.run(request).await,
        // A stream cannot follow a redirect to a page: say why instead.
        Ok(None) if request.uri().path() == ui::LIVE_PATH => {
            (StatusCode::UNAUTHORIZED, "sign in first").into_response()
        }
        Ok(None) => Redirect::to("/login").into_response(),
        Err(err) => session_unreadable(&state, err.to_string()).await,
    }
}

/// A session (or the person behind it) that could not be read: while the
/// database cannot be reached, a page that says so plainly (`503`, with
/// `Retry-After`, reloading itself); otherwise an internal failure under
/// an incident id.
async fn session_unreadable(state: &AppState, err: String) -> Response {
    if crate::ops::health::database_answers(state).await.is_ok() {
        let incident = crate::incident::Incident::record("reading the session", &err);
        return (StatusCode::INTERNAL_SERVER_ERROR, incident.message()).into_response();
    }
    tracing::warn!(%err, "a page asked for while the database cannot be reached");
    database_unreachable_page()
}

/// What a person at the dashboard sees while the database cannot be
/// reached.
fn database_unreachable_page() -> Response {
    let page = "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
        <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
        <meta http-equiv=\"refresh\" content=\"5\">\
        <title>Database unreachable · Saga Harness</title>\
        <link rel=\"stylesheet\" href=\"/pkg/saga-harness.css\"></head>\
        <body><main class=\"page\"><h1>The harness cannot reach its database</h1>\
        <p>Nothing is lost: runs, approvals and corrections are kept in the database, \
        and this page comes back by itself as soon as it answers (it reloads every \
        5 seconds).</p><p>Meanwhile agents are told to send their calls again later, \
        and no call is sent to any system.</p></main></body></html>";
    let mut response =
        (StatusCode::SERVICE_UNAVAILABLE, axum::response::Html(page)).into_response();
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("5"),
    );
    response
}

/// Leptos answers a server function whose form cannot be decoded (a field
/// missing, a number that is not one) with 500 before the function runs.
/// That is the client's mistake, and it is said with a 400.
async fn undecodable_forms_are_bad_requests(request: Request<Body>, next: Next) -> Response {
    let path = request.uri().path();
    let server_fn = path.starts_with("/api/") && !path.starts_with("/api/v1/");
    let response = next.run(request).await;
    if !server_fn || response.status() != StatusCode::INTERNAL_SERVER_ERROR {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Server functions' error bodies are short texts (`Variant|message`).
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let client_mistake = [&b"Args|"[..], b"MissingArg|", b"Deserialization|"]
        .iter()
        .any(|variant| bytes.starts_with(variant));
    if client_mistake {
        parts.status = StatusCode::BAD_REQUEST;
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// The signed-in person as the database knows them now: a removed user is
/// signed out, a changed role applies from this request on.
async fn refresh_session_user(state: &AppState, session: &Session) -> Result<(), Response> {
    let user = match session.get::<SessionUser>(SESSION_USER_KEY).await {
        // The provider's people have no local account: their role is the
        // one their groups gave at sign-in, for the session's life.
        Ok(Some(user)) if user.federated.is_some() => return Ok(()),
        Ok(Some(user)) => user,
        Ok(None) => return Ok(()),
        Err(err) => return Err(session_unreadable(state, err.to_string()).await),
    };
    let failed = |err: &dyn std::fmt::Display| {
        let incident = crate::incident::Incident::record("refreshing the session", err);
        (StatusCode::INTERNAL_SERVER_ERROR, incident.message()).into_response()
    };
    match state.store.credentials(&user.username).await {
        Ok(Some(current))
            if current.user.role == user.role && current.user.groups == user.groups =>
        {
            Ok(())
        }
        Ok(Some(current)) => session
            .insert(
                SESSION_USER_KEY,
                SessionUser::local(
                    current.user.username,
                    current.user.role,
                    current.user.groups,
                ),
            )
            .await
            .map_err(|e| failed(&e)),
        Ok(None) => session.flush().await.map_err(|e| failed(&e)),
        Err(err) if err.is_internal() => Err(failed(&err)),
        Err(err) => Err(session_unreadable(state, err.to_string()).await),
    }
}

/// Form posts carry the session cookie; refuse those sent from another
/// site's page (CSRF): a browser's `Sec-Fetch-Site: cross-site`, or an
/// `Origin` whose scheme, host and port are not this server's.
async fn refuse_cross_site_posts(request: Request<Body>, next: Next) -> Response {
    if request.method() == Method::POST {
        let headers = request.headers();
        let cross_site_fetch = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"));
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        // Behind a TLS-terminating proxy the page's scheme is the proxy's.
        let scheme = headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("http");
        let same_origin = |origin: &str| {
            host.is_some_and(|host| {
                origin.eq_ignore_ascii_case(&format!("{scheme}://{host}"))
                    // A proxy that terminates TLS may not say so.
                    || origin.eq_ignore_ascii_case(&format!("https://{host}"))
            })
        };
        // "null" (an opaque origin) is never this server, so it is refused.
        if cross_site_fetch || origin.is_some_and(|origin| !same_origin(origin)) {
            let message =
                "cross-site form posts are refused: submit the form from the dashboard itself";
            // The agent API answers every refusal in its own shape.
            if request.uri().path().starts_with("/api/v1/") {
                let body = serde_json::json!({"code": "cross_site_post", "message": message});
                return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
            }
            return (StatusCode::FORBIDDEN, message).into_response();
        }
    }
    next.run(request).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(%err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
