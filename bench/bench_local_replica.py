"""SELECT 1 round trip through clickhouse-connect against one local replica, replica memory, and
how long the replica's ``/ping`` goes unanswered while it works.

    python bench/bench_local_replica.py [--n 2000] [--replicas 3] [--ping-seconds 10] [--ping-threads 3]

Prints markdown tables for BENCHMARKS.md: median and p95 latency of ``client.query("SELECT 1")``
and ``client.command("SELECT 1")``, RSS of each replica process, and the longest wait for a
``/ping`` answer (watched from another process) while ``--ping-threads`` threads run
clickhouse-connect's ``test_temporary_tables`` against the replica for ``--ping-seconds``
(0: skip), with the rounds they completed. A real server answers ``/ping`` within milliseconds
meanwhile; the pool takes seconds without an answer for a hung replica.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

from clickhouse_lb.testing import LocalCluster
from clickhouse_lb.testing._pingwatch import PingWatch, ping_watch, temporary_table_round


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


def _ping_under_load(cluster: LocalCluster, seconds: float, threads: int) -> tuple[PingWatch, int]:
    """The longest /ping wait while ``threads`` clients run the temporary-table pattern."""
    host, port = cluster.hosts[0].rsplit(":", 1)
    clients: list[Any] = [cluster.client(0) for _ in range(threads)]
    rounds = [0] * threads

    def run(i: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            temporary_table_round(clients[i])
            rounds[i] += 1

    with ping_watch(host, int(port)) as watch:
        deadline = time.monotonic() + seconds
        workers = [threading.Thread(target=run, args=(i, deadline)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return watch, sum(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--ping-seconds", type=float, default=10.0)
    parser.add_argument("--ping-threads", type=int, default=3)
    args = parser.parse_args()
    started = time.monotonic()
    with LocalCluster(replicas=args.replicas) as cluster:
        startup = time.monotonic() - started
        client = cluster.client(0)
        q_med, q_p95 = _measure(lambda: client.query("SELECT 1"), args.n)
        c_med, c_p95 = _measure(lambda: client.command("SELECT 1"), args.n)
        memory = cluster.replica_memory_mb()
        ping = _ping_under_load(cluster, args.ping_seconds, args.ping_threads) if args.ping_seconds > 0 else None
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
    if ping is not None:
        watch, rounds = ping
        print()
        what = f"{args.ping_threads} threads run test_temporary_tables ({args.ping_seconds:g} s)"
        print(f"| /ping while {what} | value |")
        print("|---|---|")
        print(f"| longest wait for an answer | {watch.longest * 1000:.0f} ms |")
        print(f"| pings answered | {watch.pings} |")
        print(f"| rounds completed | {rounds} |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
