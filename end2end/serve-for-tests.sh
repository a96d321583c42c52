#!/usr/bin/env bash
# Starts the harness for the browser tests: a fresh SQLite file and one
# approver, "dana", whose password the tests know.
set -euo pipefail
port="$1"
bin="${SAGA_BIN:-../target/debug/saga-harness}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/saga-e2e.XXXXXX")"
export DATABASE_URL="sqlite://$dir/e2e.db"
printf 'correct horse battery\n' | "$bin" user add --username dana --role approver --password-stdin
exec "$bin" serve --bind "127.0.0.1:$port"
