//! `saga-harness prune`: settled history leaves the saga log in pages of
//! runs, each page read with one query per table, its runs removed a few
//! at a time in short transactions so agents' calls never wait long behind
//! one, and after each page a rest that keeps the pass's work to its share
//! of the time (a tenth unless set); with
//! `--archive`, each run is first written as one JSON line (its steps,
//! compensations, approvals and their messages, corrections and audit
//! lines) and the page's lines flushed to disk.
//!
//! Which runs may go is `saga::retention::why_kept`'s to say.

use crate::saga::registry::Share;
use crate::saga::retention::{why_kept, Removed, RunHistory};
use crate::saga::status::RunStatus;
use crate::saga::store::{SagaStore, StoreError};
use chrono::Utc;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// Runs read (and at most removed) per page: each table is read once
/// for the whole page.
pub const PAGE: i64 = 100;
/// Runs removed per transaction: short enough that an agent's write
/// waiting behind one waits a few milliseconds.
pub const REMOVED_TOGETHER: usize = 20;

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
    /// Of `seconds`, those spent working rather than resting.
    pub working_seconds: f64,
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
        line.push_str(&format!(
            " in {:.1} s ({:.1} s of it working)",
            self.seconds, self.working_seconds
        ));
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

/// Prunes runs last changed more than `older_than` before `now` that
/// nothing can still move; `archive` gets each one's line first. The pass
/// works `share` of the time. `progress` hears about every page.
pub async fn prune(
    store: &dyn SagaStore,
    now: chrono::DateTime<Utc>,
    older_than: Duration,
    archive: Option<&Path>,
    dry_run: bool,
    share: Share,
    mut progress: impl FnMut(&Pass),
) -> anyhow::Result<Pass> {
    let started = Instant::now();
    let before = now - chrono::Duration::from_std(older_than)?;
    let mut file = match archive {
        Some(path) if !dry_run => Some(
            open_archive(path)
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
                .await
                .map_err(|e| stopped(e, pass.pruned))?;
            let Some(last) = page.last() else { break };
            after = Some((last.created_at, last.id));
            pass.looked_at += page.len() as u64;
            let mut going = Vec::new();
            for history in store
                .histories(page)
                .await
                .map_err(|e| stopped(e, pass.pruned))?
            {
                match why_kept(&history, now) {
                    Some(why) => *pass.kept.entry(why.words().to_owned()).or_default() += 1,
                    None => going.push(history),
                }
            }
            if dry_run {
                pass.pruned += going.len() as u64;
                going.clear();
            }
            if let (Some(file), false) = (file.as_mut(), going.is_empty()) {
                for history in &going {
                    writeln!(file, "{}", serde_json::to_string(history)?)?;
                }
                // On disk before the rows go.
                file.sync_data()?;
            }
            for together in going.chunks(REMOVED_TOGETHER) {
                let seen: Vec<_> = together
                    .iter()
                    .map(|h| (h.run.id, h.run.updated_at))
                    .collect();
                let (gone, rows) = store
                    .remove_runs(&seen)
                    .await
                    .map_err(|e| stopped(e, pass.pruned))?;
                pass.pruned += gone.len() as u64;
                pass.changed += (seen.len() - gone.len()) as u64;
                removed.merge(&rows);
            }
            let worked = page_started.elapsed();
            pass.working_seconds += worked.as_secs_f64();
            pass.removed = removed.by_table.clone();
            pass.seconds = started.elapsed().as_secs_f64();
            progress(&pass);
            // Between pages the log (and the CPU) are the agents' alone.
            tokio::time::sleep(share.rest_after(worked)).await;
        }
    }
    pass.removed = removed.by_table;
    pass.seconds = started.elapsed().as_secs_f64();
    Ok(pass)
}

/// Why a pass stopped, for the operator who runs it again.
fn stopped(err: StoreError, pruned: u64) -> anyhow::Error {
    match err {
        StoreError::Unavailable { cause } => anyhow::anyhow!(
            "the database stopped answering after {pruned} runs were pruned ({cause}). \
             Each run went whole or not at all, and every one that went is in the \
             archive when one is kept: run the same prune again once the database \
             is back, and it takes the rest"
        ),
        other => anyhow::Error::new(other)
            .context(format!("the pass stopped after {pruned} runs were pruned")),
    }
}

/// Opens an archive to append to. A last line a crash cut short is cut
/// off first, so the next line starts on its own: its run is still in the
/// log (rows go only once their line is on disk), and this pass writes it
/// again.
fn open_archive(path: &Path) -> std::io::Result<std::fs::File> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    let len = file.metadata()?.len();
    let mut chunk = vec![0u8; 64 * 1024];
    // Where the whole lines end: just past the last newline, read backwards
    // a chunk at a time.
    let mut end = len;
    let whole = loop {
        if end == 0 {
            break 0;
        }
        let start = end.saturating_sub(chunk.len() as u64);
        let read = &mut chunk[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(read)?;
        if let Some(newline) = read.iter().rposition(|&b| b == b'\n') {
            break start + newline as u64 + 1;
        }
        end = start;
    };
    if whole < len {
        file.set_len(whole)?;
        file.sync_data()?;
    }
    Ok(file)
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
