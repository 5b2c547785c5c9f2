"""Background health probes, decided without I/O: when to probe which replica, and what an
outcome does to its state.

The probe worker (:mod:`clickhouse_lb.probes.workers`) only sends ``GET /ping`` and reports back;
every decision is here, driven by an injected clock so that tests need no sleeps.

* **When.** Every replica is probed every ``health_check_interval_ms`` (the sweep). A replica
  that is *suspect* (it has errors, its last attempt failed, or the probes see it down) is
  probed every ``health_check_fast_interval_ms`` instead. At most one probe per replica is in
  flight.
* **Down.** ``health_check_fall`` consecutive failed probes mark a replica down; from then on
  every failed probe counts one error against it (like a failed connection attempt on the
  server, so ``distributed_replica_max_ignored_errors`` is soon exceeded), and statements route
  away before any of them pays a timeout.
* **Re-admission.** ``health_check_rise`` consecutive successful probes, all started after the
  replica's latest error, re-admit it: its error count is cleared (slowdowns are kept) and a
  recovery event with ``reason="probe"`` is emitted. Which errors a ping may clear:

  - after an outage the probes saw (the replica was marked down): all of them, since the
    outage explains the errors counted around it;
  - otherwise only *reachability* errors (a refused or cut connection, a proxy's 502/503, a
    failed probe or ping). A count that holds an error the server answered (a replica error
    code), a timeout (alive but slow?), or an error the application recorded
    (``pool.record_error``, e.g. stale data) is **not** healed by a ping: it decays as on the
    server.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import NamedTuple, Protocol

from clickhouse_lb.config.health import HEALTH_SETTING_NAMES, HealthSettings, parse_health_settings
from clickhouse_lb.core.events import ListenerSet, ProbeEvent, ReplicaDownEvent, logger
from clickhouse_lb.core.records import ProbeRecord, ProbeState, SetClock, remap
from clickhouse_lb.core.state import Clock, HealthReading, ReplicaSetState

__all__ = [
    "HEALTH_SETTING_NAMES",
    "HealthMonitor",
    "HealthSettings",
    "HealthTarget",
    "ProbeOutcome",
    "ProbeSchedule",
    "ProbeState",
    "ProbeStatus",
    "parse_health_settings",
]


class ProbeOutcome(NamedTuple):
    """One probe's result: answered ``Ok.`` or not, in how many seconds, and why not."""

    ok: bool
    latency: float
    error: str | None = None
    #: It failed while this process stalled (see :mod:`clickhouse_lb.core.stalls`): not counted.
    inconclusive: bool = False


class Verdict(str, Enum):
    """What one probe outcome does to the replica's error count."""

    NOTHING = "nothing"
    COUNT_ERROR = "count_error"
    READMIT = "readmit"


class ProbeStatus(NamedTuple):
    """A replica's probe state for ``pool.replicas`` and ``clickhouse-lb status``."""

    probe_state: str  # a ProbeState value
    last_probe_time: float | None  # time.time() of the latest finished probe
    probe_latency: float | None  # seconds, of the latest answered probe
    last_probe_error: str | None
    delay: float | None = None  # replication delay in seconds, latest read


class ProbeSchedule:
    """Which replica to probe when, and the verdict of each outcome. Thread-safe; no I/O."""

    def __init__(
        self, size: int, settings: HealthSettings, *, clock: Clock = time.monotonic, set_clock: SetClock | None = None
    ) -> None:
        self.settings = settings
        self._clock = clock
        #: The replica set's lock (``ReplicaSetState.set_clock``): the probe records of a set are
        #: changed under the same lock as its counts and load.
        self._set = set_clock if set_clock is not None else SetClock()
        self._replicas = [ProbeRecord() for _ in range(size)]
        self._worst_delay = 0.0

    @property
    def _lock(self) -> threading.Lock:
        return self._set.lock

    def _interval(self, replica: ProbeRecord, suspect: bool) -> float:
        if suspect or replica.state is not ProbeState.UP:
            return self.settings.fast_interval
        return self.settings.interval

    def due(self, suspects: Sequence[bool], epochs: Sequence[int]) -> list[int]:
        """The replicas to probe now (each is then in flight until :meth:`finish`).
        ``epochs``: errors ever counted per replica (``ReplicaSetState.health_marks``)."""
        now = self._clock()
        chosen = []
        with self._lock:
            for i, replica in enumerate(self._replicas):
                if replica.in_flight:
                    continue
                last = replica.last_started
                if last is None or now - last >= self._interval(replica, suspects[i]):
                    replica.in_flight = True
                    replica.last_started = now
                    replica.started_epoch = epochs[i]
                    chosen.append(i)
        return chosen

    def next_wakeup(self, suspects: Sequence[bool]) -> float:
        """Seconds until some replica is due (0: now). Never more than the fast interval, so
        that a replica which becomes suspect meanwhile is probed soon."""
        now = self._clock()
        wait = self.settings.fast_interval
        with self._lock:
            for i, replica in enumerate(self._replicas):
                if replica.in_flight:
                    continue
                if replica.last_started is None:
                    return 0.0
                wait = min(wait, replica.last_started + self._interval(replica, suspects[i]) - now)
        return max(0.0, wait)

    def finish(
        self, index: int, outcome: ProbeOutcome, *, errors_count: int, epoch: int, sticky: bool, wall_time: float
    ) -> Verdict:
        """Record a finished probe; the verdict says what to do to the replica's count.
        ``errors_count``, ``epoch``, ``sticky``: the replica's count, errors ever counted, and
        whether the count holds an error a ping does not disprove, as of now."""
        settings = self.settings
        with self._lock:
            replica = self._replicas[index]
            replica.in_flight = False
            replica.last_time = wall_time
            if not outcome.ok and outcome.inconclusive:
                return Verdict.NOTHING
            if not outcome.ok:
                replica.successes = 0
                replica.failures += 1
                replica.last_error = outcome.error
                if replica.failures < settings.health_check_fall:
                    return Verdict.NOTHING
                replica.state = ProbeState.DOWN
                return Verdict.COUNT_ERROR
            replica.failures = 0
            replica.last_latency = outcome.latency
            replica.last_error = None
            if replica.streak_epoch != epoch:  # an error since the streak began: start again
                replica.successes = 0
                replica.streak_epoch = epoch
            if replica.started_epoch == epoch:  # no error was counted while it ran
                replica.successes += 1
            if replica.state is ProbeState.DOWN:
                if replica.successes < settings.health_check_rise:
                    return Verdict.NOTHING
                replica.state = ProbeState.UP
                return Verdict.READMIT
            replica.state = ProbeState.UP
            if errors_count and not sticky and replica.successes >= settings.health_check_rise:
                return Verdict.READMIT
            return Verdict.NOTHING

    # -- replication delay ------------------------------------------------------------------

    def delay_due(self) -> list[int]:
        """The replicas whose replication delay to read now (at the slower delay interval;
        never one the probes do not see up)."""
        interval = self.settings.delay_interval
        if interval is None:
            return []
        now = self._clock()
        chosen = []
        with self._lock:
            for i, replica in enumerate(self._replicas):
                if replica.delay_in_flight or replica.state is not ProbeState.UP:
                    continue
                if replica.delay_started is None or now - replica.delay_started >= interval:
                    replica.delay_in_flight = True
                    replica.delay_started = now
                    chosen.append(i)
        return chosen

    def finish_delay(self, index: int, delay: float | None) -> None:
        """A delay read finished; ``None``: it failed (the last known delay is kept: the
        liveness probes, not this, decide whether the replica is up)."""
        with self._lock:
            replica = self._replicas[index]
            replica.delay_in_flight = False
            if delay is not None:
                replica.delay = delay
                self._worst_delay = max((r.delay for r in self._replicas if r.delay is not None), default=0.0)

    def delays(self) -> list[float | None]:
        return [r.delay for r in self._replicas]

    def worst_delay(self) -> float:
        """The largest known delay (0.0 when none is known): statements skip the lag rule
        entirely while it is below the limit (one attribute read per statement)."""
        return self._worst_delay

    def is_down(self, index: int) -> bool:
        return self._replicas[index].state is ProbeState.DOWN

    def statuses(self) -> list[ProbeStatus]:
        with self._lock:
            return [
                ProbeStatus(r.state.value, r.last_time, r.last_latency, r.last_error, r.delay)
                for r in self._replicas
            ]

    def carried_over(self, kept: Mapping[int, int], size: int, set_clock: SetClock) -> ProbeSchedule:
        """The schedule of a new set of ``size`` (discovery changed it) where replica ``old``
        of this one is ``kept[old]``: its probe record (verdict, streaks, latest probe,
        replication delay) moves with it, a copy, since a probe in flight here finishes here
        (it is not in flight there); added replicas start unprobed."""
        new = ProbeSchedule(size, self.settings, clock=self._clock, set_clock=set_clock)
        with self._lock:
            new._replicas = remap([r.idle_copy() for r in self._replicas], kept, size, ProbeRecord)
        new._worst_delay = max((r.delay or 0.0 for r in new._replicas), default=0.0)
        return new

    def abandon_in_flight(self) -> None:
        """Forget probes that will never finish (their worker stopped)."""
        with self._lock:
            for replica in self._replicas:
                replica.in_flight = False
                replica.delay_in_flight = False

    def reset(self) -> None:
        """After fork: the child has none of the parent's threads, and the lock may have been
        held by one of them when the process forked (the set's lock: the counts take the new one too)."""
        self._set.lock = threading.Lock()
        for replica in self._replicas:
            replica.in_flight = False
            replica.delay_in_flight = False


class HealthTarget(Protocol):
    """What the monitor needs from the balancer."""

    addresses: tuple[str, ...]
    listeners: ListenerSet
    state: ReplicaSetState

    def suspects(self) -> list[bool]:
        """Per replica: has errors, or its latest attempt failed."""

    def error_counts(self) -> list[int]: ...

    def health_marks(self) -> tuple[list[int], list[bool]]:
        """Per replica: errors ever counted, and whether the count holds one a ping cannot disprove."""

    def health_reading(self) -> HealthReading:
        """Errors, suspects and both marks, read in one hold of the set's lock."""

    def record_error(self, index: int, reason: str, kind: str = ...) -> int: ...

    def readmit(self, index: int, reason: str) -> bool:
        """Clear the replica's error count (keep slowdowns); False when there was nothing to clear."""

    def announce_outage(self, index: int) -> bool:
        """True for the first report of the replica's current outage (WARNING), else False (INFO)."""


class BalancerGone(RuntimeError):
    """The pool (and its balancer) was garbage-collected: its probe worker ends."""


class HealthMonitor:
    """The probe schedule tied to a balancer: the drivers ask :meth:`due`, probe, and hand each
    outcome to :meth:`finish`. What it must know of the errors counted by statements and by
    the application (when the latest came, whether a ping may clear them) it reads from the
    balancing state, so that pools sharing one state (``share_state``) see the same.

    It holds its balancer weakly: a worker must not keep a dropped pool's balancer (and the
    shared state it holds) alive; once it is gone, the monitor raises :class:`BalancerGone`."""

    def __init__(self, target: HealthTarget, settings: HealthSettings, *, clock: Clock = time.monotonic) -> None:
        self._target = weakref.ref(target)
        self.settings = settings
        self.schedule = ProbeSchedule(len(target.addresses), settings, clock=clock, set_clock=target.state.set_clock)

    @classmethod
    def with_schedule(cls, target: HealthTarget, schedule: ProbeSchedule) -> HealthMonitor:
        """A monitor of ``target`` keeping ``schedule`` (one carried over by discovery)."""
        monitor = cls.__new__(cls)
        monitor._target = weakref.ref(target)
        monitor.settings = schedule.settings
        monitor.schedule = schedule
        return monitor

    @property
    def target(self) -> HealthTarget:
        target = self._target()
        if target is None:
            raise BalancerGone("the pool of these probes is gone")
        return target

    def due(self) -> list[int]:
        reading = self.target.health_reading()
        return self.schedule.due(self._suspects(reading.suspects), reading.epochs)

    def next_wakeup(self) -> float:
        return self.schedule.next_wakeup(self._suspects(self.target.health_reading().suspects))

    def _suspects(self, suspects: list[bool]) -> list[bool]:
        return [s or self.schedule.is_down(i) for i, s in enumerate(suspects)]

    def finish(self, index: int, outcome: ProbeOutcome) -> Verdict:
        target = self.target  # one strong reference for the whole decision
        address = target.addresses[index]
        reading = target.health_reading()  # count, epoch and mark from one read of the records
        was_down = self.schedule.is_down(index)
        verdict = self.schedule.finish(
            index, outcome, errors_count=reading.errors[index], epoch=reading.epochs[index],
            sticky=reading.sticky[index], wall_time=time.time(),
        )
        if outcome.ok:
            logger.debug("probe of %s answered in %.1f ms", address, outcome.latency * 1000)
        else:
            logger.debug("probe of %s failed after %.1f ms: %s", address, outcome.latency * 1000, outcome.error)
        listeners = target.listeners
        listeners.probe(ProbeEvent(address, outcome.ok, outcome.latency, outcome.error))
        if verdict is Verdict.COUNT_ERROR:
            reason = f"probe failed: {outcome.error}" if outcome.error else "probe failed"
            target.record_error(index, reason, kind="probe")
            if not was_down:
                log = logger.warning if target.announce_outage(index) else logger.info
                log("replica %s is down: %s", address, reason)
                listeners.replica_down(ReplicaDownEvent(address, reason))
        elif verdict is Verdict.READMIT:
            target.readmit(index, "probe")
        return verdict

    def statuses(self) -> list[ProbeStatus]:
        return self.schedule.statuses()

    def delay_due(self) -> list[int]:
        return self.schedule.delay_due()

    def finish_delay(self, index: int, delay: float | None, error: str | None = None) -> None:
        address = self.target.addresses[index]
        if delay is None:
            logger.debug("reading the replication delay of %s failed: %s", address, error)
        else:
            logger.debug("replication delay of %s: %g s", address, delay)
        self.schedule.finish_delay(index, delay)


def probe_statuses_off(size: int) -> list[ProbeStatus]:
    return [ProbeStatus(ProbeState.OFF.value, None, None, None)] * size
