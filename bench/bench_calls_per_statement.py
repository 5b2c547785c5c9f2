"""Python function calls per statement through a pool over the in-process fake client: a
figure that machine load cannot move (wall-clock timings on a loaded 2-core machine vary 3x).

Counts every Python and C function call (``sys.setprofile``) of N ``pool.query("SELECT 1")``
minus the same N on the bare fake client, for a read answered by its first replica, and for a
read whose first replica refuses the connection (one failover).

    python bench/bench_calls_per_statement.py [--first-attempt]

``--first-attempt`` also counts tenacity running every attempt
(``clickhouse_lb.core.failover.DIRECT_FIRST_ATTEMPT = False``), when the module has that switch.
Runs whichever clickhouse_lb is importable (``PYTHONPATH=/other/checkout`` for another version).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import clickhouse_lb

# The fakes of the checkout whose clickhouse_lb is measured.
sys.path.insert(0, str(Path(clickhouse_lb.__file__).resolve().parents[1]))

from tests.fakes import FakeCluster, make_pool, refused

N = 200


def calls(fn: Any, n: int = N) -> float:
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    fn()  # warm: lazy clients, caches
    sys.setprofile(profile)
    try:
        for _ in range(n):
            fn()
    finally:
        sys.setprofile(None)
    return count / n


def measure() -> tuple[float, float]:
    fake = FakeCluster("a", "b", "c")
    pool = make_pool(fake, clock=time.monotonic, load_balancing="in_order")  # type: ignore[arg-type]
    client = fake.factory(host="a")
    bare = calls(lambda: client.query("SELECT 1"))
    ok = calls(lambda: pool.query("SELECT 1")) - bare
    failing = FakeCluster("a", "b", "c")
    failing["a"].outcomes = [refused]
    # Errors never stick (half-life 0): every statement meets the refusing replica first.
    over = make_pool(failing, clock=time.monotonic, load_balancing="in_order",  # type: ignore[arg-type]
                     distributed_replica_error_half_life=0)
    failover = calls(lambda: over.query("SELECT 1")) - bare
    return ok, failover


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first-attempt", action="store_true")
    args = parser.parse_args()
    from clickhouse_lb.core import failover

    print(f"clickhouse_lb from {Path(clickhouse_lb.__file__).parent}")
    print("| variant | calls per statement, answered at once | calls per statement, one failover |")
    print("|---|---:|---:|")
    ok, over = measure()
    print(f"| as configured | {ok:.0f} | {over:.0f} |")
    if args.first_attempt and hasattr(failover, "DIRECT_FIRST_ATTEMPT"):
        failover.DIRECT_FIRST_ATTEMPT = False  # type: ignore[attr-defined]
        ok, over = measure()
        print(f"| tenacity runs every attempt | {ok:.0f} | {over:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
