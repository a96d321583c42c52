//! `saga-harness prune` as an operator runs it: what it says it kept and
//! why, a SQLite log it may not touch while a harness holds it, a bad age
//! refused before anything is read, and a pass killed midway that loses
//! no run.

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
async fn a_bad_age_is_refused_before_the_log_is_opened() {
    let out = prune(&[
        "--older-than",
        "soon",
        "--database-url",
        "sqlite:///nonexistent/dir/x.db",
    ])
    .await;
    assert!(!out.status.success());
    assert!(
        said(&out).contains("`soon` is not a duration like \"90d\""),
        "{}",
        said(&out)
    );
    let zero = prune(&["--older-than", "0s"]).await;
    assert!(
        said(&zero).contains("must be longer than zero"),
        "{}",
        said(&zero)
    );
}

/// Seeds `n` completed runs that ended two days ago, on a SQLite log.
async fn ended_two_days_ago(url: &str, n: usize) -> Vec<uuid::Uuid> {
    use sqlx::Connection as _;
    let opened = saga_harness::store::open(url).await.unwrap();
    let store = opened.saga_store();
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(completed(&*store, &format!("done long ago #{i}")).await);
    }
    drop(store);
    drop(opened);
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::query("UPDATE runs SET updated_at = ?")
        .bind(chrono::Utc::now() - chrono::Duration::days(2))
        .execute(&mut conn)
        .await
        .unwrap();
    ids
}

#[tokio::test]
async fn a_prune_killed_midway_loses_no_run_and_the_next_one_finishes() {
    use tokio::io::AsyncBufReadExt as _;
    let db = common::sqlite();
    let ids = ended_two_days_ago(&db.url, 450).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive.jsonl");
    let args = [
        "prune",
        "--older-than",
        "1d",
        "--archive",
        archive.to_str().unwrap(),
        "--database-url",
        &db.url,
    ];
    let mut first = tokio::process::Command::new(env!("CARGO_BIN_EXE_saga-harness"))
        .args(args)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Killed (SIGKILL) a moment after its first page, while it works on
    // the next.
    let mut lines = tokio::io::BufReader::new(first.stderr.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.starts_with('…') {
            break;
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(15)).await;
    first.kill().await.unwrap();

    let opened = saga_harness::store::open(&db.url).await.unwrap();
    let store = opened.saga_store();
    let archived = || {
        saga_harness::ops::retention::read_archive(&std::fs::read_to_string(&archive).unwrap())
            .expect("every line of the archive reads back")
            .into_iter()
            .map(|history| history.run.id)
            .collect::<std::collections::HashSet<_>>()
    };
    let mut left = 0;
    for id in &ids {
        if store.run(*id).await.unwrap().is_some() {
            left += 1;
        } else {
            assert!(archived().contains(id), "a removed run is in the archive");
        }
    }
    assert!(left > 0 && left < ids.len(), "killed midway: {left} left");
    drop(store);
    drop(opened);

    let second = prune(&args[1..]).await;
    assert!(second.status.success(), "{}", said(&second));
    assert!(
        said(&second).contains(&format!("pruned {left} of {left} finished runs")),
        "{}",
        said(&second)
    );
    assert_eq!(archived(), ids.into_iter().collect());
}
