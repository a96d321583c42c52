#!/usr/bin/env bash
# The full benchmark: builds the release binary, installs the peers (DBOS
# Transact in a Python venv, Restate from npm) under the user's cache,
# starts the machine's PostgreSQL and measures both backends and the peers
# in interleaved rounds. Writes bench-results.json and prints the table.
#
#   ./scripts/bench.sh                 # everything
#   ./scripts/bench.sh --rounds 7      # extra arguments go to `saga-harness bench`
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

setup_postgres
export RUSTFLAGS="--cfg erase_components"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --features ssr --bin saga-harness

peers_home="${SAGA_BENCH_PEERS_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/saga-harness/peers}"
mkdir -p "$peers_home"
# Peers that cannot be installed are reported by the benchmark, not fatal.
if [ ! -x "$peers_home/dbos-venv/bin/python" ] || ! "$peers_home/dbos-venv/bin/python" -c "import dbos" 2>/dev/null; then
  say "installing DBOS Transact into $peers_home/dbos-venv"
  python3.11 -m venv "$peers_home/dbos-venv" && "$peers_home/dbos-venv/bin/pip" install -q dbos \
    || echo "DBOS could not be installed; the benchmark will say so" >&2
fi
if [ ! -d "$peers_home/restate/node_modules/@restatedev/restate-sdk" ]; then
  say "installing the Restate server and SDK into $peers_home/restate"
  mkdir -p "$peers_home/restate"
  (cd "$peers_home/restate" && { [ -f package.json ] || npm init -y >/dev/null; } \
    && npm install --no-audit --no-fund @restatedev/restate-server @restatedev/restate-sdk) \
    || echo "Restate could not be installed; the benchmark will say so" >&2
fi

postgres_url="${SAGA_BENCH_POSTGRES_URL:-${SAGA_TEST_POSTGRES_URL:-postgres://saga_test:saga_test@127.0.0.1:5432/postgres}}"
"$target_dir/release/saga-harness" bench --backend both --peers \
  --postgres-url "$postgres_url" --peers-home "$peers_home" \
  --json bench-results.json "$@"
