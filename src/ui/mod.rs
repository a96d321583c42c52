//! The dashboard for support leads: sign-in, the runs list, a run's page
//! (pivot panel, timeline, questions, unwind review), the corrections inbox,
//! the audit trail and, for admins, the operators' figures. Pages render on
//! the server with their data
//! (`SsrMode::Async`), so they work before (and without) the wasm; every
//! action is a plain form (`ActionForm`) that also works without JS. Server
//! functions check the session and the role themselves, since they are
//! public endpoints. With JS, pages refresh when the saga log changes (a
//! server-sent event stream at [`LIVE_PATH`]).

pub mod audit;
pub mod figures;
pub mod inbox;
pub mod operations;
pub mod run;
pub mod runs;
pub mod sign_in;
pub mod timeline;
pub mod words;

use crate::saga::class::Role;
use leptos::prelude::*;
use leptos_meta::{provide_meta_context, Link, MetaTags, Stylesheet, Title};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::hooks::use_query_map;
use leptos_router::{path, SsrMode};
use serde::{Deserialize, Serialize};

/// The dashboard's live stream of saga-log changes (session-authenticated).
pub const LIVE_PATH: &str = "/dashboard/events";

/// The session key under which the signed-in support lead is kept.
pub const SESSION_USER_KEY: &str = "user";

/// Who is signed in, as kept in the session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionUser {
    pub username: String,
    pub role: Role,
    /// The groups that may give them the right to decide a tool's calls
    /// (a tool's `approvers`): a local account's, or the provider's.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Signed in through the company's identity provider; `None` for a
    /// local account's password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub federated: Option<Federated>,
}

/// A person the identity provider signed in: what the provider calls them
/// and the group that gave them their role. Taken from the token at each
/// sign-in and kept only as long as the session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Federated {
    /// The provider's issuer (`iss`).
    pub issuer: String,
    /// The person's subject there (`sub`).
    pub subject: String,
    /// The group that gave them their role.
    pub granted_by: String,
}

impl SessionUser {
    /// Someone signed in with a local account's password.
    pub fn local(username: String, role: Role, groups: Vec<String>) -> Self {
        SessionUser {
            username,
            role,
            groups,
            federated: None,
        }
    }
}

/// How this server may be signed in to, for the sign-in page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignInOptions {
    /// The identity provider's name, when there is one.
    pub provider: Option<String>,
    /// Whether the password form is offered.
    pub local: bool,
}

pub fn shell(options: LeptosOptions) -> impl IntoView {
    // The page's inline scripts carry the nonce its Content-Security-Policy
    // names (set per request by the server's security headers).
    #[cfg(feature = "ssr")]
    if let Some(nonce) = use_context::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<ScriptNonce>().cloned())
    {
        provide_context(leptos::nonce::Nonce::from_value(nonce.0));
    }
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <AutoReload options=options.clone()/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// The nonce of one page's inline scripts (`script-src 'nonce-…'`): 128
/// random bits, hex-encoded, made anew for every response.
#[cfg(feature = "ssr")]
#[derive(Clone, Debug)]
pub struct ScriptNonce(pub String);

#[cfg(feature = "ssr")]
impl ScriptNonce {
    pub fn new() -> Self {
        ScriptNonce(hex::encode(rand::random::<[u8; 16]>()))
    }
}

#[cfg(feature = "ssr")]
impl Default for ScriptNonce {
    fn default() -> Self {
        Self::new()
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    provide_live_updates();
    view! {
        <Stylesheet id="leptos" href="/pkg/saga-harness.css"/>
        <Link rel="icon" type_="image/svg+xml" href="/favicon.svg"/>
        <Title text="Saga Harness"/>
        <Router>
            <Routes fallback=|| view! { <main class="page"><h1>"Page not found"</h1><p><a href="/">"Back to the runs"</a></p></main> }>
                <Route path=path!("/login") view=LoginPage ssr=SsrMode::Async/>
                <Route path=path!("/") view=runs::RunsPage ssr=SsrMode::Async/>
                <Route path=path!("/runs/:id") view=run::RunPage ssr=SsrMode::Async/>
                <Route path=path!("/corrections") view=inbox::InboxPage ssr=SsrMode::Async/>
                <Route path=path!("/audit") view=audit::AuditPage ssr=SsrMode::Async/>
                <Route path=path!("/operations") view=operations::OperationsPage ssr=SsrMode::Async/>
            </Routes>
        </Router>
    }
}

#[component]
fn LoginPage() -> impl IntoView {
    let login = ServerAction::<Login>::new();
    let choices = Resource::new(|| (), |_| sign_in_choices());
    let query = use_query_map();
    let error = move || query.read().get("error");
    // A refusal is shown by its code's own sentence; an unknown code is
    // a wrong password (the form's own refusal).
    let refusal = move || error().and_then(|code| sign_in::SignInRefusal::of_code(&code));
    let wrong_password = move || error().is_some_and(|e| e != "throttled") && refusal().is_none();
    // The wait is a number of minutes or nothing: a link cannot put its
    // own words on this page.
    let throttled = move || {
        error().filter(|e| e == "throttled").map(|_| {
            query
                .read()
                .get("wait")
                .and_then(|w| w.parse::<u64>().ok())
                .map_or(1, |w| w.clamp(1, 60))
        })
    };
    view! {
        <Title text="Sign in · Saga Harness"/>
        <main class="login">
            <h1>"Saga Harness"</h1>
            <p class="lede">"Sign in to approve pivots, read saga logs and sign off corrections."</p>
            {move || refusal().map(|refusal| view! {
                <p class="error" role="alert">{refusal.words()}</p>
            })}
            <Suspense>
                {move || Suspend::new(async move {
                    let choices = choices.await.unwrap_or(SignInOptions { provider: None, local: true });
                    let provider = choices.provider.map(|name| view! {
                        <div class="card">
                            <a class="button provider" href="/auth/oidc/start" rel="external">"Sign in with " {name}</a>
                        </div>
                    });
                    let form = choices.local.then(|| view! {
                        <ActionForm action=login attr:class="card">
                            <Show when=wrong_password>
                                <p class="error" role="alert">"Wrong username or password."</p>
                            </Show>
                            {move || throttled().map(|minutes| view! {
                                <p class="error" role="alert">
                                    "Too many sign-in attempts for this account from this address. Wait "
                                    {minutes} " minute(s), then try again."
                                </p>
                            })}
                            <label>
                                "Username"
                                <input type="text" name="username" autocomplete="username" required autofocus/>
                            </label>
                            <label>
                                "Password"
                                <input type="password" name="password" autocomplete="current-password" required/>
                            </label>
                            <button type="submit">"Sign in"</button>
                        </ActionForm>
                    });
                    view! { {provider} {form} }
                })}
            </Suspense>
        </main>
    }
}

/// The bar on every signed-in page: where to go, what waits, who is in.
#[component]
pub fn TopBar() -> impl IntoView {
    let live = live_tick();
    // Only signed-in pages listen for changes (the stream needs a session).
    #[cfg(feature = "hydrate")]
    Effect::new(move |_| live::listen());
    let me = Resource::new(|| (), |_| current_user());
    let counts = Resource::new(move || live.get(), |_| nav_counts());
    let logout = ServerAction::<Logout>::new();
    view! {
        <header class="top">
            <a class="brand" href="/">"Saga Harness"</a>
            <nav aria-label="Main">
                <a href="/">
                    "Runs"
                    <Suspense>
                        {move || Suspend::new(async move {
                            counts.await.ok().filter(|c| c.awaiting > 0).map(|c| view! {
                                <span class="count" title="waiting for a person: approvals and questions">{c.awaiting}</span>
                            })
                        })}
                    </Suspense>
                </a>
                <a href="/corrections">
                    "Corrections"
                    <Suspense>
                        {move || Suspend::new(async move {
                            counts.await.ok().filter(|c| c.corrections > 0).map(|c| view! {
                                <span class="count" title="waiting for sign-off">{c.corrections}</span>
                            })
                        })}
                    </Suspense>
                </a>
                <a href="/audit">"Audit"</a>
                <Suspense>
                    {move || Suspend::new(async move {
                        me.await.ok().flatten().filter(|user| user.role == Role::Admin).map(|_| view! {
                            <a href="/operations">"Operations"</a>
                        })
                    })}
                </Suspense>
            </nav>
            <Suspense>
                {move || Suspend::new(async move {
                    me.await.ok().flatten().map(|user| view! {
                        <span class="who">{user.username}" · "{user.role.as_str()}</span>
                    })
                })}
            </Suspense>
            <ActionForm action=logout attr:class="signout">
                <button type="submit">"Sign out"</button>
            </ActionForm>
        </header>
    }
    // Erased: every page embeds the bar, and its full type nested in each
    // page's type is what overflows rustc's query depth in release builds.
    .into_any()
}

/// What the person's last action said: a one-time message kept in their
/// session by the action and taken out by the page it sent them to, so it
/// shows with and without JS, once, and a link cannot put words on a page.
#[component]
pub fn Notice(query: Memo<leptos_router::params::ParamsMap>) -> impl IntoView {
    // The query only says that a message waits; its text is the session's.
    let flash = Resource::new(
        move || query.read().get("done"),
        |waiting| async move {
            match waiting {
                Some(_) => take_flash().await.ok().flatten(),
                None => None,
            }
        },
    );
    view! {
        <Suspense>
            {move || Suspend::new(async move {
                flash.await.map(|flash| {
                    if flash.error {
                        view! { <p class="error" role="alert">{flash.text}</p> }.into_any()
                    } else {
                        view! { <p class="notice" role="status">{flash.text}</p> }.into_any()
                    }
                })
            })}
        </Suspense>
    }
}

/// A one-time message from an action to the page it leads to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Flash {
    pub error: bool,
    pub text: String,
}

/// The session key of the waiting [`Flash`].
pub const FLASH_KEY: &str = "flash";

#[server(endpoint = "take_flash")]
pub async fn take_flash() -> Result<Option<Flash>, ServerFnError> {
    ssr::session()
        .await?
        .remove::<Flash>(FLASH_KEY)
        .await
        .map_err(ssr::internal)
}

/// Text for a `<textarea>`'s content. Leptos writes a textarea's children
/// into the server's HTML unescaped (it treats the element like `<script>`),
/// so text holding `</textarea>` would end the element and whatever follows
/// would be markup. On the server the text is escaped (a textarea decodes
/// character references, so the field shows the text as it is); in the
/// browser it becomes a text node, which is never parsed, so it stays as is.
pub fn textarea_text(text: String) -> String {
    if cfg!(feature = "ssr") {
        text.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    } else {
        text
    }
}

/// A failed page's error as a person reads it: the server's sentence,
/// without the wire format's `ServerError|` prefix.
pub fn error_words(error: &leptos::error::Error) -> String {
    let text = error.to_string();
    match text.split_once('|') {
        Some((kind, said)) if kind.ends_with("Error") && !kind.contains(' ') => said.to_owned(),
        _ => text,
    }
}

/// A system's reference as a lead may read it: none when it is made of
/// the harness's own key (an email's Message-ID `<key@…>`), which belongs
/// with the technical details, not in a sentence.
pub fn lead_reference(reference: Option<&str>) -> Option<String> {
    let reference = reference?;
    let mut run = 0;
    for c in reference.chars() {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 32 {
            return None;
        }
    }
    Some(reference.to_owned())
}

/// The CSS class of a status badge: `status status-awaiting-approval`.
pub fn status_class(status: &str) -> String {
    format!("status status-{}", status.to_lowercase().replace('_', "-"))
}

/// Counts shown in the navigation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    /// Runs waiting for a person: an approval or an answer.
    pub awaiting: i64,
    pub corrections: i64,
}

/// A number that changes whenever the saga log does; resources that read
/// it refetch. Without JS it never changes (pages are fresh on each load).
pub fn live_tick() -> ReadSignal<u64> {
    use_context::<(ReadSignal<u64>, WriteSignal<u64>)>()
        .map(|(tick, _)| tick)
        .unwrap_or_else(|| signal(0).0)
}

fn provide_live_updates() {
    provide_context(signal(0u64));
}

#[cfg(feature = "hydrate")]
mod live {
    //! Listens to the dashboard's event stream and bumps the tick, at most
    //! a few times a second so a burst of log lines refetches once.
    use leptos::prelude::*;
    use wasm_bindgen::closure::Closure;
    use wasm_bindgen::JsCast;

    thread_local! {
        static LISTENING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Opens the stream once per page load; later calls do nothing.
    pub fn listen() {
        let Some((_, set_tick)) = use_context::<(ReadSignal<u64>, WriteSignal<u64>)>() else {
            return;
        };
        if LISTENING.with(|on| on.replace(true)) {
            return;
        }
        let Ok(source) = web_sys::EventSource::new(super::LIVE_PATH) else {
            return;
        };
        let pending = std::rc::Rc::new(std::cell::Cell::new(false));
        let on_change = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |_| {
            if pending.replace(true) {
                return;
            }
            let pending = pending.clone();
            set_timeout(
                move || {
                    pending.set(false);
                    set_tick.update(|t| *t += 1);
                },
                std::time::Duration::from_millis(300),
            );
        });
        let _ =
            source.add_event_listener_with_callback("change", on_change.as_ref().unchecked_ref());
        // The page lives as long as the tab: so do the stream and its callback.
        on_change.forget();
        std::mem::forget(source);
    }
}

#[server(endpoint = "login")]
pub async fn login(username: String, password: String) -> Result<(), ServerFnError> {
    use crate::auth::{verify_password, NotNow, MAX_PASSWORD_BYTES, MAX_USERNAME_BYTES};
    let state = ssr::app_state()?;
    if !state.sign_in.local {
        leptos_axum::redirect(&format!(
            "/login?error={}",
            sign_in::SignInRefusal::LocalOff.code()
        ));
        return Ok(());
    }
    // Names and passwords no account could have are refused before they
    // cost a lookup, a hash or a place in the throttle.
    if username.len() > MAX_USERNAME_BYTES
        || password.len() > MAX_PASSWORD_BYTES
        || ssr::unstorable(&username).is_some()
    {
        leptos_axum::redirect("/login?error=1");
        return Ok(());
    }
    let peer = leptos_axum::extract::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .await
        .ok()
        .map(|info| info.0.ip());
    let headers = leptos_axum::extract::<axum::http::HeaderMap>()
        .await
        .map_err(ssr::internal)?;
    let address = peer.map(|peer| {
        crate::serving::client_address(
            peer,
            headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()),
            &state.trusted_proxies,
        )
    });
    let username = username.trim().to_owned();
    // The attempt counts now, before the password is checked, so a burst
    // of concurrent guesses cannot all pass the limit.
    let attempt = match state.sign_ins.attempt(&username, address) {
        Ok(attempt) => attempt,
        Err(NotNow::Throttled(wait)) => {
            let minutes = wait.as_secs().div_ceil(60).max(1);
            leptos_axum::redirect(&format!("/login?error=throttled&wait={minutes}"));
            return Ok(());
        }
        Err(NotNow::Busy) => {
            let response = expect_context::<leptos_axum::ResponseOptions>();
            response.set_status(axum::http::StatusCode::SERVICE_UNAVAILABLE);
            response.insert_header(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
            return Err(ServerFnError::new(
                "The server is busy checking other sign-ins; try again in a moment.",
            ));
        }
    };
    let credentials = state
        .store
        .credentials(&username)
        .await
        .map_err(ssr::internal)?;
    // Verify even for an unknown name, so timing does not tell which
    // usernames exist.
    let (hash, user) = match credentials {
        Some(c) => (c.password_hash, Some(c.user)),
        None => (ssr::DECOY_HASH.clone(), None),
    };
    let (verified, attempt) = tokio::task::spawn_blocking(move || {
        let verified = verify_password(&password, &hash);
        (verified, attempt.checked())
    })
    .await
    .map_err(ssr::internal)?;
    let Some(user) = user.filter(|_| verified) else {
        leptos_axum::redirect("/login?error=1");
        return Ok(());
    };
    attempt.succeeded();
    let session = ssr::session().await?;
    // A new id on sign-in, so a session id planted before it is worthless.
    session.cycle_id().await.map_err(ssr::internal)?;
    session
        .insert(
            SESSION_USER_KEY,
            SessionUser::local(user.username, user.role, user.groups),
        )
        .await
        .map_err(ssr::internal)?;
    session.set_expiry(Some(ssr::ends_after(state.sign_in.max_age)));
    leptos_axum::redirect("/");
    Ok(())
}

#[server(endpoint = "logout")]
pub async fn logout() -> Result<(), ServerFnError> {
    let session = ssr::session().await?;
    session.flush().await.map_err(ssr::internal)?;
    leptos_axum::redirect("/login");
    Ok(())
}

#[server(endpoint = "sign_in_choices")]
pub async fn sign_in_choices() -> Result<SignInOptions, ServerFnError> {
    let state = ssr::app_state()?;
    Ok(SignInOptions {
        provider: state.sign_in.provider.as_ref().map(|p| p.name.clone()),
        local: state.sign_in.local,
    })
}

#[server(endpoint = "me")]
pub async fn current_user() -> Result<Option<SessionUser>, ServerFnError> {
    // Nobody signed in is an answer here, not a refusal.
    ssr::session()
        .await?
        .get::<SessionUser>(SESSION_USER_KEY)
        .await
        .map_err(ssr::internal)
}

#[server(endpoint = "nav_counts")]
pub async fn nav_counts() -> Result<Waiting, ServerFnError> {
    ssr::signed_in().await?;
    let state = ssr::app_state()?;
    let approvals = state
        .store
        .pending_approvals()
        .await
        .map_err(ssr::internal)?;
    // Everything that waits for a person: a decision or an answer.
    let mut awaiting: std::collections::HashSet<_> = approvals.iter().map(|a| a.run_id).collect();
    awaiting.extend(
        state
            .store
            .runs_with_status(&[crate::saga::status::RunStatus::NeedsAttention])
            .await
            .map_err(ssr::internal)?
            .into_iter()
            .map(|run| run.id),
    );
    let corrections = state
        .store
        .correction_queue()
        .await
        .map_err(ssr::internal)?
        .iter()
        .filter(|c| c.status == crate::saga::status::CorrectionStatus::Pending)
        .count();
    Ok(Waiting {
        awaiting: awaiting.len() as i64,
        corrections: corrections as i64,
    })
}

#[cfg(feature = "ssr")]
pub mod ssr {
    //! Server-side helpers for the server functions above.

    use super::{SessionUser, SESSION_USER_KEY};
    use crate::state::AppState;
    use axum::http::StatusCode;
    use leptos::prelude::*;
    use tower_sessions::Session;

    /// An Argon2id hash of a random password, verified against when the
    /// username is unknown so both paths cost the same.
    pub static DECOY_HASH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        crate::auth::hash_password(&crate::auth::new_api_token()).unwrap_or_default()
    });

    pub fn app_state() -> Result<AppState, ServerFnError> {
        use_context::<AppState>()
            .ok_or_else(|| ServerFnError::new("the server's state is missing from this request"))
    }

    /// A session that ends `max_age` after its sign-in, however active.
    pub fn ends_after(max_age: std::time::Duration) -> tower_sessions::Expiry {
        let max_age = time::Duration::try_from(max_age).unwrap_or(time::Duration::hours(12));
        tower_sessions::Expiry::AtDateTime(time::OffsetDateTime::now_utc() + max_age)
    }

    pub async fn session() -> Result<Session, ServerFnError> {
        leptos_axum::extract::<Session>()
            .await
            .map_err(ServerFnError::from)
    }

    /// The signed-in support lead, or a 401 telling them to sign in (a
    /// refusal, not a server failure: without the status it would be a 500).
    pub async fn signed_in() -> Result<SessionUser, ServerFnError> {
        let user = session()
            .await?
            .get::<SessionUser>(SESSION_USER_KEY)
            .await
            .map_err(internal)?;
        user.ok_or_else(|| {
            refused(
                StatusCode::UNAUTHORIZED,
                "You are not signed in: sign in at /login.",
            )
        })
    }

    /// A refusal with its HTTP status: a bare `ServerFnError` answers 500,
    /// which would call the client's mistake the server's failure.
    pub fn refused(status: StatusCode, message: impl Into<String>) -> ServerFnError {
        if let Some(response) = use_context::<leptos_axum::ResponseOptions>() {
            response.set_status(status);
        }
        ServerFnError::new(message.into())
    }

    /// A run id from a form, or a 400 saying it is none.
    pub fn run_id(text: &str) -> Result<uuid::Uuid, ServerFnError> {
        uuid::Uuid::parse_str(text)
            .map_err(|_| refused(StatusCode::BAD_REQUEST, format!("{text:?} is not a run id")))
    }

    /// A two-way choice from a form: `Ok(true)` for `yes`, `Ok(false)` for
    /// `no`, and a 400 for anything else, so a mistyped value never takes
    /// the branch that unwinds or re-sends.
    pub fn choice(field: &str, value: &str, yes: &str, no: &str) -> Result<bool, ServerFnError> {
        match value {
            v if v == yes => Ok(true),
            v if v == no => Ok(false),
            other => Err(refused(
                StatusCode::BAD_REQUEST,
                format!("{field} must be {yes:?} or {no:?}, not {other:?}"),
            )),
        }
    }

    /// When the question a form answers was asked (RFC 3339, as the page
    /// wrote it).
    pub fn asked_at(value: &str) -> Result<chrono::DateTime<chrono::Utc>, ServerFnError> {
        chrono::DateTime::parse_from_rfc3339(value)
            .map(|at| at.with_timezone(&chrono::Utc))
            .map_err(|_| {
                refused(
                    StatusCode::BAD_REQUEST,
                    format!("asked must be the time the question was asked, not {value:?}"),
                )
            })
    }

    /// Why this text from a form cannot be stored, if it cannot:
    /// PostgreSQL keeps no NUL character in text (refused on SQLite alike).
    pub fn unstorable(text: &str) -> Option<&'static str> {
        text.contains('\0')
            .then_some("The text cannot contain the NUL character (U+0000).")
    }

    /// The signed-in person, if their role may decide (approve, reject,
    /// answer, unwind, sign off); otherwise a 403 that says so.
    pub async fn deciding_person() -> Result<crate::saga::model::Actor, ServerFnError> {
        Ok(crate::saga::model::Actor::User(decider().await?.username))
    }

    /// The signed-in person, if their role may decide; otherwise a 403.
    pub async fn decider() -> Result<SessionUser, ServerFnError> {
        let user = signed_in().await?;
        if !user.role.can_decide() {
            return Err(refused(
                StatusCode::FORBIDDEN,
                format!(
                    "{} is {}: only an approver or an admin may do this.",
                    user.username,
                    user.role.with_article()
                ),
            ));
        }
        Ok(user)
    }

    /// How `user` signed in, for the audit trail.
    pub fn signed_in_how(user: &SessionUser) -> crate::saga::rights::SignedIn {
        match &user.federated {
            Some(f) => crate::saga::rights::SignedIn::Provider {
                issuer: f.issuer.clone(),
                subject: f.subject.clone(),
            },
            None => crate::saga::rights::SignedIn::Password,
        }
    }

    /// `user` (an approver, see [`decider`]), if they may decide
    /// `approval`: for every tool of it that names approver groups they
    /// are in one. A refusal is a 403 that says who may, and is
    /// written to the audit trail. `Ok` also gives the audit line of the
    /// right, to write once the decision is made.
    pub async fn deciding_on(
        state: &AppState,
        approval: &crate::saga::model::Approval,
        user: &SessionUser,
    ) -> Result<(crate::saga::model::Actor, String), ServerFnError> {
        let person = crate::saga::model::Actor::User(user.username.clone());
        let judged = crate::saga::rights::judge(
            &state.registry,
            approval,
            &user.username,
            &signed_in_how(user),
            &user.groups,
        );
        match judged {
            Ok(right) => Ok((person, right)),
            Err(no) => {
                if let Err(err) = state.store.note(approval.run_id, &person, &no.audit).await {
                    return Err(internal(err));
                }
                Err(refused(StatusCode::FORBIDDEN, no.words))
            }
        }
    }

    /// Writes where a decision's right came from to the audit trail; a
    /// failure is logged, the decision stands.
    pub async fn note_right(
        state: &AppState,
        run: uuid::Uuid,
        person: &crate::saga::model::Actor,
        line: &str,
    ) {
        if let Err(err) = state.store.note(run, person, line).await {
            tracing::error!(%err, "writing a decision's right to the audit trail");
        }
    }

    /// Sends the browser back to `page` with what happened in words, kept
    /// in the session for that page to show once.
    pub async fn back_to<T: std::fmt::Display, E: crate::incident::Told>(
        page: &str,
        done: Result<T, E>,
    ) {
        use percent_encoding::{utf8_percent_encode, CONTROLS};
        let flash = match done {
            Ok(notice) => super::Flash {
                error: false,
                text: notice.to_string(),
            },
            Err(refusal) => super::Flash {
                error: true,
                text: refusal.told("dashboard decision"),
            },
        };
        match session().await {
            Ok(session) => {
                if let Err(err) = session.insert(super::FLASH_KEY, flash).await {
                    tracing::error!(%err, "keeping a message for the next page");
                }
            }
            Err(err) => tracing::error!(%err, "keeping a message for the next page"),
        }
        // The page is a path of ours, but made with a form's field: nothing
        // in it may end the header (a panic) or leave the site (`\\`).
        const UNSAFE_IN_PATH: &percent_encoding::AsciiSet = &CONTROLS
            .add(b' ')
            .add(b'"')
            .add(b'#')
            .add(b'%')
            .add(b'<')
            .add(b'>')
            .add(b'?')
            .add(b'\\')
            .add(b'`');
        let page = utf8_percent_encode(page, UNSAFE_IN_PATH).to_string();
        // A fresh value each time, so a page that already shows a message
        // asks for the next one.
        let nonce: u32 = rand::random();
        leptos_axum::redirect(&format!("{page}?done={nonce:x}"));
    }

    /// Logs the cause and tells the client only that something failed.
    pub fn internal(err: impl std::fmt::Display) -> ServerFnError {
        ServerFnError::new(crate::incident::Incident::record("dashboard request", &err).message())
    }

    /// "3 min", "2 h", "5 d".
    pub fn age(elapsed: chrono::Duration) -> String {
        let seconds = elapsed.num_seconds().max(0);
        match seconds {
            0..=59 => format!("{seconds} s"),
            60..=3599 => format!("{} min", seconds / 60),
            3600..=86_399 => format!("{} h", seconds / 3600),
            _ => format!("{} d", seconds / 86_400),
        }
    }
}
