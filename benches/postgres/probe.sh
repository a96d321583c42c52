#!/usr/bin/env bash
# PostgreSQL alone, without the harness: how many steps a second the
# server gives the two statements of a step (src/store/postgres.rs,
# `try_claim_and_record` and `try_settle_step`, copied into
# step.pgbench.sql with literals for the bound values, prepared as sqlx
# prepares them), and how many steps share each WAL flush, at 1, 8 and 64
# clients. Each step needs one flush (its intent; the outcome is lazy).
# Then group commit: eight runs' intents in one transaction and their
# outcomes in another, against the same sixteen statements each committed
# on its own, at 1 and 8 clients (8 and 64 runs).
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
  SELECT 'r' || g, 'a', 'RUNNING', now(), now() FROM generate_series(0, 127) g"
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

# The step's two statements for run (client × 8 + k), k = 0 … 7.
statements="$(grep -v '^--' benches/postgres/step.pgbench.sql)"
for_run() { sed "s/:client_id/(:client_id * 8 + $1)/g" <<<"$statements"; }
scripts="$(mktemp -d)"
for k in 0 1 2 3 4 5 6 7; do for_run "$k"; done >"$scripts/separate.sql"
{
  echo "BEGIN;"; for k in 0 1 2 3 4 5 6 7; do for_run "$k" | sed -n 1p; done; echo "COMMIT;"
  echo "BEGIN;"; for k in 0 1 2 3 4 5 6 7; do for_run "$k" | sed -n 2p; done; echo "COMMIT;"
} >"$scripts/grouped.sql"
echo "clients  runs  steps/s, each commit alone  steps/s, eight runs a commit"
for clients in 1 8; do
  rate() { "$pgbench" -n -M prepared -f "$scripts/$1.sql" -c "$clients" -j 2 -T 10 "$probe" | awk '/^tps/ {printf "%d", $3 * 8}'; }
  printf "%7d  %4d  %26s  %29s\n" "$clients" "$((clients * 8))" "$(rate separate)" "$(rate grouped)"
done
rm -r "$scripts"
