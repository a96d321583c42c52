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
    bouncer: Option<cluster::Bouncer>,
}

impl TestDb {
    /// How the harness under test must open `url`.
    pub fn settings(&self) -> saga_harness::store::StoreSettings {
        saga_harness::store::StoreSettings {
            pg_transaction_pooler: self.pooler,
            ..Default::default()
        }
    }

    /// The PgBouncer in front, for a test that kills or restarts it.
    pub fn bouncer_mut(&mut self) -> &mut cluster::Bouncer {
        self.bouncer.as_mut().expect("a database behind PgBouncer")
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

/// A fresh PostgreSQL database, or the test returns at once saying it was
/// skipped. (Never in CI: `postgres` fails the test there instead.)
macro_rules! postgres_or_skip {
    () => {
        match crate::common::postgres().await {
            Some(db) => db,
            None => {
                eprintln!("skipped: SAGA_TEST_POSTGRES_URL is not set");
                return;
            }
        }
    };
}
pub(crate) use postgres_or_skip;

/// A fresh PostgreSQL database reached through a proxy the test can cut
/// (`CutProxy::down`), for the faults of a database that goes away.
pub async fn postgres_through_cut_proxy() -> Option<(TestDb, proxy::CutProxy)> {
    let mut db = postgres().await?;
    let server = upstream_of(&db.direct_url);
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
    let server = upstream_of(&db.direct_url);
    let bouncer = cluster::Bouncer::start(&server).await?;
    let name = &db.postgres.as_ref().expect("a PostgreSQL database").1;
    bouncer
        .wait_ready(name, &server.user, &server.password)
        .await;
    db.url = format!(
        "postgres://{}:{}@127.0.0.1:{}/{name}",
        server.user, server.password, bouncer.port
    );
    db.pooler = true;
    db.bouncer = Some(bouncer);
    Some(db)
}

/// The server a `postgres://USER:PASSWORD@HOST:PORT/DB` URL names, as
/// PgBouncer needs it.
pub fn upstream_of(url: &str) -> cluster::Upstream {
    let rest = url.split_once("://").expect("a URL").1;
    let (credentials, place) = rest.rsplit_once('@').expect("credentials in the URL");
    let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
    let authority = place.split('/').next().unwrap_or(place);
    let (host, port) = authority
        .rsplit_once(':')
        .map_or((authority, 5432), |(h, p)| (h, p.parse().expect("a port")));
    cluster::Upstream {
        user: user.to_owned(),
        password: password.to_owned(),
        host: host.to_owned(),
        port,
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
        drop(self.bouncer.take());
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

pub mod app;
pub mod cluster;
pub mod crash;
pub mod identity;
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
                    let db = crate::common::postgres_or_skip!();
                    let store = saga_harness::store::open(&db.url).await.unwrap().saga_store();
                    super::$name(super::$make(store)).await;
                }
            )+
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_backends;

/// The words a person reads on a page: the text between its tags, with
/// the markup, scripts and styles gone and runs of white space folded.
pub fn visible_text(html: &str) -> String {
    let mut text = String::with_capacity(html.len() / 2);
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        text.push_str(&rest[..open]);
        text.push(' ');
        let tag = &rest[open..];
        let skip_to = ["<script", "<style"]
            .iter()
            .find(|name| tag.starts_with(**name))
            .and_then(|name| tag.find(&format!("</{}>", &name[1..])));
        let end = match skip_to {
            Some(close) => close + tag[close..].find('>').unwrap_or(0),
            None => tag.find('>').unwrap_or(tag.len() - 1),
        };
        rest = &tag[end + 1..];
    }
    text.push_str(rest);
    let text = text
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&#39;", "'");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// One row of the table of faults outside the process (docs/operations.md), written
/// as a JSON line to the file `SAGA_FAULT_REPORT` names (scripts/faults.sh
/// sets it and gathers the lines into benches/results/faults.json). The
/// figures in `result` are the ones the test measured.
pub fn report_fault(fault: &str, done: &str, checked: &str, result: &str, knob: &str) {
    use std::io::Write as _;
    let Some(path) = std::env::var_os("SAGA_FAULT_REPORT") else {
        return;
    };
    let row = serde_json::json!({
        "fault": fault, "done": done, "checked": checked, "result": result, "knob": knob,
    });
    println!("fault report: {row}");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("the fault report opens");
    // One write per line: appends from tests running at once stay whole.
    file.write_all(format!("{row}\n").as_bytes())
        .expect("the fault report is written");
}
