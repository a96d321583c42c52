//! Fresh databases for tests: a new SQLite file per test, and a new
//! PostgreSQL database per test when `SAGA_TEST_POSTGRES_URL` names a server
//! (the test command always sets it; without it PostgreSQL tests say they
//! were skipped).
#![allow(dead_code)]

use std::time::Duration;
use tempfile::TempDir;

pub struct TestDb {
    /// What the harness under test connects to.
    pub url: String,
    /// The database itself, for a test's own reads and set-up (the same as
    /// `url` unless a pooler stands between).
    pub direct_url: String,
    /// `url` is a transaction-pooling PgBouncer.
    pub pooler: bool,
    _dir: Option<TempDir>,
    postgres: Option<(String, String)>,
    bouncer: Option<std::process::Child>,
}

impl TestDb {
    /// How the harness under test must open `url`.
    pub fn settings(&self) -> saga_harness::store::StoreSettings {
        saga_harness::store::StoreSettings {
            pg_transaction_pooler: self.pooler,
            ..Default::default()
        }
    }

    /// The environment a harness process needs for `url`.
    pub fn env(&self) -> Vec<(String, String)> {
        if self.pooler {
            vec![("SAGA_PG_TRANSACTION_POOLER".into(), "true".into())]
        } else {
            Vec::new()
        }
    }
}

pub fn sqlite() -> TestDb {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("saga.db").display());
    TestDb {
        direct_url: url.clone(),
        url,
        pooler: false,
        _dir: Some(dir),
        postgres: None,
        bouncer: None,
    }
}

/// `None` when no server is configured on a developer's machine; under CI
/// (`CI` set) a missing configuration fails the test, and a configured but
/// unreachable server always does, so PostgreSQL is never skipped silently.
pub async fn postgres() -> Option<TestDb> {
    let Ok(admin_url) = std::env::var("SAGA_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but SAGA_TEST_POSTGRES_URL is not: the PostgreSQL tests cannot be skipped in CI"
        );
        return None;
    };
    let name = format!("saga_test_{}", uuid_simple());
    let mut admin = connect_admin(&admin_url).await;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .expect("CREATE DATABASE");
    let url = with_database(&admin_url, &name);
    Some(TestDb {
        direct_url: url.clone(),
        url,
        pooler: false,
        _dir: None,
        postgres: Some((admin_url, name)),
        bouncer: None,
    })
}

/// A fresh PostgreSQL database reached through a proxy the test can cut
/// (`CutProxy::down`), for the faults of a database that goes away.
pub async fn postgres_through_cut_proxy() -> Option<(TestDb, proxy::CutProxy)> {
    let mut db = postgres().await?;
    let server = ServerAddress::parse(&db.direct_url);
    let host = if server.host == "localhost" {
        "127.0.0.1".to_owned()
    } else {
        server.host.clone()
    };
    let upstream: std::net::SocketAddr = format!("{host}:{}", server.port)
        .parse()
        .expect("the server's address");
    let cut = proxy::CutProxy::start(upstream).await;
    let name = &db.postgres.as_ref().expect("a PostgreSQL database").1;
    db.url = format!(
        "postgres://{}:{}@{}/{name}",
        server.user, server.password, cut.addr
    );
    Some((db, cut))
}

/// A fresh PostgreSQL database behind its own PgBouncer in transaction
/// pooling mode (Debian's `pgbouncer`), as PostgreSQL is often run at
/// scale. `None` where `postgres()` is; under CI a missing PgBouncer fails.
pub async fn postgres_via_pgbouncer() -> Option<TestDb> {
    let mut db = postgres().await?;
    let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(binary) = binary else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but pgbouncer is not installed: the PgBouncer tests cannot be skipped in CI"
        );
        eprintln!("pgbouncer is not installed: skipping");
        return None;
    };
    let server = ServerAddress::parse(&db.direct_url);
    let dir = tempfile::tempdir().expect("a directory for PgBouncer");
    let port = process::free_port();
    let config = dir.path().join("pgbouncer.ini");
    std::fs::write(
        &config,
        format!(
            "[databases]\n* = host={host} port={server_port} user={user} password={password}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = any\npool_mode = transaction\nmax_client_conn = 2000\n\
             default_pool_size = 20\nignore_startup_parameters = extra_float_digits,options\n\
             logfile =\npidfile =\n",
            host = server.host,
            server_port = server.port,
            user = server.user,
            password = server.password,
        ),
    )
    .expect("the PgBouncer configuration");
    let mut command = std::process::Command::new(binary);
    // PgBouncer refuses to run as root; as root it is asked to switch.
    let as_root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false);
    if as_root {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
        command.args(["-u", "postgres"]);
    }
    let child = command
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("pgbouncer starts");
    db.bouncer = Some(child);
    db._dir = Some(dir);
    let name = &db.postgres.as_ref().expect("a PostgreSQL database").1;
    db.url = format!(
        "postgres://{}:{}@127.0.0.1:{port}/{name}",
        server.user, server.password
    );
    db.pooler = true;
    // Ready once a statement goes through it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        use sqlx::Connection;
        let options = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(&db.url)
            .unwrap()
            .statement_cache_capacity(0);
        if let Ok(mut conn) = sqlx::PgConnection::connect_with(&options).await {
            if sqlx::raw_sql("SELECT 1").execute(&mut conn).await.is_ok() {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "PgBouncer on port {port} did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(db)
}

/// The parts of a `postgres://USER:PASSWORD@HOST:PORT/DB` URL PgBouncer
/// needs to reach the server.
struct ServerAddress {
    user: String,
    password: String,
    host: String,
    port: u16,
}

impl ServerAddress {
    fn parse(url: &str) -> ServerAddress {
        let rest = url.split_once("://").expect("a URL").1;
        let (credentials, place) = rest.rsplit_once('@').expect("credentials in the URL");
        let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
        let authority = place.split('/').next().unwrap_or(place);
        let (host, port) = authority
            .rsplit_once(':')
            .map_or((authority, 5432), |(h, p)| (h, p.parse().expect("a port")));
        ServerAddress {
            user: user.to_owned(),
            password: password.to_owned(),
            host: host.to_owned(),
            port,
        }
    }
}

/// A name no other test's database has: the time, the process and a
/// counter of this process (two tests of one process can read the same
/// nanosecond).
fn uuid_simple() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static MADE: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}{:x}_{made:x}", std::process::id())
}

async fn connect_admin(url: &str) -> sqlx::PgConnection {
    use sqlx::Connection;
    // Tests run in parallel, each with its own pool: the server's
    // connection limit may be reached for a moment, so a refusal for that
    // reason (53300) is waited out, for at most ten seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let connected =
            tokio::time::timeout(Duration::from_secs(10), sqlx::PgConnection::connect(url))
                .await
                .unwrap_or_else(|_| {
                    panic!("SAGA_TEST_POSTGRES_URL is set but the server does not answer")
                });
        match connected {
            Ok(conn) => return conn,
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some("53300") && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("SAGA_TEST_POSTGRES_URL is set but unusable: {e}"),
        }
    }
}

fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(mut bouncer) = self.bouncer.take() {
            let _ = bouncer.kill();
            let _ = bouncer.wait();
        }
        if let Some((admin_url, name)) = self.postgres.take() {
            // Drop runs inside the test's runtime, which must not block
            // here: the store's background work (a lease being released)
            // may be half-way through opening a connection, and the server
            // holds DROP DATABASE until that connection finishes signing
            // in. A thread of its own drops the database once the test's
            // runtime has closed its sockets.
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(async {
                    let mut admin = connect_admin(&admin_url).await;
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                });
            });
        }
    }
}
/// Polls `check` until it gives a value, for at most 20 s: a test waits for
/// a condition, never for a guessed length of time.
pub async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub mod crash;
pub mod process;
pub mod proxy;
pub mod world;

/// Turns each named `async fn NAME(x)` into two tests, one on a fresh
/// SQLite file and one on a fresh PostgreSQL database, building `x` from
/// the opened store with the function `$make`.
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($make:ident; $($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let db = crate::common::sqlite();
                    let store = saga_harness::store::open(&db.url).await.unwrap().saga_store();
                    super::$name(super::$make(store)).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    let Some(db) = crate::common::postgres().await else {
                        eprintln!("skipped: SAGA_TEST_POSTGRES_URL is not set");
                        return;
                    };
                    let store = saga_harness::store::open(&db.url).await.unwrap().saga_store();
                    super::$name(super::$make(store)).await;
                }
            )+
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_backends;
