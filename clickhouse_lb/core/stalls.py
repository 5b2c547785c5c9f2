"""What a failed ping proves (pure): the judgement shared by health probes, liveness checks and
hedging, so that this process's own stalls are never blamed on a replica.

A ping is sent, then waited for. When the wait ends without an answer, two different things may
have happened:

* the replica did not answer: evidence against it;
* this process did not run: a thread of the application held the GIL (a ``sorted()`` of a few
  million floats holds it for most of a second), the garbage collector ran, the machine's CPUs
  were taken by other processes, the VM was paused. The waiter then wakes up late, and a deadline
  it computed before the stall has passed while the replica's answer sat in the socket.

So every ping reports a :class:`PingReading`: whether it was answered, how long it took, the
timeout it was given, how late its waiter woke up compared with when it planned to
(``late``), whether the failure was a hard one (connection refused or reset: the replica,
or its host, is shown gone, whatever this process was doing), and whether the ping's socket
was looked at after the replica had had the whole timeout and held no byte of answer
(``silent``). The kernel receives while this process is stalled: a waiter that woke up late
and finds its socket still empty has real evidence, the replica was silent for the whole real
elapsed time, not only the part this process was awake for. Only when the answer was already
waiting (or the waiter cannot tell) is the lateness this process's own. :func:`judge` turns
the reading into :class:`Evidence`: a timeout whose waiter woke up more than ``tolerance``
late is ``INCONCLUSIVE`` (ask again), never ``DOWN``, unless it was ``silent``.

"Slow" is judged against what that replica normally answers (:class:`LatencyHistory`, in the
spirit of the phi-accrual failure detector of Hayashibara et al.: the timeout is the latency that
the replica's recent pings exceed with probability ``10**-phi``), floored at the configured ping
timeout (``liveness_check_ping_timeout_ms``, 150 ms by default): a replica behind a long network
path gets the time it always needs, a local one is still caught after the configured timeout.
A replica with too short a history (under ``WARMUP`` answered pings: a cold start, as
phi-accrual needs a few samples) is given the cap (4 times the floor) until it has answered
once, then a margin over its slowest answer: a just-started replica answering its first pings
slowly (measured: over 150 ms, 20 statements arriving at once beside 3 CPU hogs) must not be
called hung before the detector knows what it normally answers, and one that answered in
milliseconds is held to the floor from its first answer.
The model is exponential above the median (as Cassandra's phi detector models intervals), its
scale read from the upper quartile: a saturated replica answers ``/ping`` late but answers (p50
13 ms, p90 73 ms, p99 0.3 s measured on a LocalCluster replica under 12 CPU-heavy reads), and a
normal model of those answers stays at the floor, calling that replica hung about once in 40
pings; a stopped replica does not answer at all, however long it is given.
"""

from __future__ import annotations

import math
from collections import deque
from enum import Enum
from statistics import median
from typing import NamedTuple

__all__ = ["Check", "Evidence", "LatencyHistory", "PingReading", "ReplicaDetector", "StallLog", "detector", "judge",
           "lateness", "read_check"]


class Evidence(str, Enum):
    ALIVE = "alive"
    DOWN = "down"
    #: The ping failed while this process stalled: it says nothing about the replica.
    INCONCLUSIVE = "inconclusive"


class PingReading(NamedTuple):
    """One ping, as its waiter saw it. Seconds."""

    ok: bool
    elapsed: float
    timeout: float
    #: How much later than planned the waiter woke up (its own stall; 0: on time).
    late: float = 0.0
    #: Refused or reset: the replica is shown gone (no stall explains that away).
    hard: bool = False
    error: str | None = None
    #: The ping's socket was looked at after the replica had had the whole timeout (real time)
    #: and held no byte of answer: evidence, however late the waiter woke (see the module's doc).
    silent: bool = False


def lateness(planned: float, woke: float) -> float:
    """How late a waiter that planned to wake at ``planned`` woke at ``woke`` (never negative)."""
    return max(0.0, woke - planned)


class StallLog:
    """When a waiter (an event loop) did not run, from the readings of a heartbeat it runs: a
    beat planned at ``planned`` that ran at ``woke`` shows the loop stalled in between (another
    thread held the GIL, a callback blocked, the process was not scheduled).

    A wake-up's lateness alone misses stalls: an event loop starved between two holds of the
    GIL may still run a timer on time, after every step of the I/O it waited for was delayed;
    the heartbeat sees each of those stalls. :meth:`stalled` answers how much of a time window
    the loop spent stalled. Readings come in time order (one beat at a time)."""

    __slots__ = ("_stalls", "minimum")

    #: A beat less late than this is not a stall that explains a timeout: the CPU time slices
    #: of a loaded machine (3-30 ms each; measured with 4 CPU hogs on 2 cores: a beat's median
    #: lateness 8 ms) leave the loop running most of any window, and the loop reads an answer
    #: in the first slice it gets. Seconds.
    MINIMUM = 0.02
    #: Stalls kept (the oldest are forgotten: windows are a few seconds long).
    SIZE = 1024

    def __init__(self, minimum: float = MINIMUM) -> None:
        self.minimum = minimum
        self._stalls: deque[tuple[float, float]] = deque(maxlen=self.SIZE)

    def record(self, planned: float, woke: float) -> None:
        if woke - planned > self.minimum:
            self._stalls.append((planned, woke))

    def first_stall(self, start: float, longer_than: float = 0.0) -> float:
        """When the loop first stalled at or after ``start`` for more than ``longer_than``
        seconds (inf: it has not, as far as logged)."""
        first = math.inf
        for planned, woke in reversed(self._stalls):
            if woke <= start:
                break
            if woke - max(planned, start) > longer_than:
                first = max(planned, start)
        return first

    def stalled(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` the loop was stalled."""
        total = 0.0
        for planned, woke in reversed(self._stalls):
            if woke <= start:
                break
            total += max(0.0, min(woke, end) - max(planned, start))
        return total


def judge(reading: PingReading, tolerance: float) -> Evidence:
    """What the reading proves about the replica. ``tolerance``: how late a waiter may wake up
    and still count as having run on time (``liveness_stall_tolerance``)."""
    if reading.ok:
        return Evidence.ALIVE
    if reading.hard or reading.silent:
        return Evidence.DOWN
    if reading.late > tolerance:
        return Evidence.INCONCLUSIVE
    return Evidence.DOWN


class LatencyHistory:
    """The recent answered-ping latencies of one replica, and the timeout they suggest.

    Robust statistics (median and median absolute deviation of the last ``WINDOW`` readings),
    not a mean: a ping whose waiter stalled reads high, and a few of those must not teach the
    detector that the replica is slow. A latency longer than the timeout the ping had is never
    recorded (the kernel would have timed the wait out first: only a stall of this process can
    read that long). Until ``WARMUP`` readings exist a cold start applies (see the module's doc):
    the cap without any reading, ``COLD_MARGIN`` times the slowest reading with a few (never
    under the floor nor over the cap; the floor when no cap is given)."""

    __slots__ = ("_samples",)

    WINDOW = 32
    WARMUP = 5
    #: Before ``WARMUP`` readings: how many times its slowest answer a replica is given.
    COLD_MARGIN = 4.0
    #: The spread never counts as less than this (a replica that always answers in exactly
    #: 1 ms must not make 1.5 ms suspicious). Seconds.
    MIN_DEVIATION = 0.005

    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=self.WINDOW)

    @property
    def count(self) -> int:
        return len(self._samples)

    def record(self, latency: float, timeout: float = math.inf) -> None:
        if math.isfinite(latency) and 0 <= latency <= timeout:
            self._samples.append(latency)

    def timeout(self, floor: float, *, phi: float = 8.0, cap: float | None = None) -> float:
        """The ping timeout for this replica: the latency its pings exceed with probability
        ``10**-phi``, never under ``floor`` nor (when given) over ``cap``.

        Ping latencies are skewed right with a long tail (a replica busy with CPU-heavy queries
        answers most pings in milliseconds and some in tenths of a second), so above the median
        they are modelled as exponential, P(latency > median + x) = exp(-x / scale) / 2, with
        the scale read from the upper quartile (``(p75 - median) / ln 2``): quantiles, not the
        mean or the largest reading, so that up to a quarter of readings inflated by this
        process's own stalls cannot stretch the timeout."""
        samples = sorted(self._samples)
        if len(samples) < self.WARMUP:
            if cap is None:
                return floor
            if not samples:
                return max(floor, cap)
            # Too few for the quantiles: the slowest answer seen, with a margin (a replica that
            # answered its first pings in milliseconds is held to the floor at once).
            return max(floor, min(cap, self.COLD_MARGIN * samples[-1]))
        middle = median(samples)
        scale = max(self.MIN_DEVIATION, (_quantile(samples, 0.75) - middle) / math.log(2))
        limit = max(floor, middle + scale * math.log(0.5 * 10.0**phi))
        return limit if cap is None else min(cap, limit)


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered`` (linear between neighbours)."""
    position = (len(ordered) - 1) * q
    low = int(position)
    if low + 1 >= len(ordered):
        return ordered[-1]
    return ordered[low] + (ordered[low + 1] - ordered[low]) * (position - low)


class ReplicaDetector:
    """The latency histories of a pool's replicas, by address, and the judgement of their pings.

    Shared by a pool's probes and liveness checks. Readings come from several threads: each
    update is a handful of float assignments, and a reading lost to a race only makes a history
    one reading shorter, so no lock is taken."""

    __slots__ = ("_cap_factor", "_histories")

    def __init__(self, *, cap_factor: float = 4.0) -> None:
        self._cap_factor = cap_factor
        self._histories: dict[str, LatencyHistory] = {}

    def history(self, address: str) -> LatencyHistory:
        history = self._histories.get(address)
        if history is None:
            history = self._histories.setdefault(address, LatencyHistory())
        return history

    def ping_timeout(self, address: str, floor: float) -> float:
        """The timeout to ping ``address`` with: adapted to its history, at least ``floor``, at
        most ``cap_factor`` times it (a replica that became slow must still be caught)."""
        return self.history(address).timeout(floor, cap=floor * self._cap_factor)

    def observe(self, address: str, reading: PingReading, tolerance: float) -> Evidence:
        """Judge a ping of ``address`` (see :func:`judge`); an answered one joins its history,
        unless its waiter woke up late (its latency is this process's stall as much as the
        replica's)."""
        evidence = judge(reading, tolerance)
        if evidence is Evidence.ALIVE and reading.late <= tolerance:
            self.history(address).record(reading.elapsed, reading.timeout)
        return evidence


class Check(NamedTuple):
    """A liveness check as :class:`~clickhouse_lb.core.watch.AttemptWatch` records it."""

    alive: bool
    #: This process stalled around the check: a failure proves nothing.
    stalled: bool
    #: The replica is shown gone (refused, reset): no stall explains that away.
    hard: bool


def read_check(answer: bool | PingReading, *, woke_late: float, elapsed: float, timeout: float,
               tolerance: float, retry_safe: bool = True) -> Check:
    """Judge a liveness check. ``answer``: what the ping returned (a bare bool from a ping that
    cannot tell more); ``woke_late``: how late the check itself started compared with when it
    was due; ``elapsed``: how long the ping took, seen from the check; ``retry_safe``: the
    attempt's statement may go again elsewhere (a read), else a write."""
    if isinstance(answer, PingReading):
        evidence = judge(answer, tolerance)
        if retry_safe:
            # A read: a silent socket is evidence however late the check started or its waiter
            # woke (the replica had the whole timeout in real time), so a GIL hold over a
            # hung replica costs about one hold, not a hold and a check more. A check that
            # started late without that evidence is discounted: this process not running on
            # time says the machine may be overloaded, and a replica sharing it may be
            # starved alike (measured: a healthy LocalCluster replica left a ping unanswered
            # 150 ms at load 19, the check having woken 85 ms late).
            stalled = evidence is Evidence.INCONCLUSIVE or (woke_late > tolerance and not answer.silent)
        else:
            # A write cannot fail over: only checks that ran on time count, silent or not
            # (its verdict is an error the user sees; waiting costs only latency).
            stalled = woke_late > tolerance or answer.late > tolerance or evidence is Evidence.INCONCLUSIVE
        return Check(answer.ok, stalled and not answer.hard, answer.hard and not answer.ok)
    # A bare bool: the ping's timeout firing late is the only sign of a stall it leaves.
    stalled = woke_late > tolerance or elapsed > timeout + tolerance
    return Check(bool(answer), stalled, False)


#: The latency histories every pool of this process shares: a replica's normal ping latency is
#: a property of the replica and the path to it, not of the pool that measured it.
detector = ReplicaDetector()
