//! Bad input, against the real binary (§5): generated request bodies,
//! headers, query strings, paths and methods on every agent API route never
//! produce a 5xx or kill a request; every refusal is a 4xx carrying a JSON
//! `code`. SQL metacharacters and HTML/script in every text field are inert:
//! stored and returned verbatim, shown as text in the dashboard. Malformed
//! tools files each stop start-up with one clear error.
//!
//! `SAGA_FUZZ_CASES=N` (default 2000 per backend) sets the number of
//! generated requests; `SAGA_FUZZ_SEED=S` replays a run.

use crate::common;

use common::process::{provision, tools_file, Dashboard, Launch, TestProcess, PASSWORD};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use saga_harness::sim::bundle::Simulators;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const AGENT: &str = "support-bot";

/// Text an attacker would try in any field: SQL, HTML, script, template
/// and shell syntax, control and odd Unicode characters.
const NASTY: &[&str] = &[
    "'; DROP TABLE runs; --",
    "\" OR \"1\"=\"1",
    "' OR 1=1 --",
    "1); DELETE FROM saga_log WHERE (1=1",
    "%' AND label LIKE '%",
    "\\'; SELECT pg_sleep(5); --",
    "<script>alert('saga')</script>",
    "</textarea><script>alert('saga')</script>",
    "<img src=x onerror=alert(1)>",
    "\"><svg/onload=alert(1)>",
    "javascript:alert(1)",
    "]]></x><!--",
    "{{7*7}} ${7*7} {key} {args.amount}",
    "$(touch saga-pwned) `id`",
    "line one\r\nSet-Cookie: planted=1",
    "nul \u{0} byte",
    "\u{202e}gnp.exe \u{1f600} \u{fffd}",
    "",
    " ",
];

fn cases() -> usize {
    std::env::var("SAGA_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000)
}

/// What the generator aims at: real runs of this agent and another, and
/// the tools the registry has.
struct Aim {
    runs: Vec<String>,
    foreign_run: String,
    token: String,
    tools: Vec<String>,
}

/// One generated request.
#[derive(Debug)]
struct Case {
    method: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Option<Vec<u8>>,
}

const ROUTES: &[(&str, &str)] = &[
    ("POST", "/api/v1/runs"),
    ("GET", "/api/v1/runs/{run}"),
    ("POST", "/api/v1/runs/{run}/calls"),
    ("POST", "/api/v1/runs/{run}/pivot"),
    ("POST", "/api/v1/runs/{run}/unwind"),
    ("POST", "/api/v1/runs/{run}/complete"),
    ("GET", "/api/v1/runs/{run}/events"),
    ("GET", "/api/v1/tools"),
    ("GET", "/api/v1/openapi.json"),
];

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.gen_range(0..items.len())]
}

fn text(rng: &mut StdRng) -> String {
    match rng.gen_range(0..6) {
        0 => pick(rng, NASTY).to_string(),
        1 => "x".repeat(rng.gen_range(0..5000)),
        2 => (0..rng.gen_range(0..40))
            .map(|_| char::from_u32(rng.gen_range(0..0x11000)).unwrap_or('?'))
            .collect(),
        3 => format!("{}", rng.gen::<i64>()),
        _ => [
            "kettle",
            "cus_ada",
            "ord_1001",
            "ada@example.com",
            "#support",
        ][rng.gen_range(0..5)]
        .to_owned(),
    }
}

fn number(rng: &mut StdRng) -> Value {
    match rng.gen_range(0..7) {
        0 => json!(rng.gen::<i64>()),
        1 => json!(-rng.gen_range(0..100)),
        2 => json!(rng.gen_range(0..5)),
        3 => json!(rng.gen::<f64>() * 1e12),
        4 => json!(u64::MAX),
        5 => json!(i64::MIN),
        _ => json!(0),
    }
}

fn value(rng: &mut StdRng, depth: u32) -> Value {
    let top = if depth >= 4 { 4 } else { 7 };
    match rng.gen_range(0..top) {
        0 => Value::Null,
        1 => json!(rng.gen::<bool>()),
        2 => number(rng),
        3 => json!(text(rng)),
        4 => json!(text(rng)),
        5 => Value::Array(
            (0..rng.gen_range(0..4))
                .map(|_| value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut map = serde_json::Map::new();
            for _ in 0..rng.gen_range(0..5) {
                let key = pick(
                    rng,
                    &[
                        "amount",
                        "customer",
                        "to",
                        "subject",
                        "body",
                        "order_id",
                        "items",
                        "email",
                        "summary",
                        "channel",
                        "text",
                        "currency",
                        "intent_key",
                        "receipt",
                        "x",
                    ],
                )
                .to_string();
                map.insert(key, value(rng, depth + 1));
            }
            Value::Object(map)
        }
    }
}

/// A body shaped like the route's, then bent: wrong types, extra or
/// missing fields, odd tools and steps.
fn shaped_body(rng: &mut StdRng, path: &str, aim: &Aim) -> Value {
    let tool = |rng: &mut StdRng| -> Value {
        if rng.gen_bool(0.8) {
            json!(pick(rng, &aim.tools))
        } else {
            value(rng, 3)
        }
    };
    let mut body = if path.ends_with("/calls") {
        json!({"tool": tool(rng), "args": value(rng, 1), "step": number(rng)})
    } else if path.ends_with("/pivot") {
        let commit: Vec<Value> = (0..rng.gen_range(0..4))
            .map(|_| json!({"tool": tool(rng), "args": value(rng, 1)}))
            .collect();
        json!({"summary": text(rng), "commit": commit})
    } else if path.ends_with("/unwind") {
        json!({"reason": text(rng)})
    } else {
        json!({"label": text(rng), "purpose": text(rng)})
    };
    if let Some(map) = body.as_object_mut() {
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            match rng.gen_range(0..8) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    map.insert(key, value(rng, 2));
                }
                _ => {}
            }
        }
        if rng.gen_bool(0.1) {
            map.insert(text(rng), value(rng, 2));
        }
    }
    if rng.gen_bool(0.05) {
        return value(rng, 0);
    }
    body
}

fn raw_body(rng: &mut StdRng, shaped: &Value) -> Vec<u8> {
    let text = shaped.to_string();
    match rng.gen_range(0..9) {
        0 => text.as_bytes()[..rng.gen_range(0..=text.len())].to_vec(),
        1 => (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect(),
        2 => "[".repeat(rng.gen_range(100..5000)).into_bytes(),
        3 => vec![b' '; 300 * 1024],
        4 => Vec::new(),
        5 => b"{\"step\": 1e400, \"tool\": \"x\"}".to_vec(),
        6 => {
            let mut bytes = text.into_bytes();
            if !bytes.is_empty() {
                let at = rng.gen_range(0..bytes.len());
                bytes[at] = 0xff;
            }
            bytes
        }
        7 => format!("{text}{text}").into_bytes(),
        _ => text.into_bytes(),
    }
}

fn run_segment(rng: &mut StdRng, aim: &Aim) -> String {
    match rng.gen_range(0..12) {
        0..=5 => pick(rng, &aim.runs).clone(),
        6 => aim.foreign_run.clone(),
        7 => uuid::Uuid::new_v4().to_string(),
        8 => pick(rng, &aim.runs).to_uppercase(),
        9 => format!("{{{}}}", pick(rng, &aim.runs)),
        _ => pick(
            rng,
            &[
                "not-a-uuid",
                "%00",
                "%ff%fe",
                "'%20OR%201=1--",
                "..%2f..%2fetc%2fpasswd",
                "%3Cscript%3E",
                "%F0%9F%98%80",
                "0",
                "-1",
                "%25",
                "a%20b",
            ],
        )
        .to_string(),
    }
}

fn query(rng: &mut StdRng) -> String {
    if rng.gen_bool(0.7) {
        return String::new();
    }
    let parts: Vec<String> = (0..rng.gen_range(1..5))
        .map(|_| {
            pick(
                rng,
                &[
                    "step=1",
                    "x=%zz",
                    "a=b&&&c",
                    "label=%27%3B%20DROP",
                    "=",
                    "%",
                    "page=-1",
                    "tool=charge_card",
                    "q=%3Cscript%3E",
                    "debug=true",
                ],
            )
            .to_string()
        })
        .collect();
    format!("?{}", parts.join("&"))
}

fn generate(rng: &mut StdRng, aim: &Aim) -> Case {
    let (method, template) = if rng.gen_bool(0.03) {
        ("GET", "/api/v1/{run}/nothing/here")
    } else {
        *pick(rng, ROUTES)
    };
    let method = if rng.gen_bool(0.1) {
        pick(
            rng,
            &["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"],
        )
        .to_string()
    } else {
        method.to_owned()
    };
    let path = format!(
        "{}{}",
        template.replace("{run}", &run_segment(rng, aim)),
        query(rng)
    );
    let mut headers = Vec::new();
    let authorization: Vec<u8> = match rng.gen_range(0..24) {
        0 => Vec::new(),
        1 => b"Bearer".to_vec(),
        2 => b"Bearer ".to_vec(),
        3 => format!("Basic {}", aim.token).into_bytes(),
        4 => format!("bearer {}", aim.token).into_bytes(),
        5 => format!("Bearer {}x", aim.token).into_bytes(),
        6 => format!("Bearer {}", "A".repeat(4000)).into_bytes(),
        7 => b"Bearer \xff\xfe\x80".to_vec(),
        8 => format!("Bearer {}", pick(rng, NASTY))
            .replace(['\r', '\n', '\0'], "")
            .into_bytes(),
        _ => format!("Bearer {}", aim.token).into_bytes(),
    };
    if !authorization.is_empty() {
        headers.push(("authorization".to_owned(), authorization));
    }
    let content_type: &[u8] = match rng.gen_range(0..12) {
        0 => b"",
        1 => b"text/plain",
        2 => b"application/x-www-form-urlencoded",
        3 => b"application/json; charset=latin1",
        4 => b"multipart/form-data; boundary=x",
        5 => b"application/json\xff",
        6 => b"application/jsonx",
        _ => b"application/json",
    };
    if !content_type.is_empty() {
        headers.push(("content-type".to_owned(), content_type.to_vec()));
    }
    for _ in 0..rng.gen_range(0..3) {
        let (name, value): (&str, Vec<u8>) = match rng.gen_range(0..6) {
            0 => (
                "last-event-id",
                text(rng).replace(['\r', '\n', '\0'], "").into_bytes(),
            ),
            1 => ("accept", b"text/html, */*;q=0.1".to_vec()),
            2 => ("x-forwarded-for", b"'; DROP TABLE runs; --".to_vec()),
            3 => ("origin", b"https://evil.example".to_vec()),
            4 => ("accept-encoding", b"gzip, br, \xff".to_vec()),
            _ => (
                "cookie",
                b"saga_session=../../etc/passwd; other=\xfe".to_vec(),
            ),
        };
        headers.push((name.to_owned(), value));
    }
    let body = if method == "GET" || method == "HEAD" || rng.gen_bool(0.05) {
        None
    } else {
        let shaped = shaped_body(rng, &path, aim);
        Some(raw_body(rng, &shaped))
    };
    Case {
        method,
        path,
        headers,
        body,
    }
}

async fn send(
    http: &reqwest::Client,
    base: &str,
    case: &Case,
) -> Result<(u16, Value, String), String> {
    let method = reqwest::Method::from_bytes(case.method.as_bytes()).unwrap();
    let mut request = http.request(method, format!("{base}{}", case.path));
    for (name, value) in &case.headers {
        let value = reqwest::header::HeaderValue::from_bytes(value)
            .map_err(|e| format!("unsendable: {e}"))?;
        request = request.header(name.as_str(), value);
    }
    if let Some(body) = &case.body {
        request = request.body(body.clone());
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("the request failed: {e}"))?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if content_type.starts_with("text/event-stream") {
        // A live stream: the answer is the status; the stream never ends.
        return Ok((status, Value::Null, content_type));
    }
    let bytes = response
        .bytes()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        content_type,
    ))
}

async fn fuzz_every_route(db: common::TestDb, seed: u64) {
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 20);
    let token = provision(&db.url, AGENT, &[("lead", "approver")]).await;
    let other = provision(&db.url, "billing-bot", &[]).await;
    let mut harness = TestProcess::start(&Launch::new(&db.url, Some(&tools))).await;
    // A fresh connection per case: a case the server answers before
    // reading its body closes its connection, which says nothing about
    // the next case.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let new_run = |token: String| {
        let (http, base) = (http.clone(), harness.base.clone());
        async move {
            let created: Value = http
                .post(format!("{base}/api/v1/runs"))
                .bearer_auth(token)
                .json(&json!({"purpose": "fuzz"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            created["run"]["id"].as_str().unwrap().to_owned()
        }
    };
    let mut runs = Vec::new();
    for _ in 0..8 {
        runs.push(new_run(token.clone()).await);
    }
    let tools_listed: Value = http
        .get(format!("{}/api/v1/tools", harness.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut aim = Aim {
        runs,
        foreign_run: new_run(other).await,
        token: token.clone(),
        tools: tools_listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect(),
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut unsendable = 0;
    let total = cases();
    for n in 0..total {
        // Runs close as the generator unwinds and completes them: keep
        // some open ones to aim at.
        if n % 200 == 199 {
            aim.runs.remove(0);
            aim.runs.push(new_run(token.clone()).await);
        }
        let case = generate(&mut rng, &aim);
        match send(&http, &harness.base, &case).await {
            Err(err) if err.starts_with("unsendable") => {
                // A header value no HTTP client can send: not a case.
                unsendable += 1;
            }
            Err(err) => failures.push(format!("case {n}: {err}: {case:?}")),
            Ok((status, body, content_type)) => {
                *statuses.entry(status).or_default() += 1;
                if status >= 500 {
                    failures.push(format!("case {n}: {status} {body}: {case:?}"));
                } else if status >= 400 && case.method != "HEAD" && !body["code"].is_string() {
                    failures.push(format!(
                        "case {n}: {status} without a JSON code ({content_type}): {case:?}"
                    ));
                }
            }
        }
        if failures.len() >= 10 {
            break;
        }
    }
    let forms = fuzz_server_functions(&harness.base, &mut rng, &aim.runs, total / 4)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", harness.log_text()));
    eprintln!(
        "bad_input: {} generated dashboard forms sent, statuses {forms:?}, 0 5xx",
        forms.values().sum::<usize>()
    );
    assert!(
        harness.is_running(),
        "the harness died:\n{}",
        harness.log_text()
    );
    let health = http
        .get(format!("{}/healthz", harness.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    harness.kill();
    let log = harness.log_text();
    eprintln!(
        "bad_input: {} generated requests sent (SAGA_FUZZ_SEED={seed}), statuses {statuses:?}, {} 5xx",
        total - unsendable,
        statuses.range(500..).map(|(_, n)| n).sum::<usize>()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(!log.contains("panicked"), "the harness panicked:\n{log}");
}

/// The dashboard's server functions and the fields their forms carry.
const SERVER_FUNCTIONS: &[(&str, &[&str])] = &[
    ("decide_pivot", &["run", "approval", "digest", "decision"]),
    ("decide_step", &["run", "approval", "digest", "decision"]),
    ("answer_question", &["run", "step", "asked", "happened"]),
    ("answer_compensation", &["run", "step", "asked", "undone"]),
    ("unwind_run", &["run", "reason"]),
    ("send_correction", &["id", "message"]),
    ("answer_correction_send", &["id", "went_out"]),
    ("dismiss_correction", &["id", "reason"]),
    ("runs", &["status", "page"]),
    ("run_detail", &["id"]),
    ("corrections_inbox", &[]),
    ("audit_trail", &["everything"]),
    ("nav_counts", &[]),
    ("me", &[]),
    ("login", &["username", "password"]),
];

/// Generated forms for every server function, posted by a signed-in
/// approver: a person's mistakes are refusals too, never a 5xx.
async fn fuzz_server_functions(
    base: &str,
    rng: &mut StdRng,
    runs: &[String],
    cases: usize,
) -> Result<BTreeMap<u16, usize>, String> {
    let lead = Dashboard::new();
    lead.sign_in(base, "lead", PASSWORD).await;
    let mut statuses = BTreeMap::new();
    for n in 0..cases {
        let (endpoint, fields) = *pick(rng, SERVER_FUNCTIONS);
        if endpoint == "login" && rng.gen_bool(0.9) {
            continue; // five failures would lock the account out; a few are plenty
        }
        let mut form: Vec<(String, String)> = Vec::new();
        for field in fields.iter().copied() {
            if rng.gen_bool(0.1) {
                continue;
            }
            let value = match (field, rng.gen_range(0..4)) {
                ("run" | "id", 0) => pick(rng, runs).clone(),
                ("approval" | "step" | "id" | "page", 1) => rng.gen_range(-2..5).to_string(),
                ("decision" | "happened" | "undone", 2) => {
                    pick(rng, &["approve", "reject", "yes", "no"]).to_string()
                }
                ("everything", _) => pick(rng, &["true", "false", "1", "yes"]).to_string(),
                _ => text(rng),
            };
            form.push((field.to_owned(), value));
        }
        if rng.gen_bool(0.1) {
            form.push((text(rng), text(rng)));
        }
        let accept = if rng.gen_bool(0.5) {
            "text/html"
        } else {
            "application/json"
        };
        let response = lead
            .http
            .post(format!("{base}/api/{endpoint}"))
            .header("accept", accept)
            .form(&form)
            .send()
            .await;
        let response = match response {
            Ok(response) => response,
            Err(e) => return Err(format!("case {n}: {endpoint} {form:?}: {e:?}")),
        };
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        assert!(
            status < 500,
            "case {n}: {endpoint} {form:?} answered {status}: {body}"
        );
        *statuses.entry(status).or_default() += 1;
    }
    Ok(statuses)
}

fn seed() -> u64 {
    std::env::var("SAGA_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        })
}

#[tokio::test]
async fn sqlite_generated_requests_on_every_route_are_refused_with_a_4xx_and_a_code() {
    fuzz_every_route(common::sqlite(), seed()).await;
}

#[tokio::test]
async fn postgres_generated_requests_on_every_route_are_refused_with_a_4xx_and_a_code() {
    let db = crate::common::postgres_or_skip!();
    fuzz_every_route(db, seed().wrapping_add(1)).await;
}

/// Every text field an agent or a person writes, through the API and the
/// dashboard, with every nasty string: stored and returned verbatim,
/// escaped in every page, and the database intact afterwards.
async fn nasty_text_is_inert(db: common::TestDb) {
    let sims = Simulators::start("127.0.0.1".parse().unwrap(), 0)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(&sims, dir.path(), 20);
    let token = provision(&db.url, AGENT, &[("lead", "approver")]).await;
    let harness = TestProcess::start(&Launch::new(&db.url, Some(&tools))).await;
    let base = harness.base.clone();
    let http = reqwest::Client::new();
    let api = |path: String, body: Value| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let response = http
                .post(format!("{base}/api/v1{path}"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let read = |path: String| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            http.get(format!("{base}/api/v1{path}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let lead = Dashboard::new();
    lead.sign_in(&base, "lead", PASSWORD).await;
    let page = |path: String| {
        let (http, base) = (lead.http.clone(), base.clone());
        async move {
            let response = http.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            response.text().await.unwrap()
        }
    };
    let mut fields_checked = 0;
    let mut refused = 0;
    for (i, nasty) in NASTY.iter().enumerate() {
        let label = format!("{nasty}#{i}");
        if nasty.contains('\0') {
            // PostgreSQL stores no NUL in text or JSON: refused on every
            // backend alike, never a 500.
            let (status, body) =
                api("/runs".into(), json!({"label": label, "purpose": nasty})).await;
            assert_eq!(
                (status, body["code"].as_str()),
                (422, Some("invalid_body")),
                "{body}"
            );
            let (_, run) = api("/runs".into(), json!({"purpose": "nul"})).await;
            let run = run["run"]["id"].as_str().unwrap().to_owned();
            let (status, body) = api(
                format!("/runs/{run}/calls"),
                json!({"tool": "search_orders", "args": {"customer": {"deep": [nasty]}}}),
            )
            .await;
            assert_eq!(
                (status, body["code"].as_str()),
                (422, Some("invalid_body")),
                "{body}"
            );
            let response = lead
                .post(&base, "unwind_run", &[("run", &run), ("reason", nasty)])
                .await
                .unwrap();
            let location = format!(
                "{} {}",
                response.headers()["location"].to_str().unwrap(),
                common::process::flash(&lead.http, &base).await
            );
            assert!(
                location.contains("error=") && location.contains("NUL"),
                "{location}"
            );
            let response = Dashboard::new()
                .post(
                    &base,
                    "login",
                    &[("username", nasty), ("password", PASSWORD)],
                )
                .await
                .unwrap();
            assert_eq!(response.headers()["location"], "/login?error=1");
            refused += 1;
            fields_checked += 4;
            continue;
        }
        let (status, created) =
            api("/runs".into(), json!({"label": label, "purpose": nasty})).await;
        assert_eq!(status, 201, "{created}");
        let run = created["run"]["id"].as_str().unwrap().to_owned();
        assert_eq!(created["run"]["label"], label.as_str());
        assert_eq!(created["run"]["purpose"], *nasty);
        // The same label finds the same run: the text is a value, not SQL.
        let (again, same) = api("/runs".into(), json!({"label": label, "purpose": "other"})).await;
        assert_eq!(
            (again, same["run"]["id"].as_str()),
            (200, Some(run.as_str()))
        );
        // Into a tool's arguments, out to a system, back from the log.
        let args = json!({"to": "ada@example.com", "subject": nasty, "body": nasty});
        let (status, drafted) = api(
            format!("/runs/{run}/calls"),
            json!({"tool": "create_email_draft", "args": args, "step": 0}),
        )
        .await;
        assert_eq!(
            (status, drafted["outcome"].as_str()),
            (200, Some("confirmed")),
            "{drafted}"
        );
        let (status, searched) = api(
            format!("/runs/{run}/calls"),
            json!({"tool": "search_orders", "args": {"customer": nasty}}),
        )
        .await;
        assert_eq!(status, 200, "{searched}");
        let logged = read(format!("/runs/{run}")).await;
        assert_eq!(logged["steps"][0]["args"], args);
        let draft = sims.orders.ledger().of("draft.created").pop().unwrap();
        assert_eq!(draft.detail["subject"], *nasty, "the system got other text");
        // A pivot summary and an unwind reason, then the pages.
        let (status, _) = api(
            format!("/runs/{run}/pivot"),
            json!({"summary": format!("{nasty} (summary)"), "commit": [
                {"tool": "send_email", "args": {"to": "ada@example.com", "subject": nasty, "body": nasty}}]}),
        )
        .await;
        assert_eq!(status, 200);
        let sheet = page(format!("/runs/{run}")).await;
        let list = page("/".into()).await;
        for html in [&sheet, &list] {
            assert!(
                !html.contains("<script>alert"),
                "a script tag reached a page"
            );
            assert!(!html.contains("<img src=x"), "an img tag reached a page");
            assert!(!html.contains("<svg/onload"), "an svg tag reached a page");
        }
        if nasty.contains('<') {
            assert!(sheet.contains("&lt;"), "the text is not shown escaped");
        }
        // A person rejects the pivot: the run unwinds, the draft goes.
        let (status, pivot_form) = (0, ());
        let _ = (status, pivot_form);
        let proposed = read(format!("/runs/{run}")).await;
        let approval = proposed["pivot"]["id"].to_string();
        let digest = proposed["pivot"]["digest"].as_str().unwrap().to_owned();
        let response = lead
            .post(
                &base,
                "decide_pivot",
                &[
                    ("run", &run),
                    ("approval", &approval),
                    ("digest", &digest),
                    ("decision", "reject"),
                ],
            )
            .await
            .unwrap();
        assert!(response.status().is_redirection());
        assert_eq!(
            read(format!("/runs/{run}")).await["run"]["status"],
            "UNWOUND"
        );
        fields_checked += 6;
    }
    // A person's text: an unwind reason, a correction's edited message and
    // a dismissal reason, and a sign-in with SQL for a username.
    let (_, created) = api("/runs".into(), json!({"purpose": "receipts"})).await;
    let run = created["run"]["id"].as_str().unwrap().to_owned();
    for step in 0..2 {
        let (_, out) = api(
            format!("/runs/{run}/calls"),
            json!({"tool": "charge_card", "step": step,
            "args": {"customer": "cus_ada", "amount": 100 + step, "currency": "usd",
                     "email": "ada@example.com", "receipt": true}}),
        )
        .await;
        assert_eq!(out["outcome"], "confirmed", "{out}");
    }
    let response = lead
        .post(&base, "unwind_run", &[("run", &run), ("reason", NASTY[6])])
        .await
        .unwrap();
    assert!(response.status().is_redirection());
    let inbox: Value = lead
        .http
        .post(format!("{base}/api/corrections_inbox"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let items = inbox["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{inbox}");
    let (first, second) = (items[0]["id"].to_string(), items[1]["id"].to_string());
    let message = format!("{} {}", NASTY[0], NASTY[7]);
    lead.post(
        &base,
        "send_correction",
        &[("id", &first), ("message", &message)],
    )
    .await
    .unwrap();
    lead.post(
        &base,
        "dismiss_correction",
        &[("id", &second), ("reason", NASTY[1])],
    )
    .await
    .unwrap();
    let letter = sims.smtp.ledger().of("email.received").pop().unwrap();
    assert!(
        letter.detail.to_string().contains("DROP TABLE runs"),
        "the letter lost its text: {}",
        letter.detail
    );
    for path in ["/corrections", "/audit?all=1", &format!("/runs/{run}")] {
        let html = page(path.to_owned()).await;
        assert!(!html.contains("<script>alert"), "{path}");
        assert!(!html.contains("\"><svg/onload"), "{path}");
    }
    let audit: Value = lead
        .http
        .post(format!("{base}/api/audit_trail"))
        .header("accept", "application/json")
        .form(&[("everything", "true")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        audit.to_string().contains("alert('saga')"),
        "the unwind reason was lost"
    );
    for username in [NASTY[0], NASTY[1], NASTY[2]] {
        let response = Dashboard::new()
            .post(
                &base,
                "login",
                &[("username", username), ("password", NASTY[2])],
            )
            .await
            .unwrap();
        assert_eq!(response.headers()["location"], "/login?error=1");
    }
    fields_checked += 6;
    // The tables are all still there and hold every run.
    let runs: Value = lead
        .http
        .post(format!("{base}/api/runs"))
        .header("accept", "application/json")
        .form(&[("page", "1")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(runs["total"], NASTY.len() + 1, "{runs}");
    assert_eq!(refused, 1);
    eprintln!(
        "bad_input: {} nasty strings through {fields_checked} text fields: stored and shown verbatim, \
         except {refused} with a NUL character, refused with a 4xx",
        NASTY.len()
    );
}

#[tokio::test]
async fn sqlite_sql_and_html_in_every_text_field_are_inert() {
    nasty_text_is_inert(common::sqlite()).await;
}

#[tokio::test]
async fn postgres_sql_and_html_in_every_text_field_are_inert() {
    let db = crate::common::postgres_or_skip!();
    nasty_text_is_inert(db).await;
}

/// A form field that becomes part of where the browser is sent back to
/// can neither break the response (a control character in a header used to
/// panic the request) nor send the browser to another site.
#[tokio::test]
async fn a_run_field_never_breaks_or_leaves_the_redirect() {
    let db = common::sqlite();
    provision(&db.url, AGENT, &[("lead", "approver")]).await;
    let mut harness = TestProcess::start(&Launch::new(&db.url, None)).await;
    let lead = Dashboard::new();
    lead.sign_in(&harness.base, "lead", PASSWORD).await;
    let runs = [
        "nul \0 byte",
        "line\r\nSet-Cookie: planted=1",
        "x/..\\..\\\\evil.example",
        "//evil.example",
    ];
    for run in runs {
        for endpoint in ["decide_pivot", "decide_step"] {
            let form = [
                ("run", run),
                ("approval", "1"),
                ("digest", "d"),
                ("decision", "approve"),
            ];
            let response = lead.post(&harness.base, endpoint, &form).await.unwrap();
            assert_eq!(response.status(), 400, "{endpoint} with run {run:?}");
            // Leptos points a refused form back at "/"; never elsewhere.
            let location = response
                .headers()
                .get("location")
                .map(|l| l.as_bytes().to_vec());
            assert!(
                location.is_none_or(|l| l == b"/"),
                "{endpoint} with run {run:?}: {:?}",
                response.headers()
            );
        }
        let forms = [
            (
                "answer_question",
                vec![
                    ("run", run),
                    ("step", "0"),
                    ("asked", "2026-01-01T00:00:00Z"),
                    ("happened", "yes"),
                ],
            ),
            ("unwind_run", vec![("run", run), ("reason", "r")]),
        ];
        for (endpoint, form) in forms {
            let response = lead.post(&harness.base, endpoint, &form).await.unwrap();
            assert_eq!(response.status(), 400, "{endpoint} with run {run:?}");
        }
    }
    assert!(harness.is_running());
    let log = harness.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

/// A tool that is fine, to build broken files around.
const GOOD_TOOL: &str = r#"
[[tool]]
name = "search_orders"
class = "pure"
connector = "orders.search_orders"
"#;

const ORDERS: &str = r#"
[connectors.http.orders]
base_url = "http://127.0.0.1:9"
[connectors.http.orders.operations.search_orders]
method = "GET"
path = "/v1/orders?customer={args.customer}"
"#;

/// Malformed tools files, each with what its one error must name.
fn broken_tools_files() -> Vec<(&'static str, String, Vec<&'static str>)> {
    let with = |tool: &str| format!("{ORDERS}{GOOD_TOOL}{tool}");
    vec![
        ("not TOML", "[[tool]\nname = ".to_owned(), vec!["TOML"]),
        ("binary garbage", "\u{0}\u{1}\u{7f}\u{fffd}".to_owned(), vec!["TOML"]),
        ("a tool without a class", with("[[tool]]\nname = \"t\"\nconnector = \"orders.search_orders\"\n"), vec!["`t`", "class"]),
        ("an unknown class", with("[[tool]]\nname = \"t\"\nclass = \"maybe\"\nconnector = \"orders.search_orders\"\n"), vec!["maybe"]),
        ("a class of the wrong type", with("[[tool]]\nname = \"t\"\nclass = 5\nconnector = \"orders.search_orders\"\n"), vec!["class"]),
        ("a reversible tool without undo", with("[[tool]]\nname = \"t\"\nclass = \"reversible\"\nconnector = \"orders.search_orders\"\n"), vec!["`t`", "undo"]),
        ("a compensatable tool without compensation", with("[[tool]]\nname = \"t\"\nclass = \"compensatable\"\nconnector = \"orders.search_orders\"\n"), vec!["`t`", "compensation"]),
        ("an irreversible tool without correction", with("[[tool]]\nname = \"t\"\nclass = \"irreversible\"\nconnector = \"orders.search_orders\"\n"), vec!["`t`", "correction"]),
        ("an undo naming no tool", with("[[tool]]\nname = \"t\"\nclass = \"reversible\"\nconnector = \"orders.search_orders\"\nundo = { tool = \"ghost\", args = {} }\n"), vec!["ghost"]),
        ("a gated reversible tool", with("[[tool]]\nname = \"t\"\nclass = \"reversible\"\ngated = true\nconnector = \"orders.search_orders\"\nundo = { tool = \"search_orders\", args = {} }\n"), vec!["`t`", "gated"]),
        ("the same name twice", with("[[tool]]\nname = \"search_orders\"\nclass = \"pure\"\nconnector = \"orders.search_orders\"\n"), vec!["search_orders"]),
        ("an operation nobody declares", with("[[tool]]\nname = \"t\"\nclass = \"pure\"\nconnector = \"orders.nothing\"\n"), vec!["orders.nothing"]),
        ("an unknown field", with("[[tool]]\nname = \"t\"\nclass = \"pure\"\nconnector = \"orders.search_orders\"\ncolour = \"red\"\n"), vec!["colour"]),
        ("an unknown audience", with("[[tool]]\nname = \"t\"\nclass = \"pure\"\naudience = \"everyone\"\nconnector = \"orders.search_orders\"\n"), vec!["everyone"]),
        ("a negative settle pause", with("[[tool]]\nname = \"t\"\nclass = \"pure\"\nsettle_ms = -5\nconnector = \"orders.search_orders\"\n"), vec!["settle_ms"]),
        ("a way back with an unknown placeholder", with("[[tool]]\nname = \"t\"\nclass = \"reversible\"\nconnector = \"orders.search_orders\"\nundo = { tool = \"search_orders\", args = { x = \"{external_id}\" } }\n"), vec!["external_id"]),
        ("a connector without its base URL", format!("[connectors.stripe]\nsecret_key_env = \"STRIPE_SECRET_KEY\"\n{GOOD_TOOL}{ORDERS}"), vec!["stripe", "base_url"]),
        ("a base URL that is no URL", ORDERS.replace("http://127.0.0.1:9", "not a url") + GOOD_TOOL, vec!["base_url"]),
        ("an unknown Jira flavour", format!("{ORDERS}{GOOD_TOOL}[connectors.jira]\nbase_url = \"http://127.0.0.1:9\"\nflavour = \"onprem\"\nemail_env = \"JIRA_EMAIL\"\napi_token_env = \"JIRA_API_TOKEN\"\nproject = \"SUP\"\n"), vec!["flavour"]),
        ("a credential variable that is not set", format!("{ORDERS}{GOOD_TOOL}[connectors.slack]\nbase_url = \"http://127.0.0.1:9\"\ntoken_env = \"SAGA_TEST_UNSET_VARIABLE\"\n"), vec!["SAGA_TEST_UNSET_VARIABLE"]),
        ("tools as a table, not a list", format!("{ORDERS}[tool]\nname = \"t\"\nclass = \"pure\"\n"), vec!["tool"]),
        ("a nameless tool", with("[[tool]]\nclass = \"pure\"\nconnector = \"orders.search_orders\"\n"), vec!["name"]),
    ]
}

#[tokio::test]
async fn each_malformed_tools_file_stops_start_up_with_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite();
    let mut files = broken_tools_files();
    files.push((
        "a file that does not exist",
        String::new(),
        vec!["no-such-file.toml"],
    ));
    files.push(("a directory", String::new(), vec!["a-directory"]));
    std::fs::create_dir(dir.path().join("a-directory")).unwrap();
    let mut refused = 0;
    for (i, (what, text, names)) in files.iter().enumerate() {
        let path = match *what {
            "a file that does not exist" => dir.path().join("no-such-file.toml"),
            "a directory" => dir.path().join("a-directory"),
            _ => {
                let path = dir.path().join(format!("tools-{i}.toml"));
                std::fs::write(&path, text).unwrap();
                path
            }
        };
        let log = dir.path().join(format!("stderr-{i}.log"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_saga-harness"))
            .args(["serve", "--bind", "127.0.0.1:0", "--tools"])
            .arg(&path)
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "warn")
            .env_remove("SAGA_TEST_UNSET_VARIABLE")
            .envs(saga_harness::sim::bundle::CREDENTIALS.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what}: the harness started and served with this tools file");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(1), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        assert_eq!(
            stderr.matches("error:").count(),
            1,
            "{what}: not one error:\n{stderr}"
        );
        // Said once: no line of the message repeats another.
        let lines: Vec<&str> = stderr.lines().filter(|l| l.len() > 12).collect();
        let distinct: std::collections::HashSet<&str> = lines.iter().copied().collect();
        assert_eq!(
            lines.len(),
            distinct.len(),
            "{what}: the error repeats itself:\n{stderr}"
        );
        for name in names {
            assert!(
                stderr.contains(name),
                "{what}: the error does not name {name}:\n{stderr}"
            );
        }
        refused += 1;
    }
    eprintln!(
        "bad_input: {refused} malformed tools files, each refused at start-up with one error"
    );
}
