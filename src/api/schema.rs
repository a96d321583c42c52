//! The agent API's OpenAPI schemas for the saga's own types. They live here,
//! beside the routes that send them, so the engine's vocabulary carries no
//! document generator. The enums are described from the lists the engine
//! itself checks names against (`ALL`), spelt the way serde writes them;
//! the structs are described by the types below, which
//! `the_documented_schemas_name_every_field_the_api_sends` (tests/in_process/api.rs)
//! holds to the JSON the API really sends.

use crate::saga::{answer, class, model, status};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};
use uuid::Uuid;

/// A string schema whose values are exactly `all`, as serde writes them.
fn names_of<T: Serialize>(all: &[T], description: &str) -> RefOr<Schema> {
    let names = all.iter().map(|value| match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        other => unreachable!("a unit variant serialises as its name, not {other:?}"),
    });
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(names))
        .description(Some(description))
        .into()
}

/// A schema, under the saga type's own name, for a closed set of names
/// from that type's `ALL` list. (The saga's types are another crate's, so
/// the schema is a stand-in of the same name.)
macro_rules! named {
    ($($name:ident = $ty:ty => $description:literal,)+) => {
        $(
            #[allow(dead_code)] // described, never built
            pub(crate) struct $name;
            impl PartialSchema for $name {
                fn schema() -> RefOr<Schema> {
                    names_of(&<$ty>::ALL, $description)
                }
            }
            impl ToSchema for $name {}
        )+
    };
}

named! {
    ToolClass = class::ToolClass => "How a tool's effect can be taken back (R1).",
    Audience = class::Audience => "Who could have seen an effect, ordered by blast radius: a correction to the public outranks one to a customer, and so on down to the team.",
    Phase = class::Phase => "Which side of the pivot a step ran on.",
    StepStatus = status::StepStatus => "Where a non-pure step (or a compensation) stands in its lifecycle.",
    RunStatus = status::RunStatus => "Where a run stands (DESIGN.md §3, \"Run statuses\").",
    ApprovalStatus = status::ApprovalStatus => "Where an approval request (pivot or single step) stands.",
    ApprovalKind = model::ApprovalKind => "`pivot`: the whole commit plan of a run; `step`: one held call.",
    OutcomeKind = answer::OutcomeKind => "What the agent is told about its call (§5): never an HTTP error.",
}

// Sent as `crate::saga::model::Run`.
/// A run: one task of one agent, and where it stands.
#[derive(ToSchema)]
#[allow(dead_code)] // described, never built: the API sends the saga's own type
pub struct Run {
    id: Uuid,
    agent: String,
    label: Option<String>,
    purpose: String,
    status: RunStatus,
    /// Where a run in NEEDS_ATTENTION returns once its questions are answered.
    resume_to: Option<RunStatus>,
    /// The index the next new non-pure step must name (R3).
    next_step: i64,
    /// The pivot request currently in force, if one was proposed.
    pivot_approval_id: Option<i64>,
    /// Irreversible steps that ran before the pivot (goal: 0; R9).
    irreversible_before_pivot: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

// Sent as `crate::saga::model::Step`.
/// One call with an effect, as the saga log holds it.
#[derive(ToSchema)]
#[allow(dead_code)] // described, never built: the API sends the saga's own type
pub struct Step {
    run_id: Uuid,
    step_idx: i64,
    tool: String,
    tool_class: ToolClass,
    /// Derived from the run and the step, never from the arguments (R3).
    idempotency_key: String,
    args: Value,
    status: StepStatus,
    external_ref: Option<String>,
    /// The undo, compensation or correction, written before the call (R6).
    compensation: Option<Value>,
    audience: Audience,
    result: Option<Value>,
    error: Option<String>,
    phase: Phase,
    /// An irreversible step run before the pivot on its own approval.
    approved_individually: bool,
    /// R12: the step's last answer to the agent was not final (unknown, not
    /// executed, awaiting approval); the agent has yet to be given its
    /// final outcome.
    owed_to_agent: bool,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

// Sent as `crate::saga::model::Approval`.
/// A request for a person's approval: a run's pivot, or one held call.
#[derive(ToSchema)]
#[allow(dead_code)] // described, never built: the API sends the saga's own type
pub struct Approval {
    id: i64,
    run_id: Uuid,
    kind: ApprovalKind,
    /// The held step, for a single-step approval.
    step_idx: Option<i64>,
    summary: String,
    /// The exact plan shown to the approver.
    plan: Value,
    /// What the approver signs: a digest of the plan exactly as shown.
    digest: String,
    status: ApprovalStatus,
    expires_at: Option<DateTime<Utc>>,
    #[schema(example = "user:lead")]
    decided_by: Option<String>,
    decided_at: Option<DateTime<Utc>>,
    note: Option<String>,
    created_at: DateTime<Utc>,
    approvers_needed: i64,
    /// Under the two-person rule, who approved first (it waits for a
    /// second, different approver).
    #[schema(example = "user:lead")]
    first_approver: Option<String>,
    first_approved_at: Option<DateTime<Utc>>,
}

// Sent as `crate::saga::engine::CallOutcome`.
/// The answer to a tool call.
#[derive(ToSchema)]
#[allow(dead_code)] // described, never built: the API sends the saga's own type
pub struct CallOutcome {
    outcome: OutcomeKind,
    /// `null` for pure calls: they take no step index (R2).
    step: Option<i64>,
    key: Option<String>,
    external_ref: Option<String>,
    result: Option<Value>,
    error: Option<String>,
    /// Written for a model: what to do next.
    message: String,
    /// The step to send next (R12): the oldest step still owed to the agent
    /// (its last answer was unknown, not executed or awaiting approval),
    /// to be re-sent unchanged; else the index a new step takes.
    next_step: i64,
    /// The index a new effect takes, whatever is owed.
    new_step: i64,
    /// With `held_over_limit`: the limit the call would cross; else `null`.
    limit: Option<OverLimit>,
}

// Sent as `crate::saga::limits::OverLimit`.
/// A call held because it would take a limit of the tools file past its
/// maximum (`[[limits.money]]`, `[[limits.recipients]]`, `[[limits.calls]]`).
#[derive(ToSchema)]
#[allow(dead_code)] // described, never built: the API sends the saga's own type
pub struct OverLimit {
    /// The limit's name.
    #[schema(example = "refunds")]
    limit: String,
    /// Counted already in the limit's window, without this call (minor
    /// units for money).
    #[schema(example = 56200)]
    used: i64,
    /// This call's own amount.
    #[schema(example = 4900)]
    amount: i64,
    /// The limit's maximum.
    #[schema(example = 50000)]
    max: i64,
    /// The same, as the person deciding reads it.
    #[schema(
        example = "this would take demo-agent's refunds in the last 24 hours to $611.00 of $500.00"
    )]
    words: String,
}

// Read as `crate::saga::pivot::PlannedCall`.
/// One call the agent wants run after approval.
#[derive(ToSchema)]
#[allow(dead_code)] // described, never built: the API reads the saga's own type
pub struct PlannedCall {
    tool: String,
    #[schema(required = false)]
    args: Value,
}
