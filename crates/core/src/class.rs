//! The vocabulary every step is described in: its tool class (R1), who can
//! see its effect (the audience that ranks corrections, R10) and which side
//! of the pivot it ran on (R9).

use crate::names::names;

/// How a tool's effect can be taken back (R1).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
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
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
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

/// Authorisations expire after about 7 days: a pivot left pending longer
/// would commit against holds that are gone, and a hold staged before the
/// pivot is open that long.
#[cfg(feature = "engine")]
pub const AUTHORISATION_LIFETIME: chrono::Duration = chrono::Duration::days(7);

/// Which side of the pivot a step ran on.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum Phase {
    BeforePivot,
    AfterPivot,
}

/// A support lead's role in the dashboard.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::EnumCount,
)]
#[strum(serialize_all = "snake_case")]
pub enum Role {
    Viewer,
    Approver,
    Admin,
}

impl Role {
    /// The role with its article, for a sentence: "an approver", "a viewer".
    pub fn with_article(self) -> String {
        let name = self.as_str();
        if name.starts_with(['a', 'e', 'i', 'o', 'u']) {
            format!("an {name}")
        } else {
            format!("a {name}")
        }
    }

    /// Approving, rejecting, answering questions and signing off corrections.
    pub fn can_decide(self) -> bool {
        self >= Role::Approver
    }
}

names! {
    ToolClass: "tool class",
    Audience: "audience",
    Phase: "phase",
    Role: "role",
}

pub use crate::names::UnknownName;

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
