//! One way every door of the harness says that something failed inside
//! it. Whoever asked (an agent over the API or MCP, a person on the
//! dashboard or in Slack, a load balancer on `/readyz`) gets a fixed
//! sentence, the stable code `internal` and an incident id; the cause,
//! which may name a database, a file or a URL carrying a token, goes to the
//! log only, under that id, so an operator can find it from what a user
//! reports.

use crate::saga::engine::Refusal;
use crate::saga::store::StoreError;
use std::fmt::Display;

/// The stable code of every internal failure.
pub const CODE: &str = "internal";

/// One internal failure, logged under its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incident {
    id: String,
}

impl Incident {
    /// Logs `cause` under a new incident id; `place` says what was being
    /// done ("agent API request", "Slack decision").
    pub fn record(place: &str, cause: &dyn Display) -> Incident {
        let id = format!("{:08x}", rand::random::<u32>());
        tracing::error!(incident = %id, %cause, "{place} failed");
        Incident { id }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// What whoever asked is told.
    pub fn message(&self) -> String {
        format!(
            "The harness could not complete this request (incident {}); the details are in its log.",
            self.id
        )
    }
}

/// A refusal in words for whoever asked: its own sentence when it is
/// about their request, an incident when it is about the harness.
pub fn refusal_words(place: &str, refusal: &Refusal) -> String {
    if refusal.is_internal() {
        Incident::record(place, refusal).message()
    } else {
        refusal.to_string()
    }
}

/// A store error in words for whoever asked, as [`refusal_words`].
pub fn store_words(place: &str, err: &StoreError) -> String {
    if err.is_internal() {
        Incident::record(place, err).message()
    } else {
        err.to_string()
    }
}

/// A reason something was not done, as whoever asked may read it.
pub trait Told {
    fn told(&self, place: &str) -> String;
}

/// A sentence a page wrote itself for the person.
impl Told for String {
    fn told(&self, _place: &str) -> String {
        self.clone()
    }
}

impl Told for Refusal {
    fn told(&self, place: &str) -> String {
        refusal_words(place, self)
    }
}

impl Told for StoreError {
    fn told(&self, place: &str) -> String {
        store_words(place, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_internal_cause_never_reaches_the_words_and_a_request_mistake_does() {
        let internal = Refusal::Store(StoreError::database(
            "connecting",
            "connection to postgres://saga:hunter2@db failed",
        ));
        let words = refusal_words("test", &internal);
        assert!(
            !words.contains("hunter2") && !words.contains("postgres"),
            "{words}"
        );
        assert!(words.contains("(incident "), "{words}");
        let mistake = Refusal::UnknownTool("refund_all".into());
        assert_eq!(refusal_words("test", &mistake), mistake.to_string());
    }
}
