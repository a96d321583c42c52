//! `saga-harness doctor`: checks what a new user gets wrong first, in the
//! order they would hit it, and says in plain words what to fix. The tools
//! file's validation; each connector's credentials; each system reachable
//! and its lookup answering (read-only probes: a lookup of a key that was
//! never used); the database's migrations and durability settings. Nothing
//! is written anywhere: the database is read, never migrated.

use crate::connectors::wire::{Timeouts, Wire};
use crate::connectors::ConnectorSet;
use crate::saga::connector::{Connector, LookupError};
use crate::saga::observe::system_of;
use crate::saga::registry::Registry;
use serde_json::{json, Value};
use sqlx::{Connection, Row};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// One finding: fine, worth knowing, or something to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    Ok(String),
    Note(String),
    Fix(String),
}

/// Every finding under its heading, in the order they were made.
#[derive(Debug, Default)]
pub struct Report {
    pub sections: Vec<(String, Vec<Finding>)>,
}

impl Report {
    fn section(&mut self, title: impl Into<String>) -> &mut Vec<Finding> {
        self.sections.push((title.into(), Vec::new()));
        &mut self.sections.last_mut().expect("just pushed").1
    }

    /// How many findings ask for a fix.
    pub fn fixes(&self) -> usize {
        self.sections
            .iter()
            .flat_map(|(_, findings)| findings)
            .filter(|f| matches!(f, Finding::Fix(_)))
            .count()
    }

    /// The report as a person reads it.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (title, findings) in &self.sections {
            let _ = writeln!(out, "{title}");
            for finding in findings {
                let (mark, text) = match finding {
                    Finding::Ok(text) => ("ok  ", text),
                    Finding::Note(text) => ("note", text),
                    Finding::Fix(text) => ("FIX ", text),
                };
                let _ = writeln!(out, "  {mark}  {text}");
            }
        }
        let _ = match self.fixes() {
            0 => writeln!(out, "\nnothing to fix"),
            1 => writeln!(out, "\n1 thing to fix"),
            n => writeln!(out, "\n{n} things to fix"),
        };
        out
    }
}

/// How long a system has to answer a probe before it counts as down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks the tools file at `tools` (if given) and the database at
/// `database_url`.
pub async fn examine(
    tools: Option<&Path>,
    database_url: &str,
    sign_in: &crate::config::SignIn,
) -> Report {
    let mut report = Report::default();
    if let Some(path) = tools {
        if let Some(registry) = tools_file(
            path,
            report.section(format!("tools file {}", path.display())),
        ) {
            let connectors = credentials(&registry, report.section("credentials"));
            systems(&registry, &connectors, report.section("systems")).await;
            if registry.connector_settings().contains_key("mcp") {
                upstream_tools(&registry, report.section("upstream MCP tools")).await;
            }
        }
    } else {
        report.section("tools file").push(Finding::Fix(
            "no tools file named: give --tools FILE (or SAGA_TOOLS); without one agents can call nothing".into(),
        ));
    }
    database(
        database_url,
        report.section(format!("database {}", crate::store::redact(database_url))),
    )
    .await;
    if sign_in.oidc_issuer.is_some() || sign_in.oidc_client_id.is_some() {
        identity_provider(sign_in, report.section("identity provider")).await;
    }
    report
}

/// Signing in through the identity provider: its configuration, discovery,
/// keys, and the client id and secret.
async fn identity_provider(sign_in: &crate::config::SignIn, findings: &mut Vec<Finding>) {
    // The redirect address does not matter to these checks.
    let here: url::Url = "http://localhost/".parse().expect("a URL");
    match crate::oidc::SignInPolicy::from_settings(sign_in, &here) {
        Err(problem) => findings.push(Finding::Fix(problem)),
        Ok(policy) => {
            if let Some(provider) = policy.provider {
                findings.extend(provider.examine().await.into_iter().map(|line| match line {
                    Ok(fine) => Finding::Ok(fine),
                    Err(fix) => Finding::Fix(fix),
                }));
            }
        }
    }
}

fn tools_file(path: &Path, findings: &mut Vec<Finding>) -> Option<Registry> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) => {
            findings.push(Finding::Fix(format!("cannot read it: {err}")));
            return None;
        }
    };
    match Registry::from_toml(&text) {
        Ok(registry) => {
            findings.push(Finding::Ok(format!("valid: {} tools", registry.len())));
            Some(registry)
        }
        Err(err) => {
            for line in err.to_string().lines().filter(|l| !l.trim().is_empty()) {
                findings.push(Finding::Fix(line.trim().to_owned()));
            }
            None
        }
    }
}

/// One connector's settings, for building it alone: a mistake in one
/// (a missing credential) must not hide what the others say.
fn each_connector(settings: &toml::Table) -> Vec<(String, toml::Table)> {
    let mut one_each = Vec::new();
    for (name, value) in settings {
        match (name.as_str(), value.as_table()) {
            // Upstream MCP servers are started and listed by `serve`.
            ("mcp", _) => {}
            ("http", Some(apis)) => {
                for (api, table) in apis {
                    let mut http = toml::Table::new();
                    http.insert(api.clone(), table.clone());
                    let mut one = toml::Table::new();
                    one.insert("http".into(), toml::Value::Table(http));
                    one_each.push((api.clone(), one));
                }
            }
            _ => {
                let mut one = toml::Table::new();
                one.insert(name.clone(), value.clone());
                one_each.push((name.clone(), one));
            }
        }
    }
    one_each
}

/// Builds every connector, saying which credentials are missing.
fn credentials(registry: &Registry, findings: &mut Vec<Finding>) -> BTreeMap<String, ConnectorSet> {
    let wire = Wire::new(&Timeouts::default());
    let mut built = BTreeMap::new();
    for (system, settings) in each_connector(registry.connector_settings()) {
        match ConnectorSet::from_settings(&settings, &wire) {
            Ok(set) => {
                findings.push(Finding::Ok(format!(
                    "{system}: configured, credentials present"
                )));
                built.insert(system, set);
            }
            Err(mistakes) => {
                for mistake in mistakes {
                    findings.push(Finding::Fix(mistake));
                }
            }
        }
    }
    built
}

/// Each upstream MCP server's tools: what the server claims in its
/// annotations, and the class the harness gives each. A read-only claim
/// the tools file does not trust is pointed out, since every call of that
/// tool will wait for a person.
async fn upstream_tools(registry: &Registry, findings: &mut Vec<Finding>) {
    use crate::saga::class::ToolClass;
    for (server, inspected) in crate::mcp::upstream::inspect(registry).await {
        let tools = match inspected {
            Ok(tools) => tools,
            Err(problem) => {
                findings.push(Finding::Fix(format!(
                    "upstream MCP server `{server}`: {problem}"
                )));
                continue;
            }
        };
        for tool in tools {
            let source = if tool.declared {
                "as the tools file declares it"
            } else {
                "not declared in the tools file"
            };
            let line = format!(
                "{server}: {} ({}): {}, {source}",
                tool.name,
                tool.hints,
                tool.class.as_str()
            );
            let untrusted_claim = !tool.declared
                && tool.hints.read_only == Some(true)
                && tool.class == ToolClass::Irreversible;
            if untrusted_claim {
                findings.push(Finding::Note(format!(
                    "{line}; its read-only claim is not trusted, so each call waits for a person \
                     (declare it `class = \"pure\"`, or set `trust_read_only_hints = true` on the server)"
                )));
            } else {
                findings.push(Finding::Ok(line));
            }
        }
    }
}

/// Every operation the tools file uses (calls, ways back, correction
/// channels), by system, each with the arguments its probe sends.
fn operations_by_system(registry: &Registry) -> BTreeMap<String, Vec<(String, Value)>> {
    let mut by_system: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
    // Agents' own tools first: their schemas fill the probe's arguments,
    // where a way back's arguments come from a step that does not exist.
    let mut specs: Vec<_> = registry.tools().collect();
    specs.sort_by_key(|spec| spec.way_back_only || spec.schema.is_none());
    for spec in specs {
        let mut operations = vec![(spec.connector.clone(), probe_args(spec.schema.as_ref()))];
        operations.extend(
            spec.correction_channels()
                .into_iter()
                .map(|op| (op.to_owned(), json!({}))),
        );
        for (operation, args) in operations {
            let list = by_system
                .entry(system_of(&operation).to_owned())
                .or_default();
            if !list.iter().any(|(known, _)| *known == operation) {
                list.push((operation, args));
            }
        }
    }
    by_system
}

/// Arguments for a lookup probe: every field the tool's schema declares,
/// filled with a value no real call carries, so a lookup that reads an
/// original's key from the arguments (`ticket_key` …) still asks its system.
fn probe_args(schema: Option<&Value>) -> Value {
    let mut args = serde_json::Map::new();
    let properties = schema
        .and_then(|schema| schema.get("properties"))
        .and_then(Value::as_object);
    for (field, property) in properties.into_iter().flatten() {
        let value = match property.get("type").and_then(Value::as_str) {
            Some("string") => json!(PROBE_TEXT),
            Some("integer") | Some("number") => json!(1),
            Some("boolean") => json!(false),
            Some("array") => json!([]),
            _ => continue,
        };
        args.insert(field.clone(), value);
    }
    Value::Object(args)
}

const PROBE_TEXT: &str = "saga-doctor-probe";

/// Each system: its address opened (a system that does not accept a
/// connection is down, whatever else is wrong), then its lookup asked for a
/// key never used (read-only); where it has no lookup, being reachable is
/// all there is to know.
async fn systems(
    registry: &Registry,
    connectors: &BTreeMap<String, ConnectorSet>,
    findings: &mut Vec<Finding>,
) {
    let settings = each_connector(registry.connector_settings());
    for (system, operations) in operations_by_system(registry) {
        let address = settings
            .iter()
            .find(|(name, _)| *name == system)
            .and_then(|(_, table)| address_of(table));
        let reached = match &address {
            Some(address) => reachable(&system, address).await,
            None => Finding::Note(format!("{system}: no address to probe")),
        };
        let (Finding::Ok(mut reached), Some(set)) = (reached.clone(), connectors.get(&system))
        else {
            // Down, or not configured here: nothing more can be asked.
            findings.push(match (reached, connectors.contains_key(&system)) {
                (Finding::Ok(text), false) => Finding::Ok(format!(
                    "{text}; not configured here, so its lookup is not probed"
                )),
                (other, _) => other,
            });
            continue;
        };
        let probe = format!("{PROBE_TEXT}-{}", uuid::Uuid::new_v4().simple());
        let mut answered = None;
        let mut failed = None;
        let mut has_lookup = false;
        for (operation, args) in operations.iter().filter(|(op, _)| set.has_lookup(op)) {
            has_lookup = true;
            let started = Instant::now();
            let asked =
                tokio::time::timeout(PROBE_TIMEOUT, set.lookup(operation, &probe, args)).await;
            match asked {
                Ok(Ok(_)) => {
                    answered = Some((operation.clone(), started.elapsed()));
                    break;
                }
                Ok(Err(LookupError::Unsupported)) => {}
                Ok(Err(LookupError::Unavailable(reason))) => {
                    failed.get_or_insert((operation.clone(), reason));
                }
                Err(_) => {
                    failed.get_or_insert((
                        operation.clone(),
                        format!("no answer in {} s", PROBE_TIMEOUT.as_secs()),
                    ));
                }
            }
        }
        findings.push(match (answered, failed) {
            (Some((operation, took)), _) => {
                reached.push_str(&format!(
                    ", its lookup answers ({operation}, {} ms)",
                    took.as_millis()
                ));
                Finding::Ok(reached)
            }
            (None, Some((operation, reason))) => Finding::Fix(format!(
                "{system}: reachable{}, but the lookup of {operation} failed: {reason}. \
                 Check its credentials and settings in [connectors]; until its lookup \
                 answers, unknown outcomes wait",
                address.map(|a| format!(" at {a}")).unwrap_or_default()
            )),
            (None, None) => {
                if !has_lookup {
                    reached.push_str(
                        "; it has no lookup, so an unknown outcome is a question for a person",
                    );
                }
                Finding::Ok(reached)
            }
        });
    }
}

/// Where a connector's settings say its system listens: `base_url`, or
/// `host` and `port`.
fn address_of(settings: &toml::Table) -> Option<String> {
    let table = settings.values().next()?.as_table()?;
    // An HTTP API's settings sit one level deeper (`[connectors.http.NAME]`).
    let table = match table.get("base_url").or(table.get("host")) {
        Some(_) => table,
        None => table.values().next()?.as_table()?,
    };
    if let Some(base) = table.get("base_url").and_then(|v| v.as_str()) {
        let url = url::Url::parse(base).ok()?;
        return Some(format!(
            "{}:{}",
            url.host_str()?,
            url.port_or_known_default()?
        ));
    }
    let host = table.get("host")?.as_str()?;
    let port = table.get("port")?.as_integer()?;
    Some(format!("{host}:{port}"))
}

async fn reachable(system: &str, address: &str) -> Finding {
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(_)) => Finding::Ok(format!("{system}: reachable at {address}")),
        Ok(Err(err)) => Finding::Fix(format!(
            "{system}: not reachable at {address}: {err}. Start it, or correct its address in [connectors]"
        )),
        Err(_) => Finding::Fix(format!(
            "{system}: no answer from {address} in {} s",
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

async fn database(url: &str, findings: &mut Vec<Finding>) {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        postgres(url, findings).await
    } else if url.starts_with("sqlite:") {
        sqlite(url, findings).await
    } else {
        findings.push(Finding::Fix(
            "not a database URL this build opens: use sqlite://FILE or postgres://USER:PASSWORD@HOST/DATABASE".into(),
        ));
    }
}

async fn postgres(url: &str, findings: &mut Vec<Finding>) {
    let mut conn = match sqlx::PgConnection::connect(url).await {
        Ok(conn) => conn,
        Err(err) => {
            findings.push(Finding::Fix(format!("cannot connect: {err}")));
            return;
        }
    };
    let mut settings = BTreeMap::new();
    for name in [
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "max_connections",
    ] {
        let value = sqlx::raw_sql(&format!("SHOW {name}"))
            .fetch_one(&mut conn)
            .await
            .ok()
            .and_then(|row| row.try_get::<String, _>(0).ok())
            .unwrap_or_else(|| "unknown".to_owned());
        settings.insert(name, value);
    }
    let setting = |name: &str| settings.get(name).cloned().unwrap_or_default();
    let (fsync, synchronous_commit, full_page_writes, max_connections) = (
        setting("fsync"),
        setting("synchronous_commit"),
        setting("full_page_writes"),
        setting("max_connections"),
    );
    findings.push(match fsync.as_str() {
        "on" => Finding::Ok("fsync = on: a commit survives the machine losing power".into()),
        other => Finding::Fix(format!(
            "fsync = {other}: a power cut can lose intents the harness already acted on; set fsync = on"
        )),
    });
    findings.push(match synchronous_commit.as_str() {
        "on" | "remote_apply" | "remote_write" => Finding::Ok(format!(
            "synchronous_commit = {synchronous_commit}: an intent is on disk before its call goes out"
        )),
        other => Finding::Fix(format!(
            "synchronous_commit = {other}: an intent may not be on disk when its call goes out (R2); \
             set synchronous_commit = on (the harness relaxes it itself only where a lookup can rebuild the row)"
        )),
    });
    findings.push(match full_page_writes.as_str() {
        "on" => Finding::Ok("full_page_writes = on".into()),
        other => Finding::Fix(format!(
            "full_page_writes = {other}: a crash mid-write can tear pages; set it on"
        )),
    });
    findings.push(Finding::Note(format!(
        "max_connections = {max_connections}: each harness instance opens up to 32"
    )));
    let needed = crate::store::postgres::newest_migration_needed();
    let applied = sqlx::raw_sql("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(&mut conn)
        .await
        .ok()
        .and_then(|row| row.try_get::<Option<i64>, _>(0).ok().flatten());
    findings.push(migrations(applied, needed));
    let _ = conn.close().await;
}

async fn sqlite(url: &str, findings: &mut Vec<Finding>) {
    use sqlx::sqlite::SqliteConnectOptions;
    use std::str::FromStr;
    let options = match SqliteConnectOptions::from_str(url) {
        Ok(options) => options,
        Err(err) => {
            findings.push(Finding::Fix(format!("not a SQLite URL: {err}")));
            return;
        }
    };
    let path = options.get_filename().to_path_buf();
    if !path.exists() {
        findings.push(Finding::Note(format!(
            "{} does not exist yet: the harness creates it at its first start (WAL, synchronous = FULL for intents)",
            path.display()
        )));
        return;
    }
    let mut conn = match sqlx::SqliteConnection::connect_with(&options.read_only(true)).await {
        Ok(conn) => conn,
        Err(err) => {
            findings.push(Finding::Fix(format!(
                "cannot open {}: {err}",
                path.display()
            )));
            return;
        }
    };
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .unwrap_or_else(|_| "unknown".to_owned());
    findings.push(if journal.eq_ignore_ascii_case("wal") {
        Finding::Ok(
            "journal mode WAL; the harness commits intents with synchronous = FULL (on disk before the call) \
             and lazy outcomes with NORMAL"
                .into(),
        )
    } else {
        Finding::Note(format!(
            "journal mode {journal}: the harness switches the file to WAL when it opens it"
        ))
    });
    let needed = crate::store::sqlite::newest_migration_needed();
    let applied: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(&mut conn)
            .await
            .ok()
            .flatten();
    findings.push(migrations(applied, needed));
    let _ = conn.close().await;
}

fn migrations(applied: Option<i64>, needed: i64) -> Finding {
    match applied {
        Some(version) if version == needed => {
            Finding::Ok(format!("migrations current ({version})"))
        }
        Some(version) if version > needed => Finding::Fix(format!(
            "the database is at migration {version}, newer than this build's {needed}: run the newer harness"
        )),
        Some(version) => Finding::Note(format!(
            "the database is at migration {version}; this build applies up to {needed} when it starts \
             (behind a transaction pooler, run `saga-harness migrate` against PostgreSQL itself first)"
        )),
        None => Finding::Note(format!(
            "no migrations applied yet: the harness applies all {needed} when it starts"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_what_to_fix_and_says_it_last() {
        let mut report = Report::default();
        report.section("systems").extend([
            Finding::Ok("stripe: reachable".into()),
            Finding::Fix("jira: not reachable".into()),
        ]);
        assert_eq!(report.fixes(), 1);
        let text = report.text();
        assert!(text.contains("FIX   jira: not reachable"), "{text}");
        assert!(text.ends_with("1 thing to fix\n"), "{text}");
    }

    #[test]
    fn a_connectors_address_is_its_base_url_or_its_host_and_port() {
        let stripe: toml::Table =
            toml::from_str("[stripe]\nbase_url = \"http://127.0.0.1:4101\"").unwrap();
        assert_eq!(address_of(&stripe).as_deref(), Some("127.0.0.1:4101"));
        let smtp: toml::Table = toml::from_str("[smtp]\nhost = \"mail\"\nport = 25").unwrap();
        assert_eq!(address_of(&smtp).as_deref(), Some("mail:25"));
        let http: toml::Table =
            toml::from_str("[http.orders]\nbase_url = \"https://orders.example.com\"").unwrap();
        assert_eq!(address_of(&http).as_deref(), Some("orders.example.com:443"));
    }
}
