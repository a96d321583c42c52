//! Upstream MCP servers: tools another MCP server offers, called through
//! the saga log like any other.
//!
//! The tools file names each server under `[connectors.mcp.NAME]`, reached
//! by a command (stdio) or a URL (streamable HTTP):
//!
//! ```toml
//! [connectors.mcp.everything]
//! command = ["node", "server-everything/dist/index.js", "stdio"]
//! env = ["EVERYTHING_TOKEN"]   # the only variables the command inherits
//! prefix = "everything"        # tools are listed as everything_TOOL
//! timeout_ms = 30000           # no answer by then: the outcome is unknown
//! trust_read_only_hints = false  # true: a tool it marks readOnlyHint is pure
//!
//! [connectors.mcp.tickets]
//! url = "https://mcp.example.com/mcp"
//! token_env = "TICKETS_MCP_TOKEN"
//!
//! # How the step's key reaches create_ticket beyond `_meta`, and how an
//! # unknown answer is settled: another tool of the server finds the effect
//! # by key, and the JSONPath names what is there when it exists.
//! [connectors.mcp.tickets.tools.create_ticket]
//! key_arg = "external_id"
//! lookup = { tool = "find_ticket", args = { external_id = "{key}" }, found = "$.structuredContent.ticket.id" }
//! ```
//!
//! At start-up the harness connects to each, lists its tools and takes them
//! in (see `Registry::adopt_upstream` for how they are classed). A tool's
//! annotations are the server's claims: a tool the tools file does not
//! class is irreversible whatever they say, unless the file trusts that
//! server's `readOnlyHint` (`trust_read_only_hints = true`) or declares the
//! tool itself (`[[tool]] ... connector = "mcp.SERVER.TOOL"`). Each call
//! carries the step's idempotency key in its `_meta` under [`KEY_META`], so
//! an upstream that understands it can deduplicate, and in the argument
//! `key_arg` names (which the agent then neither sees nor sends). A tool
//! with a declared `lookup` is reconciled like Stripe and Jira: an unknown
//! answer is settled by asking the upstream, with the tool's `settle_ms`
//! re-check for a search that lags; without one, it becomes a question for
//! a person, as for SMTP.

use crate::connectors::ConnectorSet;
use crate::saga::class::ToolClass;
use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use crate::saga::registry::{Registry, ToolHints, UpstreamTool};
use async_trait::async_trait;
use rmcp::model::ProtocolVersion;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    RequestMetaObject,
};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientLifecycleMode, ClientServiceExt, Peer, RoleClient};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// The `_meta` field of an upstream call that carries the step's key.
pub const KEY_META: &str = "dev.saga-harness/idempotency-key";

/// Variables every command needs to start; nothing else of the harness's
/// environment (its credentials) reaches an upstream unless named.
const BASE_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TMPDIR"];

/// `[connectors.mcp.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    command: Option<Vec<String>>,
    #[serde(default)]
    env: Vec<String>,
    url: Option<String>,
    token_env: Option<String>,
    prefix: Option<String>,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    /// Take a tool this server marks `readOnlyHint: true` as pure. Off by
    /// default: annotations are untrusted (MCP specification).
    #[serde(default)]
    trust_read_only_hints: bool,
    /// `[connectors.mcp.NAME.tools.TOOL]`: the key's argument and lookup.
    #[serde(default)]
    tools: std::collections::BTreeMap<String, ToolSettings>,
}

/// `[connectors.mcp.NAME.tools.TOOL]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolSettings {
    /// The argument the step's key is put in.
    key_arg: Option<String>,
    lookup: Option<LookupSettings>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupSettings {
    /// Another tool of the same server.
    tool: String,
    /// Its arguments; `{key}` and `{args.FIELD}` are filled from the step.
    #[serde(default)]
    args: toml::Table,
    /// A JSONPath into the lookup's result: present (and not null) when the
    /// effect exists; its value is the step's external reference.
    found: String,
}

/// A tool's declared way to be found again.
#[derive(Debug)]
struct Finding {
    tool: String,
    args: Value,
    found: serde_json_path::JsonPath,
}

/// What the tools file says about one upstream tool.
#[derive(Debug, Default)]
struct Declared {
    key_arg: Option<String>,
    lookup: Option<Finding>,
}

fn default_timeout_ms() -> u64 {
    30_000
}

#[derive(Debug)]
enum Reach {
    Command {
        program: String,
        args: Vec<String>,
        env: Vec<String>,
    },
    Url {
        url: String,
        token_env: Option<String>,
    },
}

/// One upstream MCP server, connected on first need and again after its
/// connection is lost.
pub struct Upstream {
    name: String,
    trust_hints: bool,
    /// By the upstream's own tool name.
    declared: std::collections::BTreeMap<String, Declared>,
    reach: Reach,
    timeout: Duration,
    session: tokio::sync::Mutex<Option<RunningService<RoleClient, ()>>>,
}

impl Upstream {
    fn from_settings(name: &str, value: &toml::Value) -> Result<(Upstream, String), String> {
        let settings: Settings = value
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| e.to_string().trim().to_owned())?;
        let reach = match (settings.command, settings.url) {
            (Some(command), None) => {
                let mut words = command.into_iter();
                let program = words
                    .next()
                    .filter(|p| !p.trim().is_empty())
                    .ok_or("`command` is empty: name the program and its arguments")?;
                if settings.token_env.is_some() {
                    return Err(
                        "`token_env` is for a URL; pass a command its credentials with `env`"
                            .into(),
                    );
                }
                Reach::Command {
                    program,
                    args: words.collect(),
                    env: settings.env,
                }
            }
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!("`url` must be http:// or https://, not {url:?}"));
                }
                if !settings.env.is_empty() {
                    return Err(
                        "`env` is for a command; a URL takes its token from `token_env`".into(),
                    );
                }
                Reach::Url {
                    url,
                    token_env: settings.token_env,
                }
            }
            _ => {
                return Err(
                    "name exactly one of `command` (stdio) and `url` (streamable HTTP)".into(),
                )
            }
        };
        if settings.timeout_ms == 0 {
            return Err("`timeout_ms` must be above 0".into());
        }
        let prefix = settings.prefix.unwrap_or_else(|| name.to_owned());
        let mut declared = std::collections::BTreeMap::new();
        for (tool, settings) in settings.tools {
            let lookup = match settings.lookup {
                None => None,
                Some(lookup) => {
                    let found = serde_json_path::JsonPath::parse(&lookup.found).map_err(|e| {
                        format!(
                            "tools.{tool}.lookup.found: `{}` is not a JSONPath: {e}",
                            lookup.found
                        )
                    })?;
                    if lookup.tool == tool {
                        return Err(format!(
                            "tools.{tool}.lookup.tool: a tool cannot look itself up; name the tool that finds its effect"
                        ));
                    }
                    Some(Finding {
                        tool: lookup.tool,
                        args: serde_json::to_value(&lookup.args).map_err(|e| e.to_string())?,
                        found,
                    })
                }
            };
            if settings
                .key_arg
                .as_deref()
                .is_some_and(|arg| arg.trim().is_empty())
            {
                return Err(format!(
                    "tools.{tool}.key_arg: name the argument the key goes in"
                ));
            }
            declared.insert(
                tool,
                Declared {
                    key_arg: settings.key_arg,
                    lookup,
                },
            );
        }
        Ok((
            Upstream {
                name: name.to_owned(),
                trust_hints: settings.trust_read_only_hints,
                declared,
                reach,
                timeout: Duration::from_millis(settings.timeout_ms),
                session: tokio::sync::Mutex::new(None),
            },
            prefix,
        ))
    }

    /// The live session's peer, connecting first when there is none.
    async fn peer(&self) -> Result<Peer<RoleClient>, String> {
        let mut session = self.session.lock().await;
        if let Some(live) = session.as_ref() {
            if !live.is_closed() && !live.peer().is_transport_closed() {
                return Ok(live.peer().clone());
            }
        }
        let connected = tokio::time::timeout(self.timeout, self.connect())
            .await
            .map_err(|_| format!("no answer to MCP's initialize within {:?}", self.timeout))??;
        let peer = connected.peer().clone();
        *session = Some(connected);
        Ok(peer)
    }

    /// Drops a session whose transport failed; the next call reconnects.
    async fn forget(&self) {
        self.session.lock().await.take();
    }

    async fn connect(&self) -> Result<RunningService<RoleClient, ()>, String> {
        match &self.reach {
            Reach::Command { program, args, env } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).env_clear();
                for name in BASE_ENV
                    .iter()
                    .copied()
                    .chain(env.iter().map(String::as_str))
                {
                    if let Some(value) = std::env::var_os(name) {
                        command.env(name, value);
                    }
                }
                let (process, _) = TokioChildProcess::builder(command)
                    .stderr(std::process::Stdio::inherit())
                    .spawn()
                    .map_err(|e| format!("cannot start `{program}`: {e}"))?;
                ().serve_with_lifecycle(process, lifecycle())
                    .await
                    .map_err(|e| format!("`{program}` did not complete MCP's initialize: {e}"))
            }
            Reach::Url { url, token_env } => {
                // Rustls needs one crypto provider chosen for the process;
                // another part may have chosen it already.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                if let Some(variable) = token_env {
                    let token = std::env::var(variable).map_err(|_| {
                        format!("the environment variable {variable} (`token_env`) is not set")
                    })?;
                    config = config.auth_header(token);
                }
                ().serve_with_lifecycle(
                    StreamableHttpClientTransport::from_config(config),
                    lifecycle(),
                )
                .await
                .map_err(|e| format!("{url} did not complete MCP's initialize: {e}"))
            }
        }
    }

    /// The upstream's tools, as the registry takes them in.
    async fn listed(&self) -> Result<Vec<UpstreamTool>, String> {
        let peer = self.peer().await?;
        let tools = tokio::time::timeout(self.timeout, peer.list_all_tools())
            .await
            .map_err(|_| format!("no answer to tools/list within {:?}", self.timeout))?
            .map_err(|e| format!("tools/list failed: {e}"))?;
        Ok(tools
            .into_iter()
            .map(|tool| UpstreamTool {
                name: tool.name.to_string(),
                description: tool.description.map(|d| d.to_string()),
                schema: Value::Object((*tool.input_schema).clone()),
                hints: tool
                    .annotations
                    .as_ref()
                    .map(|a| ToolHints {
                        read_only: a.read_only_hint,
                        destructive: a.destructive_hint,
                        idempotent: a.idempotent_hint,
                        open_world: a.open_world_hint,
                    })
                    .unwrap_or_default(),
            })
            .collect())
    }

    /// The harness fills a tool's `key_arg`: the agent neither sees it in
    /// the schema nor must send it.
    fn without_key_args(&self, mut listed: Vec<UpstreamTool>) -> Vec<UpstreamTool> {
        for tool in &mut listed {
            let Some(arg) = self
                .declared
                .get(&tool.name)
                .and_then(|d| d.key_arg.as_deref())
            else {
                continue;
            };
            if let Some(properties) = tool
                .schema
                .get_mut("properties")
                .and_then(Value::as_object_mut)
            {
                properties.remove(arg);
            }
            if let Some(required) = tool
                .schema
                .get_mut("required")
                .and_then(Value::as_array_mut)
            {
                required.retain(|name| name.as_str() != Some(arg));
            }
        }
        listed
    }

    /// Each declaration checked against what the server lists: the tool
    /// and its lookup tool exist, and the key's argument is one the tool
    /// takes.
    fn check_declared(&self, listed: &[UpstreamTool]) -> Vec<String> {
        let mut mistakes = Vec::new();
        let has = |name: &str| listed.iter().any(|t| t.name == name);
        for (tool, declared) in &self.declared {
            if !has(tool) {
                mistakes.push(format!("tools.{tool}: the server lists no tool `{tool}`"));
                continue;
            }
            if let Some(finding) = &declared.lookup {
                if !has(&finding.tool) {
                    mistakes.push(format!(
                        "tools.{tool}.lookup.tool: the server lists no tool `{}` to look `{tool}` up with",
                        finding.tool
                    ));
                }
            }
            if let Some(arg) = &declared.key_arg {
                let takes = listed
                    .iter()
                    .find(|t| t.name == *tool)
                    .and_then(|t| t.schema.pointer(&format!("/properties/{arg}")))
                    .is_some();
                if !takes {
                    mistakes.push(format!(
                        "tools.{tool}.key_arg: `{tool}` takes no argument `{arg}` (its input schema lists none)"
                    ));
                }
            }
        }
        mistakes
    }

    fn tool_of<'a>(&self, operation: &'a str) -> Option<&'a str> {
        operation
            .strip_prefix("mcp.")
            .and_then(|rest| rest.strip_prefix(self.name.as_str()))
            .and_then(|rest| rest.strip_prefix('.'))
    }
}

#[async_trait]
impl Connector for Upstream {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        let Some(tool) = self.tool_of(operation) else {
            return CallReport::NotSent {
                reason: format!("{operation} is not a tool of the MCP server {}", self.name),
            };
        };
        let peer = match self.peer().await {
            Ok(peer) => peer,
            Err(reason) => {
                // The reason may name the server's URL, which may carry a
                // token: the operator's log has it, the agent does not.
                tracing::warn!(server = %self.name, %reason, "cannot reach an upstream MCP server");
                return CallReport::NotSent {
                    reason: format!(
                        "the upstream MCP server `{}` could not be reached; the details are in the harness's log",
                        self.name
                    ),
                };
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Value::Object(args) = args {
            let mut args = args.clone();
            if let Some(arg) = self.declared.get(tool).and_then(|d| d.key_arg.as_ref()) {
                args.insert(arg.clone(), Value::String(key.to_owned()));
            }
            params = params.with_arguments(args);
        }
        let mut meta = RequestMetaObject::new();
        meta.0
             .0
            .insert(KEY_META.to_owned(), Value::String(key.to_owned()));
        params.meta = Some(meta);
        match tokio::time::timeout(self.timeout, peer.call_tool_once(params)).await {
            Err(_) => CallReport::TimedOut,
            Ok(Ok(CallToolResponse::Complete(result))) => report_of(&result),
            // The upstream took the call on and wants more (input, or a
            // task to poll): the effect may follow.
            Ok(Ok(_)) => CallReport::Answered {
                status: 202,
                body: None,
                idempotency_conflict: false,
            },
            Ok(Err(error)) => {
                let report = report_of_error(&error);
                if matches!(
                    report,
                    CallReport::ResetAfterSend | CallReport::NotSent { .. }
                ) {
                    self.forget().await;
                }
                report
            }
        }
    }

    /// Calls the tool's declared lookup with the step's key: the effect
    /// exists when the JSONPath finds a value in the answer.
    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        let Some(finding) = self
            .tool_of(operation)
            .and_then(|tool| self.declared.get(tool))
            .and_then(|d| d.lookup.as_ref())
        else {
            return Err(LookupError::Unsupported);
        };
        let filled = crate::saga::registry::fill(&finding.args, key, args)
            .map_err(|e| LookupError::Unavailable(format!("the lookup's arguments: {e}")))?;
        let peer = self.peer().await.map_err(|reason| {
            tracing::warn!(server = %self.name, %reason, "cannot reach an upstream MCP server to look a step up");
            LookupError::Unavailable(format!("the upstream MCP server `{}` could not be reached", self.name))
        })?;
        let mut params = CallToolRequestParams::new(finding.tool.clone());
        if let Value::Object(filled) = filled {
            params = params.with_arguments(filled);
        }
        let answered = tokio::time::timeout(self.timeout, peer.call_tool_once(params))
            .await
            .map_err(|_| {
                LookupError::Unavailable(format!(
                    "no answer from `{}` within {:?}",
                    finding.tool, self.timeout
                ))
            })?;
        let result = match answered {
            Ok(CallToolResponse::Complete(result)) => result,
            Ok(_) => {
                return Err(LookupError::Unavailable(format!(
                    "`{}` did not answer at once",
                    finding.tool
                )))
            }
            Err(error) => {
                self.forget().await;
                return Err(LookupError::Unavailable(format!(
                    "`{}` failed: {error}",
                    finding.tool
                )));
            }
        };
        if result.is_error == Some(true) {
            return Err(LookupError::Unavailable(format!(
                "`{}` said: {}",
                finding.tool,
                text_of(&result)
            )));
        }
        let body = serde_json::to_value(&result).unwrap_or(Value::Null);
        let found = finding
            .found
            .query(&body)
            .all()
            .into_iter()
            .find(|value| !value.is_null())
            .cloned();
        Ok(match found {
            Some(Value::String(reference)) => Lookup::FoundSucceeded {
                external_ref: reference,
                result: body,
            },
            Some(other) => Lookup::FoundSucceeded {
                external_ref: other.to_string(),
                result: body,
            },
            None => Lookup::NotFound,
        })
    }

    fn has_lookup(&self, operation: &str) -> bool {
        self.tool_of(operation)
            .and_then(|tool| self.declared.get(tool))
            .is_some_and(|d| d.lookup.is_some())
    }

    /// What the tool's lookup would find, when its JSONPath finds it in
    /// this answer too (a create that answers with the ticket a search
    /// finds), else the result's `id` when its structured content has one;
    /// otherwise a fingerprint of the answer, so the log can tell answers
    /// apart.
    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        body.get("content")?.as_array()?;
        let declared = self
            .tool_of(operation)
            .and_then(|tool| self.declared.get(tool))
            .and_then(|d| d.lookup.as_ref())
            .and_then(|finding| {
                finding
                    .found
                    .query(body)
                    .all()
                    .into_iter()
                    .find(|value| !value.is_null())
                    .map(|value| match value {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    })
            });
        if declared.is_some() {
            return declared;
        }
        let id = body
            .pointer("/structuredContent/id")
            .and_then(|id| match id {
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            });
        Some(id.unwrap_or_else(|| {
            let digest = Sha256::digest(body.to_string().as_bytes());
            format!("answer-{}", hex::encode(&digest[..6]))
        }))
    }
}

/// A complete answer: a result, or the tool's own error (`isError`), which
/// says the call was refused.
fn report_of(result: &CallToolResult) -> CallReport {
    if result.is_error == Some(true) {
        return CallReport::Answered {
            status: 422,
            body: Some(json!({"error": {"message": text_of(result)}})),
            idempotency_conflict: false,
        };
    }
    CallReport::Answered {
        status: 200,
        body: serde_json::to_value(result).ok(),
        idempotency_conflict: false,
    }
}

/// A JSON-RPC error that says the request was not acted on (bad params, no
/// such tool) is a refusal; any other error after sending is unknown.
fn report_of_error(error: &ServiceError) -> CallReport {
    match error {
        ServiceError::McpError(error)
            if [
                ErrorCode::INVALID_REQUEST,
                ErrorCode::METHOD_NOT_FOUND,
                ErrorCode::INVALID_PARAMS,
            ]
            .contains(&error.code) =>
        {
            CallReport::Answered {
                status: 400,
                body: Some(json!({"error": {"message": error.message}})),
                idempotency_conflict: false,
            }
        }
        ServiceError::McpError(error) => CallReport::Answered {
            status: 500,
            body: Some(json!({"error": {"message": error.message}})),
            idempotency_conflict: false,
        },
        ServiceError::Timeout { .. } => CallReport::TimedOut,
        ServiceError::TransportSend(error) if refused_connection(error) => {
            tracing::warn!(%error, "an upstream MCP server refused the connection");
            CallReport::NotSent {
                reason: "the upstream MCP server refused the connection".to_owned(),
            }
        }
        _ => CallReport::ResetAfterSend,
    }
}

/// Whether the error's causes include a refused connection: then nothing
/// was sent.
fn refused_connection(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = error.source();
    }
    false
}

fn text_of(result: &CallToolResult) -> String {
    let text: Vec<&str> = result
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect();
    if text.is_empty() {
        "the tool reported an error and said nothing more".to_owned()
    } else {
        text.join("\n")
    }
}

/// The current specification first (`server/discover`), and the
/// `initialize` handshake of earlier ones for a server that has not moved.
fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: None,
    }
}

/// Connects to every upstream MCP server the tools file names, takes its
/// tools into the registry and routes their operations to it. All mistakes
/// are reported at once, each naming the server.
pub async fn attach(
    registry: &mut Registry,
    mut connectors: ConnectorSet,
) -> Result<ConnectorSet, Vec<String>> {
    let Some(servers) = registry.connector_settings().get("mcp").cloned() else {
        return Ok(connectors);
    };
    let Some(servers) = servers.as_table() else {
        return Err(vec![
            "connector `mcp`: expected a table of MCP servers ([connectors.mcp.NAME])".into(),
        ]);
    };
    let mut mistakes = Vec::new();
    for (name, settings) in servers {
        let say = |problem: String| format!("upstream MCP server `{name}`: {problem}");
        let (upstream, prefix) = match Upstream::from_settings(name, settings) {
            Ok(built) => built,
            Err(problem) => {
                mistakes.push(say(problem));
                continue;
            }
        };
        let listed = match upstream.listed().await {
            Ok(listed) => listed,
            Err(problem) => {
                mistakes.push(say(problem));
                continue;
            }
        };
        let declared = upstream.check_declared(&listed);
        if !declared.is_empty() {
            mistakes.extend(declared.into_iter().map(say));
            continue;
        }
        let listed = upstream.without_key_args(listed);
        match registry.adopt_upstream(name, &prefix, upstream.trust_hints, listed) {
            Ok(operations) => {
                let names: Vec<&str> = operations.iter().map(String::as_str).collect();
                connectors = connectors.serve(&names, Arc::new(upstream));
            }
            Err(found) => mistakes.extend(found.into_iter().map(|m| say(m.to_string()))),
        }
    }
    if mistakes.is_empty() {
        Ok(connectors)
    } else {
        Err(mistakes)
    }
}

/// One upstream tool as `saga-harness doctor` shows it: what its server
/// claims and the class the harness gives it.
pub struct InspectedTool {
    pub name: String,
    pub hints: ToolHints,
    pub class: ToolClass,
    /// Whether the tools file declares it (else it is classed from the
    /// listing).
    pub declared: bool,
}

/// Connects to every upstream server the tools file names and lists its
/// tools with their hints and the class each gets, without serving them.
/// Each server's result is its own: one that cannot be reached does not
/// hide the others.
pub async fn inspect(registry: &Registry) -> Vec<(String, Result<Vec<InspectedTool>, String>)> {
    let Some(servers) = registry
        .connector_settings()
        .get("mcp")
        .and_then(toml::Value::as_table)
    else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (name, settings) in servers {
        let inspected = async {
            let (upstream, prefix) = Upstream::from_settings(name, settings)?;
            let listed = upstream.listed().await?;
            let declared = upstream.check_declared(&listed);
            if !declared.is_empty() {
                return Err(declared.join("; "));
            }
            let listed = upstream.without_key_args(listed);
            let mut adopted = registry.clone();
            adopted
                .adopt_upstream(name, &prefix, upstream.trust_hints, listed.clone())
                .map_err(|mistakes| {
                    mistakes
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                })?;
            Ok(listed
                .into_iter()
                .filter_map(|tool| {
                    let operation = format!("mcp.{name}.{}", tool.name);
                    let spec = adopted.tools().find(|spec| spec.connector == operation)?;
                    Some(InspectedTool {
                        name: spec.name.clone(),
                        hints: tool.hints,
                        class: spec.class,
                        declared: registry.tools().any(|s| s.connector == operation),
                    })
                })
                .collect())
        }
        .await;
        found.push((name.clone(), inspected));
    }
    found
}
