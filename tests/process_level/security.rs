//! The security suite: what an attacker tried against the release binary,
//! replayed against the real binary with a fresh database. Sign-in cannot be
//! raced, used to exhaust memory or used to lock others out; slow clients
//! cannot starve agents or people; every page carries the headers that stop
//! framing and sniffing; a link cannot put words on a page; an approval is
//! decided only on its own run; agents cannot make pages huge or nest
//! arguments past what the log can read back.

use crate::common;

use common::process::{provision, tools_file, ApiAgent, Dashboard, Launch, TestProcess, PASSWORD};
use saga_harness::sim::bundle::Simulators;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const AGENT: &str = "support-bot";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// One sign-in form post; the answer's status and where it sends the
/// browser.
async fn sign_in(
    http: &reqwest::Client,
    base: &str,
    username: &str,
    password: &str,
    forwarded_for: Option<&str>,
) -> (u16, String) {
    let mut request = http
        .post(format!("{base}/api/login"))
        .header("accept", "text/html")
        .form(&[("username", username), ("password", password)]);
    if let Some(address) = forwarded_for {
        request = request.header("x-forwarded-for", address);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, location)
}

async fn harness_with_people() -> (common::TestDb, TestProcess) {
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("dana", "approver"), ("lee", "approver")]).await;
    let harness = TestProcess::start(&Launch::new(&db.url, None)).await;
    (db, harness)
}

/// The harness over the shipped tools file pointed at fresh simulators,
/// with an agent token and the named people.
struct SimulatedWorld {
    sims: Simulators,
    token: String,
    harness: TestProcess,
    _dir: tempfile::TempDir,
    _db: common::TestDb,
}

impl SimulatedWorld {
    async fn start(people: &[(&str, &str)]) -> SimulatedWorld {
        saga_harness::sim::bundle::use_simulated_credentials();
        let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tools = tools_file(&sims, dir.path(), 0);
        let db = common::sqlite();
        let token = provision(&db.url, AGENT, people).await;
        let harness = TestProcess::start(&Launch::new(&db.url, Some(&tools))).await;
        SimulatedWorld {
            sims,
            token,
            harness,
            _dir: dir,
            _db: db,
        }
    }
}

/// `saga-harness user add`, its password on standard input.
fn add_user_by_command(url: &str, username: &str, password: &str) -> std::process::Output {
    use std::io::Write as _;
    let mut add = std::process::Command::new(env!("CARGO_BIN_EXE_saga-harness"))
        .args([
            "user",
            "add",
            "--username",
            username,
            "--role",
            "viewer",
            "--password-stdin",
        ])
        .env("DATABASE_URL", url)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    add.stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    add.wait_with_output().unwrap()
}

#[tokio::test]
async fn a_concurrent_burst_of_sign_ins_verifies_at_most_the_allowed_number() {
    let (_db, harness) = harness_with_people().await;
    let http = client();
    // 40 wrong passwords for one account from one address, all at once;
    // a 503 (every checker busy) is retried, as an attacker would.
    let attempts = (0..40).map(|i| {
        let (http, base) = (http.clone(), harness.base.clone());
        async move {
            loop {
                let (status, location) =
                    sign_in(&http, &base, "dana", &format!("wrong guess {i}"), None).await;
                if status != 503 {
                    return location;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let outcomes = futures::future::join_all(attempts).await;
    let verified = outcomes.iter().filter(|l| l.ends_with("error=1")).count();
    let throttled = outcomes.iter().filter(|l| l.contains("throttled")).count();
    assert_eq!(verified + throttled, 40, "{outcomes:?}");
    assert!(verified <= 5, "{verified} wrong passwords were checked");
    // The right password now waits too: the guesser used up the allowance.
    let (_, location) = sign_in(&http, &harness.base, "dana", PASSWORD, None).await;
    assert!(location.contains("throttled"), "{location}");
}

#[tokio::test]
async fn sign_in_bursts_keep_memory_bounded() {
    let (_db, harness) = harness_with_people().await;
    let http = client();
    let before = common::process::rss_kib(harness.pid).unwrap();
    // 256 concurrent failed sign-ins for names nobody has.
    let burst = (0..256).map(|i| {
        let (http, base) = (http.clone(), harness.base.clone());
        async move {
            sign_in(
                &http,
                &base,
                &format!("nobody{i}"),
                "not the password",
                None,
            )
            .await
        }
    });
    let answers = futures::future::join_all(burst).await;
    assert!(
        answers
            .iter()
            .all(|(status, _)| [302, 503].contains(status)),
        "{answers:?}"
    );
    let busy = answers.iter().filter(|(status, _)| *status == 503).count();
    assert!(
        busy > 0,
        "password checks are capped, so a burst meets a busy server"
    );
    // 200 sign-ins with 1.9 MB usernames are refused before they are read.
    let huge = "u".repeat(1_900_000);
    for _ in 0..200 {
        let sent = http
            .post(format!("{}/api/login", harness.base))
            .form(&[("username", huge.as_str()), ("password", "x")])
            .send()
            .await;
        match sent {
            Ok(response) => assert_eq!(response.status(), 413),
            // Refused before the body was read: the server stopped reading.
            Err(err) => assert!(err.is_request(), "{err}"),
        }
    }
    let after = common::process::rss_kib(harness.pid).unwrap();
    let grown_mib = after.saturating_sub(before) / 1024;
    println!("RSS {before} KiB -> {after} KiB (+{grown_mib} MiB)");
    assert!(grown_mib < 150, "RSS grew by {grown_mib} MiB");
}

#[tokio::test]
async fn half_open_connections_do_not_starve_agents_or_people() {
    use tokio::io::AsyncWriteExt;
    let db = common::sqlite();
    let token = provision(&db.url, AGENT, &[("dana", "approver")]).await;
    // Started the way services usually are, with 1,024 open files allowed
    // (the soft limit it inherits); the server raises it to the hard one.
    let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    rlimit::setrlimit(rlimit::Resource::NOFILE, 1024.min(hard), hard).unwrap();
    let harness = TestProcess::start(&Launch::new(&db.url, None)).await;
    rlimit::setrlimit(rlimit::Resource::NOFILE, soft, hard).unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", harness.pid)).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .nth(3)
        .unwrap()
        .to_owned();
    assert_eq!(
        open_files,
        hard.to_string(),
        "the server raised its open-file limit"
    );
    let address = harness.base.trim_start_matches("http://").to_owned();
    // 2,000 clients that send half a request and never the rest.
    let mut stalled = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        stream
            .write_all(b"GET /api/v1/tools HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        stalled.push(stream);
    }
    let http = client();
    let started = Instant::now();
    let tools = http
        .get(format!("{}/api/v1/tools", harness.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let agent_took = started.elapsed();
    assert_eq!(tools.status(), 200);
    let started = Instant::now();
    let page = http
        .get(format!("{}/login", harness.base))
        .send()
        .await
        .unwrap();
    let page_took = started.elapsed();
    assert_eq!(page.status(), 200);
    println!("with 2000 half-open connections: agent call {agent_took:?}, page {page_took:?}");
    assert!(agent_took < Duration::from_secs(1), "{agent_took:?}");
    assert!(page_took < Duration::from_secs(1), "{page_took:?}");
    drop(stalled);
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = common::sqlite();
    let launch = Launch::new(&db.url, None).env("SAGA_REQUEST_TIMEOUT_SECS", "1");
    let harness = TestProcess::start(&launch).await;
    let address = harness.base.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    stream
        .write_all(b"GET /login HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the server kept a half-sent request open past its timeout"
    );
}

/// A harness on a fresh SQLite log with these request and idle timeouts
/// (seconds), and its address.
async fn with_timeouts(request: &str, idle: &str) -> (common::TestDb, TestProcess, String) {
    let db = common::sqlite();
    let launch = Launch::new(&db.url, None)
        .env("SAGA_REQUEST_TIMEOUT_SECS", request)
        .env("SAGA_IDLE_TIMEOUT_SECS", idle);
    let harness = TestProcess::start(&launch).await;
    let address = harness.base.trim_start_matches("http://").to_owned();
    (db, harness, address)
}

/// A client's pool reuses a kept-alive connection after a pause: the
/// pause is bounded by the idle timeout, not by the header timeout (which
/// runs from the next request's first byte). A second request that stops
/// halfway through its headers is still cut off by the header timeout.
#[tokio::test]
async fn a_kept_alive_connection_waits_the_idle_timeout_and_a_half_sent_next_request_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_db, _harness, address) = with_timeouts("1", "30").await;
    const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    /// Reads one answer to `/healthz` (its body is short and sent whole).
    async fn answer(stream: &mut tokio::net::TcpStream) -> String {
        let mut buf = [0u8; 4096];
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            Ok(Err(err)) => format!("read failed: {err}"),
            Err(_) => "no answer in 5 s".into(),
        }
    }

    let mut pooled = tokio::net::TcpStream::connect(&address).await.unwrap();
    pooled.write_all(HEALTH).await.unwrap();
    let first = answer(&mut pooled).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // Clients' pools are told how long an idle connection is kept.
    assert!(
        first
            .to_ascii_lowercase()
            .contains("\r\nkeep-alive: timeout=30\r\n"),
        "{first}"
    );
    // Three header timeouts of doing nothing, well within the idle timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    pooled.write_all(HEALTH).await.unwrap();
    let second = answer(&mut pooled).await;
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "a connection idle for 3 s of a 30 s idle timeout was not served: {second:?}"
    );

    // The next request begins and stops halfway through its headers.
    pooled
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let began = Instant::now();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), pooled.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "a half-sent second request kept the connection open past its header timeout"
    );
    println!(
        "half-sent second request cut off after {:?}",
        began.elapsed()
    );
}

/// A connection from `source` (another loopback address stands for
/// another client).
async fn connect_from(source: &str, address: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(address.parse().unwrap()).await.unwrap()
}

/// Whether the server closes the connection within `limit` (reading and
/// dropping whatever it sends first; PINGs of an HTTP/2 connection are
/// answered, as a live peer would).
async fn closed_by_server_within(
    mut stream: tokio::net::TcpStream,
    limit: Duration,
    answer_pings: bool,
) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let reading = async {
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
            // HTTP/2 frames: 9-byte header (length, type, flags, stream).
            while answer_pings && pending.len() >= 9 {
                let length = u32::from_be_bytes([0, pending[0], pending[1], pending[2]]) as usize;
                if pending.len() < 9 + length {
                    break;
                }
                let frame: Vec<u8> = pending.drain(..9 + length).collect();
                let (kind, flags) = (frame[3], frame[4]);
                let reply = match (kind, flags & 1) {
                    // SETTINGS: acknowledge.
                    (4, 0) => Some(vec![0, 0, 0, 4, 1, 0, 0, 0, 0]),
                    // PING: answer with the same payload.
                    (6, 0) => Some([&[0, 0, 8, 6, 1, 0, 0, 0, 0][..], &frame[9..]].concat()),
                    _ => None,
                };
                if let Some(reply) = reply {
                    if stream.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::time::timeout(limit, reading).await.is_ok()
}

/// The client preface and an empty SETTINGS frame: an HTTP/2 connection
/// that then opens no stream.
const HTTP2_START: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

#[tokio::test]
async fn one_client_holding_idle_connections_cannot_keep_others_out() {
    use tokio::io::AsyncWriteExt;
    let db = common::sqlite();
    let launch = Launch::new(&db.url, None).env("SAGA_MAX_CONNECTIONS", "20");
    let harness = TestProcess::start(&launch).await;
    let address = harness.base.trim_start_matches("http://").to_owned();
    // One client takes every slot, four ways: silent, half an HTTP/2
    // preface, an HTTP/2 connection with no stream, a body never sent.
    let mut held = Vec::new();
    for n in 0..20 {
        let mut stream = connect_from("127.0.0.2", &address).await;
        let start: &[u8] = match n % 4 {
            0 => b"",
            1 => b"PRI * HTTP/2.0\r\n",
            2 => HTTP2_START,
            _ => b"POST /api/login HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nu",
        };
        let _ = stream.write_all(start).await;
        held.push(stream);
    }
    let http = client();
    let started = Instant::now();
    let health = tokio::time::timeout(
        Duration::from_secs(2),
        http.get(format!("{}/healthz", harness.base)).send(),
    )
    .await;
    let took = started.elapsed();
    println!("/healthz with one client holding 20 connections: {took:?}");
    assert!(
        matches!(&health, Ok(Ok(r)) if r.status() == 200),
        "/healthz did not answer within 2 s: {health:?}"
    );
    drop(held);
}

#[tokio::test]
async fn idle_half_open_and_trickling_connections_are_closed_by_their_deadlines() {
    use tokio::io::AsyncWriteExt;
    let (_db, harness, address) = with_timeouts("1", "1").await;
    let limit = Duration::from_secs(4);

    let silent = connect_from("127.0.0.3", &address).await;
    assert!(
        closed_by_server_within(silent, limit, false).await,
        "a connection that sends nothing stays open"
    );

    let mut preface = connect_from("127.0.0.4", &address).await;
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert!(
        closed_by_server_within(preface, limit, false).await,
        "half an HTTP/2 preface keeps the connection open"
    );

    let mut streamless = connect_from("127.0.0.5", &address).await;
    streamless.write_all(HTTP2_START).await.unwrap();
    assert!(
        closed_by_server_within(streamless, limit, true).await,
        "an HTTP/2 connection that opens no stream but answers PINGs stays open"
    );

    // A whole request first, then nothing: idle after its answer.
    let mut kept_alive = connect_from("127.0.0.6", &address).await;
    kept_alive
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(
        closed_by_server_within(kept_alive, limit, false).await,
        "an idle keep-alive connection stays open"
    );

    // A body sent a byte every 300 ms: each byte is in time, the whole is not.
    let trickle = connect_from("127.0.0.7", &address).await;
    let (reader, mut writer) = trickle.into_split();
    writer
        .write_all(
            b"POST /api/login HTTP/1.1\r\nHost: x\r\n\
              Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 200\r\n\r\n",
        )
        .await
        .unwrap();
    let trickling = tokio::spawn(async move {
        for _ in 0..200 {
            if writer.write_all(b"u").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let started = Instant::now();
    let mut reader = reader;
    let mut answer = Vec::new();
    let answered = tokio::time::timeout(limit, async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    trickling.abort();
    println!(
        "trickled body: {:?} after {:?}",
        String::from_utf8_lossy(&answer).lines().next(),
        started.elapsed()
    );
    assert!(
        answered.is_ok(),
        "a body sent a byte at a time kept the request open past its deadline"
    );
    // The server is still serving.
    let health = client()
        .get(format!("{}/healthz", harness.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn one_address_cannot_lock_an_account_out_for_everyone() {
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("dana", "approver"), ("lee", "approver")]).await;
    // Behind a reverse proxy on this machine, which names the client.
    let launch = Launch::new(&db.url, None).env("SAGA_TRUSTED_PROXIES", "127.0.0.1");
    let harness = TestProcess::start(&launch).await;
    let http = client();
    for i in 0..8 {
        sign_in(
            &http,
            &harness.base,
            "dana",
            &format!("guess {i}"),
            Some("203.0.113.9"),
        )
        .await;
    }
    let (_, location) = sign_in(&http, &harness.base, "dana", PASSWORD, Some("203.0.113.9")).await;
    assert!(
        location.contains("throttled"),
        "the guesser waits: {location}"
    );
    // Dana from her own address, and Lee from the guesser's, sign in.
    let (_, location) = sign_in(&http, &harness.base, "dana", PASSWORD, Some("198.51.100.4")).await;
    assert_eq!(location, "/");
    let (_, location) = sign_in(&http, &harness.base, "lee", PASSWORD, Some("203.0.113.9")).await;
    assert_eq!(location, "/");
    // Without a trusted proxy, a client cannot choose its own address.
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("dana", "approver")]).await;
    let direct = TestProcess::start(&Launch::new(&db.url, None)).await;
    for i in 0..8 {
        sign_in(
            &http,
            &direct.base,
            "dana",
            &format!("guess {i}"),
            Some(&format!("192.0.2.{i}")),
        )
        .await;
    }
    let (_, location) = sign_in(&http, &direct.base, "dana", PASSWORD, Some("198.51.100.4")).await;
    assert!(location.contains("throttled"), "{location}");
}

#[tokio::test]
async fn every_page_carries_headers_that_stop_framing_sniffing_and_caching() {
    let (_db, harness) = harness_with_people().await;
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "dana", PASSWORD).await;
    for path in [
        "/login",
        "/",
        "/corrections",
        "/audit",
        "/runs/00000000-0000-0000-0000-000000000000",
        "/api/v1/tools",
        "/healthz",
    ] {
        let response = lead
            .http
            .get(format!("{}{path}", harness.base))
            .send()
            .await
            .unwrap();
        let headers = response.headers();
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["referrer-policy"], "same-origin", "{path}");
        assert_eq!(headers["cache-control"], "no-store", "{path}");
        assert!(
            headers.get("strict-transport-security").is_none(),
            "no HSTS over plain HTTP: {path}"
        );
    }
}

/// Only the page's own scripts run: the policy names scripts from this
/// site and one nonce, made anew for each page, and every inline script
/// the page carries has it.
#[tokio::test]
async fn inline_scripts_run_only_with_the_pages_own_nonce() {
    let (_db, harness) = harness_with_people().await;
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "dana", PASSWORD).await;
    let mut nonces = Vec::new();
    for path in ["/login", "/", "/", "/corrections", "/audit"] {
        let response = lead
            .http
            .get(format!("{}{path}", harness.base))
            .send()
            .await
            .unwrap();
        let csp = response.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        let nonce = csp
            .split("'nonce-")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .unwrap_or_else(|| panic!("{path}: no nonce in {csp}"))
            .to_owned();
        assert!(
            csp.starts_with("script-src 'self' 'nonce-"),
            "{path}: {csp}"
        );
        let page = response.text().await.unwrap();
        let scripts = page.matches("<script").count();
        assert!(scripts > 0, "{path} has no script");
        assert_eq!(
            page.matches(&format!("<script type=\"module\" nonce=\"{nonce}\""))
                .count()
                + page.matches(&format!("<script nonce=\"{nonce}\"")).count(),
            scripts,
            "{path}: a script without this page's nonce:\n{page}"
        );
        nonces.push(nonce);
    }
    nonces.sort();
    nonces.dedup();
    assert_eq!(nonces.len(), 5, "a nonce was used twice");
}

/// Dana signs in; the session cookie the server sets.
async fn session_cookie(http: &reqwest::Client, base: &str) -> String {
    let response = http
        .post(format!("{base}/api/login"))
        .header("accept", "text/html")
        .form(&[("username", "dana"), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// Served at an HTTPS address, the session cookie is `Secure` with the
/// `__Host-` prefix and pages carry HSTS; on a developer's loopback over
/// plain HTTP it stays a plain cookie so sign-in works there.
#[tokio::test]
async fn behind_https_the_session_cookie_is_secure_host_only_and_pages_carry_hsts() {
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("dana", "approver")]).await;
    let launch = Launch::new(&db.url, None).env("SAGA_PUBLIC_URL", "https://saga.example.com");
    let harness = TestProcess::start(&launch).await;
    let http = client();
    let cookie = session_cookie(&http, &harness.base).await;
    assert!(cookie.starts_with("__Host-saga_session="), "{cookie}");
    for attribute in ["Secure", "HttpOnly", "Path=/", "SameSite=Lax"] {
        assert!(cookie.contains(attribute), "{attribute} missing: {cookie}");
    }
    assert!(!cookie.contains("Domain"), "{cookie}");
    let page = http
        .get(format!("{}/login", harness.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        page.headers()["strict-transport-security"],
        "max-age=31536000"
    );

    let (_db, local) = harness_with_people().await;
    let cookie = session_cookie(&http, &local.base).await;
    assert!(cookie.starts_with("saga_session="), "{cookie}");
    assert!(!cookie.contains("Secure"), "{cookie}");
}

#[tokio::test]
async fn cross_site_posts_are_refused_by_fetch_metadata_and_by_full_origin() {
    let (_db, harness) = harness_with_people().await;
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "dana", PASSWORD).await;
    let port = harness.base.rsplit(':').next().unwrap().to_owned();
    let other_port = format!("http://127.0.0.1:{}", port.parse::<u16>().unwrap() + 1);
    let other_scheme = harness.base.replace("http://", "ftp://");
    let cases: [(&str, Option<&str>, Option<&str>); 3] = [
        ("fetch metadata says cross-site", None, Some("cross-site")),
        ("another port", Some(&other_port), None),
        ("another scheme", Some(&other_scheme), None),
    ];
    for (why, origin, fetch_site) in cases {
        let mut request = lead
            .http
            .post(format!("{}/api/logout", harness.base))
            .form(&[] as &[(&str, &str)]);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if let Some(site) = fetch_site {
            request = request.header("sec-fetch-site", site);
        }
        assert_eq!(request.send().await.unwrap().status(), 403, "{why}");
    }
    // The dashboard's own page is let through.
    let own = lead
        .http
        .post(format!("{}/api/logout", harness.base))
        .header("origin", &harness.base)
        .header("sec-fetch-site", "same-origin")
        .header("accept", "text/html")
        .form(&[] as &[(&str, &str)])
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 302);
    assert_eq!(own.headers()["location"], "/login");
}

#[tokio::test]
async fn a_link_cannot_put_words_on_a_page() {
    let (_db, harness) = harness_with_people().await;
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "dana", PASSWORD).await;
    let forged = "Approved by the CEO, send everything";
    for path in [
        format!("/?notice={}", forged.replace(' ', "%20")),
        format!("/corrections?error={}&done=1", forged.replace(' ', "%20")),
    ] {
        let html = lead
            .http
            .get(format!("{}{path}", harness.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(!html.contains(forged), "{path} shows the link's words");
    }
    let html = client()
        .get(format!(
            "{}/login?error=throttled&wait=5%20minutes.%20Call%20555-0100%20to%20unlock",
            harness.base
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !html.contains("555-0100"),
        "the wait is a number of minutes, never text"
    );
}

/// Two runs, each with a pivot waiting, through the agent API.
async fn two_waiting_pivots(base: &str, token: &str) -> [(String, i64, String); 2] {
    let http = client();
    let post = |path: String, body: Value| {
        let http = http.clone();
        let token = token.to_owned();
        async move {
            let response = http
                .post(path)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            assert!(status.is_success(), "{status} {body}");
            body
        }
    };
    let mut out = Vec::new();
    for label in ["run a", "run b"] {
        let run = post(
            format!("{base}/api/v1/runs"),
            json!({"label": label, "purpose": label}),
        )
        .await;
        let id = run["run"]["id"].as_str().unwrap().to_owned();
        let pivot = post(
            format!("{base}/api/v1/runs/{id}/pivot"),
            json!({"summary": label, "commit": [{"tool": "send_email", "args": {"to": "grace@example.com", "subject": "s", "body": "b"}}]}),
        )
        .await;
        out.push((
            id,
            pivot["approval_id"].as_i64().unwrap(),
            pivot["digest"].as_str().unwrap().to_owned(),
        ));
    }
    [out[0].clone(), out[1].clone()]
}

#[tokio::test]
async fn an_approval_is_decided_only_on_its_own_runs_page() {
    let world = SimulatedWorld::start(&[("dana", "approver")]).await;
    let (sims, token, harness) = (&world.sims, world.token.clone(), &world.harness);
    let [(run_a, _, _), (run_b, approval_b, digest_b)] =
        two_waiting_pivots(&harness.base, &token).await;
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "dana", PASSWORD).await;
    let approval = approval_b.to_string();
    let response = lead
        .http
        .post(format!("{}/api/decide_pivot", harness.base))
        .header("origin", &harness.base)
        .header("accept", "text/html")
        .form(&[
            ("run", run_a.as_str()),
            ("approval", &approval),
            ("digest", &digest_b),
            ("decision", "approve"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 302);
    let said = common::process::flash(&lead.http, &harness.base).await;
    assert!(
        said.starts_with("error=")
            && said.contains(&format!("approval {approval_b} of run {run_a}")),
        "{said}"
    );
    let b = client()
        .get(format!("{}/api/v1/runs/{run_b}", harness.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(
        b["run"]["status"], "AWAITING_APPROVAL",
        "run b was not decided from run a's page"
    );
    assert!(sims.smtp.ledger().effects().is_empty());
}

#[tokio::test]
async fn agents_cannot_nest_arguments_past_what_the_log_reads_back_or_make_pages_huge() {
    let world = SimulatedWorld::start(&[("dana", "approver")]).await;
    let (token, harness) = (world.token.clone(), &world.harness);
    let http = client();
    let post = |path: String, body: Value| {
        let (http, token) = (http.clone(), token.clone());
        async move {
            let response = http
                .post(path)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let base = &harness.base;
    let (_, run) = post(format!("{base}/api/v1/runs"), json!({"purpose": "nesting"})).await;
    let run = run["run"]["id"].as_str().unwrap().to_owned();
    let mut deep = json!("bottom");
    for _ in 0..123 {
        deep = json!({"d": deep});
    }
    let (status, body) = post(
        format!("{base}/api/v1/runs/{run}/pivot"),
        json!({"summary": "deep", "commit": [{"tool": "send_email", "args": {"to": "a@example.com", "subject": "s", "body": deep}}]}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_body")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("deeper than 32 levels"),
        "{body}"
    );
    for (field, body) in [
        ("label", json!({"label": "l".repeat(201), "purpose": "p"})),
        ("purpose", json!({"purpose": "p".repeat(2001)})),
    ] {
        let (status, answer) = post(format!("{base}/api/v1/runs"), body).await;
        assert_eq!(status, 422, "{answer}");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains(&format!("`{field}`")),
            "{answer}"
        );
    }
    let (status, answer) = post(
        format!("{base}/api/v1/runs/{run}/pivot"),
        json!({"summary": "s".repeat(2001), "commit": [{"tool": "send_email", "args": {"to": "a@example.com", "subject": "s", "body": "b"}}]}),
    )
    .await;
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("`summary`"),
        "{answer}"
    );
    // Fifty runs with the longest purpose allowed: the runs list shows the
    // start of each, not all of it.
    let long = format!("{}END", "p".repeat(1996));
    for _ in 0..50 {
        let (status, _) = post(format!("{base}/api/v1/runs"), json!({"purpose": long})).await;
        assert_eq!(status, 201);
    }
    let lead = Dashboard::new();
    lead.sign_in(base, "dana", PASSWORD).await;
    let list = lead
        .http
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!list.contains("pEND"), "a whole purpose in the list");
    assert!(
        list.len() < 100_000,
        "the runs list is {} bytes",
        list.len()
    );
}

#[tokio::test]
async fn what_the_approver_reads_shows_hidden_characters() {
    let world = SimulatedWorld::start(&[("dana", "approver")]).await;
    let (token, harness) = (world.token.clone(), &world.harness);
    let http = client();
    let run = http
        .post(format!("{}/api/v1/runs", harness.base))
        .bearer_auth(&token)
        .json(&json!({"purpose": "bidi"}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["run"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let subject = "Refund of \u{202e}00.001$ approved\u{7}";
    let proposed = http
        .post(format!("{}/api/v1/runs/{run}/pivot", harness.base))
        .bearer_auth(&token)
        .json(&json!({"summary": "tell Grace", "commit": [{"tool": "send_email", "args": {"to": "grace@example.com", "subject": subject, "body": "b\u{2066}x"}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(proposed.status(), 200);
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "dana", PASSWORD).await;
    let html = lead.page(&harness.base, &format!("/runs/{run}")).await;
    for hidden in ['\u{202e}', '\u{2066}', '\u{7}'] {
        assert!(
            !html.contains(hidden),
            "{hidden:?} is on the page as itself"
        );
    }
    assert!(
        html.contains("\\u{202e}"),
        "the override is shown as an escape"
    );
    assert!(html.contains("Hidden or control characters in this call"));
}

#[tokio::test]
async fn agents_cannot_push_peoples_decisions_off_the_audit_page() {
    use saga_harness::saga::model::{Actor, NewRun};
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("dana", "approver")]).await;
    {
        let opened = saga_harness::store::open(&db.url).await.unwrap();
        let store = opened.saga_store();
        let (run, _) = store
            .create_run(NewRun {
                agent: AGENT.into(),
                label: None,
                purpose: "noise".into(),
            })
            .await
            .unwrap();
        store
            .note(
                run.id,
                &Actor::User("dana".into()),
                "dana's decision that must stay visible",
            )
            .await
            .unwrap();
        for i in 0..6000 {
            store
                .note(
                    run.id,
                    &Actor::Agent(AGENT.into()),
                    &format!("agent noise {i}"),
                )
                .await
                .unwrap();
        }
    }
    let harness = TestProcess::start(&Launch::new(&db.url, None)).await;
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "dana", PASSWORD).await;
    let html = lead.page(&harness.base, "/audit").await;
    assert!(
        html.contains("dana&#x27;s decision that must stay visible")
            || html.contains("dana's decision that must stay visible")
    );
    assert!(!html.contains("agent noise"));
    // Everything, a page at a time, with a link to older lines.
    let html = lead.page(&harness.base, "/audit?all=1").await;
    assert!(html.contains("agent noise 5999"));
    assert!(
        !html.contains("agent noise 5000"),
        "one page, not the whole trail"
    );
    assert!(html.contains("before="), "a link to older lines");
}

/// Runs the binary's own command line against a database.
fn command(url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_saga-harness"))
        .args(args)
        .env("DATABASE_URL", url)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[tokio::test]
async fn removed_people_changed_roles_and_revoked_tokens_take_effect_at_once() {
    // Several processes share PostgreSQL, so the commands run while the
    // server serves (a SQLite file is one process's).
    let db = crate::common::postgres_or_skip!();
    let token = provision(&db.url, AGENT, &[("dana", "approver"), ("lee", "admin")]).await;
    let harness = TestProcess::start(&Launch::new(&db.url, None)).await;
    let dana = Dashboard::new();
    // Usernames are case-insensitive.
    dana.sign_in(&harness.base, "Dana", PASSWORD).await;
    let lee = Dashboard::new();
    lee.sign_in(&harness.base, "lee", PASSWORD).await;
    let whoami = |who: &Dashboard| {
        let (http, base) = (who.http.clone(), harness.base.clone());
        async move {
            let response = http
                .post(format!("{base}/api/me"))
                .header("origin", &base)
                .form(&[] as &[(&str, &str)])
                .send()
                .await
                .unwrap();
            response.json::<Value>().await.unwrap()
        }
    };
    assert_eq!(whoami(&dana).await["role"], "approver");

    let changed = command(
        &db.url,
        &["user", "role", "--username", "dana", "--role", "viewer"],
    );
    assert!(
        changed.status.success(),
        "{}",
        String::from_utf8_lossy(&changed.stderr)
    );
    assert_eq!(
        whoami(&dana).await["role"],
        "viewer",
        "the next request sees the new role"
    );

    let grouped = command(&db.url, &["user", "group", "add", "dana", "billing-leads"]);
    assert!(
        String::from_utf8_lossy(&grouped.stderr).contains("dana is in: billing-leads"),
        "{}",
        String::from_utf8_lossy(&grouped.stderr)
    );
    assert_eq!(
        whoami(&dana).await["groups"],
        serde_json::json!(["billing-leads"]),
        "the next request sees the new group"
    );
    let ungrouped = command(
        &db.url,
        &["user", "group", "remove", "dana", "billing-leads"],
    );
    assert!(ungrouped.status.success());
    assert_eq!(whoami(&dana).await["groups"], serde_json::json!([]));
    let spaced = command(&db.url, &["user", "group", "add", "dana", "billing leads"]);
    assert!(!spaced.status.success());
    assert!(
        String::from_utf8_lossy(&spaced.stderr).contains("is not a group name"),
        "{}",
        String::from_utf8_lossy(&spaced.stderr)
    );

    let removed = command(&db.url, &["user", "remove", "--username", "LEE"]);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let page = lee
        .http
        .get(format!("{}/", harness.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        page.headers()["location"],
        "/login",
        "a removed person is signed out"
    );

    let tools = |token: String| {
        let base = harness.base.clone();
        async move {
            client()
                .get(format!("{base}/api/v1/tools"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(tools(token.clone()).await, 200);
    let revoked = command(&db.url, &["token", "revoke", "--agent", AGENT]);
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    assert_eq!(tools(token).await, 401);

    // A second Dana cannot be created beside the first, and a common
    // password is refused.
    let added = add_user_by_command(&db.url, "DANA", "a long fresh passphrase");
    assert!(!added.status.success());
    assert!(String::from_utf8_lossy(&added.stderr).contains("already exists"));
    let weak = add_user_by_command(&db.url, "kim", "password123");
    assert!(!weak.status.success());
    assert!(String::from_utf8_lossy(&weak.stderr).contains("first guessers try"));
}

#[tokio::test]
async fn expired_sessions_are_deleted_from_the_table() {
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("dana", "approver")]).await;
    // A server made the session table; a session expired in it since.
    let harness = TestProcess::start(&Launch::new(&db.url, None)).await;
    drop(harness);
    let path = db.url.trim_start_matches("sqlite://").to_owned();
    let count = |path: String| async move {
        let mut conn =
            <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!("sqlite://{path}"))
                .await
                .unwrap();
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tower_sessions WHERE id = 'expired-one'")
                .fetch_one(&mut conn)
                .await
                .unwrap();
        n
    };
    {
        let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&db.url)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO tower_sessions (id, data, expiry_date) VALUES ('expired-one', x'00', 1)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    }
    assert_eq!(count(path.clone()).await, 1);
    let harness = TestProcess::start(&Launch::new(&db.url, None)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(path.clone()).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the expired session is still in the table"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(harness);
}

/// One agent token holds at most eight event streams: a ninth ends that
/// token's oldest (a client that went away unseen) and nobody is refused;
/// another token's streams are untouched. Every stream of a token ends
/// within seconds of its revocation by another process; a person's live
/// stream ends when they are removed.
#[tokio::test]
async fn event_streams_are_capped_per_token_and_end_when_the_token_is_revoked() {
    let db = crate::common::postgres_or_skip!();
    let token = provision(&db.url, AGENT, &[("dana", "approver")]).await;
    let other = provision(&db.url, "other-bot", &[]).await;
    let harness = TestProcess::start(&Launch::new(&db.url, None)).await;
    // No overall timeout: the streams stay open.
    let http = reqwest::Client::new();
    let mine = ApiAgent::with_new_run(&harness.base, &token, "watch a run")
        .await
        .run;
    let theirs = ApiAgent::with_new_run(&harness.base, &other, "watch a run")
        .await
        .run;
    let open = |token: &str, run: &str| {
        http.get(format!("{}/api/v1/runs/{run}/events", harness.base))
            .bearer_auth(token)
            .send()
    };
    let mut streams = Vec::new();
    for _ in 0..8 {
        let stream = open(&token, &mine).await.unwrap();
        assert_eq!(stream.status(), 200);
        streams.push(stream);
    }
    let theirs = open(&other, &theirs).await.unwrap();
    assert_eq!(theirs.status(), 200);
    let ninth = open(&token, &mine).await.unwrap();
    assert_eq!(ninth.status(), 200, "a newcomer is never refused");
    let mut oldest = streams.remove(0);
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = oldest.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the token's oldest stream made no room");
    streams.push(ninth);

    let revoked = command(&db.url, &["token", "revoke", "--agent", AGENT]);
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    let started = Instant::now();
    for mut stream in streams {
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(Some(_)) = stream.chunk().await {}
        })
        .await;
        assert!(ended.is_ok(), "a revoked token's stream is still open");
    }
    println!(
        "streams of a revoked token ended after {:?}",
        started.elapsed()
    );
    drop(theirs);

    let dana = Dashboard::new();
    dana.sign_in(&harness.base, "dana", PASSWORD).await;
    let mut live = dana
        .http
        .get(format!("{}/dashboard/events", harness.base))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let removed = command(&db.url, &["user", "remove", "--username", "dana"]);
    assert!(removed.status.success());
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = live.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "a removed person's stream is still open");
}
