"""The sync pool's cheap path for an attempt that is not hedged: the statement runs on the
caller's own thread, and one watchdog thread per pool keeps the waits every running attempt's
:class:`~clickhouse_lb.core.watch.AttemptWatch` asks for (liveness checks, the receive timeout, the
deadline). To abandon an attempt the watchdog shuts its connections down
(:class:`~clickhouse_lb.pools._transport.AttemptConnections`): the caller's blocked read fails at once
and the caller raises the watchdog's verdict.

No thread hand-off per statement (that costs more than the pool's whole bookkeeping); the
watchdog only works for statements that outlive ``liveness_check_after_ms``. Hedged reads need
two runs at once and go through :class:`~clickhouse_lb.pools._drive_sync.SyncDriver`; so does a pool
whose connections cannot be shut down from outside (no abandonable transport).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.race import AttemptSpec
from clickhouse_lb.core.stalls import PingReading, read_check
from clickhouse_lb.core.watch import AttemptWatch, Wake
from clickhouse_lb.errors import AttemptAbandonedError
from clickhouse_lb.pools._leftovers import release
from clickhouse_lb.pools._threads import check_executor
from clickhouse_lb.pools._transport import AttemptConnections, quiet_transport

__all__ = ["Watchdog"]

T = TypeVar("T")


class _Watched(AttemptConnections):
    """One attempt under watch, and the connections it uses (one object per attempt: this runs
    for every statement). Its :class:`~clickhouse_lb.core.watch.AttemptWatch` is built by the
    watchdog thread when it first looks at the attempt (most attempts end before that)."""

    __slots__ = ("_source", "_watch", "checking", "first", "index", "planned", "query_id", "started", "verdict")

    def __init__(
        self, source: AttemptSpec | StatementPlan, index: int, query_id: str | None, started: float, *,
        first: float, connect_timeout: float | None,
    ) -> None:
        self._source = source
        self._watch: AttemptWatch | None = None
        self.index = index
        self.query_id = query_id
        self.started = started
        #: When its first wake-up is due.
        self.first = first
        AttemptConnections.__init__(self, connect_timeout)  # (no super() object: one per attempt)
        self.verdict: AttemptAbandonedError | None = None
        self.checking = False
        self.planned = first  # when its next wake-up is due (a check then late means a stall)

    @classmethod
    def of_spec(cls, spec: AttemptSpec, query_id: str | None, started: float) -> _Watched:
        """The entry of an attempt run from its spec, starting at ``started``."""
        watch = spec.watch(spec.first, started)
        entry = cls(spec, spec.first, query_id, started, first=watch.next_wake(started)[1] + started,
                    connect_timeout=spec.connect_timeout)
        entry._watch = watch
        return entry

    @property
    def watch(self) -> AttemptWatch:
        watch = self._watch
        if watch is None:
            source = self._source
            if isinstance(source, AttemptSpec):
                watch = source.watch(self.index, self.started)
            else:
                watch = source.watch(self.started)
            self._watch = watch
        return watch

    @property
    def untouched(self) -> bool:
        """Its watch is not built yet: nothing happened to it since it started (its first
        wake-up is ``first``)."""
        return self._watch is None

    @property
    def address(self) -> str:
        source = self._source
        return source.address(self.index) if isinstance(source, AttemptSpec) else source.addresses[self.index]

    @property
    def write(self) -> bool:
        return self._source.write


class Watchdog:
    """Watches the attempts running on their callers' threads. ``ping(index, timeout)``: a
    liveness check; ``kill(index, query_id)``: a best-effort KILL QUERY."""

    def __init__(
        self,
        ping: Callable[[int, float], bool | PingReading],
        kill: Callable[[int, str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        idle_exit: float = 10.0,
    ) -> None:
        self._ping = ping
        self._kill = kill
        self._clock = clock
        self._watched: set[_Watched] = set()
        # The condition's own lock, taken directly on the per-attempt path (cheaper than the
        # condition's Python-level context manager).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._wakes_at = float("inf")  # when the watchdog thread means to wake up next
        self._checks = check_executor()
        self._idle_exit = idle_exit

    def run(self, spec: AttemptSpec, call: Callable[[int, str | None], T]) -> tuple[int, T]:
        """Run ``call`` on this thread under watch; raises the watchdog's verdict when it
        abandoned the attempt, the call's own error otherwise."""
        query_id = spec.query_id()
        started = self._clock()
        entry = _Watched.of_spec(spec, query_id, started)
        result = self._watched_call(entry, call)
        spec.on_latency(spec.first, self._clock() - started)
        return spec.first, result

    def run_planned(self, plan: StatementPlan, index: int, call: Callable[[int, str | None], T]) -> T:
        """:meth:`run` for an attempt of a statement's plan (not hedged) on replica ``index``,
        without building its :class:`~clickhouse_lb.core.race.AttemptSpec`: the per-statement path."""
        if plan.deadline.at is None:  # the usual statement: no query id of the pool's, nothing to cut
            settings = plan.settings
            query_id, connect_timeout = plan.query_id, settings.timeouts.connect
            started = self._clock()
            first = started + settings.first_wake_after  # plan.first_wake(started), inlined
        else:
            query_id, connect_timeout = plan.run_query_id(None)(), plan.connect_timeout()
            started = self._clock()
            first = plan.first_wake(started)
        entry = _Watched(plan, index, query_id, started, first=first, connect_timeout=connect_timeout)
        return self._watched_call(entry, call)

    def _watched_call(self, entry: _Watched, call: Callable[[int, str | None], T]) -> T:
        # An attempt with nothing to wait for (no liveness check, timeout or deadline) is not
        # registered: the watchdog would never act on it.
        watched = entry.first != math.inf
        if watched:
            self._add(entry)
        try:
            with entry:
                return call(entry.index, entry.query_id)  # even when abandoned a moment too late: the answer is whole
        except Exception as exc:
            verdict = entry.verdict
            if verdict is None:
                raise
            release(exc)  # the abandoned response it holds is freed now, not by the GC later
            del exc
        finally:
            if watched:
                with self._lock:
                    self._watched.discard(entry)
        raise verdict  # outside the handler: not chained to the broken connection's error

    # -- the watchdog thread -----------------------------------------------------------------

    def _add(self, entry: _Watched) -> None:
        first = entry.first
        with self._lock:
            self._watched.add(entry)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._loop, name="clickhouse-lb-watchdog", daemon=True)
                self._thread.start()
            # Wake the watchdog only when this attempt needs it sooner than it means to wake up
            # anyway (a thread switch per statement would cost more than the statement's bookkeeping).
            if first < self._wakes_at:
                self._wakes_at = first
                self._cond.notify()

    def _remove(self, entry: _Watched) -> None:
        with self._lock:
            self._watched.discard(entry)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = self._clock()
                due: list[tuple[_Watched, Wake]] = []
                sleep = None
                for entry in self._watched:
                    if entry.verdict is not None:
                        continue
                    if entry.checking:  # a ping is out: only the deadline cannot wait for it
                        deadline = entry.watch.deadline_at
                        if deadline is not None:
                            if deadline <= now:
                                due.append((entry, Wake.DEADLINE))
                            elif sleep is None or deadline - now < sleep:
                                sleep = deadline - now
                        continue
                    if entry.untouched and entry.first > now:
                        delay = entry.first - now  # not due yet: its watch is built when it is
                    else:
                        wake, delay = entry.watch.next_wake(now)
                        if delay <= 0:
                            due.append((entry, wake))
                            continue
                        entry.planned = now + delay  # to tell, when it is due, whether this thread ran late
                    if sleep is None or delay < sleep:
                        sleep = delay
                if not due:
                    if not self._watched:
                        # Nothing to watch: wait a while, then end (a pool nobody closes must not
                        # keep a thread); the next attempt starts a new one.
                        self._wakes_at = float("inf")
                        self._cond.wait(self._idle_exit)
                        if not self._watched:
                            self._thread = None
                            return
                        continue
                    self._wakes_at = float("inf") if sleep is None else now + sleep
                    self._cond.wait(sleep)
                    continue
                self._wakes_at = now
                for entry, wake in due:
                    if wake is Wake.CHECK:
                        entry.checking = True
            for entry, wake in due:
                self._act(entry, wake, now)

    def _act(self, entry: _Watched, wake: Wake, now: float) -> None:
        if wake is Wake.CHECK:
            timeout = entry.watch.ping_timeout(now)
            self._checks.submit(self._check, entry, timeout, now)
        elif wake is Wake.DEADLINE:
            self._abandon(entry, "deadline", f"failover_timeout ran out after {now - entry.started:.3f}s", kill=True)
        elif wake is Wake.RECEIVE_TIMEOUT:
            limit = (entry.watch.receive_at or entry.started) - entry.started
            self._abandon(entry, "receive_timeout", f"timed out: no answer within {limit:g}s", kill=True)
        else:  # HEDGE: not hedged here
            entry.watch.hedged()

    def _check(self, entry: _Watched, timeout: float, due: float) -> None:
        try:
            answer: bool | PingReading = self._ping(entry.index, timeout)
        except Exception:
            answer = False
        pinged = self._clock()
        check = read_check(answer, woke_late=due - entry.planned, elapsed=pinged - due, timeout=timeout,
                           tolerance=entry.watch.liveness.stall_tolerance)
        with self._cond:
            entry.checking = False
            entry.planned = pinged
            hung = entry.watch.checked(check.alive, pinged, stalled=check.stalled, hard=check.hard)
            self._cond.notify()
        if hung:
            self._abandon(entry, "hung", f"no answer to /ping within {entry.watch.liveness.ping_timeout:g}s "
                                         f"after waiting {due - entry.started:.3f}s", kill=False)

    def _abandon(self, entry: _Watched, kind: str, detail: str, *, kill: bool) -> None:
        if entry.verdict is not None:
            return  # already abandoned (the deadline came while its ping was out)
        entry.verdict = AttemptAbandonedError(entry.address, kind, detail, write=entry.write)
        entry.abandon()
        if kill and entry.query_id:
            self._checks.submit(self._kill_quietly, entry.index, entry.query_id)

    def _kill_quietly(self, index: int, query_id: str) -> None:
        try:
            with quiet_transport():
                self._kill(index, query_id)
        except Exception as exc:
            logger.debug("KILL QUERY %s on replica %d failed: %s", query_id, index, exc)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
