#!/usr/bin/env bash
# Starts `saga-harness demo` for the dashboard's browser tests: simulators
# on 127.0.0.1:4301-4308, a fresh SQLite file, logins admin / lead / viewer
# and an agent token the tests know; people also sign in through the OpenID
# provider playwright.config.ts starts on 127.0.0.1:3919.
set -euo pipefail
port="$1"
bin="${SAGA_BIN:-../target/debug/saga-harness}"
dir="$(mktemp -d "${TMPDIR:-/tmp}/saga-e2e-demo.XXXXXX")"
export SAGA_DEMO_PASSWORD='correct horse battery'
export SAGA_DEMO_TOKEN='sh_e2e_demo_agent_token'
export SAGA_OIDC_ISSUER='http://127.0.0.1:3919'
export SAGA_OIDC_CLIENT_ID='saga-harness-e2e'
export SAGA_OIDC_CLIENT_SECRET='a-client-secret-only-the-browser-tests-use'
export SAGA_OIDC_NAME='Example SSO'
export SAGA_OIDC_ROLES='admin=platform,approver=support-leads,viewer=support'
exec "$bin" demo --bind "127.0.0.1:$port" --database "$dir/demo.db" --first-port 4301
