"""The pools' liveness pings (``/ping`` of a replica whose attempt waits), judged by
:mod:`clickhouse_lb.core.stalls`: a ping timeout adapted to the replica's usual latency (at least
the configured one), and a reading that tells a silent replica from a stalled waiter.

Sync: :class:`~clickhouse_lb.probes._stall_ping.StallAwarePinger` on connections of its own.
Async: the replica client's own ``ping``, awaited as
:func:`~clickhouse_lb.probes._stall_ping.stall_aware_wait` does on the event loop what the sync
pinger does on a socket.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from clickhouse_lb.config.liveness import LIVENESS_DEFAULTS
from clickhouse_lb.core.stalls import PingReading, detector
from clickhouse_lb.probes._stall_ping import StallAwarePinger, stall_aware_wait

__all__ = ["SyncLiveness", "async_reading"]

_TOLERANCE = LIVENESS_DEFAULTS.stall_tolerance


class SyncLiveness:
    """A sync pool's liveness pings."""

    def __init__(self) -> None:
        self._pinger = StallAwarePinger(tolerance=_TOLERANCE)

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
