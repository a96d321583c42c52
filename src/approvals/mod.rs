//! Approvals where support leads already are: a waiting pivot or held step
//! is posted to a Slack channel with Approve and Reject buttons, a press
//! comes back signed to `POST /slack/interactions`, and the message is
//! rewritten in place once the approval is decided, from Slack or from the
//! dashboard.
//!
//! ```toml
//! [approvals.slack]
//! channel = "#support"                        # where waiting approvals are posted
//! escalate_channel = "#support-leads"        # optional: after [approvals] escalate_after
//! signing_secret_env = "SLACK_SIGNING_SECRET" # the app's signing secret
//! dashboard_url = "https://saga.example.com"  # optional: for the run page link
//! users_by_email = true                       # optional: see below
//! [approvals.slack.users]                     # Slack user ID → dashboard user
//! U0123LEAD = "lead"
//! ```
//!
//! Posting uses the `[connectors.slack]` connector (its bot token). Only a
//! Slack user linked to a dashboard user who is an approver or an admin can
//! decide; anyone else is told so privately. A Slack user is linked by the
//! map, or with `users_by_email` by Slack's `users.info`: the dashboard
//! account named by their profile's email (the app needs the
//! `users:read.email` scope).

pub mod interactions;
pub mod message;
pub mod notifier;

use crate::connectors::slack::SlackConnector;
use crate::connectors::wire::{self, Wire};
use crate::saga::registry::Registry;
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    channel: String,
    /// Where a waiting approval is posted again after `[approvals]
    /// escalate_after`.
    escalate_channel: Option<String>,
    signing_secret_env: String,
    dashboard_url: Option<String>,
    #[serde(default)]
    users: BTreeMap<String, String>,
    /// Link Slack users the map does not name by their profile's email.
    #[serde(default)]
    users_by_email: bool,
}

/// Slack users' emails kept: at most this many (the least recently used
/// is forgotten first, so nobody is ever refused for want of room) …
const EMAILS_KEPT: std::num::NonZeroUsize = std::num::NonZeroUsize::new(10_000).unwrap();
/// … each for this long (a changed email is seen after it) …
const EMAIL_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(600);
/// … and a user without one for this long (one added is seen soon).
const NO_EMAIL_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(60);

type Emails = lru::LruCache<String, (Option<String>, std::time::Instant)>;

/// Slack approvals as the tools file configures them.
pub struct SlackApprovals {
    pub channel: String,
    pub escalate_channel: Option<String>,
    signing_secret: SecretString,
    /// Slack user ID → dashboard username.
    users: BTreeMap<String, String>,
    /// Others are linked by their Slack email (`users.info`).
    pub users_by_email: bool,
    emails: std::sync::Mutex<Emails>,
    /// Where the dashboard is reached, for links to a run's page.
    pub dashboard_url: String,
    pub slack: SlackConnector,
    /// Wakes the notifier at once after a decision made here.
    pub nudged: tokio::sync::Notify,
}

impl fmt::Debug for SlackApprovals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlackApprovals")
            .field("channel", &self.channel)
            .field("signing_secret", &self.signing_secret)
            .field("users", &self.users)
            .field("dashboard_url", &self.dashboard_url)
            .finish()
    }
}

impl SlackApprovals {
    /// Reads `[approvals.slack]`; `None` when the file has none. Every
    /// mistake is reported at once.
    pub fn from_registry(
        registry: &Registry,
        wire: &Wire,
        dashboard_url: &str,
    ) -> Result<Option<Arc<SlackApprovals>>, Vec<String>> {
        // The section's other settings are the registry's (deadlines).
        let Some(slack) = registry.approval_settings().get("slack").cloned() else {
            return Ok(None);
        };
        let settings: Settings = slack.try_into().map_err(|e: toml::de::Error| {
            vec![format!("approvals.slack: {}", e.to_string().trim())]
        })?;
        let mut mistakes = Vec::new();
        if settings.channel.trim().is_empty() {
            mistakes.push("approvals.slack, field `channel`: name the channel to post to".into());
        }
        let signing_secret = wire::secret_from_env(
            "approvals.slack",
            "signing_secret_env",
            &settings.signing_secret_env,
        )
        .map_err(|e| mistakes.push(e))
        .unwrap_or_default();
        let connector = match registry
            .connector_settings()
            .get("slack")
            .and_then(|t| t.as_table())
        {
            Some(table) => SlackConnector::from_settings(table, wire.clone())
                .map_err(|found| mistakes.extend(found))
                .ok(),
            None => {
                mistakes.push(
                    "approvals.slack: posts through the Slack connector; add [connectors.slack]"
                        .into(),
                );
                None
            }
        };
        let escalates = registry.approval_policy().escalate_after.is_some();
        if escalates && settings.escalate_channel.is_none() {
            mistakes.push(
                "approvals.slack: [approvals] escalate_after is set; name the channel to escalate to (escalate_channel)"
                    .into(),
            );
        }
        for (slack_user, username) in &settings.users {
            if username.trim().is_empty() {
                mistakes.push(format!(
                    "approvals.slack.users, `{slack_user}`: name the dashboard user"
                ));
            }
        }
        let dashboard_url = settings
            .dashboard_url
            .unwrap_or_else(|| dashboard_url.to_owned())
            .trim_end_matches('/')
            .to_owned();
        match (connector, mistakes.is_empty()) {
            (Some(slack), true) => Ok(Some(Arc::new(SlackApprovals {
                channel: settings.channel,
                escalate_channel: settings.escalate_channel,
                signing_secret,
                users: settings.users,
                users_by_email: settings.users_by_email,
                emails: std::sync::Mutex::new(lru::LruCache::new(EMAILS_KEPT)),
                dashboard_url,
                slack,
                nudged: tokio::sync::Notify::new(),
            }))),
            _ => Err(mistakes),
        }
    }

    pub fn signing_secret(&self) -> &str {
        self.signing_secret.expose_secret()
    }

    /// The dashboard user a Slack user acts as: the map's, else (with
    /// `users_by_email`) the one named by their Slack email; `Err` when
    /// Slack could not say who they are.
    pub async fn dashboard_user(&self, slack_user: &str) -> Result<Option<String>, String> {
        if let Some(name) = self.users.get(slack_user) {
            return Ok(Some(name.clone()));
        }
        if !self.users_by_email {
            return Ok(None);
        }
        if let Some(known) = self.email_kept(slack_user) {
            return Ok(known);
        }
        let email = self.slack.user_email(slack_user).await?;
        self.emails
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .put(
                slack_user.to_owned(),
                (email.clone(), std::time::Instant::now()),
            );
        Ok(email)
    }

    /// A Slack user's email as last read, while it is fresh.
    fn email_kept(&self, slack_user: &str) -> Option<Option<String>> {
        let mut emails = self.emails.lock().unwrap_or_else(|p| p.into_inner());
        let (email, read_at) = emails.get(slack_user)?.clone();
        let kept_for = if email.is_some() {
            EMAIL_KEPT_FOR
        } else {
            NO_EMAIL_KEPT_FOR
        };
        if read_at.elapsed() < kept_for {
            Some(email)
        } else {
            emails.pop(slack_user);
            None
        }
    }

    /// The link to a run's page.
    pub fn run_url(&self, run_id: uuid::Uuid) -> String {
        format!("{}/runs/{run_id}", self.dashboard_url)
    }
}
