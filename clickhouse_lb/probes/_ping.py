"""Ask one replica ``GET /ping`` with a short timeout, on a connection of our own (never a
statement's): the sync flavour on urllib3, the async one on aiohttp (imported only when used).

A replica answers ``200 Ok.``; anything else, or nothing within the timeout, is a failed ping.

The replication delay is read the same way, with the pool's credentials: the largest
``absolute_delay`` of the replica's replicated tables (``system.replicas``; 0 without any).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any
from urllib.parse import quote

import urllib3

from clickhouse_lb.config.liveness import LIVENESS_DEFAULTS
from clickhouse_lb.core.classify import classify
from clickhouse_lb.core.health import ProbeOutcome
from clickhouse_lb.core.stalls import Evidence, PingReading, detector
from clickhouse_lb.probes._route import Route, RoutedManagers, base_url
from clickhouse_lb.probes._stall_ping import StallAwarePinger, stall_aware_wait

_TOLERANCE = LIVENESS_DEFAULTS.stall_tolerance

__all__ = ["DELAY_QUERY", "AsyncPinger", "SyncPinger", "delay_url", "ping_once", "ping_url"]

DELAY_QUERY = "SELECT max(absolute_delay) FROM system.replicas"


def ping_url(address: str, options: Mapping[str, Any]) -> str:
    """``http(s)://host:port[/proxy_path]/ping`` for a replica address, as the pool's clients
    reach it (see :mod:`~clickhouse_lb.probes._route`)."""
    return base_url(address, options) + "/ping"


def delay_url(address: str, options: Mapping[str, Any]) -> str:
    """The URL that reads a replica's replication delay (:data:`DELAY_QUERY`)."""
    return base_url(address, options) + "/?query=" + quote(DELAY_QUERY)


def auth_headers(options: Mapping[str, Any]) -> dict[str, str]:
    """Credentials as the HTTP interface takes them (never in the URL, so never in a log)."""
    if options.get("access_token"):
        return {"Authorization": f"Bearer {options['access_token']}"}
    headers = {"X-ClickHouse-User": str(options.get("username") or "default")}
    if options.get("password"):
        headers["X-ClickHouse-Key"] = str(options["password"])
    return headers


def _delay(status: int, body: bytes) -> float:
    if status != 200:
        raise ValueError(f"HTTP {status}: {body[:120]!r}")
    return float(body.strip() or 0)


def _address(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


def _outcome(address: str, reading: PingReading) -> ProbeOutcome:
    """A ping's reading as a probe outcome; one that failed while this process stalled is
    inconclusive (not counted against the replica)."""
    evidence = detector.observe(address, reading, _TOLERANCE)
    return ProbeOutcome(reading.ok, reading.elapsed, reading.error,
                        inconclusive=evidence is Evidence.INCONCLUSIVE)


def _answered(status: int, body: bytes) -> str | None:
    """None when this is a healthy answer, else why not."""
    if status == 200 and body.startswith(b"Ok."):
        return None
    return f"/ping answered HTTP {status}: {body[:80]!r}"


class SyncPinger:
    """Pings over a small urllib3 pool (one kept-alive connection per replica)."""

    def __init__(self, options: Mapping[str, Any], timeout: float) -> None:
        self.timeout = timeout
        route = Route(options)
        self._http = RoutedManagers(route, num_pools=64, maxsize=1, retries=False)
        self._pinger = StallAwarePinger(tolerance=_TOLERANCE, route=route)
        self._headers = auth_headers(options)

    def ping(self, url: str) -> ProbeOutcome:
        address = _address(url)
        try:
            reading = self._pinger.ping(url, detector.ping_timeout(address, self.timeout))
        except Exception as exc:  # pragma: no cover - the pinger reports its failures
            return ProbeOutcome(False, 0.0, classify(exc).reason)
        return _outcome(address, reading)

    def delay(self, url: str) -> tuple[float | None, str | None]:
        """``(delay in seconds, None)``, or ``(None, why not)``."""
        try:
            response = self._http.get(url, self._headers, urllib3.Timeout(total=self.timeout))
            return _delay(response.status, response.data), None
        except Exception as exc:
            return None, classify(exc).reason

    def close(self) -> None:
        self._http.clear()
        self._pinger.close()


class AsyncPinger:
    """Pings over one aiohttp session, replication-delay reads over another; create and close it
    on the event loop that uses it.

    Two sessions, each with one connection per replica: with one session for both, a ping due
    while the replica ran its delay read (a SQL query, slow on a busy replica) queued behind it
    for the one connection, and its timeout ran out in the queue: a healthy replica's health
    probe failed with "no answer to /ping within 0.5s" (bench_stalls.py's async phase, about one
    60 s run in three), which the sync pinger, on connections of its own, never did."""

    def __init__(self, options: Mapping[str, Any], timeout: float) -> None:
        self.timeout = timeout
        self._route = Route(options)
        self._session = _session(self._route, timeout)
        self._delay_session = _session(self._route, timeout)
        self._headers = auth_headers(options)

    async def ping(self, url: str) -> ProbeOutcome:
        address = _address(url)

        once = partial(_ping_on, self._session, self._route, url)
        return _outcome(address, await stall_aware_wait(once, detector.ping_timeout(address, self.timeout),
                                                        _TOLERANCE))

    async def delay(self, url: str) -> tuple[float | None, str | None]:
        try:
            options = self._route.aiohttp_options(url)
            options["headers"].update(self._headers)
            async with self._delay_session.get(url, **options) as response:
                return _delay(response.status, await response.read()), None
        except Exception as exc:
            return None, classify(exc).reason or type(exc).__name__

    async def close(self) -> None:
        try:
            await self._session.close()
        finally:
            await self._delay_session.close()


async def _ping_on(session: Any, route: Route, url: str, limit: float) -> bool:
    """``GET /ping`` on ``session`` answered within ``limit`` seconds: True; a failure raises."""
    import aiohttp

    async with session.get(url, timeout=aiohttp.ClientTimeout(total=limit), **route.aiohttp_options(url)) as response:
        error = _answered(response.status, await response.read())
    if error is not None:
        raise ValueError(error)
    return True


async def ping_once(route: Route, url: str, limit: float) -> bool:
    """:func:`_ping_on` on an aiohttp session of its own, made and closed here: never queued
    behind another request (the async pool's liveness pings)."""
    async with _session(route, limit) as session:
        return await _ping_on(session, route, url, limit)


def _session(route: Route, timeout: float) -> Any:
    """An aiohttp session keeping one connection per replica (the pool's TLS settings; each
    request takes the rest of its way from :meth:`Route.aiohttp_options`)."""
    import aiohttp

    connector = aiohttp.TCPConnector(ssl=route.ssl_context or False, limit_per_host=1)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))
