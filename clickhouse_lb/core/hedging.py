"""Hedged reads: when to send the same read to a second replica (pure, apart from a lock).

ClickHouse's ``use_hedged_requests``, on the client side: a read-only statement whose replica has
not answered within ``receive_data_timeout_ms`` is sent to the next replica of the plan as well;
the first complete answer wins, the other attempt is cancelled (connection closed, and
``KILL QUERY`` sent to its replica), and the slower replica's ``slowdowns_count`` rises, which
orders it later while hedging is on (the hedged sort key: errors, slowdowns, priority,
strategy, random).

``receive_data_timeout_ms`` is a number of milliseconds, or ``"auto"``: the 95th percentile of
the pool's recent read latencies (the winners'), but at most ``AUTO_MEDIAN_FACTOR`` times their
median (one slow replica among fast ones puts a third of the samples above any high percentile;
the median stays with the fast ones, so the slow replica's reads are still hedged), bounded to
[``AUTO_MIN``, ``AUTO_MAX``]; until the pool has seen ``AUTO_MIN_SAMPLES`` reads it is
``AUTO_MAX`` (hedge rarely while nothing is known). On a steady workload about 5 reads in 100
are hedged: that is the extra load hedging costs (see BENCHMARKS.md for measured figures).

Off by default in the pool, unlike on the server: every hedge is a second full query on another
replica, and the pool cannot see the server's load; hedge when tail latency matters more than
cluster load.
"""

from __future__ import annotations

import math
import threading
from collections import deque

from clickhouse_lb.config.hedging import AUTO, HedgePolicy, parse_receive_data_timeout

__all__ = ["AUTO", "HedgePolicy", "LatencyWindow", "parse_receive_data_timeout"]

AUTO_PERCENTILE = 0.95
AUTO_MIN = 0.05
AUTO_MAX = 2.0  # ClickHouse's receive_data_timeout_ms default
AUTO_MIN_SAMPLES = 20
AUTO_MEDIAN_FACTOR = 3.0
WINDOW = 512


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (not empty)."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def adaptive_delay(latencies: list[float]) -> float:
    """The "auto" delay for these recent latencies (any order)."""
    if len(latencies) < AUTO_MIN_SAMPLES:
        return AUTO_MAX
    ordered = sorted(latencies)
    high = min(percentile(ordered, AUTO_PERCENTILE), AUTO_MEDIAN_FACTOR * percentile(ordered, 0.5))
    return min(AUTO_MAX, max(AUTO_MIN, high))


class LatencyWindow:
    """The pool's most recent read latencies (seconds), shared by threads and tasks."""

    __slots__ = ("_lock", "_values")

    def __init__(self, size: int = WINDOW) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._values.append(seconds)

    def snapshot(self) -> list[float]:
        with self._lock:
            return list(self._values)


def hedge_delay(policy: HedgePolicy, window: LatencyWindow) -> float | None:
    """Seconds to wait before hedging a read now; None: do not hedge."""
    if not policy.enabled:
        return None
    if policy.delay is not None:
        return policy.delay
    return adaptive_delay(window.snapshot())
