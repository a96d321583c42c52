//! The operators' figures in the Prometheus text format. Counters and
//! latencies are fed by the engine as it works (it is this module's
//! [`Observer`]); what waits on people (approvals, corrections) and the
//! database pool are read when Prometheus scrapes, so they are true across
//! every instance sharing the database. Served on a listener of its own
//! (`--metrics-bind`), never on the public address.

use crate::ops::history::{History, Reading};
use crate::saga::class::Audience;
use crate::saga::model::{Actor, ApprovalKind};
use crate::saga::observe::{Observer, Settlement, SystemRequest};
use crate::saga::status::{CorrectionStatus, StepStatus};
use crate::saga::store::{SagaStore, StoreError};
use crate::store::PoolUse;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::time::Duration;

/// Seconds, from a fast local system to a search index that lags.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

pub struct Metrics {
    registry: Registry,
    steps: IntCounterVec,
    unknowns: IntCounterVec,
    unknowns_settled: IntCounterVec,
    reconcile: HistogramVec,
    in_flight: IntGaugeVec,
    system_latency: HistogramVec,
    compensations: IntCounterVec,
    unwinds: IntCounterVec,
    approvals_expired: IntCounterVec,
    approvals_waiting: IntGaugeVec,
    approvals_oldest: GaugeVec,
    corrections_pending: IntGaugeVec,
    db_connections: IntGaugeVec,
    db_connections_max: IntGauge,
    limit_used: GaugeVec,
    pruned_rows: IntCounterVec,
    prune_last_pass: IntGaugeVec,
    /// Each limit of the tools file: its name, window and maximum.
    limits: Vec<(String, Option<i64>, i64)>,
    history: History,
}

/// What the figures read at scrape time come from.
pub struct Sources<'a> {
    pub store: &'a dyn SagaStore,
    pub pool: PoolUse,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let family = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("a valid counter definition");
            registry
                .register(Box::new(family.clone()))
                .expect("each metric registered once");
            family
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let family =
                IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge definition");
            registry
                .register(Box::new(family.clone()))
                .expect("each metric registered once");
            family
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
            let family = HistogramVec::new(opts, labels).expect("a valid histogram definition");
            registry
                .register(Box::new(family.clone()))
                .expect("each metric registered once");
            family
        };
        let steps = counter(
            "saga_steps_total",
            "Steps moved to an outcome, by tool, class and outcome.",
            &["tool", "class", "outcome"],
        );
        let unknowns = counter(
            "saga_unknown_outcomes_total",
            "Steps whose outcome became unknown (a timeout, a reset, a blank answer).",
            &["tool"],
        );
        let unknowns_settled = counter(
            "saga_unknowns_settled_total",
            "Unknown or in-flight steps given their real outcome, by how: lookup, second_look or person.",
            &["tool", "how"],
        );
        let reconcile = histogram(
            "saga_reconcile_seconds",
            "How long reconciling one step took, lookups and settle pause included.",
            &["tool"],
        );
        let in_flight = gauge(
            "saga_calls_in_flight",
            "Calls sent to a system and not yet answered.",
            &["system"],
        );
        let system_latency = histogram(
            "saga_system_request_seconds",
            "How long a system took to answer, by system and request (execute or lookup).",
            &["system", "request"],
        );
        let compensations = counter(
            "saga_compensations_total",
            "Compensations and undos moved to an outcome, by tool and outcome.",
            &["tool", "outcome"],
        );
        let unwinds = counter(
            "saga_unwinds_total",
            "Runs that started unwinding, by who asked: agent, person or system.",
            &["by"],
        );
        let approvals_expired = counter(
            "saga_approvals_expired_total",
            "Approvals left pending past their deadline.",
            &["kind"],
        );
        let approvals_waiting = gauge(
            "saga_approvals_waiting",
            "Approvals waiting for a person now, by kind (pivot or step).",
            &["kind"],
        );
        let approvals_oldest = GaugeVec::new(
            Opts::new(
                "saga_approvals_oldest_wait_seconds",
                "How long the oldest waiting approval of each kind has waited.",
            ),
            &["kind"],
        )
        .expect("a valid gauge definition");
        registry
            .register(Box::new(approvals_oldest.clone()))
            .expect("each metric registered once");
        let corrections_pending = gauge(
            "saga_corrections_pending",
            "Corrections waiting for a person's sign-off, by audience.",
            &["audience"],
        );
        let db_connections = gauge(
            "saga_db_connections",
            "Database connections of this instance, by state (in_use or idle).",
            &["state"],
        );
        let db_connections_max = IntGauge::new(
            "saga_db_connections_max",
            "The most database connections this instance may open.",
        )
        .expect("a valid gauge definition");
        registry
            .register(Box::new(db_connections_max.clone()))
            .expect("each metric registered once");
        let limit_used = GaugeVec::new(
            Opts::new(
                "saga_limit_used_ratio",
                "How much of each limit of the tools file the busiest run, agent or customer it counts has used in its window (1 = at the maximum; above 1 only by a person's approval).",
            ),
            &["limit"],
        )
        .expect("a valid gauge definition");
        registry
            .register(Box::new(limit_used.clone()))
            .expect("each metric registered once");
        let pruned_rows = counter(
            "saga_pruned_rows_total",
            "Rows the retention pass took out of the saga log, by table.",
            &["table"],
        );
        let prune_last_pass = gauge(
            "saga_prune_last_pass",
            "The last retention pass: when it ended (what=\"timestamp_seconds\") and the runs it pruned (what=\"runs\").",
            &["what"],
        );
        Metrics {
            registry,
            pruned_rows,
            prune_last_pass,
            steps,
            unknowns,
            unknowns_settled,
            reconcile,
            in_flight,
            system_latency,
            compensations,
            unwinds,
            approvals_expired,
            approvals_waiting,
            approvals_oldest,
            corrections_pending,
            db_connections,
            db_connections_max,
            limit_used,
            limits: Vec::new(),
            history: History::default(),
        }
    }

    /// Every series whose labels the tools file already names, at zero:
    /// a dashboard or an alert sees it from the first scrape, not from its
    /// first event (a series that appears only then hides the start of a
    /// rate and makes `absent()` mean two things).
    pub fn with_known_labels(mut self, tools: &crate::saga::registry::Registry) -> Self {
        self.limits = tools
            .limits()
            .list
            .iter()
            .map(|l| (l.name.clone(), l.per.window_s(), l.max))
            .collect();
        for (name, _, _) in &self.limits {
            self.limit_used.with_label_values(&[name.as_str()]);
        }
        let outcomes: Vec<String> = StepStatus::ALL
            .into_iter()
            .filter(|status| *status != StepStatus::Intended)
            .map(|status| status.as_str().to_ascii_lowercase())
            .collect();
        for spec in tools.tools() {
            let (tool, class) = (spec.name.as_str(), spec.class.as_str());
            for outcome in &outcomes {
                self.steps.with_label_values(&[tool, class, outcome]);
                self.compensations.with_label_values(&[tool, outcome]);
            }
            self.unknowns.with_label_values(&[tool]);
            for how in [
                Settlement::Lookup,
                Settlement::SecondLook,
                Settlement::Person,
            ] {
                self.unknowns_settled
                    .with_label_values(&[tool, how.as_str()]);
            }
            self.reconcile.with_label_values(&[tool]);
            let system = crate::saga::observe::system_of(&spec.connector);
            self.in_flight.with_label_values(&[system]);
            for request in [SystemRequest::Execute, SystemRequest::Lookup] {
                self.system_latency
                    .with_label_values(&[system, request.as_str()]);
            }
        }
        for by in ["agent", "person", "system"] {
            self.unwinds.with_label_values(&[by]);
        }
        for kind in [ApprovalKind::Pivot, ApprovalKind::Step] {
            self.approvals_expired
                .with_label_values(&[kind_label(kind)]);
        }
        self
    }

    /// A retention pass ended.
    pub fn pruned(&self, pass: &crate::ops::retention::Pass) {
        for (table, rows) in &pass.removed {
            self.pruned_rows.with_label_values(&[table]).inc_by(*rows);
        }
        self.prune_last_pass
            .with_label_values(&["timestamp_seconds"])
            .set(chrono::Utc::now().timestamp());
        self.prune_last_pass
            .with_label_values(&["runs"])
            .set(pass.pruned as i64);
    }

    /// Every figure, the ones read from the database brought up to date
    /// first, in the Prometheus text format (version 0.0.4).
    pub async fn render(&self, sources: Sources<'_>) -> Result<String, StoreError> {
        self.refresh(sources).await?;
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .map_err(|e| StoreError::database("encoding the metrics", e))?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    /// Every figure as it stands now, for the operators' page.
    pub async fn reading(&self, sources: Sources<'_>) -> Result<Reading, StoreError> {
        self.refresh(sources).await?;
        Ok(Reading::of(&self.registry.gather()))
    }

    /// Takes this minute's reading into the last hour's.
    pub async fn record_minute(&self, sources: Sources<'_>) -> Result<(), StoreError> {
        let reading = self.reading(sources).await?;
        self.history.record(reading);
        Ok(())
    }

    /// The readings of the last hour, oldest first.
    pub fn last_hour(&self) -> Vec<Reading> {
        self.history.readings()
    }

    /// Brings the figures read from the database and the pool up to date.
    async fn refresh(&self, sources: Sources<'_>) -> Result<(), StoreError> {
        self.read_waiting_work(sources.store).await?;
        if !self.limits.is_empty() {
            let asked: Vec<(String, Option<i64>)> = self
                .limits
                .iter()
                .map(|(name, window, _)| (name.clone(), *window))
                .collect();
            let peaks = sources.store.limit_peaks(&asked).await?;
            for ((name, _, max), peak) in self.limits.iter().zip(peaks) {
                self.limit_used
                    .with_label_values(&[name.as_str()])
                    .set(peak as f64 / (*max).max(1) as f64);
            }
        }
        let pool = sources.pool;
        self.db_connections
            .with_label_values(&["in_use"])
            .set(i64::from(pool.open.saturating_sub(pool.idle)));
        self.db_connections
            .with_label_values(&["idle"])
            .set(i64::from(pool.idle));
        self.db_connections_max.set(i64::from(pool.max));
        Ok(())
    }

    /// Approvals and corrections waiting for people, as the database has
    /// them now (every instance's, not only this one's).
    async fn read_waiting_work(&self, store: &dyn SagaStore) -> Result<(), StoreError> {
        let now = chrono::Utc::now();
        let approvals = store.pending_approvals().await?;
        for kind in [ApprovalKind::Pivot, ApprovalKind::Step] {
            let waiting: Vec<_> = approvals.iter().filter(|a| a.kind == kind).collect();
            let label = kind_label(kind);
            self.approvals_waiting
                .with_label_values(&[label])
                .set(waiting.len() as i64);
            let oldest = waiting
                .iter()
                .map(|a| (now - a.created_at).num_milliseconds().max(0) as f64 / 1000.0)
                .fold(0.0, f64::max);
            self.approvals_oldest
                .with_label_values(&[label])
                .set(oldest);
        }
        let queue = store.correction_queue().await?;
        for audience in [
            Audience::Public,
            Audience::Customer,
            Audience::Partner,
            Audience::Finance,
            Audience::Internal,
        ] {
            let pending = queue
                .iter()
                .filter(|c| c.audience == audience && c.status == CorrectionStatus::Pending)
                .count();
            self.corrections_pending
                .with_label_values(&[audience.as_str()])
                .set(pending as i64);
        }
        Ok(())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn kind_label(kind: ApprovalKind) -> &'static str {
    match kind {
        ApprovalKind::Pivot => "pivot",
        ApprovalKind::Step => "step",
    }
}

impl Observer for Metrics {
    fn step_moved(&self, tool: &str, class: &str, _from: StepStatus, to: StepStatus) {
        if to == StepStatus::Intended {
            return;
        }
        let outcome = to.as_str().to_ascii_lowercase();
        self.steps.with_label_values(&[tool, class, &outcome]).inc();
        if to == StepStatus::Unknown {
            self.unknowns.with_label_values(&[tool]).inc();
        }
    }

    fn compensation_moved(&self, tool: &str, to: StepStatus) {
        if to == StepStatus::Intended {
            return;
        }
        let outcome = to.as_str().to_ascii_lowercase();
        self.compensations
            .with_label_values(&[tool, &outcome])
            .inc();
    }

    fn unknown_settled(&self, tool: &str, how: Settlement) {
        self.unknowns_settled
            .with_label_values(&[tool, how.as_str()])
            .inc();
    }

    fn reconciled(&self, tool: &str, took: Duration) {
        self.reconcile
            .with_label_values(&[tool])
            .observe(took.as_secs_f64());
    }

    fn request_started(&self, system: &str) {
        self.in_flight.with_label_values(&[system]).inc();
    }

    fn request_ended(&self, system: &str, request: SystemRequest, took: Duration) {
        if request == SystemRequest::Execute {
            self.in_flight.with_label_values(&[system]).dec();
        }
        self.system_latency
            .with_label_values(&[system, request.as_str()])
            .observe(took.as_secs_f64());
    }

    fn approval_expired(&self, kind: ApprovalKind) {
        self.approvals_expired
            .with_label_values(&[kind_label(kind)])
            .inc();
    }

    fn unwind_started(&self, by: &Actor) {
        let by = match by {
            Actor::Agent(_) => "agent",
            Actor::User(_) => "person",
            Actor::System => "system",
        };
        self.unwinds.with_label_values(&[by]).inc();
    }
}
