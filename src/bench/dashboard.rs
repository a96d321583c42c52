//! The dashboard on a big log: the server time of the runs list and of a
//! run page's data (timeline included) on a database filled in bulk with
//! plain SQL (full mode: 10,000 runs × 100 steps = 1,000,000 saga_log rows,
//! and two audit events per step).

use super::stats::{percentile, Better, Figures};
use super::{Sizes, Target};
use crate::saga::engine::Engine;
use crate::state::AppState;
use crate::store;
use anyhow::{bail, Context};
use sqlx::Connection;
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

pub struct Dashboard {
    state: AppState,
    runs: usize,
}

/// The id of bulk run `r` (1-based), the same text on both backends.
fn run_id(r: usize) -> Uuid {
    Uuid::parse_str(&format!("00000000-0000-4000-8000-{r:012}")).expect("a fixed UUID shape")
}

const UUID_SQLITE: &str = "'00000000-0000-4000-8000-' || printf('%012d', r)";
const UUID_POSTGRES: &str = "'00000000-0000-4000-8000-' || lpad(r::text, 12, '0')";

fn sqlite_fill(runs: usize, steps: usize) -> Vec<String> {
    let series = format!(
        "WITH RECURSIVE rr(r) AS (SELECT 1 UNION ALL SELECT r + 1 FROM rr WHERE r < {runs}),
              ss(s) AS (SELECT 0 UNION ALL SELECT s + 1 FROM ss WHERE s < {last})",
        last = steps - 1
    );
    let at = format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ({runs} - r) || ' seconds')");
    vec![
        format!(
            "{series} INSERT INTO runs (id, agent, label, purpose, status, next_step, irreversible_before_pivot, created_at, updated_at)
             SELECT {UUID_SQLITE}, 'bench-dashboard', NULL, 'bulk run ' || r,
                    CASE r % 100 WHEN 0 THEN 'AWAITING_APPROVAL' WHEN 1 THEN 'NEEDS_ATTENTION' ELSE 'COMPLETED' END,
                    {steps}, 0, {at}, {at} FROM rr"
        ),
        format!(
            "{series} INSERT INTO saga_log (run_id, step_idx, tool, tool_class, idempotency_key, args, status, external_ref,
                 compensation, audience, result, error, phase, approved_individually, created_at, updated_at)
             SELECT {UUID_SQLITE}, s, 'noop_looked_up', 'compensatable', printf('%016x%016x', r, s),
                    '{{\"n\": ' || s || '}}', 'CONFIRMED', 'noop_' || r || '_' || s,
                    '{{\"tool\": \"noop_undo\", \"args\": {{\"of\": \"k\"}}}}', 'internal', '{{\"id\": \"x\"}}', NULL,
                    'before_pivot', 0, {at}, {at} FROM rr, ss"
        ),
        format!(
            "{series} INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status, detail, at)
             SELECT {UUID_SQLITE}, 'step', s, 'agent:bench-dashboard', f, t, NULL, {at}
             FROM rr, ss, (SELECT NULL AS f, 'INTENDED' AS t UNION ALL SELECT 'INTENDED', 'CONFIRMED')"
        ),
        "ANALYZE".into(),
    ]
}

fn postgres_fill(runs: usize, steps: usize) -> Vec<String> {
    let at = format!("now() - make_interval(secs => {runs} - r)");
    vec![
        format!(
            "INSERT INTO runs (id, agent, label, purpose, status, next_step, irreversible_before_pivot, created_at, updated_at)
             SELECT {UUID_POSTGRES}, 'bench-dashboard', NULL, 'bulk run ' || r,
                    CASE r % 100 WHEN 0 THEN 'AWAITING_APPROVAL' WHEN 1 THEN 'NEEDS_ATTENTION' ELSE 'COMPLETED' END,
                    {steps}, 0, {at}, {at} FROM generate_series(1, {runs}) r"
        ),
        format!(
            "INSERT INTO saga_log (run_id, step_idx, tool, tool_class, idempotency_key, args, status, external_ref,
                 compensation, audience, result, error, phase, approved_individually, created_at, updated_at)
             SELECT {UUID_POSTGRES}, s, 'noop_looked_up', 'compensatable', lpad(to_hex(r), 16, '0') || lpad(to_hex(s), 16, '0'),
                    jsonb_build_object('n', s), 'CONFIRMED', 'noop_' || r || '_' || s,
                    '{{\"tool\": \"noop_undo\", \"args\": {{\"of\": \"k\"}}}}'::jsonb, 'internal', '{{\"id\": \"x\"}}'::jsonb, NULL,
                    'before_pivot', false, {at}, {at}
             FROM generate_series(1, {runs}) r, generate_series(0, {last}) s",
            last = steps - 1
        ),
        format!(
            "INSERT INTO events (run_id, entity, entity_id, actor, from_status, to_status, detail, at)
             SELECT {UUID_POSTGRES}, 'step', s, 'agent:bench-dashboard', f, t, NULL, {at}
             FROM generate_series(1, {runs}) r, generate_series(0, {last}) s,
                  (VALUES (NULL, 'INTENDED'), ('INTENDED', 'CONFIRMED')) AS moves (f, t)",
            last = steps - 1
        ),
        "ANALYZE".into(),
    ]
}

impl Dashboard {
    /// Migrates a fresh database, fills it in bulk and opens the store on it.
    pub async fn prepare(
        target: &Target,
        url: &str,
        sizes: &Sizes,
    ) -> anyhow::Result<(Dashboard, f64)> {
        let (runs, steps) = (sizes.dashboard_runs, sizes.dashboard_steps);
        // Migrate, then let go of the file (a SQLite store holds it alone).
        drop(store::open(url).await?);
        let started = Instant::now();
        match target {
            Target::Sqlite { .. } => {
                let mut conn = sqlx::SqliteConnection::connect(url).await?;
                for sql in sqlite_fill(runs, steps) {
                    sqlx::query(&sql)
                        .execute(&mut conn)
                        .await
                        .with_context(|| sql.clone())?;
                }
                conn.close().await?;
            }
            Target::Postgres { .. } => {
                let mut conn = sqlx::PgConnection::connect(url).await?;
                for sql in postgres_fill(runs, steps) {
                    sqlx::query(&sql)
                        .execute(&mut conn)
                        .await
                        .with_context(|| sql.clone())?;
                }
                conn.close().await?;
            }
        }
        let filled_s = started.elapsed().as_secs_f64();
        let opened = store::open(url).await?;
        let store = opened.saga_store();
        let registry = super::path::registry()?;
        let engine = Arc::new(Engine::new(
            store.clone(),
            registry.clone(),
            Arc::new(super::path::NoopConnector),
        ));
        let state = AppState {
            leptos_options: crate::server::leptos_options(([127, 0, 0, 1], 0).into()),
            streams: crate::streams::Streams::new(store.clone()),
            store,
            registry,
            engine,
            sign_ins: Arc::new(crate::auth::SignInThrottle::standard()),
            sign_in: Arc::new(crate::oidc::SignInPolicy::local_only()),
            known_tokens: Default::default(),
            trusted_proxies: Arc::new(Vec::new()),
            opened,
            metrics: Default::default(),
            draining: Default::default(),
            slack_approvals: None,
        };
        Ok((Dashboard { state, runs }, filled_s))
    }

    pub async fn round(
        &self,
        prefix: &str,
        sizes: &Sizes,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let mut list = Vec::with_capacity(sizes.dashboard_queries);
        let mut page = Vec::with_capacity(sizes.dashboard_queries);
        for i in 0..sizes.dashboard_queries {
            let at = Instant::now();
            let shown = crate::ui::runs::ssr::list(
                self.state.store.as_ref(),
                &self.state.registry,
                None,
                "",
                1,
            )
            .await?;
            list.push(at.elapsed().as_secs_f64() * 1e3);
            if shown.total == 0 {
                bail!("the runs list is empty");
            }
            let run = run_id(i * 7919 % self.runs + 1);
            let at = Instant::now();
            let sheet = crate::ui::run::ssr::detail(
                &self.state,
                run,
                &crate::ui::SessionUser::local(
                    "lead".into(),
                    crate::saga::class::Role::Approver,
                    Vec::new(),
                ),
            )
            .await?;
            page.push(at.elapsed().as_secs_f64() * 1e3);
            if sheet.is_none() {
                bail!("run {run} is missing from the bulk data");
            }
        }
        let key = format!("{prefix}.dashboard");
        figures.record(
            &format!("{key}.runs_list.p50_ms"),
            "ms",
            Better::Lower,
            percentile(&list, 50.0),
        );
        figures.record(
            &format!("{key}.runs_list.p99_ms"),
            "ms",
            Better::Lower,
            percentile(&list, 99.0),
        );
        figures.record(
            &format!("{key}.run_page.p50_ms"),
            "ms",
            Better::Lower,
            percentile(&page, 50.0),
        );
        figures.record(
            &format!("{key}.run_page.p99_ms"),
            "ms",
            Better::Lower,
            percentile(&page, 99.0),
        );
        Ok(())
    }
}
