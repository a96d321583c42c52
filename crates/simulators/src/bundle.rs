//! Every simulator at once, as `saga-harness sim`, the demo and the
//! end-to-end tests start them, and the tools file pointed at them.

use super::{serve, smtp, Ledger, Running, SimState};
use axum::Router;
use std::net::{IpAddr, SocketAddr};

/// The ports `saga-harness sim` uses unless told otherwise; tools/support.toml
/// points at them.
pub const FIRST_PORT: u16 = 4101;

/// The credentials tools/support.toml names, with the values the simulators
/// accept. Real deployments set these variables to real secrets.
pub const CREDENTIALS: &[(&str, &str)] = &[
    ("STRIPE_SECRET_KEY", "sk_test_simulated"),
    ("JIRA_EMAIL", "agent@example.com"),
    ("JIRA_API_TOKEN", "jira-simulated-token"),
    ("ZENDESK_EMAIL", "agent@example.com"),
    ("ZENDESK_API_TOKEN", "zendesk-simulated-token"),
    ("SLACK_BOT_TOKEN", "xoxb-simulated"),
    ("SLACK_SIGNING_SECRET", "simulated-signing-secret"),
];

/// One HTTP simulator: its state (ledger, faults) and its server.
pub struct Sim {
    pub state: SimState,
    pub server: Running,
}

impl Sim {
    async fn start(routes: fn(&SimState) -> Router, addr: SocketAddr) -> std::io::Result<Sim> {
        let state = SimState::default();
        let server = serve(routes(&state), addr).await?;
        Ok(Sim { state, server })
    }

    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    pub fn ledger(&self) -> &Ledger {
        &self.state.ledger
    }
}

pub struct Simulators {
    /// The SMTP sink's ledger over HTTP (`GET /_sim/ledger`), as the HTTP
    /// simulators serve theirs, on the port after the warehouse's.
    pub mailbox: Running,
    pub stripe: Sim,
    pub jira: Sim,
    pub zendesk: Sim,
    pub slack: Sim,
    pub smtp: smtp::SmtpSink,
    pub orders: Sim,
    pub warehouse: Sim,
}

impl Simulators {
    /// Starts them all on `ip`: on consecutive ports from `first_port`
    /// (stripe, jira, zendesk, slack, smtp, orders, warehouse, and the
    /// mailbox that shows what the SMTP sink received), or on free ports
    /// when `first_port` is 0.
    pub async fn start(ip: IpAddr, first_port: u16) -> std::io::Result<Simulators> {
        let at = |offset: u16| {
            let port = if first_port == 0 {
                0
            } else {
                first_port + offset
            };
            SocketAddr::new(ip, port)
        };
        let bind = |what: &'static str, addr: SocketAddr| {
            move |e: std::io::Error| {
                std::io::Error::new(
                    e.kind(),
                    format!("the {what} simulator cannot listen on {addr}: {e}"),
                )
            }
        };
        let smtp = smtp::start(at(4)).await.map_err(bind("SMTP", at(4)))?;
        let mailbox = serve(mailbox(smtp.ledger(), smtp.shared_faults()), at(7))
            .await
            .map_err(bind("mailbox", at(7)))?;
        Ok(Simulators {
            mailbox,
            stripe: Sim::start(super::stripe::router, at(0))
                .await
                .map_err(bind("Stripe", at(0)))?,
            jira: Sim::start(super::jira::router, at(1))
                .await
                .map_err(bind("Jira", at(1)))?,
            zendesk: Sim::start(super::zendesk::router, at(2))
                .await
                .map_err(bind("Zendesk", at(2)))?,
            slack: Sim::start(super::slack_app::router, at(3))
                .await
                .map_err(bind("Slack", at(3)))?,
            smtp,
            orders: Sim::start(super::orders::router, at(5))
                .await
                .map_err(bind("back-office", at(5)))?,
            warehouse: Sim::start(super::warehouse::router, at(6))
                .await
                .map_err(bind("warehouse", at(6)))?,
        })
    }

    /// Every effect every simulator recorded, system by system.
    pub fn effects(&self) -> Vec<super::Effect> {
        let mut all = Vec::new();
        for sim in [
            &self.stripe,
            &self.jira,
            &self.zendesk,
            &self.slack,
            &self.orders,
            &self.warehouse,
        ] {
            all.extend(sim.ledger().effects());
        }
        all.extend(self.smtp.ledger().effects());
        all
    }

    /// What runs where, for people to read.
    pub fn addresses(&self) -> Vec<(&'static str, String)> {
        vec![
            ("stripe", self.stripe.base_url()),
            ("jira", self.jira.base_url()),
            ("zendesk", self.zendesk.base_url()),
            ("slack", self.slack.base_url()),
            ("smtp", format!("smtp://{}", self.smtp.addr())),
            ("orders", self.orders.base_url()),
            ("warehouse", self.warehouse.base_url()),
            ("mailbox", self.mailbox.base_url()),
        ]
    }

    /// `tools` (a tools file's text) with every connector pointed at these
    /// simulators.
    pub fn point(&self, tools: &str) -> Result<String, String> {
        let mut file: toml::Table = toml::from_str(tools).map_err(|e| e.to_string())?;
        let Some(connectors) = file.get_mut("connectors").and_then(|c| c.as_table_mut()) else {
            return Ok(tools.to_owned());
        };
        let url = |s: String| toml::Value::String(s);
        for (name, sim) in [
            ("stripe", &self.stripe),
            ("jira", &self.jira),
            ("zendesk", &self.zendesk),
            ("slack", &self.slack),
        ] {
            if let Some(table) = connectors.get_mut(name).and_then(|t| t.as_table_mut()) {
                table.insert("base_url".into(), url(sim.base_url()));
            }
        }
        if let Some(table) = connectors.get_mut("smtp").and_then(|t| t.as_table_mut()) {
            table.insert("host".into(), url(self.smtp.addr().ip().to_string()));
            table.insert(
                "port".into(),
                toml::Value::Integer(i64::from(self.smtp.addr().port())),
            );
        }
        if let Some(http) = connectors.get_mut("http").and_then(|t| t.as_table_mut()) {
            for (name, sim) in [("orders", &self.orders), ("warehouse", &self.warehouse)] {
                if let Some(table) = http.get_mut(name).and_then(|t| t.as_table_mut()) {
                    table.insert("base_url".into(), url(sim.base_url()));
                }
            }
        }
        toml::to_string(&file).map_err(|e| e.to_string())
    }
}

/// The SMTP sink's ledger, read over HTTP.
fn mailbox(ledger: Ledger, faults: std::sync::Arc<std::sync::Mutex<smtp::SinkFaults>>) -> Router {
    use axum::routing::{get, post};
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SmtpFaults {
        drop_after_data: u32,
    }
    Router::new()
        .route(
            "/_sim/ledger",
            get(move || {
                let ledger = ledger.clone();
                async move { axum::Json(ledger.effects()) }
            }),
        )
        .route(
            "/_sim/faults",
            post(move |axum::Json(set): axum::Json<SmtpFaults>| {
                let faults = faults.clone();
                async move {
                    smtp::SmtpSink::set_drop_after_data(&faults, set.drop_after_data);
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        )
}

/// Sets the simulated credentials for any the environment lacks, so the
/// shipped tools file works against the simulators out of the box. Call it
/// before starting threads that read the environment.
pub fn use_simulated_credentials() {
    for (variable, value) in CREDENTIALS {
        if std::env::var_os(variable).is_none() {
            std::env::set_var(variable, value);
        }
    }
}
