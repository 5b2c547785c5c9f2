"""What the shared balancing state costs a pool-per-request application: building and closing
a pool (no I/O: clients connect on first use), with and without ``share_state``.

    python bench/bench_shared_state.py
"""

from __future__ import annotations

import timeit

import clickhouse_lb

HOSTS = ["ch-1:8123", "ch-2:8123", "ch-3:8123"]


def measure(share_state: bool) -> float:
    def one() -> None:
        clickhouse_lb.get_pool(HOSTS, load_balancing="round_robin", share_state=share_state).close()

    one()
    number = 300
    # Best of many short runs: on a shared machine the minimum is the uninterrupted run.
    runs = timeit.repeat(one, number=number, repeat=30)
    return min(runs) / number * 1e6


def main() -> None:
    print("| share_state | get_pool() + close() us (best of 30 runs) |")
    print("|---|---:|")
    for share in (False, True):
        print(f"| {share} | {measure(share):.1f} |")


if __name__ == "__main__":
    main()
