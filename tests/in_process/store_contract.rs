//! The store contract: every `SagaStore` implementation must pass these, on
//! a fresh database each. Run against SQLite always and PostgreSQL whenever
//! `SAGA_TEST_POSTGRES_URL` is set (the test command sets it).

use crate::common;

use saga_harness::saga::class::{Audience, Phase, Role, ToolClass};
use saga_harness::saga::key::{compensation_key, correction_key, notice_key, step_key};
use saga_harness::saga::model::*;
use saga_harness::saga::status::*;
use saga_harness::saga::store::{SagaStore, StoreError};
use serde_json::json;
use std::sync::Arc;
use uuid::Uuid;

type Store = Arc<dyn SagaStore>;

fn agent() -> Actor {
    Actor::Agent("support-bot".into())
}

fn lead() -> Actor {
    Actor::User("dana".into())
}

async fn new_run(store: &Store, label: Option<&str>) -> Run {
    store
        .create_run(NewRun {
            agent: "support-bot".into(),
            label: label.map(str::to_owned),
            purpose: "refund a double charge".into(),
        })
        .await
        .unwrap()
        .0
}

/// A new run waiting at a pivot (digest `d1`) that `approvers_needed`
/// people must approve.
async fn waiting_pivot(
    store: &Store,
    summary: &str,
    plan: serde_json::Value,
    approvers_needed: i64,
) -> (Run, Approval) {
    let run = new_run(store, None).await;
    let approval = store
        .request_approval(
            NewApproval {
                run_id: run.id,
                kind: ApprovalKind::Pivot,
                step_idx: None,
                summary: summary.into(),
                plan,
                digest: "d1".into(),
                expires_at: None,
                approvers_needed,
            },
            Some((RunStatus::Running, RunStatus::AwaitingApproval)),
            &agent(),
        )
        .await
        .unwrap();
    (run, approval)
}

fn step(run: &Run, idx: i64, tool: &str, class: ToolClass, status: StepStatus) -> NewStep {
    NewStep {
        run_id: run.id,
        step_idx: idx,
        tool: tool.into(),
        tool_class: class,
        idempotency_key: step_key(run.id, idx, tool),
        args: json!({"amount": 1200, "currency": "eur"}),
        status,
        compensation: Some(
            json!({"tool": "stripe.refund", "args": {"charge_key": step_key(run.id, idx, tool)}}),
        ),
        audience: Audience::Finance,
        phase: Phase::BeforePivot,
        limits: Default::default(),
    }
}

/// Records a step at the run's next index and drives it to `status` along
/// legal moves only.
async fn step_in(store: &Store, status: StepStatus) -> (Run, Step) {
    use StepStatus::*;
    let run = new_run(store, None).await;
    let start = if matches!(status, AwaitingApproval | Rejected) {
        AwaitingApproval
    } else {
        Intended
    };
    let mut current = store
        .record_step(
            step(&run, 0, "stripe.charge", ToolClass::Compensatable, start),
            &agent(),
        )
        .await
        .unwrap();
    let path: &[StepStatus] = match status {
        AwaitingApproval | Intended => &[],
        Rejected => &[Rejected],
        Confirmed => &[Confirmed],
        Failed => &[Failed],
        Unknown => &[Unknown],
        NotExecuted => &[NotExecuted],
        Compensated => &[Confirmed, Compensated],
    };
    for &to in path {
        current = store
            .settle_step(
                run.id,
                0,
                Outcome::moving(current.status, to),
                Durability::Durable,
                &agent(),
            )
            .await
            .unwrap();
    }
    assert_eq!(current.status, status);
    (run, current)
}

async fn runs_are_created_once_per_agent_label(store: Store) {
    let (first, created) = store
        .create_run(NewRun {
            agent: "support-bot".into(),
            label: Some("ticket-4512".into()),
            purpose: "refund".into(),
        })
        .await
        .unwrap();
    assert!(created);
    assert_eq!(first.status, RunStatus::Running);
    assert_eq!(first.next_step, 0);
    let (again, created) = store
        .create_run(NewRun {
            agent: "support-bot".into(),
            label: Some("ticket-4512".into()),
            purpose: "refund".into(),
        })
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(again.id, first.id);
    // Another agent's label is its own; unlabelled runs are always new.
    let (other, created) = store
        .create_run(NewRun {
            agent: "billing-bot".into(),
            label: Some("ticket-4512".into()),
            purpose: "refund".into(),
        })
        .await
        .unwrap();
    assert!(created);
    assert_ne!(other.id, first.id);
    assert_ne!(
        new_run(&store, None).await.id,
        new_run(&store, None).await.id
    );
    assert_eq!(store.run(first.id).await.unwrap().unwrap(), first);
    assert!(store.run(Uuid::new_v4()).await.unwrap().is_none());
    assert_eq!(store.list_runs(10).await.unwrap().len(), 4);
}

async fn the_runs_list_puts_waiting_runs_first_and_pages(store: Store) {
    let lead = Actor::User("dana".into());
    let plain_old = new_run(&store, Some("old")).await;
    let attention = new_run(&store, Some("attention")).await;
    store
        .move_run(
            attention.id,
            RunStatus::Running,
            RunStatus::NeedsAttention,
            &lead,
            None,
        )
        .await
        .unwrap();
    let pivot = new_run(&store, Some("pivot")).await;
    store
        .move_run(
            pivot.id,
            RunStatus::Running,
            RunStatus::AwaitingApproval,
            &lead,
            None,
        )
        .await
        .unwrap();
    let plain_new = new_run(&store, Some("new")).await;
    let page = store.runs_page(None, "", 0, 10).await.unwrap();
    let order: Vec<(Uuid, bool)> = page.runs.iter().map(|(r, w)| (r.id, *w)).collect();
    assert_eq!(
        order,
        vec![
            (pivot.id, true),
            (attention.id, false),
            (plain_new.id, false),
            (plain_old.id, false)
        ]
    );
    assert_eq!(page.total, 4);
    let second = store.runs_page(None, "", 2, 2).await.unwrap();
    assert_eq!(second.runs.len(), 2);
    assert_eq!(second.runs[0].0.id, plain_new.id);
    let running = store
        .runs_page(Some(RunStatus::Running), "", 0, 10)
        .await
        .unwrap();
    assert_eq!(running.total, 2);
    assert!(running
        .runs
        .iter()
        .all(|(r, _)| r.status == RunStatus::Running));
}

async fn r3_steps_take_the_next_index_in_order(store: Store) {
    let run = new_run(&store, None).await;
    let err = store
        .record_step(
            step(
                &run,
                1,
                "jira.create",
                ToolClass::Compensatable,
                StepStatus::Intended,
            ),
            &agent(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::StepOutOfOrder {
                given: 1,
                expected: 0
            }
        ),
        "{err}"
    );
    let first = store
        .record_step(
            step(
                &run,
                0,
                "jira.create",
                ToolClass::Compensatable,
                StepStatus::Intended,
            ),
            &agent(),
        )
        .await
        .unwrap();
    assert_eq!(first.status, StepStatus::Intended);
    assert_eq!(first.idempotency_key, step_key(run.id, 0, "jira.create"));
    assert_eq!(store.run(run.id).await.unwrap().unwrap().next_step, 1);
    let err = store
        .record_step(
            step(
                &run,
                0,
                "jira.create",
                ToolClass::Compensatable,
                StepStatus::Intended,
            ),
            &agent(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::StepExists { step_idx: 0 }),
        "{err}"
    );
    store
        .record_step(
            step(
                &run,
                1,
                "stripe.charge",
                ToolClass::Compensatable,
                StepStatus::Intended,
            ),
            &agent(),
        )
        .await
        .unwrap();
    let steps = store.steps(run.id).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.step_idx).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(
        store
            .step_by_key(&first.idempotency_key)
            .await
            .unwrap()
            .unwrap(),
        first
    );
    // The key is unique across the whole log.
    let mut reused = step(
        &run,
        2,
        "email.send",
        ToolClass::Irreversible,
        StepStatus::AwaitingApproval,
    );
    reused.idempotency_key = first.idempotency_key.clone();
    let err = store.record_step(reused, &agent()).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err}");
    assert_eq!(
        store.run(run.id).await.unwrap().unwrap().next_step,
        2,
        "a refused step takes no index"
    );
    // The refusal came half way through the write; the store is still
    // writable, and the refused row left no audit line.
    let third = store
        .record_step(
            step(
                &run,
                2,
                "email.send",
                ToolClass::Compensatable,
                StepStatus::Intended,
            ),
            &agent(),
        )
        .await
        .unwrap();
    assert_eq!(third.step_idx, 2);
    let lines = store.events(Some(run.id), 100).await.unwrap();
    assert_eq!(
        lines.iter().filter(|e| e.entity.as_str() == "step").count(),
        3,
        "one audit line per step written, none for the refused ones"
    );
}

async fn r2_pure_calls_are_never_logged(store: Store) {
    let run = new_run(&store, None).await;
    let err = store
        .record_step(
            step(&run, 0, "crm.lookup", ToolClass::Pure, StepStatus::Intended),
            &agent(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("R2"));
    assert_eq!(store.run(run.id).await.unwrap().unwrap().next_step, 0);
    let err = store
        .record_step(
            step(
                &run,
                0,
                "x",
                ToolClass::Compensatable,
                StepStatus::Confirmed,
            ),
            &agent(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
}

async fn every_step_transition_is_judged(store: Store) {
    for from in StepStatus::ALL {
        for to in StepStatus::ALL {
            let (run, before) = step_in(&store, from).await;
            let legal = check_step_transition(Lifecycle::Step, from, to).is_ok();
            let result = store
                .settle_step(
                    run.id,
                    0,
                    Outcome::moving(from, to),
                    Durability::Durable,
                    &lead(),
                )
                .await;
            let after = store.step(run.id, 0).await.unwrap().unwrap();
            if legal {
                let moved = result.unwrap_or_else(|e| panic!("{from} -> {to} refused: {e}"));
                assert_eq!(moved.status, to);
                assert_eq!(after.status, to);
            } else {
                assert!(
                    matches!(result, Err(StoreError::IllegalTransition(_))),
                    "{from} -> {to} accepted"
                );
                assert_eq!(
                    after.status, before.status,
                    "{from} -> {to} changed the row"
                );
            }
        }
    }
}

async fn a_stale_status_is_refused_and_changes_nothing(store: Store) {
    let (run, _) = step_in(&store, StepStatus::Intended).await;
    let err = store
        .settle_step(
            run.id,
            0,
            Outcome::moving(StepStatus::Unknown, StepStatus::Confirmed),
            Durability::Lazy,
            &agent(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Stale { .. }), "{err}");
    assert_eq!(
        store.step(run.id, 0).await.unwrap().unwrap().status,
        StepStatus::Intended
    );
    let err = store
        .settle_step(
            run.id,
            7,
            Outcome::moving(StepStatus::Intended, StepStatus::Confirmed),
            Durability::Lazy,
            &agent(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
}

async fn r4_outcomes_keep_what_was_learnt(store: Store) {
    let (run, _) = step_in(&store, StepStatus::Intended).await;
    let unknown = store
        .settle_step(
            run.id,
            0,
            Outcome {
                from: StepStatus::Intended,
                to: StepStatus::Unknown,
                external_ref: None,
                result: None,
                error: Some("504 from the gateway".into()),
            },
            Durability::Lazy,
            &agent(),
        )
        .await
        .unwrap();
    assert_eq!(unknown.error.as_deref(), Some("504 from the gateway"));
    let confirmed = store
        .settle_step(
            run.id,
            0,
            Outcome {
                from: StepStatus::Unknown,
                to: StepStatus::Confirmed,
                external_ref: Some("pi_3Nabc".into()),
                result: Some(json!({"id": "pi_3Nabc", "status": "requires_capture"})),
                error: None,
            },
            Durability::Lazy,
            &Actor::System,
        )
        .await
        .unwrap();
    assert_eq!(confirmed.external_ref.as_deref(), Some("pi_3Nabc"));
    assert_eq!(confirmed.result.unwrap()["status"], "requires_capture");
    assert_eq!(confirmed.args, json!({"amount": 1200, "currency": "eur"}));
}

async fn every_run_transition_is_judged(store: Store) {
    use RunStatus::*;
    let paths: [(RunStatus, &[RunStatus]); 8] = [
        (Running, &[]),
        (AwaitingApproval, &[AwaitingApproval]),
        (Committing, &[AwaitingApproval, Committing]),
        (Completed, &[Completed]),
        (Rejected, &[AwaitingApproval, Rejected]),
        (Unwinding, &[Unwinding]),
        (Unwound, &[Unwinding, Unwound]),
        (NeedsAttention, &[NeedsAttention]),
    ];
    for (from, path) in paths {
        for to in RunStatus::ALL {
            let mut run = new_run(&store, None).await;
            for &next in path {
                run = store
                    .move_run(run.id, run.status, next, &agent(), None)
                    .await
                    .unwrap();
            }
            assert_eq!(run.status, from);
            let legal = check_run_transition(from, to, run.resume_to).is_ok();
            let result = store
                .move_run(run.id, from, to, &lead(), Some("contract"))
                .await;
            let after = store.run(run.id).await.unwrap().unwrap();
            if legal {
                assert_eq!(
                    result
                        .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"))
                        .status,
                    to
                );
                assert_eq!(after.status, to);
            } else {
                assert!(
                    matches!(result, Err(StoreError::IllegalTransition(_))),
                    "{from} -> {to} accepted"
                );
                assert_eq!(after.status, from);
            }
        }
    }
}

async fn needs_attention_returns_to_where_the_run_was(store: Store) {
    use RunStatus::*;
    let run = new_run(&store, None).await;
    store
        .move_run(run.id, Running, AwaitingApproval, &agent(), None)
        .await
        .unwrap();
    store
        .move_run(run.id, AwaitingApproval, Committing, &lead(), None)
        .await
        .unwrap();
    let held = store
        .move_run(
            run.id,
            Committing,
            NeedsAttention,
            &Actor::System,
            Some("did this happen?"),
        )
        .await
        .unwrap();
    assert_eq!(held.resume_to, Some(Committing));
    let err = store
        .move_run(run.id, NeedsAttention, Running, &lead(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::IllegalTransition(_)), "{err}");
    let back = store
        .move_run(run.id, NeedsAttention, Committing, &lead(), None)
        .await
        .unwrap();
    assert_eq!(back.status, Committing);
    assert_eq!(back.resume_to, None);
    let err = store
        .move_run(run.id, Running, Completed, &agent(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Stale { .. }), "{err}");
}

async fn r9_irreversible_steps_before_the_pivot_are_counted(store: Store) {
    let run = new_run(&store, None).await;
    store
        .record_step(
            step(
                &run,
                0,
                "email.send",
                ToolClass::Irreversible,
                StepStatus::AwaitingApproval,
            ),
            &agent(),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .run(run.id)
            .await
            .unwrap()
            .unwrap()
            .irreversible_before_pivot,
        0,
        "held, not run"
    );
    let approved = store
        .settle_step(
            run.id,
            0,
            Outcome::moving(StepStatus::AwaitingApproval, StepStatus::Intended),
            Durability::Durable,
            &lead(),
        )
        .await
        .unwrap();
    assert!(approved.approved_individually);
    assert_eq!(
        store
            .run(run.id)
            .await
            .unwrap()
            .unwrap()
            .irreversible_before_pivot,
        1
    );
    // A rejected one never ran; one after the pivot is the plan working.
    store
        .record_step(
            step(
                &run,
                1,
                "email.send",
                ToolClass::Irreversible,
                StepStatus::AwaitingApproval,
            ),
            &agent(),
        )
        .await
        .unwrap();
    store
        .settle_step(
            run.id,
            1,
            Outcome::moving(StepStatus::AwaitingApproval, StepStatus::Rejected),
            Durability::Durable,
            &lead(),
        )
        .await
        .unwrap();
    let mut commit = step(
        &run,
        2,
        "email.send",
        ToolClass::Irreversible,
        StepStatus::Intended,
    );
    commit.phase = Phase::AfterPivot;
    store.record_step(commit, &Actor::System).await.unwrap();
    assert_eq!(
        store
            .run(run.id)
            .await
            .unwrap()
            .unwrap()
            .irreversible_before_pivot,
        1
    );
}

async fn r8_compensations_have_their_own_key_and_lifecycle(store: Store) {
    let (run, _) = step_in(&store, StepStatus::Intended).await;
    let new = NewCompensation {
        run_id: run.id,
        step_idx: 0,
        tool: "stripe.refund".into(),
        idempotency_key: compensation_key(run.id, 0, "stripe.charge"),
        args: json!({"charge_key": step_key(run.id, 0, "stripe.charge")}),
    };
    let err = store
        .record_compensation(new.clone(), &Actor::System)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("only a confirmed step is compensated"),
        "{err}"
    );
    store
        .settle_step(
            run.id,
            0,
            Outcome::moving(StepStatus::Intended, StepStatus::Confirmed),
            Durability::Lazy,
            &agent(),
        )
        .await
        .unwrap();
    let intended = store
        .record_compensation(new.clone(), &Actor::System)
        .await
        .unwrap();
    assert_eq!(intended.status, StepStatus::Intended);
    let err = store
        .record_compensation(new, &Actor::System)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err}");
    let err = store
        .settle_compensation(
            run.id,
            0,
            Outcome::moving(StepStatus::Confirmed, StepStatus::Compensated),
            Durability::Lazy,
            &Actor::System,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::IllegalTransition(_)), "{err}");
    store
        .settle_compensation(
            run.id,
            0,
            Outcome::moving(StepStatus::Intended, StepStatus::Unknown),
            Durability::Lazy,
            &Actor::System,
        )
        .await
        .unwrap();
    assert_eq!(
        store.step(run.id, 0).await.unwrap().unwrap().status,
        StepStatus::Confirmed
    );
    let done = store
        .settle_compensation(
            run.id,
            0,
            Outcome {
                from: StepStatus::Unknown,
                to: StepStatus::Confirmed,
                external_ref: Some("re_1".into()),
                result: None,
                error: None,
            },
            Durability::Durable,
            &Actor::System,
        )
        .await
        .unwrap();
    assert_eq!(done.external_ref.as_deref(), Some("re_1"));
    assert_eq!(
        store.step(run.id, 0).await.unwrap().unwrap().status,
        StepStatus::Compensated
    );
    assert_eq!(store.compensations(run.id).await.unwrap(), vec![done]);
}

async fn pivot_approval_is_one_atomic_decision_on_the_plan_shown(store: Store) {
    let run = new_run(&store, None).await;
    let proposal = |digest: &str| NewApproval {
        run_id: run.id,
        kind: ApprovalKind::Pivot,
        step_idx: None,
        summary: "capture and notify".into(),
        plan: json!([{"tool": "stripe.capture", "args": {}}]),
        digest: digest.into(),
        expires_at: None,
        approvers_needed: 1,
    };
    let first = store
        .request_approval(
            proposal("d1"),
            Some((RunStatus::Running, RunStatus::AwaitingApproval)),
            &agent(),
        )
        .await
        .unwrap();
    let second = store
        .request_approval(proposal("d2"), None, &agent())
        .await
        .unwrap();
    assert_eq!(
        store.approval(first.id).await.unwrap().unwrap().status,
        ApprovalStatus::Superseded
    );
    let stored = store.run(run.id).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::AwaitingApproval);
    assert_eq!(stored.pivot_approval_id, Some(second.id));
    assert_eq!(
        store.pending_approvals().await.unwrap(),
        vec![second.clone()]
    );
    let decision = |digest: &str| Decision {
        approval_id: second.id,
        digest: digest.into(),
        to: ApprovalStatus::Approved,
        note: None,
        run_move: Some((RunStatus::AwaitingApproval, RunStatus::Committing)),
    };
    let err = store
        .decide_approval(decision("d1"), &lead())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::PlanChanged), "{err}");
    assert_eq!(
        store.run(run.id).await.unwrap().unwrap().status,
        RunStatus::AwaitingApproval
    );
    let approved = store
        .decide_approval(decision("d2"), &lead())
        .await
        .unwrap();
    assert_eq!(approved.status, ApprovalStatus::Approved);
    assert_eq!(approved.decided_by, Some(Actor::User("dana".into())));
    assert_eq!(
        store.run(run.id).await.unwrap().unwrap().status,
        RunStatus::Committing
    );
    // A second click finds it done and moves nothing.
    let replay = store
        .decide_approval(decision("d2"), &lead())
        .await
        .unwrap();
    assert_eq!(replay, approved);
    let err = store
        .decide_approval(
            Decision {
                approval_id: first.id,
                digest: "d1".into(),
                to: ApprovalStatus::Approved,
                note: None,
                run_move: None,
            },
            &lead(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::PlanChanged),
        "a superseded plan is a changed plan: {err}"
    );
    assert!(store.pending_approvals().await.unwrap().is_empty());
}

async fn r10_corrections_are_ranked_gated_and_sent_once(store: Store) {
    let run = new_run(&store, None).await;
    for idx in 0..3 {
        store
            .record_step(
                step(
                    &run,
                    idx,
                    "email.send",
                    ToolClass::Irreversible,
                    StepStatus::AwaitingApproval,
                ),
                &agent(),
            )
            .await
            .unwrap();
    }
    let queue = |idx: i64, audience: Audience| NewCorrection {
        run_id: run.id,
        step_idx: idx,
        source: CorrectionSource::Step,
        tool: "email.send".into(),
        audience,
        template: "We wrote to you in error; please disregard it.".into(),
        recipients: vec!["ana@example.com".into()],
        idempotency_key: correction_key(run.id, idx, "email.send"),
    };
    let internal = store
        .queue_correction(queue(0, Audience::Internal), &Actor::System)
        .await
        .unwrap();
    let customer = store
        .queue_correction(queue(1, Audience::Customer), &Actor::System)
        .await
        .unwrap();
    let public = store
        .queue_correction(queue(2, Audience::Public), &Actor::System)
        .await
        .unwrap();
    assert_eq!(
        store
            .queue_correction(queue(1, Audience::Customer), &Actor::System)
            .await
            .unwrap(),
        customer
    );
    let order: Vec<i64> = store
        .correction_queue()
        .await
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(order, vec![public.id, customer.id, internal.id]);
    assert_eq!(customer.message, customer.template);
    // The inbox reads the same queue, each with its run and logged call.
    let inbox = store.correction_inbox().await.unwrap();
    let ids: Vec<i64> = inbox.iter().map(|q| q.correction.id).collect();
    assert_eq!(ids, order);
    for queued in &inbox {
        assert_eq!(queued.run_title, "refund a double charge");
        let original = queued.original.as_ref().expect("the corrected step");
        assert_eq!(original.tool, "email.send");
        assert_eq!(original.args, json!({"amount": 1200, "currency": "eur"}));
    }

    let edited = store
        .edit_correction(customer.id, "Sorry: ignore our last email.", &lead())
        .await
        .unwrap();
    assert_eq!(edited.message, "Sorry: ignore our last email.");
    let err = store
        .move_correction(
            internal.id,
            CorrectionStatus::Pending,
            CorrectionStatus::Dismissed,
            None,
            &lead(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("needs a reason"), "{err}");
    let dismissed = store
        .move_correction(
            internal.id,
            CorrectionStatus::Pending,
            CorrectionStatus::Dismissed,
            Some("only the team saw it"),
            &lead(),
        )
        .await
        .unwrap();
    assert_eq!(
        dismissed.dismiss_reason.as_deref(),
        Some("only the team saw it")
    );

    let err = store
        .settle_correction_send(
            customer.id,
            Outcome::moving(StepStatus::NotExecuted, StepStatus::Intended),
            Durability::Durable,
            &lead(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Stale { .. }),
        "unsigned correction sent: {err}"
    );
    store
        .move_correction(
            customer.id,
            CorrectionStatus::Pending,
            CorrectionStatus::Approved,
            None,
            &lead(),
        )
        .await
        .unwrap();
    let err = store
        .edit_correction(customer.id, "changed after sign-off", &lead())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("only a pending correction"),
        "{err}"
    );
    let err = store
        .move_correction(
            customer.id,
            CorrectionStatus::Approved,
            CorrectionStatus::Sent,
            None,
            &lead(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");

    for (from, to) in [
        (StepStatus::NotExecuted, StepStatus::Intended),
        (StepStatus::Intended, StepStatus::Unknown),
    ] {
        store
            .settle_correction_send(
                customer.id,
                Outcome::moving(from, to),
                Durability::Durable,
                &lead(),
            )
            .await
            .unwrap();
    }
    let unknown = store
        .corrections(run.id)
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.id == customer.id)
        .unwrap();
    assert_eq!(unknown.status, CorrectionStatus::Approved);
    assert_eq!(unknown.send_status, Some(StepStatus::Unknown));
    let err = store
        .settle_correction_send(
            customer.id,
            Outcome::moving(StepStatus::NotExecuted, StepStatus::Intended),
            Durability::Durable,
            &lead(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Stale { .. }),
        "an unknown send was sent again: {err}"
    );
    let sent = store
        .settle_correction_send(
            customer.id,
            Outcome {
                from: StepStatus::Unknown,
                to: StepStatus::Confirmed,
                external_ref: Some("<msg-1@saga>".into()),
                result: None,
                error: None,
            },
            Durability::Durable,
            &lead(),
        )
        .await
        .unwrap();
    assert_eq!(sent.status, CorrectionStatus::Sent);
    assert_eq!(sent.message, "Sorry: ignore our last email.");
    let left: Vec<i64> = store
        .correction_queue()
        .await
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(left, vec![public.id]);
}

async fn every_change_is_in_the_audit_trail(store: Store) {
    let (run, _) = step_in(&store, StepStatus::Confirmed).await;
    store
        .move_run(
            run.id,
            RunStatus::Running,
            RunStatus::Unwinding,
            &lead(),
            Some("wrong customer"),
        )
        .await
        .unwrap();
    let events = store.events(Some(run.id), 100).await.unwrap();
    let lines: Vec<(String, String, Option<String>, Option<String>)> = events
        .iter()
        .map(|e| {
            (
                e.entity.to_string(),
                e.actor.to_string(),
                e.from_status.clone(),
                e.to_status.clone(),
            )
        })
        .collect();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        lines,
        vec![
            ("run".into(), "agent:support-bot".into(), None, s("RUNNING")),
            (
                "step".into(),
                "agent:support-bot".into(),
                None,
                s("INTENDED")
            ),
            (
                "step".into(),
                "agent:support-bot".into(),
                s("INTENDED"),
                s("CONFIRMED")
            ),
            (
                "run".into(),
                "user:dana".into(),
                s("RUNNING"),
                s("UNWINDING")
            ),
        ]
    );
    assert_eq!(
        events.last().unwrap().detail.as_deref(),
        Some("wrong customer")
    );
    assert!(events
        .windows(2)
        .all(|w| w[0].id < w[1].id && w[0].at <= w[1].at));

    // Across runs: newest first for the audit page, after an id for the
    // dashboard's live stream.
    let (other, _) = step_in(&store, StepStatus::Intended).await;
    let recent = store.recent_events(2).await.unwrap();
    assert_eq!(recent.len(), 2);
    assert!(recent[0].id > recent[1].id);
    assert_eq!(recent[0].run_id, Some(other.id));
    let after = store.all_events_after(events[1].id, 100).await.unwrap();
    assert_eq!(after.first().map(|e| e.id), Some(events[2].id));
    assert!(after.iter().any(|e| e.run_id == Some(other.id)));
    assert!(after.windows(2).all(|w| w[0].id < w[1].id));
}

async fn users_and_tokens(store: Store) {
    let user = store
        .add_user("dana", "$argon2id$stub-hash", Role::Approver)
        .await
        .unwrap();
    assert_eq!(user.role, Role::Approver);
    let err = store
        .add_user("dana", "$argon2id$other", Role::Admin)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate { .. }), "{err}");
    let creds = store.credentials("dana").await.unwrap().unwrap();
    assert_eq!(creds.password_hash, "$argon2id$stub-hash");
    assert!(store.credentials("nobody").await.unwrap().is_none());
    store
        .add_api_token("support-bot", "abc123", Some("laptop"))
        .await
        .unwrap();
    assert_eq!(
        store.agent_for_token("abc123").await.unwrap().as_deref(),
        Some("support-bot")
    );
    assert!(store.agent_for_token("abc124").await.unwrap().is_none());
}

/// The contract tests take the store as it is.
/// What a call reads first: the run and only its unsettled steps, in
/// order, or no run at all.
async fn a_claimed_run_comes_with_its_unsettled_steps(store: Store) {
    let actor = agent();
    let run = new_run(&store, None).await;
    for (idx, status) in [
        (0, StepStatus::Intended),
        (1, StepStatus::Intended),
        (2, StepStatus::AwaitingApproval),
    ] {
        store
            .record_step(
                step(&run, idx, "jira.create", ToolClass::Compensatable, status),
                &actor,
            )
            .await
            .unwrap();
    }
    store
        .settle_step(
            run.id,
            0,
            Outcome::moving(StepStatus::Intended, StepStatus::Confirmed),
            Durability::Lazy,
            &actor,
        )
        .await
        .unwrap();
    let claimed = store.claim_and_read(run.id).await.unwrap();
    assert_eq!(claimed.read.run.as_ref().unwrap().next_step, 3);
    let unsettled: Vec<_> = claimed
        .read
        .unsettled
        .iter()
        .map(|s| (s.step_idx, s.status))
        .collect();
    assert_eq!(
        unsettled,
        [(1, StepStatus::Intended), (2, StepStatus::AwaitingApproval)]
    );
    assert_eq!(
        claimed.read.unsettled,
        store.unsettled_steps(run.id).await.unwrap()
    );
    drop(claimed);
    let missing = store.claim_and_read(uuid::Uuid::new_v4()).await.unwrap();
    assert!(missing.read.run.is_none() && missing.read.unsettled.is_empty());
}

/// A bearer token the API has not looked up for this request is checked
/// by the intent itself: the step lands only while the token is issued to
/// the run's agent and not revoked, so a revocation (by any process)
/// refuses the very next call, and a refused intent writes nothing.
async fn a_new_step_lands_at_once_only_while_its_bearer_token_is_valid(store: Store) {
    let actor = agent();
    let run = new_run(&store, None).await;
    issue_tokens(&store).await;
    let hot = |idx: i64, token: &'static str| {
        let store = store.clone();
        let new = step(
            &run,
            idx,
            "jira.create",
            ToolClass::Compensatable,
            StepStatus::Intended,
        );
        let actor = actor.clone();
        async move {
            let bearer = Bearer {
                agent: "support-bot",
                token_to_check: Some(token),
            };
            store
                .claim_and_record_step(bearer, new, &actor)
                .await
                .unwrap()
        }
    };
    let nothing_written = |next_step: i64| {
        let store = store.clone();
        async move {
            assert_eq!(
                store.run(run.id).await.unwrap().unwrap().next_step,
                next_step
            );
            assert_eq!(store.steps(run.id).await.unwrap().len() as i64, next_step);
        }
    };
    assert!(
        hot(0, "hash-unknown").await.is_none(),
        "a token never issued"
    );
    assert!(
        hot(0, "hash-other").await.is_none(),
        "another agent's token"
    );
    nothing_written(0).await;

    let (mut claim, logged) = hot(0, "hash-live").await.expect("a live token");
    confirm_releasing(&*store, run.id, logged.step_idx, "PROJ-1", claim.as_mut()).await;
    drop(claim);
    nothing_written(1).await;

    assert_eq!(store.revoke_tokens("support-bot").await.unwrap(), 1);
    assert!(hot(1, "hash-live").await.is_none(), "a revoked token");
    nothing_written(1).await;
}

/// The hot path claims the run and writes a new step's intent in one
/// commit, only when the run is ready for that step: RUNNING, the agent's,
/// at its next index, with nothing unsettled and nothing owed to the
/// agent. Otherwise it writes nothing and the caller takes the general
/// path.
async fn a_new_step_is_claimed_and_recorded_at_once_only_on_a_ready_run(store: Store) {
    let actor = agent();
    let run = new_run(&store, None).await;
    let new = |idx| {
        step(
            &run,
            idx,
            "jira.create",
            ToolClass::Compensatable,
            StepStatus::Intended,
        )
    };
    let hot = |idx: i64, who: &'static str| {
        let store = store.clone();
        let new = new(idx);
        let actor = actor.clone();
        async move {
            store
                .claim_and_record_step(who.into(), new, &actor)
                .await
                .unwrap()
        }
    };
    assert!(hot(0, "another-bot").await.is_none(), "another agent's run");
    assert!(hot(1, "support-bot").await.is_none(), "a step out of order");
    assert_eq!(store.run(run.id).await.unwrap().unwrap().next_step, 0);
    assert!(store.steps(run.id).await.unwrap().is_empty());

    let (claim, logged) = hot(0, "support-bot").await.expect("a ready run");
    assert_eq!((logged.step_idx, logged.status), (0, StepStatus::Intended));
    assert_eq!(store.run(run.id).await.unwrap().unwrap().next_step, 1);
    let events = store.events(Some(run.id), 100).await.unwrap();
    assert!(events.iter().any(|e| e.entity.as_str() == "step"
        && e.entity_id == Some(0)
        && e.to_status.as_deref() == Some("INTENDED")));
    drop(claim);
    // Step 0 is still INTENDED: the next step waits for the general path.
    assert!(hot(1, "support-bot").await.is_none(), "an unsettled step");
    store
        .settle_step(
            run.id,
            0,
            Outcome::confirmed(StepStatus::Intended, "PROJ-1".into(), json!({})),
            Durability::Lazy,
            &actor,
        )
        .await
        .unwrap();
    store.set_owed_to_agent(run.id, 0, true).await.unwrap();
    assert!(
        hot(1, "support-bot").await.is_none(),
        "a step owed to the agent"
    );
    store.set_owed_to_agent(run.id, 0, false).await.unwrap();

    let (mut claim, logged) = hot(1, "support-bot").await.expect("ready again");
    let settled =
        confirm_releasing(&*store, run.id, logged.step_idx, "PROJ-2", claim.as_mut()).await;
    assert_eq!(settled.status, StepStatus::Confirmed);
    assert_eq!(settled.external_ref.as_deref(), Some("PROJ-2"));
    drop(claim);
    store
        .move_run(
            run.id,
            RunStatus::Running,
            RunStatus::NeedsAttention,
            &lead(),
            Some("paused"),
        )
        .await
        .unwrap();
    assert!(
        hot(2, "support-bot").await.is_none(),
        "a run that is not RUNNING"
    );
    assert_eq!(store.steps(run.id).await.unwrap().len(), 2);
}

/// The stale-step sweep's query: INTENDED and UNKNOWN steps old enough, in
/// runs of the given statuses, in run and step order; nothing else.
async fn stale_steps_are_the_old_unsettled_ones_of_live_runs(store: Store) {
    let actor = agent();
    let live = [RunStatus::Running, RunStatus::Unwinding];
    let mut runs = vec![new_run(&store, None).await, new_run(&store, None).await];
    runs.sort_by_key(|r| r.id.to_string());
    for run in &runs {
        for idx in 0..4 {
            store
                .record_step(
                    step(
                        run,
                        idx,
                        "jira.create",
                        ToolClass::Compensatable,
                        StepStatus::Intended,
                    ),
                    &actor,
                )
                .await
                .unwrap();
        }
        // 0 stays INTENDED, 1 becomes UNKNOWN, 2 CONFIRMED, 3 FAILED.
        for (idx, to) in [
            (1, StepStatus::Unknown),
            (2, StepStatus::Confirmed),
            (3, StepStatus::Failed),
        ] {
            store
                .settle_step(
                    run.id,
                    idx,
                    Outcome::moving(StepStatus::Intended, to),
                    Durability::Durable,
                    &actor,
                )
                .await
                .unwrap();
        }
    }
    let later = chrono::Utc::now() + chrono::Duration::seconds(1);
    let stale = store.stale_steps(later, &live).await.unwrap();
    let expected: Vec<(Uuid, i64)> = runs.iter().flat_map(|r| [(r.id, 0), (r.id, 1)]).collect();
    assert_eq!(stale, expected);
    // Too recent: nothing.
    let earlier = chrono::Utc::now() - chrono::Duration::seconds(60);
    assert!(store.stale_steps(earlier, &live).await.unwrap().is_empty());
    // A run in another status is not swept.
    assert!(store
        .stale_steps(later, &[RunStatus::Committing])
        .await
        .unwrap()
        .is_empty());
    assert!(store.stale_steps(later, &[]).await.unwrap().is_empty());
}

fn contract_store(store: Store) -> Store {
    store
}

async fn an_approvals_notice_is_written_once_and_kept_until_done(store: Store) {
    let (run, approval) =
        waiting_pivot(&store, "capture and notify", json!({"commit": []}), 1).await;
    assert_eq!(
        store.approvals_without_notice().await.unwrap(),
        vec![approval.clone()]
    );
    let new = NewNotice {
        approval_id: approval.id,
        run_id: run.id,
        place: saga_harness::saga::model::NoticePlace::Primary,
        idempotency_key: notice_key(
            run.id,
            approval.id,
            saga_harness::saga::model::NoticePlace::Primary,
        ),
        channel: "#support".into(),
    };
    let written = store.record_notice(new.clone()).await.unwrap();
    assert_eq!(written.status, NoticeStatus::Intended);
    assert_eq!(
        store.record_notice(new).await.unwrap(),
        written,
        "written once"
    );
    assert!(store.approvals_without_notice().await.unwrap().is_empty());

    let mut posted = written.clone();
    posted.status = NoticeStatus::Posted;
    posted.message_ref = Some("C0SUPPORT1:1712345678.000100".into());
    posted.shown = Some("digest-1".into());
    store.save_notice(&posted).await.unwrap();
    let open = store.open_notices().await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].message_ref, posted.message_ref);
    assert_eq!(open[0].shown.as_deref(), Some("digest-1"));
    posted.done = true;
    store.save_notice(&posted).await.unwrap();
    assert!(store.open_notices().await.unwrap().is_empty());
    assert!(store.notices(approval.id).await.unwrap()[0].done);
}

async fn a_signature_is_seen_once_until_it_is_forgotten(store: Store) {
    let now = chrono::Utc::now();
    let long_ago = now - chrono::Duration::hours(1);
    assert!(store.first_sighting("v0=aa", now, long_ago).await.unwrap());
    assert!(
        !store.first_sighting("v0=aa", now, long_ago).await.unwrap(),
        "a replay"
    );
    assert!(store.first_sighting("v0=bb", now, long_ago).await.unwrap());
    // Forgotten once older than the window: its timestamp is refused anyway.
    let later = now + chrono::Duration::minutes(20);
    assert!(store
        .first_sighting("v0=aa", later, later - chrono::Duration::minutes(10))
        .await
        .unwrap());
}

async fn under_the_two_person_rule_the_first_approval_waits_and_one_rejection_ends_it(
    store: Store,
) {
    let (run, approval) = waiting_pivot(&store, "refund $900", json!({"commit": []}), 2).await;
    let decision = |to: ApprovalStatus| Decision {
        approval_id: approval.id,
        digest: "d1".into(),
        to,
        note: None,
        run_move: Some((RunStatus::AwaitingApproval, RunStatus::Committing)),
    };
    let first = store
        .decide_approval(decision(ApprovalStatus::Approved), &lead())
        .await
        .unwrap();
    assert_eq!(first.status, ApprovalStatus::Pending, "one of two");
    assert_eq!(first.first_approver, Some(Actor::User("dana".into())));
    assert_eq!(
        store.run(run.id).await.unwrap().unwrap().status,
        RunStatus::AwaitingApproval,
        "the run does not move on one approval"
    );
    let again = store
        .decide_approval(decision(ApprovalStatus::Approved), &lead())
        .await;
    assert!(matches!(again, Err(StoreError::Invalid(_))), "{again:?}");
    let rejected = store
        .decide_approval(
            Decision {
                run_move: Some((RunStatus::AwaitingApproval, RunStatus::Rejected)),
                ..decision(ApprovalStatus::Rejected)
            },
            &Actor::User("sam".into()),
        )
        .await
        .unwrap();
    assert_eq!(
        rejected.status,
        ApprovalStatus::Rejected,
        "one rejection ends it"
    );
    assert_eq!(
        store.run(run.id).await.unwrap().unwrap().status,
        RunStatus::Rejected
    );
}

async fn an_edit_replaces_a_waiting_plan_only_if_it_is_the_one_edited(store: Store) {
    let (run, approval) = waiting_pivot(
        &store,
        "refund $900",
        json!({"commit": [{"step": 1, "args": {"amount": 900}}]}),
        2,
    )
    .await;
    let approve = |digest: &str| Decision {
        approval_id: approval.id,
        digest: digest.into(),
        to: ApprovalStatus::Approved,
        note: None,
        run_move: Some((RunStatus::AwaitingApproval, RunStatus::Committing)),
    };
    let first = store.decide_approval(approve("d1"), &lead()).await.unwrap();
    assert_eq!(first.first_approver, Some(Actor::User("dana".into())));
    let change = |digest_before: &str, digest: &str, amount: i64| PlanChange {
        approval_id: approval.id,
        digest_before: digest_before.into(),
        plan: json!({"commit": [{"step": 1, "args": {"amount": amount}}]}),
        digest: digest.into(),
        approvers_needed: 1,
        detail: format!("amount 900 -> {amount}"),
    };
    let stale = store.edit_plan(change("d0", "d2", 90), &lead()).await;
    assert!(matches!(stale, Err(StoreError::PlanChanged)), "{stale:?}");
    let edited = store
        .edit_plan(change("d1", "d2", 90), &lead())
        .await
        .unwrap();
    assert_eq!(edited.digest, "d2");
    assert_eq!(edited.plan["commit"][0]["args"]["amount"], 90);
    assert_eq!(edited.status, ApprovalStatus::Pending);
    assert_eq!(edited.approvers_needed, 1);
    assert_eq!(
        edited.first_approver, None,
        "a first approval was of the old plan"
    );
    let old_button = store.decide_approval(approve("d1"), &lead()).await;
    assert!(
        matches!(old_button, Err(StoreError::PlanChanged)),
        "{old_button:?}"
    );
    let events = store.events(Some(run.id), 50).await.unwrap();
    assert!(events.iter().any(|e| e.entity.as_str() == "approval"
        && e.actor == Actor::User("dana".into())
        && e.detail.as_deref() == Some("amount 900 -> 90")));
    let decided = store.decide_approval(approve("d2"), &lead()).await.unwrap();
    assert_eq!(decided.status, ApprovalStatus::Approved);
    let late = store.edit_plan(change("d2", "d3", 9), &lead()).await;
    assert!(matches!(late, Err(StoreError::Invalid(_))), "{late:?}");
    assert_eq!(
        store.approval(approval.id).await.unwrap().unwrap().digest,
        "d2"
    );
}

async fn runs_are_found_by_label_purpose_agent_or_an_argument(store: Store) {
    let grace = new_run(&store, Some("ticket-77")).await;
    store
        .record_step(
            NewStep {
                args: json!({"customer": "cus_Grace", "amount": 3200}),
                ..step(
                    &grace,
                    0,
                    "stripe.charge",
                    ToolClass::Compensatable,
                    StepStatus::Intended,
                )
            },
            &agent(),
        )
        .await
        .unwrap();
    let (percent, _) = store
        .create_run(NewRun {
            agent: "billing-bot".into(),
            label: Some("refund 100% of ord_5".into()),
            purpose: "a full refund".into(),
        })
        .await
        .unwrap();
    let other = new_run(&store, Some("ticket-78")).await;
    let found = |search: &'static str| {
        let store = store.clone();
        async move {
            let page = store.runs_page(None, search, 0, 10).await.unwrap();
            assert_eq!(page.total as usize, page.runs.len(), "{search}");
            let mut ids: Vec<Uuid> = page.runs.into_iter().map(|(r, _)| r.id).collect();
            ids.sort();
            ids
        }
    };
    let sorted = |mut ids: Vec<Uuid>| {
        ids.sort();
        ids
    };
    // A customer's id in a call's arguments, in any case.
    assert_eq!(found("CUS_grace").await, vec![grace.id]);
    assert_eq!(found("ticket-7").await, sorted(vec![grace.id, other.id]));
    assert_eq!(found("billing").await, vec![percent.id]);
    // A page's steps in one read.
    let steps = store
        .steps_of_runs(&[grace.id, other.id, percent.id], &["stripe.charge"])
        .await
        .unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].args["customer"], "cus_Grace");
    assert!(store
        .steps_of_runs(&[grace.id], &["create_ticket"])
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .steps_of_runs(&[], &["stripe.charge"])
        .await
        .unwrap()
        .is_empty());
    // LIKE's wildcards are taken as the characters they are.
    assert_eq!(found("100%").await, vec![percent.id]);
    assert_eq!(found("0%").await, vec![percent.id]);
    assert!(found("ticket_7").await.is_empty());
    assert_eq!(found("  ").await.len(), 3, "a blank search finds every run");
    // No stored text holds a NUL (PostgreSQL keeps none): a search with
    // one finds nothing rather than failing.
    assert!(found("ticket\0").await.is_empty());
    assert!(found("\0").await.is_empty());
    // The status filter and the search together.
    let running = store
        .runs_page(Some(RunStatus::Unwound), "ticket", 0, 10)
        .await
        .unwrap();
    assert_eq!(running.total, 0);
}

async fn an_unwinds_reason_is_found_per_run(store: Store) {
    let unwound = new_run(&store, None).await;
    let never = new_run(&store, None).await;
    store
        .move_run(
            unwound.id,
            RunStatus::Running,
            RunStatus::Unwinding,
            &lead(),
            Some("charged the wrong customer"),
        )
        .await
        .unwrap();
    let reasons = store.unwind_reasons(&[unwound.id, never.id]).await.unwrap();
    assert_eq!(reasons.len(), 1);
    let why = &reasons[&unwound.id];
    assert_eq!(why.detail.as_deref(), Some("charged the wrong customer"));
    assert_eq!(why.actor, lead());
    assert!(store.unwind_reasons(&[]).await.unwrap().is_empty());
}

common::on_both_backends!(
    contract_store;
    runs_are_found_by_label_purpose_agent_or_an_argument,
    an_unwinds_reason_is_found_per_run,
    runs_are_created_once_per_agent_label,
    the_runs_list_puts_waiting_runs_first_and_pages,
    r3_steps_take_the_next_index_in_order,
    r2_pure_calls_are_never_logged,
    every_step_transition_is_judged,
    a_stale_status_is_refused_and_changes_nothing,
    r4_outcomes_keep_what_was_learnt,
    every_run_transition_is_judged,
    needs_attention_returns_to_where_the_run_was,
    r9_irreversible_steps_before_the_pivot_are_counted,
    r8_compensations_have_their_own_key_and_lifecycle,
    pivot_approval_is_one_atomic_decision_on_the_plan_shown,
    r10_corrections_are_ranked_gated_and_sent_once,
    every_change_is_in_the_audit_trail,
    users_and_tokens,
    a_claimed_run_comes_with_its_unsettled_steps,
    a_new_step_is_claimed_and_recorded_at_once_only_on_a_ready_run,
    a_new_step_lands_at_once_only_while_its_bearer_token_is_valid,
    stale_steps_are_the_old_unsettled_ones_of_live_runs,
    an_approvals_notice_is_written_once_and_kept_until_done,
    under_the_two_person_rule_the_first_approval_waits_and_one_rejection_ends_it,
    a_signature_is_seen_once_until_it_is_forgotten,
    an_edit_replaces_a_waiting_plan_only_if_it_is_the_one_edited,
);

#[tokio::test]
async fn sqlite_a_second_harness_on_the_same_file_is_refused() {
    let db = common::sqlite();
    let _first = saga_harness::store::open(&db.url).await.unwrap();
    let Err(err) = saga_harness::store::open(&db.url).await else {
        panic!("second open accepted");
    };
    let message = err.to_string();
    assert!(
        message.contains("in use by another saga-harness process"),
        "{message}"
    );
    assert!(message.contains("PostgreSQL"), "{message}");
}

/// Two harness instances' stores on one PostgreSQL database.
async fn two_instances(url: &str) -> (Store, Store) {
    let open = || async { saga_harness::store::open(url).await.unwrap().saga_store() };
    (open().await, open().await)
}

#[tokio::test]
async fn postgres_several_instances_share_one_database() {
    let db = crate::common::postgres_or_skip!();
    let (a, b) = two_instances(&db.url).await;
    let run = new_run(&a, Some("shared")).await;
    assert_eq!(new_run(&b, Some("shared")).await.id, run.id);
    // Both instances race for the same step index: exactly one wins.
    let actor = agent();
    let (ra, rb) = tokio::join!(
        a.record_step(
            step(
                &run,
                0,
                "jira.create",
                ToolClass::Compensatable,
                StepStatus::Intended
            ),
            &actor
        ),
        b.record_step(
            step(
                &run,
                0,
                "jira.create",
                ToolClass::Compensatable,
                StepStatus::Intended
            ),
            &actor
        ),
    );
    assert_eq!(ra.is_ok() as u8 + rb.is_ok() as u8, 1, "{ra:?} {rb:?}");
    assert_eq!(a.run(run.id).await.unwrap().unwrap().next_step, 1);
}

/// The run claim across instances: exclusive while held, free again once
/// dropped, and free again when a caller gives up while still waiting for
/// it (an agent that hangs up mid-call must not leave the run locked).
#[tokio::test]
async fn postgres_run_claims_are_exclusive_and_never_left_behind() {
    let db = crate::common::postgres_or_skip!();
    let (a, b) = two_instances(&db.url).await;
    let run = new_run(&a, Some("claimed")).await;
    let wait = std::time::Duration::from_millis(300);
    let held = a.claim_run(run.id).await.unwrap();
    assert!(
        tokio::time::timeout(wait, b.claim_run(run.id))
            .await
            .is_err(),
        "a second instance claimed a run that was held"
    );
    // Another run is not blocked by this one.
    let other = new_run(&a, Some("other")).await;
    tokio::time::timeout(wait, b.claim_run(other.id))
        .await
        .expect("an unrelated run waited for this run's claim")
        .unwrap();
    drop(held);
    let again = tokio::time::timeout(std::time::Duration::from_secs(5), b.claim_run(run.id))
        .await
        .expect("a dropped claim was not released")
        .unwrap();
    drop(again);
    // A claim that waited reads what the previous holder wrote while it
    // waited: its reads come after the lock, not from before the wait.
    let held = a.claim_run(run.id).await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        let id = run.id;
        async move { b.claim_and_read(id).await }
    });
    tokio::time::sleep(wait).await;
    let actor = agent();
    a.record_step(
        step(
            &run,
            0,
            "jira.create",
            ToolClass::Compensatable,
            StepStatus::Intended,
        ),
        &actor,
    )
    .await
    .unwrap();
    drop(held);
    let claimed = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the waiting claim never got the run")
        .unwrap()
        .unwrap();
    assert_eq!(claimed.read.run.as_ref().unwrap().next_step, 1);
    assert_eq!(claimed.read.unsettled.len(), 1);
    assert_eq!(claimed.read.unsettled[0].status, StepStatus::Intended);
    drop(claimed);
    // Give up while waiting, several times over: each abandoned wait must
    // not end up holding the run.
    let held = a.claim_run(run.id).await.unwrap();
    for _ in 0..3 {
        let gave_up =
            tokio::time::timeout(std::time::Duration::from_millis(50), b.claim_run(run.id));
        assert!(gave_up.await.is_err());
    }
    drop(held);
    for store in [&a, &b] {
        let claim =
            tokio::time::timeout(std::time::Duration::from_secs(5), store.claim_run(run.id))
                .await
                .expect("an abandoned wait left the run claimed")
                .unwrap();
        drop(claim);
    }
}

/// On PostgreSQL the hot path's claim is a lease taken by the intent's own
/// statement, and the outcome gives it back in its own statement: another
/// instance is kept out while the call is out and finds the run free the
/// moment the outcome is written, without waiting for the claim's drop. An
/// outcome written after the lease passed to someone else leaves their
/// lease alone.
#[tokio::test]
async fn postgres_the_hot_path_leases_with_the_intent_and_releases_with_the_outcome() {
    let db = crate::common::postgres_or_skip!();
    let (a, b) = two_instances(&db.url).await;
    let actor = agent();
    let run = new_run(&a, Some("hot")).await;
    let new = |idx| {
        step(
            &run,
            idx,
            "jira.create",
            ToolClass::Compensatable,
            StepStatus::Intended,
        )
    };
    let owner = || lease_owner(&db.url, run.id);
    let (mut claim, logged) = a
        .claim_and_record_step("support-bot".into(), new(0), &actor)
        .await
        .unwrap()
        .expect("a ready run");
    assert!(owner().await.is_some(), "the intent took no lease");
    assert!(
        b.try_claim_run(run.id).await.unwrap().is_none(),
        "another instance claimed a run whose step is out"
    );
    let settled = confirm_releasing(&*a, run.id, logged.step_idx, "PROJ-1", claim.as_mut()).await;
    assert_eq!(settled.status, StepStatus::Confirmed);
    assert_eq!(owner().await, None, "the outcome kept the lease");
    let taken = b
        .try_claim_run(run.id)
        .await
        .unwrap()
        .expect("the run was not free once the outcome was written");
    drop(claim);
    drop(taken);
    // The other instance's claim is released off its caller's path.
    common::until("the other instance's release", || async {
        owner().await.is_none().then_some(())
    })
    .await;

    // A holder that outlived its lease: someone else holds the run now.
    let (mut late, logged) = a
        .claim_and_record_step("support-bot".into(), new(1), &actor)
        .await
        .unwrap()
        .expect("ready again");
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    sqlx::query(
        "UPDATE runs SET lease_owner = 'other-instance/1',
            lease_until = clock_timestamp() + interval '1 minute' WHERE id = $1",
    )
    .bind(run.id.to_string())
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    confirm_releasing(&*a, run.id, logged.step_idx, "PROJ-2", late.as_mut()).await;
    assert_eq!(
        owner().await.as_deref(),
        Some("other-instance/1"),
        "a late outcome released another holder's lease"
    );
}

/// Group commit on PostgreSQL: the hot path's step writes of many runs,
/// waiting at once, go to the database as one statement with one commit
/// (the intents with their leases, then the outcomes giving the leases
/// back), and each caller gets its own step, its audit lines and its
/// lease taken and given back.
#[tokio::test]
async fn postgres_step_writes_of_many_runs_share_one_statement_and_commit() {
    let db = crate::common::postgres_or_skip!();
    step_writes_share_one_statement(&db, Default::default()).await;
}

/// The same behind a transaction-pooling PgBouncer.
#[tokio::test]
async fn postgres_step_writes_share_one_statement_behind_pgbouncer() {
    let Some(db) = common::postgres_via_pgbouncer().await else {
        return;
    };
    let settings = saga_harness::store::StoreSettings {
        pg_transaction_pooler: true,
        ..Default::default()
    };
    step_writes_share_one_statement(&db, settings).await;
}

/// A PostgreSQL store on `db` (behind its pooler when `settings` says so,
/// after migrating the database itself, as `saga-harness migrate` would).
async fn open_postgres(
    db: &common::TestDb,
    settings: saga_harness::store::StoreSettings,
) -> Arc<saga_harness::store::postgres::PostgresStore> {
    use saga_harness::store::postgres::PostgresStore;
    if settings.pg_transaction_pooler {
        let direct = PostgresStore::open(&db.direct_url, &Default::default())
            .await
            .unwrap();
        direct.session_pool().close().await;
    }
    Arc::new(PostgresStore::open(&db.url, &settings).await.unwrap())
}

async fn step_writes_share_one_statement(
    db: &common::TestDb,
    settings: saga_harness::store::StoreSettings,
) {
    let url = db.direct_url.as_str();
    let pg = open_postgres(db, settings).await;
    let store: Store = pg.clone();
    let mut runs = Vec::new();
    for _ in 0..12 {
        runs.push(new_run(&store, None).await);
    }
    let intents = runs
        .iter()
        .map(|run| (first_step(run), "support-bot".into()));
    let (results, before, after) = intents_held_then_let_go(&pg, intents.collect()).await;
    let mut claimed = Vec::new();
    for result in results {
        let (claim, step) = result.unwrap().expect("a ready run");
        assert_eq!(step.status, StepStatus::Intended);
        claimed.push((claim, step));
    }
    assert_eq!(
        after.groups - before.groups,
        statements_for_held_writes(),
        "{before:?} → {after:?}"
    );
    assert_eq!(after.jobs - before.jobs, runs.len() as u64);
    for ((_, step), run) in claimed.iter().zip(&runs) {
        assert_eq!(step.run_id, run.id, "a caller got another run's step");
        assert!(
            lease_owner(url, run.id).await.is_some(),
            "the intent took no lease"
        );
        assert_eq!(store.run(run.id).await.unwrap().unwrap().next_step, 1);
    }

    // Their outcomes, waiting at once, go together and give the leases back.
    let held = hold_the_pool(&pg).await;
    let before = pg.commit_groups();
    let mut settles = Vec::new();
    for (i, (mut claim, step)) in claimed.into_iter().enumerate() {
        let store = store.clone();
        settles.push(tokio::spawn(async move {
            store
                .settle_step_and_release(
                    step.run_id,
                    step.step_idx,
                    Outcome::confirmed(StepStatus::Intended, format!("PROJ-{i}"), json!({"i": i})),
                    Durability::Lazy,
                    &agent(),
                    claim.as_mut(),
                )
                .await
        }));
    }
    while pg.commit_groups().sent < before.sent + runs.len() as u64 {
        tokio::task::yield_now().await;
    }
    drop(held);
    for (i, (settle, run)) in settles.into_iter().zip(&runs).enumerate() {
        let settled = settle.await.unwrap().unwrap();
        assert_eq!(settled.run_id, run.id);
        assert_eq!(settled.status, StepStatus::Confirmed);
        assert_eq!(
            settled.external_ref.as_deref(),
            Some(format!("PROJ-{i}").as_str())
        );
        assert_eq!(settled.result, Some(json!({"i": i})));
        assert_eq!(
            lease_owner(url, run.id).await,
            None,
            "the outcome kept the lease"
        );
        let lines: Vec<_> = store
            .events(Some(run.id), 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.entity.as_str() == "step")
            .map(|e| (e.from_status, e.to_status))
            .collect();
        assert_eq!(lines.len(), 2, "run {i}: {lines:?}");
    }
    let after = pg.commit_groups();
    assert_eq!(
        after.groups - before.groups,
        statements_for_held_writes(),
        "{before:?} → {after:?}"
    );
}

/// How many statements carry a burst of writes that waited for the pool:
/// the first ones, one a free group slot, go at once (each waiting for a
/// connection on its own), and all the others in one group after them.
fn statements_for_held_writes() -> u64 {
    saga_harness::store::postgres::GROUPS_IN_FLIGHT as u64 + 1
}

/// One refused write in a group (a key already in the log) refuses that
/// write alone: the group's others land, the refused run has no step and
/// no audit line, and a run that is not ready is sent down the general
/// path (no claim), not refused.
#[tokio::test]
async fn postgres_a_refused_step_write_in_a_group_refuses_only_itself() {
    let db = crate::common::postgres_or_skip!();
    let pg = open_postgres(&db, Default::default()).await;
    let store: Store = pg.clone();
    let earlier = new_run(&store, None).await;
    let taken = store
        .record_step(
            step(
                &earlier,
                0,
                "jira.create",
                ToolClass::Compensatable,
                StepStatus::Intended,
            ),
            &agent(),
        )
        .await
        .unwrap();
    let mut runs = Vec::new();
    for _ in 0..8 {
        runs.push(new_run(&store, None).await);
    }
    let intents = runs.iter().enumerate().map(|(i, run)| {
        let mut new = first_step(run);
        if i == 3 {
            new.idempotency_key = taken.idempotency_key.clone();
        }
        if i == 5 {
            new.step_idx = 4;
        }
        (new, "support-bot".into())
    });
    let (results, _, _) = intents_held_then_let_go(&pg, intents.collect()).await;
    for (i, (result, run)) in results.into_iter().zip(&runs).enumerate() {
        let next_step = store.run(run.id).await.unwrap().unwrap().next_step;
        let step_lines = store
            .events(Some(run.id), 100)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.entity.as_str() == "step")
            .count();
        match i {
            3 => {
                assert!(
                    matches!(result, Err(StoreError::Duplicate { .. })),
                    "{:?}",
                    result.map(|r| r.map(|(_, s)| s))
                );
                assert_eq!((next_step, step_lines), (0, 0), "run {i}");
                assert_eq!(lease_owner(&db.url, run.id).await, None);
            }
            5 => {
                assert!(
                    matches!(result, Ok(None)),
                    "run {i}: not ready, not claimed"
                );
                assert_eq!((next_step, step_lines), (0, 0), "run {i}");
            }
            _ => {
                let (_claim, step) = result.unwrap().expect("a ready run");
                assert_eq!((step.run_id, step.step_idx), (run.id, 0));
                assert_eq!((next_step, step_lines), (1, 1), "run {i}");
            }
        }
    }
}

/// Each intent of a group checks its own bearer token: those whose token is
/// another agent's write nothing and go down the general path, the others
/// land, alone or grouped alike.
#[tokio::test]
async fn postgres_each_intent_of_a_group_checks_its_own_bearer_token() {
    let db = crate::common::postgres_or_skip!();
    let pg = open_postgres(&db, Default::default()).await;
    let store: Store = pg.clone();
    issue_tokens(&store).await;
    let mut runs = Vec::new();
    for _ in 0..8 {
        runs.push(new_run(&store, None).await);
    }
    let intents = runs.iter().enumerate().map(|(i, run)| {
        let token = if i % 2 == 1 {
            "hash-other"
        } else {
            "hash-live"
        };
        let bearer = Bearer {
            agent: "support-bot",
            token_to_check: Some(token),
        };
        (first_step(run), bearer)
    });
    let (results, before, after) = intents_held_then_let_go(&pg, intents.collect()).await;
    assert_eq!(
        after.groups - before.groups,
        statements_for_held_writes(),
        "the writes did not wait as a group: {before:?} → {after:?}"
    );
    for (i, (result, run)) in results.into_iter().zip(&runs).enumerate() {
        let result = result.unwrap();
        let next_step = store.run(run.id).await.unwrap().unwrap().next_step;
        let logged = store.steps(run.id).await.unwrap().len();
        if i % 2 == 1 {
            assert!(result.is_none(), "run {i}: another agent's token landed");
            assert_eq!((next_step, logged), (0, 0), "run {i}");
            assert_eq!(lease_owner(&db.url, run.id).await, None, "run {i}");
        } else {
            let (_claim, step) = result.expect("a live token on a ready run");
            assert_eq!((step.run_id, step.step_idx), (run.id, 0));
            assert_eq!((next_step, logged), (1, 1), "run {i}");
        }
    }
}

/// Confirms a step written on the hot path (lazily, as a looked-up tool's
/// outcome is) and gives its claim back in the same write.
async fn confirm_releasing(
    store: &dyn SagaStore,
    run_id: Uuid,
    step_idx: i64,
    reference: &str,
    claim: &mut dyn saga_harness::saga::store::RunClaim,
) -> Step {
    store
        .settle_step_and_release(
            run_id,
            step_idx,
            Outcome::confirmed(StepStatus::Intended, reference.into(), json!({})),
            Durability::Lazy,
            &agent(),
            claim,
        )
        .await
        .unwrap()
}

/// Tokens whose hashes are `hash-live` (support-bot's, the runs' agent)
/// and `hash-other` (another agent's).
async fn issue_tokens(store: &Store) {
    for (agent, hash) in [("support-bot", "hash-live"), ("another-bot", "hash-other")] {
        store.add_api_token(agent, hash, None).await.unwrap();
    }
}

/// A run's step 0 of a compensatable tool, as the hot path writes it.
fn first_step(run: &Run) -> NewStep {
    step(
        run,
        0,
        "jira.create",
        ToolClass::Compensatable,
        StepStatus::Intended,
    )
}

type HotPathResult =
    Result<Option<(Box<dyn saga_harness::saga::store::RunClaim>, Step)>, StoreError>;
type Counts = saga_harness::store::group_commit::GroupCounts;

/// The hot path's intents, each from its bearer, sent at once while every
/// connection of the pool is held, so that they wait and go together once
/// it is let go: each caller's result in order, and the step writer's
/// counts before and after.
async fn intents_held_then_let_go(
    pg: &Arc<saga_harness::store::postgres::PostgresStore>,
    intents: Vec<(NewStep, Bearer<'static>)>,
) -> (Vec<HotPathResult>, Counts, Counts) {
    let store: Store = pg.clone();
    let held = hold_the_pool(pg).await;
    let before = pg.commit_groups();
    let sent = intents.len() as u64;
    let claims: Vec<_> = intents
        .into_iter()
        .map(|(new, bearer)| {
            let store = store.clone();
            tokio::spawn(async move { store.claim_and_record_step(bearer, new, &agent()).await })
        })
        .collect();
    while pg.commit_groups().sent < before.sent + sent {
        tokio::task::yield_now().await;
    }
    drop(held);
    let mut results = Vec::new();
    for claim in claims {
        results.push(claim.await.unwrap());
    }
    let after = pg.commit_groups();
    (results, before, after)
}

/// Every connection of the store's pool, held until dropped: step writes
/// queue meanwhile, and go together once they are let go.
async fn hold_the_pool(
    pg: &saga_harness::store::postgres::PostgresStore,
) -> Vec<sqlx::pool::PoolConnection<sqlx::Postgres>> {
    let mut held = Vec::new();
    for _ in 0..saga_harness::store::postgres::POOL_SIZE {
        held.push(pg.session_pool().acquire().await.unwrap());
    }
    held
}

async fn lease_owner(url: &str, run_id: Uuid) -> Option<String> {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let owner = sqlx::query_scalar("SELECT lease_owner FROM runs WHERE id = $1")
        .bind(run_id.to_string())
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    owner
}

/// R2 with group commit: the step writes of many runs, sent at once, share
/// one SQLite transaction; each still stands or falls on its own.
#[tokio::test]
async fn sqlite_r2_step_writes_of_many_runs_share_a_commit_and_stay_apart() {
    use saga_harness::store::sqlite::SqliteStore;
    let db = common::sqlite();
    let sqlite = Arc::new(SqliteStore::open(&db.url).await.unwrap());
    let store: Store = sqlite.clone();
    let earlier = new_run(&store, None).await;
    let taken = store
        .record_step(
            step(
                &earlier,
                0,
                "jira.create",
                ToolClass::Compensatable,
                StepStatus::Intended,
            ),
            &agent(),
        )
        .await
        .unwrap();
    let mut runs = Vec::new();
    for _ in 0..12 {
        runs.push(new_run(&store, None).await);
    }
    // While the test holds the single writer connection, every write
    // queues; released, they all go in the writer's next transaction.
    let held = sqlite.session_pool().acquire().await.unwrap();
    let before = sqlite.commit_groups();
    let mut writes = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let mut new = step(
            run,
            0,
            "jira.create",
            ToolClass::Compensatable,
            StepStatus::Intended,
        );
        if i == 3 {
            // A key that is already in the log: refused inside the group.
            new.idempotency_key = taken.idempotency_key.clone();
        }
        if i == 7 {
            // Not the run's next index: nothing is written for it.
            new.step_idx = 5;
        }
        let store = store.clone();
        writes.push(tokio::spawn(async move {
            store.record_step(new, &agent()).await
        }));
    }
    while sqlite.commit_groups().sent < before.sent + runs.len() as u64 {
        tokio::task::yield_now().await;
    }
    drop(held);
    let mut results = Vec::new();
    for write in writes {
        results.push(write.await.unwrap());
    }
    let after = sqlite.commit_groups();
    assert_eq!(after.groups - before.groups, 1, "{before:?} → {after:?}");
    assert_eq!(after.jobs - before.jobs, runs.len() as u64);
    for (i, (run, result)) in runs.iter().zip(&results).enumerate() {
        let next_step = store.run(run.id).await.unwrap().unwrap().next_step;
        let lines = store.events(Some(run.id), 100).await.unwrap();
        let step_lines = lines.iter().filter(|e| e.entity.as_str() == "step").count();
        match i {
            3 => {
                assert!(
                    matches!(result, Err(StoreError::Duplicate { .. })),
                    "{result:?}"
                );
                assert_eq!((next_step, step_lines), (0, 0), "run {i}");
            }
            7 => {
                assert!(
                    matches!(
                        result,
                        Err(StoreError::StepOutOfOrder {
                            given: 5,
                            expected: 0
                        })
                    ),
                    "{result:?}"
                );
                assert_eq!((next_step, step_lines), (0, 0), "run {i}");
            }
            _ => {
                let written = result.as_ref().unwrap();
                assert_eq!(written.status, StepStatus::Intended);
                assert_eq!((next_step, step_lines), (1, 1), "run {i}");
            }
        }
    }
}

/// The queue of step writes waiting for SQLite's writer is bounded: past
/// it, callers wait for room (back-pressure) and every write still lands.
#[tokio::test]
async fn sqlite_a_burst_of_step_writes_waits_for_room_and_all_land() {
    use saga_harness::store::group_commit::QUEUE;
    use saga_harness::store::sqlite::SqliteStore;
    let db = common::sqlite();
    let sqlite = Arc::new(SqliteStore::open(&db.url).await.unwrap());
    let store: Store = sqlite.clone();
    let mut runs = Vec::new();
    for _ in 0..(2 * QUEUE + 10) {
        runs.push(new_run(&store, None).await);
    }
    let held = sqlite.session_pool().acquire().await.unwrap();
    let before = sqlite.commit_groups();
    let mut writes = Vec::new();
    for run in &runs {
        let new = step(
            run,
            0,
            "jira.create",
            ToolClass::Compensatable,
            StepStatus::Intended,
        );
        let store = store.clone();
        writes.push(tokio::spawn(async move {
            store.record_step(new, &agent()).await
        }));
    }
    // Everyone has had the chance to queue; the writer is held.
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let queued = sqlite.commit_groups().sent - before.sent;
    assert!(
        queued <= QUEUE as u64 + 1,
        "{queued} writes queued for a writer that takes none"
    );
    drop(held);
    for write in writes {
        assert_eq!(write.await.unwrap().unwrap().status, StepStatus::Intended);
    }
}

/// A run's claim on PostgreSQL is a lease in the run's row: it holds no
/// connection, so one instance can hold many more claims than its pool
/// has connections, and each claimed run still takes its steps.
#[tokio::test]
async fn postgres_a_run_claim_holds_no_database_connection() {
    let db = crate::common::postgres_or_skip!();
    let store = saga_harness::store::open(&db.url)
        .await
        .unwrap()
        .saga_store();
    let mut runs = Vec::new();
    for i in 0..100 {
        runs.push(new_run(&store, Some(&format!("held {i}"))).await);
    }
    let claims = futures::future::try_join_all(runs.iter().map(|r| store.claim_and_read(r.id)))
        .await
        .unwrap();
    let observer = sqlx::PgPool::connect(&db.url).await.unwrap();
    let leased: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE lease_owner IS NOT NULL AND lease_until > clock_timestamp()",
    )
    .fetch_one(&observer)
    .await
    .unwrap();
    assert_eq!(leased, 100, "every claim is a live lease in its run's row");
    let sessions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
    )
    .fetch_one(&observer)
    .await
    .unwrap();
    assert!(
        sessions < 100,
        "{sessions} sessions for 100 claims: claims hold connections"
    );
    // Every claimed run writes its step while all 100 claims are held.
    let actor = agent();
    futures::future::try_join_all(runs.iter().map(|r| {
        store.record_step(
            step(
                r,
                0,
                "jira.create",
                ToolClass::Compensatable,
                StepStatus::Intended,
            ),
            &actor,
        )
    }))
    .await
    .unwrap();
    drop(claims);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let leased: i64 =
            sqlx::query_scalar("SELECT count(*) FROM runs WHERE lease_owner IS NOT NULL")
                .fetch_one(&observer)
                .await
                .unwrap();
        if leased == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{leased} leases were never released"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A server restart breaks every pooled connection. The next statements
/// of a step (the claim, the intent, the outcome) each find out and are
/// sent again on a fresh connection: the caller sees no error, and the
/// pool does not hand out the other broken connections one by one.
#[tokio::test]
async fn postgres_connections_broken_by_a_restart_cost_a_retried_statement_not_an_error() {
    let db = crate::common::postgres_or_skip!();
    let store = saga_harness::store::open(&db.url)
        .await
        .unwrap()
        .saga_store();
    let actor = agent();
    // Several connections in the pool, all idle.
    let runs = futures::future::try_join_all((0..8).map(|i| {
        let store = store.clone();
        async move {
            store
                .create_run(NewRun {
                    agent: "bot".into(),
                    label: Some(format!("r{i}")),
                    purpose: String::new(),
                })
                .await
        }
    }))
    .await
    .unwrap();
    // What a restart does to them: every session of this database ends.
    let observer = sqlx::PgPool::connect(&db.url).await.unwrap();
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&observer)
    .await
    .unwrap();
    assert!(
        ended.len() >= 2,
        "the pool held {} connections",
        ended.len()
    );
    for (run, _) in &runs {
        let claimed = store
            .claim_and_read(run.id)
            .await
            .expect("the claim after a restart");
        store
            .record_step(
                step(
                    run,
                    0,
                    "jira.create",
                    ToolClass::Compensatable,
                    StepStatus::Intended,
                ),
                &actor,
            )
            .await
            .expect("the intent after a restart");
        store
            .settle_step(
                run.id,
                0,
                Outcome::moving(StepStatus::Intended, StepStatus::Confirmed),
                Durability::Lazy,
                &actor,
            )
            .await
            .expect("the outcome after a restart");
        drop(claimed);
    }
}

/// A holder that died leaves its lease in the row. Another instance waits
/// for it to run out (never takes a live one), then takes the run; one
/// that cannot wait that long is told the run is busy.
#[tokio::test]
async fn postgres_a_dead_holders_lease_is_taken_over_only_after_it_runs_out() {
    let db = crate::common::postgres_or_skip!();
    let open = |lease_ms: u64, wait_ms: u64| {
        let url = db.url.clone();
        async move {
            let settings = saga_harness::store::StoreSettings {
                run_lease_ms: lease_ms,
                run_wait_ms: wait_ms,
                ..Default::default()
            };
            saga_harness::store::open_with(&url, &settings)
                .await
                .unwrap()
                .saga_store()
        }
    };
    let patient = open(1_000, 5_000).await;
    let hasty = open(1_000, 200).await;
    let run = new_run(&patient, Some("orphaned")).await;
    let observer = sqlx::PgPool::connect(&db.url).await.unwrap();
    // The dead holder's lease: 1.5 s left, and nobody to renew it.
    sqlx::query(
        "UPDATE runs SET lease_owner = 'dead-instance',
            lease_until = clock_timestamp() + interval '1500 milliseconds' WHERE id = $1",
    )
    .bind(run.id.to_string())
    .execute(&observer)
    .await
    .unwrap();
    match hasty.claim_run(run.id).await {
        Err(StoreError::RunBusy { waited_ms }) => assert_eq!(waited_ms, 200),
        Err(other) => panic!("expected RunBusy, got {other}"),
        Ok(_) => panic!("a live lease was taken over"),
    }
    let started = std::time::Instant::now();
    let claim = patient.claim_and_read(run.id).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(1_000),
        "taken after {waited:?}, before the dead holder's lease ran out"
    );
    assert_eq!(claim.read.run.as_ref().unwrap().id, run.id);
    let owner: Option<String> = sqlx::query_scalar("SELECT lease_owner FROM runs WHERE id = $1")
        .bind(run.id.to_string())
        .fetch_one(&observer)
        .await
        .unwrap();
    assert_ne!(owner.as_deref(), Some("dead-instance"));
    // While held, the lease is renewed: it outlives its first term.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    assert!(
        matches!(
            hasty.claim_run(run.id).await,
            Err(StoreError::RunBusy { .. })
        ),
        "a held lease ran out while its holder was alive"
    );
    drop(claim);
}
