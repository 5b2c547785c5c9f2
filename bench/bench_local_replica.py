"""SELECT 1 round trip through clickhouse-connect against one local replica, and replica memory.

    python bench/bench_local_replica.py [--n 2000] [--replicas 3]

Prints a markdown table (median and p95 latency of ``client.query("SELECT 1")`` and
``client.command("SELECT 1")``, RSS of each replica process) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

from clickhouse_lb.testing import LocalCluster


def _measure(fn: object, n: int) -> tuple[float, float]:
    assert callable(fn)
    for _ in range(50):  # warm-up
        fn()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    samples.sort()
    return statistics.median(samples) * 1000, samples[int(len(samples) * 0.95)] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    started = time.monotonic()
    with LocalCluster(replicas=args.replicas) as cluster:
        startup = time.monotonic() - started
        client = cluster.client(0)
        q_med, q_p95 = _measure(lambda: client.query("SELECT 1"), args.n)
        c_med, c_p95 = _measure(lambda: client.command("SELECT 1"), args.n)
        memory = cluster.replica_memory_mb()
    print(f"| measurement ({args.n} round trips, {args.replicas} replicas) | median | p95 |")
    print("|---|---|---|")
    print(f"| `client.query('SELECT 1')` | {q_med:.2f} ms | {q_p95:.2f} ms |")
    print(f"| `client.command('SELECT 1')` | {c_med:.2f} ms | {c_p95:.2f} ms |")
    print()
    print("| replica | RSS after the run |")
    print("|---|---|")
    for name, rss in zip(cluster.names, memory):
        print(f"| {name} | {rss:.0f} MiB |" if rss is not None else f"| {name} | n/a |")
    print(f"\ncluster startup ({args.replicas} replicas, in parallel): {startup:.1f} s")


if __name__ == "__main__":
    main()
