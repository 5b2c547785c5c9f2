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
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, cast

__all__ = ["DEFAULT_DECAY_TIME", "LoadSnapshot", "ReplicaLoad", "decayed", "load_scores", "peak_ewma"]

Clock = Callable[[], float]

#: Seconds: the time constant of the latency average (Finagle's and Linkerd's default).
DEFAULT_DECAY_TIME = 10.0


def decayed(average: float, elapsed: float, decay_time: float) -> float:
    """``average`` after ``elapsed`` seconds without a sample (toward zero)."""
    if elapsed <= 0:
        return average
    return average * math.exp(-elapsed / decay_time)


def peak_ewma(average: float | None, sample: float, elapsed: float, decay_time: float) -> float:
    """The average after a ``sample`` taken ``elapsed`` seconds after the previous one.

    No history: the sample. Above the average: the sample (the peak). Otherwise the sample
    blended in, the older the average the more weight the sample gets."""
    if average is None or sample >= average:
        return sample
    weight = math.exp(-elapsed / decay_time) if elapsed > 0 else 1.0
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
    never held during I/O). Shared like the rest of the balancing state."""

    __slots__ = ("_averages", "_clock", "_cold", "_in_flight", "_keys", "_lock", "_stamps", "decay_time", "size")

    def __init__(self, size: int, *, decay_time: float = DEFAULT_DECAY_TIME, clock: Clock = time.monotonic) -> None:
        if not decay_time > 0:
            raise ValueError(f"decay_time must be > 0, not {decay_time!r}")
        self.size = size
        self.decay_time = decay_time
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight = [0] * size
        self._averages: list[float | None] = [None] * size
        self._stamps = [0.0] * size  # clock time of each average's last sample
        # ln(average) + stamp / decay_time: the log of the average decayed to any time t, plus
        # t / decay_time, which is the same for every replica at one t. So the order of the
        # decayed scores needs no exp per replica per statement (see order_keys). None: not
        # computed since the last sample (only least_loaded's plans read them).
        self._keys: list[float | None] = [-math.inf] * size
        self._cold = size  # replicas without an average yet

    def carried_over(self, kept: Mapping[int, int], size: int) -> ReplicaLoad:
        """A load of ``size`` replicas where replica ``old`` of this one is ``kept[old]``: its
        latency average moves with it; in-flight counts start at zero (the attempts running
        now end on this load, not the new one)."""
        new = ReplicaLoad(size, decay_time=self.decay_time, clock=self._clock)
        with self._lock:
            for old, index in kept.items():
                if self._averages[old] is not None:
                    new._averages[index] = self._averages[old]
                    new._stamps[index] = self._stamps[old]
                    new._keys[index] = self._keys[old]
                    new._cold -= 1
        return new

    def start(self, index: int) -> float:
        """An attempt on replica ``index`` begins; returns its start time (for :meth:`finish`)."""
        now = self._clock()
        with self._lock:
            self._in_flight[index] += 1
        return now

    def finish(self, index: int, started: float) -> None:
        """The attempt that :meth:`start` returned ``started`` for ended (answered, failed or
        was cancelled): it leaves the in-flight count, and its duration is a latency sample."""
        now = self._clock()
        sample = now - started if now > started else 0.0
        with self._lock:
            if self._in_flight[index] > 0:
                self._in_flight[index] -= 1
            average = self._averages[index]
            if average is None:
                self._cold -= 1
                average = sample
            else:
                # decayed() then peak_ewma(), inlined (one exp: this runs for every attempt).
                elapsed = now - self._stamps[index]
                weight = math.exp(-elapsed / self.decay_time) if elapsed > 0 else 1.0
                average *= weight
                average = sample if sample >= average else average * weight + sample * (1.0 - weight)
            self._averages[index] = average
            self._stamps[index] = now
            self._keys[index] = None

    def _decayed(self, averages: list[float | None], stamps: list[float], now: float) -> list[float | None]:
        decay_time = self.decay_time
        exp = math.exp
        return [
            None if a is None else (a * exp((stamp - now) / decay_time) if now > stamp else a)
            for a, stamp in zip(averages, stamps)
        ]

    def scores(self) -> list[float]:
        """Every replica's load score now (a read: changes nothing)."""
        now = self._clock()
        with self._lock:
            return self._scores_locked(now)

    def _scores_locked(self, now: float) -> list[float]:
        return load_scores(self._in_flight, self._decayed(self._averages, self._stamps, now))

    def order_keys(self) -> list[float]:
        """Keys that order the replicas exactly like :meth:`scores` (an increasing function of
        them), for ``least_loaded``'s once-per-statement plan: ``ln(score) + now/decay_time``,
        which needs no exp per replica. While some replica has no average yet: the scores."""
        with self._lock:
            if self._cold:
                return self._scores_locked(self._clock())
            keys = self._keys
            if None in keys:
                decay_time = self.decay_time
                for i, key in enumerate(keys):
                    if key is None:
                        average = self._averages[i]
                        assert average is not None  # not cold: every replica has one
                        keys[i] = (math.log(average) if average > 0 else -math.inf) + self._stamps[i] / decay_time
            known = cast("list[float]", keys[:])
            in_flight = self._in_flight[:]
        log = math.log
        return [key if k == 0 else key + log(k + 1) for key, k in zip(known, in_flight)]

    def snapshot(self) -> list[LoadSnapshot]:
        """Every replica's in-flight count and decayed average now (a read: changes nothing)."""
        now = self._clock()
        with self._lock:
            averages = self._decayed(self._averages, self._stamps, now)
            return [LoadSnapshot(k, a) for k, a in zip(self._in_flight, averages)]
