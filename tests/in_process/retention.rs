//! Retention: `prune` takes settled history out of the saga log, each run
//! archived first as one JSON line that reads back whole, and never a run
//! something can still move. Time passes by the clock `prune` is given.
//! On SQLite and PostgreSQL.

use crate::common;

use chrono::{Duration as Days, Utc};
use common::world::{World, TOOLS};
use saga_harness::ops::retention::{history, prune, read_archive, Pass};
use saga_harness::saga::engine::Engine;
use saga_harness::saga::model::{Actor, NewRun, Run, Via};
use saga_harness::saga::pivot::PlannedCall;
use saga_harness::saga::registry::Registry;
use saga_harness::saga::status::RunStatus;
use saga_harness::saga::store::SagaStore;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const AGENT: &str = "support-bot";
const NINETY_DAYS: Duration = Duration::from_secs(90 * 86_400);

struct Setup {
    store: Arc<dyn SagaStore>,
    engine: Engine,
}

fn setup(store: Arc<dyn SagaStore>) -> Setup {
    let registry = Arc::new(Registry::from_toml(TOOLS).expect("the test tools"));
    let engine = Engine::new(store.clone(), registry, Arc::new(World::new()));
    Setup { store, engine }
}

impl Setup {
    async fn run(&self, purpose: &str) -> Run {
        self.store
            .create_run(NewRun {
                agent: AGENT.into(),
                label: None,
                purpose: purpose.into(),
            })
            .await
            .unwrap()
            .0
    }

    /// A run that opened a ticket and was completed by its agent.
    async fn completed(&self) -> Run {
        let run = self.run("open a ticket").await;
        self.engine
            .call(
                AGENT,
                run.id,
                "create_ticket",
                json!({"summary": "Broken kettle"}),
                Some(0),
            )
            .await
            .unwrap();
        self.engine.complete(AGENT, run.id).await.unwrap()
    }

    /// A pass `later` than now.
    async fn prune(&self, later: Days, older_than: Duration, archive: Option<&Path>) -> Pass {
        prune(
            &*self.store,
            Utc::now() + later,
            older_than,
            archive,
            false,
            |_| {},
        )
        .await
        .unwrap()
    }
}

async fn a_settled_run_is_archived_then_removed_and_reads_back_from_its_line(s: Setup) {
    let run = s.completed().await;
    let before = history(&*s.store, s.store.run(run.id).await.unwrap().unwrap())
        .await
        .unwrap();
    assert!(!before.events.is_empty(), "the run has audit lines");
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive.jsonl");

    let dry = prune(
        &*s.store,
        Utc::now() + Days::days(100),
        NINETY_DAYS,
        Some(&archive),
        true,
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!((dry.looked_at, dry.pruned), (1, 1));
    assert!(
        s.store.run(run.id).await.unwrap().is_some(),
        "a dry run changes nothing"
    );
    assert!(!archive.exists(), "nor writes an archive");

    let early = s.prune(Days::days(30), NINETY_DAYS, Some(&archive)).await;
    assert_eq!(early.looked_at, 0, "not yet ninety days old");

    let pass = s.prune(Days::days(100), NINETY_DAYS, Some(&archive)).await;
    assert_eq!((pass.looked_at, pass.pruned), (1, 1));
    assert_eq!(pass.removed["runs"], 1);
    assert_eq!(pass.removed["saga_log"], 1);
    assert_eq!(pass.removed["events"], before.events.len() as u64);
    assert!(s.store.run(run.id).await.unwrap().is_none());
    assert!(s.store.steps(run.id).await.unwrap().is_empty());
    assert!(s.store.events(Some(run.id), 100).await.unwrap().is_empty());

    let lines = read_archive(&std::fs::read_to_string(&archive).unwrap()).unwrap();
    assert_eq!(lines, vec![before], "the line is the run as it was, whole");
    assert_eq!(
        s.prune(Days::days(100), NINETY_DAYS, None).await.looked_at,
        0
    );
}

async fn prune_keeps_every_run_something_can_still_move(s: Setup) {
    // Not finished: a step made, never completed or unwound.
    let open = s.run("still working").await;
    s.engine
        .call(AGENT, open.id, "create_ticket", json!({}), Some(0))
        .await
        .unwrap();
    // Unwound, with a correction nobody has signed off yet.
    let corrected = s.run("charge then unwind").await;
    s.engine
        .call(
            AGENT,
            corrected.id,
            "charge_card",
            json!({"amount": 900, "receipt": false}),
            Some(0),
        )
        .await
        .unwrap();
    let unwound = s
        .engine
        .unwind(
            corrected.id,
            &Actor::User("dana".into()),
            "charged the wrong card",
        )
        .await
        .unwrap();
    assert_eq!(unwound.status, RunStatus::Unwound);
    assert!(!s.store.corrections(corrected.id).await.unwrap().is_empty());
    // Completed by a pivot that charged without capturing its hold: the
    // authorisation is still open on the card for a week.
    let held = s.run("hold then charge").await;
    s.engine
        .call(
            AGENT,
            held.id,
            "authorize_card",
            json!({"amount": 300}),
            Some(0),
        )
        .await
        .unwrap();
    let pivot = s
        .engine
        .propose_pivot(
            AGENT,
            held.id,
            "charge",
            vec![PlannedCall {
                tool: "charge_card".into(),
                args: json!({"amount": 300}),
            }],
        )
        .await
        .unwrap();
    let done = s
        .engine
        .decide_pivot(
            pivot.id,
            &pivot.digest,
            true,
            &Actor::User("dana".into()),
            Via::Dashboard,
        )
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);

    // Half a day on, with any age allowed: every finished run is kept,
    // each for its reason; the unfinished one is not even looked at.
    let soon = s
        .prune(Days::hours(12), Duration::from_secs(60), None)
        .await;
    assert_eq!((soon.looked_at, soon.pruned), (2, 0), "{soon:?}");
    assert_eq!(
        soon.kept["ended within a day (may still count against a limit)"],
        2
    );

    // Three days on: the hold is still open, the correction still waits.
    let later = s
        .prune(Days::days(3), Duration::from_secs(86_400), None)
        .await;
    assert_eq!((later.looked_at, later.pruned), (2, 0), "{later:?}");
    assert_eq!(later.kept["a correction pending"], 1);
    assert_eq!(later.kept["an open authorisation or draft"], 1);

    // Past the authorisation's lifetime the held run goes; the others stay.
    let past = s
        .prune(Days::days(10), Duration::from_secs(86_400), None)
        .await;
    assert_eq!(past.pruned, 1, "{past:?}");
    assert!(s.store.run(held.id).await.unwrap().is_none());
    assert!(s.store.run(open.id).await.unwrap().is_some());
    assert!(s.store.run(corrected.id).await.unwrap().is_some());
}

async fn a_run_that_changed_after_it_was_read_is_not_removed(s: Setup) {
    let run = s.completed().await;
    let stale = run.updated_at - Days::seconds(1);
    assert!(s.store.remove_run(run.id, stale).await.unwrap().is_none());
    assert!(s.store.run(run.id).await.unwrap().is_some());
    let removed = s
        .store
        .remove_run(run.id, run.updated_at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(removed.by_table["runs"], 1);
    assert!(s.store.run(run.id).await.unwrap().is_none());
}

async fn pages_go_oldest_first_and_reach_every_old_run(s: Setup) {
    let mut ids = Vec::new();
    for _ in 0..(saga_harness::ops::retention::PAGE + 5) {
        ids.push(s.completed().await.id);
    }
    let pass = s.prune(Days::days(100), NINETY_DAYS, None).await;
    assert_eq!(pass.pruned as usize, ids.len());
    for id in ids {
        assert!(s.store.run(id).await.unwrap().is_none());
    }
}

common::on_both_backends!(
    setup;
    a_settled_run_is_archived_then_removed_and_reads_back_from_its_line,
    prune_keeps_every_run_something_can_still_move,
    a_run_that_changed_after_it_was_read_is_not_removed,
    pages_go_oldest_first_and_reach_every_old_run,
);
