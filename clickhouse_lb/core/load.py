"""Per-replica load for ``least_loaded``: statements in flight and a peak-EWMA of latency.

Every attempt the pool makes (any strategy) is counted here, so that a statement may switch to
``least_loaded`` for itself and ``pool.replicas`` always shows the load. The average is
Finagle's *peak EWMA*: a sample above the current average replaces it at once (a replica that
turns slow is avoided from its first slow answer), a lower one is blended in with weight
``1 - exp(-dt / decay_time)``, and between samples the average decays toward zero with the
same time constant. The decay is what lets a replica that was slow be tried again: left idle,
its average halves every ``decay_time * ln 2`` seconds until it looks cheap enough to be picked,
and its next answer sets the average to what it costs now.

The load score of a replica is ``average * (in_flight + 1)``: the latency a new statement
should expect to queue behind there. A replica that never answered has no average: with nothing
in flight it scores 0 (so it is tried at once), with statements in flight it is priced at the
mean average of the others (so a cold replica is not flooded before its first answer, and the
others are not starved meanwhile). With no history anywhere, every average is 1 and the score is
plain least-in-flight.

Reads (:meth:`ReplicaLoad.scores`, :meth:`ReplicaLoad.order_keys`, :meth:`ReplicaLoad.snapshot`) never
change the state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from clickhouse_lb.core.records import ReplicaRecord, SetClock

__all__ = ["DEFAULT_DECAY_TIME", "LoadSnapshot", "ReplicaLoad", "decay_factor", "decayed", "load_scores", "peak_ewma"]

Clock = Callable[[], float]

#: Seconds: the time constant of the latency average (Finagle's and Linkerd's default).
DEFAULT_DECAY_TIME = 10.0


#: Below this ``elapsed / decay_time`` (a replica's answers 78 ms apart or closer, with the
#: default decay time), :func:`decay_factor` is a series, not ``math.exp``: libm's exp reads a
#: table that is cold between two statements (5 us of a cold statement's 100, measured in the
#: real mix: BENCHMARKS.md), where the series is a few multiplications, exact to 2e-10.
_SERIES_BELOW = 1.0 / 128
_SIXTH = 1.0 / 6.0


def decay_factor(elapsed: float, decay_time: float) -> float:
    """``exp(-elapsed / decay_time)``: what is left of a value after ``elapsed`` seconds (1 for
    none, or a clock that went back)."""
    x = elapsed / decay_time
    if x < _SERIES_BELOW:
        return 1.0 if x <= 0.0 else 1.0 - x * (1.0 - x * (0.5 - x * _SIXTH))
    return math.exp(-x)


def decayed(average: float, elapsed: float, decay_time: float) -> float:
    """``average`` after ``elapsed`` seconds without a sample (toward zero)."""
    return average * decay_factor(elapsed, decay_time)


def peak_ewma(average: float | None, sample: float, elapsed: float, decay_time: float) -> float:
    """The average after a ``sample`` taken ``elapsed`` seconds after the previous one.

    No history: the sample. Above the average: the sample (the peak). Otherwise the sample
    blended in, the older the average the more weight the sample gets."""
    if average is None or sample >= average:
        return sample
    weight = decay_factor(elapsed, decay_time)
    return average * weight + sample * (1.0 - weight)


def load_scores(in_flight: list[int], averages: list[float | None]) -> list[float]:
    """Each replica's load score ``average * (in_flight + 1)`` (see the module documentation
    for replicas without an average)."""
    known = [a for a in averages if a is not None]
    if not known:
        return [float(k) for k in in_flight]
    default = sum(known) / len(known)
    scores = []
    for k, average in zip(in_flight, averages):
        if average is None:
            scores.append(0.0 if k == 0 else default * (k + 1))
        else:
            scores.append(average * (k + 1))
    return scores


class LoadSnapshot(NamedTuple):
    """One replica's load as of now: statements in flight, the decayed average (None: no answer yet)."""

    in_flight: int
    latency_ewma: float | None


class ReplicaLoad:
    """In-flight counts and latency averages of one replica set (thread-safe; one short lock,
    never held during I/O). The values live in the set's records
    (:class:`~clickhouse_lb.core.records.ReplicaRecord`), under the set's lock: a
    :class:`~clickhouse_lb.core.state.ReplicaSetState` makes its load with :meth:`over`; a
    load built alone (tests, benchmarks) has records and a lock of its own."""

    __slots__ = ("_clock", "_cold", "_records", "_set", "decay_time", "size")

    def __init__(self, size: int, *, decay_time: float = DEFAULT_DECAY_TIME, clock: Clock = time.monotonic) -> None:
        self._setup(tuple(ReplicaRecord() for _ in range(size)), SetClock(), decay_time, clock)

    @classmethod
    def over(
        cls, records: Sequence[ReplicaRecord], set_clock: SetClock, *,
        decay_time: float = DEFAULT_DECAY_TIME, clock: Clock = time.monotonic,
    ) -> ReplicaLoad:
        """The load kept in ``records``, under ``set_clock``'s lock (a replica set's own)."""
        load = cls.__new__(cls)
        load._setup(tuple(records), set_clock, decay_time, clock)
        return load

    def _setup(self, records: tuple[ReplicaRecord, ...], set_clock: SetClock, decay_time: float, clock: Clock) -> None:
        if not decay_time > 0:
            raise ValueError(f"decay_time must be > 0, not {decay_time!r}")
        self.size = len(records)
        self.decay_time = decay_time
        self._clock = clock
        self._records = records
        self._set = set_clock
        # Replicas without an average yet (an upper bound: recounted while it is not 0, since
        # records carried over by discovery may get their first sample through the old set).
        self._cold = sum(r.average is None for r in records)

    def start(self, index: int) -> float:
        """An attempt on replica ``index`` begins; returns its start time (for :meth:`finish`)."""
        now = self._clock()
        record = self._records[index]
        with self._set.lock:
            record.in_flight += 1
        return now

    def finish(self, index: int, started: float) -> None:
        """The attempt that :meth:`start` returned ``started`` for ended (answered, failed or
        was cancelled): it leaves the in-flight count, and its duration is a latency sample."""
        now = self._clock()
        sample = now - started if now > started else 0.0
        record = self._records[index]
        with self._set.lock:
            if record.in_flight > 0:
                record.in_flight -= 1
            average = record.average
            if average is None:
                average = sample
            else:
                # decayed() then peak_ewma(), inlined, decay_factor() too (this runs for every attempt).
                x = (now - record.stamp) / self.decay_time
                if x < _SERIES_BELOW:
                    weight = 1.0 if x <= 0.0 else 1.0 - x * (1.0 - x * (0.5 - x * _SIXTH))
                else:
                    weight = math.exp(-x)
                average *= weight
                average = sample if sample >= average else average * weight + sample * (1.0 - weight)
            record.average = average
            record.stamp = now
            record.key = None

    def _decayed_locked(self, now: float) -> list[float | None]:
        decay_time = self.decay_time
        result: list[float | None] = []
        for r in self._records:
            average = r.average
            if average is not None:
                average *= decay_factor(now - r.stamp, decay_time)
            result.append(average)
        return result

    def scores(self) -> list[float]:
        """Every replica's load score now (a read: changes nothing)."""
        now = self._clock()
        with self._set.lock:
            return self._scores_locked(now)

    def _scores_locked(self, now: float) -> list[float]:
        return load_scores([r.in_flight for r in self._records], self._decayed_locked(now))

    def order_keys(self) -> list[float]:
        """Keys that order the replicas exactly like :meth:`scores` (an increasing function of
        them), for ``least_loaded``'s once-per-statement plan: ``ln(score) + now/decay_time``,
        which needs no exp per replica. While some replica has no average yet: the scores."""
        records = self._records
        with self._set.lock:
            if self._cold:
                self._cold = sum(r.average is None for r in records)
                if self._cold:
                    return self._scores_locked(self._clock())
            decay_time = self.decay_time
            keys = []
            in_flight = []
            for record in records:
                key = record.key
                if key is None:
                    average = record.average
                    assert average is not None  # not cold: every replica has one
                    key = record.key = (math.log(average) if average > 0 else -math.inf) + record.stamp / decay_time
                keys.append(key)
                in_flight.append(record.in_flight)
        log = math.log
        return [key if k == 0 else key + log(k + 1) for key, k in zip(keys, in_flight)]

    def snapshot(self) -> list[LoadSnapshot]:
        """Every replica's in-flight count and decayed average now (a read: changes nothing)."""
        now = self._clock()
        with self._set.lock:
            return self.snapshot_locked(now)

    def snapshot_locked(self, now: float) -> list[LoadSnapshot]:
        """:meth:`snapshot` at ``now``, the set's lock held by the caller."""
        return [LoadSnapshot(r.in_flight, a) for r, a in zip(self._records, self._decayed_locked(now))]
