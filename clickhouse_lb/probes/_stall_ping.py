"""``GET /ping`` that can tell a silent replica from a stalled waiter (sync, on urllib3 connections).

urllib3's ``Timeout(total=...)`` counts time this process did not run against the replica: a
thread that waited 0.8 s for the GIL between sending the request and reading the answer finds
the total spent and raises ``ReadTimeoutError (read timeout=0)`` without looking at the socket,
where the answer has been waiting all along. So the ping here sends the request on a urllib3
connection, then waits for the socket to become readable itself: when that wait ends empty and
its waiter woke up late, it looks once more without blocking (the answer may have arrived while
this process was not running). Still empty, that is evidence, not a stall: the kernel receives
while this process does not run, so the replica left the request unanswered for the whole real
time since it was sent, longer than the timeout (the reading is ``silent``). The
:class:`~clickhouse_lb.core.stalls.PingReading` it returns says how late the wait woke up and
whether the socket was seen silent; :func:`~clickhouse_lb.core.stalls.judge` decides what that proves.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from urllib3.connection import HTTPConnection
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import parse_url

from clickhouse_lb.core.stalls import PingReading, lateness
from clickhouse_lb.probes._loop_stalls import LoopStallMeter, loop_meter
from clickhouse_lb.probes._route import Route

__all__ = ["STARVED_SHARE", "StallAwarePinger", "run_delay", "stall_aware_wait", "starved"]

#: Errors that show the replica gone, whatever this process was doing (on a fresh connection:
#: on a kept-alive one a reset may only mean the server closed it while it was idle).
_HARD = (ConnectionRefusedError, ConnectionResetError, BrokenPipeError)


def _readable(sock: socket.socket, timeout: float) -> bool:
    pending = getattr(sock, "pending", None)  # TLS: bytes already decrypted, which select() cannot see
    if pending is not None and pending():
        return True
    readable, _, _ = select.select([sock], [], [], max(0.0, timeout))
    return bool(readable)


def run_delay() -> float | None:
    """Seconds this thread has spent runnable but not running, waiting for a CPU (Linux's
    ``/proc/thread-self/schedstat``; None where there is none)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


#: A late wake-up of which more than this share was spent waiting for a CPU (not for the GIL,
#: a sleep) says the machine is short of CPU: a replica sharing it (a local cluster, a sidecar)
#: may have been starved alike, and its silence is not evidence. Measured on 2 cores: a waiter
#: behind another thread's GIL holds spent 25-60% of its lateness runnable (it wakes every 5 ms
#: to ask for the GIL), one behind 4 CPU hogs 95-100%.
STARVED_SHARE = 0.75


def starved(before: float | None, late: float) -> bool:
    """The lateness of a wait that began with :func:`run_delay` ``before`` was mostly a wait for a CPU."""
    after = run_delay()
    return before is not None and after is not None and after - before > STARVED_SHARE * late


def _hard(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, _HARD):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class StallAwarePinger:
    """Pings replicas over kept-alive urllib3 connections (one idle connection per address).
    ``tolerance``: how late a wait may wake up and still count as on time; ``route``: how the
    pool's clients reach the replicas (TLS, server name, proxy; none of them without)."""

    def __init__(
        self, *, tolerance: float = 0.05, route: Route | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._route = route if route is not None else Route({})
        self._headers = {"Connection": "keep-alive", **self._route.headers}
        self.tolerance = tolerance
        self._clock = clock
        self._idle: dict[tuple[str, str, int], tuple[HTTPConnection, bool]] = {}
        self._lock = threading.Lock()

    def _connection(self, key: tuple[str, str, int], *, reuse: bool) -> tuple[HTTPConnection, bool, bool]:
        """A connection to ``key``, whether it is fresh (a kept-alive one when ``reuse``) and
        whether its requests name the whole URL (a forwarding proxy's)."""
        kept = None
        if reuse:
            with self._lock:
                kept = self._idle.pop(key, None)
        if kept is not None and kept[0].sock is not None:
            # An idle kept-alive socket that reads as ready was closed by the server (or holds
            # garbage): start afresh rather than fail a ping on it.
            if not _readable(kept[0].sock, 0):
                return kept[0], False, kept[1]
            kept[0].close()
        connection, absolute = self._route.connection(*key)
        return connection, True, absolute

    def _keep(self, key: tuple[str, str, int], connection: HTTPConnection, absolute: bool) -> None:
        with self._lock:
            previous = self._idle.get(key)
            self._idle[key] = (connection, absolute)
        if previous is not None and previous[0] is not connection:
            previous[0].close()

    def ping(self, url: str, timeout: float) -> PingReading:
        parsed = parse_url(url)
        scheme, host = parsed.scheme or "http", parsed.host or "localhost"
        port = parsed.port or (443 if scheme == "https" else 80)
        reading = self._ping_once((scheme, host, port), parsed.request_uri, timeout, reuse=True)
        if reading is None:  # a kept-alive connection the server had closed: once more, afresh
            reading = self._ping_once((scheme, host, port), parsed.request_uri, timeout, reuse=False)
        assert reading is not None
        return reading

    def _ping_once(self, key: tuple[str, str, int], path: str, timeout: float, *, reuse: bool) -> PingReading | None:
        clock = self._clock
        connection, fresh, absolute = self._connection(key, reuse=reuse)
        if absolute:
            path = f"{key[0]}://{key[1]}:{key[2]}{path}"
        connection.timeout = timeout
        start = clock()
        try:
            if connection.sock is None:
                connection.connect()
            connection.request("GET", path, headers=self._headers)
            sent = clock()
            answered, late, silent = self._await(connection, timeout, sent)
            if not answered:
                connection.close()
                silence = clock() - sent
                why = f"no answer to /ping within {timeout:g}s" if late <= self.tolerance else \
                    f"no answer to /ping within {timeout:g}s (its socket still silent after {silence:.3f}s)"
                return PingReading(False, clock() - start, timeout, late, False, why, silent=silent)
            response = connection.getresponse()
            body = response.data  # read whole (preloaded) by urllib3
            elapsed = clock() - sent
        except NewConnectionError as exc:  # (a ConnectTimeoutError too in urllib3 2: refused, unreachable)
            connection.close()
            return PingReading(False, clock() - start, timeout, 0.0, _hard(exc), f"{type(exc).__name__}: {exc}")
        except (ConnectTimeoutError, TimeoutError) as exc:
            connection.close()
            late = lateness(start + timeout, clock())
            return PingReading(False, clock() - start, timeout, late, False, f"{type(exc).__name__}: {exc}")
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            if not fresh:
                return None
            return PingReading(False, clock() - start, timeout, 0.0, _hard(exc), f"{type(exc).__name__}: {exc}")
        if response.status == 200 and body.startswith(b"Ok."):
            if response.headers.get("connection", "").lower() == "close" or connection.sock is None:
                connection.close()
            else:
                self._keep(key, connection, absolute)
            # ``late``: an answer found after a late wake-up reads as slow as this process's
            # stall (the detector does not learn a latency from it).
            return PingReading(True, elapsed, timeout, late)
        connection.close()
        return PingReading(False, elapsed, timeout, 0.0, False, f"/ping answered HTTP {response.status}: {body[:80]!r}")

    def _await(self, connection: HTTPConnection, timeout: float, sent: float) -> tuple[bool, float, bool]:
        """Wait for the answer to start; ``(answered, how late the wait woke up, silent)``.
        Silent: the socket was seen empty after the replica had at least ``timeout`` of real
        time, and it is evidence (see :func:`starved`)."""
        sock = connection.sock
        if sock is None:
            return False, 0.0, False
        planned = sent + timeout
        waiting = run_delay()
        if _readable(sock, timeout):
            return True, 0.0, False
        late = lateness(planned, self._clock())
        if late <= self.tolerance:
            return False, late, True
        # Woke up late: this process did not run for a while, the replica's did, and the kernel
        # received for us meanwhile. Look without blocking: an answer that came in the stall is
        # there; none means the replica was silent through the whole stall as well, unless the
        # stall was the machine's (then the replica may have been starved too).
        if _readable(sock, 0):
            return True, late, False
        return False, late, not starved(waiting, late)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for connection, _ in idle:
            with contextlib.suppress(Exception):
                connection.close()


#: How long an event loop must have run after a ping started for its request to be out: the
#: loop writes it within its first turns (a kept-alive connection: the first; a fresh one to a
#: LAN address: a few more, for the connect). Seconds.
_SENDING = 0.02


def _ping_task(ping: Awaitable[Any]) -> asyncio.Future[Any]:
    """The ping as a task named as the pool's own tasks are (``clickhouse-lb-...``): a probe's
    ping in flight is not a statement's attempt left running."""
    task = asyncio.ensure_future(ping)
    if isinstance(task, asyncio.Task):
        task.set_name("clickhouse-lb-ping")
    return task


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def stall_aware_wait(
    ping: Callable[[float], Awaitable[Any]], limit: float, tolerance: float, *,
    clock: Callable[[], float] = time.monotonic,
) -> PingReading:
    """Await ``ping(inner_timeout)`` (truthy: answered; raising: failed) as a :class:`PingReading`.

    On an event loop, the timer of a ping that was answered while the loop was blocked (another
    thread holding the GIL, a blocking callback) can run before the answer's callbacks do: the
    answer is in hand and the ping still times out. So the wait here is the caller's own: when it
    ends without an answer and the loop stalled during it (it woke up late, or the loop's
    heartbeat, :mod:`~clickhouse_lb.probes._loop_stalls`, ran late inside the wait), the loop is
    given ``tolerance`` more. That is the event loop's zero-timeout look at the socket: the
    kernel received while the loop did not run, and a loop that runs reads what is there at its
    next turn and hands the answer over within a few callbacks; no answer after such a wait
    that ran on time means the replica was silent the whole real time since the ping was sent,
    over ``limit`` (the reading is ``silent``: evidence). That holds only if the request was
    out before the stall: the loop sends it in its first turns, so it must have run
    :data:`_SENDING` after the ping started before it stalled (for more than ``tolerance``); a
    stall that began sooner is given one more ``limit`` instead (the request may have gone only
    when the stall ended). A failure that came in a stall (its own
    timer may have fired late) is asked once more, with one more ``limit``. The ping itself is
    given a timeout long enough for the waits. The reading's ``late`` is the stall of its last
    wait: how late it woke, or how long the loop was stalled in it, the larger."""
    start = clock()
    meter = loop_meter()
    silent = False
    waiting = run_delay()
    with meter.watching():
        began = meter.now()
        # The ping's own timeout only bounds a ping nobody waits for any more: the waits here decide.
        task = _ping_task(ping(10 * limit + 1.0))
        task.add_done_callback(_retrieve)  # whatever happens to this wait, no "never retrieved" later
        try:
            done, late = await _wait(task, limit, meter, clock)
            if not done and late <= tolerance:
                silent = True  # the loop ran the whole wait: nothing came
            elif not done:
                # Stalled without an answer: let the loop read what the kernel holds for it (a
                # request that may have been sent only after the stall: one more timeout).
                sent_before = meter.ran_before_stalling(began, tolerance) >= _SENDING
                stall = late
                done, late = await _wait(task, tolerance if sent_before else limit, meter, clock)
                silent = not done and late <= tolerance and not starved(waiting, stall)
            elif late > tolerance and not (task.exception() is None and task.result()):
                # A failure that came late: its own timer may have fired in the stall. Once more.
                task = _ping_task(ping(10 * limit + 1.0))
                task.add_done_callback(_retrieve)
                done, late = await _wait(task, limit, meter, clock)
                silent = not done and late <= tolerance
        finally:
            if not task.done():
                task.cancel()
    elapsed = clock() - start
    if not done:
        return PingReading(False, elapsed, limit, late, False, f"no answer to /ping within {limit:g}s", silent)
    exc = task.exception()
    if exc is not None:
        return PingReading(False, elapsed, limit, late, _hard(exc), f"{type(exc).__name__}: {exc}")
    answered = bool(task.result())
    return PingReading(answered, elapsed, limit, late, False, None if answered else "/ping failed")


async def _wait(task: asyncio.Future[Any], limit: float, meter: LoopStallMeter,
                clock: Callable[[], float]) -> tuple[bool, float]:
    """Wait up to ``limit`` for ``task``: ``(done, how stalled the wait was)``."""
    since = meter.now()
    planned = clock() + limit
    done, _ = await asyncio.wait({task}, timeout=limit)
    return bool(done), max(lateness(planned, clock()), meter.stalled(since))
