//! Idempotency keys (R3): derived from the run and the step, never from the
//! model's wording, so a reworded retry of step 4 still carries step 4's key.

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// First 32 hex characters of `sha256("{run_id}:{step_idx}:{tool}")`.
///
/// `run_id` is the server-generated run UUID; a client's label never enters
/// the key. Compensations and corrections use the same function with the
/// tool prefixed by `"compensate:"` or `"correct:"`, so they get keys of
/// their own that are just as stable.
pub fn step_key(run_id: Uuid, step_idx: i64, tool: &str) -> String {
    let digest = Sha256::digest(format!("{run_id}:{step_idx}:{tool}").as_bytes());
    hex::encode(&digest[..16])
}

/// The key of the compensation (or undo) of step `step_idx` (R8).
pub fn compensation_key(run_id: Uuid, step_idx: i64, tool: &str) -> String {
    step_key(run_id, step_idx, &format!("compensate:{tool}"))
}

/// The key of the correction sent for step `step_idx` (R10).
pub fn correction_key(run_id: Uuid, step_idx: i64, tool: &str) -> String {
    step_key(run_id, step_idx, &format!("correct:{tool}"))
}

/// The key of the message telling people approval `approval_id` waits
/// (`place`: which of its messages), derived from the run and the
/// approval, so a retried post finds the first one.
pub fn notice_key(run_id: Uuid, approval_id: i64, place: super::model::NoticePlace) -> String {
    step_key(run_id, approval_id, &format!("notice:{place}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Uuid {
        Uuid::parse_str("6f1c2a4e-3b7d-4c1e-9a2f-0d5e8b7c6a11").unwrap()
    }

    #[test]
    fn r3_key_is_the_first_32_hex_of_sha256_of_run_step_tool() {
        // Computed independently: printf '%s' '6f1c2a4e-3b7d-4c1e-9a2f-0d5e8b7c6a11:0:stripe.charge' | sha256sum
        assert_eq!(
            step_key(run(), 0, "stripe.charge"),
            "d5d073060683facdde2c689c1459c5a1"
        );
    }

    #[test]
    fn r3_key_changes_with_run_step_and_tool_only() {
        let base = step_key(run(), 3, "jira.create_issue");
        assert_eq!(base.len(), 32);
        assert!(base
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(base, step_key(run(), 3, "jira.create_issue"));
        assert_ne!(base, step_key(run(), 4, "jira.create_issue"));
        assert_ne!(base, step_key(run(), 3, "jira.transition"));
        assert_ne!(base, step_key(Uuid::new_v4(), 3, "jira.create_issue"));
    }

    #[test]
    fn r8_compensation_and_r10_correction_keys_are_their_own() {
        let call = step_key(run(), 2, "stripe.charge");
        let compensation = compensation_key(run(), 2, "stripe.charge");
        let correction = correction_key(run(), 2, "stripe.charge");
        assert_eq!(compensation, step_key(run(), 2, "compensate:stripe.charge"));
        assert_eq!(correction, step_key(run(), 2, "correct:stripe.charge"));
        assert_ne!(call, compensation);
        assert_ne!(compensation, correction);
    }
}
