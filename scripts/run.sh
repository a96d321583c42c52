#!/usr/bin/env bash
# Builds the app (release) and runs the demo: the simulated Stripe, Jira,
# Zendesk, Slack, SMTP, back office and warehouse on 127.0.0.1:4101-4108,
# the dashboard and agent API on http://127.0.0.1:3000 over a fresh
# ./saga-demo.db, and a scripted agent that leaves four runs to look at.
# It prints the logins (admin, lead, viewer) and an agent token.
#
#   ./scripts/run.sh                 the demo (extra arguments go to `saga-harness demo`)
#   ./scripts/run.sh serve [ARGS]    a plain server instead (`saga-harness serve`;
#                                    DATABASE_URL and SAGA_TOOLS are honoured)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

setup_build_tools
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"

# The demo needs the simulated systems in the binary; a plain server is
# built without them, as a team deploys it.
if [ "${1:-}" = "serve" ]; then
  say "building the app (release)"
  cargo leptos build --release
else
  say "building the app with its simulators (release)"
  cargo leptos build --release --bin-features ssr,simulators
fi
bin="$target_dir/release/saga-harness"
export LEPTOS_SITE_ROOT="$PWD/target/site"

if [ "${1:-}" = "serve" ]; then
  shift
  # On first start, an admin to sign in with.
  password="${SAGA_ADMIN_PASSWORD:-$(head -c 18 /dev/urandom | base64 | tr -d '/+=')}"
  if output="$(printf '%s\n' "$password" | "$bin" user add --username admin --role admin --password-stdin 2>&1)"; then
    say "created the dashboard user admin with password: $password (add more with: $bin user add)"
  elif grep -q "already exists" <<<"$output"; then
    say "the dashboard user admin already exists; sign in with the password printed when it was created"
  else
    echo "$output" >&2
    exit 1
  fi
  say "serving; stop with Ctrl-C"
  exec "$bin" serve "$@"
fi

say "starting the demo; stop with Ctrl-C"
exec "$bin" demo "$@"
