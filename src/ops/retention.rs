//! `saga-harness prune`: settled history leaves the saga log, in pages
//! of runs, each run removed in its own short transaction so agents' calls
//! never wait long behind it, and after each page a pause as long as the
//! page took; with `--archive`, each run is first written
//! as one JSON line (its steps, compensations, approvals and their
//! messages, corrections and audit lines) and flushed to disk.
//!
//! Which runs may go is `saga::retention::why_kept`'s to say.

use crate::saga::retention::{why_kept, Removed, RunHistory};
use crate::saga::status::RunStatus;
use crate::saga::store::{SagaStore, StoreResult};
use chrono::Utc;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// Runs read (and at most removed) per page.
pub const PAGE: i64 = 100;

/// What one pass did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Pass {
    /// Runs old enough to be considered.
    pub looked_at: u64,
    /// Runs removed (or, on a dry run, that would be).
    pub pruned: u64,
    /// Rows removed, by table (none on a dry run).
    pub removed: BTreeMap<String, u64>,
    /// Runs kept, by why.
    pub kept: BTreeMap<String, u64>,
    /// Runs that changed between being read and being removed (kept).
    pub changed: u64,
    pub seconds: f64,
}

impl Pass {
    pub fn summary(&self, dry_run: bool) -> String {
        let rows: u64 = self.removed.values().sum();
        let mut line = format!(
            "{} {} of {} finished runs older than the cut-off",
            if dry_run { "would prune" } else { "pruned" },
            self.pruned,
            self.looked_at
        );
        if !dry_run {
            line.push_str(&format!(
                " ({rows} rows: {})",
                self.removed
                    .iter()
                    .map(|(table, n)| format!("{table} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        line.push_str(&format!(" in {:.1} s", self.seconds));
        if !self.kept.is_empty() || self.changed > 0 {
            let mut why: Vec<String> = self
                .kept
                .iter()
                .map(|(reason, n)| format!("{n} {reason}"))
                .collect();
            if self.changed > 0 {
                why.push(format!("{} changed while pruning", self.changed));
            }
            line.push_str(&format!("; kept {}", why.join(", ")));
        }
        line
    }
}

/// Everything the log holds about `run`.
pub async fn history(
    store: &dyn SagaStore,
    run: crate::saga::model::Run,
) -> StoreResult<RunHistory> {
    let steps = store.steps(run.id).await?;
    let compensations = store.compensations(run.id).await?;
    let approvals = store.approvals(run.id).await?;
    let mut notices = Vec::new();
    for approval in &approvals {
        notices.extend(store.notices(approval.id).await?);
    }
    let corrections = store.corrections(run.id).await?;
    let events = store.events(Some(run.id), i64::MAX).await?;
    Ok(RunHistory {
        run,
        steps,
        compensations,
        approvals,
        notices,
        corrections,
        events,
    })
}

/// Prunes runs last changed more than `older_than` before `now` that
/// nothing can still move; `archive` gets each one's line first.
/// `progress` hears about every page.
pub async fn prune(
    store: &dyn SagaStore,
    now: chrono::DateTime<Utc>,
    older_than: Duration,
    archive: Option<&Path>,
    dry_run: bool,
    mut progress: impl FnMut(&Pass),
) -> anyhow::Result<Pass> {
    let started = Instant::now();
    let before = now - chrono::Duration::from_std(older_than)?;
    let mut file = match archive {
        Some(path) if !dry_run => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("opening the archive {}: {e}", path.display()))?,
        ),
        _ => None,
    };
    let mut pass = Pass::default();
    let mut removed = Removed::default();
    // Only finished runs can go; each status is paged on its own index.
    for status in [RunStatus::Completed, RunStatus::Unwound] {
        let mut after = None;
        loop {
            let page_started = Instant::now();
            let page = store
                .finished_runs_before(status, before, after, PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            after = Some((last.created_at, last.id));
            for run in page {
                pass.looked_at += 1;
                let (id, seen) = (run.id, run.updated_at);
                let history = history(store, run).await?;
                if let Some(why) = why_kept(&history, now) {
                    *pass.kept.entry(why.words().to_owned()).or_default() += 1;
                    continue;
                }
                if dry_run {
                    pass.pruned += 1;
                    continue;
                }
                if let Some(file) = file.as_mut() {
                    let line = serde_json::to_string(&history)?;
                    writeln!(file, "{line}")?;
                    // On disk before the rows go.
                    file.sync_data()?;
                }
                match store.remove_run(id, seen).await? {
                    Some(rows) => {
                        pass.pruned += 1;
                        removed.merge(&rows);
                    }
                    None => pass.changed += 1,
                }
            }
            pass.removed = removed.by_table.clone();
            pass.seconds = started.elapsed().as_secs_f64();
            progress(&pass);
            // Between pages the log is the agents' alone, as long as the
            // page took: a prune never holds more than half the writes.
            tokio::time::sleep(page_started.elapsed()).await;
        }
    }
    pass.removed = removed.by_table;
    pass.seconds = started.elapsed().as_secs_f64();
    Ok(pass)
}

/// The runs of an archive, one per line, as `prune --archive` wrote them.
pub fn read_archive(text: &str) -> Result<Vec<RunHistory>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| format!("archive line {}: {e}", i + 1))
        })
        .collect()
}
