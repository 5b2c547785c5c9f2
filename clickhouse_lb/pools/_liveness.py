"""The pools' liveness pings (``/ping`` of a replica whose attempt waits), judged by
:mod:`clickhouse_lb.core.stalls`: a ping timeout adapted to the replica's usual latency (at least
the configured one), and a reading that tells a silent replica from a stalled waiter.

Sync: :class:`~clickhouse_lb.probes._stall_ping.StallAwarePinger` on connections of its own.
Async: :func:`~clickhouse_lb.probes._ping.ping_once`, on a session of its own (the client's
session queues requests beyond its per-host connection limit, behind the running statements;
the client's own ``ping`` only for a client factory of the caller's), awaited as
:func:`~clickhouse_lb.probes._stall_ping.stall_aware_wait` does on the event loop what the sync
pinger does on a socket.

Async statements: aiohttp's connect timeout is a timer on the event loop. When the loop stalls
(another thread holds the GIL back to back), the timer fires after each step of a connect to a
healthy replica was delayed, and the replica would be blamed. :func:`stall_tolerant_run`
re-runs such a run on the same replica when the loop's heartbeat
(:mod:`~clickhouse_lb.probes._loop_stalls`) shows it stalled during the failed connect: the
request was never sent, so even a write may go again. A sync connect cannot fail that way (the
kernel times it, and the answer is in hand when the thread gets the GIL back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from clickhouse_lb.config.liveness import LIVENESS_DEFAULTS
from clickhouse_lb.core.classify import classify
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.stalls import PingReading, detector
from clickhouse_lb.probes._loop_stalls import loop_meter
from clickhouse_lb.probes._route import Route
from clickhouse_lb.probes._stall_ping import StallAwarePinger, stall_aware_wait

__all__ = ["STALLED_CONNECT_RETRIES", "SyncLiveness", "async_reading", "connect_timed_out", "stall_tolerant_run"]

T = TypeVar("T")

_TOLERANCE = LIVENESS_DEFAULTS.stall_tolerance

#: Re-runs of one run after connects that timed out while the loop stalled. Bounded: a replica
#: that is really black-holed, in a process stalled all the time, still fails over (after
#: about this many connect timeouts more; until then the attempt's own receive timeout and
#: the statement's deadline bound it, as they bound any run).
STALLED_CONNECT_RETRIES = 8


class SyncLiveness:
    """A sync pool's liveness pings, reaching the replicas as the clients with ``options`` do."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self._pinger = StallAwarePinger(tolerance=_TOLERANCE, route=Route(options or {}))

    def ping(self, url: str, address: str, timeout: float) -> PingReading:
        reading = self._pinger.ping(url, detector.ping_timeout(address, timeout))
        detector.observe(address, reading, _TOLERANCE)
        return reading

    def close(self) -> None:
        self._pinger.close()


async def async_reading(ping: Callable[[float], Awaitable[Any]], address: str, timeout: float) -> PingReading:
    """Await ``ping(inner_timeout)`` (a replica client's ``ping``: True when answered) as a
    reading (see :func:`~clickhouse_lb.probes._stall_ping.stall_aware_wait`), with the timeout
    adapted to the replica's history."""
    reading = await stall_aware_wait(ping, detector.ping_timeout(address, timeout), _TOLERANCE)
    detector.observe(address, reading, _TOLERANCE)
    return reading


def connect_timed_out(exc: BaseException) -> bool:
    """The run failed because a connect timed out (never sent; not refused, not reset)."""
    if classify(exc).kind != "connect":
        return False
    seen: BaseException | None = exc
    timed_out = False
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, (ConnectionRefusedError, ConnectionResetError)):
            return False
        timed_out = timed_out or isinstance(seen, (TimeoutError, asyncio.CancelledError))
        seen = seen.__cause__ or seen.__context__
    return timed_out


async def stall_tolerant_run(call: Callable[[int, str | None], Awaitable[T]], index: int, query_id: str | None) -> T:
    """``call(index, query_id)``, run again on the same replica after a connect that timed out
    while this event loop stalled (more than ``stall_tolerance`` of the failed run's time):
    that timeout proves nothing about the replica."""
    meter = loop_meter()
    with meter.watching():
        retries = 0
        while True:
            since = meter.now()
            try:
                return await call(index, query_id)
            except Exception as exc:
                if retries >= STALLED_CONNECT_RETRIES or not connect_timed_out(exc):
                    raise
                stalled = meter.stalled(since)
                if stalled <= _TOLERANCE:
                    raise
                retries += 1
                logger.debug("connect to replica %d timed out while this event loop stalled %.3fs: trying again "
                             "(%d/%d): %s: %s", index, stalled, retries, STALLED_CONNECT_RETRIES,
                             type(exc).__name__, exc)
