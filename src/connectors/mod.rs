//! The connectors this build can reach, routed by operation name.
//!
//! Each connector is configured in the `[connectors]` section of the tools
//! file (base URL, the environment variables holding credentials) and serves
//! the operations tools name (`stripe.authorize`, `jira.close` …). Start-up
//! refuses a tools file that names an operation no connector serves, so a
//! call never finds out at run time.

pub mod http;
pub mod jira;
pub mod slack;
pub mod smtp;
pub mod stripe;
pub mod wire;
pub mod zendesk;

use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use crate::saga::registry::Registry;
use async_trait::async_trait;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A connector built from its settings, with the operations it serves.
type Built = Result<(Vec<String>, Arc<dyn Connector>), Vec<String>>;

/// Operation name → the connector that performs it.
#[derive(Clone, Default)]
pub struct ConnectorSet {
    routes: BTreeMap<String, Arc<dyn Connector>>,
}

impl ConnectorSet {
    pub fn new() -> Self {
        ConnectorSet::default()
    }

    /// Routes every operation in `operations` to `connector`.
    pub fn serve(mut self, operations: &[&str], connector: Arc<dyn Connector>) -> Self {
        for operation in operations {
            self.routes
                .insert((*operation).to_owned(), connector.clone());
        }
        self
    }

    /// Builds every connector the `[connectors]` section configures. All
    /// mistakes are reported at once, each naming the connector and field.
    pub fn from_settings(settings: &toml::Table, wire: &wire::Wire) -> Result<Self, Vec<String>> {
        let mut set = ConnectorSet::new();
        let mut mistakes = Vec::new();
        for (name, value) in settings {
            let Some(table) = value.as_table() else {
                mistakes.push(format!("connector `{name}`: expected a table of settings"));
                continue;
            };
            let built: Built = match name.as_str() {
                // Upstream MCP servers are connected to at start-up, where
                // their tools are listed (crate::mcp::upstream::attach).
                "mcp" => continue,
                "http" => http::HttpConnector::from_settings(table, wire.clone())
                    .map(|c| (c.operations(), Arc::new(c) as Arc<dyn Connector>)),
                "stripe" => stripe::StripeConnector::from_settings(table, wire.clone())
                    .map(|c| (c.operations(), Arc::new(c) as Arc<dyn Connector>)),
                "jira" => jira::JiraConnector::from_settings(table, wire.clone())
                    .map(|c| (c.operations(), Arc::new(c) as Arc<dyn Connector>)),
                "zendesk" => zendesk::ZendeskConnector::from_settings(table, wire.clone())
                    .map(|c| (c.operations(), Arc::new(c) as Arc<dyn Connector>)),
                "slack" => slack::SlackConnector::from_settings(table, wire.clone())
                    .map(|c| (c.operations(), Arc::new(c) as Arc<dyn Connector>)),
                "smtp" => smtp::SmtpConnector::from_settings(table)
                    .map(|c| (c.operations(), Arc::new(c) as Arc<dyn Connector>)),
                other => Err(vec![format!(
                    "connector `{other}` is not one this build has (stripe, jira, zendesk, slack, smtp, http, mcp)"
                )]),
            };
            match built {
                Ok((operations, connector)) => {
                    let names: Vec<&str> = operations.iter().map(String::as_str).collect();
                    set = set.serve(&names, connector);
                }
                Err(found) => mistakes.extend(found),
            }
        }
        if mistakes.is_empty() {
            Ok(set)
        } else {
            Err(mistakes)
        }
    }

    /// The operations this set serves.
    pub fn operations(&self) -> impl Iterator<Item = &str> {
        self.routes.keys().map(String::as_str)
    }

    /// The operations the tools file names that nothing here serves.
    pub fn missing_for(&self, registry: &Registry) -> Vec<String> {
        let mut missing = Vec::new();
        for spec in registry.tools() {
            let mut operations = vec![spec.connector.clone()];
            operations.extend(spec.correction_channels().into_iter().map(str::to_owned));
            for operation in operations {
                if !self.routes.contains_key(&operation) {
                    missing.push(format!(
                        "tool `{}`: no connector serves operation `{operation}`",
                        spec.name
                    ));
                }
            }
        }
        missing
    }

    fn route(&self, operation: &str) -> Option<&Arc<dyn Connector>> {
        self.routes.get(operation)
    }
}

#[async_trait]
impl Connector for ConnectorSet {
    async fn execute(&self, operation: &str, key: &str, args: &Value) -> CallReport {
        match self.route(operation) {
            Some(connector) => connector.execute(operation, key, args).await,
            None => CallReport::NotSent {
                reason: format!("no connector serves {operation}"),
            },
        }
    }

    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        args: &Value,
    ) -> Result<Lookup, LookupError> {
        match self.route(operation) {
            Some(connector) => connector.lookup(operation, key, args).await,
            None => Err(LookupError::Unsupported),
        }
    }

    fn has_lookup(&self, operation: &str) -> bool {
        self.route(operation)
            .is_some_and(|c| c.has_lookup(operation))
    }

    fn external_ref(&self, operation: &str, body: &Value) -> Option<String> {
        self.route(operation)
            .and_then(|c| c.external_ref(operation, body))
    }
}
