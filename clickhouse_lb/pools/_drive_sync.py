"""The sync driver of the attempt machine (:class:`clickhouse_lb.core.race.AttemptMachine`): each run
on a worker thread, each liveness check on a check thread, the statement's thread waiting with
timeouts (so it can stop waiting at any moment). It decides nothing: it carries out commands."""

from __future__ import annotations

import concurrent.futures as cf
import math
from collections.abc import Callable
from typing import Any, TypeVar

from clickhouse_lb.core._driver_logs import handled_by_pool
from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.race import Abandon, AttemptMachine, AttemptSpec, Launch, Ping, Wait
from clickhouse_lb.core.stalls import PingReading
from clickhouse_lb.core.watch import first_wake
from clickhouse_lb.pools._leftovers import release
from clickhouse_lb.pools._threads import attempt_executor, check_executor
from clickhouse_lb.pools._transport import AttemptConnections, quiet_transport

__all__ = ["SyncDriver", "ThreadRun", "abandon_run", "kill_quietly", "launch_on_thread"]

T = TypeVar("T")


class ThreadRun:
    """A run on a worker thread: its future and the connections it used."""

    __slots__ = ("connections", "future")

    def __init__(self, future: cf.Future[Any], connections: AttemptConnections) -> None:
        self.future = future
        self.connections = connections

    def done(self) -> bool:
        return self.future.done()

    def exception(self) -> BaseException | None:
        return self.future.exception()

    def result(self) -> Any:
        return self.future.result()


def _close_late_result(future: cf.Future[Any]) -> None:
    """A run abandoned after all may still produce a result: close it if it holds a stream.
    A run that failed (its connection was shut down) gives its half-read response back now."""
    if future.cancelled():
        return
    if future.exception() is not None:
        release(future.exception())
        return
    close = getattr(future.result(), "close", None)
    if callable(close):
        try:
            close()
        except Exception as exc:  # pragma: no cover - best effort (no traceback: a background thread)
            logger.debug("closing an abandoned run's result failed: %s: %s", type(exc).__name__, exc)


class SyncDriver:
    """Runs attempts on a pool's worker threads. ``call(index, query_id)`` is the statement on
    one replica; ``ping(index, timeout)`` a liveness check; ``kill(index, query_id)`` a best
    effort ``KILL QUERY`` (run on a worker, never waited for)."""

    def __init__(self) -> None:
        self._executor = attempt_executor()

    def run(
        self,
        spec: AttemptSpec,
        call: Callable[[int, str | None], T],
        ping: Callable[[int, float], bool | PingReading],
        kill: Callable[[int, str], None],
    ) -> tuple[int, T]:
        return self._drive(AttemptMachine(spec), [], call, ping, kill, connect_timeout=spec.connect_timeout)

    def run_planned(
        self,
        plan: StatementPlan,
        index: int,
        call: Callable[[int, str | None], T],
        ping: Callable[[int, float], bool | PingReading],
        kill: Callable[[int, str], None],
    ) -> tuple[int, T]:
        """An attempt of a statement's plan on replica ``index``. One that is not hedged costs no
        machine (nor its spec) until its first wake-up is due: called on this thread when nothing
        can wake it, else on a worker waited for until that moment; most attempts answer before."""
        if plan.hedgeable:
            return self.run(plan.spec(index), call, ping, kill)
        settings = plan.settings
        query_id = plan.query_id if plan.deadline.at is None else plan.run_query_id(None)()
        started = plan.clock()
        first = first_wake(started, settings.liveness, settings.timeouts.receive, plan.deadline.at)
        if first == math.inf:
            return index, call(index, query_id)
        connect_timeout = plan.connect_timeout()
        run = launch_on_thread(self._executor, call, Launch(index, query_id), connect_timeout)
        try:
            cf.wait((run.future,), first - started)
        except BaseException:  # KeyboardInterrupt: leave nothing behind
            run.connections.abandon()
            raise
        if run.done():
            return index, run.result()
        machine = AttemptMachine(plan.spec(index), running=(run, started, query_id))
        return self._drive(machine, [run], call, ping, kill, connect_timeout=connect_timeout)

    def _drive(
        self,
        machine: AttemptMachine,
        launched: list[ThreadRun],
        call: Callable[[int, str | None], T],
        ping: Callable[[int, float], bool | PingReading],
        kill: Callable[[int, str], None],
        *,
        connect_timeout: float | None,
    ) -> tuple[int, T]:
        try:
            for command in machine:
                if isinstance(command, Launch):
                    machine.reply = run = launch_on_thread(self._executor, call, command, connect_timeout)
                    launched.append(run)
                elif isinstance(command, Wait):
                    futures = [h.future if isinstance(h, ThreadRun) else h for h in command.handles]
                    cf.wait(futures, command.timeout, cf.FIRST_COMPLETED)
                elif isinstance(command, Ping):
                    machine.reply = check_executor().submit(ping, command.replica, command.timeout)
                elif isinstance(command, Abandon):
                    abandon_run(command, kill)
            return machine.outcome
        except BaseException as exc:
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: leave nothing behind
                for run in launched:
                    if not run.done():
                        run.connections.abandon()
            raise


def launch_on_thread(
    executor: cf.Executor, call: Callable[[int, str | None], Any], command: Launch, connect_timeout: float | None
) -> ThreadRun:
    """Carry out ``Launch``: the run on a worker thread, its connections abandonable."""
    connections = AttemptConnections(connect_timeout)

    def work() -> Any:
        # A worker thread does not inherit the statement's context: mark its attempt as
        # the pool's here (quiet driver logging, as on the statement's own thread).
        with connections, handled_by_pool():
            return call(command.replica, command.query_id)

    return ThreadRun(executor.submit(work), connections)


def abandon_run(command: Abandon, kill: Callable[[int, str], None]) -> None:
    """Carry out ``Abandon`` for a run on a worker thread (:func:`launch_on_thread`)."""
    run: ThreadRun = command.handle
    run.connections.abandon()
    run.future.add_done_callback(_close_late_result)
    if command.kill and command.query_id:
        check_executor().submit(kill_quietly, kill, command.replica, command.query_id)


def kill_quietly(kill: Callable[[int, str], None], index: int, query_id: str) -> None:
    """A best-effort ``KILL QUERY`` of an abandoned run (on a check thread, never waited for)."""
    try:
        with quiet_transport():
            kill(index, query_id)
    except Exception as exc:
        logger.debug("KILL QUERY %s on replica %d failed: %s", query_id, index, exc)
