# Installs whatever the build and the tests need and is missing; skips what
# is already there. Sourced by scripts/run.sh and scripts/test.sh.
# Everything comes from the package registries (crates.io, npm, Debian).

CARGO_LEPTOS_VERSION=0.3.10
WASM_BINDGEN_VERSION=0.2.130   # must equal the `wasm-bindgen` pin in Cargo.toml

say() { printf '\n==> %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@"
}

setup_build_tools() {
  export PATH="$HOME/.cargo/bin:$PATH"
  if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    say "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown
  fi
  if ! cargo leptos --version 2>/dev/null | grep -q "$CARGO_LEPTOS_VERSION"; then
    say "installing cargo-leptos $CARGO_LEPTOS_VERSION (a one-time build of about 20 minutes on 2 cores)"
    cargo install cargo-leptos --version "$CARGO_LEPTOS_VERSION" --locked
  fi
  if ! wasm-bindgen --version 2>/dev/null | grep -q "$WASM_BINDGEN_VERSION"; then
    say "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION"
    # Not --locked: its lock file names a crate version the registry no longer has.
    cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
  fi
  if ! command -v npm >/dev/null; then
    say "installing Node.js and npm"
    apt_install nodejs npm
  fi
  if [ ! -x end2end/node_modules/.bin/wasm-opt ] || [ ! -d end2end/node_modules/@playwright/test ] \
     || [ end2end/package-lock.json -nt end2end/node_modules/.package-lock.json ]; then
    say "installing npm packages (wasm-opt from binaryen, Playwright)"
    (cd end2end && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund)
  fi
  # cargo-leptos finds wasm-bindgen and wasm-opt on PATH instead of downloading them.
  export PATH="$PWD/end2end/node_modules/.bin:$PATH"
}

setup_browser() {
  if [ ! -x /usr/bin/chromium ]; then
    say "installing Chromium (Debian)"
    apt_install chromium
  fi
  export CHROMIUM_PATH=/usr/bin/chromium
}

# Starts the machine's PostgreSQL and makes sure the test role exists.
# Sets SAGA_TEST_POSTGRES_URL for the Rust tests.
setup_postgres() {
  if ! command -v pg_ctlcluster >/dev/null; then
    say "installing PostgreSQL (Debian)"
    apt_install postgresql
  fi
  # A transaction-pooling PgBouncer stands in front of PostgreSQL in the
  # race and crash suites, as it does where PostgreSQL is run at scale.
  if [ ! -x /usr/sbin/pgbouncer ]; then
    say "installing PgBouncer (Debian)"
    apt_install pgbouncer
  fi
  local version
  version="$(ls /etc/postgresql | sort -n | tail -n 1)"
  if [ -z "$version" ]; then
    echo "PostgreSQL is installed but has no cluster under /etc/postgresql" >&2
    return 1
  fi
  if ! pg_ctlcluster "$version" main status >/dev/null 2>&1; then
    say "starting PostgreSQL $version"
    as_root pg_ctlcluster "$version" main start
  fi
  local tries=0
  until as_root su postgres -c "psql -qtAc 'SELECT 1'" >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -gt 30 ]; then
      echo "PostgreSQL did not accept connections within 30 s" >&2
      return 1
    fi
    sleep 1
  done
  as_root su postgres -c "psql -qtAc \"DO \\\$\\\$ BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'saga_test') THEN
        CREATE ROLE saga_test LOGIN SUPERUSER PASSWORD 'saga_test';
      END IF;
    END \\\$\\\$;\"" >/dev/null
  # Databases left behind by an interrupted earlier run.
  as_root su postgres -c "psql -qtAc \"SELECT 'DROP DATABASE ' || datname || ' WITH (FORCE);' FROM pg_database WHERE datname LIKE 'saga\\_test\\_%'\"" \
    | as_root su postgres -c "psql -q" >/dev/null 2>&1 || true
  export SAGA_TEST_POSTGRES_URL="postgres://saga_test:saga_test@127.0.0.1:5432/postgres"
}

# promtool (Debian's prometheus package) checks the /metrics output.
setup_promtool() {
  if ! command -v promtool >/dev/null; then
    say "installing promtool (Debian's prometheus package)"
    apt_install prometheus
  fi
}

# Python tools the tests drive: a real SMTP server (aiosmtpd) for the email
# connector, an OpenAPI 3 validator for the API document, the OpenAI Agents
# SDK for the example agent `eval` runs over MCP, and the MCP SDK the
# upstream ticket desk of the tests is written with.
setup_python_tools() {
  if ! python3 -c "import aiosmtpd, openapi_spec_validator, agents, mcp.server.mcpserver" >/dev/null 2>&1; then
    say "installing aiosmtpd, openapi-spec-validator, the OpenAI Agents SDK and the MCP SDK (PyPI)"
    python3 -m pip install --quiet --disable-pip-version-check \
      "aiosmtpd==1.4.6" "openapi-spec-validator==0.9.0" "openai-agents==0.25.0" "mcp==2.3.0"
  fi
}
