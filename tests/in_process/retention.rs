//! Retention: `prune` takes settled history out of the saga log, each run
//! archived first as one JSON line that reads back whole, and never a run
//! something can still move. Time passes by the clock `prune` is given.
//! On SQLite and PostgreSQL.

use crate::common;

use chrono::{Duration as Days, Utc};
use common::crash::CrashingStore;
use common::world::{World, TOOLS};
use saga_harness::ops::retention::{prune, read_archive, Pass, REMOVED_TOGETHER};
use saga_harness::saga::engine::Engine;
use saga_harness::saga::model::{Actor, Run, Via};
use saga_harness::saga::pivot::PlannedCall;
use saga_harness::saga::registry::{Registry, Share};
use saga_harness::saga::retention::RunHistory;
use saga_harness::saga::status::RunStatus;
use saga_harness::saga::store::SagaStore;
use serde_json::json;
use std::collections::HashSet;
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
        common::world::new_run(&*self.store, AGENT, purpose).await
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

    /// A run that charged a card and was unwound by a lead: a
    /// compensation, and a correction nobody has signed off yet.
    async fn unwound_with_a_correction(&self) -> Run {
        let run = self.run("charge then unwind").await;
        self.engine
            .call(
                AGENT,
                run.id,
                "charge_card",
                json!({"amount": 900, "receipt": false}),
                Some(0),
            )
            .await
            .unwrap();
        let unwound = self
            .engine
            .unwind(
                run.id,
                &Actor::User("dana".into()),
                "charged the wrong card",
            )
            .await
            .unwrap();
        assert_eq!(unwound.status, RunStatus::Unwound);
        assert!(!self.store.corrections(run.id).await.unwrap().is_empty());
        unwound
    }

    /// A run that held an amount on a card, then was completed by an
    /// approved pivot that charged without capturing the hold.
    async fn completed_by_a_pivot(&self) -> Run {
        let run = self.run("hold then charge").await;
        self.engine
            .call(
                AGENT,
                run.id,
                "authorize_card",
                json!({"amount": 300}),
                Some(0),
            )
            .await
            .unwrap();
        let pivot = self
            .engine
            .propose_pivot(
                AGENT,
                run.id,
                "charge",
                vec![PlannedCall {
                    tool: "charge_card".into(),
                    args: json!({"amount": 300}),
                }],
            )
            .await
            .unwrap();
        let done = self
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
        done
    }

    /// A pass `later` than now.
    async fn prune(&self, later: Days, older_than: Duration, archive: Option<&Path>) -> Pass {
        prune(
            &*self.store,
            Utc::now() + later,
            older_than,
            archive,
            false,
            Share::DEFAULT,
            |_| {},
        )
        .await
        .unwrap()
    }
}

/// A run's history read table by table with the run page's own reads:
/// what the pruner's one read per table for a page must equal.
async fn read_one_by_one(store: &dyn SagaStore, id: uuid::Uuid) -> RunHistory {
    let approvals = store.approvals(id).await.unwrap();
    let mut notices = Vec::new();
    for approval in &approvals {
        notices.extend(store.notices(approval.id).await.unwrap());
    }
    RunHistory {
        run: store.run(id).await.unwrap().unwrap(),
        steps: store.steps(id).await.unwrap(),
        compensations: store.compensations(id).await.unwrap(),
        approvals,
        notices,
        corrections: store.corrections(id).await.unwrap(),
        events: store.events(Some(id), i64::MAX).await.unwrap(),
    }
}

async fn a_settled_run_is_archived_then_removed_and_reads_back_from_its_line(s: Setup) {
    let run = s.completed().await;
    let before = read_one_by_one(&*s.store, run.id).await;
    assert!(!before.events.is_empty(), "the run has audit lines");
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive.jsonl");

    let dry = prune(
        &*s.store,
        Utc::now() + Days::days(100),
        NINETY_DAYS,
        Some(&archive),
        true,
        Share::DEFAULT,
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
    let corrected = s.unwound_with_a_correction().await;
    // Completed by a pivot that charged without capturing its hold: the
    // authorisation is still open on the card for a week.
    let held = s.completed_by_a_pivot().await;

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

async fn a_page_read_with_one_query_per_table_equals_each_run_read_alone(s: Setup) {
    let runs = vec![
        s.completed().await,
        s.unwound_with_a_correction().await,
        s.run("not started").await,
        s.completed_by_a_pivot().await,
    ];
    let mut alone = Vec::new();
    for run in &runs {
        alone.push(read_one_by_one(&*s.store, run.id).await);
    }
    let page = s.store.histories(runs).await.unwrap();
    assert_eq!(page, alone);
    assert!(!page[1].compensations.is_empty() && !page[1].corrections.is_empty());
    assert!(page[2].steps.is_empty() && !page[2].events.is_empty());
    assert!(!page[3].approvals.is_empty());
}

async fn removing_several_runs_leaves_the_ones_that_changed_since_they_were_read(s: Setup) {
    let (first, moved, last) = (
        s.completed().await,
        s.completed().await,
        s.completed().await,
    );
    let (gone, rows) = s
        .store
        .remove_runs(&[
            (first.id, first.updated_at),
            (moved.id, moved.updated_at - Days::seconds(1)),
            (last.id, last.updated_at),
        ])
        .await
        .unwrap();
    assert_eq!(gone, vec![first.id, last.id]);
    assert_eq!((rows.by_table["runs"], rows.by_table["saga_log"]), (2, 2));
    assert!(s.store.run(first.id).await.unwrap().is_none());
    assert!(s.store.run(last.id).await.unwrap().is_none());
    assert_eq!(s.store.steps(moved.id).await.unwrap().len(), 1);
}

async fn a_pass_cut_off_midway_loses_no_run_and_the_next_pass_finishes(s: Setup) {
    let mut ids = Vec::new();
    for _ in 0..REMOVED_TOGETHER * 3 {
        ids.push(s.completed().await.id);
    }
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive.jsonl");
    // The database goes away just after the second removal commits.
    let dying = CrashingStore::new(s.store.clone(), Some(1), true);
    let later = Utc::now() + Days::days(100);
    let cut = prune(
        &dying,
        later,
        NINETY_DAYS,
        Some(&archive),
        false,
        Share::DEFAULT,
        |_| {},
    )
    .await;
    assert!(cut.is_err(), "the pass stops with the database");
    let archived = |path: &Path| -> HashSet<uuid::Uuid> {
        read_archive(&std::fs::read_to_string(path).unwrap())
            .unwrap()
            .into_iter()
            .map(|history| history.run.id)
            .collect()
    };
    let mut left = HashSet::new();
    for id in &ids {
        if s.store.run(*id).await.unwrap().is_some() {
            left.insert(*id);
        } else {
            assert!(
                archived(&archive).contains(id),
                "a removed run is in the archive"
            );
        }
    }
    assert_eq!(left.len(), REMOVED_TOGETHER, "two removals committed");

    let pass = s.prune(Days::days(100), NINETY_DAYS, Some(&archive)).await;
    assert_eq!(pass.pruned as usize, REMOVED_TOGETHER);
    for id in &ids {
        assert!(s.store.run(*id).await.unwrap().is_none());
    }
    assert_eq!(archived(&archive), ids.iter().copied().collect());
}

async fn a_last_archive_line_cut_short_by_a_crash_is_cut_off_before_the_next_pass_writes(s: Setup) {
    let run = s.completed().await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive.jsonl");
    std::fs::write(&archive, "{\"run\":{\"id\":\"").unwrap();
    let pass = s.prune(Days::days(100), NINETY_DAYS, Some(&archive)).await;
    assert_eq!(pass.pruned, 1);
    let lines = read_archive(&std::fs::read_to_string(&archive).unwrap()).unwrap();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].run.id, run.id);
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

/// A pass given a quarter of the time rests three times as long as each
/// page took, and says how much of its time was work.
async fn a_pass_works_only_its_share_of_the_time(s: Setup) {
    for _ in 0..3 {
        s.completed().await;
    }
    let quarter = Share::new(0.25).unwrap();
    let pass = prune(
        &*s.store,
        Utc::now() + Days::days(100),
        NINETY_DAYS,
        None,
        false,
        quarter,
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(pass.pruned, 3);
    assert!(pass.working_seconds > 0.0);
    assert!(
        pass.seconds >= pass.working_seconds * 4.0,
        "worked {:.4} s of {:.4} s",
        pass.working_seconds,
        pass.seconds
    );
    let summary = pass.summary(false);
    assert!(summary.contains(" s of it working)"), "{summary}");
}

common::on_both_backends!(
    setup;
    a_pass_works_only_its_share_of_the_time,
    a_settled_run_is_archived_then_removed_and_reads_back_from_its_line,
    prune_keeps_every_run_something_can_still_move,
    a_run_that_changed_after_it_was_read_is_not_removed,
    pages_go_oldest_first_and_reach_every_old_run,
    a_page_read_with_one_query_per_table_equals_each_run_read_alone,
    removing_several_runs_leaves_the_ones_that_changed_since_they_were_read,
    a_pass_cut_off_midway_loses_no_run_and_the_next_pass_finishes,
    a_last_archive_line_cut_short_by_a_crash_is_cut_off_before_the_next_pass_writes,
);
