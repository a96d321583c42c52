//! Retention: which runs may leave the saga log, and the record a run
//! leaves behind when it does, one JSON line an operator can read back.
//!
//! A run leaves only when nothing about it can still move: it is finished
//! (completed or unwound), every step and compensation is settled, no
//! approval waits, no correction waits for a person or a send, no approval
//! message is still being posted or updated, no staged effect (a hold, a
//! draft) is still open, and it ended more than a day ago, so that none of
//! its calls still count against a rolling limit.

use crate::class::{Phase, ToolClass, AUTHORISATION_LIFETIME};
use crate::model::{Approval, Compensation, Correction, Event, Notice, NoticeStatus, Run, Step};
use crate::status::{ApprovalStatus, CorrectionStatus, StepStatus};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The longest rolling window a limit counts over (`agent/day`,
/// `customer/day`): a run that ended within it may still count.
pub const LONGEST_LIMIT_WINDOW: chrono::Duration = chrono::Duration::days(1);

/// Everything the saga log holds about one run: what a pruned run's
/// archive line is, and what the rules read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunHistory {
    pub run: Run,
    pub steps: Vec<Step>,
    pub compensations: Vec<Compensation>,
    pub approvals: Vec<Approval>,
    pub notices: Vec<Notice>,
    pub corrections: Vec<Correction>,
    /// Its audit lines, oldest first.
    pub events: Vec<Event>,
}

/// Why a run old enough to go stays in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kept {
    /// Not completed or unwound.
    NotFinished,
    /// Ended within the last day: its calls may still count against a limit.
    CountsAgainstALimit,
    UnsettledStep,
    UnsettledCompensation,
    WaitingApproval,
    PendingCorrection,
    /// An approval's message is still being posted or brought up to date.
    NoticeInFlight,
    /// A hold or a draft staged before the pivot, which the commit did not
    /// use, within its lifetime.
    OpenStagedEffect,
}

impl Kept {
    pub fn words(self) -> &'static str {
        match self {
            Kept::NotFinished => "not finished",
            Kept::CountsAgainstALimit => "ended within a day (may still count against a limit)",
            Kept::UnsettledStep => "a step not settled",
            Kept::UnsettledCompensation => "a compensation not settled",
            Kept::WaitingApproval => "an approval waiting",
            Kept::PendingCorrection => "a correction pending",
            Kept::NoticeInFlight => "an approval message still being posted",
            Kept::OpenStagedEffect => "an open authorisation or draft",
        }
    }
}

/// Why `history` must stay, or `None` when it may be pruned at `now`.
pub fn why_kept(history: &RunHistory, now: DateTime<Utc>) -> Option<Kept> {
    let run = &history.run;
    if !run.status.is_terminal() {
        return Some(Kept::NotFinished);
    }
    if now - run.updated_at < LONGEST_LIMIT_WINDOW {
        return Some(Kept::CountsAgainstALimit);
    }
    if history.steps.iter().any(|s| !s.status.is_settled()) {
        return Some(Kept::UnsettledStep);
    }
    if history.compensations.iter().any(|c| !c.status.is_settled()) {
        return Some(Kept::UnsettledCompensation);
    }
    if history
        .approvals
        .iter()
        .any(|a| a.status == ApprovalStatus::Pending)
    {
        return Some(Kept::WaitingApproval);
    }
    if history.corrections.iter().any(|c| {
        matches!(
            c.status,
            CorrectionStatus::Pending | CorrectionStatus::Approved
        ) || c.send_status.is_some_and(|s| !s.is_settled())
    }) {
        return Some(Kept::PendingCorrection);
    }
    if history
        .notices
        .iter()
        .any(|n| !n.done && n.status != NoticeStatus::Failed)
    {
        return Some(Kept::NoticeInFlight);
    }
    if now - run.updated_at < AUTHORISATION_LIFETIME && open_staged(&history.steps) {
        return Some(Kept::OpenStagedEffect);
    }
    None
}

/// A reversible step staged before the pivot, confirmed, and named by no
/// commit step (a capture names the hold it captures).
fn open_staged(steps: &[Step]) -> bool {
    let committed: Vec<String> = steps
        .iter()
        .filter(|s| s.phase == Phase::AfterPivot)
        .map(|s| s.args.to_string())
        .collect();
    steps.iter().any(|s| {
        s.tool_class == ToolClass::Reversible
            && s.status == StepStatus::Confirmed
            && s.phase == Phase::BeforePivot
            && !committed
                .iter()
                .any(|args| args.contains(&s.idempotency_key))
    })
}

/// The rows one pruned run took with it, by table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    pub by_table: std::collections::BTreeMap<String, u64>,
}

impl Removed {
    pub fn add(&mut self, table: &str, rows: u64) {
        if rows > 0 {
            *self.by_table.entry(table.to_owned()).or_default() += rows;
        }
    }

    pub fn merge(&mut self, other: &Removed) {
        for (table, rows) in &other.by_table {
            self.add(table, *rows);
        }
    }

    pub fn rows(&self) -> u64 {
        self.by_table.values().sum()
    }
}
