//! Storage: the [`SagaStore`](crate::saga::store::SagaStore) trait
//! implemented for SQLite (the default) and PostgreSQL, chosen by the
//! database URL's scheme.

pub mod group_commit;
pub mod pooled_sessions;
pub mod postgres;
pub(crate) mod sql;
pub mod sqlite;

use crate::saga::store::{SagaStore, StoreError, StoreResult};
use std::sync::Arc;

/// The default database: a file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://saga-harness.db";

/// How a store shares runs between harness instances (PostgreSQL only: a
/// SQLite file has one harness by design).
#[derive(Clone, Debug, clap::Args)]
pub struct StoreSettings {
    /// How long an instance owns a run it works on without renewing (it
    /// renews every third of this while it works). After a crash, another
    /// instance takes the run over once this has passed.
    #[arg(long = "run-lease-ms", env = "SAGA_RUN_LEASE_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(300..))]
    pub run_lease_ms: u64,
    /// How long a call waits for a run another instance is working on
    /// before answering that the run is busy (409 `run_busy`).
    #[arg(
        long = "run-wait-ms",
        env = "SAGA_RUN_WAIT_MS",
        default_value_t = 10_000
    )]
    pub run_wait_ms: u64,
    /// PostgreSQL: how long a request waits for a database connection
    /// before it is answered `503 store_unavailable` (nothing sent). While
    /// the database is down this is how long agents wait for that answer.
    #[arg(long = "store-wait-ms", env = "SAGA_STORE_WAIT_MS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub store_wait_ms: u64,
    /// The PostgreSQL URL points at a transaction-pooling PgBouncer: keep no
    /// prepared statement across transactions.
    #[arg(long = "pg-transaction-pooler", env = "SAGA_PG_TRANSACTION_POOLER")]
    pub pg_transaction_pooler: bool,
    /// This instance's name, stable across its restarts (letters, digits,
    /// `.`, `_`, `:` and `-`). Started again under the same name, an
    /// instance takes back at once the runs its previous life held,
    /// instead of waiting for their leases to run out. Two live instances
    /// must never share one. Default: the host name and the port served.
    #[arg(long = "instance-id", env = "SAGA_INSTANCE_ID", value_parser = instance_id)]
    pub instance_id: Option<String>,
}

pub(crate) fn instance_id(text: &str) -> Result<String, String> {
    let fits = !text.is_empty()
        && text.len() <= 100
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'));
    if fits {
        Ok(text.to_owned())
    } else {
        Err("1 to 100 of letters, digits, '.', '_', ':' and '-'".to_owned())
    }
}

/// This machine's host name, for the default instance name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .and_then(|name| instance_id(&name).ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            run_lease_ms: 15_000,
            run_wait_ms: 10_000,
            store_wait_ms: 2_000,
            pg_transaction_pooler: false,
            instance_id: None,
        }
    }
}

/// An opened store, plus the pool the session store should use.
#[derive(Clone)]
pub enum Opened {
    Sqlite(Arc<sqlite::SqliteStore>),
    Postgres(Arc<postgres::PostgresStore>),
}

impl Opened {
    pub fn saga_store(&self) -> Arc<dyn SagaStore> {
        match self {
            Opened::Sqlite(store) => store.clone(),
            Opened::Postgres(store) => store.clone(),
        }
    }

    /// Closes the store's connections now rather than when they idle out
    /// (the benchmark shares one PostgreSQL server's connection limit
    /// between several stores).
    pub async fn close(&self) {
        match self {
            Opened::Sqlite(store) => store.close().await,
            Opened::Postgres(store) => store.session_pool().close().await,
        }
    }
}

impl Opened {
    /// Whether the store can take calls now (`/readyz`): the database
    /// answers and its migrations are current. The reason when not.
    pub async fn readiness(&self) -> Result<(), String> {
        match self {
            Opened::Sqlite(store) => store.readiness().await,
            Opened::Postgres(store) => store.readiness().await,
        }
    }

    pub fn pool_use(&self) -> PoolUse {
        match self {
            Opened::Sqlite(store) => store.pool_use(),
            Opened::Postgres(store) => store.pool_use(),
        }
    }
}

/// A store's database connections: open, idle among them, and the most
/// it may open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolUse {
    pub open: u32,
    pub idle: u32,
    pub max: u32,
}

impl PoolUse {
    fn of<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> Self {
        let open = pool.size();
        // sqlx counts idle connections apart from open ones, and the count
        // can be read mid-update (seen: a value near usize::MAX, which
        // overflowed the sum below): idle is never more than open.
        let idle = u32::try_from(pool.num_idle()).unwrap_or(u32::MAX).min(open);
        PoolUse {
            open,
            idle,
            max: pool.options().get_max_connections(),
        }
    }
}

/// The newest migration a migrator carries.
fn newest_migration(migrator: &sqlx::migrate::Migrator) -> i64 {
    migrator.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Says what is wrong when the database's newest applied migration is not
/// the newest this build carries.
fn migrations_current(applied: Option<i64>, needed: i64) -> Result<(), String> {
    match applied {
        Some(version) if version == needed => Ok(()),
        Some(version) if version > needed => Err(format!(
            "the database is at migration {version}, newer than this build's {needed}: run the newer harness"
        )),
        applied => Err(format!(
            "the database is at migration {}, and this build needs {needed}: run `saga-harness migrate`",
            applied.map_or("none".to_owned(), |v| v.to_string())
        )),
    }
}

/// Opens the backend named by the URL's scheme and migrates it.
pub async fn open(url: &str) -> StoreResult<Opened> {
    open_with(url, &StoreSettings::default()).await
}

/// `open`, with the settings for sharing runs between instances.
pub async fn open_with(url: &str, settings: &StoreSettings) -> StoreResult<Opened> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Opened::Postgres(Arc::new(
            postgres::PostgresStore::open(url, settings).await?,
        )))
    } else if url.starts_with("sqlite:") {
        Ok(Opened::Sqlite(Arc::new(
            sqlite::SqliteStore::open(url).await?,
        )))
    } else {
        Err(StoreError::Invalid(format!(
            "unsupported database URL {:?}: use sqlite://FILE (the default is {DEFAULT_DATABASE_URL}) \
             or postgres://USER:PASSWORD@HOST/DATABASE",
            redact(url)
        )))
    }
}

/// The URL without any password it carries, for messages and logs: the
/// one after the user name and any `password` or `sslpassword` in the
/// query string. A URL that cannot be parsed shows only its scheme.
pub fn redact(url: &str) -> String {
    const SECRET_PARAMETERS: [&str; 3] = ["password", "sslpassword", "pass"];
    let Ok(mut parsed) = url::Url::parse(url) else {
        return match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://(a URL that cannot be read)"),
            None => "(a URL that cannot be read)".to_owned(),
        };
    };
    if parsed.password().is_some() {
        // Fails only for URLs that cannot have a password at all.
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(name, value)| {
                let secret = SECRET_PARAMETERS
                    .iter()
                    .any(|s| name.eq_ignore_ascii_case(s));
                let value = if secret {
                    "***".to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_the_query_string_never_reach_messages() {
        let shown = redact("postgres://saga@db/x?sslmode=require&password=hunter2&PassWord=x2");
        assert!(
            !shown.contains("hunter2") && !shown.contains("x2"),
            "{shown}"
        );
        assert!(shown.contains("sslmode=require"), "{shown}");
        let shown = redact("postgres://saga:hunter2@db/x?sslpassword=keypass");
        assert_eq!(shown, "postgres://saga:***@db/x?sslpassword=***");
        assert!(!redact("postgres://saga:hunter2@[bad").contains("hunter2"));
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://saga:hunter2@db:5432/x"),
            "postgres://saga:***@db:5432/x"
        );
        assert_eq!(
            redact("sqlite://saga-harness.db"),
            "sqlite://saga-harness.db"
        );
    }

    #[tokio::test]
    async fn an_unknown_scheme_is_refused_with_the_accepted_forms() {
        let Err(err) = open("mysql://u:secret@h/db").await else {
            panic!("mysql accepted")
        };
        let message = err.to_string();
        assert!(message.contains("sqlite://FILE"), "{message}");
        assert!(!message.contains("secret"), "{message}");
    }
}
