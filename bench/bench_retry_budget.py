"""Executions on the servers per completed statement when every replica is saturated.

12 threads run a CPU-heavy read (``SELECT sum(sipHash64(number)) FROM numbers(4000000)``) through
one pool over a 3-replica LocalCluster for ``--seconds`` each, in three configurations: the
defaults, ``use_hedged_requests=1``, and ``liveness_check_after_ms=0`` (no liveness checks: the
pool never sends anything on its own). Executions are counted by the servers (``QueryStart``
rows of ``system.query_log``, found by a marker in the SQL); a statement that failed is reported
as an error.

    python bench/bench_retry_budget.py [--seconds 30] [--threads 12] [--rounds 1]

Runs whichever clickhouse_lb is importable: ``PYTHONPATH=/path/to/other/checkout`` measures
another version with the same script.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from typing import Any

import clickhouse_lb
from clickhouse_lb.testing import LocalCluster

HEAVY = "SELECT sum(sipHash64(number)) FROM numbers(4000000) /* {marker} */"

CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "use_hedged_requests=1": {"use_hedged_requests": 1},
    "liveness_check_after_ms=0": {"liveness_check_after_ms": 0},
}


def executions(cluster: LocalCluster, marker: str) -> int:
    total = 0
    for i in range(len(cluster.hosts)):
        cluster.query(i, "SYSTEM FLUSH LOGS")
        total += int(cluster.query(
            i, f"SELECT count() FROM system.query_log WHERE type = 'QueryStart' AND query LIKE '%{marker}%' "
               "AND query NOT LIKE '%system.query_log%'",
        ).strip())
    return total


def run(cluster: LocalCluster, options: dict[str, Any], seconds: float, threads: int) -> tuple[int, int, int, int]:
    """(completed, errors, executions, hedges) of ``threads`` readers for ``seconds``."""
    marker = uuid.uuid4().hex
    sql = HEAVY.format(marker=marker)
    completed = errors = 0
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    with clickhouse_lb.get_pool(cluster.hosts, share_state=False, **options) as pool:

        def reader() -> None:
            nonlocal completed, errors
            while time.monotonic() < stop:
                try:
                    pool.query(sql)
                except Exception:
                    with lock:
                        errors += 1
                else:
                    with lock:
                        completed += 1

        workers = [threading.Thread(target=reader) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        hedges = getattr(pool, "hedged_requests", 0)
    time.sleep(1.0)  # let abandoned runs reach the log
    return completed, errors, executions(cluster, marker), hedges


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"clickhouse_lb from {os.path.dirname(clickhouse_lb.__file__)}; load {os.getloadavg()[0]:.1f}")
    print("| configuration | completed | errors | executions | per statement | hedges |")
    print("|---|---:|---:|---:|---:|---:|")
    with LocalCluster(replicas=3) as cluster:
        for _ in range(args.rounds):
            for name, options in CONFIGS.items():
                done, failed, runs, hedges = run(cluster, options, args.seconds, args.threads)
                per = runs / done if done else float("nan")
                print(f"| {name} | {done} | {failed} | {runs} | {per:.2f} | {hedges} |", flush=True)
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
