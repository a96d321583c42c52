//! `saga-harness prune` as an operator runs it: what it says it kept and
//! why, a SQLite log it may not touch while a harness holds it, a bad age
//! refused before anything is read, and a pass killed midway, or whose
//! PostgreSQL stops midway, that loses no run.

use crate::common;

use saga_harness::saga::model::{Actor, NewRun};
use saga_harness::saga::status::RunStatus;
use std::process::Output;

async fn prune(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_saga-harness"))
        .arg("prune")
        .args(args)
        .output()
        .await
        .expect("saga-harness prune runs")
}

fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A run completed by its agent now, with no steps.
async fn completed(store: &dyn saga_harness::saga::store::SagaStore, purpose: &str) -> uuid::Uuid {
    let (run, _) = store
        .create_run(NewRun {
            agent: "support-bot".into(),
            label: None,
            purpose: purpose.into(),
        })
        .await
        .unwrap();
    store
        .move_run(
            run.id,
            RunStatus::Running,
            RunStatus::Completed,
            &Actor::Agent("support-bot".into()),
            None,
        )
        .await
        .unwrap();
    run.id
}

#[tokio::test]
async fn prune_says_what_it_kept_and_why_and_leaves_a_held_sqlite_log_alone() {
    let db = common::sqlite();
    let opened = saga_harness::store::open(&db.url).await.unwrap();
    let store = opened.saga_store();
    completed(&*store, "done today").await;
    drop(store);
    // While another process holds the file, prune is refused, and says why.
    let held = prune(&["--older-than", "1s", "--database-url", &db.url]).await;
    assert!(!held.status.success());
    assert!(
        said(&held).contains("is in use by another saga-harness process"),
        "{}",
        said(&held)
    );
    drop(opened);
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;

    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive.jsonl");
    let dry = prune(&["--older-than", "1s", "--dry-run", "--database-url", &db.url]).await;
    assert!(dry.status.success(), "{}", said(&dry));
    assert!(
        said(&dry).contains("would prune 0 of 1 finished runs older than the cut-off"),
        "{}",
        said(&dry)
    );
    assert!(
        said(&dry).contains("kept 1 ended within a day (may still count against a limit)"),
        "{}",
        said(&dry)
    );
    let real = prune(&[
        "--older-than",
        "1s",
        "--archive",
        archive.to_str().unwrap(),
        "--database-url",
        &db.url,
    ])
    .await;
    assert!(real.status.success(), "{}", said(&real));
    assert!(
        said(&real).contains("pruned 0 of 1 finished runs"),
        "{}",
        said(&real)
    );
    assert!(said(&real).contains("archived to"), "{}", said(&real));
}

#[tokio::test]
async fn a_bad_age_or_share_is_refused_before_the_log_is_opened() {
    const NOWHERE: &str = "sqlite:///nonexistent/dir/x.db";
    let cases: &[(&[&str], &str)] = &[
        (
            &["--older-than", "soon"],
            "`soon` is not a duration like \"90d\"",
        ),
        (&["--older-than", "0s"], "must be longer than zero"),
        (&["--older-than", "90d", "--share", "0"], FRACTION),
        (&["--older-than", "90d", "--share", "2"], FRACTION),
        (&["--older-than", "90d", "--share", "half"], FRACTION),
    ];
    const FRACTION: &str = "must be a fraction of the time greater than 0 and at most 1";
    for (args, expected) in cases {
        let out = prune(&[args, &["--database-url", NOWHERE][..]].concat()).await;
        assert!(!out.status.success(), "{args:?}");
        assert!(said(&out).contains(expected), "{args:?}: {}", said(&out));
    }
}

/// Seeds `n` completed runs that ended two days ago, on either backend.
async fn ended_two_days_ago(url: &str, n: usize) -> Vec<uuid::Uuid> {
    use sqlx::Connection as _;
    let opened = saga_harness::store::open(url).await.unwrap();
    let store = opened.saga_store();
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(completed(&*store, &format!("done long ago #{i}")).await);
    }
    drop(store);
    opened.close().await;
    let two_days_ago = chrono::Utc::now() - chrono::Duration::days(2);
    if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query("UPDATE runs SET updated_at = $1")
            .bind(two_days_ago)
            .execute(&mut conn)
            .await
            .unwrap();
    } else {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query("UPDATE runs SET updated_at = ?")
            .bind(two_days_ago)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    ids
}

/// Starts `saga-harness` with `args` (a prune) and waits for its first
/// page; the rest of what it says is read into the returned task.
async fn pruning_past_its_first_page(
    args: &[&str],
) -> (tokio::process::Child, tokio::task::JoinHandle<String>) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_saga-harness"))
        .args(args)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.starts_with('…') {
            break;
        }
    }
    // What it says from here on is read by a task of its own, so that
    // the pipe never fills and the process can exit.
    let rest = tokio::spawn(async move {
        let mut said = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            said.push_str(&line);
            said.push('\n');
        }
        said
    });
    (child, rest)
}

/// `saga-harness prune` of runs older than a day, archived to `archive`.
fn archiving_prune<'a>(archive: &'a std::path::Path, url: &'a str) -> [&'a str; 7] {
    [
        "prune",
        "--older-than",
        "1d",
        "--archive",
        archive.to_str().unwrap(),
        "--database-url",
        url,
    ]
}

#[tokio::test]
async fn a_prune_killed_midway_loses_no_run_and_the_next_one_finishes() {
    let db = common::sqlite();
    let ids = ended_two_days_ago(&db.url, 450).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive.jsonl");
    let args = archiving_prune(&archive, &db.url);
    // Killed (SIGKILL) a moment after its first page, while it works on
    // the next.
    let (mut first, _) = pruning_past_its_first_page(&args).await;
    tokio::time::sleep(std::time::Duration::from_millis(15)).await;
    first.kill().await.unwrap();
    the_next_pass_finishes_what_was_left(&db.url, &args, &archive, &ids).await;
}

/// After a pass cut off midway: every run it removed is in the archive,
/// some are left, and the next pass removes exactly those.
async fn the_next_pass_finishes_what_was_left(
    url: &str,
    args: &[&str],
    archive: &std::path::Path,
    ids: &[uuid::Uuid],
) {
    let opened = saga_harness::store::open(url).await.unwrap();
    let store = opened.saga_store();
    let archived = || {
        saga_harness::ops::retention::read_archive(&std::fs::read_to_string(archive).unwrap())
            .expect("every line of the archive reads back")
            .into_iter()
            .map(|history| history.run.id)
            .collect::<std::collections::HashSet<_>>()
    };
    let mut left = 0;
    for id in ids {
        if store.run(*id).await.unwrap().is_some() {
            left += 1;
        } else {
            assert!(archived().contains(id), "a removed run is in the archive");
        }
    }
    assert!(left > 0 && left < ids.len(), "cut off midway: {left} left");
    drop(store);
    opened.close().await;
    // Its hold on a SQLite log goes with it.
    drop(opened);

    let second = prune(&args[1..]).await;
    assert!(second.status.success(), "{}", said(&second));
    assert!(
        said(&second).contains(&format!("pruned {left} of {left} finished runs")),
        "{}",
        said(&second)
    );
    assert_eq!(archived(), ids.iter().copied().collect());
}

/// PostgreSQL stopped in immediate mode under a running prune: the
/// command stops at once (not hanging) and tells the operator to run it
/// again once the database is back, nothing it removed is missing from the archive, and once the
/// server is back the next pass removes exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_whose_postgres_stops_midway_says_so_and_the_next_one_finishes() {
    let Some(server) = common::cluster::Server::primary() else {
        return;
    };
    let url = server.url();
    let ids = ended_two_days_ago(&url, 450).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive.jsonl");
    let args = archiving_prune(&archive, &url);
    let (mut first, rest) = pruning_past_its_first_page(&args).await;
    tokio::task::block_in_place(|| server.stop_immediately());
    let stopped = std::time::Instant::now();
    let status = tokio::time::timeout(std::time::Duration::from_secs(60), first.wait())
        .await
        .expect("the prune stops within a minute of its database")
        .unwrap();
    let said = rest.await.unwrap();
    println!(
        "the prune stopped {:?} after PostgreSQL: {said}",
        stopped.elapsed()
    );
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("the database stopped answering after")
            && said.contains("run the same prune again once the database is back"),
        "{said}"
    );
    tokio::task::block_in_place(|| server.start());
    the_next_pass_finishes_what_was_left(&url, &args, &archive, &ids).await;
}
