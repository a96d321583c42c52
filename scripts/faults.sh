#!/usr/bin/env bash
# Runs the tests of faults outside the process (tests/process_level/operations.rs,
# tests/process_level/two_processes.rs) and keeps what each measured in
# benches/results/faults.json (committed: docs/operations.md's table of faults is
# generated from it), then rewrites that table.
#
#   ./scripts/faults.sh                                        # CI's sizes
#   SAGA_FAULT_AGENTS=50 SAGA_FAULT_CUT_SECS=30 ./scripts/faults.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

setup_postgres
export RUSTFLAGS="--cfg erase_components"
export SAGA_TEST_POSTGRES_URL="${SAGA_TEST_POSTGRES_URL:-postgres://saga_test:saga_test@127.0.0.1:5432/postgres}"
lines="$(mktemp)"
trap 'rm -f "$lines"' EXIT
SAGA_FAULT_REPORT="$lines" cargo test --features bench --test process_level -- operations:: two_processes::
python3 - "$lines" benches/results/faults.json <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
rows.sort(key=lambda row: row["fault"].lower())
with open(sys.argv[2], "w") as out:
    json.dump(rows, out, indent=2, ensure_ascii=False)
    out.write("\n")
print(f"faults: {len(rows)} rows written to {sys.argv[2]}")
PY
SAGA_UPDATE_README=1 cargo test --features bench --test process_level -- bench::the_readme_faults_table
