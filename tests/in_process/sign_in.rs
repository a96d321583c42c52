//! Signing in with the company's identity provider, through a real
//! certified OpenID provider (oidc-provider from npm): the role from the
//! person's groups, and each refusal with its sentence on the sign-in page
//! and no session left behind.

use crate::common;

use common::app::{Spawn, TestApp};
use common::identity::{Browser, IdentityProvider, CLIENT_ID, CLIENT_SECRET};
use saga_harness::auth::hash_password;
use saga_harness::config::SignIn;
use saga_harness::saga::class::Role;
use saga_harness::ui::sign_in::SignInRefusal;
use std::time::{Duration, Instant};

struct Setup {
    app: TestApp,
    provider: IdentityProvider,
    _db: common::TestDb,
}

impl Setup {
    fn base(&self) -> &str {
        &self.app.base
    }
}

fn settings(issuer: &str) -> SignIn {
    SignIn {
        oidc_issuer: Some(issuer.parse().unwrap()),
        oidc_client_id: Some(CLIENT_ID.into()),
        oidc_client_secret: Some(CLIENT_SECRET.to_owned().into()),
        oidc_roles: Some(
            "admin=platform,approver=support-leads,approver=billing-leads,viewer=support"
                .parse()
                .unwrap(),
        ),
        oidc_name: Some("Example SSO".into()),
        oidc_timeout_secs: 5,
        ..SignIn::default()
    }
}

/// The harness on `db` signing people in through a fresh provider started
/// with `env`; `change` alters the harness's sign-in settings.
async fn with_provider(
    db: common::TestDb,
    env: &[(&str, &str)],
    change: impl FnOnce(&mut SignIn),
) -> Setup {
    let port = common::process::free_port();
    let mut sign_in = settings(&format!("http://127.0.0.1:{port}"));
    change(&mut sign_in);
    let app = Spawn::on(&db)
        .with(|args| args.sign_in = sign_in)
        .start()
        .await;
    let hash = hash_password("correct horse battery").unwrap();
    app.state()
        .store
        .add_user("dana", &hash, Role::Approver)
        .await
        .unwrap();
    let redirect = format!("{}/auth/oidc/callback", app.base);
    let provider = IdentityProvider::start(port, &redirect, env).await;
    Setup {
        app,
        provider,
        _db: db,
    }
}

fn refused_with(refusal: SignInRefusal) -> String {
    format!("/login?error={}", refusal.code())
}

/// What the sign-in page says after a refusal, as a person reads it.
async fn login_page_says(browser: &Browser, base: &str, landed: &str) -> String {
    common::visible_text(&browser.page(&format!("{base}{landed}")).await)
}

async fn nobody_is_signed_in(browser: &Browser, base: &str) {
    assert_eq!(browser.me(base).await, None);
    assert_eq!(
        browser.location_of(&format!("{base}/")).await.as_deref(),
        Some(format!("{base}/login").as_str()),
        "the dashboard lets the browser in"
    );
}

async fn a_person_signs_in_with_the_role_their_groups_give(db: common::TestDb) {
    let setup = with_provider(db, &[], |_| {}).await;
    let base = setup.base();
    let page = Browser::new();
    let text = login_page_says(&page, base, "/login").await;
    assert!(text.contains("Sign in with Example SSO"), "{text}");
    assert!(text.contains("Password"), "the password form stays: {text}");

    let ada = Browser::new();
    let arrival = ada.sign_in(base, "ada").await;
    assert_eq!(arrival.landed, format!("{base}/"));
    let me = ada.me(base).await.expect("ada is signed in");
    assert_eq!(me["username"], "ada@example.com");
    assert_eq!(me["role"], "approver");
    assert_eq!(me["federated"]["issuer"], setup.provider.issuer.as_str());
    assert_eq!(me["federated"]["subject"], "ada");
    assert_eq!(me["federated"]["granted_by"], "support-leads");
    let runs = ada.http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(runs.status(), 200, "the runs list opens");

    // The highest role any group gives; taken again at each sign-in.
    for (person, role, group) in [
        ("pat", "admin", "platform"),
        ("bea", "approver", "billing-leads"),
        ("vic", "viewer", "support"),
    ] {
        let browser = Browser::new();
        assert_eq!(
            browser.sign_in(base, person).await.landed,
            format!("{base}/")
        );
        let me = browser.me(base).await.expect("signed in");
        assert_eq!(
            (me["role"].as_str(), me["federated"]["granted_by"].as_str()),
            (Some(role), Some(group)),
            "{person}"
        );
    }
}

#[tokio::test]
async fn sqlite_a_person_signs_in_with_the_role_their_groups_give() {
    a_person_signs_in_with_the_role_their_groups_give(common::sqlite()).await;
}

#[tokio::test]
async fn neither_the_client_secret_nor_a_token_is_kept_in_the_database() {
    let db = common::sqlite();
    let file = db.url.trim_start_matches("sqlite://").to_owned();
    let setup = with_provider(db, &[], |_| {}).await;
    let browser = Browser::new();
    assert_eq!(
        browser.sign_in(setup.base(), "ada").await.landed,
        format!("{}/", setup.base())
    );
    // A page after sign-in, so the session is written back.
    browser.me(setup.base()).await.expect("signed in");
    let mut bytes = std::fs::read(&file).unwrap();
    if let Ok(wal) = std::fs::read(format!("{file}-wal")) {
        bytes.extend(wal);
    }
    let holds = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(
        holds(b"ada@example.com"),
        "the session is not in the file read"
    );
    assert!(
        !holds(CLIENT_SECRET.as_bytes()),
        "the client secret is stored"
    );
    // Every JWT (ID token, access token) starts with the base64 of `{"`.
    assert!(!holds(b"eyJ"), "a token is stored");
}

#[tokio::test]
async fn postgres_a_person_signs_in_with_the_role_their_groups_give() {
    let db = common::postgres_or_skip!();
    a_person_signs_in_with_the_role_their_groups_give(db).await;
}

#[tokio::test]
async fn the_session_id_is_new_after_signing_in_through_the_provider() {
    let setup = with_provider(common::sqlite(), &[], |_| {}).await;
    let browser = Browser::new();
    let callback = browser.to_callback(setup.base(), "ada").await;
    let before = session_cookie(&browser, setup.base());
    assert!(before.is_some(), "the sign-in's state waits in a session");
    browser.location_of(&callback).await;
    let after = session_cookie(&browser, setup.base());
    assert!(after.is_some());
    assert_ne!(
        before, after,
        "the session id planted before sign-in is kept"
    );
}

/// The harness's session cookie as the browser holds it.
fn session_cookie(browser: &Browser, base: &str) -> Option<String> {
    use reqwest::cookie::CookieStore;
    let cookies = browser.jar.cookies(&base.parse().unwrap())?;
    cookies
        .to_str()
        .ok()?
        .split("; ")
        .find(|c| c.starts_with("saga_session="))
        .map(str::to_owned)
}

#[tokio::test]
async fn someone_in_no_mapped_group_is_refused_and_gets_no_session() {
    let setup = with_provider(common::sqlite(), &[], |_| {}).await;
    let browser = Browser::new();
    let arrival = browser.sign_in(setup.base(), "mo").await;
    assert_eq!(
        arrival.landed,
        format!("{}{}", setup.base(), refused_with(SignInRefusal::NoAccess))
    );
    let text = login_page_says(
        &browser,
        setup.base(),
        &refused_with(SignInRefusal::NoAccess),
    )
    .await;
    assert!(
        text.contains("none of your groups may use Saga Harness"),
        "{text}"
    );
    nobody_is_signed_in(&browser, setup.base()).await;
}

#[tokio::test]
async fn an_answer_this_browser_did_not_start_is_refused() {
    let setup = with_provider(common::sqlite(), &[], |_| {}).await;
    let victim = Browser::new();
    // Login CSRF: the attacker's own sign-in, finished in another browser.
    let attackers = Browser::new().to_callback(setup.base(), "ada").await;
    let landed = victim.location_of(&attackers).await.unwrap();
    assert_eq!(
        landed,
        format!("{}{}", setup.base(), refused_with(SignInRefusal::State))
    );
    nobody_is_signed_in(&victim, setup.base()).await;

    // A state changed in the browser's own answer.
    let own = victim.to_callback(setup.base(), "ada").await;
    let forged = own.replace("state=", "state=x");
    let landed = victim.location_of(&forged).await.unwrap();
    assert_eq!(
        landed,
        format!("{}{}", setup.base(), refused_with(SignInRefusal::State))
    );
    nobody_is_signed_in(&victim, setup.base()).await;
}

#[tokio::test]
async fn a_code_used_twice_is_refused() {
    let setup = with_provider(common::sqlite(), &[], |_| {}).await;
    let base = setup.base();
    let browser = Browser::new();
    let first = browser.sign_in(base, "ada").await;
    assert_eq!(first.landed, format!("{base}/"));
    // The same answer again: its sign-in is used up.
    let again = browser.location_of(&first.callback).await.unwrap();
    assert_eq!(
        again,
        format!("{base}{}", refused_with(SignInRefusal::State))
    );

    // The used code inside a fresh sign-in of the same browser: the state
    // matches, and the provider refuses the code.
    let thief = Browser::new();
    let fresh = thief
        .location_of(&format!("{base}/auth/oidc/start"))
        .await
        .unwrap();
    let state = query_value(&fresh, "state");
    let code = query_value(&first.callback, "code");
    let replay = format!(
        "{base}/auth/oidc/callback?code={code}&state={state}&iss={}",
        setup.provider.issuer
    );
    let landed = thief.location_of(&replay).await.unwrap();
    assert_eq!(
        landed,
        format!("{base}{}", refused_with(SignInRefusal::Code))
    );
    nobody_is_signed_in(&thief, base).await;
}

fn query_value(url: &str, name: &str) -> String {
    reqwest::Url::parse(url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("{name} in {url}"))
}

/// Each way a token that arrived is not to be trusted: the provider signs
/// it again with its own key after changing one claim.
#[tokio::test]
async fn a_token_that_is_expired_or_for_another_audience_issuer_or_sign_in_is_refused() {
    for (tamper, refusal, words) in [
        ("expired", SignInRefusal::Expired, "had expired"),
        ("audience", SignInRefusal::Audience, "another application"),
        ("issuer", SignInRefusal::Issuer, "another issuer"),
        ("nonce", SignInRefusal::Nonce, "another sign-in"),
    ] {
        let setup = with_provider(common::sqlite(), &[("OIDC_TAMPER", tamper)], |_| {}).await;
        let browser = Browser::new();
        let arrival = browser.sign_in(setup.base(), "ada").await;
        assert_eq!(
            arrival.landed,
            format!("{}{}", setup.base(), refused_with(refusal)),
            "{tamper}"
        );
        let text = login_page_says(&browser, setup.base(), &refused_with(refusal)).await;
        assert!(text.contains(words), "{tamper}: {text}");
        nobody_is_signed_in(&browser, setup.base()).await;
    }
}

#[tokio::test]
async fn a_token_signed_by_a_key_the_provider_does_not_publish_is_refused_after_one_fresh_look() {
    let setup = with_provider(
        common::sqlite(),
        &[("OIDC_PUBLISH_OTHER_KEYS", "always")],
        |_| {},
    )
    .await;
    let browser = Browser::new();
    let arrival = browser.sign_in(setup.base(), "ada").await;
    assert_eq!(
        arrival.landed,
        format!("{}{}", setup.base(), refused_with(SignInRefusal::Signature))
    );
    assert_eq!(
        setup.provider.key_set_answers().await,
        2,
        "the keys are fetched again once"
    );
    nobody_is_signed_in(&browser, setup.base()).await;
}

#[tokio::test]
async fn a_key_the_harness_has_not_seen_yet_is_found_by_fetching_the_keys_again() {
    let setup = with_provider(
        common::sqlite(),
        &[("OIDC_PUBLISH_OTHER_KEYS", "once")],
        |_| {},
    )
    .await;
    let browser = Browser::new();
    let arrival = browser.sign_in(setup.base(), "ada").await;
    assert_eq!(arrival.landed, format!("{}/", setup.base()));
    assert_eq!(setup.provider.key_set_answers().await, 2);
    // The new keys are kept: the next sign-in fetches nothing.
    Browser::new().sign_in(setup.base(), "bea").await;
    assert_eq!(setup.provider.key_set_answers().await, 2);
}

#[tokio::test]
async fn groups_the_id_token_leaves_out_are_read_from_userinfo() {
    let setup = with_provider(common::sqlite(), &[("OIDC_GROUPS_IN", "userinfo")], |_| {}).await;
    let browser = Browser::new();
    assert_eq!(
        browser.sign_in(setup.base(), "ada").await.landed,
        format!("{}/", setup.base())
    );
    assert_eq!(browser.me(setup.base()).await.unwrap()["role"], "approver");
}

#[tokio::test]
async fn a_provider_whose_discovery_names_another_issuer_is_refused() {
    // The same provider, configured by another name for it.
    let setup = with_provider(common::sqlite(), &[], |_| {}).await;
    let port = reqwest::Url::parse(&setup.provider.issuer)
        .unwrap()
        .port()
        .unwrap();
    let db = common::sqlite();
    let app = Spawn::on(&db)
        .with(|args| args.sign_in = settings(&format!("http://localhost:{port}")))
        .start()
        .await;
    let browser = Browser::new();
    let landed = browser
        .location_of(&format!("{}/auth/oidc/start", app.base))
        .await
        .unwrap();
    assert_eq!(
        landed,
        format!("{}{}", app.base, refused_with(SignInRefusal::Issuer))
    );
    nobody_is_signed_in(&browser, &app.base).await;
}

async fn local_sign_in(browser: &Browser, base: &str) -> String {
    let response = browser
        .http
        .post(format!("{base}/api/login"))
        .header("accept", "text/html")
        .form(&[("username", "dana"), ("password", "correct horse battery")])
        .send()
        .await
        .unwrap();
    response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_provider_that_is_down_is_said_so_and_passwords_still_work() {
    let db = common::sqlite();
    let nobody_there = common::process::free_port();
    let app = Spawn::on(&db)
        .with(|args| args.sign_in = settings(&format!("http://127.0.0.1:{nobody_there}")))
        .start()
        .await;
    let hash = hash_password("correct horse battery").unwrap();
    app.state()
        .store
        .add_user("dana", &hash, Role::Approver)
        .await
        .unwrap();
    let browser = Browser::new();
    let landed = browser
        .location_of(&format!("{}/auth/oidc/start", app.base))
        .await
        .unwrap();
    assert_eq!(
        landed,
        format!("{}{}", app.base, refused_with(SignInRefusal::Unreachable))
    );
    let text = login_page_says(
        &browser,
        &app.base,
        &refused_with(SignInRefusal::Unreachable),
    )
    .await;
    assert!(text.contains("did not answer"), "{text}");
    assert_eq!(local_sign_in(&browser, &app.base).await, "/");
    assert_eq!(browser.me(&app.base).await.unwrap()["username"], "dana");
}

#[tokio::test]
async fn a_provider_that_does_not_answer_is_said_so_within_its_timeout() {
    // Takes connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let db = common::sqlite();
    let app = Spawn::on(&db)
        .with(|args| {
            args.sign_in = settings(&format!("http://127.0.0.1:{port}"));
            args.sign_in.oidc_timeout_secs = 1;
        })
        .start()
        .await;
    let browser = Browser::new();
    let asked = Instant::now();
    let landed = browser
        .location_of(&format!("{}/auth/oidc/start", app.base))
        .await
        .unwrap();
    assert_eq!(
        landed,
        format!("{}{}", app.base, refused_with(SignInRefusal::Unreachable))
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    held.abort();
}

#[tokio::test]
async fn with_local_accounts_off_the_password_form_is_gone_and_its_endpoint_refuses() {
    let setup = with_provider(common::sqlite(), &[], |s| s.local_accounts = false).await;
    let browser = Browser::new();
    let page = browser.page(&format!("{}/login", setup.base())).await;
    assert!(common::visible_text(&page).contains("Sign in with Example SSO"));
    assert!(
        !page.contains("name=\"password\""),
        "the password form is offered"
    );
    assert_eq!(
        local_sign_in(&browser, setup.base()).await,
        refused_with(SignInRefusal::LocalOff)
    );
    nobody_is_signed_in(&browser, setup.base()).await;
}

#[tokio::test]
async fn a_session_ends_at_its_maximum_age_however_active() {
    let setup = with_provider(common::sqlite(), &[], |s| {
        s.session_max_age = Duration::from_secs(3)
    })
    .await;
    let browser = Browser::new();
    assert_eq!(
        browser.sign_in(setup.base(), "ada").await.landed,
        format!("{}/", setup.base())
    );
    let signed_in = Instant::now();
    common::until("the session to end", || async {
        // Active all along: a page every 100 ms.
        let me = browser.me(setup.base()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        me.is_none().then_some(())
    })
    .await;
    // The cookie's expiry is written in whole seconds.
    assert!(
        signed_in.elapsed() >= Duration::from_secs(2),
        "{:?}",
        signed_in.elapsed()
    );
    nobody_is_signed_in(&browser, setup.base()).await;
}

#[tokio::test]
async fn start_up_refuses_half_a_provider_configuration_and_a_server_nobody_can_sign_in_to() {
    let db = common::sqlite();
    let no_client = Spawn::on(&db)
        .with(|args| args.sign_in.oidc_issuer = Some("https://sso.example.com".parse().unwrap()))
        .build()
        .await;
    let err = no_client.err().expect("refused").to_string();
    assert!(err.contains("--oidc-client-id"), "{err}");
    let no_roles = Spawn::on(&db)
        .with(|args| {
            args.sign_in = settings("https://sso.example.com");
            args.sign_in.oidc_roles = None;
        })
        .build()
        .await;
    let err = no_roles.err().expect("refused").to_string();
    assert!(err.contains("SAGA_OIDC_ROLES"), "{err}");
    let nobody = Spawn::on(&db)
        .with(|args| args.sign_in.local_accounts = false)
        .build()
        .await;
    let err = nobody.err().expect("refused").to_string();
    assert!(err.contains("nobody could sign in"), "{err}");
}

/// `doctor`'s findings under "identity provider", as text.
async fn doctor_says(sign_in: &SignIn) -> String {
    let db = common::sqlite();
    let report = saga_harness::ops::doctor::examine(None, &db.url, sign_in).await;
    report
        .sections
        .iter()
        .find(|(title, _)| title == "identity provider")
        .map(|(_, findings)| format!("{findings:?}"))
        .expect("an identity provider section")
}

#[tokio::test]
async fn doctor_says_whether_discovery_the_keys_and_the_client_secret_are_right() {
    let setup = with_provider(common::sqlite(), &[], |_| {}).await;
    let issuer = setup.provider.issuer.clone();
    let right = doctor_says(&settings(&issuer)).await;
    assert!(right.contains("discovery document read"), "{right}");
    assert!(right.contains("1 signing key(s)"), "{right}");
    assert!(right.contains("accepts the client id"), "{right}");
    assert!(!right.contains("Fix("), "{right}");

    let mut wrong_secret = settings(&issuer);
    wrong_secret.oidc_client_secret = Some("not-the-secret-not-the-secret-0000".to_owned().into());
    let said = doctor_says(&wrong_secret).await;
    assert!(said.contains("refused the client id"), "{said}");
    assert!(
        !said.contains("not-the-secret"),
        "the secret is printed: {said}"
    );

    let port = reqwest::Url::parse(&issuer).unwrap().port().unwrap();
    let said = doctor_says(&settings(&format!("http://localhost:{port}"))).await;
    assert!(said.contains("names another issuer"), "{said}");

    let nobody = common::process::free_port();
    let said = doctor_says(&settings(&format!("http://127.0.0.1:{nobody}"))).await;
    assert!(said.contains("did not answer"), "{said}");
}

#[tokio::test]
async fn the_live_dashboard_of_someone_the_provider_signed_in_stays_open() {
    let setup = with_provider(common::sqlite(), &[], |_| {}).await;
    let browser = Browser::new();
    assert_eq!(
        browser.sign_in(setup.base(), "ada").await.landed,
        format!("{}/", setup.base())
    );
    let mut live = browser
        .http
        .get(format!("{}/dashboard/events", setup.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    // A new listener is told of a change at once, so the page refetches
    // what it may have missed while the stream was opening.
    let first = tokio::time::timeout(Duration::from_secs(5), live.chunk())
        .await
        .expect("the greeting arrives")
        .unwrap()
        .expect("a chunk");
    assert!(
        String::from_utf8_lossy(&first).contains("event: change"),
        "{first:?}"
    );
    // Ada has no local account: the check that ends a removed person's
    // streams (every second) must leave hers open.
    let ended = tokio::time::timeout(Duration::from_millis(2500), live.chunk()).await;
    assert!(ended.is_err(), "the stream ended or spoke: {ended:?}");
}
