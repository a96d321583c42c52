//! PostgreSQL servers and PgBouncers of a test's own, for the faults that
//! need a whole server: stopped in immediate mode and started again, a
//! synchronous standby promoted in its place, a pooler killed and started
//! again or pointed at another server. Each runs from a directory of the
//! test and is stopped when dropped; nothing else on the machine is
//! touched.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::free_port;

/// Whether this process runs as root: PostgreSQL and PgBouncer refuse to,
/// so they are run as the `postgres` user instead.
fn as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// Where this machine's PostgreSQL server programs are (`initdb`, `pg_ctl`):
/// `SAGA_TEST_PG_BIN`, else the newest under /usr/lib/postgresql.
fn server_programs() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SAGA_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("pg_ctl").exists())
        .collect();
    versions.sort();
    versions.pop()
}

/// `None` on a machine without the programs; under CI that fails instead.
fn required<T>(what: &str, found: Option<T>) -> Option<T> {
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but {what} is not installed: the fault tests that need it cannot be skipped in CI"
        );
        eprintln!("{what} is not installed: skipping");
    }
    found
}

/// A directory the `postgres` user may write when the test runs as root.
fn own_directory() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a directory");
    if as_root() {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    dir
}

/// Runs a server program, as `postgres` when this process is root.
fn run_as_server_user(program: &Path, args: &[&str]) -> std::process::Output {
    let mut command = if as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()))
}

fn must(output: std::process::Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// One PostgreSQL server of the test's own on a free port, trusting local
/// connections, with one database (`saga`).
pub struct Server {
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
}

impl Server {
    /// A server's directory and port, nothing in them yet.
    fn unstarted(bin: PathBuf) -> Server {
        Server {
            bin,
            dir: own_directory(),
            port: free_port(),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A new primary, started. `None` where the machine has no PostgreSQL
    /// server programs (and not under CI).
    pub fn primary() -> Option<Server> {
        let bin = required("PostgreSQL's server programs", server_programs())?;
        let server = Server::unstarted(bin);
        let data = server.data();
        must(
            run_as_server_user(
                &server.bin.join("initdb"),
                &[
                    "-D",
                    data.to_str().unwrap(),
                    "--auth=trust",
                    "--username=postgres",
                    "--no-sync",
                    "--encoding=UTF8",
                ],
            ),
            "initdb",
        );
        server.configure(&[
            // Its standbys wait for it: a commit returns once one of them
            // has the WAL on disk.
            "max_wal_senders = 4",
            "wal_level = replica",
            "wal_keep_size = '64MB'",
        ]);
        server.start();
        server.create_database("saga");
        Some(server)
    }

    /// A streaming standby of this server, started, and made synchronous:
    /// from now on a commit on this server returns only once the standby
    /// has its WAL.
    pub fn synchronous_standby(&self) -> Server {
        let standby = Server::unstarted(self.bin.clone());
        let data = standby.data();
        must(
            run_as_server_user(
                &self.bin.join("pg_basebackup"),
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                    "-D",
                    data.to_str().unwrap(),
                    "-R",
                    "-X",
                    "stream",
                    "--no-sync",
                ],
            ),
            "pg_basebackup",
        );
        standby.configure(&[&format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name=standby'",
            self.port
        )]);
        standby.start();
        self.configure(&[
            "synchronous_standby_names = 'standby'",
            "synchronous_commit = on",
        ]);
        must(self.pg_ctl(&["reload"]), "pg_ctl reload");
        // Synchronous once the primary says so.
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.sql("SELECT sync_state FROM pg_stat_replication") != "sync" {
            assert!(
                Instant::now() < deadline,
                "the standby never became synchronous"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        standby
    }

    /// Appends settings to its configuration (applied at the next start or
    /// reload).
    fn configure(&self, lines: &[&str]) {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.auto.conf"))
            .expect("postgresql.auto.conf");
        for line in lines {
            writeln!(file, "{line}").unwrap();
        }
    }

    fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        let data = self.data();
        let mut all = vec!["-D", data.to_str().unwrap()];
        all.extend_from_slice(args);
        run_as_server_user(&self.bin.join("pg_ctl"), &all)
    }

    /// Starts it and waits until it takes connections.
    pub fn start(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' \
             -c max_connections=200 -c shared_buffers=32MB",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        must(
            self.pg_ctl(&["-o", &options, "-l", log.to_str().unwrap(), "-w", "start"]),
            "pg_ctl start",
        );
    }

    /// Stops it as a crash would: no checkpoint, every connection dropped,
    /// recovery from the WAL at the next start.
    pub fn stop_immediately(&self) {
        must(
            self.pg_ctl(&["-m", "immediate", "-w", "stop"]),
            "pg_ctl stop",
        );
    }

    /// Makes a standby the primary and waits until it takes writes.
    pub fn promote(&self) {
        must(self.pg_ctl(&["-w", "promote"]), "pg_ctl promote");
    }

    /// One value from `psql` against database `postgres`.
    pub fn sql(&self, query: &str) -> String {
        let out = run_as_server_user(
            &self.bin.join("psql"),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-XAtc",
                query,
            ],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn create_database(&self, name: &str) {
        let out = run_as_server_user(
            &self.bin.join("createdb"),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                name,
            ],
        );
        must(out, "createdb");
    }

    /// The URL of database `saga` on it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/saga", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "stop"]);
    }
}

/// A PostgreSQL server PgBouncer forwards to.
#[derive(Clone, Debug)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
}

/// A transaction-pooling PgBouncer (Debian's `pgbouncer`) of the test's own.
pub struct Bouncer {
    binary: &'static str,
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
}

impl Bouncer {
    /// Started in front of `upstream`. `None` where PgBouncer is not
    /// installed (and not under CI).
    pub async fn start(upstream: &Upstream) -> Option<Bouncer> {
        let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| Path::new(p).exists());
        let binary = required("pgbouncer", binary)?;
        let mut bouncer = Bouncer {
            binary,
            dir: own_directory(),
            port: free_port(),
            child: None,
        };
        bouncer.write_config(upstream);
        bouncer.spawn();
        bouncer
            .wait_ready("postgres", &upstream.user, &upstream.password)
            .await;
        Some(bouncer)
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.ini")
    }

    fn write_config(&self, upstream: &Upstream) {
        let Upstream {
            host,
            port,
            user,
            password,
        } = upstream;
        let password = if password.is_empty() {
            String::new()
        } else {
            format!(" password={password}")
        };
        std::fs::write(
            self.config(),
            format!(
                "[databases]\n* = host={host} port={port} user={user}{password}\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {}\nunix_socket_dir =\n\
                 auth_type = any\npool_mode = transaction\nmax_client_conn = 2000\n\
                 default_pool_size = 20\nignore_startup_parameters = extra_float_digits,options\n\
                 server_login_retry = 1\n\
                 logfile =\npidfile =\n",
                self.port
            ),
        )
        .expect("the PgBouncer configuration");
        if as_root() {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(self.config(), std::fs::Permissions::from_mode(0o644))
                .unwrap();
        }
    }

    fn spawn(&mut self) {
        let mut command = Command::new(self.binary);
        if as_root() {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(self.config())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer starts");
        self.child = Some(child);
    }

    /// Ready once a statement goes through it to `database`.
    pub async fn wait_ready(&self, database: &str, user: &str, password: &str) {
        use sqlx::Connection as _;
        let url = format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{database}",
            self.port
        );
        let options = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(&url)
            .unwrap()
            .statement_cache_capacity(0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut conn) = sqlx::PgConnection::connect_with(&options).await {
                if sqlx::raw_sql("SELECT 1").execute(&mut conn).await.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "PgBouncer on port {} does not pass statements on",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills it (SIGKILL): every client and server connection drops.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, as a supervisor would.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Points it at another server and has it reload its configuration
    /// (SIGHUP), as an operator does after a failover: clients stay
    /// connected to it.
    pub fn point_at(&mut self, upstream: &Upstream) {
        self.write_config(upstream);
        let pid = self.child.as_ref().expect("a running PgBouncer").id();
        let status = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "PgBouncer did not take SIGHUP");
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        self.kill();
    }
}
