//! The Zendesk connector: support tickets, solved or deleted as the way
//! back.
//!
//! ```toml
//! [connectors.zendesk]
//! base_url = "https://acme.zendesk.com"
//! email_env = "ZENDESK_EMAIL"          # Basic auth: {email}/token:{api_token}
//! api_token_env = "ZENDESK_API_TOKEN"
//! settle_ms = 2000                     # default; see "Finding by key" below
//! ```
//!
//! Operations:
//! - `zendesk.create_ticket` `{subject, body, requester_email?, tags?,
//!   status?}` → the ticket id. The step's key travels twice (R5): as the
//!   `Idempotency-Key` header, which Zendesk honours for ticket creation (a
//!   repeat with the same body replays the first answer and creates
//!   nothing; a repeat with another body is 400 `IdempotentRequestError`,
//!   reported as an idempotency conflict, so unknown), and as the ticket's
//!   `external_id`, which the lookup lists by (R7):
//!   `GET /api/v2/tickets.json?external_id=K`.
//! - `zendesk.close_ticket` `{ticket_key, comment?}` — the compensation of
//!   a create: finds the ticket by the create step's external_id and sets
//!   it `solved` with a private comment, adding the tag `saga-<K>` (the
//!   close's own key). A ticket already solved or closed counts as done:
//!   the answer is the ticket itself.
//! - `zendesk.delete_ticket` `{ticket_key}` — the undo of a draft ticket:
//!   finds it the same way and deletes it. `DELETE` answers 204 with no
//!   body, so the connector reports `{"ticket": {"id", "external_id",
//!   "status": "deleted"}}` (the shape Zendesk's exports give a deleted
//!   ticket), which confirms with the id as the reference.
//!
//! "Already gone" for a delete, and what its lookup can and cannot know:
//! Zendesk lists no deleted ticket by external_id, and its deleted-tickets
//! list does not show external ids, so "not listed" is the only evidence a
//! ticket was deleted. It means deleted only if the ticket existed, which
//! holds whenever the delete runs: an undo runs only for a create that was
//! confirmed, and the connector sends `DELETE` only for a ticket it has just
//! seen listed. What it cannot tell apart is a ticket so new the listing has
//! not caught up; for that the connector looks a second time after
//! `settle_ms` before it calls a ticket gone (the engine's lookups look
//! twice, R7). A ticket gone before the delete could see it is reported
//! with its external id as the reference, as no id is known.
//!
//! Finding by key for a close: if no ticket is listed after the second
//! look, nothing was done and the call reports `NotSent`. When a
//! preparatory listing fails, no effect was sent: a 4xx answer is reported
//! as it came, anything else as `NotSent`.

use super::jira::settle;
use super::wire::{self, Wire};
use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use async_trait::async_trait;
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{json, Value};
use std::time::Duration;

pub const CREATE_TICKET: &str = "zendesk.create_ticket";
pub const CLOSE_TICKET: &str = "zendesk.close_ticket";
pub const DELETE_TICKET: &str = "zendesk.delete_ticket";

const NAME: &str = "zendesk";
const FIELDS: [&str; 4] = ["base_url", "email_env", "api_token_env", "settle_ms"];

/// The error Zendesk answers a reused idempotency key with.
const IDEMPOTENCY_ERROR: &str = "IdempotentRequestError";

/// The tag that carries a saga key on an update (R5).
pub fn saga_tag(key: &str) -> String {
    format!("saga-{key}")
}

/// The agent's email and API token (redacted in `Debug` output).
#[derive(Clone, Debug)]
struct Credential {
    email: SecretString,
    api_token: SecretString,
}

#[derive(Clone, Debug)]
pub struct ZendeskConnector {
    wire: Wire,
    base_url: String,
    credential: Credential,
    settle: Duration,
}

impl ZendeskConnector {
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
        let mut secret = |field: &str| -> Option<SecretString> {
            let variable = wire::setting(table, NAME, field)
                .map_err(|e| mistakes.push(e))
                .ok()?;
            wire::secret_from_env(NAME, field, variable)
                .map_err(|e| mistakes.push(e))
                .ok()
        };
        let email = secret("email_env");
        let api_token = secret("api_token_env");
        let settle = settle(table, NAME).map_err(|e| mistakes.push(e)).ok();
        match (base_url, email, api_token, settle) {
            (Some(base_url), Some(email), Some(api_token), Some(settle)) if mistakes.is_empty() => {
                Ok(ZendeskConnector {
                    wire,
                    base_url,
                    credential: Credential { email, api_token },
                    settle,
                })
            }
            _ => Err(mistakes),
        }
    }

    pub fn operations(&self) -> Vec<String> {
        vec![
            CREATE_TICKET.into(),
            CLOSE_TICKET.into(),
            DELETE_TICKET.into(),
        ]
    }

    fn request(&self, method: reqwest::Method, rest: &str) -> reqwest::RequestBuilder {
        self.wire
            .client()
            .request(method, format!("{}/api/v2{rest}", self.base_url))
            .basic_auth(
                format!("{}/token", self.credential.email.expose_secret()),
                Some(self.credential.api_token.expose_secret()),
            )
    }

    fn create_body(key: &str, args: &Value) -> Value {
        let mut ticket = json!({
            "subject": args["subject"],
            "comment": {"body": args["body"]},
            "external_id": key,
        });
        if let Some(tags) = args.get("tags").filter(|t| t.is_array()) {
            ticket["tags"] = tags.clone();
        }
        if let Some(status) = args["status"].as_str() {
            ticket["status"] = status.into();
        }
        if let Some(email) = args["requester_email"].as_str() {
            // `name` is used only when Zendesk must create the user.
            let name = email.split('@').next().unwrap_or(email);
            ticket["requester"] = json!({"email": email, "name": name});
        }
        json!({ "ticket": ticket })
    }

    /// The listing of tickets carrying `external_id`.
    fn listing(&self, external_id: &str) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::GET, "/tickets.json")
            .query(&[("external_id", external_id)])
    }

    /// The first live ticket carrying `external_id`, or `None`.
    async fn find(&self, external_id: &str) -> Result<Option<Value>, LookupError> {
        let body = self.wire.read_ok(self.listing(external_id)).await?;
        match body.get("tickets").and_then(Value::as_array) {
            Some(tickets) => Ok(tickets.first().cloned()),
            None => Err(LookupError::Unavailable(
                "the listing answered without a tickets list".into(),
            )),
        }
    }

    /// Finds the ticket a compensation acts on, looking once more after the
    /// settle pause. A failed listing is passed on: a 4xx as the system's
    /// refusal, anything else as `NotSent` (no effect was sent).
    async fn find_for(&self, external_id: &str) -> Result<Option<Value>, CallReport> {
        for attempt in 0..2 {
            if attempt > 0 {
                tokio::time::sleep(self.settle).await;
            }
            let body = match self.wire.read(self.listing(external_id)).await {
                Ok((200..=299, Some(body))) => body,
                Ok((status @ 400..=499, body)) => {
                    return Err(CallReport::Answered {
                        status,
                        body,
                        idempotency_conflict: false,
                    })
                }
                Ok((status, _)) => {
                    return Err(CallReport::NotSent {
                        reason: format!(
                            "the ticket listing answered HTTP {status}; nothing was changed"
                        ),
                    })
                }
                Err(e) => {
                    return Err(CallReport::NotSent {
                        reason: format!("the ticket listing: {e}; nothing was changed"),
                    })
                }
            };
            if let Some(ticket) = body["tickets"].as_array().and_then(|t| t.first()) {
                return Ok(Some(ticket.clone()));
            }
        }
        Ok(None)
    }

    async fn close(&self, key: &str, args: &Value) -> CallReport {
        let Some(ticket_key) = ticket_key(args) else {
            return missing_ticket_key();
        };
        let ticket = match self.find_for(ticket_key).await {
            Ok(Some(ticket)) => ticket,
            Ok(None) => {
                return CallReport::NotSent {
                    reason: format!(
                        "no ticket carries external_id {ticket_key} (not created, or not yet listed); nothing was changed"
                    ),
                }
            }
            Err(report) => return report,
        };
        if is_solved(&ticket) {
            // Already solved or closed: the compensation's work is done.
            return CallReport::Answered {
                status: 200,
                body: Some(json!({ "ticket": ticket })),
                idempotency_conflict: false,
            };
        }
        let comment = args["comment"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| {
                format!("Solved by Saga Harness: the work of step {ticket_key} was undone.")
            });
        let Some(path) = ticket_path(&ticket) else {
            return unnamed_ticket();
        };
        let request = self
            .request(reqwest::Method::PUT, &path)
            .json(&json!({"ticket": {
                "status": "solved",
                "comment": {"body": comment, "public": false},
                "additional_tags": [saga_tag(key)],
            }}));
        self.wire.send(request).await
    }

    async fn delete(&self, args: &Value) -> CallReport {
        let Some(ticket_key) = ticket_key(args) else {
            return missing_ticket_key();
        };
        let ticket = match self.find_for(ticket_key).await {
            Ok(Some(ticket)) => ticket,
            Ok(None) => {
                return CallReport::Answered {
                    status: 200,
                    body: Some(deleted(&Value::Null, ticket_key)),
                    idempotency_conflict: false,
                }
            }
            Err(report) => return report,
        };
        let Some(path) = ticket_path(&ticket) else {
            return unnamed_ticket();
        };
        let request = self.request(reqwest::Method::DELETE, &path);
        match self.wire.send(request).await {
            CallReport::Answered {
                status: status @ 200..=299,
                ..
            } => CallReport::Answered {
                status,
                body: Some(deleted(&ticket["id"], ticket_key)),
                idempotency_conflict: false,
            },
            // Listed a moment ago, not found now: someone deleted it first.
            CallReport::Answered { status: 404, .. } => CallReport::Answered {
                status: 200,
                body: Some(deleted(&ticket["id"], ticket_key)),
                idempotency_conflict: false,
            },
            other => other,
        }
    }
}

fn ticket_key(args: &Value) -> Option<&str> {
    args["ticket_key"].as_str().filter(|k| !k.is_empty())
}

fn missing_ticket_key() -> CallReport {
    CallReport::NotSent {
        reason:
            "the call has no argument `ticket_key` (the key of the step that created the ticket)"
                .into(),
    }
}

fn ticket_path(ticket: &Value) -> Option<String> {
    let id = id_text(ticket)?;
    let id = percent_encoding::utf8_percent_encode(&id, percent_encoding::NON_ALPHANUMERIC);
    Some(format!("/tickets/{id}.json"))
}

fn unnamed_ticket() -> CallReport {
    CallReport::NotSent {
        reason: "the listing answered a ticket without an id; nothing was changed".into(),
    }
}

fn is_solved(ticket: &Value) -> bool {
    matches!(ticket["status"].as_str(), Some("solved" | "closed"))
}

/// What the connector reports for a deleted ticket.
fn deleted(id: &Value, external_id: &str) -> Value {
    json!({"ticket": {"id": id, "external_id": external_id, "status": "deleted"}})
}

fn id_text(ticket: &Value) -> Option<String> {
    match &ticket["id"] {
        Value::Number(id) => Some(id.to_string()),
        Value::String(id) if !id.is_empty() => Some(id.clone()),
        _ => None,
    }
}

#[async_trait]
impl Connector for ZendeskConnector {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        match operation {
            CREATE_TICKET => {
                let request = self
                    .request(reqwest::Method::POST, "/tickets.json")
                    .header("Idempotency-Key", key)
                    .json(&Self::create_body(key, args));
                match self.wire.send(request).await {
                    CallReport::Answered {
                        status: 400,
                        body: Some(body),
                        ..
                    } if body["error"] == IDEMPOTENCY_ERROR => CallReport::Answered {
                        status: 400,
                        body: Some(body),
                        idempotency_conflict: true,
                    },
                    other => other,
                }
            }
            CLOSE_TICKET => self.close(key, args).await,
            DELETE_TICKET => self.delete(args).await,
            other => CallReport::NotSent {
                reason: format!("the Zendesk connector has no operation {other}"),
            },
        }
    }

    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        let wanted = match operation {
            CREATE_TICKET => key,
            CLOSE_TICKET | DELETE_TICKET => ticket_key(args).ok_or_else(|| {
                LookupError::Unavailable("the call has no argument `ticket_key` to look up".into())
            })?,
            _ => return Err(LookupError::Unsupported),
        };
        let found = self.find(wanted).await?;
        let succeeded = |ticket: Value| -> Result<Lookup, LookupError> {
            let external_ref = id_text(&ticket).ok_or_else(|| {
                LookupError::Unavailable("the listing answered a ticket without an id".into())
            })?;
            Ok(Lookup::FoundSucceeded {
                external_ref,
                result: json!({ "ticket": ticket }),
            })
        };
        match (operation, found) {
            (CREATE_TICKET, Some(ticket)) => succeeded(ticket),
            (CLOSE_TICKET, Some(ticket)) if is_solved(&ticket) => succeeded(ticket),
            (DELETE_TICKET, None) => Ok(Lookup::FoundSucceeded {
                external_ref: wanted.to_owned(),
                result: deleted(&Value::Null, wanted),
            }),
            _ => Ok(Lookup::NotFound),
        }
    }

    fn has_lookup(&self, operation: &str) -> bool {
        matches!(operation, CREATE_TICKET | CLOSE_TICKET | DELETE_TICKET)
    }

    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        let ticket = body.get("ticket")?;
        match operation {
            CREATE_TICKET => id_text(ticket),
            CLOSE_TICKET => is_solved(ticket).then(|| id_text(ticket)).flatten(),
            DELETE_TICKET if ticket["status"] == "deleted" => id_text(ticket).or_else(|| {
                ticket["external_id"]
                    .as_str()
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned)
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connector() -> ZendeskConnector {
        ZendeskConnector {
            wire: Wire::new(&Default::default()),
            base_url: "http://127.0.0.1:1".into(),
            credential: Credential {
                email: "agent@example.com".into(),
                api_token: "secret-token".into(),
            },
            settle: Duration::ZERO,
        }
    }

    #[test]
    fn the_credential_stays_out_of_debug_output() {
        let shown = format!("{:?}", connector());
        assert!(shown.contains("127.0.0.1"), "{shown}");
        assert!(
            !shown.contains("secret-token") && !shown.contains("agent@example.com"),
            "{shown}"
        );
    }

    #[test]
    fn r4_only_the_operations_own_answer_names_a_ref() {
        let c = connector();
        let open = json!({"ticket": {"id": 7, "status": "open"}});
        let solved = json!({"ticket": {"id": 7, "status": "solved"}});
        assert_eq!(c.external_ref(CREATE_TICKET, &open).as_deref(), Some("7"));
        assert_eq!(c.external_ref(CLOSE_TICKET, &open), None);
        assert_eq!(c.external_ref(CLOSE_TICKET, &solved).as_deref(), Some("7"));
        assert_eq!(c.external_ref(DELETE_TICKET, &open), None);
        assert_eq!(
            c.external_ref(DELETE_TICKET, &deleted(&Value::Null, "k1"))
                .as_deref(),
            Some("k1")
        );
        assert_eq!(c.external_ref(CREATE_TICKET, &json!({})), None);
    }

    #[test]
    fn the_credential_never_shows_in_debug_output() {
        let shown = format!("{:?}", connector());
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(!shown.contains("agent@example.com"), "{shown}");
    }
}
