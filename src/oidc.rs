//! Signing in with the company's identity provider: OpenID Connect's
//! authorization code flow with PKCE (S256). The provider is found by
//! discovery; `state`, `nonce`, the `iss` of the answer (RFC 9207, where
//! the provider sends it), and the ID token's signature, issuer, audience
//! and expiry are checked; a key id the harness has not seen makes it fetch
//! the provider's keys once more. A person's role comes from their groups
//! at every sign-in and lives only as long as the session.

use crate::config::{RoleMap, SignIn};
use crate::saga::class::Role;
use crate::ui::sign_in::SignInRefusal;
use openidconnect::core::{
    CoreAuthenticationFlow, CoreClient, CoreGenderClaim, CoreJsonWebKeySet,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreProviderMetadata,
};
use openidconnect::{
    AdditionalClaims, AuthorizationCode, ClaimsVerificationError, ClientId, ClientSecret,
    CsrfToken, DiscoveryError, EndpointMaybeSet, EndpointNotSet, EndpointSet, IssuerUrl, Nonce,
    OAuth2TokenResponse, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, RequestTokenError,
    Scope, SignatureVerificationError, TokenResponse, UserInfoClaims,
};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Who signed in through the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// What the dashboard and the audit trail call them: their email,
    /// else their preferred username, else their subject.
    pub name: String,
    pub issuer: String,
    pub subject: String,
    pub groups: Vec<String>,
    pub role: Role,
    /// The group that gave them `role`.
    pub granted_by: String,
}

/// A sign-in this browser started and has not finished: kept in its
/// session until the provider sends the person back.
#[derive(Clone, Serialize, Deserialize)]
pub struct Pending {
    pub state: String,
    nonce: String,
    verifier: String,
}

/// Claims beyond the standard ones: where the groups are.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Extra(serde_json::Map<String, serde_json::Value>);

impl AdditionalClaims for Extra {}

type IdToken = openidconnect::IdToken<
    Extra,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;

type Client = CoreClient<
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// How long a discovery document (and its keys) is used before it is read
/// again.
const DISCOVERY_KEPT: Duration = Duration::from_secs(3600);

/// The configured provider, and what discovery found of it.
pub struct Provider {
    issuer: IssuerUrl,
    client_id: ClientId,
    secret: Option<SecretString>,
    redirect: RedirectUrl,
    groups_claim: String,
    roles: RoleMap,
    /// On the sign-in button: "Sign in with …".
    pub name: String,
    http: reqwest::Client,
    found: tokio::sync::Mutex<Option<(CoreProviderMetadata, Instant)>>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("issuer", &self.issuer.as_str())
            .field("client_id", &self.client_id.as_str())
            .field("secret", &self.secret.as_ref().map(|_| "[hidden]"))
            .finish_non_exhaustive()
    }
}

/// How the dashboard may be signed in to on this server.
#[derive(Debug)]
pub struct SignInPolicy {
    pub provider: Option<Provider>,
    /// The password form is offered and answered.
    pub local: bool,
    pub max_age: Duration,
}

impl SignInPolicy {
    /// Passwords only, sessions of the default length.
    pub fn local_only() -> Self {
        SignInPolicy {
            provider: None,
            local: true,
            max_age: SignIn::default().session_max_age,
        }
    }

    /// From the flags, with the client secret from `SAGA_OIDC_CLIENT_SECRET`
    /// and `public_url` the address browsers reach the harness at.
    pub fn from_settings(settings: &SignIn, public_url: &url::Url) -> Result<Self, String> {
        let secret = settings.oidc_client_secret.clone().or_else(|| {
            std::env::var("SAGA_OIDC_CLIENT_SECRET")
                .ok()
                .filter(|s| !s.is_empty())
                .map(SecretString::from)
        });
        let provider = match (&settings.oidc_issuer, &settings.oidc_client_id) {
            (None, None) => None,
            (Some(_), None) => {
                return Err("--oidc-issuer is set but --oidc-client-id is not".into());
            }
            (None, Some(_)) => {
                return Err("--oidc-client-id is set but --oidc-issuer is not".into());
            }
            (Some(issuer), Some(client_id)) => {
                let Some(roles) = settings.oidc_roles.clone() else {
                    return Err(
                        "--oidc-roles (SAGA_OIDC_ROLES) is not set: nobody signing in with the \
                         identity provider would get a role"
                            .into(),
                    );
                };
                Some(Provider::new(
                    issuer, client_id, secret, public_url, settings, roles,
                )?)
            }
        };
        if provider.is_none() && !settings.local_accounts {
            return Err(
                "--local-accounts false with no --oidc-issuer: nobody could sign in".into(),
            );
        }
        Ok(SignInPolicy {
            provider,
            local: settings.local_accounts,
            max_age: settings.session_max_age,
        })
    }
}

impl Provider {
    fn new(
        issuer: &url::Url,
        client_id: &str,
        secret: Option<SecretString>,
        public_url: &url::Url,
        settings: &SignIn,
        roles: RoleMap,
    ) -> Result<Provider, String> {
        // The issuer is compared with the discovery document's as a string.
        // A URL of a bare host is written with a slash, which providers'
        // issuers do not have; any other path is kept as given.
        let issuer_text = if issuer.path() == "/" {
            issuer.as_str().trim_end_matches('/').to_owned()
        } else {
            issuer.as_str().to_owned()
        };
        let redirect = public_url
            .join("/auth/oidc/callback")
            .map_err(|e| format!("the public URL {public_url}: {e}"))?;
        let http = reqwest::Client::builder()
            // Following a provider's redirects would let it send the
            // harness's requests anywhere.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(settings.oidc_timeout_secs.max(1)))
            .build()
            .map_err(|e| format!("the identity provider's HTTP client: {e}"))?;
        Ok(Provider {
            issuer: IssuerUrl::new(issuer_text).map_err(|e| format!("--oidc-issuer: {e}"))?,
            client_id: ClientId::new(client_id.to_owned()),
            secret,
            redirect: RedirectUrl::from_url(redirect),
            groups_claim: settings.oidc_groups_claim.clone(),
            roles,
            name: settings
                .oidc_name
                .clone()
                .unwrap_or_else(|| issuer.host_str().unwrap_or("your identity provider").into()),
            http,
            found: tokio::sync::Mutex::new(None),
        })
    }

    pub fn issuer(&self) -> &str {
        self.issuer.as_str()
    }

    /// The discovery document and keys: kept an hour, read again after, or
    /// at once when `fresh_keys` (a token named a key not among them).
    async fn metadata(&self, fresh_keys: bool) -> Result<CoreProviderMetadata, SignInRefusal> {
        let mut found = self.found.lock().await;
        match found.as_mut() {
            Some((metadata, at)) if at.elapsed() < DISCOVERY_KEPT && !fresh_keys => {
                return Ok(metadata.clone());
            }
            Some((metadata, at)) if at.elapsed() < DISCOVERY_KEPT => {
                let keys = CoreJsonWebKeySet::fetch_async(metadata.jwks_uri(), &self.http)
                    .await
                    .map_err(|e| discovery_refusal(&e))?;
                *metadata = metadata.clone().set_jwks(keys);
                return Ok(metadata.clone());
            }
            _ => {}
        }
        let metadata = CoreProviderMetadata::discover_async(self.issuer.clone(), &self.http)
            .await
            .map_err(|e| {
                tracing::warn!(issuer = %self.issuer.as_str(), error = %e, "identity provider discovery");
                discovery_refusal(&e)
            })?;
        *found = Some((metadata.clone(), Instant::now()));
        Ok(metadata)
    }

    fn client(&self, metadata: CoreProviderMetadata) -> Client {
        CoreClient::from_provider_metadata(
            metadata,
            self.client_id.clone(),
            self.secret
                .as_ref()
                .map(|s| ClientSecret::new(s.expose_secret().to_owned())),
        )
        .set_redirect_uri(self.redirect.clone())
    }

    /// Where to send the browser, and what to keep until it comes back.
    pub async fn start(&self) -> Result<(url::Url, Pending), SignInRefusal> {
        let metadata = self.metadata(false).await?;
        let offers_groups = metadata
            .scopes_supported()
            .is_some_and(|scopes| scopes.iter().any(|s| s.as_str() == "groups"));
        let client = self.client(metadata);
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .add_scope(Scope::new("email".into()))
            .add_scope(Scope::new("profile".into()))
            .set_pkce_challenge(challenge);
        // Some providers release groups only for their own scope; others
        // refuse a scope they do not list.
        if offers_groups {
            request = request.add_scope(Scope::new("groups".into()));
        }
        let (url, state, nonce) = request.url();
        Ok((
            url,
            Pending {
                state: state.secret().clone(),
                nonce: nonce.secret().clone(),
                verifier: verifier.secret().clone(),
            },
        ))
    }

    /// The person the provider signed in, once every check has passed.
    pub async fn finish(
        &self,
        pending: Pending,
        code: String,
        iss: Option<&str>,
    ) -> Result<Identity, SignInRefusal> {
        // RFC 9207: an answer naming another issuer is a mix-up attack.
        if iss.is_some_and(|iss| iss != self.issuer.as_str()) {
            return Err(SignInRefusal::Issuer);
        }
        let metadata = self.metadata(false).await?;
        let client = self.client(metadata);
        let tokens = client
            .exchange_code(AuthorizationCode::new(code))
            .map_err(|_| SignInRefusal::Token)?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.verifier))
            .request_async(&self.http)
            .await
            .map_err(|e| match e {
                RequestTokenError::ServerResponse(answer) => {
                    tracing::info!(error = %answer.error(), "the identity provider refused a code");
                    SignInRefusal::Code
                }
                RequestTokenError::Request(_) => SignInRefusal::Unreachable,
                _ => SignInRefusal::Token,
            })?;
        let raw = tokens.id_token().ok_or(SignInRefusal::Token)?.to_string();
        let token: IdToken = raw.parse().map_err(|_| SignInRefusal::Token)?;
        let nonce = Nonce::new(pending.nonce);
        let claims = match token.claims(&client.id_token_verifier(), &nonce) {
            Ok(claims) => claims.clone(),
            Err(ClaimsVerificationError::SignatureVerification(
                SignatureVerificationError::NoMatchingKey,
            )) => {
                // The provider may have rotated its keys since discovery.
                let client = self.client(self.metadata(true).await?);
                let verifier = client.id_token_verifier();
                let claims = token
                    .claims(&verifier, &nonce)
                    .map_err(|e| claims_refusal(&e))?
                    .clone();
                claims
            }
            Err(e) => return Err(claims_refusal(&e)),
        };
        let mut groups = groups_in(claims.additional_claims(), &self.groups_claim);
        if groups.is_none() {
            let userinfo: UserInfoClaims<Extra, CoreGenderClaim> = client
                .user_info(
                    tokens.access_token().clone(),
                    Some(claims.subject().clone()),
                )
                .map_err(|_| SignInRefusal::NoAccess)?
                .request_async(&self.http)
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, "the identity provider's userinfo");
                    SignInRefusal::Unreachable
                })?;
            groups = groups_in(userinfo.additional_claims(), &self.groups_claim);
        }
        let groups = groups.unwrap_or_default();
        let (role, granted_by) = self.roles.role_of(&groups).ok_or(SignInRefusal::NoAccess)?;
        let subject = claims.subject().as_str().to_owned();
        let name = claims
            .email()
            .map(|e| e.as_str().to_owned())
            .or_else(|| claims.preferred_username().map(|u| u.as_str().to_owned()))
            .unwrap_or_else(|| subject.clone());
        Ok(Identity {
            name,
            issuer: self.issuer.as_str().to_owned(),
            subject,
            groups,
            role,
            granted_by,
        })
    }
}

/// What `saga-harness doctor` found of the provider: each line fine
/// (`Ok`) or something to fix (`Err`).
pub type Findings = Vec<Result<String, String>>;

impl Provider {
    /// Discovery, the keys, and whether the token endpoint accepts the
    /// client id and secret: a code nobody was given is exchanged, and a
    /// provider that knows the client refuses the code (`invalid_grant`)
    /// where it would refuse the client (`invalid_client`).
    pub async fn examine(&self) -> Findings {
        let mut found = Vec::new();
        let discovery = format!(
            "{}/.well-known/openid-configuration",
            self.issuer.as_str().trim_end_matches('/')
        );
        let metadata = match self.metadata(false).await {
            Ok(metadata) => metadata,
            Err(SignInRefusal::Issuer) => {
                found.push(Err(format!(
                    "{discovery} names another issuer than {}: set --oidc-issuer to exactly the `issuer` it names",
                    self.issuer.as_str()
                )));
                return found;
            }
            Err(_) => {
                found.push(Err(format!(
                    "{discovery} did not answer with a discovery document: is --oidc-issuer right, and is the provider reachable from here?"
                )));
                return found;
            }
        };
        found.push(Ok(format!("discovery document read from {discovery}")));
        match metadata.jwks().keys().len() {
            0 => found.push(Err(format!(
                "{} publishes no signing key: no ID token could be checked",
                metadata.jwks_uri().as_str()
            ))),
            n => found.push(Ok(format!(
                "{n} signing key(s) at {}",
                metadata.jwks_uri().as_str()
            ))),
        }
        let client = self.client(metadata);
        let Ok(request) =
            client.exchange_code(AuthorizationCode::new("saga-harness-doctor-probe".into()))
        else {
            found.push(Err("the discovery document names no token endpoint".into()));
            return found;
        };
        let answer = request
            .set_pkce_verifier(PkceCodeVerifier::new("a".repeat(64)))
            .request_async(&self.http)
            .await;
        found.push(match answer {
            Err(RequestTokenError::ServerResponse(refusal)) => match refusal.error().as_ref() {
                "invalid_client" | "unauthorized_client" => Err(format!(
                    "the provider refused the client id {} and its secret ({}): check --oidc-client-id and SAGA_OIDC_CLIENT_SECRET",
                    self.client_id.as_str(),
                    refusal.error().as_ref()
                )),
                _ => Ok(format!(
                    "the provider accepts the client id {} and its secret",
                    self.client_id.as_str()
                )),
            },
            Err(RequestTokenError::Request(_)) => Err(
                "the token endpoint did not answer: is the provider reachable from here?".into(),
            ),
            Ok(_) => Err("the token endpoint exchanged a made-up code: it is not safe to use".into()),
            Err(other) => Err(format!("the token endpoint's answer could not be read: {other}")),
        });
        found
    }
}

/// The groups a claim lists: an array of names, or one name.
fn groups_in(extra: &Extra, claim: &str) -> Option<Vec<String>> {
    match extra.0.get(claim)? {
        serde_json::Value::Array(items) => Some(
            items
                .iter()
                .filter_map(|g| g.as_str().map(str::to_owned))
                .collect(),
        ),
        serde_json::Value::String(one) => Some(vec![one.clone()]),
        _ => None,
    }
}

fn discovery_refusal<E: std::error::Error>(e: &DiscoveryError<E>) -> SignInRefusal {
    match e {
        // The document names another issuer than the configured one.
        DiscoveryError::Validation(_) => SignInRefusal::Issuer,
        _ => SignInRefusal::Unreachable,
    }
}

fn claims_refusal(e: &ClaimsVerificationError) -> SignInRefusal {
    tracing::info!(error = %e, "an ID token was refused");
    match e {
        ClaimsVerificationError::Expired(_) => SignInRefusal::Expired,
        ClaimsVerificationError::InvalidAudience(_) => SignInRefusal::Audience,
        ClaimsVerificationError::InvalidIssuer(_) => SignInRefusal::Issuer,
        ClaimsVerificationError::InvalidNonce(_) => SignInRefusal::Nonce,
        ClaimsVerificationError::SignatureVerification(_) => SignInRefusal::Signature,
        _ => SignInRefusal::Token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(names: &[&str]) -> Vec<String> {
        names.iter().map(|g| g.to_string()).collect()
    }

    #[test]
    fn a_person_gets_the_highest_role_any_of_their_groups_gives() {
        let map: RoleMap = "admin=platform, approver=support-leads,viewer=support"
            .parse()
            .unwrap();
        assert_eq!(
            map.role_of(&groups(&["support", "support-leads"])),
            Some((Role::Approver, "support-leads".into()))
        );
        assert_eq!(
            map.role_of(&groups(&["support"])),
            Some((Role::Viewer, "support".into()))
        );
        assert_eq!(
            map.role_of(&groups(&["platform", "support"])),
            Some((Role::Admin, "platform".into()))
        );
        assert_eq!(map.role_of(&groups(&["marketing"])), None);
        assert_eq!(map.role_of(&[]), None);
    }

    #[test]
    fn a_role_map_with_a_mistake_is_refused_with_what_is_wrong() {
        assert!("approver"
            .parse::<RoleMap>()
            .unwrap_err()
            .contains("ROLE=GROUP"));
        assert!("boss=leads"
            .parse::<RoleMap>()
            .unwrap_err()
            .contains("boss"));
        assert!("approver="
            .parse::<RoleMap>()
            .unwrap_err()
            .contains("no group"));
        assert!(" , ".parse::<RoleMap>().unwrap_err().contains("nobody"));
    }

    #[test]
    fn groups_are_read_from_an_array_or_a_single_name() {
        let extra: Extra =
            serde_json::from_value(serde_json::json!({"groups": ["a", "b"], "team": "c"})).unwrap();
        assert_eq!(groups_in(&extra, "groups"), Some(groups(&["a", "b"])));
        assert_eq!(groups_in(&extra, "team"), Some(groups(&["c"])));
        assert_eq!(groups_in(&extra, "roles"), None);
    }
}
