"""A balanced ``SELECT 1`` against a bare clickhouse-connect client to the same replica.

Both talk to replica 0 of a local cluster (the pool uses ``in_order``, so every statement goes
there): the difference is the pool's own work (ordering, failover bookkeeping, tenacity).
Measured side by side in alternating rounds, so machine noise hits both equally; the result
is a ratio (target: the pool within 3% of the bare client). Also reports the pool's pure
Python overhead per statement against an in-process fake client (no I/O at all).

    python bench/bench_pool_overhead.py [--rounds 20] [--per-round 100] [--overhead-only] [--first-attempt]

``--first-attempt``: the pool's own work per statement with the first attempt run directly
(clickhouse_lb.core.failover.DIRECT_FIRST_ATTEMPT, the default) and with tenacity running every
attempt, alternated in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any

import clickhouse_connect

import clickhouse_lb
from clickhouse_lb.testing import LocalCluster


def timed_rounds(fn: Any, per_round: int) -> float:
    """Median latency of one call over a round, in milliseconds."""
    samples = []
    for _ in range(per_round):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


#: Strategies whose pure Python work per statement is reported side by side.
OVERHEAD_STRATEGIES = ("in_order", "random", "round_robin", "least_loaded")


def python_overhead_us(strategy: str = "in_order") -> float:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fakes import FakeCluster, make_pool

    fake = FakeCluster("a", "b", "c")
    # The real monotonic clock: the load bookkeeping reads it twice per attempt.
    pool = make_pool(fake, clock=time.monotonic, load_balancing=strategy)  # type: ignore[arg-type]
    client = fake.factory(host="a")
    n = 20000
    direct = min(timeit.repeat(lambda: client.query("SELECT 1"), number=n, repeat=5)) / n
    pooled = min(timeit.repeat(lambda: pool.query("SELECT 1"), number=n, repeat=5)) / n
    return (pooled - direct) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--overhead-only", action="store_true", help="only the pure Python work per strategy")
    parser.add_argument("--first-attempt", action="store_true",
                        help="only the direct first attempt against tenacity for every attempt")
    args = parser.parse_args()
    if args.first_attempt:
        print_first_attempt_variants()
        return 0
    if args.overhead_only:
        print_overheads()
        return 0
    with LocalCluster(replicas=3) as cluster:
        host, _, port = cluster.hosts[0].rpartition(":")
        bare = clickhouse_connect.get_client(host=host, port=int(port), autogenerate_session_id=False,
                                             query_retries=0)
        pool = clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order")
        for _ in range(200):  # warm both: connections, server caches
            bare.query("SELECT 1")
            pool.query("SELECT 1")
        bare_ms: list[float] = []
        pool_ms: list[float] = []
        for i in range(args.rounds):
            pair = [(bare_ms, bare), (pool_ms, pool)]
            for samples, target in pair if i % 2 == 0 else reversed(pair):
                samples.append(timed_rounds(lambda t=target: t.query("SELECT 1"), args.per_round))
        pool.close()
        bare.close()
    b, p = statistics.median(bare_ms), statistics.median(pool_ms)
    ratio = p / b
    overhead = python_overhead_us("in_order")
    print("| client | SELECT 1 median (ms) |")
    print("|---|---:|")
    print(f"| bare clickhouse-connect client | {b:.3f} |")
    print(f"| clickhouse-lb pool (3 replicas, in_order) | {p:.3f} |")
    print()
    print(f"pool / bare = {ratio:.3f} ({(ratio - 1) * 100:+.1f}%; target within +3%); "
          f"pool's own Python work per statement: {overhead:.1f} us")
    print()
    print_overheads()
    return 0


def print_overheads() -> None:
    print("| strategy | pool's own Python work per statement (us, best of 5 x 20000) |")
    print("|---|---:|")
    for strategy in OVERHEAD_STRATEGIES:
        print(f"| {strategy} | {python_overhead_us(strategy):.1f} |")


def print_first_attempt_variants(rounds: int = 4) -> None:
    from clickhouse_lb.core import failover

    samples: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds):
        for direct in (True, False) if i % 2 == 0 else (False, True):
            failover.DIRECT_FIRST_ATTEMPT = direct
            samples[direct].append(python_overhead_us("in_order"))
    failover.DIRECT_FIRST_ATTEMPT = True
    print(f"| first attempt (in_order) | pool's own Python work per statement (us; {rounds} alternated rounds) |")
    print("|---|---|")
    for direct, label in ((True, "run directly, tenacity after a failure"), (False, "tenacity runs every attempt")):
        print(f"| {label} | {' / '.join(f'{v:.1f}' for v in samples[direct])} |")


if __name__ == "__main__":
    raise SystemExit(main())
