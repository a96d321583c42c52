//! One worker per run: this process's lock per run (with the run's agent
//! and its next step once known), the store's claim across processes, and
//! the lease fence every send of the run asks first.

use super::store::{LeaseFence, RunClaim, SagaStore, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use uuid::Uuid;

/// This process's lock per run, and the run's agent once known: a run's
/// owner never changes, so another agent's calls are refused before they
/// wait for (or hold) the owner's lock. Locks nobody holds or waits for
/// are dropped as the map grows.
#[derive(Default)]
pub(crate) struct RunLocks {
    slots: HashMap<Uuid, RunSlot>,
    /// The map's size after its last pruning.
    pruned_at: usize,
}

pub(crate) struct RunSlot {
    lock: Arc<tokio::sync::Mutex<()>>,
    owner: Option<String>,
    /// The index a new step took at this process's last answer on the run:
    /// a guess for a client that names no step, which the store checks.
    new_step: Option<i64>,
}

impl RunLocks {
    pub(crate) fn lock_for(&mut self, run_id: Uuid) -> Arc<tokio::sync::Mutex<()>> {
        if self.slots.len() >= (2 * self.pruned_at).max(1024) {
            // Held or awaited locks have clones outside the map.
            self.slots
                .retain(|_, slot| Arc::strong_count(&slot.lock) > 1);
            self.pruned_at = self.slots.len();
        }
        self.slots
            .entry(run_id)
            .or_insert_with(|| RunSlot {
                lock: Default::default(),
                owner: None,
                new_step: None,
            })
            .lock
            .clone()
    }

    /// Whether the run is known to belong to another agent.
    pub(crate) fn owned_by_another(&self, run_id: Uuid, agent: &str) -> bool {
        self.slots
            .get(&run_id)
            .and_then(|slot| slot.owner.as_deref())
            .is_some_and(|owner| owner != agent)
    }

    pub(crate) fn remember_owner(&mut self, run_id: Uuid, owner: &str) {
        if let Some(slot) = self.slots.get_mut(&run_id) {
            slot.owner.get_or_insert_with(|| owner.to_owned());
        }
    }

    pub(crate) fn remember_new_step(&mut self, run_id: Uuid, new_step: i64) {
        if let Some(slot) = self.slots.get_mut(&run_id) {
            slot.new_step = Some(new_step);
        }
    }

    pub(crate) fn new_step_of(&self, run_id: Uuid) -> Option<i64> {
        self.slots.get(&run_id).and_then(|slot| slot.new_step)
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

/// Held while a run is worked on; dropping it lets the next caller in.
pub struct RunGuard {
    pub(crate) _fence: Option<FenceEntry>,
    pub(crate) _claim: Box<dyn RunClaim>,
    pub(crate) _local: tokio::sync::OwnedMutexGuard<()>,
}

/// The fences of the runs this process holds now, by run: a send looks
/// its run's up just before the call leaves.
pub(crate) type Fences = Arc<Mutex<HashMap<Uuid, Arc<dyn LeaseFence>>>>;

/// A run's fence, known to sends while this is held.
pub(crate) struct FenceEntry {
    run_id: Uuid,
    fences: Fences,
}

impl Drop for FenceEntry {
    fn drop(&mut self) {
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.run_id);
    }
}

/// This process's hold on the runs it works on: a lock per run, and the
/// lease fences of the runs it holds now.
#[derive(Default)]
pub(crate) struct Runs {
    /// One call at a time per run in this process, so a re-sent step never
    /// races its own first attempt.
    locks: Mutex<RunLocks>,
    fences: Fences,
}

impl Runs {
    /// Serialises work on one run: in this process (a mutex per run) and
    /// across processes sharing the database (the store's run claim, held
    /// for the whole call, not only for a transaction).
    pub(crate) async fn serialise(
        &self,
        store: &dyn SagaStore,
        run_id: Uuid,
    ) -> Result<RunGuard, StoreError> {
        let local = self.lock(run_id).lock_owned().await;
        let claim = store.claim_run(run_id).await?;
        Ok(RunGuard {
            _fence: self.fence_while_held(run_id, claim.as_ref()),
            _claim: claim,
            _local: local,
        })
    }

    /// `serialise` without waiting: `None` when a call in this process or
    /// another instance is working on the run now.
    pub(crate) async fn try_serialise(
        &self,
        store: &dyn SagaStore,
        run_id: Uuid,
    ) -> Result<Option<RunGuard>, StoreError> {
        let Ok(local) = self.lock(run_id).try_lock_owned() else {
            return Ok(None);
        };
        Ok(store.try_claim_run(run_id).await?.map(|claim| RunGuard {
            _fence: self.fence_while_held(run_id, claim.as_ref()),
            _claim: claim,
            _local: local,
        }))
    }

    /// Makes the claim's fence known to this run's sends until the entry
    /// is dropped.
    pub(crate) fn fence_while_held(
        &self,
        run_id: Uuid,
        claim: &dyn RunClaim,
    ) -> Option<FenceEntry> {
        let fence = claim.fence()?;
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(run_id, fence);
        Some(FenceEntry {
            run_id,
            fences: self.fences.clone(),
        })
    }

    /// Just before a call of the run leaves: refuses (`LeaseLost`, nothing
    /// sent, nothing written) when this process can no longer be sure the
    /// run is still its own for `longest_call` more, as after a pause
    /// longer than its lease.
    pub(crate) async fn confirm_lease(
        &self,
        run_id: Uuid,
        longest_call: std::time::Duration,
    ) -> Result<(), StoreError> {
        let fence = self
            .fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&run_id)
            .cloned();
        match fence {
            Some(fence) => fence.confirm(longest_call).await,
            None => Ok(()),
        }
    }

    /// The run's lock in this process.
    pub(crate) fn lock(&self, run_id: Uuid) -> Arc<tokio::sync::Mutex<()>> {
        self.locks().lock_for(run_id)
    }

    pub(crate) fn locks(&self) -> std::sync::MutexGuard<'_, RunLocks> {
        // A poisoned map only means another call panicked; the map is still
        // a valid set of locks.
        self.locks.lock().unwrap_or_else(|p| p.into_inner())
    }
}
