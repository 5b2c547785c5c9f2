"""Error accounting per replica set, as ClickHouse's PoolWithFailoverBase keeps it.

Counts decay lazily: at the start of each selection, every replica's error and slowdown
counts are shifted right once per whole half-life elapsed since the last decrease, and the
leftover fraction of a period is dropped (the clock restarts at the moment of the shift).
Errors are capped; slowdowns are not. A monotonic clock drives the decay (the server uses
wall-clock seconds; a clock jump must neither wipe nor freeze the counts here).

All mutation happens under one lock, held only for arithmetic: never during I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from clickhouse_lb.core.load import DEFAULT_DECAY_TIME, ReplicaLoad

__all__ = ["Clock", "ReplicaCounts", "ReplicaSetState", "Selection", "decay_shifts", "estimated_recovery_time"]

Clock = Callable[[], float]

#: Shifting a 64-bit count 64 or more times clears it, as on the server.
_MAX_SHIFTS = 64


def decay_shifts(elapsed: float, half_life: float) -> int:
    """Whole half-lives in ``elapsed`` seconds; a zero half-life clears everything."""
    if half_life <= 0:
        return _MAX_SHIFTS
    if elapsed <= 0:
        return 0
    return min(_MAX_SHIFTS, int(elapsed // half_life))


def _shift(count: int, shifts: int) -> int:
    return 0 if shifts >= _MAX_SHIFTS else count >> shifts


def estimated_recovery_time(errors: int, slowdowns: int, half_life: float, since_decrease: float) -> float:
    """Seconds until both counts decay to zero, as system.clusters reports it:
    ``max(bits(errors), bits(slowdowns)) * half_life - (now - last_decrease)``, at least 0."""
    periods = max(errors.bit_length(), slowdowns.bit_length())
    return max(0.0, periods * half_life - since_decrease)


_new_tuple = tuple.__new__


class Selection(NamedTuple):
    """A snapshot of the counts for ordering one statement (after decay)."""

    errors: list[int]
    slowdowns: list[int]
    #: Whether any slowdown is stored (False: ``slowdowns`` is all zeros).
    slowed: bool
    #: The round-robin counter before this selection's step.
    round_robin: int
    #: Replicas whose counts this selection's decay brought back to zero.
    recovered: list[int]


@dataclass(frozen=True)
class ReplicaCounts:
    """One replica's counts after decay to ``now``, and what it last saw."""

    errors: int
    slowdowns: int
    estimated_recovery_time: float
    last_error: str | None
    last_error_time: float | None  # wall-clock (time.time()), for display
    last_attempt_failed: bool


class ReplicaSetState:
    """Counts for one set of replicas (one pool), shared by all threads and tasks using it."""

    __slots__ = (
        "_announced",
        "_clock",
        "_epochs",
        "_errors",
        "_failed",
        "_last_decrease",
        "_last_error",
        "_last_error_time",
        "_lock",
        "_round_robin",
        "_slowdowns",
        "_slowed",
        "_sticky",
        "error_cap",
        "half_life",
        "replica_load",
        "size",
    )

    def __init__(
        self,
        size: int,
        *,
        half_life: float = 60.0,
        error_cap: int = 1000,
        clock: Clock = time.monotonic,
        round_robin_start: int = 0,
        load_decay_time: float = DEFAULT_DECAY_TIME,
    ) -> None:
        self.size = size
        #: In-flight statements and latency averages (``least_loaded``), shared with the counts.
        self.replica_load = ReplicaLoad(size, decay_time=load_decay_time, clock=clock)
        self.half_life = half_life
        self.error_cap = error_cap
        self._clock = clock
        self._lock = threading.Lock()
        self._errors = [0] * size
        self._slowdowns = [0] * size
        self._slowed = False  # some slowdown may be non-zero (cleared when decay zeroes them)
        self._last_error: list[str | None] = [None] * size
        self._last_error_time: list[float | None] = [None] * size
        self._failed = [False] * size
        # Whether the current outage of each replica was already reported at WARNING (by a
        # failover or by the probes, whichever saw it first): one line per outage.
        self._announced = [False] * size
        # For the health probes: each replica's number of errors ever counted (a probe that
        # started before the latest one proves nothing about it), and whether its current count
        # holds an error a successful ping cannot disprove (cleared when the count reaches zero).
        self._epochs = [0] * size
        self._sticky = [False] * size
        self._last_decrease: float | None = None
        self._round_robin = round_robin_start

    # -- selection -------------------------------------------------------------------------

    def _decay_locked(self, now: float) -> list[int]:
        """Apply the lazy decay; returns the replicas whose counts just reached zero."""
        last = self._last_decrease
        if last is None:
            self._last_decrease = now
            return []
        shifts = decay_shifts(now - last, self.half_life)
        if shifts == 0:
            return []
        self._last_decrease = now
        recovered = []
        errors = self._errors
        slowdowns = self._slowdowns
        for i in range(self.size):
            e = errors[i]
            s = slowdowns[i]
            if e or s:
                errors[i] = _shift(e, shifts)
                slowdowns[i] = _shift(s, shifts)
                if errors[i] == 0:
                    self._sticky[i] = False
                    if slowdowns[i] == 0:
                        recovered.append(i)
        return recovered

    def select(self, *, advance_round_robin: bool) -> Selection:
        """Decay, then a snapshot for ordering. ``advance_round_robin``: this is a statement
        (one round-robin step), not a look at ``plan()``. This runs once per statement, hence
        the inlined fast path."""
        with self._lock:
            now = self._clock()
            last = self._last_decrease
            if last is not None and self.half_life > 0 and now - last < self.half_life:
                recovered: list[int] = []
            else:
                recovered = self._decay_locked(now)
            counter = self._round_robin
            if advance_round_robin:
                self._round_robin = counter + 1
            slowed = self._slowed
            if slowed and not any(self._slowdowns):
                slowed = self._slowed = False
            # tuple.__new__: a Selection without the Python-level __new__ NamedTuple gives it.
            return _new_tuple(Selection, (self._errors[:], self._slowdowns[:], slowed, counter, recovered))

    def clear(self) -> bool:
        """Whether :meth:`select` would find every error and slowdown count at zero and decay
        nothing (the usual statement, on a healthy replica set): no snapshot is needed then.
        Reads without the lock, as :meth:`record_success` does: a count that changes just after
        is one that changed just after the snapshot would have been taken."""
        last = self._last_decrease
        return (
            not self._slowed and last is not None and self._clock() - last < self.half_life and not any(self._errors)
        )

    # -- outcomes --------------------------------------------------------------------------

    def record_error(self, index: int, error: str | None = None, *, sticky: bool = True) -> int:
        """Count one error against replica ``index`` (capped); returns the new count.
        ``sticky``: a successful ping does not disprove this error (see :meth:`health_marks`)."""
        wall_time = time.time()
        now = self._clock()
        with self._lock:
            held = self._errors[index]
            last = self._last_decrease
            if held and last is not None and _shift(held, decay_shifts(now - last, self.half_life)) == 0:
                held = 0  # decayed away already, only not applied yet
            if not held:
                self._sticky[index] = False
            if sticky:
                self._sticky[index] = True
            self._epochs[index] += 1
            count = min(self.error_cap, self._errors[index] + 1)
            self._errors[index] = count
            self._failed[index] = True
            if error is not None:
                self._last_error[index] = error
                self._last_error_time[index] = wall_time
            return count

    def clear_errors(self, index: int) -> bool:
        """Forget replica ``index``'s errors (health probes re-admitted it); slowdowns stay.
        Returns False when there was nothing to clear."""
        with self._lock:
            had = self._errors[index] > 0 or self._failed[index]
            self._errors[index] = 0
            self._failed[index] = False
            self._sticky[index] = False
            self._announced[index] = False
            return had

    def announce_outage(self, index: int) -> bool:
        """True the first time an outage of replica ``index`` is reported (the caller logs it
        at WARNING), False until a success or a re-admission ends that outage (INFO then)."""
        with self._lock:
            first = not self._announced[index]
            self._announced[index] = True
            return first

    def health_marks(self) -> tuple[list[int], list[bool]]:
        """Per replica: how many errors were ever counted against it, and whether its count
        holds one that a successful ping does not disprove (what health probes need to decide,
        whichever pool sharing this state counted the error)."""
        with self._lock:
            return self._epochs[:], self._sticky[:]

    def record_slowdown(self, index: int) -> int:
        with self._lock:
            self._slowdowns[index] += 1
            self._slowed = True
            return self._slowdowns[index]

    def record_success(self, index: int) -> bool:
        """Note a successful attempt; returns True when the previous attempt had failed."""
        if not self._failed[index] and not self._announced[index]:  # the common case reads without the lock
            return False
        with self._lock:
            was_failed = self._failed[index]
            self._failed[index] = False
            self._announced[index] = False
            return was_failed

    # -- reporting -------------------------------------------------------------------------

    def counts(self) -> list[ReplicaCounts]:
        """Every replica's counts as if decayed to now, without changing the state (a look
        must not move the decay clock, or watching a pool would change its behaviour)."""
        now = self._clock()
        with self._lock:
            last = self._last_decrease
            since = 0.0 if last is None else now - last
            shifts = 0 if last is None else decay_shifts(since, self.half_life)
            if shifts:
                since = 0.0
            result = []
            for i in range(self.size):
                e = _shift(self._errors[i], shifts)
                s = _shift(self._slowdowns[i], shifts)
                result.append(
                    ReplicaCounts(
                        errors=e,
                        slowdowns=s,
                        estimated_recovery_time=estimated_recovery_time(e, s, self.half_life, since),
                        last_error=self._last_error[i],
                        last_error_time=self._last_error_time[i],
                        last_attempt_failed=self._failed[i],
                    )
                )
            return result

    def carried_over(self, kept: Mapping[int, int], size: int) -> ReplicaSetState:
        """The state of a new replica set of ``size`` where replica ``old`` of this one is
        ``kept[old]`` (discovery refreshed the set): kept replicas keep their counts, last
        error and epochs, the others start clean; the decay clock and round-robin counter go on."""
        new = ReplicaSetState(
            size, half_life=self.half_life, error_cap=self.error_cap, clock=self._clock,
            round_robin_start=0, load_decay_time=self.replica_load.decay_time,
        )
        new.replica_load = self.replica_load.carried_over(kept, size)
        with self._lock:
            new._last_decrease = self._last_decrease
            new._round_robin = self._round_robin
            for old, index in kept.items():
                new._errors[index] = self._errors[old]
                new._slowdowns[index] = self._slowdowns[old]
                new._last_error[index] = self._last_error[old]
                new._last_error_time[index] = self._last_error_time[old]
                new._failed[index] = self._failed[old]
                new._epochs[index] = self._epochs[old]
                new._sticky[index] = self._sticky[old]
                new._announced[index] = self._announced[old]
            new._slowed = any(new._slowdowns)
        return new

    def load(self, errors: Sequence[int], slowdowns: Sequence[int] | None = None) -> None:
        """Set the counts directly (tests, and restoring a state)."""
        with self._lock:
            self._errors = [min(self.error_cap, int(e)) for e in errors]
            self._slowdowns = list(slowdowns) if slowdowns is not None else [0] * self.size
            self._slowed = any(self._slowdowns)
