//! The Jira connector: issues for support follow-ups, closed (and reopened)
//! as compensations, on Jira Cloud (REST v3) or Data Center / Server
//! (REST v2).
//!
//! ```toml
//! [connectors.jira]
//! base_url = "https://acme.atlassian.net"
//! flavour = "cloud"                 # or "datacenter"
//! email_env = "JIRA_EMAIL"          # cloud: Basic auth, email + API token
//! api_token_env = "JIRA_API_TOKEN"
//! # token_env = "JIRA_PAT"          # datacenter: bearer personal access token
//! project = "SUP"
//! issue_type = "Task"               # default
//! done_transition = "Done"          # default
//! reopen_transition = "To Do"       # default
//! settle_ms = 2000                  # default; see "Finding by key" below
//! ```
//!
//! Operations:
//! - `jira.create_issue` `{summary, description?, project?}` → the issue
//!   key (`SUP-7`). Jira has no idempotency header, so the step's key
//!   travels as the label `saga-<K>` (R5) and the lookup is the JQL
//!   `labels = "saga-<K>"` (R7): Cloud's enhanced search
//!   `POST /rest/api/3/search/jql`, Data Center's `GET /rest/api/2/search`.
//! - `jira.close` `{ticket_key, comment?}` — the compensation of a create:
//!   finds the issue by the create step's label, adds its own `saga-<K>`
//!   label and the comment in one edit, then takes the transition named
//!   `done_transition` (matched case-insensitively against the transition's
//!   name or its target status). An issue already in a done status counts
//!   as closed: the answer is the issue itself, so the step is confirmed.
//! - `jira.reopen` `{ticket_key, comment?}` — the way back from a close,
//!   the same way with `reopen_transition`; an issue already out of done
//!   counts as reopened.
//!
//! Why the label and comment go in an edit and not in the transition: Jira
//! sets fields during a transition only when they are on its screen, and
//! the default Done transition has none. An edit needs only the edit
//! screen, where labels are by default. The edit is skipped when the label
//! is already there, so a re-sent close adds no second comment.
//!
//! What a close or reopen reports: the transition answers 204 with no body,
//! so the connector reads the issue back and reports `Answered {status:
//! 204, body: the issue}`; a 2xx answer confirms only when the issue it
//! names is in the state the operation promises (done for a close). If the
//! read-back fails the body is `None`, which R4 makes unknown and R7
//! settles. When a preparatory read (find, get, transitions) fails, no
//! effect was sent: a 4xx answer is reported as it came (the system said
//! no), anything else as `NotSent`.
//!
//! Finding by key: search lags creation. When a close or reopen cannot find
//! its issue it looks once more after `settle_ms`, then reports `NotSent`
//! (nothing was done), so the unwind retries and finally asks a person.
//! The lookups do not wait: the engine looks twice (R7).

use super::wire::{self, Wire};
use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use async_trait::async_trait;
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{json, Value};
use std::time::Duration;

pub const CREATE_ISSUE: &str = "jira.create_issue";
pub const CLOSE: &str = "jira.close";
pub const REOPEN: &str = "jira.reopen";

const NAME: &str = "jira";
const FIELDS: [&str; 10] = [
    "base_url",
    "flavour",
    "email_env",
    "api_token_env",
    "token_env",
    "project",
    "issue_type",
    "done_transition",
    "reopen_transition",
    "settle_ms",
];

/// The label that carries a saga key (R5).
pub fn saga_label(key: &str) -> String {
    format!("saga-{key}")
}

/// Which Jira, and so which REST API.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Flavour {
    /// Jira Cloud: REST v3, Basic auth with an email and an API token.
    Cloud,
    /// Jira Data Center / Server: REST v2, a bearer personal access token.
    DataCenter,
}

impl Flavour {
    fn api(self) -> &'static str {
        match self {
            Flavour::Cloud => "3",
            Flavour::DataCenter => "2",
        }
    }
}

/// A credential (redacted in `Debug` output).
#[derive(Clone, Debug)]
enum Credential {
    Basic {
        email: SecretString,
        api_token: SecretString,
    },
    Bearer(SecretString),
}

/// Where a compensation is going.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Move {
    Close,
    Reopen,
}

#[derive(Clone, Debug)]
pub struct JiraConnector {
    wire: Wire,
    base_url: String,
    flavour: Flavour,
    credential: Credential,
    project: String,
    issue_type: String,
    done_transition: String,
    reopen_transition: String,
    settle: Duration,
}

impl JiraConnector {
    pub fn from_settings(table: &toml::Table, wire: Wire) -> Result<Self, Vec<String>> {
        let mut mistakes = Vec::new();
        for field in table.keys() {
            if !FIELDS.contains(&field.as_str()) {
                mistakes.push(format!(
                    "connector `{NAME}`: unknown field `{field}` (known: {})",
                    FIELDS.join(", ")
                ));
            }
        }
        let base_url = wire::base_url(table, NAME)
            .map_err(|e| mistakes.push(e))
            .ok();
        let flavour = match wire::setting(table, NAME, "flavour") {
            Ok(text) => match text.to_ascii_lowercase().as_str() {
                "cloud" => Some(Flavour::Cloud),
                "datacenter" | "data_center" | "server" => Some(Flavour::DataCenter),
                _ => {
                    mistakes.push(format!(
                        "connector `{NAME}`, field `flavour`: {text:?} is not \"cloud\" or \"datacenter\""
                    ));
                    None
                }
            },
            Err(e) => {
                mistakes.push(e);
                None
            }
        };
        let credential = flavour.and_then(|flavour| {
            credential(table, flavour)
                .map_err(|found| mistakes.extend(found))
                .ok()
        });
        let project = wire::setting(table, NAME, "project")
            .map(str::to_owned)
            .map_err(|e| mistakes.push(e))
            .ok();
        let optional = |field: &str, default: &str, mistakes: &mut Vec<String>| {
            if table.contains_key(field) {
                wire::setting(table, NAME, field)
                    .map(str::to_owned)
                    .map_err(|e| mistakes.push(e))
                    .unwrap_or_default()
            } else {
                default.to_owned()
            }
        };
        let issue_type = optional("issue_type", "Task", &mut mistakes);
        let done_transition = optional("done_transition", "Done", &mut mistakes);
        let reopen_transition = optional("reopen_transition", "To Do", &mut mistakes);
        let settle = settle(table, NAME).map_err(|e| mistakes.push(e)).ok();
        match (base_url, flavour, credential, project, settle) {
            (Some(base_url), Some(flavour), Some(credential), Some(project), Some(settle))
                if mistakes.is_empty() =>
            {
                Ok(JiraConnector {
                    wire,
                    base_url,
                    flavour,
                    credential,
                    project,
                    issue_type,
                    done_transition,
                    reopen_transition,
                    settle,
                })
            }
            _ => Err(mistakes),
        }
    }

    pub fn operations(&self) -> Vec<String> {
        vec![CREATE_ISSUE.into(), CLOSE.into(), REOPEN.into()]
    }

    fn url(&self, rest: &str) -> String {
        format!("{}/rest/api/{}{rest}", self.base_url, self.flavour.api())
    }

    fn issue_url(&self, issue_key: &str, rest: &str) -> String {
        self.url(&format!("/issue/{}{rest}", encode(issue_key)))
    }

    fn authed(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.credential {
            Credential::Basic { email, api_token } => {
                request.basic_auth(email.expose_secret(), Some(api_token.expose_secret()))
            }
            Credential::Bearer(token) => request.bearer_auth(token.expose_secret()),
        }
    }

    fn get(&self, url: String) -> reqwest::RequestBuilder {
        self.authed(self.wire.client().get(url))
    }

    /// Rich text in this API's shape: a document on Cloud, a string on v2.
    fn rich_text(&self, text: &str) -> Value {
        match self.flavour {
            Flavour::Cloud => adf(text),
            Flavour::DataCenter => Value::String(text.to_owned()),
        }
    }

    fn create_body(&self, key: &str, args: &Value) -> Value {
        let project = args["project"].as_str().unwrap_or(&self.project);
        let mut fields = json!({
            "project": {"key": project},
            "issuetype": {"name": self.issue_type},
            "labels": [saga_label(key)],
        });
        // Sent as given, absent or not: a missing summary is Jira's to
        // refuse (400), which makes the step FAILED rather than guessed.
        if let Some(summary) = args.get("summary") {
            fields["summary"] = summary.clone();
        }
        if let Some(description) = args["description"].as_str() {
            fields["description"] = self.rich_text(description);
        }
        json!({ "fields": fields })
    }

    /// The request that finds issues carrying `label`, oldest first.
    fn search(&self, label: &str) -> reqwest::RequestBuilder {
        let jql = format!(
            "labels = \"{}\"",
            label.replace('\\', "\\\\").replace('"', "\\\"")
        );
        let fields = ["summary", "status", "labels"];
        match self.flavour {
            Flavour::Cloud => self.authed(
                self.wire
                    .client()
                    .post(self.url("/search/jql"))
                    .json(&json!({"jql": jql, "fields": fields, "maxResults": 10})),
            ),
            Flavour::DataCenter => self.get(self.url("/search")).query(&[
                ("jql", jql.as_str()),
                ("fields", &fields.join(",")),
                ("maxResults", "10"),
            ]),
        }
    }

    /// The first issue carrying `label`, or `None`.
    async fn find(&self, label: &str) -> Result<Option<Value>, LookupError> {
        let body = self.wire.read_ok(self.search(label)).await?;
        match body.get("issues").and_then(Value::as_array) {
            Some(issues) => Ok(issues.first().cloned()),
            None => Err(LookupError::Unavailable(
                "the search answered without an issues list".into(),
            )),
        }
    }

    /// The issue as it is now (reading by key never lags).
    async fn issue(&self, issue_key: &str) -> Result<Value, LookupError> {
        self.wire
            .read_ok(self.get(self.issue_url(issue_key, "")))
            .await
    }

    /// A read made on the way to an effect. Its failure means the effect was
    /// not sent: a 4xx answer is passed on as the system's refusal, any
    /// other trouble is `NotSent`.
    async fn prepare(
        &self,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Value, CallReport> {
        match self.wire.read(request).await {
            Ok((200..=299, Some(body))) => Ok(body),
            Ok((status @ 400..=499, body)) => Err(CallReport::Answered {
                status,
                body,
                idempotency_conflict: false,
            }),
            Ok((status, _)) => Err(CallReport::NotSent {
                reason: format!("{what} answered HTTP {status}; nothing was changed"),
            }),
            Err(e) => Err(CallReport::NotSent {
                reason: format!("{what}: {e}; nothing was changed"),
            }),
        }
    }

    /// Finds the issue a compensation acts on, looking once more after the
    /// settle pause if the index has not caught up.
    async fn find_for(&self, ticket_key: &str) -> Result<Value, CallReport> {
        let label = saga_label(ticket_key);
        for attempt in 0..2 {
            if attempt > 0 {
                tokio::time::sleep(self.settle).await;
            }
            let body = self
                .prepare("the search for the issue", self.search(&label))
                .await?;
            if let Some(issue) = body["issues"].as_array().and_then(|i| i.first()) {
                return Ok(issue.clone());
            }
        }
        Err(CallReport::NotSent {
            reason: format!(
                "no issue carries the label {label} (not created, or not yet searchable); nothing was changed"
            ),
        })
    }

    fn target(&self, movement: Move) -> &str {
        match movement {
            Move::Close => &self.done_transition,
            Move::Reopen => &self.reopen_transition,
        }
    }

    /// Closes or reopens the issue the step `ticket_key` created.
    async fn transition(&self, movement: Move, key: &str, args: &Value) -> CallReport {
        let Some(ticket_key) = args["ticket_key"].as_str().filter(|k| !k.is_empty()) else {
            return CallReport::NotSent {
                reason: "the call has no argument `ticket_key` (the key of the step that created the issue)".into(),
            };
        };
        let found = match self.find_for(ticket_key).await {
            Ok(found) => found,
            Err(report) => return report,
        };
        let Some(issue_key) = found["key"].as_str().map(str::to_owned) else {
            return CallReport::NotSent {
                reason: "the search answered an issue without a key; nothing was changed".into(),
            };
        };
        let current = match self
            .prepare(
                "reading the issue",
                self.get(self.issue_url(&issue_key, "")),
            )
            .await
        {
            Ok(issue) => issue,
            Err(report) => return report,
        };
        if reached(movement, &current) {
            // Already where the compensation would take it: done.
            return CallReport::Answered {
                status: 200,
                body: Some(current),
                idempotency_conflict: false,
            };
        }

        let own_label = saga_label(key);
        if !has_label(&current, &own_label) {
            let comment = args["comment"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| match movement {
                    Move::Close => {
                        format!("Closed by Saga Harness: the work of step {ticket_key} was undone.")
                    }
                    Move::Reopen => {
                        format!("Reopened by Saga Harness: the close of the issue of step {ticket_key} was undone.")
                    }
                });
            let edit = self
                .authed(self.wire.client().put(self.issue_url(&issue_key, "")))
                .json(&json!({
                    "update": {
                        "labels": [{"add": own_label}],
                        "comment": [{"add": {"body": self.rich_text(&comment)}}],
                    }
                }));
            match self.wire.send(edit).await {
                CallReport::Answered {
                    status: 200..=299, ..
                } => {}
                other => return other,
            }
        }

        let transitions = match self
            .prepare(
                "listing the issue's transitions",
                self.get(self.issue_url(&issue_key, "/transitions")),
            )
            .await
        {
            Ok(body) => body,
            Err(report) => return report,
        };
        let wanted = self.target(movement);
        let Some(transition_id) = pick_transition(&transitions, wanted) else {
            return CallReport::NotSent {
                reason: format!(
                    "issue {issue_key} offers no transition named {wanted:?} (available: {}); check `{}` in the tools file",
                    transition_names(&transitions),
                    match movement {
                        Move::Close => "done_transition",
                        Move::Reopen => "reopen_transition",
                    }
                ),
            };
        };
        let request = self
            .authed(
                self.wire
                    .client()
                    .post(self.issue_url(&issue_key, "/transitions")),
            )
            .json(&json!({"transition": {"id": transition_id}}));
        match self.wire.send(request).await {
            CallReport::Answered {
                status: status @ 200..=299,
                idempotency_conflict,
                ..
            } => {
                // 204 has no body: report the issue it transitioned, read
                // back. If that read fails the body is None (unknown), and
                // the lookup settles it.
                CallReport::Answered {
                    status,
                    body: self.issue(&issue_key).await.ok(),
                    idempotency_conflict,
                }
            }
            other => other,
        }
    }

    /// R7 for a close or reopen: the issue the step acted on, if it is
    /// where the step would have taken it.
    async fn look_for_move(&self, movement: Move, args: &Value) -> Result<Lookup, LookupError> {
        let ticket_key = args["ticket_key"]
            .as_str()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| {
                LookupError::Unavailable("the call has no argument `ticket_key` to look up".into())
            })?;
        let Some(found) = self.find(&saga_label(ticket_key)).await? else {
            return Ok(Lookup::NotFound);
        };
        let issue_key = found["key"].as_str().ok_or_else(|| {
            LookupError::Unavailable("the search answered an issue without a key".into())
        })?;
        let issue = self.issue(issue_key).await?;
        if reached(movement, &issue) {
            Ok(Lookup::FoundSucceeded {
                external_ref: issue_key.to_owned(),
                result: issue,
            })
        } else {
            Ok(Lookup::NotFound)
        }
    }
}

fn credential(table: &toml::Table, flavour: Flavour) -> Result<Credential, Vec<String>> {
    let mut mistakes = Vec::new();
    let secret = |field: &str, mistakes: &mut Vec<String>| -> Option<SecretString> {
        let variable = wire::setting(table, NAME, field)
            .map_err(|e| mistakes.push(e))
            .ok()?;
        wire::secret_from_env(NAME, field, variable)
            .map_err(|e| mistakes.push(e))
            .ok()
    };
    let misplaced = |fields: &[&str], mistakes: &mut Vec<String>, why: &str| {
        for field in fields {
            if table.contains_key(*field) {
                mistakes.push(format!("connector `{NAME}`, field `{field}`: {why}"));
            }
        }
    };
    let credential = match flavour {
        Flavour::Cloud => {
            misplaced(
                &["token_env"],
                &mut mistakes,
                "Jira Cloud uses `email_env` and `api_token_env` (Basic auth); a personal access token is for flavour = \"datacenter\"",
            );
            let email = secret("email_env", &mut mistakes);
            let api_token = secret("api_token_env", &mut mistakes);
            email
                .zip(api_token)
                .map(|(email, api_token)| Credential::Basic { email, api_token })
        }
        Flavour::DataCenter => {
            misplaced(
                &["email_env", "api_token_env"],
                &mut mistakes,
                "Jira Data Center uses `token_env` (a bearer personal access token); email and API token are for flavour = \"cloud\"",
            );
            secret("token_env", &mut mistakes).map(Credential::Bearer)
        }
    };
    match credential {
        Some(credential) if mistakes.is_empty() => Ok(credential),
        _ => Err(mistakes),
    }
}

/// `settle_ms`, a whole number of milliseconds (default 2000).
pub(crate) fn settle(table: &toml::Table, connector: &str) -> Result<Duration, String> {
    match table.get("settle_ms") {
        None => Ok(Duration::from_secs(2)),
        Some(toml::Value::Integer(ms)) if (0..=600_000).contains(ms) => {
            Ok(Duration::from_millis(*ms as u64))
        }
        Some(_) => Err(format!(
            "connector `{connector}`, field `settle_ms`: must be a whole number of milliseconds from 0 to 600000"
        )),
    }
}

fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A one-paragraph-per-block Atlassian Document (Cloud's rich text).
fn adf(text: &str) -> Value {
    let paragraphs: Vec<Value> = text
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(|p| json!({"type": "paragraph", "content": [{"type": "text", "text": p}]}))
        .collect();
    json!({"type": "doc", "version": 1, "content": paragraphs})
}

fn category(issue: &Value) -> Option<&str> {
    issue
        .pointer("/fields/status/statusCategory/key")
        .and_then(Value::as_str)
}

/// Whether the issue is where `movement` would take it.
fn reached(movement: Move, issue: &Value) -> bool {
    match (movement, category(issue)) {
        (Move::Close, Some(category)) => category == "done",
        (Move::Reopen, Some(category)) => category != "done",
        (_, None) => false,
    }
}

fn has_label(issue: &Value, label: &str) -> bool {
    issue
        .pointer("/fields/labels")
        .and_then(Value::as_array)
        .is_some_and(|labels| labels.iter().any(|l| l.as_str() == Some(label)))
}

/// The id of the transition named `wanted` (its own name or its target
/// status's), case-insensitively.
fn pick_transition(body: &Value, wanted: &str) -> Option<String> {
    let transitions = body["transitions"].as_array()?;
    let named = |t: &&Value, pointer: &str| {
        t.pointer(pointer)
            .and_then(Value::as_str)
            .is_some_and(|name| name.trim().eq_ignore_ascii_case(wanted.trim()))
    };
    transitions
        .iter()
        .find(|t| named(t, "/name"))
        .or_else(|| transitions.iter().find(|t| named(t, "/to/name")))
        .and_then(|t| t["id"].as_str().map(str::to_owned))
}

fn transition_names(body: &Value) -> String {
    let names: Vec<&str> = body["transitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

#[async_trait]
impl Connector for JiraConnector {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        match operation {
            CREATE_ISSUE => {
                let request = self
                    .authed(self.wire.client().post(self.url("/issue")))
                    .json(&self.create_body(key, args));
                self.wire.send(request).await
            }
            CLOSE => self.transition(Move::Close, key, args).await,
            REOPEN => self.transition(Move::Reopen, key, args).await,
            other => CallReport::NotSent {
                reason: format!("the Jira connector has no operation {other}"),
            },
        }
    }

    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        match operation {
            CREATE_ISSUE => match self.find(&saga_label(key)).await? {
                Some(issue) => {
                    let external_ref =
                        issue["key"].as_str().map(str::to_owned).ok_or_else(|| {
                            LookupError::Unavailable(
                                "the search answered an issue without a key".into(),
                            )
                        })?;
                    Ok(Lookup::FoundSucceeded {
                        external_ref,
                        result: issue,
                    })
                }
                None => Ok(Lookup::NotFound),
            },
            CLOSE => self.look_for_move(Move::Close, args).await,
            REOPEN => self.look_for_move(Move::Reopen, args).await,
            _ => Err(LookupError::Unsupported),
        }
    }

    fn has_lookup(&self, operation: &str) -> bool {
        matches!(operation, CREATE_ISSUE | CLOSE | REOPEN)
    }

    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        let issue_key = body["key"].as_str().filter(|k| !k.is_empty())?.to_owned();
        match operation {
            // 201 {id, key, self}
            CREATE_ISSUE => body["id"].as_str().map(|_| issue_key),
            CLOSE => reached(Move::Close, body).then_some(issue_key),
            REOPEN => reached(Move::Reopen, body).then_some(issue_key),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transition_is_picked_by_its_name_or_its_target_status() {
        let body = json!({"transitions": [
            {"id": "11", "name": "Back to backlog", "to": {"name": "To Do"}},
            {"id": "31", "name": "Resolve", "to": {"name": "Done"}},
            {"id": "41", "name": "done", "to": {"name": "Closed"}},
        ]});
        assert_eq!(pick_transition(&body, "Done").as_deref(), Some("41"));
        assert_eq!(pick_transition(&body, "to do").as_deref(), Some("11"));
        assert_eq!(pick_transition(&body, "Resolve").as_deref(), Some("31"));
        assert_eq!(pick_transition(&body, "Archive"), None);
    }

    #[test]
    fn r4_a_close_confirms_only_an_issue_in_a_done_status() {
        let issue = |category: &str| json!({"id": "1", "key": "SUP-1", "fields": {"status": {"statusCategory": {"key": category}}}});
        assert!(reached(Move::Close, &issue("done")));
        assert!(!reached(Move::Close, &issue("indeterminate")));
        assert!(reached(Move::Reopen, &issue("new")));
        assert!(!reached(Move::Reopen, &json!({"key": "SUP-1"})));
    }
}
