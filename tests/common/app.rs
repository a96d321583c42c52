//! The harness inside the test process, served over real HTTP on port 0:
//! the one way the in-process tests start it. `Spawn` says what differs
//! from a plain `saga-harness serve` on the test's database; `TestApp` is
//! the server running, stopped when it is dropped.

use super::TestDb;
use saga_harness::config::{DatabaseArgs, ServeArgs};
use saga_harness::connectors::ConnectorSet;
use saga_harness::server::{Application, ServerError};
use saga_harness::state::AppState;
use saga_harness::store::StoreSettings;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `saga-harness serve` on `database_url`, bound to a free loopback port,
/// with every other setting at its default.
pub fn serve_args(database_url: &str, store: StoreSettings) -> ServeArgs {
    ServeArgs {
        bind: "127.0.0.1:0".parse().unwrap(),
        database: DatabaseArgs {
            database_url: database_url.to_owned(),
            store,
        },
        tools: None,
        secure_cookies: None,
        public_url: None,
        limits: Default::default(),
        operations: Default::default(),
        sign_in: Default::default(),
    }
}

/// How to start the harness for one test.
pub struct Spawn {
    args: ServeArgs,
    connectors: Option<ConnectorSet>,
}

impl Spawn {
    /// On the test's database, opened the way it must be (through its
    /// pooler, if it has one).
    pub fn on(db: &TestDb) -> Spawn {
        Spawn {
            args: serve_args(&db.url, db.settings()),
            connectors: None,
        }
    }

    /// On a database named by its URL alone, opened with the default
    /// settings.
    pub fn on_url(database_url: &str) -> Spawn {
        Spawn {
            args: serve_args(database_url, Default::default()),
            connectors: None,
        }
    }

    /// With this tools file.
    pub fn tools(mut self, path: PathBuf) -> Spawn {
        self.args.tools = Some(path);
        self
    }

    /// Over these connectors instead of the ones the tools file configures
    /// (the in-process model world).
    pub fn connectors(mut self, connectors: ConnectorSet) -> Spawn {
        self.connectors = Some(connectors);
        self
    }

    /// With any other setting changed.
    pub fn with(mut self, change: impl FnOnce(&mut ServeArgs)) -> Spawn {
        change(&mut self.args);
        self
    }

    /// Built, not served: for the tests of what start-up refuses.
    pub async fn build(self) -> Result<Application, ServerError> {
        match self.connectors {
            Some(connectors) => Application::build_with(self.args, connectors).await,
            None => Application::build(self.args).await,
        }
    }

    /// Built and served, answering `/healthz` before this returns.
    pub async fn start(self) -> TestApp {
        let app = self.build().await.expect("the harness starts");
        let base = format!("http://{}", app.local_addr());
        let metrics = app
            .metrics_addr()
            .map(|addr| format!("http://{addr}/metrics"));
        let state = app.state().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            app.serve(async {
                let _ = stopped.await;
            })
            .await
            .expect("serving");
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while reqwest::get(format!("{base}/healthz")).await.is_err() {
            assert!(Instant::now() < deadline, "the server did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        TestApp {
            base,
            metrics,
            state: Some(state),
            stop: Some(stop),
            served: Some(served),
        }
    }
}

/// The harness serving in this process.
pub struct TestApp {
    /// `http://127.0.0.1:PORT`: the dashboard; the agent API is under
    /// `/api/v1`.
    pub base: String,
    /// The metrics listener's `/metrics`, when it has one of its own.
    pub metrics: Option<String>,
    state: Option<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl TestApp {
    /// What the handlers reach: the store, the engine, the registry.
    pub fn state(&self) -> &AppState {
        self.state.as_ref().expect("serving")
    }

    /// The agent API's base URL.
    pub fn api(&self) -> String {
        format!("{}/api/v1", self.base)
    }

    /// Stops serving and waits until the server has let go of everything,
    /// the saga log's file included.
    pub async fn stop(mut self) {
        drop(self.state.take());
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.expect("the server stops");
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
