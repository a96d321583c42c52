//! The engine's own re-sends of a call a system refused for now (a
//! compensation, a commit step): never at once. Each waits longer than the
//! one before (exponential, with jitter) and at least as long as the
//! system's `Retry-After` asked; after [`SENDS`] sends, or when a system
//! asks for a longer wait than the engine holds a run for, the run goes to
//! a person instead (NEEDS_ATTENTION), who can try again later.
//!
//! The agent's own re-sends are the agent's to time: its answer says the
//! call was not executed, and how long the system asked to wait.

use backon::{BackoffBuilder, ExponentialBuilder};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Sends of one call the engine makes before it asks a person.
pub const SENDS: usize = 5;

/// The longest `Retry-After` the engine waits out in place.
pub const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// The first pause before a re-send; each next one is twice as long.
pub const FIRST_PAUSE: Duration = Duration::from_millis(250);

/// How long a system's `Retry-After` is remembered.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The pauses before one call's re-sends.
pub struct Resends {
    pauses: backon::ExponentialBackoff,
}

impl Default for Resends {
    /// Pauses of about 0.25, 0.5, 1 and 2 s: under 8 s in all before a
    /// person is asked.
    fn default() -> Self {
        Resends::starting_at(FIRST_PAUSE)
    }
}

impl Resends {
    /// Pauses starting at `first`, each twice the one before, plus a random
    /// part under `first`.
    pub fn starting_at(first: Duration) -> Self {
        Resends {
            pauses: ExponentialBuilder::default()
                .with_min_delay(first)
                .with_factor(2.0)
                .with_max_delay(Duration::from_secs(8))
                .with_max_times(SENDS - 1)
                .with_jitter()
                .build(),
        }
    }

    /// Waits before the next re-send: the next pause, or what the system
    /// asked (`asked`) if that is longer. `Err` says why there is no next
    /// re-send, in words that finish "the call …".
    pub async fn pause(&mut self, asked: Option<Duration>) -> Result<(), String> {
        let Some(pause) = self.pauses.next() else {
            return Err(format!("was refused for now {SENDS} times"));
        };
        if let Some(asked) = asked.filter(|asked| *asked > LONGEST_WAIT) {
            return Err(format!(
                "was refused for now, and the system asked to wait {} s before another try",
                asked.as_secs()
            ));
        }
        tokio::time::sleep(pause.max(asked.unwrap_or_default())).await;
        Ok(())
    }
}

/// The waits systems asked for (`Retry-After`), by idempotency key, until
/// the call's next re-send reads them.
#[derive(Default)]
pub struct HoldOffs(Mutex<HashMap<String, (Instant, Duration)>>);

impl HoldOffs {
    pub fn record(&self, key: &str, wait: Duration) {
        let now = Instant::now();
        let mut asked = self.0.lock().unwrap_or_else(|p| p.into_inner());
        asked.retain(|_, (at, _)| now.duration_since(*at) < FORGET_AFTER);
        asked.insert(key.to_owned(), (now, wait));
    }

    /// What is left of the wait asked for `key`, forgetting it.
    pub fn take(&self, key: &str) -> Option<Duration> {
        let (at, wait) = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)?;
        Some(wait.saturating_sub(at.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn re_sends_wait_longer_each_time_and_stop_after_the_cap() {
        let mut resends = Resends::starting_at(Duration::from_millis(20));
        let mut waited = Vec::new();
        for _ in 1..SENDS {
            let before = Instant::now();
            resends.pause(None).await.unwrap();
            waited.push(before.elapsed());
        }
        assert!(waited[0] >= Duration::from_millis(20), "{waited:?}");
        assert!(
            waited.windows(2).all(|w| w[1] > w[0]),
            "each pause longer than the one before: {waited:?}"
        );
        assert_eq!(
            resends.pause(None).await,
            Err(format!("was refused for now {SENDS} times"))
        );
    }

    #[tokio::test]
    async fn a_re_send_waits_at_least_what_the_system_asked() {
        let mut resends = Resends::starting_at(Duration::from_millis(1));
        let before = Instant::now();
        resends
            .pause(Some(Duration::from_millis(300)))
            .await
            .unwrap();
        assert!(before.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_wait_longer_than_the_engine_holds_a_run_goes_to_a_person_at_once() {
        let mut resends = Resends::default();
        let before = Instant::now();
        let refused = resends.pause(Some(Duration::from_secs(120))).await;
        assert_eq!(
            refused,
            Err(
                "was refused for now, and the system asked to wait 120 s before another try".into()
            )
        );
        assert!(before.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn a_system_s_wait_is_read_once() {
        let asked = HoldOffs::default();
        asked.record("k", Duration::from_secs(3));
        assert!(asked
            .take("k")
            .is_some_and(|left| left <= Duration::from_secs(3)));
        assert_eq!(asked.take("k"), None);
    }
}
