//! Peer engines measured in the same run: DBOS Transact (Python, on the same
//! PostgreSQL) and Restate (its server binary from npm, a Node service).
//! Each runs as a child process from benches/peers that sets itself up,
//! prints one JSON line when ready, then one JSON line of figures for each
//! `round` line it reads, so its rounds interleave with ours. A peer that
//! cannot be installed or started is reported as such, never a failure.

use super::stats::{Better, Figures};
use crate::config::BenchArgs;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Sequential steps in one workflow, and steps per workflow when 8 run at once.
const SEQUENTIAL_STEPS: usize = 1000;
const CONCURRENT_STEPS: usize = 250;
const PEER_TIMEOUT: Duration = Duration::from_secs(600);

struct Peer {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// A database created for the peer, dropped at the end.
    database: Option<(String, String)>,
}

#[derive(Default)]
pub struct Peers {
    running: Vec<Peer>,
}

fn peers_home(args: &BenchArgs) -> PathBuf {
    args.peers_home.clone().unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        cache.join("saga-harness").join("peers")
    })
}

impl Peers {
    pub async fn start(args: &BenchArgs, figures: &mut Figures) -> Peers {
        let mut peers = Peers::default();
        if !args.peers {
            figures.note(
                "peers",
                "not measured: pass --peers (full mode) to run DBOS and Restate",
            );
            return peers;
        }
        if args.quick {
            figures.note("peers", "not measured: peers run in full mode only");
            return peers;
        }
        let home = peers_home(args);
        for name in ["dbos", "restate"] {
            match start_one(name, args, &home).await {
                Ok(peer) => peers.running.push(peer),
                Err(why) => {
                    eprintln!("bench: {name} not measured: {why}");
                    figures.note(name, format!("not measured: {why}"));
                }
            }
        }
        peers
    }

    pub async fn round(&mut self, figures: &mut Figures) {
        let mut failed = Vec::new();
        for (i, peer) in self.running.iter_mut().enumerate() {
            match peer.ask("round").await {
                Ok(answer) => {
                    for (key, unit, better) in [
                        ("c1.p50_ms", "ms", Better::Lower),
                        ("c1.p99_ms", "ms", Better::Lower),
                        ("c1.mean_ms", "ms", Better::Lower),
                        ("c1.per_s", "/s", Better::Higher),
                        ("c8.per_s", "/s", Better::Higher),
                    ] {
                        if let Some(value) = answer[key].as_f64() {
                            figures.record(&format!("{}.{key}", peer.name), unit, better, value);
                        }
                    }
                }
                Err(why) => {
                    eprintln!("bench: {} failed: {why}", peer.name);
                    figures.note(peer.name, format!("stopped measuring: {why}"));
                    failed.push(i);
                }
            }
        }
        for i in failed.into_iter().rev() {
            let peer = self.running.remove(i);
            peer.stop().await;
        }
    }

    pub async fn stop(self) {
        for peer in self.running {
            peer.stop().await;
        }
    }
}

async fn start_one(
    name: &'static str,
    args: &BenchArgs,
    home: &std::path::Path,
) -> Result<Peer, String> {
    let mut database = None;
    let mut command = match name {
        "dbos" => {
            let python = home.join("dbos-venv").join("bin").join("python");
            if !python.exists() {
                return Err(format!(
                    "no DBOS install at {} (scripts/bench.sh makes it)",
                    python.display()
                ));
            }
            let Some(admin) = args.postgres_url.clone() else {
                return Err("DBOS needs PostgreSQL: pass --postgres-url".into());
            };
            let db = format!("saga_bench_{}_dbos", std::process::id());
            create_database(&admin, &db).await?;
            let url = super::with_database(&admin, &db);
            database = Some((admin, db));
            let mut command = Command::new(python);
            command
                .arg(args.peers_scripts.join("dbos_bench.py"))
                .env("DBOS_BENCH_DATABASE_URL", url);
            command
        }
        _ => {
            let modules = home.join("restate").join("node_modules");
            if !modules.join("@restatedev").join("restate-sdk").exists() {
                return Err(format!(
                    "no Restate install under {} (scripts/bench.sh makes it)",
                    modules.display()
                ));
            }
            let mut command = Command::new("node");
            command
                .arg(args.peers_scripts.join("restate_bench.cjs"))
                .env("RESTATE_BENCH_MODULES", modules)
                .env(
                    "RESTATE_BENCH_DATA",
                    std::env::temp_dir().join(format!("saga-bench-restate-{}", std::process::id())),
                );
            command
        }
    };
    command
        .env("BENCH_SEQUENTIAL_STEPS", SEQUENTIAL_STEPS.to_string())
        .env("BENCH_CONCURRENT_STEPS", CONCURRENT_STEPS.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("its pipes were not set up".into());
    };
    let mut peer = Peer {
        name,
        child,
        stdin,
        lines: BufReader::new(stdout).lines(),
        database,
    };
    match peer.read().await {
        Ok(_) => Ok(peer),
        Err(why) => {
            peer.stop().await;
            Err(why)
        }
    }
}

async fn create_database(admin: &str, db: &str) -> Result<(), String> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .map_err(|e| format!("PostgreSQL: {e}"))?;
    for sql in [
        format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
        format!("CREATE DATABASE {db}"),
    ] {
        sqlx::query(&sql)
            .execute(&mut conn)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    let _ = conn.close().await;
    Ok(())
}

impl Peer {
    async fn ask(&mut self, line: &str) -> Result<Value, String> {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| format!("writing to it: {e}"))?;
        self.stdin.flush().await.map_err(|e| e.to_string())?;
        self.read().await
    }

    /// The next JSON line; `{"error": …}` is a failure with its reason.
    async fn read(&mut self) -> Result<Value, String> {
        let line = loop {
            let line = tokio::time::timeout(PEER_TIMEOUT, self.lines.next_line())
                .await
                .map_err(|_| format!("no answer in {} s", PEER_TIMEOUT.as_secs()))?
                .map_err(|e| e.to_string())?
                .ok_or("it exited (see its output above)")?;
            // A library's log line is not an answer.
            if line.starts_with('{') {
                break line;
            }
        };
        let value: Value =
            serde_json::from_str(&line).map_err(|e| format!("it printed {line:?}: {e}"))?;
        match value.get("error") {
            Some(error) => Err(error.as_str().unwrap_or_default().to_owned()),
            None => Ok(value),
        }
    }

    async fn stop(mut self) {
        let _ = self.stdin.write_all(b"quit\n").await;
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        if let Some((admin, db)) = self.database {
            if let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await;
            }
        }
    }
}
