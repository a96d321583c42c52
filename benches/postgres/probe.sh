#!/usr/bin/env bash
# PostgreSQL alone, without the harness: how many steps a second the
# server gives the two statements of a step (src/store/postgres.rs,
# `try_claim_and_record` and `try_settle_step`, copied into
# step.pgbench.sql with literals for the bound values, prepared as sqlx
# prepares them), and how many steps share each WAL flush, at 1, 8 and 64
# clients. Each step needs one flush (its intent; the outcome is lazy).
#
#   benches/postgres/probe.sh postgres://USER:PASSWORD@HOST/postgres
#
# Needs pgbench and psql (Debian's postgresql-15 package) and the release
# binary (it applies the migrations). Creates the database saga_probe and
# drops it afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
admin="${1:?give an administrator URL of a PostgreSQL server}"
probe="${admin%/*}/saga_probe"
bin="${CARGO_TARGET_DIR:-target}/release/saga-harness"
pgbench="$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)"
psql "$admin" -qc "DROP DATABASE IF EXISTS saga_probe" -c "CREATE DATABASE saga_probe"
trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS saga_probe"' EXIT
"$bin" migrate --database-url "$probe" >/dev/null
psql "$probe" -qc "INSERT INTO runs (id, agent, status, created_at, updated_at)
  SELECT 'r' || g, 'a', 'RUNNING', now(), now() FROM generate_series(0, 63) g"
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
