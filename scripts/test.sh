#!/usr/bin/env bash
# Runs every test, installing what is missing first: formatting, clippy, the
# single-sqlx check, the wasm half, the Rust tests on SQLite and PostgreSQL,
# then the dashboard in Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

setup_build_tools
setup_browser
setup_postgres
setup_python_tools
setup_promtool

# The same flags cargo-leptos uses for dev builds, so the tests, clippy and
# the app share one set of compiled dependencies.
export RUSTFLAGS="--cfg erase_components"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
started=$SECONDS
phase() { say "$1 ($((SECONDS - started)) s so far)"; }

phase "formatting"
cargo fmt --all --check

phase "clippy"
cargo clippy --workspace --all-targets --features saga-harness/bench,saga-core/engine -- -D warnings
# The deployed build: no simulators, no benchmark.
cargo clippy --features ssr -- -D warnings

phase "one sqlx in the dependency tree"
# Two versions of any sqlx crate would mean two drivers and two pools.
versions="$(cargo tree --features ssr -e normal,build --prefix none --format '{p}' \
  | awk '/^sqlx/ {print $1, $2}' | sort -u)"
duplicates="$(awk '{print $1}' <<<"$versions" | uniq -d)"
if [ -z "$versions" ] || [ -n "$duplicates" ]; then
  echo "expected exactly one version of each sqlx crate, found:" >&2
  echo "$versions" >&2
  exit 1
fi
echo "$versions"

phase "the wasm half"
cargo check --lib --target wasm32-unknown-unknown --no-default-features --features hydrate

phase "Rust tests on SQLite and PostgreSQL"
cargo test --workspace --features saga-harness/bench,saga-core/engine

# Exactly what ./scripts/run.sh builds: the release app through cargo-leptos,
# with no extra flags (release builds do not erase view types), so a build
# only the README's first command would hit cannot pass CI unnoticed.
phase "building the app as ./scripts/run.sh does (release)"
env -u RUSTFLAGS cargo leptos build --release --bin-features ssr,simulators

phase "browser tests against the release app"
(
  cd end2end
  SAGA_BIN="$target_dir/release/saga-harness" LEPTOS_SITE_ROOT="$PWD/../target/site" npx playwright test
)

phase "all tests passed"
