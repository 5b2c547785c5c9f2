"""Running totals of one pool, for metrics: statements, failovers, failures by kind, probes.

:class:`PoolStats` listens to the pool's own events (so it sees exactly what a user listener
sees) and is told of each statement by the pool. Totals only grow; read them with
:meth:`PoolStats.snapshot`.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from clickhouse_lb.core.events import ErrorRecordedEvent, FailoverEvent, ProbeEvent

__all__ = ["PoolStats", "StatsSnapshot"]


class StatsSnapshot(NamedTuple):
    statements: int
    failovers: int
    #: errors counted against replicas, by kind (connect, disconnect, timeout, http_status,
    #: server_error, probe, ping, recorded)
    failures: dict[str, int]
    probes: int
    failed_probes: int


class PoolStats:
    """Thread-safe counters; also a listener of the pool's events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Statements are counted by an itertools.count: one C call per statement, atomic under
        # the GIL, no lock. Reading it advances it too, so the reads are counted and taken off.
        self._statements = itertools.count()
        self._statement_reads = 0
        #: A statement started: the counter's own ``__next__`` (a C call, no Python frame).
        self.count_statement: Callable[[], object] = self._statements.__next__
        self._failovers = 0
        self._failures: Counter[str] = Counter()
        self._probes = 0
        self._failed_probes = 0

    def _statements_now(self) -> int:
        """Statements counted so far (under the lock: the reads it takes off are counted there)."""
        reads = self._statement_reads
        self._statement_reads = reads + 1
        return next(self._statements) - reads

    def on_failover(self, event: FailoverEvent) -> None:
        with self._lock:
            self._failovers += 1

    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        with self._lock:
            self._failures[event.kind] += 1

    def on_probe(self, event: ProbeEvent) -> None:
        with self._lock:
            self._probes += 1
            self._failed_probes += not event.ok

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            return StatsSnapshot(
                self._statements_now(), self._failovers, dict(self._failures), self._probes, self._failed_probes
            )
