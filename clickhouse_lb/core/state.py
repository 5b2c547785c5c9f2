"""Error accounting per replica set, as ClickHouse's PoolWithFailoverBase keeps it.

Counts decay lazily: at the start of each selection, every replica's error and slowdown
counts are shifted right once per whole half-life elapsed since the last decrease, and the
leftover fraction of a period is dropped (the clock restarts at the moment of the shift).
Errors are capped; slowdowns are not. A monotonic clock drives the decay (the server uses
wall-clock seconds; a clock jump must neither wipe nor freeze the counts here).

:class:`ReplicaSetState` is the one owner of the set's per-replica records
(:class:`~clickhouse_lb.core.records.ReplicaRecord`: counts, marks, load). All mutation happens
under the set's one lock, held only for arithmetic: never during I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

from clickhouse_lb.core.load import DEFAULT_DECAY_TIME, LoadSnapshot, ReplicaLoad
from clickhouse_lb.core.records import ReplicaRecord, SetClock, remap

__all__ = [
    "Clock",
    "HealthReading",
    "ReplicaCounts",
    "ReplicaSetState",
    "Selection",
    "decay_shifts",
    "estimated_recovery_time",
]

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
_ERRORS = attrgetter("errors")
_SLOWDOWNS = attrgetter("slowdowns")


class Selection(NamedTuple):
    """A snapshot of the counts for ordering one statement (after decay)."""

    errors: list[int]
    slowdowns: list[int]  # shared while `slowed` is False: read it, never change it
    #: Whether any slowdown is stored (False: ``slowdowns`` is all zeros).
    slowed: bool
    #: The round-robin counter before this selection's step.
    round_robin: int
    #: Replicas whose counts this selection's decay brought back to zero.
    recovered: list[int]


class HealthReading(NamedTuple):
    """Per replica, what the health probes read of the records (:meth:`ReplicaSetState.health_reading`)."""

    #: Errors, decayed to now.
    errors: list[int]
    #: Has errors, or its latest attempt failed (probed more often).
    suspects: list[bool]
    #: Errors ever counted.
    epochs: list[int]
    #: The count holds an error a successful ping does not disprove.
    sticky: list[bool]


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
    """The records of one set of replicas (one pool, or every pool sharing them), shared by
    all threads and tasks using it; ``records[i]`` is replica ``i``'s."""

    __slots__ = ("_clock", "_set", "error_cap", "half_life", "records", "replica_load", "size", "zeros")

    def __init__(
        self,
        size: int,
        *,
        half_life: float = 60.0,
        error_cap: int = 1000,
        clock: Clock = time.monotonic,
        round_robin_start: int = 0,
        load_decay_time: float = DEFAULT_DECAY_TIME,
        records: Sequence[ReplicaRecord] | None = None,
        set_clock: SetClock | None = None,
    ) -> None:
        self.size = size
        self.records: tuple[ReplicaRecord, ...] = (
            tuple(records) if records is not None else tuple(ReplicaRecord() for _ in range(size))
        )
        #: The lock, decay stamp and round-robin counter (carried over by discovery with the records).
        self._set = set_clock if set_clock is not None else SetClock(round_robin_start)
        self.half_life, self.error_cap, self._clock = half_life, error_cap, clock
        #: A count of zero per replica, one list shared by every reader, never changed: a
        #: Selection's slowdowns while none is stored, a healthy set's errors for least_loaded
        #: (no allocation per statement for a vector of zeros).
        self.zeros = [0] * size
        #: In-flight statements and latency averages (``least_loaded``): the same records, the same lock.
        self.replica_load = ReplicaLoad.over(self.records, self._set, decay_time=load_decay_time, clock=clock)

    @property
    def set_clock(self) -> SetClock:
        """The set's lock, decay stamp and round-robin counter (the probe schedule takes the lock)."""
        return self._set

    # -- selection -------------------------------------------------------------------------

    def _decay_locked(self, now: float) -> list[int]:
        """Apply the lazy decay; returns the replicas whose counts just reached zero."""
        clock = self._set
        last = clock.last_decrease
        if last is None:
            clock.last_decrease = now
            return []
        shifts = decay_shifts(now - last, self.half_life)
        if shifts == 0:
            return []
        clock.last_decrease = now
        recovered = []
        for i, record in enumerate(self.records):
            if record.errors or record.slowdowns:
                record.errors = errors = _shift(record.errors, shifts)
                record.slowdowns = _shift(record.slowdowns, shifts)
                if errors == 0:
                    record.sticky = False
                    if record.slowdowns == 0:
                        recovered.append(i)
        return recovered

    def select(self, *, advance_round_robin: bool) -> Selection:
        """Decay, then one consistent snapshot of the records for ordering.
        ``advance_round_robin``: this is a statement (one round-robin step), not a look at
        ``plan()``. This runs once per statement, hence the inlined fast path."""
        clock = self._set
        with clock.lock:
            now = self._clock()
            last = clock.last_decrease
            if last is not None and self.half_life > 0 and now - last < self.half_life:
                recovered: list[int] = []
            else:
                recovered = self._decay_locked(now)
            counter = clock.round_robin
            if advance_round_robin:
                clock.round_robin = counter + 1
            records = self.records
            # map over an attrgetter: the snapshot without a Python-level loop (this is the
            # one read of the records a statement makes).
            errors = list(map(_ERRORS, records))
            slowed = clock.slowed
            if slowed:
                slowdowns = list(map(_SLOWDOWNS, records))
                if not any(slowdowns):
                    slowed = clock.slowed = False
            else:
                slowdowns = self.zeros
            # tuple.__new__: a Selection without the Python-level __new__ NamedTuple gives it.
            return _new_tuple(Selection, (errors, slowdowns, slowed, counter, recovered))

    def round_robin_step(self, advance: bool) -> int:
        """The round-robin counter as :meth:`select` takes it (one step on when ``advance``),
        without a snapshot: for a set found :meth:`clear`."""
        clock = self._set
        with clock.lock:
            counter = clock.round_robin
            if advance:
                clock.round_robin = counter + 1
        return counter

    def clear(self) -> bool:
        """Whether :meth:`select` would find every error and slowdown count at zero and decay
        nothing (the usual statement, on a healthy replica set): no snapshot is needed then.
        Once found so, known so until the decay stamp it was found at is a half-life old (the
        decay then moves the stamp) or something counts an error or a slowdown (which forgets
        it), as ClickHouse's balancer keeps its order between updates: the records are not
        read per statement. Reads without the lock, as :meth:`record_success` does: a count that
        changes just after is one that changed just after the snapshot would have been taken."""
        clock = self._set
        since = clock.clear_since
        if since is not None and self._clock() - since < self.half_life:
            return True
        return self._found_clear()

    def _clear_now(self) -> bool:
        clock = self._set
        last = clock.last_decrease
        return (
            not clock.slowed
            and last is not None
            and self._clock() - last < self.half_life
            and not any(map(_ERRORS, self.records))
        )

    def _found_clear(self) -> bool:
        """:meth:`clear` from the records, remembered when true. Remembered, then looked at
        again: a count made between the first look and the remembering (which forgets what
        it finds remembered only once it has counted) is seen by the second look."""
        if not self._clear_now():
            return False
        clock = self._set
        clock.clear_since = clock.last_decrease
        if not self._clear_now():
            clock.clear_since = None
            return False
        return True

    # -- outcomes --------------------------------------------------------------------------

    def record_error(self, index: int, error: str | None = None, *, sticky: bool = True) -> int:
        """Count one error against replica ``index`` (capped); returns the new count.
        ``sticky``: a successful ping does not disprove this error (see :meth:`health_marks`)."""
        wall_time = time.time()
        now = self._clock()
        record = self.records[index]
        clock = self._set
        with clock.lock:
            held = record.errors
            last = clock.last_decrease
            if held and last is not None and _shift(held, decay_shifts(now - last, self.half_life)) == 0:
                held = 0  # decayed away already, only not applied yet
            if not held:
                record.sticky = False
            if sticky:
                record.sticky = True
            record.epoch += 1
            count = record.errors = min(self.error_cap, record.errors + 1)
            clock.clear_since = None  # (after counting: see _found_clear)
            record.failed = True
            if error is not None:
                record.last_error = error
                record.last_error_time = wall_time
            return count

    def clear_errors(self, index: int) -> bool:
        """Forget replica ``index``'s errors (health probes re-admitted it); slowdowns stay.
        Returns False when there was nothing to clear."""
        record = self.records[index]
        with self._set.lock:
            had = record.errors > 0 or record.failed
            record.errors = 0
            record.failed = record.sticky = record.announced = False
            return had

    def announce_outage(self, index: int) -> bool:
        """True the first time an outage of replica ``index`` is reported (the caller logs it
        at WARNING), False until a success or a re-admission ends that outage (INFO then)."""
        record = self.records[index]
        with self._set.lock:
            first = not record.announced
            record.announced = True
            return first

    def health_marks(self) -> tuple[list[int], list[bool]]:
        """Per replica: how many errors were ever counted against it, and whether its count
        holds one that a successful ping does not disprove (what health probes need to decide,
        whichever pool sharing this state counted the error)."""
        with self._set.lock:
            return [r.epoch for r in self.records], [r.sticky for r in self.records]

    def health_reading(self) -> HealthReading:
        """What the health probes decide on, read from every record in one hold of the lock
        (counts decayed to now without moving the decay clock): a probe's verdict never mixes
        a count from before an error with the epoch from after it."""
        now = self._clock()
        with self._set.lock:
            counts = self._counts_locked(now)
            records = self.records
            return HealthReading(
                [c.errors for c in counts],
                [c.errors > 0 or c.last_attempt_failed for c in counts],
                [r.epoch for r in records],
                [r.sticky for r in records],
            )

    def record_slowdown(self, index: int) -> int:
        record = self.records[index]
        clock = self._set
        with clock.lock:
            record.slowdowns += 1
            clock.slowed = True
            clock.clear_since = None
            return record.slowdowns

    def record_success(self, index: int) -> bool:
        """Note a successful attempt; returns True when the previous attempt had failed."""
        record = self.records[index]
        if not record.failed and not record.announced:  # the common case reads without the lock
            return False
        with self._set.lock:
            was_failed = record.failed
            record.failed = record.announced = False
            return was_failed

    # -- reporting -------------------------------------------------------------------------

    def counts(self) -> list[ReplicaCounts]:
        """Every replica's counts as if decayed to now, without changing the state (a look
        must not move the decay clock, or watching a pool would change its behaviour)."""
        now = self._clock()
        with self._set.lock:
            return self._counts_locked(now)

    def report(self) -> list[tuple[ReplicaCounts, LoadSnapshot]]:
        """Every replica's counts (as :meth:`counts`) and load, read from its record in one
        hold of the lock: one consistent picture of the set (``pool.replicas``)."""
        now = self._clock()
        with self._set.lock:
            return list(zip(self._counts_locked(now), self.replica_load.snapshot_locked(now)))

    def _counts_locked(self, now: float) -> list[ReplicaCounts]:
        last = self._set.last_decrease
        since = 0.0 if last is None else now - last
        shifts = 0 if last is None else decay_shifts(since, self.half_life)
        if shifts:
            since = 0.0
        result = []
        for record in self.records:
            e = _shift(record.errors, shifts)
            s = _shift(record.slowdowns, shifts)
            result.append(
                ReplicaCounts(
                    e, s, estimated_recovery_time(e, s, self.half_life, since),
                    record.last_error, record.last_error_time, record.failed,
                )
            )
        return result

    def carried_over(self, kept: Mapping[int, int], size: int) -> ReplicaSetState:
        """The state of a new replica set of ``size`` where replica ``old`` of this one is
        ``kept[old]`` (discovery refreshed the set): a kept replica's record moves whole
        (counts, last error, marks, load, attempts still in flight on it), added ones start
        fresh, removed ones stay with this state only. The set's lock, decay clock and
        round-robin counter go on (one :class:`SetClock`), so statements still running on this
        state and those starting on the new one count on the same records under one lock."""
        with self._set.lock:
            records = remap(self.records, kept, size, ReplicaRecord)
        return ReplicaSetState(
            size, half_life=self.half_life, error_cap=self.error_cap, clock=self._clock,
            load_decay_time=self.replica_load.decay_time, records=records, set_clock=self._set,
        )

    def load(self, errors: Sequence[int], slowdowns: Sequence[int] | None = None) -> None:
        """Set the counts directly (tests, and restoring a state)."""
        clock = self._set
        with clock.lock:
            for i, record in enumerate(self.records):
                record.errors = min(self.error_cap, int(errors[i]))
                record.slowdowns = int(slowdowns[i]) if slowdowns is not None else 0
            clock.slowed = any(r.slowdowns for r in self.records)
            clock.clear_since = None
