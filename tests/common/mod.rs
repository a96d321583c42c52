//! Fresh databases for tests: a new SQLite file per test, and a new
//! PostgreSQL database per test when `SAGA_TEST_POSTGRES_URL` names a server
//! (the test command always sets it; without it PostgreSQL tests say they
//! were skipped).
#![allow(dead_code)]

use std::time::Duration;
use tempfile::TempDir;

pub struct TestDb {
    pub url: String,
    _dir: Option<TempDir>,
    postgres: Option<(String, String)>,
}

pub fn sqlite() -> TestDb {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("saga.db").display());
    TestDb {
        url,
        _dir: Some(dir),
        postgres: None,
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
        url,
        _dir: None,
        postgres: Some((admin_url, name)),
    })
}

fn uuid_simple() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{nanos:x}{:x}", std::process::id())
}

async fn connect_admin(url: &str) -> sqlx::PgConnection {
    use sqlx::Connection;
    tokio::time::timeout(Duration::from_secs(10), sqlx::PgConnection::connect(url))
        .await
        .unwrap_or_else(|_| panic!("SAGA_TEST_POSTGRES_URL is set but the server does not answer"))
        .unwrap_or_else(|e| panic!("SAGA_TEST_POSTGRES_URL is set but unusable: {e}"))
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
        if let Some((admin_url, name)) = self.postgres.take() {
            // Drop runs outside any runtime's async context: use a thread
            // with its own small runtime.
            let _ = std::thread::spawn(move || {
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
            })
            .join();
        }
    }
}
pub mod crash;
pub mod process;
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
