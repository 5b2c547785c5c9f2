"""Read-your-writes: how often a write-then-read pair misses its own write without it, and what it
costs with it on.

A local cluster of 3 replicas, each applying the others' writes ``--lag`` seconds late
(``delay_replication``: asynchronous replication under load). One pair is an insert of one row
into a ReplicatedMergeTree table and a balanced read of that row (``round_robin`` and ``random``).
Pools with ``read_your_writes`` off and on are measured side by side in alternating rounds, so
machine noise hits both alike. Reported per mode: pairs that did not see their row, and the median
and p95 latency of a pair (insert + read).

    python bench/bench_read_your_writes.py [--pairs 200] [--rounds 4] [--lag 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import clickhouse_lb
from clickhouse_lb.core.read_your_writes import forget_writes
from clickhouse_lb.testing import LocalCluster


def run_pairs(pool: clickhouse_lb.ReplicaPool, table: str, start: int, n: int) -> tuple[int, list[float]]:
    missed, latencies = 0, []
    for k in range(start, start + n):
        began = time.perf_counter()
        pool.insert(table, [[k]], column_names=["k"])
        seen = pool.query(f"SELECT count() FROM {table} WHERE k = {k}").result_rows[0][0]
        latencies.append(time.perf_counter() - began)
        missed += seen != 1
    return missed, latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=200, help="pairs per mode and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--lag", type=float, default=30.0, help="replication delay of every replica (s)")
    args = parser.parse_args()
    with LocalCluster(replicas=3) as cluster:
        table = f"ryw_{uuid.uuid4().hex[:8]}"
        cluster.query(
            0, f"CREATE TABLE {table} ON CLUSTER lb_cluster (k UInt32) ENGINE = ReplicatedMergeTree ORDER BY k"
        )
        for i in range(len(cluster)):
            cluster.delay_replication(i, args.lag)
        print("| strategy | read_your_writes | pairs | missed their write | pair median (ms) | pair p95 (ms) |")
        print("|---|---|---:|---:|---:|---:|")
        key = 0
        for strategy in ("round_robin", "random"):
            results: dict[bool, tuple[int, list[float]]] = {False: (0, []), True: (0, [])}
            pools = {
                on: clickhouse_lb.get_pool(
                    hosts=cluster.hosts, load_balancing=strategy, read_your_writes=on, health_check_interval_ms=0,
                    share_state=False,
                )
                for on in (False, True)
            }
            for round_ in range(args.rounds):
                for on in ((False, True) if round_ % 2 == 0 else (True, False)):
                    forget_writes()
                    missed, latencies = run_pairs(pools[on], table, key, args.pairs)
                    key += args.pairs
                    total_missed, all_latencies = results[on]
                    results[on] = (total_missed + missed, all_latencies + latencies)
            for on in (False, True):
                missed, latencies = results[on]
                latencies.sort()
                p95 = latencies[int(len(latencies) * 0.95) - 1]
                print(f"| {strategy} | {'on' if on else 'off'} | {len(latencies)} | {missed} "
                      f"({100 * missed / len(latencies):.0f}%) | {statistics.median(latencies) * 1e3:.2f} | "
                      f"{p95 * 1e3:.2f} |")
            for pool in pools.values():
                pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
