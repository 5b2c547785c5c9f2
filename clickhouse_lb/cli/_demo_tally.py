"""What ``clickhouse-lb demo`` counts: the workload's statements per replica and phase, the pool's
events, the recent shares, and the claims the run is judged by."""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clickhouse_lb._redact import redact
from clickhouse_lb.cli._demo_plan import (
    PACE,
    STATEMENT_TIMEOUT,
    WHO,
)
from clickhouse_lb.core.events import ErrorRecordedEvent, FailoverEvent, PoolListener, ReplicaRecoveredEvent
from clickhouse_lb.pools.pool import ReplicaPool


class Tally:
    """Statements served per replica name and failed statements (thread-safe)."""

    def __init__(self, names: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._served: Counter[str] = Counter(dict.fromkeys(names, 0))
        self.failed = 0
        self.last_failure: str | None = None
        self._phase_starts: list[float] = []  # monotonic start of phase 1, 2, ...
        self._by_phase: list[Counter[str]] = [Counter(dict.fromkeys(names, 0))]

    def served_by(self, name: str, started: float | None = None) -> None:
        """One statement answered by ``name``; it counts in the phase in which it was *sent*
        (``started``, monotonic), so one answered just after a phase mark stays where it began."""
        with self._lock:
            self._served[name] += 1
            phase = len(self._phase_starts) if started is None else bisect.bisect_right(self._phase_starts, started)
            self._by_phase[phase][name] += 1

    def next_phase(self) -> None:
        """Statements sent from now on count in a new phase."""
        with self._lock:
            self._phase_starts.append(time.monotonic())
            self._by_phase.append(Counter(dict.fromkeys(self._served, 0)))

    def phases(self) -> list[Counter[str]]:
        """Statements served per replica in each phase, in order."""
        with self._lock:
            return [Counter(c) for c in self._by_phase]

    def failure(self, exc: BaseException) -> None:
        with self._lock:
            self.failed += 1
            self.last_failure = redact(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}")

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self._served)

    @property
    def statements(self) -> int:
        with self._lock:
            return sum(self._served.values()) + self.failed


class Workload:
    """Client threads running ``WHO`` through a pool until stopped, tallying who answered."""

    def __init__(self, pool: ReplicaPool, tally: Tally, threads: int) -> None:
        self._pool = pool
        self.tally = tally
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"clickhouse-lb-demo-{i}", daemon=True) for i in range(threads)
        ]

    def start(self) -> Workload:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                started = time.monotonic()
                self.tally.served_by(str(self._pool.command(WHO)), started)
            except Exception as exc:
                if self._stop.is_set():
                    return  # stopping (Ctrl-C may have stopped the replicas too): not a failure
                self.tally.failure(exc)
            self._stop.wait(PACE)

    def stop(self) -> None:
        """Stop the threads; each finishes its statement (bounded by the statement timeout)."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=STATEMENT_TIMEOUT * 3 + 1)


class EventLog(PoolListener):
    """The pool's events (the listener hook an application would use for metrics): errors
    counted per replica, failovers and recoveries kept for the display to announce. (The
    failovers' total is the pool's own, ``pool.stats.failovers``.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors_recorded: Counter[str] = Counter()
        self._pending: deque[FailoverEvent | ReplicaRecoveredEvent] = deque()

    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        with self._lock:
            self.errors_recorded[event.address] += 1

    def on_failover(self, event: FailoverEvent) -> None:
        with self._lock:
            self._pending.append(event)

    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        with self._lock:
            self._pending.append(event)

    def drain(self) -> list[FailoverEvent | ReplicaRecoveredEvent]:
        with self._lock:
            events = list(self._pending)
            self._pending.clear()
        return events


class RecentShare:
    """Each replica's share of the statements over the last ``window`` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._samples: deque[tuple[float, Counter[str]]] = deque()

    def add(self, now: float, served: Counter[str]) -> dict[str, float]:
        self._samples.append((now, served))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()
        return shares(served - self._samples[0][1], list(served))


def shares(served: Mapping[str, int], names: Sequence[str]) -> dict[str, float]:
    """Fraction of ``served`` per name (0 for all when nothing was served)."""
    total = sum(served.get(n, 0) for n in names)
    return {n: (served.get(n, 0) / total if total else 0.0) for n in names}


@dataclass
class Claims:
    """What the run set out to show; the exit status is 0 only when every one holds."""

    failed: int = 0
    victim: str | None = None
    victim_errors: int = 0
    victim_served_while_down: int | None = None
    others_served_while_down: int = 0
    returned_after: float | None = None
    notes: list[str] = field(default_factory=list)
    #: Statements each replica served in part 2-3: before the kill, while the victim was down
    #: (from the kill to its restart), after the restart.
    phases: dict[str, Counter[str]] = field(default_factory=dict)
    #: Errors counted per replica name over part 2-3 (the live table's "errors recorded").
    errors_recorded: Counter[str] = field(default_factory=Counter)
    failovers: int = 0

    def checks(self) -> list[tuple[str, bool]]:
        name = self.victim or "the killed replica"
        return [
            ("no statement failed (one replica down at most)", self.failed == 0),
            (f"{name}'s errors rose while it was down ({self.victim_errors} recorded)", self.victim_errors > 0),
            (
                f"traffic moved: {name} served {self.victim_served_while_down} while down, "
                f"the others {self.others_served_while_down}",
                self.victim_served_while_down == 0 and self.others_served_while_down > 0,
            ),
            (
                f"{name} back in rotation"
                + (f" ({self.returned_after:.1f} s after the restart)" if self.returned_after is not None else ""),
                self.returned_after is not None,
            ),
        ]

    @property
    def met(self) -> bool:
        return all(ok for _, ok in self.checks())
