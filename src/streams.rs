//! Event streams (an agent's run events, a person's live dashboard) served
//! from one poller. The poller reads new audit lines for every open stream
//! at once, a query a tick however many streams are open, and hands each
//! batch to the streams, which keep only their own. It reads the shared
//! table, not an in-process channel, so lines written by any instance
//! reach every stream.
//!
//! Bounds, and who each shuts out: one agent token or one person holds at
//! most `MAX_PER_HOLDER` streams at once; a new one past it ends that
//! holder's oldest stream (a tab closed long ago whose connection the
//! server has not yet seen go), so nobody is refused and nobody else's
//! stream is touched. A token's streams
//! end within `HOLDER_CHECK` of its revocation, and a person's within
//! `HOLDER_CHECK` of their removal, by any process.

use crate::saga::model::Event;
use crate::saga::store::SagaStore;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// How often the poller looks for new audit lines.
pub const POLL: Duration = Duration::from_millis(250);
/// How often the holders of open streams are checked (a revoked token, a
/// removed person).
pub const HOLDER_CHECK: Duration = Duration::from_secs(1);
/// Streams one token or one person may hold open at once.
pub const MAX_PER_HOLDER: usize = 8;
/// Batches a stream may fall behind before it reads from the database.
const BACKLOG: usize = 64;
/// Lines read a query.
const PAGE: i64 = 500;

/// Who holds a stream open.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Holder {
    /// An agent, by its bearer token's hash.
    Token(String),
    /// A person signed in to the dashboard with a local account, by
    /// username.
    Person(String),
    /// A person the identity provider signed in, by the name the session
    /// gives them: they have no local account to be removed from, and
    /// their session's maximum age ends their access.
    Federated(String),
}

struct Held {
    /// Each open stream's number and what ends it, oldest first.
    open: std::collections::VecDeque<(u64, CancellationToken)>,
    /// Cancelled when the holder may no longer stream (a revoked token, a
    /// removed person): ends all of theirs.
    ended: CancellationToken,
}

pub struct Streams {
    store: Arc<dyn SagaStore>,
    batches: broadcast::Sender<Arc<Vec<Event>>>,
    held: Mutex<HashMap<Holder, Held>>,
    numbered: std::sync::atomic::AtomicU64,
}

/// One open stream's place, given back when the stream is dropped.
pub struct StreamSlot {
    holder: Holder,
    number: u64,
    streams: Arc<Streams>,
    /// Cancelled when the stream must end.
    pub ended: CancellationToken,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut held = self.streams.lock();
        if let Some(entry) = held.get_mut(&self.holder) {
            entry.open.retain(|(number, _)| *number != self.number);
            if entry.open.is_empty() {
                held.remove(&self.holder);
            }
        }
    }
}

impl Streams {
    pub fn new(store: Arc<dyn SagaStore>) -> Arc<Streams> {
        let (batches, _) = broadcast::channel(BACKLOG);
        Arc::new(Streams {
            store,
            batches,
            held: Mutex::new(HashMap::new()),
            numbered: Default::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Holder, Held>> {
        // A poisoned map only means a panic elsewhere; its counts still hold.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more stream of `holder`; at the bound, that
    /// holder's oldest stream ends to make room.
    pub fn open(self: &Arc<Self>, holder: Holder) -> StreamSlot {
        let number = self
            .numbered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut held = self.lock();
        let entry = held.entry(holder.clone()).or_insert_with(|| Held {
            open: Default::default(),
            ended: CancellationToken::new(),
        });
        while entry.open.len() >= MAX_PER_HOLDER {
            if let Some((_, oldest)) = entry.open.pop_front() {
                oldest.cancel();
            }
        }
        let ended = entry.ended.child_token();
        entry.open.push_back((number, ended.clone()));
        drop(held);
        StreamSlot {
            holder,
            number,
            streams: self.clone(),
            ended,
        }
    }

    /// New audit lines, a batch at a time, from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Vec<Event>>> {
        self.batches.subscribe()
    }

    /// Streams open now, by all holders.
    pub fn open_count(&self) -> usize {
        self.lock().values().map(|h| h.open.len()).sum()
    }

    /// The poller: runs until the server stops. An outage of the database
    /// is logged once, when it begins, and once when it ends.
    pub async fn poll(self: Arc<Self>) {
        let mut last: Option<i64> = None;
        let mut failing = false;
        let mut every = tokio::time::interval(POLL);
        let mut holders_checked = tokio::time::Instant::now();
        loop {
            every.tick().await;
            let read = self.read_new(&mut last).await;
            match (read, failing) {
                (Ok(()), true) => {
                    tracing::info!("event streams: the audit trail answers again");
                    failing = false;
                }
                (Err(err), false) => {
                    tracing::error!(%err, "event streams: cannot read the audit trail");
                    failing = true;
                }
                _ => {}
            }
            if holders_checked.elapsed() >= HOLDER_CHECK {
                holders_checked = tokio::time::Instant::now();
                self.end_revoked().await;
            }
        }
    }

    /// Reads the lines after `last` and hands them out; the first read only
    /// finds where the trail ends now.
    async fn read_new(&self, last: &mut Option<i64>) -> Result<(), crate::saga::store::StoreError> {
        let Some(after) = *last else {
            let newest = self.store.recent_events(1).await?;
            *last = Some(newest.first().map_or(0, |e| e.id));
            return Ok(());
        };
        if self.batches.receiver_count() == 0 {
            // Nobody listens: only keep up with where the trail ends.
            let newest = self.store.recent_events(1).await?;
            *last = Some(newest.first().map_or(after, |e| e.id.max(after)));
            return Ok(());
        }
        let mut after = after;
        loop {
            let fresh = self.store.all_events_after(after, PAGE).await?;
            let full = fresh.len() as i64 == PAGE;
            if let Some(newest) = fresh.last() {
                after = newest.id;
                *last = Some(after);
                // No receiver only means every stream closed meanwhile.
                let _ = self.batches.send(Arc::new(fresh));
            }
            if !full {
                return Ok(());
            }
        }
    }

    /// Ends the streams of every token no longer valid and every person
    /// no longer in the dashboard's users.
    async fn end_revoked(&self) {
        let holders: Vec<Holder> = self.lock().keys().cloned().collect();
        for holder in holders {
            let gone = match &holder {
                Holder::Token(hash) => matches!(self.store.agent_for_token(hash).await, Ok(None)),
                Holder::Person(name) => matches!(self.store.credentials(name).await, Ok(None)),
                Holder::Federated(_) => false,
            };
            // A holder that cannot be checked now is checked again next time.
            if gone {
                if let Some(held) = self.lock().get(&holder) {
                    held.ended.cancel();
                }
            }
        }
    }
}
