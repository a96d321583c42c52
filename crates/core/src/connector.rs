//! What the engine needs from the systems tools touch, and the R4 table that
//! turns what a call reported into an outcome.
//!
//! A connector reports what it saw on the wire (`CallReport`), never its own
//! verdict: the classification lives in one table here ([`classify`]), so
//! every connector is judged by the same rules.

use super::model::Outcome;
use super::status::StepStatus;
use async_trait::async_trait;
use serde_json::Value;

/// What one call through a connector reported.
#[derive(Clone, Debug, PartialEq)]
pub enum CallReport {
    /// The system answered. `body` is `None` when it was empty or not JSON.
    Answered {
        status: u16,
        body: Option<Value>,
        /// The system said this idempotency key was used before with other
        /// parameters (Stripe's `idempotency_error`).
        idempotency_conflict: bool,
    },
    /// The system refused the call for now and kept nothing: HTTP 429, an
    /// SMTP 4xx reply, Slack's `ratelimited`. `retry_after` is how long it
    /// asked the caller to wait, when it said.
    Deferred {
        reason: String,
        retry_after: Option<std::time::Duration>,
    },
    /// The system took the call, in a protocol without HTTP statuses (an
    /// SMTP 250 after the data); `body` says what it kept.
    Accepted { body: Value },
    /// The system refused the call for good and kept nothing, in a
    /// protocol without HTTP statuses (an SMTP 5xx reply).
    Refused { reason: String },
    /// The request went out and no answer came back in time.
    TimedOut,
    /// The connection dropped after the request was sent.
    ResetAfterSend,
    /// The request never left (connection refused, DNS failure).
    NotSent { reason: String },
}

/// What a lookup by idempotency key found in the real system (R7).
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    FoundSucceeded {
        external_ref: String,
        result: Value,
    },
    /// The effect exists but failed (a declined PaymentIntent).
    FoundFailed {
        error: String,
    },
    NotFound,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LookupError {
    /// This operation cannot be looked up: a person must answer.
    #[error("this operation has no lookup")]
    Unsupported,
    /// The lookup itself failed; try again later.
    #[error("lookup unavailable: {0}")]
    Unavailable(String),
}

/// One connector operation (`stripe.create_payment_intent`, `jira.close` …).
#[async_trait]
pub trait Connector: Send + Sync {
    /// Performs the call, carrying `key` to the system natively and where it
    /// can be searched later (R5).
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport;

    /// Asks the system whether the effect with this key exists.
    async fn lookup(&self, operation: &str, key: &str, args: &Value)
        -> Result<Lookup, LookupError>;

    /// Whether `lookup` can answer for this operation.
    fn has_lookup(&self, operation: &str) -> bool;

    /// The external reference in a success body, or `None` when the body is
    /// not what this operation returns (a proxy's page, an empty object).
    fn external_ref(&self, operation: &str, body: &Value) -> Option<String>;
}

/// The outcome of one call, per R4.
#[derive(Clone, Debug, PartialEq)]
pub enum Classified {
    Confirmed { external_ref: String, result: Value },
    Failed { error: String },
    Unknown { reason: String },
    NotExecuted { reason: String },
}

/// The R4 table. `expected` reads the external reference out of a 2xx body.
pub fn classify(report: &CallReport, expected: impl Fn(&Value) -> Option<String>) -> Classified {
    match report {
        CallReport::Answered {
            idempotency_conflict: true,
            status,
            ..
        } => Classified::Unknown {
            reason: format!(
                "HTTP {status}: the idempotency key was used before, so the effect may exist"
            ),
        },
        CallReport::Answered { status, body, .. } => match status {
            200..=299 => match body.as_ref().and_then(|b| expected(b).map(|r| (r, b))) {
                Some((external_ref, body)) => Classified::Confirmed {
                    external_ref,
                    result: body.clone(),
                },
                None => Classified::Unknown {
                    reason: format!("HTTP {status} with an empty or unexpected body"),
                },
            },
            409 => Classified::Unknown {
                reason: "HTTP 409 conflict: the effect may already exist".into(),
            },
            429 => Classified::NotExecuted {
                reason: "HTTP 429: rate limited, nothing was done".into(),
            },
            400..=499 => Classified::Failed {
                error: format!("HTTP {status}: {}", error_message(body.as_ref())),
            },
            // 500, 502, 503, 504 and any other answer: the request arrived,
            // so the effect may exist.
            _ => Classified::Unknown {
                reason: format!("HTTP {status} after the request arrived"),
            },
        },
        CallReport::Deferred {
            reason,
            retry_after,
        } => Classified::NotExecuted {
            reason: match retry_after {
                Some(wait) => format!(
                    "{reason}: nothing was done (the system asked to wait {} s)",
                    wait.as_secs_f64().ceil() as u64
                ),
                None => format!("{reason}: nothing was done"),
            },
        },
        CallReport::Accepted { body } => match expected(body) {
            Some(external_ref) => Classified::Confirmed {
                external_ref,
                result: body.clone(),
            },
            None => Classified::Unknown {
                reason: format!("accepted with an unexpected answer: {body}"),
            },
        },
        CallReport::Refused { reason } => Classified::Failed {
            error: reason.clone(),
        },
        CallReport::TimedOut => Classified::Unknown {
            reason: "timed out after the request was sent".into(),
        },
        CallReport::ResetAfterSend => Classified::Unknown {
            reason: "connection reset after the request was sent".into(),
        },
        CallReport::NotSent { reason } => Classified::NotExecuted {
            reason: format!("the request never left: {reason}"),
        },
    }
}

/// The move a classified call makes from `from` (usually INTENDED).
pub fn outcome_of_call(from: StepStatus, classified: Classified) -> Outcome {
    match classified {
        Classified::Confirmed {
            external_ref,
            result,
        } => Outcome::confirmed(from, external_ref, result),
        Classified::Failed { error } => Outcome::because(from, StepStatus::Failed, error),
        Classified::Unknown { reason } => Outcome::because(from, StepStatus::Unknown, reason),
        Classified::NotExecuted { reason } => {
            Outcome::because(from, StepStatus::NotExecuted, reason)
        }
    }
}

/// The move a lookup's answer makes from `from` (R7).
pub fn outcome_of_lookup(from: StepStatus, found: Lookup) -> Outcome {
    match found {
        Lookup::FoundSucceeded {
            external_ref,
            result,
        } => Outcome::confirmed(from, external_ref, result),
        Lookup::FoundFailed { error } => Outcome::because(from, StepStatus::Failed, error),
        Lookup::NotFound => Outcome::moving(from, StepStatus::NotExecuted),
    }
}

/// The message a system put in an error body, in the common shapes
/// (`{"error": {"message"}}`, `{"errorMessages": [..]}`, `{"message"}`).
fn error_message(body: Option<&Value>) -> String {
    let Some(body) = body else {
        return "no details".into();
    };
    body.pointer("/error/message")
        .or_else(|| body.pointer("/errorMessages/0"))
        .or_else(|| body.get("message"))
        .or_else(|| body.get("error"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| body.to_string())
}

#[cfg(test)]
mod tests {
    //! One test per row of the R4 table.
    use super::*;
    use serde_json::json;

    fn id_field(body: &Value) -> Option<String> {
        body.get("id").and_then(Value::as_str).map(str::to_owned)
    }

    fn answered(status: u16, body: Option<Value>) -> CallReport {
        CallReport::Answered {
            status,
            body,
            idempotency_conflict: false,
        }
    }

    fn is_unknown(c: &Classified) -> bool {
        matches!(c, Classified::Unknown { .. })
    }

    #[test]
    fn r4_2xx_with_the_expected_body_is_confirmed_with_its_ref() {
        let c = classify(
            &answered(200, Some(json!({"id": "pi_1", "status": "succeeded"}))),
            id_field,
        );
        assert_eq!(
            c,
            Classified::Confirmed {
                external_ref: "pi_1".into(),
                result: json!({"id": "pi_1", "status": "succeeded"})
            }
        );
    }

    #[test]
    fn r4_2xx_empty_unparseable_or_unexpected_is_unknown() {
        assert!(is_unknown(&classify(&answered(200, None), id_field)));
        assert!(is_unknown(&classify(&answered(204, None), id_field)));
        assert!(is_unknown(&classify(
            &answered(200, Some(json!({"ok": true}))),
            id_field
        )));
        assert!(is_unknown(&classify(
            &answered(201, Some(json!("<html>"))),
            id_field
        )));
    }

    #[test]
    fn r4_timeout_reset_and_5xx_are_unknown() {
        assert!(is_unknown(&classify(&CallReport::TimedOut, id_field)));
        assert!(is_unknown(&classify(&CallReport::ResetAfterSend, id_field)));
        for status in [500, 502, 503, 504] {
            assert!(
                is_unknown(&classify(&answered(status, None), id_field)),
                "{status}"
            );
        }
    }

    #[test]
    fn r4_409_and_an_idempotency_conflict_are_unknown() {
        assert!(is_unknown(&classify(
            &answered(409, Some(json!({"message": "exists"}))),
            id_field
        )));
        let stripe = CallReport::Answered {
            status: 400,
            body: Some(
                json!({"error": {"type": "idempotency_error", "message": "Keys for idempotent requests can only be used with the same parameters"}}),
            ),
            idempotency_conflict: true,
        };
        assert!(is_unknown(&classify(&stripe, id_field)));
    }

    #[test]
    fn r4_other_4xx_is_failed_with_the_systems_message() {
        for status in [400, 401, 403, 404, 422] {
            let c = classify(
                &answered(
                    status,
                    Some(json!({"error": {"message": "No such customer"}})),
                ),
                id_field,
            );
            assert_eq!(
                c,
                Classified::Failed {
                    error: format!("HTTP {status}: No such customer")
                }
            );
        }
        let jira = classify(
            &answered(
                400,
                Some(json!({"errorMessages": ["Field 'summary' is required"]})),
            ),
            id_field,
        );
        assert_eq!(
            jira,
            Classified::Failed {
                error: "HTTP 400: Field 'summary' is required".into()
            }
        );
    }

    #[test]
    fn r4_429_and_a_request_that_never_left_are_not_executed() {
        assert!(matches!(
            classify(&answered(429, None), id_field),
            Classified::NotExecuted { .. }
        ));
        let refused = CallReport::NotSent {
            reason: "connection refused".into(),
        };
        assert!(matches!(
            classify(&refused, id_field),
            Classified::NotExecuted { .. }
        ));
    }

    #[test]
    fn r4_an_acceptance_outside_http_is_confirmed_with_its_ref_or_unknown_without_one() {
        let accepted = CallReport::Accepted {
            body: json!({"id": "<k@saga>", "reply": "250 OK"}),
        };
        assert_eq!(
            classify(&accepted, id_field),
            Classified::Confirmed {
                external_ref: "<k@saga>".into(),
                result: json!({"id": "<k@saga>", "reply": "250 OK"})
            }
        );
        let without_ref = CallReport::Accepted {
            body: json!({"reply": "250 OK"}),
        };
        assert!(is_unknown(&classify(&without_ref, id_field)));
    }

    #[test]
    fn r4_a_permanent_refusal_outside_http_is_failed_in_the_systems_words() {
        let refused = CallReport::Refused {
            reason: "the SMTP server refused at RCPT TO: 550 5.1.1 no such user".into(),
        };
        assert_eq!(
            classify(&refused, id_field),
            Classified::Failed {
                error: "the SMTP server refused at RCPT TO: 550 5.1.1 no such user".into()
            }
        );
    }

    #[test]
    fn r4_a_call_deferred_by_the_system_is_not_executed_and_says_how_long_to_wait() {
        let deferred = CallReport::Deferred {
            reason: "SMTP 451 4.7.1 try again later".into(),
            retry_after: Some(std::time::Duration::from_millis(1500)),
        };
        assert_eq!(
            classify(&deferred, id_field),
            Classified::NotExecuted {
                reason: "SMTP 451 4.7.1 try again later: nothing was done (the system asked to wait 2 s)".into()
            }
        );
    }
}
