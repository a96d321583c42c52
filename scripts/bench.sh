#!/usr/bin/env bash
# The full benchmark: builds the release binary, installs the peers (DBOS
# Transact in a Python venv, Restate from npm) under the user's cache,
# starts the machine's PostgreSQL and measures both backends and the peers
# in interleaved rounds. Writes benches/results/bench.json (committed: the
# benches/README.md's benchmark tables are generated from it) and prints the table.
#
#   ./scripts/bench.sh                 # everything
#   ./scripts/bench.sh --rounds 7      # extra arguments go to `saga-harness bench`
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

setup_postgres
setup_build_tools
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
# The binary ./scripts/run.sh serves, built the same way.
env -u RUSTFLAGS cargo leptos build --release --bin-features ssr,bench

peers_home="${SAGA_BENCH_PEERS_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/saga-harness/peers}"
mkdir -p "$peers_home"
# Peers that cannot be installed are reported by the benchmark, not fatal.
# Their versions are pinned, so runs compare like with like.
dbos_version="3.4.0"
restate_server_version="1.7.12"
restate_sdk_version="1.17.2"
if ! "$peers_home/dbos-venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('dbos') != '$dbos_version')" 2>/dev/null; then
  say "installing DBOS Transact $dbos_version into $peers_home/dbos-venv"
  python3.11 -m venv "$peers_home/dbos-venv" && "$peers_home/dbos-venv/bin/pip" install -q "dbos==$dbos_version" \
    || echo "DBOS could not be installed; the benchmark will say so" >&2
fi
installed_restate="$(cd "$peers_home/restate" 2>/dev/null && node -p 'require("@restatedev/restate-server/package.json").version + " " + require("@restatedev/restate-sdk/package.json").version' 2>/dev/null || true)"
if [ "$installed_restate" != "$restate_server_version $restate_sdk_version" ]; then
  say "installing the Restate server $restate_server_version and SDK $restate_sdk_version into $peers_home/restate"
  mkdir -p "$peers_home/restate"
  (cd "$peers_home/restate" && { [ -f package.json ] || npm init -y >/dev/null; } \
    && npm install --no-audit --no-fund "@restatedev/restate-server@$restate_server_version" "@restatedev/restate-sdk@$restate_sdk_version") \
    || echo "Restate could not be installed; the benchmark will say so" >&2
fi

postgres_url="${SAGA_BENCH_POSTGRES_URL:-${SAGA_TEST_POSTGRES_URL:-postgres://saga_test:saga_test@127.0.0.1:5432/postgres}}"
"$target_dir/release/saga-harness" bench --backend both --peers \
  --postgres-url "$postgres_url" --peers-home "$peers_home" \
  --json benches/results/bench.json "$@"
