//! The vocabulary every step is described in: its tool class (R1), who can
//! see its effect (the audience that ranks corrections, R10) and which side
//! of the pivot it ran on (R9).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How a tool's effect can be taken back (R1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// No side effect: never logged, takes no step index (R2).
    Pure,
    /// Has an undo (delete the draft, cancel the authorisation).
    Reversible,
    /// Has a compensation (refund, close).
    Compensatable,
    /// Cannot be taken back; only corrected, and only after approval.
    Irreversible,
}

/// Who could have seen an effect, ordered by blast radius: a correction to
/// the public outranks one to a customer, and so on down to the team.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Audience {
    Internal,
    Partner,
    Finance,
    Customer,
    Public,
}

impl Audience {
    /// Correction rank: higher is more urgent (public > customer >
    /// partner/finance > internal).
    pub fn blast_radius(self) -> i64 {
        match self {
            Audience::Public => 3,
            Audience::Customer => 2,
            Audience::Partner | Audience::Finance => 1,
            Audience::Internal => 0,
        }
    }

    /// Internal effects are compensated first and silently (R8).
    pub fn is_internal(self) -> bool {
        self == Audience::Internal
    }
}

/// Which side of the pivot a step ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    BeforePivot,
    AfterPivot,
}

/// A support lead's role in the dashboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Viewer,
    Approver,
    Admin,
}

impl Role {
    /// Approving, rejecting, answering questions and signing off corrections.
    pub fn can_decide(self) -> bool {
        self >= Role::Approver
    }
}

/// A name from storage, configuration or a form that names no such thing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}; expected one of: {expected}")]
pub struct UnknownName {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// `ALL`, `as_str`, `FromStr` and `Display` for a closed set of names.
macro_rules! named_enum {
    ($ty:ident, $what:literal, $expected:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }
        }
        impl FromStr for $ty {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(UnknownName { what: $what, value: s.to_owned(), expected: $expected }),
                }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_enum!(ToolClass, "tool class", "pure, reversible, compensatable, irreversible", {
    Pure => "pure", Reversible => "reversible", Compensatable => "compensatable", Irreversible => "irreversible",
});
named_enum!(Audience, "audience", "internal, partner, finance, customer, public", {
    Internal => "internal", Partner => "partner", Finance => "finance", Customer => "customer", Public => "public",
});
named_enum!(Phase, "phase", "before_pivot, after_pivot", {
    BeforePivot => "before_pivot", AfterPivot => "after_pivot",
});
named_enum!(Role, "role", "viewer, approver, admin", {
    Viewer => "viewer", Approver => "approver", Admin => "admin",
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r10_blast_radius_orders_public_customer_partner_internal() {
        assert!(Audience::Public.blast_radius() > Audience::Customer.blast_radius());
        assert!(Audience::Customer.blast_radius() > Audience::Partner.blast_radius());
        assert_eq!(
            Audience::Partner.blast_radius(),
            Audience::Finance.blast_radius()
        );
        assert!(Audience::Finance.blast_radius() > Audience::Internal.blast_radius());
    }

    #[test]
    fn r1_unknown_class_names_the_choices() {
        let err = "maybe".parse::<ToolClass>().unwrap_err();
        assert!(err
            .to_string()
            .contains("pure, reversible, compensatable, irreversible"));
        assert_eq!(
            "irreversible".parse::<ToolClass>(),
            Ok(ToolClass::Irreversible)
        );
    }

    #[test]
    fn only_approvers_and_admins_decide() {
        assert!(!Role::Viewer.can_decide());
        assert!(Role::Approver.can_decide());
        assert!(Role::Admin.can_decide());
        assert_eq!("admin".parse::<Role>(), Ok(Role::Admin));
    }
}
