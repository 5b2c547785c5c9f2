"""How long the event loop did not run: a heartbeat on the loop, beating while someone asks.

An event loop that another thread starves of the GIL (a ``sorted()`` of a few million floats
holds it most of a second), or that one of its own callbacks blocks, runs its timers late; a
timeout it arms (aiohttp's connect timeout, a ping's wait) can then fire after every step of
the I/O it guards was delayed, and the replica is blamed for the loop's stall. The sync pinger
can look at its socket once more after a late wake-up; on the loop the I/O is many callbacks
deep, so the loop measures its own stalls instead: while a statement's attempt or a ping waits
(:meth:`LoopStallMeter.watching`), a beat every :data:`TICK` seconds records how late it ran
(:class:`~clickhouse_lb.core.stalls.StallLog`), and :meth:`LoopStallMeter.stalled` says how much
of a window the loop spent stalled. With nothing watched, nothing beats.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable, Iterator

from clickhouse_lb.core.stalls import StallLog

__all__ = ["TICK", "LoopStallMeter", "loop_meter"]

#: Seconds between two beats: a stall longer than this plus ``StallLog.MINIMUM`` is always seen
#: (a beat due inside it runs late).
TICK = 0.02


class LoopStallMeter:
    """The heartbeat of one event loop (create and use it on that loop)."""

    __slots__ = ("__weakref__", "_clock", "_handle", "_loop", "_planned", "_tick", "_watchers", "log")

    def __init__(self, loop: asyncio.AbstractEventLoop, *, tick: float = TICK,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._loop = weakref.ref(loop)  # the registry below maps the loop to this meter: no cycle
        self._tick = tick
        self._clock = clock
        self._watchers = 0
        self._handle: asyncio.TimerHandle | None = None
        self._planned = float("inf")
        self.log = StallLog()

    def now(self) -> float:
        return self._clock()

    @contextlib.contextmanager
    def watching(self) -> Iterator[float]:
        """Beat while the block runs; yields the time it started (a window's start)."""
        self._watchers += 1
        if self._handle is None:
            self._schedule(self._clock())
        try:
            yield self._clock()
        finally:
            self._watchers -= 1  # the next beat stops the heartbeat when nobody watches

    def stalled(self, since: float) -> float:
        """Seconds the loop was stalled from ``since`` to now, a stall still going on (a beat
        overdue, not run yet: its callback is queued behind the caller's) included."""
        now = self._clock()
        total = self.log.stalled(since, now)
        if now - self._planned > self.log.minimum:
            total += now - max(self._planned, since)
        return total

    def ran_before_stalling(self, since: float, longer_than: float) -> float:
        """Seconds the loop ran from ``since`` until it first stalled for more than
        ``longer_than`` (a stall still going on included; until now when it has not): the
        time it had, stalls shorter than that (a loaded machine's CPU slices) taken off."""
        now = self._clock()
        first = min(now, self.log.first_stall(since, longer_than))
        if now - max(self._planned, since) > longer_than:
            first = min(first, max(self._planned, since))
        return max(0.0, first - since - self.log.stalled(since, first))

    def _schedule(self, now: float) -> None:
        loop = self._loop()
        if loop is None or loop.is_closed():
            self._handle = None
            self._planned = float("inf")
            return
        self._planned = now + self._tick
        self._handle = loop.call_later(self._tick, self._beat)

    def _beat(self) -> None:
        now = self._clock()
        self.log.record(self._planned, now)
        if self._watchers > 0:
            self._schedule(now)
        else:
            self._handle = None
            self._planned = float("inf")


_METERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopStallMeter] = weakref.WeakKeyDictionary()


def loop_meter() -> LoopStallMeter:
    """The running loop's meter (one per loop, forgotten with the loop)."""
    loop = asyncio.get_running_loop()
    meter = _METERS.get(loop)
    if meter is None:
        meter = _METERS[loop] = LoopStallMeter(loop)
    return meter
