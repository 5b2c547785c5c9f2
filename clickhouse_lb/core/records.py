"""One record per replica: everything the balancing state knows of it, in one place; and the
record one prober keeps of it (:class:`ProbeRecord`).

A :class:`ReplicaRecord` holds a replica's error and slowdown counts, what it last saw, the
marks the health probes read (errors ever counted, whether the count holds one a ping cannot
disprove), and its load (attempts in flight, the peak-EWMA latency average). What is true of
the whole set rather than of one replica (the lock, the decay stamp, the round-robin counter,
"some slowdown is stored") is one :class:`SetClock`.

The records are owned by one :class:`~clickhouse_lb.core.state.ReplicaSetState` and changed
only under its set's lock (:attr:`SetClock.lock`), which
:class:`~clickhouse_lb.core.load.ReplicaLoad` and the probe schedule
(:mod:`clickhouse_lb.core.health`) take too: one lock for every per-replica fact of a set.
When discovery changes the set, a kept replica's record moves whole to its new position
(:func:`remap`) and the set's clock goes on: statements that
started on the old set end on the same records, under the same lock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import TypeVar

__all__ = ["ProbeRecord", "ProbeState", "ReplicaRecord", "SetClock", "remap"]

T = TypeVar("T")


def remap(values: Sequence[T], kept: Mapping[int, int], size: int, fresh: Callable[[], T]) -> list[T]:
    """Per-replica values for a new set of ``size``: ``values[old]`` moves whole to
    ``kept[old]``, every other position gets ``fresh()``. The one carry-over rule: records,
    probe records and client slots all move by it."""
    source = {new: old for old, new in kept.items()}
    return [values[source[i]] if i in source else fresh() for i in range(size)]


class ReplicaRecord:
    """One replica's counts, marks and load (mutated under its set's lock only)."""

    __slots__ = (
        "announced",
        "average",
        "epoch",
        "errors",
        "failed",
        "in_flight",
        "key",
        "last_error",
        "last_error_time",
        "slowdowns",
        "stamp",
        "sticky",
    )

    def __init__(self) -> None:
        self.errors = 0
        self.slowdowns = 0
        self.last_error: str | None = None
        self.last_error_time: float | None = None  # wall clock (time.time()), for display
        self.failed = False  # the latest attempt failed
        # The current outage was already reported at WARNING (by a failover or by the probes,
        # whichever saw it first): one line per outage.
        self.announced = False
        # For the health probes: errors ever counted (a probe that started before the latest
        # one proves nothing about it), and whether the current count holds an error a
        # successful ping cannot disprove (cleared when the count reaches zero).
        self.epoch = 0
        self.sticky = False
        # Load (clickhouse_lb.core.load): attempts running, the latency average (None: no
        # attempt ended yet), the clock time of its last sample, and ln(average) +
        # stamp / decay_time (None: not computed since the last sample).
        self.in_flight = 0
        self.average: float | None = None
        self.stamp = 0.0
        self.key: float | None = -math.inf


class SetClock:
    """What a replica set shares across its records and across the generations discovery
    makes of it: the lock, the decay stamp, the round-robin counter, the slowdown flag."""

    __slots__ = ("clear_since", "last_decrease", "lock", "round_robin", "slowed")

    def __init__(self, round_robin: int = 0) -> None:
        self.lock = threading.Lock()
        self.last_decrease: float | None = None  # None: the decay clock has not started
        self.round_robin = round_robin
        self.slowed = False  # some slowdown may be non-zero (cleared when decay zeroes them)
        #: The decay stamp the set was last found clear at (no error, no slowdown), so that
        #: until that stamp is a half-life old it is known clear without looking at the records
        #: (ReplicaSetState.clear); None: not known clear. Whatever counts an error or a
        #: slowdown sets it to None after counting.
        self.clear_since: float | None = None


class ProbeState(str, Enum):
    """What the probes think of a replica."""

    OFF = "off"  # probing is turned off
    UNKNOWN = "unknown"  # not probed yet
    UP = "up"
    DOWN = "down"  # health_check_fall consecutive probes failed, not re-admitted yet


class ProbeRecord:
    """One replica as one prober sees it: its verdict, rise/fall streaks, latest probe and
    replication delay (:class:`~clickhouse_lb.core.health.ProbeSchedule`'s, changed under the
    set's lock). One per prober, not per set: pools sharing a set may probe it with other
    settings, or each on its own event loop."""

    __slots__ = (
        "delay",
        "delay_in_flight",
        "delay_started",
        "failures",
        "in_flight",
        "last_error",
        "last_latency",
        "last_started",
        "last_time",
        "started_epoch",
        "state",
        "streak_epoch",
        "successes",
    )

    def __init__(self) -> None:
        self.state = ProbeState.UNKNOWN
        self.successes = 0  # consecutive, all started after the latest error
        self.failures = 0  # consecutive
        self.in_flight = False
        self.last_started: float | None = None  # monotonic
        self.last_time: float | None = None  # wall clock
        self.last_latency: float | None = None
        self.last_error: str | None = None
        # Epoch: the number of errors ever counted against the replica (the state's). A probe
        # that started before the latest error proves nothing about it.
        self.started_epoch = 0  # of the probe in flight
        self.streak_epoch = 0  # of the current run of successes
        self.delay: float | None = None  # seconds, latest read (None: never read)
        self.delay_in_flight = False
        self.delay_started: float | None = None

    def idle_copy(self) -> ProbeRecord:
        """This record with nothing in flight (what a new schedule takes over: a probe in
        flight finishes on the schedule that started it)."""
        copy = ProbeRecord()
        for name in ProbeRecord.__slots__:
            setattr(copy, name, getattr(self, name))
        copy.in_flight = copy.delay_in_flight = False
        return copy
