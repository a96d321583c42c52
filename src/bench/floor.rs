//! The floor: what the disk and the database charge for durability with no
//! harness logic at all. One durable commit, and the two-commit pair a
//! step needs at the least (insert a saga_log-shaped row, commit, update
//! its status, commit), at the store's durability settings: SQLite in WAL
//! with `synchronous = FULL` through one writer connection (as the store
//! writes), PostgreSQL with its default `fsync` and `synchronous_commit`.
//!
//! Beside them, the same single commit with durability relaxed (SQLite
//! `synchronous = NORMAL`, PostgreSQL `synchronous_commit = off`): safe
//! against a process crash but not against power loss. The difference is
//! what keeping R2 true across power loss costs.

use super::stats::{percentile, Better, Figures};
use super::{Sizes, Target};
use anyhow::Context;
use futures::future::try_join_all;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, PgPool, SqlitePool};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS floor_log (
    run_id TEXT NOT NULL, step_idx INTEGER NOT NULL, tool TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE, args TEXT NOT NULL, status TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (run_id, step_idx))";
const POSTGRES_TABLE: &str = "CREATE TABLE IF NOT EXISTS floor_log (
    run_id TEXT NOT NULL, step_idx BIGINT NOT NULL, tool TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE, args JSONB NOT NULL, status TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (run_id, step_idx))";

#[derive(Clone)]
enum Db {
    /// One writer connection, as the store has.
    Sqlite(SqlitePool),
    /// Connected per measurement, one connection per writer, and closed
    /// after it, so the floor holds no connections while the rest runs.
    Postgres(String),
}

/// What one measured operation writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// One durable commit.
    Commit,
    /// Insert then update, two durable commits.
    Pair,
    /// One commit with durability relaxed (crash-safe, not power-safe).
    RelaxedCommit,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Commit => "commit",
            Shape::Pair => "pair",
            Shape::RelaxedCommit => "relaxed_commit",
        }
    }
}

#[derive(Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

#[derive(Clone)]
pub struct Floor {
    db: Db,
    /// Makes every row's key unique across rounds.
    next: Arc<std::sync::atomic::AtomicU64>,
}

impl Floor {
    pub async fn open(target: &Target, url: &str) -> anyhow::Result<Floor> {
        let db = match target {
            Target::Sqlite { .. } => {
                let options = SqliteConnectOptions::from_str(url)?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full);
                let pool = SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await
                    .context("opening the SQLite floor file")?;
                sqlx::query(SQLITE_TABLE).execute(&pool).await?;
                Db::Sqlite(pool)
            }
            Target::Postgres { .. } => {
                let mut conn = sqlx::PgConnection::connect(url)
                    .await
                    .context("connecting to the PostgreSQL floor database")?;
                sqlx::query(POSTGRES_TABLE).execute(&mut conn).await?;
                conn.close().await?;
                Db::Postgres(url.to_owned())
            }
        };
        Ok(Floor {
            db,
            next: Arc::default(),
        })
    }

    /// One round of every floor figure, at 1, 8 and 64 writers.
    pub async fn round(
        &self,
        prefix: &str,
        sizes: &Sizes,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let shapes = [
            (Shape::Commit, &[1usize, 8, 64][..]),
            (Shape::Pair, &[1, 8, 64][..]),
            (Shape::RelaxedCommit, &[1, 8][..]),
        ];
        for (shape, concurrency) in shapes {
            for &writers in concurrency {
                let total = sizes.ops(writers);
                let (latencies, per_s) = self.measure(shape, writers, total).await?;
                let key = format!("{prefix}.floor.{}.c{writers}", shape.name());
                if writers == 1 {
                    figures.record(
                        &format!("{key}.p50_ms"),
                        "ms",
                        Better::Lower,
                        percentile(&latencies, 50.0),
                    );
                    figures.record(
                        &format!("{key}.p99_ms"),
                        "ms",
                        Better::Lower,
                        percentile(&latencies, 99.0),
                    );
                }
                figures.record(&format!("{key}.per_s"), "/s", Better::Higher, per_s);
            }
        }
        Ok(())
    }

    /// `total` operations spread over `writers` concurrent writers: each
    /// operation's latency (ms), and operations per second overall.
    async fn measure(
        &self,
        shape: Shape,
        writers: usize,
        total: usize,
    ) -> anyhow::Result<(Vec<f64>, f64)> {
        let each = total.div_ceil(writers);
        let pool = match &self.db {
            Db::Sqlite(pool) => Pool::Sqlite(pool.clone()),
            Db::Postgres(url) => {
                let pool = PgPoolOptions::new()
                    .max_connections(writers as u32)
                    .min_connections(writers as u32)
                    .connect(url)
                    .await?;
                // Every writer's connection is open before the clock starts.
                let mut warm = try_join_all((0..writers).map(|_| pool.acquire())).await?;
                if shape == Shape::RelaxedCommit {
                    for conn in &mut warm {
                        sqlx::query("SET synchronous_commit = off")
                            .execute(&mut **conn)
                            .await?;
                    }
                }
                drop(warm);
                Pool::Postgres(pool)
            }
        };
        if let Pool::Sqlite(pool) = &pool {
            set_sqlite_synchronous(pool, shape).await?;
        }
        let started = Instant::now();
        let tasks = (0..writers).map(|_| {
            let floor = self.clone();
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(each);
                for _ in 0..each {
                    let at = Instant::now();
                    floor.one(&pool, shape == Shape::Pair).await?;
                    latencies.push(at.elapsed().as_secs_f64() * 1e3);
                }
                anyhow::Ok(latencies)
            })
        });
        let mut latencies = Vec::with_capacity(each * writers);
        for done in try_join_all(tasks).await? {
            latencies.extend(done?);
        }
        let per_s = latencies.len() as f64 / started.elapsed().as_secs_f64();
        match pool {
            Pool::Postgres(pool) => pool.close().await,
            Pool::Sqlite(pool) => set_sqlite_synchronous(&pool, Shape::Commit).await?,
        }
        Ok((latencies, per_s))
    }

    async fn one(&self, pool: &Pool, pair: bool) -> anyhow::Result<()> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as i64;
        let run_id = format!("floor-{}", n / 100);
        let key = format!("{n:032x}");
        let now = chrono::Utc::now();
        let insert = "INSERT INTO floor_log (run_id, step_idx, tool, idempotency_key, args, status, created_at, updated_at)
                      VALUES ($1, $2, 'reship', $3, $4, 'INTENDED', $5, $5)";
        let update = "UPDATE floor_log SET status = 'CONFIRMED', updated_at = $1 WHERE run_id = $2 AND step_idx = $3";
        let args = sqlx::types::Json(serde_json::json!({"order_id": n, "items": ["sku-1"]}));
        match pool {
            Pool::Sqlite(pool) => {
                sqlx::query(insert)
                    .bind(&run_id)
                    .bind(n)
                    .bind(&key)
                    .bind(&args)
                    .bind(now)
                    .execute(pool)
                    .await?;
                if pair {
                    sqlx::query(update)
                        .bind(now)
                        .bind(&run_id)
                        .bind(n)
                        .execute(pool)
                        .await?;
                }
            }
            Pool::Postgres(pool) => {
                // One connection for both commits, as a writer has.
                let mut conn = pool.acquire().await?;
                sqlx::query(insert)
                    .bind(&run_id)
                    .bind(n)
                    .bind(&key)
                    .bind(&args)
                    .bind(now)
                    .execute(&mut *conn)
                    .await?;
                if pair {
                    sqlx::query(update)
                        .bind(now)
                        .bind(&run_id)
                        .bind(n)
                        .execute(&mut *conn)
                        .await?;
                }
            }
        }
        Ok(())
    }

    pub async fn close(self) {
        if let Db::Sqlite(pool) = self.db {
            pool.close().await;
        }
    }
}

/// The one writer connection's `synchronous` setting for `shape`.
async fn set_sqlite_synchronous(pool: &SqlitePool, shape: Shape) -> anyhow::Result<()> {
    let pragma = if shape == Shape::RelaxedCommit {
        "PRAGMA synchronous = NORMAL"
    } else {
        "PRAGMA synchronous = FULL"
    };
    sqlx::query(pragma).execute(pool).await?;
    Ok(())
}
