"""The local cluster's replication: insert cost, time until another replica sees a row, ON CLUSTER.

    python bench/bench_replication.py [--n 200]

Prints a markdown table for BENCHMARKS.md: median and p95 of a 100-row insert through
clickhouse-connect into a plain MergeTree and into a ReplicatedMergeTree table (the latter logs
and fsyncs before answering), of the time from an insert's answer on r1 until r2 returns the
row (replication lag with no delay injected; polled every query), and of CREATE ... ON CLUSTER.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from clickhouse_lb.testing import LocalCluster


def _stats(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples) * 1000, samples[int(len(samples) * 0.95)] * 1000


def _timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    rows = [[i, i] for i in range(100)]
    with LocalCluster(replicas=3) as cluster:
        c0, c1 = cluster.client(0), cluster.client(1)
        create_times = []
        for k in range(10):
            started = time.perf_counter()
            c0.command(f"CREATE TABLE oc_{k} ON CLUSTER lb_cluster (a UInt32) ENGINE = ReplicatedMergeTree ORDER BY a")
            create_times.append(time.perf_counter() - started)
        c0.command("CREATE TABLE plain (a UInt32, b UInt32) ENGINE = MergeTree ORDER BY a")
        c0.command(
            "CREATE TABLE rep ON CLUSTER lb_cluster (a UInt32, b UInt32) ENGINE = ReplicatedMergeTree ORDER BY a"
        )
        for _ in range(20):  # warm-up
            c0.insert("plain", rows, column_names=["a", "b"], settings={"insert_deduplicate": 0})
        plain = _timed(lambda: c0.insert("plain", rows, column_names=["a", "b"]), args.n)
        replicated = _timed(
            lambda: c0.insert("rep", rows, column_names=["a", "b"], settings={"insert_deduplicate": 0}), args.n
        )
        c0.command("CREATE TABLE lag ON CLUSTER lb_cluster (a UInt32) ENGINE = ReplicatedMergeTree ORDER BY a")
        lags = []
        for i in range(args.n):
            c0.command(f"INSERT INTO lag VALUES ({i})")
            started = time.perf_counter()
            while c1.command(f"SELECT count() FROM lag WHERE a = {i}") != 1:
                pass
            lags.append(time.perf_counter() - started)
    print(f"| measurement ({args.n} runs, 3 replicas) | median | p95 |")
    print("|---|---|---|")
    for label, samples in (
        ("insert 100 rows, MergeTree", plain),
        ("insert 100 rows, ReplicatedMergeTree (logged, fsynced)", replicated),
        ("insert answered on r1 until r2 returns the row", lags),
        ("CREATE TABLE ... ON CLUSTER (10 runs)", create_times),
    ):
        med, p95 = _stats(samples)
        print(f"| {label} | {med:.2f} ms | {p95:.2f} ms |")


if __name__ == "__main__":
    main()
