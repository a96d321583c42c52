//! One place for flags and environment variables. Each flag has an
//! environment variable of the same meaning; flags win.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "saga-harness",
    version,
    about = "A write-ahead saga log between LLM agents and the systems their tools touch"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How the log is written to standard error: text lines, or one JSON
    /// object a line with the spans it happened in.
    #[arg(
        long,
        global = true,
        env = "SAGA_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: crate::ops::logging::LogFormat,
    /// Also export every span over OTLP/HTTP (protobuf) to the collector at
    /// this base URL (e.g. http://localhost:4318; spans go to /v1/traces
    /// under it). Off unless given.
    #[arg(long, global = true, env = "SAGA_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<url::Url>,
}

#[derive(Debug, Args, Clone)]
pub struct DatabaseArgs {
    /// sqlite://FILE (default, created if missing) or postgres://USER:PASSWORD@HOST/DB
    #[arg(long, env = "DATABASE_URL", default_value = crate::store::DEFAULT_DATABASE_URL)]
    pub database_url: String,
    #[command(flatten)]
    pub store: crate::store::StoreSettings,
}

// Parsed once at start-up: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the agent API and the dashboard.
    Serve(ServeArgs),
    /// Apply the database migrations and exit.
    Migrate(DatabaseArgs),
    /// Manage support leads who sign in to the dashboard.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage agents' API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Run the simulated Stripe, Jira, Zendesk, Slack, SMTP, back office and
    /// warehouse on loopback (what tools/support.toml points at).
    #[cfg(feature = "simulators")]
    Sim(SimArgs),
    /// Start the simulators and the server on a fresh SQLite file, and run a
    /// scripted agent that leaves runs to look at in the dashboard.
    #[cfg(feature = "simulators")]
    Demo(DemoArgs),
    /// Run your own agent against the simulators under the incident's
    /// faults, one scenario at a time, and score it from the systems'
    /// ledgers and the saga log. Exits non-zero when a scenario fails.
    #[cfg(feature = "simulators")]
    Eval(EvalArgs),
    /// Take settled runs out of the saga log: those last changed longer
    /// ago than --older-than that nothing can still move (no unsettled
    /// step, waiting approval, pending correction or open authorisation),
    /// each first written to --archive as one JSON line when given.
    Prune(PruneArgs),
    /// Check a tools file and a database the way a new user needs: the
    /// file's validation, each connector's credentials, each system
    /// reachable and its lookup answering (read-only), the database's
    /// migrations and durability settings. Exits non-zero when something
    /// needs fixing.
    Doctor(DoctorArgs),
    /// Measure the per-step cost against the disk's commit floor, the HTTP
    /// path, flatness, unwind, the dashboard and (optionally) peer engines;
    /// print a table and write JSON.
    #[cfg(feature = "bench")]
    Bench(BenchArgs),
}

#[derive(Debug, Args, Clone)]
pub struct PruneArgs {
    /// How long a run stays after its last change ("90d", "12w").
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub older_than: std::time::Duration,
    /// Append each pruned run here first, one JSON line per run (flushed
    /// to disk before its rows go).
    #[arg(long, value_name = "FILE.jsonl")]
    pub archive: Option<PathBuf>,
    /// Say what would be pruned and why the rest stays; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The most of the time the pass works (0.1 is a tenth); after each
    /// page it rests the rest, leaving the database to agents' calls. 1
    /// prunes flat out.
    #[arg(long, value_name = "FRACTION", default_value = "0.1")]
    pub share: crate::saga::registry::Share,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// A duration as people write one ("90d", "12w", "36h").
pub fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(age) if age.is_zero() => Err("must be longer than zero".into()),
        Ok(age) => Ok(age),
        Err(e) => Err(format!("`{text}` is not a duration like \"90d\": {e}")),
    }
}

#[cfg(feature = "simulators")]
#[derive(Debug, Args, Clone)]
pub struct EvalArgs {
    /// The command that runs the agent, through the shell (`python3
    /// my_agent.py`). It gets SAGA_API_URL, SAGA_TOKEN, SAGA_MCP_URL,
    /// SAGA_RUN_LABEL, SAGA_TASK and SAGA_SCENARIO.
    #[arg(long)]
    pub agent: String,
    /// A scenario file (TOML); default: the built-in incident set
    /// (tools/eval.toml).
    #[arg(long, value_name = "FILE")]
    pub scenarios: Option<PathBuf>,
    /// Only these scenarios, by name, comma-separated.
    #[arg(long, value_name = "NAME,…")]
    pub only: Option<String>,
    /// Write JUnit XML here: one testcase per scenario.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Write every scorecard as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The agent's time limit per scenario, instead of the file's.
    #[arg(long, value_name = "N")]
    pub timeout_s: Option<u64>,
    /// Keep each scenario's files here (the agent's output, the harness's
    /// log, the saga log, the ledgers); default: removed afterwards.
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
}

#[cfg(feature = "bench")]
/// Which storage backends the benchmark measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchBackend {
    Sqlite,
    Postgres,
    Both,
}

#[cfg(feature = "bench")]
#[derive(Debug, Args, Clone)]
pub struct BenchArgs {
    /// A seconds-long run with small sizes (for CI): every figure, little data.
    #[arg(long)]
    pub quick: bool,
    /// Instead: many runs at once, each making one call its system answers
    /// a second later, through real harness processes (1, 200 and 1,000 runs
    /// on one instance; on PostgreSQL also 3,000 on three instances).
    #[arg(long)]
    pub in_flight: bool,
    /// Instead: what checking limits costs one engine step, with and
    /// without a money and a calls limit, at one run and at eight runs of
    /// one agent.
    #[arg(long)]
    pub limits: bool,
    /// Instead: what pruning settled history costs: seconds per million
    /// saga_log rows, and one run's step p50 alone and while a prune runs.
    #[arg(long)]
    pub prune: bool,
    /// With --prune: also time the steps beside a prune of a log grown to
    /// about this many saga_log rows (copies of engine-made runs, written
    /// in bulk), e.g. 10000000. Off unless set.
    #[arg(long, value_name = "ROWS", requires = "prune")]
    pub prune_log_rows: Option<u64>,
    /// Print the README's retention table from a report `--prune --json`
    /// wrote, and exit.
    #[arg(long, value_name = "JSON")]
    pub prune_table: Option<PathBuf>,
    /// Print the README's limits table from a report `--limits --json`
    /// wrote, and exit.
    #[arg(long, value_name = "JSON")]
    pub limits_table: Option<PathBuf>,
    /// Print the README's in-flight table from a report `--in-flight --json`
    /// wrote, and exit.
    #[arg(long, value_name = "JSON")]
    pub in_flight_table: Option<PathBuf>,
    /// Print the README's benchmark, targets and durability tables from a
    /// report `--json` wrote, and exit.
    #[arg(long, value_name = "JSON")]
    pub readme_tables: Option<PathBuf>,
    /// Write every figure, with its rounds, to this JSON file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "sqlite")]
    pub backend: BenchBackend,
    /// An administrator URL of a PostgreSQL server; the benchmark creates
    /// its own databases there (saga_bench_*) and drops them afterwards.
    #[arg(long, env = "SAGA_BENCH_POSTGRES_URL")]
    pub postgres_url: Option<String>,
    /// Also measure DBOS Transact and Restate (full mode only), from the
    /// scripts in benches/peers and the installs scripts/bench.sh makes.
    #[arg(long)]
    pub peers: bool,
    /// Rounds (every figure is measured once per round, interleaved);
    /// at least 5.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Where the peer installs live (a Python venv with dbos, node_modules
    /// with Restate); default: saga-harness/peers under the user's cache.
    #[arg(long, env = "SAGA_BENCH_PEERS_HOME")]
    pub peers_home: Option<PathBuf>,
    /// Where the peer scripts are.
    #[arg(long, default_value = "benches/peers")]
    pub peers_scripts: PathBuf,
}

#[derive(Debug, Args, Clone)]
pub struct DoctorArgs {
    /// The tools file (TOML) to check.
    #[arg(long, env = "SAGA_TOOLS")]
    pub tools: Option<PathBuf>,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The identity provider, when one is configured, is checked too.
    #[command(flatten)]
    pub sign_in: SignIn,
}

#[cfg(feature = "simulators")]
#[derive(Debug, Args, Clone)]
pub struct DemoArgs {
    /// Address the dashboard and the agent API listen on.
    #[arg(long, env = "SAGA_BIND", default_value = "127.0.0.1:3000")]
    pub bind: SocketAddr,
    /// The demo's own SQLite file, emptied at every start.
    #[arg(long, default_value = "saga-demo.db")]
    pub database: PathBuf,
    /// Address the simulators listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub sim_ip: std::net::IpAddr,
    /// First of the simulators' eight consecutive ports; 0 picks free ports.
    #[arg(long, default_value_t = 4101)]
    pub first_port: u16,
    /// The demo's people may also sign in through an identity provider.
    #[command(flatten)]
    pub sign_in: SignIn,
}

#[cfg(feature = "simulators")]
#[derive(Debug, Args, Clone)]
pub struct SimArgs {
    /// Address the simulators listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub ip: std::net::IpAddr,
    /// First of eight consecutive ports (stripe, jira, zendesk, slack, smtp,
    /// orders, warehouse, mailbox); 0 picks free ports.
    #[arg(long, default_value_t = 4101)]
    pub first_port: u16,
}

#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "SAGA_BIND", default_value = "127.0.0.1:3000")]
    pub bind: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The tools file (TOML) declaring every tool agents may call.
    #[arg(long, env = "SAGA_TOOLS")]
    pub tools: Option<PathBuf>,
    /// The address people and agents reach the harness at (behind a proxy,
    /// the proxy's): `https://…` turns on HSTS. Default: `http://` and the
    /// bind address.
    #[arg(long, env = "SAGA_PUBLIC_URL")]
    pub public_url: Option<url::Url>,
    /// Mark the session cookie `Secure` (and name it with the `__Host-`
    /// prefix). Default: on, unless the public URL is plain HTTP on a
    /// loopback address (a developer's own machine).
    #[arg(
        long,
        env = "SAGA_SECURE_COOKIES",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub secure_cookies: Option<bool>,
    #[command(flatten)]
    pub limits: Limits,
    #[command(flatten)]
    pub operations: Operations,
    #[command(flatten)]
    pub sign_in: SignIn,
}

/// How people sign in to the dashboard: local accounts (`saga-harness
/// user add`), the company's OpenID Connect provider, or both. The client
/// secret is read from `SAGA_OIDC_CLIENT_SECRET` only, never from a flag
/// (flags show in the process list).
#[derive(Clone, Debug, Args)]
pub struct SignIn {
    /// The provider's issuer URL; it is found at
    /// `<issuer>/.well-known/openid-configuration`. Off unless given.
    #[arg(long, env = "SAGA_OIDC_ISSUER", value_name = "URL")]
    pub oidc_issuer: Option<url::Url>,
    /// The client id the provider registered for the harness.
    #[arg(long, env = "SAGA_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,
    /// The client secret: from `SAGA_OIDC_CLIENT_SECRET` when not set here
    /// (no flag sets it).
    #[arg(skip)]
    pub oidc_client_secret: Option<secrecy::SecretString>,
    /// The claim that lists a person's groups: read from the ID token,
    /// else from the provider's userinfo.
    #[arg(long, env = "SAGA_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,
    /// Which groups give which role, e.g.
    /// `admin=platform,approver=support-leads,viewer=support`. A person
    /// gets the highest role any of their groups gives.
    #[arg(long, env = "SAGA_OIDC_ROLES", value_name = "ROLE=GROUP,…")]
    pub oidc_roles: Option<RoleMap>,
    /// The provider's name on the sign-in button ("Sign in with Okta");
    /// default: the issuer's host.
    #[arg(long, env = "SAGA_OIDC_NAME")]
    pub oidc_name: Option<String>,
    /// Seconds the provider has to answer each request (discovery, keys,
    /// token, userinfo) before the sign-in page says it did not.
    #[arg(long, env = "SAGA_OIDC_TIMEOUT_SECS", default_value_t = 10)]
    pub oidc_timeout_secs: u64,
    /// Whether the password form is offered and its endpoint answers.
    #[arg(
        long,
        env = "SAGA_LOCAL_ACCOUNTS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "true|false"
    )]
    pub local_accounts: bool,
    /// How long a dashboard session lasts after its sign-in, however
    /// active (e.g. `12h`, `30m`).
    #[arg(long, env = "SAGA_SESSION_MAX_AGE", default_value = "12h", value_parser = humantime::parse_duration)]
    pub session_max_age: std::time::Duration,
}

impl Default for SignIn {
    fn default() -> Self {
        SignIn {
            oidc_issuer: None,
            oidc_client_id: None,
            oidc_client_secret: None,
            oidc_groups_claim: "groups".into(),
            oidc_roles: None,
            oidc_name: None,
            oidc_timeout_secs: 10,
            local_accounts: true,
            session_max_age: std::time::Duration::from_secs(12 * 3600),
        }
    }
}

/// What the people who run the harness reach besides the public address.
#[derive(Clone, Debug, Args)]
pub struct Operations {
    /// Serve Prometheus metrics (`GET /metrics`) on this address, apart
    /// from the public one; off unless given.
    #[arg(long, env = "SAGA_METRICS_BIND")]
    pub metrics_bind: Option<SocketAddr>,
    /// On SIGTERM or Ctrl-C: seconds the calls in flight have to finish
    /// after new ones stop being taken; whatever is cut off resumes from the
    /// log at the next start.
    #[arg(long, env = "SAGA_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,
}

impl Default for Operations {
    fn default() -> Self {
        Operations {
            metrics_bind: None,
            shutdown_grace_secs: 10,
        }
    }
}

/// What protects the server from slow or hostile clients, and who may say
/// where a request came from.
#[derive(Clone, Debug, Args)]
pub struct Limits {
    /// Reverse proxies whose `X-Forwarded-For` names the client (comma-
    /// separated addresses). From anyone else the header is ignored and the
    /// connection's own address is the client's.
    #[arg(
        long = "trusted-proxy",
        env = "SAGA_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Connections served at once; further clients wait in the listen queue.
    #[arg(long, env = "SAGA_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// Connections one client address (an IPv6 client's /64) may hold at
    /// once; at most, and by default, a quarter of --max-connections.
    /// Trusted proxies are not limited.
    #[arg(long, env = "SAGA_MAX_CONNECTIONS_PER_CLIENT")]
    pub max_connections_per_client: Option<usize>,
    /// Seconds a new connection has to send its first request's headers,
    /// and a request has to send its whole body.
    #[arg(long, env = "SAGA_REQUEST_TIMEOUT_SECS", default_value_t = 10)]
    pub request_timeout_secs: u64,
    /// Seconds a connection with no request in progress is kept open.
    #[arg(long, env = "SAGA_IDLE_TIMEOUT_SECS", default_value_t = 30)]
    pub idle_timeout_secs: u64,
    /// The most bytes of a connector's answer that are read; a longer
    /// answer is cut, and the step keeps its beginning and says so.
    #[arg(long, env = "SAGA_MAX_ANSWER_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_answer_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            trusted_proxies: Vec::new(),
            max_connections: 10_000,
            max_connections_per_client: None,
            request_timeout_secs: 10,
            idle_timeout_secs: 30,
            max_answer_bytes: 4 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a support lead. The password is asked for without echo, or
    /// read from standard input with --password-stdin.
    Add {
        #[arg(long)]
        username: String,
        /// viewer, approver or admin
        #[arg(long, default_value = "viewer")]
        role: String,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Remove a support lead; their sessions end at their next request.
    Remove {
        #[arg(long)]
        username: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Change a support lead's role; it applies from their next request.
    Role {
        #[arg(long)]
        username: String,
        /// viewer, approver or admin
        #[arg(long)]
        role: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Put a support lead in a group, or take them out of one (a tool's
    /// `approvers` name groups); it applies from their next request.
    Group {
        /// add or remove
        #[arg(value_parser = ["add", "remove"])]
        change: String,
        username: String,
        group: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue a bearer token for an agent; it is printed once and stored hashed.
    Create {
        #[arg(long)]
        agent: String,
        #[arg(long)]
        label: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Revoke every token of an agent; its next call is refused.
    Revoke {
        #[arg(long)]
        agent: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

/// Which groups give which role: `admin=platform,approver=support-leads`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleMap(Vec<(crate::saga::class::Role, String)>);

impl std::str::FromStr for RoleMap {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut pairs = Vec::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((role, group)) = pair.split_once('=') else {
                return Err(format!("{pair:?} is not ROLE=GROUP"));
            };
            let role: crate::saga::class::Role = role.trim().parse().map_err(|e| format!("{e}"))?;
            let group = group.trim();
            if group.is_empty() {
                return Err(format!("{pair:?} names no group"));
            }
            pairs.push((role, group.to_owned()));
        }
        if pairs.is_empty() {
            return Err("no ROLE=GROUP pair: nobody could sign in".into());
        }
        Ok(RoleMap(pairs))
    }
}

impl RoleMap {
    /// The highest role any of `groups` gives, with the group that gave it.
    pub fn role_of(&self, groups: &[String]) -> Option<(crate::saga::class::Role, String)> {
        self.0
            .iter()
            .filter(|(_, group)| groups.iter().any(|g| g == group))
            .max_by_key(|(role, _)| *role)
            .cloned()
    }
}
