"""The asyncio driver of :func:`clickhouse_lb.core.race.run_attempt`: each run a task, the statement
awaiting them with timeouts; abandoning a run cancels its task (aiohttp then closes the
connection)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from clickhouse_lb.core.events import logger
from clickhouse_lb.core.race import Abandon, AttemptSpec, Launch, Ping, Wait, run_attempt
from clickhouse_lb.core.stalls import PingReading
from clickhouse_lb.pools._leftovers import release
from clickhouse_lb.pools._liveness import stall_tolerant_run

__all__ = ["AsyncDriver"]

T = TypeVar("T")

_CLOSING: set[asyncio.Future[Any]] = set()


class AsyncDriver:
    """``call(index, query_id)``, ``ping(index, timeout)``, ``kill(index, query_id)``: as for
    :class:`~clickhouse_lb.pools._drive_sync.SyncDriver`, as coroutines."""

    def __init__(self) -> None:
        self._background: set[asyncio.Task[Any]] = set()

    async def run(
        self,
        spec: AttemptSpec,
        call: Callable[[int, str | None], Awaitable[T]],
        ping: Callable[[int, float], Awaitable[bool | PingReading]],
        kill: Callable[[int, str], Awaitable[None]],
    ) -> tuple[int, T]:
        steps = run_attempt(spec)
        launched: list[asyncio.Task[Any]] = []
        reply: Any = None
        try:
            while True:
                try:
                    command = steps.send(reply)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                reply = None
                if isinstance(command, Launch):
                    # A connect that timed out while the loop stalled is tried again (pools/_liveness.py).
                    reply = asyncio.ensure_future(stall_tolerant_run(call, command.replica, command.query_id))
                    launched.append(reply)
                elif isinstance(command, Wait):
                    await asyncio.wait(command.handles, timeout=command.timeout, return_when=asyncio.FIRST_COMPLETED)
                elif isinstance(command, Ping):
                    reply = await ping(command.replica, command.timeout)
                elif isinstance(command, Abandon):
                    self._abandon(command, kill)
        except BaseException:
            for task in launched:  # cancelled, or a failure: no run is left behind
                if not task.done():
                    task.cancel()
            raise

    def _abandon(self, command: Abandon, kill: Callable[[int, str], Awaitable[None]]) -> None:
        task: asyncio.Task[Any] = command.handle
        task.cancel()
        task.add_done_callback(_retrieve)
        if command.kill and command.query_id:
            index, query_id = command.replica, command.query_id

            async def kill_quietly() -> None:
                try:
                    await kill(index, query_id)
                except Exception as exc:
                    logger.debug("KILL QUERY %s on replica %d failed: %s", query_id, index, exc)

            background = asyncio.ensure_future(kill_quietly())
            self._background.add(background)
            background.add_done_callback(self._background.discard)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Read an abandoned task's outcome (no "exception was never retrieved" warning); close a
    stream it may have produced just before it was cancelled."""
    if task.cancelled():
        return
    release(task.exception())  # a half-read response it holds is freed now, not by the GC later
    if task.exception() is None:
        close = getattr(task.result(), "close", None)
        if callable(close):
            try:
                result = close()
                if asyncio.iscoroutine(result):
                    closing = asyncio.ensure_future(result)
                    _CLOSING.add(closing)
                    closing.add_done_callback(_CLOSING.discard)
            except Exception as exc:  # pragma: no cover - best effort (no traceback: a background thread)
                logger.debug("closing an abandoned run's result failed: %s: %s", type(exc).__name__, exc)
