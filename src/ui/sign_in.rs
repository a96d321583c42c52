//! Why a sign-in was refused, in the words the sign-in page shows. The
//! page is sent a code (`/login?error=…`), never a sentence: a link cannot
//! put its own words on the page.

use serde::{Deserialize, Serialize};

/// Each way a sign-in through the identity provider, or with a password,
/// is refused. None of them leaves a session behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SignInRefusal {
    /// The answer's `state` matches no sign-in this browser started (a
    /// forged link, or one used already).
    State,
    /// The provider said no (the person cancelled, or it refused them).
    Denied,
    /// The provider did not answer, or not in time.
    Unreachable,
    /// The provider would not exchange the code (used twice, expired).
    Code,
    /// The ID token had expired when it arrived.
    Expired,
    /// The ID token was not signed with a key the provider publishes.
    Signature,
    /// The ID token was made for another application.
    Audience,
    /// The answer or the token came from another issuer.
    Issuer,
    /// The ID token belongs to another sign-in.
    Nonce,
    /// The provider's answer could not be read as an ID token.
    Token,
    /// Signed in, but no group of theirs gives a role here.
    NoAccess,
    /// Password sign-in is turned off on this server.
    LocalOff,
}

impl SignInRefusal {
    pub const ALL: [SignInRefusal; 12] = [
        SignInRefusal::State,
        SignInRefusal::Denied,
        SignInRefusal::Unreachable,
        SignInRefusal::Code,
        SignInRefusal::Expired,
        SignInRefusal::Signature,
        SignInRefusal::Audience,
        SignInRefusal::Issuer,
        SignInRefusal::Nonce,
        SignInRefusal::Token,
        SignInRefusal::NoAccess,
        SignInRefusal::LocalOff,
    ];

    /// What goes in the sign-in page's address.
    pub fn code(self) -> &'static str {
        match self {
            SignInRefusal::State => "oidc-state",
            SignInRefusal::Denied => "oidc-denied",
            SignInRefusal::Unreachable => "oidc-unreachable",
            SignInRefusal::Code => "oidc-code",
            SignInRefusal::Expired => "oidc-expired",
            SignInRefusal::Signature => "oidc-signature",
            SignInRefusal::Audience => "oidc-audience",
            SignInRefusal::Issuer => "oidc-issuer",
            SignInRefusal::Nonce => "oidc-nonce",
            SignInRefusal::Token => "oidc-token",
            SignInRefusal::NoAccess => "no-access",
            SignInRefusal::LocalOff => "local-off",
        }
    }

    pub fn of_code(code: &str) -> Option<SignInRefusal> {
        SignInRefusal::ALL.into_iter().find(|r| r.code() == code)
    }

    /// The sentence on the sign-in page.
    pub fn words(self) -> &'static str {
        match self {
            SignInRefusal::State => {
                "That sign-in was not started in this browser, or its link was used already. Sign in again."
            }
            SignInRefusal::Denied => "The identity provider did not sign you in.",
            SignInRefusal::Unreachable => {
                "The identity provider did not answer. Try again in a moment."
            }
            SignInRefusal::Code => {
                "The identity provider would not complete that sign-in (its code was used already or had expired). Sign in again."
            }
            SignInRefusal::Expired => {
                "The identity provider's answer was not accepted: its sign-in had expired by the time it arrived (check the clocks)."
            }
            SignInRefusal::Signature => {
                "The identity provider's answer was not accepted: it was not signed with any key the provider publishes."
            }
            SignInRefusal::Audience => {
                "The identity provider's answer was not accepted: it was made for another application."
            }
            SignInRefusal::Issuer => {
                "The identity provider's answer was not accepted: it came from another issuer than the one configured."
            }
            SignInRefusal::Nonce => {
                "The identity provider's answer was not accepted: it belongs to another sign-in."
            }
            SignInRefusal::Token => {
                "The identity provider's answer was not accepted: it carried no readable ID token."
            }
            SignInRefusal::NoAccess => {
                "You signed in, but none of your groups may use Saga Harness. Ask an administrator to add you to a group that may."
            }
            SignInRefusal::LocalOff => {
                "Signing in with a password is turned off here: use your company's sign-in."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_has_its_own_code_and_a_sentence() {
        for refusal in SignInRefusal::ALL {
            assert_eq!(SignInRefusal::of_code(refusal.code()), Some(refusal));
            assert!(refusal.words().ends_with('.'), "{refusal:?}");
        }
        let codes: std::collections::HashSet<_> =
            SignInRefusal::ALL.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), SignInRefusal::ALL.len());
        assert_eq!(SignInRefusal::of_code("<script>"), None);
    }
}
