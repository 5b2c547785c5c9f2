"""The pool's own time per statement when the CPU has done something else in between.

The real mix (``bench/compare.py``'s ``pool_own_time_us``) costs the pool about ten times its hot
loop: between two statements the CPU runs the replicas, so the pool's code and data are met
cold. This reproduces that without a server: the same pool over in-process fake clients
(tests/fakes.py) against calling a fake client directly, with, between two measured statements,
nothing (the hot loop), a 2 ms sleep (the wait for a replica's answer), or a write to every cache
line of 16 MB (another process's work). Medians of ``--n`` statements, in microseconds.

It also counts, per 1000 statements 2 ms apart, what the statement path asks of the system
beyond its own Python work: ``os.getpid()`` calls (a system call each) and the watchdog
thread's wake-ups (``Watchdog._notify``).

    PYTHONPATH=<tree> python bench/bench_cold_path.py [--n 400]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # tests/fakes.py (after PYTHONPATH: the tree measured comes first)

from tests.fakes import FakeCluster, make_pool  # noqa: E402

_JUNK = bytearray(16 << 20)


def _trash() -> None:
    junk = _JUNK
    for i in range(0, len(junk), 64):
        junk[i] = 1


def _median_us(call: Callable[[], object], between: Callable[[], object], n: int) -> float:
    for _ in range(50):
        call()
    times = []
    for _ in range(n):
        between()
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=400)
    args = parser.parse_args()

    import clickhouse_lb
    from clickhouse_lb.pools import _watchdog

    fake = FakeCluster("a", "b", "c")
    client = fake.factory(host="a")
    # Probes off for the timings (nothing on a clock beside the statements), as in
    # bench/callgrind_statement_cost.py; on for the counts (the per-statement check of the probe
    # worker; the fake replicas fail their first probe, which changes nothing counted here).
    pool = make_pool(fake, load_balancing="in_order", health_check_interval_ms=0)
    print(f"clickhouse_lb from {Path(clickhouse_lb.__file__).parent}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| between statements | direct (us) | pool (us) | pool's own (us) |")
    print("|---|---:|---:|---:|")
    for name, between in (("nothing (hot loop)", lambda: None), ("a 2 ms sleep", lambda: time.sleep(0.002)),
                          ("16 MB written", _trash)):
        direct = _median_us(lambda: client.query("SELECT 1"), between, args.n)
        pooled = _median_us(lambda: pool.query("SELECT 1"), between, args.n)
        print(f"| {name} | {direct:.1f} | {pooled:.1f} | {pooled - direct:.1f} |")

    pool.close()
    logging.getLogger("clickhouse_lb").setLevel(logging.CRITICAL)
    pool = make_pool(fake, load_balancing="in_order", health_check_interval_ms=60_000)
    pool.query("SELECT 1")  # (starts its probe worker)
    counts = {"getpid": 0, "notify": 0}
    real_getpid, real_notify = os.getpid, _watchdog.Watchdog._notify

    def getpid() -> int:
        counts["getpid"] += 1
        return real_getpid()

    def notify(self: _watchdog.Watchdog, *args: float) -> None:
        counts["notify"] += 1
        real_notify(self, *args)  # type: ignore[arg-type]

    os.getpid = getpid
    _watchdog.Watchdog._notify = notify  # type: ignore[method-assign]
    try:
        for _ in range(1000):
            time.sleep(0.002)
            pool.query("SELECT 1")
    finally:
        os.getpid, _watchdog.Watchdog._notify = real_getpid, real_notify  # type: ignore[method-assign]
        pool.close()
    print(f"per 1000 statements 2 ms apart: os.getpid() {counts['getpid']}, watchdog wake-ups {counts['notify']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
