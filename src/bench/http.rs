//! The full path: an agent's call over the HTTP API of a real server (port
//! 0) to the warehouse simulator on loopback through the generic HTTP
//! connector (tools/support.toml's `reship`), against the same request
//! sent straight to the simulator. The difference is the harness.

use super::stats::{percentile, Better, Figures};
use super::Sizes;
use crate::auth;
use crate::config::{DatabaseArgs, ServeArgs};
use crate::connectors::wire::{Timeouts, Wire};
use crate::connectors::ConnectorSet;
use crate::saga::registry::Registry;
use crate::server::Application;
use crate::sim::bundle::{use_simulated_credentials, Simulators};
use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use std::time::Instant;

use crate::demo::SUPPORT_TOOLS;

pub struct FullPath {
    _sims: Simulators,
    warehouse: String,
    api: String,
    token: String,
    client: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    sent: u64,
}

impl FullPath {
    pub async fn start(database_url: &str) -> anyhow::Result<FullPath> {
        use_simulated_credentials();
        let sims = Simulators::start([127, 0, 0, 1].into(), 0)
            .await
            .context("starting the simulators")?;
        let tools = sims.point(SUPPORT_TOOLS).map_err(|e| anyhow!(e))?;
        let registry = Registry::from_toml(&tools)?;
        let connectors = ConnectorSet::from_settings(
            registry.connector_settings(),
            &Wire::new(&Timeouts::default()),
        )
        .map_err(|mistakes| anyhow!(mistakes.join("\n")))?;
        let serve = ServeArgs {
            bind: ([127, 0, 0, 1], 0).into(),
            database: DatabaseArgs {
                database_url: database_url.to_owned(),
                store: Default::default(),
            },
            tools: None,
            secure_cookies: None,
            public_url: None,
            limits: Default::default(),
            operations: Default::default(),
            sign_in: Default::default(),
        };
        let app = Application::build_from(serve, registry, connectors).await?;
        let token = auth::new_api_token();
        app.state()
            .store
            .add_api_token(super::path::AGENT, &auth::token_hash(&token), Some("bench"))
            .await?;
        let api = format!("http://{}/api/v1", app.local_addr());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(err) = app.serve(shutdown).await {
                tracing::error!(%err, "the benchmark's server stopped");
            }
        });
        Ok(FullPath {
            warehouse: sims.warehouse.base_url(),
            _sims: sims,
            api,
            token,
            client: reqwest::Client::builder()
                .pool_idle_timeout(crate::serving::CLIENT_POOL_IDLE)
                .build()?,
            stop: Some(stop),
            served: Some(served),
            sent: 0,
        })
    }

    async fn post(&self, url: &str, body: Value) -> anyhow::Result<Value> {
        let response = self
            .client
            .post(url)
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await?;
        if !status.is_success() {
            bail!("{url} answered {status}: {body}");
        }
        Ok(body)
    }

    pub async fn round(
        &mut self,
        prefix: &str,
        sizes: &Sizes,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let created = self
            .post(
                &format!("{}/runs", self.api),
                json!({ "purpose": "benchmark" }),
            )
            .await?;
        let run = created["run"]["id"]
            .as_str()
            .ok_or_else(|| anyhow!("no run id in {created}"))?
            .to_owned();
        let calls = format!("{}/runs/{run}/calls", self.api);
        let n = sizes.ops(1);
        let mut harness = Vec::with_capacity(n);
        for step in 0..n {
            let body = json!({
                "tool": "reship",
                "step": step,
                "args": { "order_id": format!("ord_{step}"), "items": ["sku-1"], "email": "customer@example.com" },
            });
            let at = Instant::now();
            let answer = self.post(&calls, body).await?;
            harness.push(at.elapsed().as_secs_f64() * 1e3);
            if answer["outcome"] != "confirmed" {
                bail!("step {step} over HTTP came back {answer}");
            }
        }
        let shipments = format!("{}/v1/shipments", self.warehouse);
        let mut direct = Vec::with_capacity(n);
        for step in 0..n {
            self.sent += 1;
            let key = format!("direct-{}-{}", std::process::id(), self.sent);
            let at = Instant::now();
            let response = self
                .client
                .post(&shipments)
                .header("Idempotency-Key", &key)
                .json(&json!({ "order_id": format!("ord_{step}"), "items": ["sku-1"], "reference": key }))
                .send()
                .await?;
            let status = response.status();
            let _: Value = response.json().await?;
            direct.push(at.elapsed().as_secs_f64() * 1e3);
            if !status.is_success() {
                bail!("the warehouse simulator answered {status}");
            }
        }
        let (h50, d50) = (percentile(&harness, 50.0), percentile(&direct, 50.0));
        figures.record(
            &format!("{prefix}.http.c1.p50_ms"),
            "ms",
            Better::Lower,
            h50,
        );
        figures.record(
            &format!("{prefix}.http.c1.p99_ms"),
            "ms",
            Better::Lower,
            percentile(&harness, 99.0),
        );
        figures.record(
            &format!("{prefix}.http.direct.p50_ms"),
            "ms",
            Better::Lower,
            d50,
        );
        figures.record(
            &format!("{prefix}.http.direct.p99_ms"),
            "ms",
            Better::Lower,
            percentile(&direct, 99.0),
        );
        figures.record(
            &format!("{prefix}.http.harness_share.p50_ms"),
            "ms",
            Better::Lower,
            h50 - d50,
        );
        Ok(())
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
    }
}
