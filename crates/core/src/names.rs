//! Closed sets of names (statuses, classes, audiences, roles, kinds), each
//! spelt once, by strum's derive on the enum (`serialize_all`), and given
//! the same surface by [`names!`]: `ALL`, `as_str`, `FromStr` with an error
//! that lists what was expected, `Display`, and serde as that same string.
//! Storage, the wire, forms and the tools file all go through the one
//! spelling.

/// A name from storage, configuration or a form that names no such thing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}; expected one of: {expected}")]
pub struct UnknownName {
    pub what: &'static str,
    pub value: String,
    pub expected: String,
}

/// The surface of a closed set of names, for enums that derive strum's
/// `IntoStaticStr`, `VariantArray` and `EnumCount`. `$what` names the set
/// in errors ("step status", "tool class").
macro_rules! names {
    ($($ty:ident: $what:literal),+ $(,)?) => {$(
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: [$ty; <$ty as strum::EnumCount>::COUNT] =
                match <$ty as strum::VariantArray>::VARIANTS.first_chunk() {
                    Some(all) => *all,
                    None => unreachable!(),
                };

            /// The one spelling: in storage, on the wire, in forms.
            pub fn as_str(self) -> &'static str {
                self.into()
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::names::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|value| value.as_str() == s)
                    .ok_or_else(|| $crate::names::UnknownName {
                        what: $what,
                        value: s.to_owned(),
                        expected: Self::ALL.map(|value| value.as_str()).join(", "),
                    })
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <String as serde::Deserialize>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    )+};
}
pub(crate) use names;

#[cfg(test)]
mod tests {
    use crate::class::{Audience, ToolClass};
    use crate::status::{RunStatus, StepStatus};

    #[test]
    fn a_name_reads_back_as_itself_in_every_form() {
        for status in StepStatus::ALL {
            assert_eq!(status.as_str().parse::<StepStatus>(), Ok(status));
            assert_eq!(status.to_string(), status.as_str());
            let json = serde_json::to_value(status).unwrap();
            assert_eq!(json, serde_json::json!(status.as_str()));
            assert_eq!(serde_json::from_value::<StepStatus>(json).unwrap(), status);
        }
        assert_eq!(RunStatus::NeedsAttention.as_str(), "NEEDS_ATTENTION");
        assert_eq!(ToolClass::Compensatable.as_str(), "compensatable");
    }

    #[test]
    fn an_unknown_name_says_what_was_expected() {
        let err = "everyone".parse::<Audience>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown audience \"everyone\"; expected one of: internal, partner, finance, customer, public"
        );
        let err = serde_json::from_value::<StepStatus>(serde_json::json!("DONE")).unwrap_err();
        assert!(
            err.to_string().contains("unknown step status \"DONE\""),
            "{err}"
        );
    }
}
