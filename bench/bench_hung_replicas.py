"""Hung and slow replicas: the blackout a hung replica causes, and what hedged reads cost.

    python bench/bench_hung_replicas.py [--pause 10] [--threads 4] [--reads 250]

1. Hang blackout: a 3-replica LocalCluster, ``--threads`` threads of reads
   (``SELECT getMacro('replica')``), one replica paused (SIGSTOP) for ``--pause`` seconds.
   Per setting: failed statements, the worst per-thread gap between two finished statements
   (the blackout a user sees), the errors counted against the paused replica.
2. Hedging: ``--reads`` reads per thread on a healthy cluster, then with one replica slowed
   (an injected 0.5 s delay on every query): extra requests per 100 statements
   (``pool.hedged_requests``), median and p99 latency, hedging off / "auto" / fixed.
3. Deadline: ``failover_timeout=1`` with every replica paused, and with every replica refusing
   under an 8 s backoff: how long the statement took, sync and async.

Prints markdown tables for BENCHMARKS.md, with the machine's load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import clickhouse_lb
from clickhouse_lb.testing import LocalCluster

WHO = "SELECT getMacro('replica')"


def blackout(cluster: LocalCluster, pause: float, threads: int, **settings: Any) -> tuple[int, float, int, int]:
    with clickhouse_lb.get_pool(cluster.hosts, share_state=False, **settings) as pool:
        for _ in range(30):
            pool.command(WHO)
        stop = threading.Event()
        ready = threading.Barrier(threads + 1)
        worst = [0.0] * threads
        failed = [0] * threads
        done = [0] * threads

        def reader(n: int) -> None:
            ready.wait()
            last = time.monotonic()
            while not stop.is_set():
                try:
                    pool.command(WHO)
                    done[n] += 1
                except Exception:
                    failed[n] += 1
                now = time.monotonic()
                worst[n] = max(worst[n], now - last)
                last = now

        with ThreadPoolExecutor(threads) as executor:
            futures = [executor.submit(reader, n) for n in range(threads)]
            ready.wait()
            time.sleep(0.5)
            cluster.pause(1)
            time.sleep(pause)
            cluster.resume(1)
            time.sleep(0.5)
            stop.set()
            for future in futures:
                future.result()
        return sum(failed), max(worst), pool.replicas[1].errors_count, sum(done)


def hedging(cluster: LocalCluster, threads: int, reads: int, **settings: Any) -> tuple[float, float, float]:
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="round_robin", share_state=False, **settings) as pool:
        for address in cluster.hosts:
            pool.client(address).command("SELECT 1")
        for _ in range(40):  # warm-up (and the adaptive delay's first samples)
            pool.command(WHO)
        start_hedges = pool.hedged_requests
        latencies: list[float] = []
        lock = threading.Lock()

        def reader(n: int) -> None:
            mine = []
            for _ in range(reads):
                started = time.perf_counter()
                pool.command(WHO)
                mine.append(time.perf_counter() - started)
            with lock:
                latencies.extend(mine)

        with ThreadPoolExecutor(threads) as executor:
            list(executor.map(reader, range(threads)))
        latencies.sort()
        extra = (pool.hedged_requests - start_hedges) * 100 / len(latencies)
        return extra, statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def run_blackout(cluster: LocalCluster, args: argparse.Namespace) -> None:
    print(f"### Hang blackout: {args.threads} threads of reads, one replica of 3 paused {args.pause:g} s\n")
    print("| settings | failed statements | worst per-thread gap | errors counted | statements |")
    print("|---|---|---|---|---|")
    for label, settings in (
        ("defaults", {}),
        ("tuned: `liveness_check_after_ms=100, liveness_ping_timeout_ms=100`",
         {"liveness_check_after_ms": 100, "liveness_ping_timeout_ms": 100}),
        ("liveness off, default timeouts (before this change)", {"liveness_check_after_ms": 0}),
    ):
        cluster.heal()
        failed, worst, errors, done = blackout(cluster, args.pause, args.threads, **settings)
        print(f"| {label} | {failed} | {worst:.2f} s | {errors} | {done} |")


def run_hedging(cluster: LocalCluster, args: argparse.Namespace) -> None:
    print(f"\n### Hedged reads: {args.threads} threads x {args.reads} reads, round_robin\n")
    print("| cluster | hedging | extra requests per 100 statements | median | p99 |")
    print("|---|---|---|---|---|")
    for condition, delay in (("healthy", 0.0), ("one replica +0.5 s", 0.5)):
        cluster.heal()
        cluster.set_delay(0, delay)
        for label, settings in (
            ("off (default)", {}),
            ('`receive_data_timeout_ms="auto"`', {"use_hedged_requests": 1}),
            ("`receive_data_timeout_ms=50`", {"use_hedged_requests": 1, "receive_data_timeout_ms": 50}),
        ):
            extra, median, p99 = hedging(cluster, args.threads, args.reads, **settings)
            print(f"| {condition} | {label} | {extra:.1f} | {median:.1f} ms | {p99:.1f} ms |")
    cluster.heal()


def _stopped(pid: int | None) -> bool:
    """Every thread of the process stopped (SIGSTOP takes effect asynchronously)."""
    if pid is None:
        return True
    tasks = Path(f"/proc/{pid}/task")
    states = [(task / "stat").read_text().rpartition(")")[2].split()[0] for task in tasks.iterdir()]
    return all(state in ("T", "t") for state in states)


def _fault_all(cluster: LocalCluster, fault: str) -> None:
    for i in range(len(cluster.hosts)):
        (cluster.pause if fault == "pause" else cluster.kill)(i)
    if fault == "pause":
        while not all(_stopped(pid) for pid in cluster.pids):
            time.sleep(0.002)


def deadline_sync(cluster: LocalCluster, fault: str, settings: dict[str, Any]) -> float:
    with clickhouse_lb.get_pool(cluster.hosts, share_state=False, **settings) as pool:
        pool.command(WHO)
        _fault_all(cluster, fault)
        started = time.monotonic()
        with contextlib.suppress(clickhouse_lb.AllReplicasUnavailableError):
            pool.command(WHO)
        return time.monotonic() - started


async def deadline_async(cluster: LocalCluster, fault: str, settings: dict[str, Any]) -> float:
    async with clickhouse_lb.get_async_pool(cluster.hosts, share_state=False, **settings) as pool:
        await pool.command(WHO)
        _fault_all(cluster, fault)
        started = time.monotonic()
        with contextlib.suppress(clickhouse_lb.AllReplicasUnavailableError):
            await pool.command(WHO)
        return time.monotonic() - started


def run_deadline(cluster: LocalCluster, args: argparse.Namespace) -> None:
    import asyncio

    print("\n### Statement deadline: `failover_timeout=1`\n")
    print("| case | pool | statement took (3 runs) |")
    print("|---|---|---|")
    cases = (
        ("all replicas paused", "pause", {"failover_timeout": 1.0}),
        ("all replicas refusing, `failover_backoff_ms=8000`", "kill",
         {"failover_timeout": 1.0, "failover_backoff_ms": 8000, "connections_with_failover_max_tries": 5}),
    )
    for label, fault, settings in cases:
        for flavour in ("sync", "async"):
            took = []
            for _ in range(3):
                cluster.heal()
                if flavour == "sync":
                    took.append(deadline_sync(cluster, fault, settings))
                else:
                    took.append(asyncio.run(deadline_async(cluster, fault, settings)))
            print(f"| {label} | {flavour} | {' / '.join(f'{t:.3f} s' for t in took)} |")
    cluster.heal()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pause", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--reads", type=int, default=250)
    parser.add_argument("--only", choices=["blackout", "hedging", "deadline"], help="run one part")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with LocalCluster(replicas=3) as cluster:
        if args.only in (None, "blackout"):
            run_blackout(cluster, args)
        if args.only in (None, "hedging"):
            run_hedging(cluster, args)
        if args.only in (None, "deadline"):
            run_deadline(cluster, args)
    load_after = os.getloadavg()
    print(f"\nload average (1 min) before/after: {load_before[0]:.1f} / {load_after[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
