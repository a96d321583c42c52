//! The real `saga-harness` binary as a child process: started with
//! `serve`, its standard error kept in a file the test can read, stopped
//! with SIGKILL (or dying by itself at a failpoint). Tests that need a
//! process boundary — a crash, a restart, several instances, the log a
//! process writes — use this rather than an in-process server.

use saga_harness::sim::bundle::CREDENTIALS;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How a harness process is started.
#[derive(Clone, Debug)]
pub struct Launch {
    pub database_url: String,
    pub tools: Option<PathBuf>,
    /// `NAME[:NTH]` for `SAGA_FAILPOINT`; none arms nothing.
    pub failpoint: Option<String>,
    pub rust_log: String,
    pub env: Vec<(String, String)>,
}

impl Launch {
    pub fn new(database_url: &str, tools: Option<&Path>) -> Self {
        Launch {
            database_url: database_url.to_owned(),
            tools: tools.map(Path::to_path_buf),
            failpoint: None,
            rust_log: "warn".to_owned(),
            env: Vec::new(),
        }
    }

    pub fn failpoint(mut self, spec: impl Into<String>) -> Self {
        self.failpoint = Some(spec.into());
        self
    }

    pub fn rust_log(mut self, filter: &str) -> Self {
        self.rust_log = filter.to_owned();
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }
}

pub struct TestProcess {
    child: Child,
    pub pid: u32,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

impl TestProcess {
    /// Starts the binary and waits until `/healthz` answers (after resume,
    /// which runs before the server takes requests).
    pub async fn start(launch: &Launch) -> TestProcess {
        // Port 0: the binary binds a port of its own and says which, so no
        // other test's process can take it between a choice and the bind.
        let mut harness = TestProcess::spawn(launch);
        if let Err(log) = harness.wait_healthy().await {
            panic!("the harness exited during start-up:\n{log}");
        }
        harness
    }

    fn spawn(launch: &Launch) -> TestProcess {
        let dir = tempfile::tempdir().expect("a directory for the log");
        let log = dir.path().join("stderr.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_saga-harness"));
        command
            .args(["serve", "--bind", "127.0.0.1:0"])
            .env("DATABASE_URL", &launch.database_url)
            .env("RUST_LOG", &launch.rust_log)
            .env_remove(saga_harness::failpoint::VARIABLE)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the log file"));
        if let Some(tools) = &launch.tools {
            command.arg("--tools").arg(tools);
        }
        if let Some(spec) = &launch.failpoint {
            command.env(saga_harness::failpoint::VARIABLE, spec);
        }
        for (name, value) in CREDENTIALS {
            command.env(name, value);
        }
        for (name, value) in &launch.env {
            command.env(name, value);
        }
        let child = command.spawn().expect("the harness binary starts");
        TestProcess {
            pid: child.id(),
            child,
            // Known once the process says where it listens.
            base: String::new(),
            log,
            _dir: dir,
        }
    }

    async fn wait_healthy(&mut self) -> Result<(), String> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("a client");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("({status}) {}", self.log_text()));
            }
            if self.base.is_empty() {
                let log = self.log_text();
                // Only a whole line: the file may be read mid-write.
                let said = log
                    .split_inclusive('\n')
                    .filter(|line| line.ends_with('\n'))
                    .find_map(|line| line.split_once("listening on ").map(|(_, at)| at.trim()));
                match said {
                    Some(base) => self.base = base.to_owned(),
                    None => {
                        tokio::time::sleep(Duration::from_millis(25)).await;
                        continue;
                    }
                }
            }
            if let Ok(response) = http.get(format!("{}/healthz", self.base)).send().await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "the harness at {} did not become healthy:\n{}",
            self.base,
            self.log_text()
        );
    }

    /// Everything the process wrote to standard error so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to end by itself (at a failpoint).
    pub async fn wait_for_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL: no graceful shutdown, as a crash would be.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process's resident memory (VmRSS), in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

impl Drop for TestProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A dashboard session: signs in over `POST /api/login` and keeps the
/// cookie; server functions are posted as forms, the way a browser
/// without JavaScript would.
pub struct Dashboard {
    pub http: reqwest::Client,
}

impl Dashboard {
    pub fn new() -> Self {
        Dashboard {
            http: reqwest::Client::builder()
                .cookie_store(true)
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(60))
                .build()
                .expect("a client"),
        }
    }

    /// Signs in; panics unless the server sends the browser to `/`.
    pub async fn sign_in(&self, base: &str, username: &str, password: &str) {
        let response = self
            .post(
                base,
                "login",
                &[("username", username), ("password", password)],
            )
            .await
            .expect("the sign-in answers");
        let location = response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert_eq!(location, "/", "sign-in of {username} refused");
    }

    /// A dashboard page's HTML, as the server renders it.
    pub async fn page(&self, base: &str, path: &str) -> String {
        self.http
            .get(format!("{base}{path}"))
            .send()
            .await
            .expect("the page answers")
            .text()
            .await
            .expect("the page's text")
    }

    /// Posts a server function's form, as the dashboard's page does.
    pub async fn post(
        &self,
        base: &str,
        endpoint: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Result<reqwest::Response> {
        self.http
            .post(format!("{base}/api/{endpoint}"))
            .header("accept", "text/html,application/xhtml+xml")
            .form(form)
            .send()
            .await
    }
}

/// The one-time message the last dashboard action left for the next page,
/// as `error=TEXT` or `notice=TEXT`; empty when there is none.
pub async fn flash(http: &reqwest::Client, base: &str) -> String {
    let response = http
        .post(format!("{base}/api/take_flash"))
        .header("origin", base)
        .form(&[] as &[(&str, &str)])
        .send()
        .await
        .expect("the message answers");
    let value: serde_json::Value = response.json().await.unwrap_or_default();
    match value.get("text").and_then(|t| t.as_str()) {
        Some(text) if value["error"] == true => format!("error={text}"),
        Some(text) => format!("notice={text}"),
        None => String::new(),
    }
}

impl Default for Dashboard {
    fn default() -> Self {
        Self::new()
    }
}

/// The shipped tools file pointed at `sims`, with every settle pause cut to
/// `settle_ms` (the simulators' search does not lag unless a test says so,
/// and a pause only makes a test slower), written into `dir`.
pub fn tools_file(
    sims: &saga_harness::sim::bundle::Simulators,
    dir: &Path,
    settle_ms: i64,
) -> PathBuf {
    let shipped = std::fs::read_to_string("tools/support.toml").expect("the shipped tools file");
    let pointed = sims
        .point(&shipped)
        .expect("the tools file points at the simulators");
    let mut file: toml::Table = toml::from_str(&pointed).expect("valid TOML");
    if let Some(tools) = file.get_mut("tool").and_then(|t| t.as_array_mut()) {
        for tool in tools.iter_mut().filter_map(|t| t.as_table_mut()) {
            tool.insert("settle_ms".into(), toml::Value::Integer(settle_ms));
        }
    }
    let path = dir.join("tools.toml");
    std::fs::write(&path, toml::to_string(&file).expect("TOML")).expect("the tools file");
    path
}

/// One Argon2id hash per test binary: hashing is slow in debug builds, and
/// every provisioned person may share the password.
pub static PASSWORD: &str = "correct horse battery staple";
static PASSWORD_HASH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    saga_harness::auth::hash_password(PASSWORD).expect("hashing a password")
});

/// Puts an agent token and the named people (`(username, role)`, all with
/// [`PASSWORD`]) into the database at `url`, then closes it (a SQLite file
/// is one process's at a time). Returns the token.
pub async fn provision(url: &str, agent: &str, people: &[(&str, &str)]) -> String {
    let opened = saga_harness::store::open(url)
        .await
        .expect("the database opens");
    let store = opened.saga_store();
    let token = saga_harness::auth::new_api_token();
    store
        .add_api_token(agent, &saga_harness::auth::token_hash(&token), None)
        .await
        .expect("a token");
    for (username, role) in people {
        store
            .add_user(username, &PASSWORD_HASH, role.parse().expect("a role"))
            .await
            .expect("a person");
    }
    drop(store);
    drop(opened);
    token
}

/// An agent over the HTTP API with one run of its own: what the fault
/// tests drive.
pub struct ApiAgent {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
    /// The run's id.
    pub run: String,
}

impl ApiAgent {
    /// Creates a run for the agent of `token`; panics unless it is made.
    pub async fn with_new_run(base: &str, token: &str, purpose: &str) -> ApiAgent {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a client");
        let created: serde_json::Value = http
            .post(format!("{base}/api/v1/runs"))
            .bearer_auth(token)
            .json(&serde_json::json!({ "purpose": purpose }))
            .send()
            .await
            .expect("the run is created")
            .json()
            .await
            .expect("a JSON answer");
        let run = created["run"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no run in {created}"))
            .to_owned();
        ApiAgent {
            http,
            base: base.to_owned(),
            token: token.to_owned(),
            run,
        }
    }

    /// Step `step` of the run: a reship of its own order.
    pub async fn reship(&self, step: i64) -> reqwest::Result<reqwest::Response> {
        self.http
            .post(format!("{}/api/v1/runs/{}/calls", self.base, self.run))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({"tool": "reship", "step": step,
                "args": {"order_id": format!("ord_{step}"), "items": ["LAMP-7"], "email": "grace@example.com"}}))
            .send()
            .await
    }
}

/// What a crowd of agents met while the world failed around the harness.
#[derive(Debug, Default)]
pub struct Tally {
    /// How many answers came with each HTTP status.
    pub statuses: std::collections::BTreeMap<u16, usize>,
    /// Requests that got no HTTP answer at all.
    pub no_answer: usize,
    /// The longest any `503` took to come.
    pub slowest_refusal: Duration,
    /// When the last `503` came.
    pub last_refusal: Option<Instant>,
    /// How many refusals came with each code (`store_unavailable`,
    /// `run_busy` …).
    pub codes: std::collections::BTreeMap<String, usize>,
    /// Each step the harness said was confirmed: (run, step, reference).
    pub confirmed: Vec<(String, i64, String)>,
}

impl Tally {
    /// Adds what another crowd met.
    pub fn add(&mut self, other: Tally) {
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        self.no_answer += other.no_answer;
        self.slowest_refusal = self.slowest_refusal.max(other.slowest_refusal);
        self.last_refusal = self.last_refusal.max(other.last_refusal);
        for (code, n) in other.codes {
            *self.codes.entry(code).or_default() += n;
        }
        self.confirmed.extend(other.confirmed);
    }

    /// Answers with this status.
    pub fn count(&self, status: u16) -> usize {
        self.statuses.get(&status).copied().unwrap_or(0)
    }

    /// Every answer that was not a success (200, or 201 for a new run), a
    /// `503` (the database cannot be reached: send again) or a `409` (the
    /// run is busy or moved under the call: send again).
    pub fn unexpected(&self) -> Vec<(u16, usize)> {
        self.statuses
            .iter()
            .filter(|(s, _)| !matches!(**s, 200 | 201 | 409 | 503))
            .map(|(s, n)| (*s, *n))
            .collect()
    }

    fn saw(&mut self, status: u16, took: Duration) {
        *self.statuses.entry(status).or_default() += 1;
        if status == 503 {
            self.slowest_refusal = self.slowest_refusal.max(took);
            self.last_refusal = Some(Instant::now());
        }
    }
}

/// `agents` agents, each creating a run and making `calls` reship calls
/// through the HTTP API, as a well-behaved agent does: any answer that is
/// not final (no answer, `503`, an outcome that is not confirmed) is sent
/// again, unchanged, 50 ms later. Returns once every step is confirmed,
/// or panics after `give_up`.
pub async fn crowd(base: &str, token: &str, agents: usize, calls: i64, give_up: Duration) -> Tally {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("a client");
    let deadline = Instant::now() + give_up;
    // Each crowd's runs are its own, also when one follows another.
    static CROWDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let crowd = CROWDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let agent = |n: usize| {
        let (http, base, token) = (http.clone(), base.to_owned(), token.to_owned());
        async move {
            let mut tally = Tally::default();
            let pause = || tokio::time::sleep(Duration::from_millis(50));
            let run = loop {
                assert!(Instant::now() < deadline, "agent {n} never got a run");
                let started = Instant::now();
                let created = http
                    .post(format!("{base}/api/v1/runs"))
                    .bearer_auth(&token)
                    .json(&serde_json::json!({"purpose": format!("agent {n}"), "label": format!("crowd-{crowd}-agent-{n}")}))
                    .send()
                    .await;
                match created {
                    Ok(answer) => {
                        tally.saw(answer.status().as_u16(), started.elapsed());
                        if answer.status().is_success() {
                            let body: serde_json::Value = answer.json().await.unwrap();
                            break body["run"]["id"].as_str().unwrap().to_owned();
                        }
                    }
                    Err(_) => tally.no_answer += 1,
                }
                pause().await;
            };
            for step in 0..calls {
                loop {
                    assert!(
                        Instant::now() < deadline,
                        "agent {n} never got step {step} confirmed: {tally:?}"
                    );
                    let started = Instant::now();
                    let answer = http
                        .post(format!("{base}/api/v1/runs/{run}/calls"))
                        .bearer_auth(&token)
                        .json(&serde_json::json!({"tool": "reship", "step": step,
                            "args": {"order_id": format!("ord_{crowd}_{n}_{step}"), "items": ["LAMP-7"], "email": "grace@example.com"}}))
                        .send()
                        .await;
                    match answer {
                        Ok(answer) => {
                            let status = answer.status().as_u16();
                            tally.saw(status, started.elapsed());
                            let body: serde_json::Value = answer.json().await.unwrap_or_default();
                            if let Some(code) = body["code"].as_str() {
                                *tally.codes.entry(code.to_owned()).or_default() += 1;
                            }
                            if status == 200 && body["outcome"] == "confirmed" {
                                let reference =
                                    body["external_ref"].as_str().unwrap_or("").to_owned();
                                tally.confirmed.push((run.clone(), step, reference));
                                break;
                            }
                        }
                        Err(_) => tally.no_answer += 1,
                    }
                    pause().await;
                }
            }
            tally
        }
    };
    let mut all = Tally::default();
    for tally in futures::future::join_all((0..agents).map(agent)).await {
        all.add(tally);
    }
    all
}

/// A fault test's size knob: `variable` as a number, else `default`.
pub fn knob(variable: &str, default: u64) -> u64 {
    std::env::var(variable)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}
