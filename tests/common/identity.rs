//! A real OpenID provider for the sign-in tests: the npm package
//! `oidc-provider`, started from end2end/oidc/provider.mjs on a port of its
//! own, with the harness registered as a client and people whose `groups`
//! claim says what they may do (ada: support-leads; bea: billing-leads and
//! support; vic: support; pat: platform; mo: marketing). Stopped when
//! dropped. Also a browser that signs in through it, following each
//! redirect itself so a test can stop at any step.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const CLIENT_ID: &str = "saga-harness-tests";
pub const CLIENT_SECRET: &str = "a-client-secret-only-these-tests-use-0123456789";

/// The provider's process (only this one is stopped).
pub struct IdentityProvider {
    child: Child,
    pub issuer: String,
}

impl IdentityProvider {
    /// Listening on `port`, registered to send people back to
    /// `redirect_uri`; `env` sets the script's other knobs (OIDC_TAMPER,
    /// OIDC_PUBLISH_OTHER_KEYS, OIDC_GROUPS_IN).
    pub async fn start(port: u16, redirect_uri: &str, env: &[(&str, &str)]) -> IdentityProvider {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("end2end/oidc/provider.mjs");
        assert!(
            script
                .parent()
                .unwrap()
                .join("../node_modules/oidc-provider")
                .exists(),
            "oidc-provider is missing: run `npm ci` in end2end (scripts/setup.sh does)"
        );
        let child = Command::new("node")
            .arg(&script)
            .env("OIDC_PORT", port.to_string())
            .env("OIDC_CLIENT_ID", CLIENT_ID)
            .env("OIDC_CLIENT_SECRET", CLIENT_SECRET)
            .env("OIDC_REDIRECT_URI", redirect_uri)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("node starts the identity provider");
        let issuer = format!("http://127.0.0.1:{port}");
        let provider = IdentityProvider { child, issuer };
        let discovery = format!("{}/.well-known/openid-configuration", provider.issuer);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !reqwest::get(&discovery)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(
                Instant::now() < deadline,
                "the identity provider did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        provider
    }

    /// How many times the provider's key set was fetched.
    pub async fn key_set_answers(&self) -> u64 {
        let answer: serde_json::Value =
            reqwest::get(format!("{}/_test/key-set-answers", self.issuer))
                .await
                .expect("the provider answers")
                .json()
                .await
                .expect("JSON");
        answer["answers"].as_u64().expect("a count")
    }
}

impl Drop for IdentityProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A browser without JavaScript: keeps cookies, follows no redirect by
/// itself.
pub struct Browser {
    pub http: reqwest::Client,
    pub jar: std::sync::Arc<reqwest::cookie::Jar>,
}

/// Where a sign-in through the provider ended.
#[derive(Debug)]
pub struct Arrival {
    /// The harness's callback address the provider sent the browser to.
    pub callback: String,
    /// Where the harness then sent the browser: `/` or `/login?error=…`.
    pub landed: String,
}

impl Browser {
    pub fn new() -> Browser {
        let jar = std::sync::Arc::new(reqwest::cookie::Jar::default());
        Browser {
            http: reqwest::Client::builder()
                .cookie_provider(jar.clone())
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(30))
                .build()
                .expect("a client"),
            jar,
        }
    }

    /// A page's HTML, as the server renders it.
    pub async fn page(&self, url: &str) -> String {
        self.http
            .get(url)
            .send()
            .await
            .expect("the page answers")
            .text()
            .await
            .expect("the page's text")
    }

    /// `GET url`; the `Location` it answers with, resolved against `url`.
    pub async fn location_of(&self, url: &str) -> Option<String> {
        let response = self.http.get(url).send().await.expect("an answer");
        redirect_of(url, &response)
    }

    /// Clicks "Sign in with …" and goes as far as the provider sending the
    /// browser back: the provider's sign-in form is filled in as `person`.
    /// Returns the callback address, not yet visited.
    pub async fn to_callback(&self, harness: &str, person: &str) -> String {
        let mut url = self
            .location_of(&format!("{harness}/auth/oidc/start"))
            .await
            .expect("the harness sends the browser to the provider");
        assert!(!url.starts_with(harness), "refused at the start: {url}");
        for _ in 0..10 {
            if url.starts_with(harness) {
                return url;
            }
            let response = self
                .http
                .get(&url)
                .send()
                .await
                .expect("the provider answers");
            if let Some(next) = redirect_of(&url, &response) {
                url = next;
                continue;
            }
            let page = response.text().await.expect("a page");
            let action =
                form_action(&page).unwrap_or_else(|| panic!("no sign-in form at {url}: {page}"));
            let action = reqwest::Url::parse(&url)
                .unwrap()
                .join(&action)
                .unwrap()
                .to_string();
            let response = self
                .http
                .post(&action)
                .form(&[("prompt", "login"), ("login", person), ("password", "any")])
                .send()
                .await
                .expect("the provider takes the form");
            url = redirect_of(&action, &response).expect("the provider goes on after its form");
        }
        panic!("the provider never sent the browser back (last at {url})");
    }

    /// The whole sign-in: to the provider, back to the harness, and where
    /// the harness sent the browser then.
    pub async fn sign_in(&self, harness: &str, person: &str) -> Arrival {
        let callback = self.to_callback(harness, person).await;
        let landed = self
            .location_of(&callback)
            .await
            .expect("the harness answers the callback with a redirect");
        Arrival { callback, landed }
    }

    /// Who the dashboard says is signed in (`None`: nobody).
    pub async fn me(&self, harness: &str) -> Option<serde_json::Value> {
        let answer: serde_json::Value = self
            .http
            .post(format!("{harness}/api/me"))
            .send()
            .await
            .expect("the harness answers")
            .json()
            .await
            .expect("JSON");
        (!answer.is_null()).then_some(answer)
    }
}

fn redirect_of(url: &str, response: &reqwest::Response) -> Option<String> {
    if !response.status().is_redirection() {
        return None;
    }
    let location = response.headers().get("location")?.to_str().ok()?;
    Some(
        reqwest::Url::parse(url)
            .ok()?
            .join(location)
            .ok()?
            .to_string(),
    )
}

fn form_action(page: &str) -> Option<String> {
    let at = page.find("<form")?;
    let rest = &page[at..];
    let start = rest.find("action=\"")? + "action=\"".len();
    let end = rest[start..].find('"')?;
    Some(rest[start..start + end].replace("&amp;", "&"))
}
