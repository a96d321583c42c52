//! The dashboard for support leads: sign-in and the runs list. Pages render
//! on the server with their data (`SsrMode::Async`), so they work before
//! (and without) the wasm; server functions check the session themselves,
//! since they are public endpoints.

use crate::saga::class::Role;
use leptos::prelude::*;
use leptos_meta::{provide_meta_context, Link, MetaTags, Stylesheet, Title};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::hooks::use_query_map;
use leptos_router::{path, SsrMode};
use serde::{Deserialize, Serialize};

/// The session key under which the signed-in support lead is kept.
pub const SESSION_USER_KEY: &str = "user";

/// Who is signed in, as kept in the session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionUser {
    pub username: String,
    pub role: Role,
}

/// One line of the runs list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    pub id: String,
    pub agent: String,
    pub purpose: String,
    pub status: String,
    pub age: String,
    /// Non-pure steps given out so far.
    pub steps: i64,
    pub irreversible_before_pivot: i64,
    pub awaiting_approval: bool,
}

pub fn shell(options: LeptosOptions) -> impl IntoView {
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

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Stylesheet id="leptos" href="/pkg/saga-harness.css"/>
        <Link rel="icon" type_="image/svg+xml" href="/favicon.svg"/>
        <Title text="Saga Harness"/>
        <Router>
            <Routes fallback=|| view! { <main class="page"><h1>"Page not found"</h1><p><a href="/">"Back to the runs"</a></p></main> }>
                <Route path=path!("/login") view=LoginPage ssr=SsrMode::Async/>
                <Route path=path!("/") view=RunsPage ssr=SsrMode::Async/>
            </Routes>
        </Router>
    }
}

#[component]
fn LoginPage() -> impl IntoView {
    let login = ServerAction::<Login>::new();
    let query = use_query_map();
    let refused = move || query.read().get("error").is_some();
    view! {
        <Title text="Sign in · Saga Harness"/>
        <main class="login">
            <h1>"Saga Harness"</h1>
            <p class="lede">"Sign in to approve pivots, read saga logs and sign off corrections."</p>
            <ActionForm action=login attr:class="card">
                <Show when=refused>
                    <p class="error" role="alert">"Wrong username or password."</p>
                </Show>
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
        </main>
    }
}

#[component]
fn RunsPage() -> impl IntoView {
    let runs = Resource::new(|| (), |_| list_runs());
    let me = Resource::new(|| (), |_| current_user());
    let logout = ServerAction::<Logout>::new();
    view! {
        <Title text="Runs · Saga Harness"/>
        <header class="top">
            <a class="brand" href="/">"Saga Harness"</a>
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
        <main class="page">
            <h1>"Runs"</h1>
            <Suspense fallback=|| view! { <p>"Loading runs…"</p> }>
                <ErrorBoundary fallback=|errors| view! {
                    <p class="error" role="alert">
                        {move || errors.get().into_iter().map(|(_, e)| e.to_string()).collect::<Vec<_>>().join("; ")}
                    </p>
                }>
                    {move || Suspend::new(async move { runs.await.map(runs_table) })}
                </ErrorBoundary>
            </Suspense>
        </main>
    }
}

fn runs_table(rows: Vec<RunRow>) -> AnyView {
    if rows.is_empty() {
        return view! {
            <p class="empty">"No runs yet. A run appears here as soon as an agent starts one through the API."</p>
        }
        .into_any();
    }
    view! {
        <table class="runs">
            <thead>
                <tr>
                    <th>"Status"</th>
                    <th>"Agent"</th>
                    <th>"Purpose"</th>
                    <th>"Age"</th>
                    <th class="num">"Steps"</th>
                    <th class="num" title="Irreversible steps run before the pivot (goal: 0)">"Irrev. before pivot"</th>
                </tr>
            </thead>
            <tbody>
                {rows.into_iter().map(|row| {
                    let status_class = format!("status status-{}", row.status.to_lowercase().replace('_', "-"));
                    view! {
                        <tr class:attention=row.awaiting_approval>
                            <td><span class=status_class>{row.status.clone()}</span></td>
                            <td>{row.agent}</td>
                            <td>{row.purpose}</td>
                            <td>{row.age}</td>
                            <td class="num">{row.steps}</td>
                            <td class="num">{row.irreversible_before_pivot}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

#[server(endpoint = "login")]
pub async fn login(username: String, password: String) -> Result<(), ServerFnError> {
    use crate::auth::verify_password;
    let state = ssr::app_state()?;
    let credentials = state
        .store
        .credentials(username.trim())
        .await
        .map_err(ssr::internal)?;
    // Verify even for an unknown name, so timing does not tell which
    // usernames exist.
    let (hash, user) = match credentials {
        Some(c) => (c.password_hash, Some(c.user)),
        None => (ssr::DECOY_HASH.clone(), None),
    };
    let verified = tokio::task::spawn_blocking(move || verify_password(&password, &hash))
        .await
        .map_err(ssr::internal)?;
    let Some(user) = user.filter(|_| verified) else {
        leptos_axum::redirect("/login?error=1");
        return Ok(());
    };
    let session = ssr::session().await?;
    // A new id on sign-in, so a session id planted before it is worthless.
    session.cycle_id().await.map_err(ssr::internal)?;
    session
        .insert(
            SESSION_USER_KEY,
            SessionUser {
                username: user.username,
                role: user.role,
            },
        )
        .await
        .map_err(ssr::internal)?;
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

#[server(endpoint = "me")]
pub async fn current_user() -> Result<Option<SessionUser>, ServerFnError> {
    ssr::signed_in().await.map(Some).or(Ok(None))
}

#[server(endpoint = "runs")]
pub async fn list_runs() -> Result<Vec<RunRow>, ServerFnError> {
    use crate::saga::status::RunStatus;
    ssr::signed_in().await?;
    let state = ssr::app_state()?;
    let runs = state.store.list_runs(500).await.map_err(ssr::internal)?;
    // A held single step waits for a person just as a pivot does.
    let held: std::collections::HashSet<_> = state
        .store
        .pending_approvals()
        .await
        .map_err(ssr::internal)?
        .into_iter()
        .map(|approval| approval.run_id)
        .collect();
    let now = chrono::Utc::now();
    let mut rows: Vec<RunRow> = runs
        .into_iter()
        .map(|run| RunRow {
            id: run.id.to_string(),
            agent: run.agent,
            purpose: run.purpose,
            status: run.status.as_str().to_owned(),
            age: ssr::age(now - run.created_at),
            steps: run.next_step,
            irreversible_before_pivot: run.irreversible_before_pivot,
            awaiting_approval: run.status == RunStatus::AwaitingApproval || held.contains(&run.id),
        })
        .collect();
    // Awaiting approval first; otherwise newest first (the store's order).
    rows.sort_by_key(|row| !row.awaiting_approval);
    Ok(rows)
}

#[cfg(feature = "ssr")]
pub mod ssr {
    //! Server-side helpers for the server functions above.

    use super::{SessionUser, SESSION_USER_KEY};
    use crate::server::AppState;
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

    pub async fn session() -> Result<Session, ServerFnError> {
        leptos_axum::extract::<Session>()
            .await
            .map_err(ServerFnError::from)
    }

    /// The signed-in support lead, or an error telling them to sign in.
    pub async fn signed_in() -> Result<SessionUser, ServerFnError> {
        session()
            .await?
            .get::<SessionUser>(SESSION_USER_KEY)
            .await
            .map_err(internal)?
            .ok_or_else(|| ServerFnError::new("You are not signed in: sign in at /login."))
    }

    /// Logs the cause and tells the client only that something failed.
    pub fn internal(err: impl std::fmt::Display) -> ServerFnError {
        tracing::error!(%err, "dashboard request failed");
        ServerFnError::new(
            "The server could not complete this request; the details are in its log.",
        )
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
