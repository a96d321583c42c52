#!/usr/bin/env bash
# PostgreSQL alone, without the harness, on the statements the store sends
# for a step. First a step whose writes go alone (step.pgbench.sql, a copy
# of src/store/postgres/step_writes.rs's `INTENT_ONE` and `OUTCOME_ONE`
# with literals for the bound values, prepared as sqlx prepares them): how
# many steps a second, and how many steps share each WAL flush, at 1, 8
# and 64 clients. Each step needs one flush (its intent; the outcome is
# lazy). Then group commit: eight runs' intents in one statement and their
# outcomes in another, as the store sends a group (pgbench sends
# src/store/postgres/intents.sql and outcomes.sql themselves, the JSON
# records built in SQL where the store binds them), against the same eight
# steps each alone, at 1 and 8 clients (8 and 64 runs).
#
#   benches/postgres/probe.sh postgres://USER:PASSWORD@HOST/postgres
#
# Needs pgbench and psql (Debian's postgresql-15 package), python3 and the
# release binary (it applies the migrations). Creates the database
# saga_probe and drops it afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
admin="${1:?give an administrator URL of a PostgreSQL server}"
probe="${admin%/*}/saga_probe"
bin="${CARGO_TARGET_DIR:-target}/release/saga-harness"
pgbench="$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)"
psql "$admin" -qc "DROP DATABASE IF EXISTS saga_probe" -c "CREATE DATABASE saga_probe"
scripts="$(mktemp -d)"
trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS saga_probe"; rm -r "$scripts"' EXIT
"$bin" migrate --database-url "$probe" >/dev/null
psql "$probe" -qc "INSERT INTO runs (id, agent, status, created_at, updated_at)
  SELECT 'r' || g, 'a', 'RUNNING', now(), now() FROM generate_series(0, 511) g" \
  -c "INSERT INTO api_tokens (agent, token_hash, created_at) VALUES ('a', 'probe-token', now())"

# A pgbench script of one step for each run RUNS names (an SQL list), as
# the store's two group statements, their records built from the runs'
# rows. (':a' would be a pgbench variable, hence 'agent:' || 'a'.)
group_script() {
  python3 - "$1" <<'PY'
import sys
runs = sys.argv[1]
def statement(path):
    lines = open(path).read().splitlines()
    return "\n".join(l for l in lines if not l.startswith("--"))
intent = f"""(SELECT jsonb_agg(jsonb_build_object('run_id', id, 'step_idx', next_step,
  'tool', 'noop_looked_up', 'tool_class', 'compensatable',
  'idempotency_key', id || '/' || next_step || '/noop_looked_up/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
  'args', '{{"n": 1}}', 'status', 'INTENDED', 'compensation', '{{"tool": "noop_undo", "args": {{"of": "k"}}}}',
  'audience', 'internal', 'phase', 'before_pivot', 'at', now(), 'irreversible', 0,
  'actor', 'agent:' || 'a', 'detail', 'noop_looked_up', 'agent', 'a', 'token', 'probe-token', 'lease_owner', 'me',
  'lease_ms', 15000, 'handover', NULL)) FROM runs WHERE id IN ({runs}))"""
outcome = f"""(SELECT jsonb_agg(jsonb_build_object('run_id', id, 'step_idx', next_step - 1,
  'from_status', 'INTENDED', 'to_status', 'CONFIRMED', 'external_ref', 'x',
  'result', '{{"id": "x"}}', 'error', NULL, 'at', now(), 'actor', 'agent:' || 'a',
  'detail', 'x', 'release', 'me')) FROM runs WHERE id IN ({runs}))"""
print(statement("src/store/postgres/intents.sql").replace("$1::jsonb", intent + "::jsonb") + ";")
print(statement("src/store/postgres/outcomes.sql").replace("$1::jsonb", outcome + "::jsonb").replace("$2", "'off'") + ";")
PY
}
# The single-step statements for run (client × 8 + k), k = 0 … 7.
statements="$(grep -v '^--' benches/postgres/step.pgbench.sql)"
for k in 0 1 2 3 4 5 6 7; do sed "s/:client_id/(:client_id * 8 + $k)/g" <<<"$statements"; done >"$scripts/separate.sql"
group_script "SELECT 'r' || ((:client_id)::int8 * 8 + k) FROM generate_series(0, 7) k" >"$scripts/grouped.sql"

# WAL statistics reach pg_stat_wal when a backend has been idle a while.
flushes() { sleep 11; psql "$probe" -Atc "SELECT wal_sync FROM pg_stat_wal"; }
echo "clients  steps/s  steps per WAL flush"
for clients in 1 8 64; do
  before="$(flushes)"
  out="$("$pgbench" -n -M prepared -f benches/postgres/step.pgbench.sql -c "$clients" -j 2 -T 10 "$probe")"
  after="$(flushes)"
  steps="$(awk '/actually processed/ {print $NF}' <<<"$out")"
  tps="$(awk '/^tps/ {printf "%d", $3}' <<<"$out")"
  awk -v c="$clients" -v t="$tps" -v s="$steps" -v f="$((after - before))" \
    'BEGIN { printf "%7d  %7d  %.1f\n", c, t, s / (f > 0 ? f : 1) }'
done

echo "clients  runs  steps/s, each step's writes alone  steps/s, eight runs a statement"
for clients in 1 8; do
  rate() { "$pgbench" -n -M prepared -f "$scripts/$1.sql" -c "$clients" -j 2 -T 10 "$probe" | awk '/^tps/ {printf "%d", $3 * 8}'; }
  printf "%7d  %4d  %30s  %30s\n" "$clients" "$((clients * 8))" "$(rate separate)" "$(rate grouped)"
done
