"""How long ``plan()`` takes: the per-statement ordering cost of a pool, no I/O.

Targets: <= 5 us with 3 replicas, <= 50 us with 100 (hostname scores are computed once per
pool, so a hostname strategy costs what ``random`` costs). Prints a markdown table.

    python bench/bench_plan.py
"""

from __future__ import annotations

import sys
import timeit

from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import parse_balancing_settings
from clickhouse_lb.core.balancer import Balancer

STRATEGIES = [
    "random", "in_order", "nearest_hostname", "hostname_levenshtein_distance", "round_robin", "least_loaded",
]


def measure(n: int, strategy: str, with_errors: bool) -> float:
    replicas = [Replica(f"ch-{i:03d}.dc1.example.com", 8123) for i in range(n)]
    settings = parse_balancing_settings({"load_balancing": strategy, "local_hostname": "ch-007.dc1.example.com"})
    balancer = Balancer(replicas, settings)
    if with_errors:
        balancer.state.load([i % 3 for i in range(n)])
    # least_loaded reads in-flight counts and latency averages: give every replica some history
    # and a few replicas a statement in flight, as under traffic.
    load = balancer.state.replica_load
    for i in range(n):
        load.finish(i, load.start(i) - 0.001 * (1 + i % 5))
    for i in range(0, n, 4):
        load.start(i)
    balancer.plan_indices()  # first use computes the static ranks
    # Many short runs, keep the fastest: on a shared machine the minimum is the run that was
    # not interrupted, which is what the code costs.
    number = 2000 if n <= 10 else 200
    runs = timeit.repeat(balancer.plan_indices, number=number, repeat=60)
    return min(runs) / number * 1e6


def main() -> int:
    print("| replicas | strategy | errors | plan() us (best of 60 runs) |")
    print("|---:|---|---|---:|")
    worst = {}
    for n in (3, 100):
        for strategy in STRATEGIES:
            for with_errors in (False, True):
                us = measure(n, strategy, with_errors)
                worst[n] = max(worst.get(n, 0.0), us)
                print(f"| {n} | {strategy} | {'yes' if with_errors else 'no'} | {us:.2f} |")
    limits = {3: 5.0, 100: 50.0}
    verdict = all(worst[n] <= limits[n] for n in limits)
    print()
    print(f"worst: 3 replicas {worst[3]:.2f} us (target 5), 100 replicas {worst[100]:.2f} us (target 50): "
          f"{'within target' if verdict else 'OVER TARGET'}")
    print(f"python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
