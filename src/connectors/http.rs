//! The generic HTTP connector: a team's internal API declared entirely in
//! the tools file, no Rust needed.
//!
//! ```toml
//! [connectors.http.warehouse]
//! base_url = "http://127.0.0.1:4106"
//! token_env = "WAREHOUSE_TOKEN"          # optional: sent as a bearer token
//!
//! [connectors.http.warehouse.operations.reship]   # operation `warehouse.reship`
//! method = "POST"
//! path = "/v1/shipments"
//! body = { order_id = "{args.order_id}", reference = "{key}" }
//! idempotency_header = "Idempotency-Key"          # carries the step's key
//! ref = "/id"                                     # the external id in a 2xx body
//!
//! [connectors.http.warehouse.operations.reship.lookup]
//! method = "GET"
//! path = "/v1/shipments?reference={key}"
//! found = "/data/0"                               # present = the effect exists
//! ref = "/data/0/id"
//! failed = { pointer = "/data/0/status", equals = "failed" }
//! # found_when = { pointer = "/data/0/status", equals = "cancelled" }
//! ```
//!
//! Templates take `{key}` and `{args.FIELD}`; values put into a path are
//! percent-encoded. An argument is attacker input (the model chose it): a
//! filled path with a `.` or `..` segment, however encoded, is refused, and
//! the final URL must keep the base URL's origin and path prefix, so no
//! argument can point the service's credentials anywhere else. A way back
//! (undo, compensation) is another operation named by the tool's `undo` or
//! `compensation`.

use super::wire::{self, Wire};
use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use crate::saga::registry::fill;
use async_trait::async_trait;
use reqwest::Method;
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceSettings {
    base_url: String,
    token_env: Option<String>,
    /// Parsed one by one, so a mistake in one operation does not hide the
    /// others'.
    #[serde(default)]
    operations: BTreeMap<String, toml::Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationSettings {
    method: String,
    path: String,
    body: Option<toml::Value>,
    idempotency_header: Option<String>,
    /// JSON pointer to the external reference in a 2xx body.
    #[serde(rename = "ref")]
    reference: Option<String>,
    lookup: Option<LookupSettings>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupSettings {
    #[serde(default = "get")]
    method: String,
    path: String,
    /// The pointer whose presence means the effect exists.
    found: String,
    #[serde(rename = "ref")]
    reference: String,
    /// The match counts only when this field has this value (a delete's
    /// lookup finds the record and checks it says deleted).
    found_when: Option<FieldEquals>,
    failed: Option<FieldEquals>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FieldEquals {
    pointer: String,
    equals: toml::Value,
}

impl FieldEquals {
    fn into_pair(self) -> (String, Value) {
        let equals = serde_json::to_value(self.equals).unwrap_or(Value::Null);
        (self.pointer, equals)
    }
}

fn get() -> String {
    "GET".into()
}

#[derive(Clone, Debug)]
struct Operation {
    base_url: String,
    token: Option<SecretString>,
    method: Method,
    path: String,
    body: Option<Value>,
    idempotency_header: Option<String>,
    reference: Option<String>,
    lookup: Option<LookupPlan>,
}

#[derive(Clone, Debug)]
struct LookupPlan {
    method: Method,
    path: String,
    found: String,
    reference: String,
    found_when: Option<(String, Value)>,
    failed: Option<(String, Value)>,
}

/// Every operation of every `[connectors.http.*]` service.
#[derive(Clone, Debug)]
pub struct HttpConnector {
    wire: Wire,
    operations: BTreeMap<String, Operation>,
}

impl HttpConnector {
    pub fn from_settings(settings: &toml::Table, wire: Wire) -> Result<Self, Vec<String>> {
        let mut mistakes = Vec::new();
        let mut operations = BTreeMap::new();
        for (service, value) in settings {
            let label = format!("http.{service}");
            let parsed: ServiceSettings = match value.clone().try_into() {
                Ok(parsed) => parsed,
                Err(e) => {
                    mistakes.push(format!("connector `{label}`: {}", e.to_string().trim()));
                    continue;
                }
            };
            let base_url = match wire::check_base_url(&label, &parsed.base_url) {
                Ok(url) => url,
                Err(e) => {
                    mistakes.push(e);
                    continue;
                }
            };
            let token = match &parsed.token_env {
                Some(variable) => match wire::secret_from_env(&label, "token_env", variable) {
                    Ok(token) => Some(token),
                    Err(e) => {
                        mistakes.push(e);
                        continue;
                    }
                },
                None => None,
            };
            if parsed.operations.is_empty() {
                mistakes.push(format!("connector `{label}`: declares no operations"));
            }
            for (name, op) in parsed.operations {
                let full = format!("{service}.{name}");
                let op: OperationSettings = match op.try_into() {
                    Ok(op) => op,
                    Err(e) => {
                        mistakes.push(format!("operation `{full}`: {}", e.to_string().trim()));
                        continue;
                    }
                };
                match operation(&full, op, &base_url, &token) {
                    Ok(op) => {
                        operations.insert(full, op);
                    }
                    Err(e) => mistakes.extend(e),
                }
            }
        }
        if mistakes.is_empty() {
            Ok(HttpConnector { wire, operations })
        } else {
            Err(mistakes)
        }
    }

    pub fn operations(&self) -> Vec<String> {
        self.operations.keys().cloned().collect()
    }

    fn operation(&self, name: &str) -> Option<&Operation> {
        self.operations.get(name)
    }

    fn request(
        &self,
        op: &Operation,
        method: &Method,
        path: &str,
        key: &str,
        args: &Value,
    ) -> Result<reqwest::RequestBuilder, String> {
        let path = fill_path(path, key, args)?;
        let url = url_within(&op.base_url, &path)?;
        let mut request = self.wire.client().request(method.clone(), url);
        if let Some(token) = &op.token {
            request = request.bearer_auth(token.expose_secret());
        }
        Ok(request)
    }
}

fn operation(
    name: &str,
    op: OperationSettings,
    base_url: &str,
    token: &Option<SecretString>,
) -> Result<Operation, Vec<String>> {
    let mut mistakes = Vec::new();
    let method = parse_method(name, "method", &op.method).map_err(|e| mistakes.push(e));
    if !op.path.starts_with('/') {
        mistakes.push(format!(
            "operation `{name}`, field `path`: must start with `/`"
        ));
    }
    let has_effect = method.as_ref().is_ok_and(|m| *m != Method::GET);
    if has_effect && op.reference.is_none() {
        mistakes.push(format!(
            "operation `{name}`, field `ref`: missing; a call with an effect must say where its answer names the external id (a JSON pointer such as \"/id\")"
        ));
    }
    for pointer in op.reference.iter() {
        check_pointer(name, "ref", pointer, &mut mistakes);
    }
    let lookup = op.lookup.map(|lookup| {
        check_pointer(name, "lookup.found", &lookup.found, &mut mistakes);
        check_pointer(name, "lookup.ref", &lookup.reference, &mut mistakes);
        if let Some(failed) = &lookup.failed {
            check_pointer(name, "lookup.failed.pointer", &failed.pointer, &mut mistakes);
        }
        if let Some(found_when) = &lookup.found_when {
            check_pointer(name, "lookup.found_when.pointer", &found_when.pointer, &mut mistakes);
        }
        if !lookup.path.contains("{key}") && !lookup.path.contains("{args.") {
            mistakes.push(format!(
                "operation `{name}`, field `lookup.path`: must contain {{key}} (or, for a way back, the original step's key as {{args.FIELD}}); a lookup finds the effect by its key"
            ));
        }
        (
            parse_method(name, "lookup.method", &lookup.method),
            lookup,
        )
    });
    let lookup = match lookup {
        Some((Ok(method), lookup)) => Some(LookupPlan {
            method,
            path: lookup.path,
            found: lookup.found,
            reference: lookup.reference,
            found_when: lookup.found_when.map(FieldEquals::into_pair),
            failed: lookup.failed.map(FieldEquals::into_pair),
        }),
        Some((Err(e), _)) => {
            mistakes.push(e);
            None
        }
        None => None,
    };
    let body = op
        .body
        .map(|b| {
            serde_json::to_value(b).map_err(|e| format!("operation `{name}`, field `body`: {e}"))
        })
        .transpose()
        .map_err(|e| mistakes.push(e))
        .ok()
        .flatten();
    match method {
        Ok(method) if mistakes.is_empty() => Ok(Operation {
            base_url: base_url.to_owned(),
            token: token.clone(),
            method,
            path: op.path,
            body,
            idempotency_header: op.idempotency_header,
            reference: op.reference,
            lookup,
        }),
        _ => Err(mistakes),
    }
}

fn parse_method(name: &str, field: &str, text: &str) -> Result<Method, String> {
    match text.to_ascii_uppercase().as_str() {
        "GET" => Ok(Method::GET),
        "POST" => Ok(Method::POST),
        "PUT" => Ok(Method::PUT),
        "PATCH" => Ok(Method::PATCH),
        "DELETE" => Ok(Method::DELETE),
        _ => Err(format!(
            "operation `{name}`, field `{field}`: {text:?} is not one of GET, POST, PUT, PATCH, DELETE"
        )),
    }
}

fn check_pointer(name: &str, field: &str, pointer: &str, mistakes: &mut Vec<String>) {
    if !pointer.starts_with('/') {
        mistakes.push(format!(
            "operation `{name}`, field `{field}`: {pointer:?} is not a JSON pointer (it starts with `/`)"
        ));
    }
}

/// Fills a path template, percent-encoding every value put into it.
fn fill_path(template: &str, key: &str, args: &Value) -> Result<String, String> {
    let encoded = encode_leaves(args);
    let key = encode(key);
    match fill(&Value::String(template.to_owned()), &key, &encoded)? {
        Value::String(path) => Ok(path),
        other => Ok(other.to_string()),
    }
}

/// The URL a filled path makes under `base_url`, refused if any of its
/// path segments is a dot segment once decoded (URL parsers resolve `%2E%2E`
/// as `..`, and many servers decode `%2F`), or if the result leaves the
/// base URL's origin or path.
fn url_within(base_url: &str, path: &str) -> Result<reqwest::Url, String> {
    let path_only = path.split(['?', '#']).next().unwrap_or_default();
    for segment in path_only.split('/') {
        let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
        if decoded
            .split(['/', '\\'])
            .any(|piece| piece == "." || piece == "..")
        {
            return Err(format!(
                "the filled path {path:?} has a `.` or `..` segment; an argument cannot move the call to another path"
            ));
        }
    }
    let base = reqwest::Url::parse(base_url).map_err(|e| format!("base URL: {e}"))?;
    let url = reqwest::Url::parse(&format!("{base_url}{path}"))
        .map_err(|e| format!("the filled path {path:?} does not make a URL: {e}"))?;
    let prefix = base.path().trim_end_matches('/');
    let inside = url.path() == prefix || url.path().starts_with(&format!("{prefix}/"));
    if url.origin() != base.origin() || !inside {
        return Err(format!(
            "the filled path {path:?} leaves {base_url}; an argument cannot send the call elsewhere"
        ));
    }
    Ok(url)
}

fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn encode_leaves(value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(encode(text)),
        Value::Array(items) => Value::Array(items.iter().map(encode_leaves).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), encode_leaves(v)))
                .collect(),
        ),
        other => Value::String(encode(&other.to_string())),
    }
}

fn text_at(body: &Value, pointer: &str) -> Option<String> {
    match body.pointer(pointer)? {
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

#[async_trait]
impl Connector for HttpConnector {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        let Some(op) = self.operation(operation) else {
            return CallReport::NotSent {
                reason: format!("no HTTP operation named {operation}"),
            };
        };
        let mut request = match self.request(op, &op.method, &op.path, key, args) {
            Ok(request) => request,
            Err(reason) => return CallReport::NotSent { reason },
        };
        if let Some(body) = &op.body {
            match fill(body, key, args) {
                Ok(body) => request = request.json(&body),
                Err(reason) => return CallReport::NotSent { reason },
            }
        }
        if let Some(header) = &op.idempotency_header {
            request = request.header(header, key);
        }
        self.wire.send(request).await
    }

    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        let op = self.operation(operation).ok_or(LookupError::Unsupported)?;
        let plan = op.lookup.as_ref().ok_or(LookupError::Unsupported)?;
        let request = self
            .request(op, &plan.method, &plan.path, key, args)
            .map_err(LookupError::Unavailable)?;
        let body = self.wire.read_ok(request).await?;
        let Some(found) = body.pointer(&plan.found).filter(|v| !v.is_null()) else {
            return Ok(Lookup::NotFound);
        };
        if let Some((pointer, equals)) = &plan.found_when {
            if body.pointer(pointer) != Some(equals) {
                return Ok(Lookup::NotFound);
            }
        }
        if let Some((pointer, equals)) = &plan.failed {
            if body.pointer(pointer) == Some(equals) {
                return Ok(Lookup::FoundFailed {
                    error: format!("the system reports the effect failed ({pointer} = {equals})"),
                });
            }
        }
        let external_ref = text_at(&body, &plan.reference).ok_or_else(|| {
            LookupError::Unavailable(format!(
                "the lookup found a match without a reference at {}",
                plan.reference
            ))
        })?;
        Ok(Lookup::FoundSucceeded {
            external_ref,
            result: found.clone(),
        })
    }

    fn has_lookup(&self, operation: &str) -> bool {
        self.operation(operation)
            .is_some_and(|op| op.lookup.is_some())
    }

    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        let pointer = self.operation(operation)?.reference.as_ref()?;
        text_at(body, pointer)
    }
}
