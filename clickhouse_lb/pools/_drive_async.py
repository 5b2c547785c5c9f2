"""The asyncio driver of the attempt machine (:class:`clickhouse_lb.core.race.AttemptMachine`): each
run and each liveness check a task, the statement awaiting them with timeouts; abandoning a run
cancels its task (aiohttp then closes the connection). It decides nothing: it carries out commands."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.race import Abandon, AttemptMachine, AttemptSpec, Launch, Ping, Wait
from clickhouse_lb.core.stalls import PingReading
from clickhouse_lb.core.watch import first_wake
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
        return await self._drive(AttemptMachine(spec), [], call, ping, kill)

    async def run_planned(
        self,
        plan: StatementPlan,
        index: int,
        call: Callable[[int, str | None], Awaitable[T]],
        ping: Callable[[int, float], Awaitable[bool | PingReading]],
        kill: Callable[[int, str], Awaitable[None]],
    ) -> tuple[int, T]:
        """An attempt of a statement's plan on replica ``index``. One that is not hedged costs no
        machine (nor its spec) until its first wake-up is due, as on the sync pool's watchdog
        path: the call is awaited directly when nothing can wake it, else as a task until that
        moment; most attempts answer before it."""
        if plan.hedgeable:
            return await self.run(plan.spec(index), call, ping, kill)
        settings = plan.settings
        query_id = plan.query_id if plan.deadline.at is None else plan.run_query_id(None)()
        started = plan.clock()
        first = first_wake(started, settings.liveness, settings.timeouts.receive, plan.deadline.at)
        if first == math.inf:
            return index, await stall_tolerant_run(call, index, query_id)
        run = asyncio.ensure_future(stall_tolerant_run(call, index, query_id))
        try:
            await asyncio.wait((run,), timeout=first - started)
        except BaseException:  # cancelled: no run is left behind
            run.cancel()
            raise
        if run.done():
            return index, run.result()
        machine = AttemptMachine(plan.spec(index), running=(run, started, query_id))
        return await self._drive(machine, [run], call, ping, kill)

    async def _drive(
        self,
        machine: AttemptMachine,
        launched: list[asyncio.Future[Any]],  # runs and pings: none is left behind
        call: Callable[[int, str | None], Awaitable[T]],
        ping: Callable[[int, float], Awaitable[bool | PingReading]],
        kill: Callable[[int, str], Awaitable[None]],
    ) -> tuple[int, T]:
        try:
            for command in machine:
                if isinstance(command, Launch):
                    # A connect that timed out while the loop stalled is tried again (pools/_liveness.py).
                    machine.reply = _started(launched, stall_tolerant_run(call, command.replica, command.query_id))
                elif isinstance(command, Ping):
                    machine.reply = _started(launched, ping(command.replica, command.timeout))
                elif isinstance(command, Wait):
                    await asyncio.wait(command.handles, timeout=command.timeout, return_when=asyncio.FIRST_COMPLETED)
                elif isinstance(command, Abandon):
                    self._abandon(command, kill)
            return machine.outcome
        finally:
            for task in launched:  # a ping the answer made moot; on failure or cancellation, every run
                if not task.done():
                    task.cancel()
                    task.add_done_callback(_retrieve)

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


def _started(launched: list[asyncio.Future[Any]], work: Awaitable[Any]) -> asyncio.Future[Any]:
    """``work`` as a task, noted so that none is left behind."""
    task = asyncio.ensure_future(work)
    launched.append(task)
    return task


def _retrieve(task: asyncio.Future[Any]) -> None:
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
