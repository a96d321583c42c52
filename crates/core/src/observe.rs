//! What the engine tells whoever watches it work: each step's move, how an
//! unknown was settled, how long systems took to answer. The operators'
//! metrics (src/ops/metrics.rs) listen here; the core knows nothing of how
//! they are exposed. Every method has a do-nothing default, so an engine
//! nobody watches pays nothing.

use super::model::{Actor, ApprovalKind};
use super::status::StepStatus;
use std::time::Duration;

/// How a step whose outcome was unknown got its real one (R7).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray, strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum Settlement {
    /// The first lookup found the effect (or its failure).
    Lookup,
    /// The first lookup found nothing; the second, after the settle pause,
    /// answered (found, or not found twice: not executed).
    SecondLook,
    /// A person answered "did this happen?".
    Person,
}

/// Which of a connector's two requests a system answered.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray, strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum SystemRequest {
    /// The effect itself (a step, a compensation, a correction send).
    Execute,
    /// R7's lookup by key.
    Lookup,
}

crate::names::names! {
    Settlement: "settlement",
    SystemRequest: "system request",
}

/// The system a connector operation belongs to: `stripe` for
/// `stripe.capture`, an upstream MCP server's name for its tools.
pub fn system_of(operation: &str) -> &str {
    operation.split('.').next().unwrap_or(operation)
}

pub trait Observer: Send + Sync {
    /// A step of `tool` (of class `class`) moved to `to`.
    fn step_moved(&self, _tool: &str, _class: &str, _from: StepStatus, _to: StepStatus) {}
    /// A compensation (or undo) of `tool` moved to `to`.
    fn compensation_moved(&self, _tool: &str, _to: StepStatus) {}
    /// A step that was unknown (or left in flight) was settled.
    fn unknown_settled(&self, _tool: &str, _how: Settlement) {}
    /// One reconcile of a step of `tool`, lookups and pause included.
    fn reconciled(&self, _tool: &str, _took: Duration) {}
    /// A request to `system` went out; `request_ended` follows it.
    fn request_started(&self, _system: &str) {}
    fn request_ended(&self, _system: &str, _request: SystemRequest, _took: Duration) {}
    /// An approval was left pending past its deadline.
    fn approval_expired(&self, _kind: ApprovalKind) {}
    /// A run started unwinding, at `by`'s word.
    fn unwind_started(&self, _by: &Actor) {}
}

/// The engine's observer when nobody watches.
pub struct Unobserved;

impl Observer for Unobserved {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_belongs_to_the_system_before_its_first_dot() {
        assert_eq!(system_of("stripe.capture"), "stripe");
        assert_eq!(system_of("everything.echo"), "everything");
        assert_eq!(system_of("orders"), "orders");
    }
}
