//! The engine path: non-pure steps through `Engine::call` to a connector
//! that confirms at once, so what is left is the harness and its commits.
//! Also the flatness of a long run and the reconcile + unwind of one.

use super::stats::{percentile, Better, Figures};
use super::Sizes;
use crate::saga::class::{Audience, Phase, ToolClass};
use crate::saga::connector::{CallReport, Connector, Lookup, LookupError};
use crate::saga::engine::{Engine, OutcomeKind};
use crate::saga::key::step_key;
use crate::saga::model::{Actor, Durability, NewRun, NewStep, Outcome};
use crate::saga::registry::Registry;
use crate::saga::status::{RunStatus, StepStatus};
use crate::saga::store::SagaStore;
use anyhow::{bail, Context};
use async_trait::async_trait;
use futures::future::try_join_all;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

pub const AGENT: &str = "bench-agent";

/// Untimed steps on each of 64 runs before a round's engine figures.
const WARM_UP_STEPS: usize = 8;

/// Two tools alike but for the lookup: one whose outcome commit may be
/// lazy (DESIGN.md §9), one whose outcome is durable before the agent
/// hears of it. Both internal, so no correction is ever queued.
pub const TOOLS: &str = r#"
[[tool]]
name = "noop_looked_up"
class = "compensatable"
connector = "noop.looked_up"
audience = "internal"
settle_ms = 0
compensation = { tool = "noop_undo", args = { of = "{key}" } }

[[tool]]
name = "noop_blind"
class = "compensatable"
connector = "noop.blind"
audience = "internal"
settle_ms = 0
compensation = { tool = "noop_undo", args = { of = "{key}" } }

[[tool]]
name = "noop_undo"
class = "compensatable"
connector = "noop.looked_up"
audience = "internal"
way_back_only = true
settle_ms = 0
"#;

/// An in-process system that does nothing and confirms instantly with an
/// id; it finds every key it is asked about.
pub struct NoopConnector;

#[async_trait]
impl Connector for NoopConnector {
    async fn execute(&self, _operation: &str, key: &str, _args: &Value) -> CallReport {
        CallReport::Answered {
            status: 200,
            body: Some(json!({ "id": format!("noop_{key}") })),
            idempotency_conflict: false,
        }
    }

    async fn lookup(
        &self,
        operation: &str,
        key: &str,
        _args: &Value,
    ) -> Result<Lookup, LookupError> {
        if !self.has_lookup(operation) {
            return Err(LookupError::Unsupported);
        }
        Ok(Lookup::FoundSucceeded {
            external_ref: format!("noop_{key}"),
            result: json!({ "id": format!("noop_{key}") }),
        })
    }

    fn has_lookup(&self, operation: &str) -> bool {
        operation == "noop.looked_up"
    }

    fn external_ref(&self, _operation: &str, body: &Value) -> Option<String> {
        body["id"].as_str().map(str::to_owned)
    }
}

pub fn registry() -> anyhow::Result<Arc<Registry>> {
    Ok(Arc::new(
        Registry::from_toml(TOOLS).context("the benchmark's tools")?,
    ))
}

#[derive(Clone)]
pub struct EnginePath {
    engine: Arc<Engine>,
    store: Arc<dyn SagaStore>,
}

impl EnginePath {
    pub fn new(store: Arc<dyn SagaStore>) -> anyhow::Result<EnginePath> {
        Ok(EnginePath::with_registry(store, registry()?))
    }

    /// The same path over another tools file's registry.
    pub fn with_registry(store: Arc<dyn SagaStore>, registry: Arc<Registry>) -> EnginePath {
        let engine = Arc::new(Engine::new(
            store.clone(),
            registry,
            Arc::new(NoopConnector),
        ));
        EnginePath { engine, store }
    }

    pub(super) async fn new_run(&self) -> anyhow::Result<Uuid> {
        let (run, _) = self
            .store
            .create_run(NewRun {
                agent: AGENT.into(),
                label: None,
                purpose: "benchmark".into(),
            })
            .await?;
        Ok(run.id)
    }

    /// A run of `steps` calls, completed by its agent: settled history.
    pub(super) async fn completed_run(&self, steps: usize) -> anyhow::Result<()> {
        let run = self.new_run().await?;
        self.steps_on(run, "noop_looked_up", steps).await?;
        self.engine
            .complete(AGENT, run)
            .await
            .map_err(|e| anyhow::anyhow!("completing a run: {e}"))?;
        Ok(())
    }

    /// `steps` calls of `tool` on one new run, one after another: each
    /// call's latency in ms.
    async fn steps(&self, tool: &str, steps: usize) -> anyhow::Result<Vec<f64>> {
        let run = self.new_run().await?;
        self.steps_on(run, tool, steps).await
    }

    pub(super) async fn steps_on(
        &self,
        run: Uuid,
        tool: &str,
        steps: usize,
    ) -> anyhow::Result<Vec<f64>> {
        let mut latencies = Vec::with_capacity(steps);
        for step in 0..steps as i64 {
            let at = Instant::now();
            let outcome = self
                .engine
                .call(AGENT, run, tool, json!({ "n": step }), Some(step))
                .await
                .map_err(|e| anyhow::anyhow!("step {step} of {tool}: {e}"))?;
            latencies.push(at.elapsed().as_secs_f64() * 1e3);
            if outcome.outcome != OutcomeKind::Confirmed {
                bail!("step {step} of {tool} came back {:?}", outcome.outcome);
            }
        }
        Ok(latencies)
    }

    /// Untimed steps on a new run, the two tools in turn.
    async fn warm_up(&self) -> anyhow::Result<()> {
        let run = self.new_run().await?;
        for i in 0..WARM_UP_STEPS {
            let tool = ["noop_looked_up", "noop_blind"][i % 2];
            self.engine
                .call(AGENT, run, tool, json!({ "warm": i }), Some(i as i64))
                .await
                .map_err(|e| anyhow::anyhow!("warm-up step {i}: {e}"))?;
        }
        Ok(())
    }

    pub async fn round(
        &self,
        prefix: &str,
        sizes: &Sizes,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        // The store is opened afresh for each round: its pool starts empty,
        // and on PostgreSQL opening a connection (authentication included)
        // takes milliseconds, and each connection plans a prepared statement
        // afresh on its first five runs before it keeps a generic plan.
        // Untimed steps of both tools on as many runs at once as the widest
        // measurement open the connections and settle their plans first, so
        // the figure measured first does not pay for them.
        try_join_all((0..64).map(|_| {
            let path = self.clone();
            tokio::spawn(async move { path.warm_up().await })
        }))
        .await?
        .into_iter()
        .collect::<anyhow::Result<()>>()?;
        let tools = [("noop_looked_up", "lookup"), ("noop_blind", "no_lookup")];
        for (tool, name) in tools {
            let key = format!("{prefix}.engine.{name}");
            let run = self.new_run().await?;
            let started = Instant::now();
            let latencies = self.steps_on(run, tool, sizes.ops(1)).await?;
            let per_s = latencies.len() as f64 / started.elapsed().as_secs_f64();
            figures.record(
                &format!("{key}.c1.p50_ms"),
                "ms",
                Better::Lower,
                percentile(&latencies, 50.0),
            );
            figures.record(
                &format!("{key}.c1.p99_ms"),
                "ms",
                Better::Lower,
                percentile(&latencies, 99.0),
            );
            figures.record(&format!("{key}.c1.per_s"), "/s", Better::Higher, per_s);
            for runs in [8usize, 64] {
                let each = sizes.ops(runs).div_ceil(runs);
                let ids = try_join_all((0..runs).map(|_| self.new_run())).await?;
                let cpu = super::cpu::CpuMark::now();
                let started = Instant::now();
                let all = try_join_all(ids.into_iter().map(|run| {
                    let path = self.clone();
                    tokio::spawn(async move { path.steps_on(run, tool, each).await })
                }))
                .await?;
                let mut done = 0;
                for one in all {
                    done += one?.len();
                }
                let per_s = done as f64 / started.elapsed().as_secs_f64();
                figures.record(&format!("{key}.c{runs}.per_s"), "/s", Better::Higher, per_s);
                // Whether the figure was bound by the cores: the benchmark
                // process (the harness and the tasks driving it) and the
                // machine, in cores busy on average.
                if let Some(used) = cpu.and_then(|mark| mark.since()) {
                    figures.record(
                        &format!("{key}.c{runs}.process_cores"),
                        "cores",
                        Better::Lower,
                        used.process_cores,
                    );
                    figures.record(
                        &format!("{key}.c{runs}.machine_busy_cores"),
                        "cores",
                        Better::Lower,
                        used.machine_busy_cores,
                    );
                }
            }
        }
        self.store_parts(prefix, sizes, figures).await?;
        self.flatness(prefix, sizes, figures).await?;
        self.unwind(prefix, sizes, figures).await
    }

    /// The two store calls a looked-up step makes on its hot path, without
    /// the engine around them, each timed: the claim written with the
    /// durable intent, and the lazy outcome that gives the claim back. The
    /// engine's p50 less their sum is the harness's own time per step.
    async fn store_parts(
        &self,
        prefix: &str,
        sizes: &Sizes,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let run = self.new_run().await?;
        let actor = Actor::Agent(AGENT.into());
        let steps = sizes.ops(1);
        let (mut intent, mut outcome, mut sum) = (
            Vec::with_capacity(steps),
            Vec::with_capacity(steps),
            Vec::with_capacity(steps),
        );
        let ms = |at: Instant| at.elapsed().as_secs_f64() * 1e3;
        for step in 0..steps as i64 {
            let started = Instant::now();
            let (mut claim, _) = self
                .store
                .claim_and_record_step(AGENT.into(), looked_up_step(run, step), &actor)
                .await?
                .ok_or_else(|| anyhow::anyhow!("step {step}: the run was not ready"))?;
            intent.push(ms(started));
            let at = Instant::now();
            let confirmed = Outcome::confirmed(
                StepStatus::Intended,
                format!("noop-{step}"),
                json!({ "id": format!("noop-{step}") }),
            );
            self.store
                .settle_step_and_release(
                    run,
                    step,
                    confirmed,
                    Durability::Lazy,
                    &actor,
                    claim.as_mut(),
                )
                .await?;
            outcome.push(ms(at));
            drop(claim);
            sum.push(ms(started));
        }
        for (part, values) in [("intent", &intent), ("outcome", &outcome), ("sum", &sum)] {
            figures.record(
                &format!("{prefix}.store.{part}.p50_ms"),
                "ms",
                Better::Lower,
                percentile(values, 50.0),
            );
        }
        Ok(())
    }

    /// Step N against step 1: the p50 of a window at each end of one run.
    async fn flatness(
        &self,
        prefix: &str,
        sizes: &Sizes,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let latencies = self.steps("noop_looked_up", sizes.long_run).await?;
        let window = sizes.window;
        let first = percentile(&latencies[..window], 50.0);
        let last = percentile(&latencies[latencies.len() - window..], 50.0);
        let key = format!("{prefix}.flat");
        figures.record(&format!("{key}.first.p50_ms"), "ms", Better::Lower, first);
        figures.record(&format!("{key}.last.p50_ms"), "ms", Better::Lower, last);
        figures.record(
            &format!("{key}.last_over_first"),
            "×",
            Better::Lower,
            last / first,
        );
        Ok(())
    }

    /// A run whose every step is logged INTENDED and never heard back (as
    /// after a crash): the unwind reconciles each one, then compensates
    /// them all, newest first.
    async fn unwind(
        &self,
        prefix: &str,
        sizes: &Sizes,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let run = self.new_run().await?;
        let actor = Actor::Agent(AGENT.into());
        for step in 0..sizes.long_run as i64 {
            self.store
                .record_step(looked_up_step(run, step), &actor)
                .await?;
        }
        let started = Instant::now();
        let after = self
            .engine
            .unwind(run, &actor, "benchmark")
            .await
            .map_err(|e| anyhow::anyhow!("unwinding: {e}"))?;
        let wall = started.elapsed().as_secs_f64() * 1e3;
        if after.status != RunStatus::Unwound {
            bail!("the benchmark's unwind ended {}", after.status);
        }
        figures.record(
            &format!("{prefix}.unwind.wall_ms"),
            "ms",
            Better::Lower,
            wall,
        );
        Ok(())
    }
}

/// A looked-up step's intent, as the engine would write it.
fn looked_up_step(run: Uuid, step: i64) -> NewStep {
    let key = step_key(run, step, "noop_looked_up");
    NewStep {
        run_id: run,
        step_idx: step,
        tool: "noop_looked_up".into(),
        tool_class: ToolClass::Compensatable,
        compensation: Some(json!({ "tool": "noop_undo", "args": { "of": key } })),
        idempotency_key: key,
        args: json!({ "n": step }),
        status: StepStatus::Intended,
        audience: Audience::Internal,
        phase: Phase::BeforePivot,
        limits: Default::default(),
    }
}
