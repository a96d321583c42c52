"""DBOS Transact as a peer for `saga-harness bench --peers`.

A workflow of BENCH_SEQUENTIAL_STEPS trivial steps, then 8 such workflows
at once (BENCH_CONCURRENT_STEPS steps each), on the PostgreSQL database in
DBOS_BENCH_DATABASE_URL. Protocol: one JSON line when ready, then one JSON
line of figures for each "round" line read on standard input; "quit" ends.
"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def say(value):
    print(json.dumps(value), flush=True)


try:
    from dbos import DBOS, DBOSConfig
except Exception as e:  # the install is missing or broken
    say({"error": f"cannot import dbos: {e}"})
    sys.exit(0)

SEQUENTIAL = int(os.environ.get("BENCH_SEQUENTIAL_STEPS", "1000"))
CONCURRENT = int(os.environ.get("BENCH_CONCURRENT_STEPS", "250"))
WORKFLOWS = 8

config: DBOSConfig = {
    "name": "saga-bench-peer",
    "system_database_url": os.environ["DBOS_BENCH_DATABASE_URL"],
    "log_level": "WARNING",
    "sys_db_pool_size": 20,
}
DBOS(config=config)


@DBOS.step()
def trivial(i: int) -> int:
    return i + 1


@DBOS.workflow()
def steps(n: int) -> list:
    latencies = []
    for i in range(n):
        at = time.perf_counter()
        trivial(i)
        latencies.append((time.perf_counter() - at) * 1e3)
    return latencies


def percentile(values, p):
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * p // 100)))
    return ordered[int(rank) - 1]


def one_round():
    started = time.perf_counter()
    latencies = steps(SEQUENTIAL)
    wall = time.perf_counter() - started
    with ThreadPoolExecutor(max_workers=WORKFLOWS) as pool:
        started = time.perf_counter()
        list(pool.map(lambda _: steps(CONCURRENT), range(WORKFLOWS)))
        concurrent_wall = time.perf_counter() - started
    return {
        "c1.p50_ms": percentile(latencies, 50),
        "c1.p99_ms": percentile(latencies, 99),
        "c1.mean_ms": wall * 1e3 / SEQUENTIAL,
        "c1.per_s": SEQUENTIAL / wall,
        "c8.per_s": WORKFLOWS * CONCURRENT / concurrent_wall,
    }


def main():
    try:
        DBOS.launch()
        steps(10)  # warm up: connections, tables
    except Exception as e:
        say({"error": f"DBOS did not start: {e}"})
        return
    say({"ready": "dbos"})
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        if command == "round":
            try:
                say(one_round())
            except Exception as e:
                say({"error": f"DBOS round failed: {e}"})
    DBOS.destroy()


if __name__ == "__main__":
    main()
