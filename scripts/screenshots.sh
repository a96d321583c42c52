#!/usr/bin/env bash
# Remakes the README's screenshots of the lead's pages (the pivot, an
# unwound run, the corrections inbox, at 1366×768 and 390×844) from the
# demo: builds the release app as ./scripts/run.sh does, then runs the
# browser tests that read those pages with SAGA_SCREENSHOTS_DIR pointing
# at docs/screenshots.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

setup_build_tools
setup_browser

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
env -u RUSTFLAGS cargo leptos build --release --bin-features ssr,simulators
mkdir -p docs/screenshots
(
  cd end2end
  SAGA_SCREENSHOTS_DIR="$PWD/../docs/screenshots" \
    SAGA_BIN="$target_dir/release/saga-harness" LEPTOS_SITE_ROOT="$PWD/../target/site" \
    npx playwright test tests/at-a-glance.spec.ts
)
say "screenshots written to docs/screenshots"
