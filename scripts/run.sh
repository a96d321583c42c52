#!/usr/bin/env bash
# Builds the app (release) and serves it on the embedded SQLite default,
# installing what is missing first. Extra arguments go to `saga-harness
# serve` (e.g. --bind 0.0.0.0:8080); DATABASE_URL and SAGA_TOOLS are honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

setup_build_tools
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"

say "building the app (release)"
cargo leptos build --release
bin="$target_dir/release/saga-harness"
export LEPTOS_SITE_ROOT="$PWD/target/site"

# On first start, an admin to sign in with.
password="${SAGA_ADMIN_PASSWORD:-$(head -c 18 /dev/urandom | base64 | tr -d '/+=')}"
if output="$(printf '%s\n' "$password" | "$bin" user add --username admin --role admin --password-stdin 2>&1)"; then
  say "created the dashboard user admin with password: $password (change it by adding users with: $bin user add)"
elif grep -q "already exists" <<<"$output"; then
  say "the dashboard user admin already exists; sign in with the password printed when it was created"
else
  echo "$output" >&2
  exit 1
fi

say "serving; stop with Ctrl-C"
exec "$bin" serve "$@"
