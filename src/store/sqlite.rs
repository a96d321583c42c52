//! The embedded default: one SQLite file in WAL mode, used by one harness
//! process at a time.
//!
//! Writes go through a single connection (SQLite has one writer anyway, and
//! queuing in the pool is cheaper than `SQLITE_BUSY` retries); reads use a
//! pool of read-only connections that WAL lets run beside the writer.
//! INTENDED rows commit with `synchronous = FULL` (durable on power loss);
//! lazy outcome commits use `NORMAL` (DESIGN.md §9).

use crate::saga::model::Durability;
use crate::store::sql::saga_store_sql;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub struct SqliteStore {
    writer: SqlitePool,
    readers: SqlitePool,
    /// Whether the writer was last set to `synchronous = NORMAL`.
    synchronous_is_normal: AtomicBool,
    /// Held for the life of the store: a second harness on the same file is
    /// refused at start-up instead of corrupting the single-writer design.
    _lock: File,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url`, takes the
    /// one-process lock and applies the migrations.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad SQLite URL {url:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let path = options.get_filename().to_path_buf();
        if path.as_os_str() == ":memory:" || path.as_os_str().is_empty() {
            return Err(StoreError::Invalid(
                "an in-memory SQLite database would lose the saga log on exit; give a file, e.g. sqlite://saga-harness.db".into(),
            ));
        }
        let lock = take_process_lock(&path)?;
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .map_err(|e| StoreError::Database(format!("cannot open {}: {e}", path.display())))?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&writer)
            .await
            .map_err(|e| StoreError::Database(format!("migrating {}: {e}", path.display())))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options.read_only(true))
            .await
            .map_err(|e| StoreError::Database(format!("cannot open {}: {e}", path.display())))?;
        Ok(SqliteStore {
            writer,
            readers,
            synchronous_is_normal: AtomicBool::new(false),
            _lock: lock,
        })
    }

    /// The writer pool, shared with the session store so that sign-ins do
    /// not contend with the saga log for the write lock.
    pub fn session_pool(&self) -> SqlitePool {
        self.writer.clone()
    }

    pub async fn close(&self) {
        self.readers.close().await;
        self.writer.close().await;
    }

    fn reader(&self) -> &SqlitePool {
        &self.readers
    }

    /// The writer connection, set to the durability this commit needs.
    /// SQLite refuses to change it inside a transaction, so it is set here.
    /// The writer, set to `durability`. The pragma is sent only when the
    /// setting changes: `synchronous_is_normal` is set after the pragma ran,
    /// so when it is wrong (the pool opened a fresh connection, which starts
    /// at FULL) the connection is at FULL, the safe side.
    async fn write(&self, durability: Durability) -> StoreResult<PoolConnection<Sqlite>> {
        let mut conn = self.writer.acquire().await.map_err(db)?;
        let want_normal = durability == Durability::Lazy;
        if self.synchronous_is_normal.load(Ordering::Acquire) != want_normal {
            let pragma = if want_normal {
                "PRAGMA synchronous = NORMAL"
            } else {
                "PRAGMA synchronous = FULL"
            };
            sqlx::query(pragma).execute(&mut *conn).await.map_err(db)?;
            self.synchronous_is_normal
                .store(want_normal, Ordering::Release);
        }
        Ok(conn)
    }

    async fn lazy_commit(_tx: &mut SqliteConnection, _durability: Durability) -> StoreResult<()> {
        Ok(())
    }

    /// One transaction on the single writer: SQLite has no statement that
    /// inserts and updates two tables at once, and its round trips are calls
    /// into the same process.
    async fn record_step_alone(&self, new: NewStep, actor: &Actor) -> StoreResult<Step> {
        let mut conn = self.write(Durability::Durable).await?;
        let mut tx = conn.begin().await.map_err(db)?;
        let step = insert_step(&mut tx, new, actor).await?;
        tx.commit().await.map_err(db)?;
        Ok(step)
    }

    async fn settle_step_alone(
        &self,
        run_id: uuid::Uuid,
        step_idx: i64,
        outcome: Outcome,
        durability: Durability,
        actor: &Actor,
    ) -> StoreResult<Step> {
        let mut conn = self.write(durability).await?;
        let mut tx = conn.begin().await.map_err(db)?;
        let step = settle_step_in(&mut tx, run_id, step_idx, outcome, actor).await?;
        tx.commit().await.map_err(db)?;
        Ok(step)
    }
}

pub struct NoClaim;
impl crate::saga::store::RunClaim for NoClaim {}

impl SqliteStore {
    async fn claim(
        &self,
        _run_id: uuid::Uuid,
    ) -> StoreResult<Box<dyn crate::saga::store::RunClaim>> {
        Ok(Box::new(NoClaim))
    }

    async fn claim_and_read_here(
        &self,
        run_id: uuid::Uuid,
    ) -> StoreResult<crate::saga::store::ClaimedRun> {
        Ok(crate::saga::store::ClaimedRun {
            claim: self.claim(run_id).await?,
            run: self.run(run_id).await?,
            unsettled: self.unsettled_steps(run_id).await?,
        })
    }
}

fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

fn take_process_lock(db: &Path) -> StoreResult<File> {
    let path = lock_path(db);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            StoreError::Database(format!("cannot create lock file {}: {e}", path.display()))
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(StoreError::Invalid(format!(
            "{} is in use by another saga-harness process. A SQLite saga log has one harness at a time: \
             stop the other process, or point every instance at PostgreSQL (DATABASE_URL=postgres://...)",
            db.display()
        ))),
        Err(TryLockError::Error(e)) => Err(StoreError::Database(format!(
            "cannot lock {}: {e}",
            path.display()
        ))),
    }
}

saga_store_sql!(SqliteStore, Sqlite, Backend::Sqlite, for_update = "");
