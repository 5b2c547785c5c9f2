"""The sync driver of :func:`clickhouse_lb.core.race.run_attempt`: each run on a worker thread, the
statement's thread waiting with timeouts (so it can stop waiting at any moment)."""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from typing import Any, TypeVar

from clickhouse_lb.core._driver_logs import handled_by_pool
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.race import Abandon, AttemptSpec, Launch, Ping, Wait, run_attempt
from clickhouse_lb.core.stalls import PingReading
from clickhouse_lb.pools._leftovers import release
from clickhouse_lb.pools._threads import attempt_executor, check_executor
from clickhouse_lb.pools._transport import AttemptConnections, quiet_transport

__all__ = ["SyncDriver"]

T = TypeVar("T")


class _ThreadRun:
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
        steps = run_attempt(spec)
        launched: list[_ThreadRun] = []
        reply: Any = None
        try:
            while True:
                try:
                    command = steps.send(reply)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                reply = None
                if isinstance(command, Launch):
                    reply = self._launch(call, command, spec.connect_timeout)
                    launched.append(reply)
                elif isinstance(command, Wait):
                    cf.wait([run.future for run in command.handles], command.timeout, cf.FIRST_COMPLETED)
                elif isinstance(command, Ping):
                    reply = ping(command.replica, command.timeout)
                elif isinstance(command, Abandon):
                    self._abandon(command, kill)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: leave nothing behind
                for run in launched:
                    if not run.done():
                        run.connections.abandon()
            raise

    def _launch(
        self, call: Callable[[int, str | None], Any], command: Launch, connect_timeout: float | None
    ) -> _ThreadRun:
        connections = AttemptConnections(connect_timeout)

        def work() -> Any:
            # A worker thread does not inherit the statement's context: mark its attempt as
            # the pool's here (quiet driver logging, as on the statement's own thread).
            with connections, handled_by_pool():
                return call(command.replica, command.query_id)

        return _ThreadRun(self._executor.submit(work), connections)

    def _abandon(self, command: Abandon, kill: Callable[[int, str], None]) -> None:
        run: _ThreadRun = command.handle
        run.connections.abandon()
        run.future.add_done_callback(_close_late_result)
        if command.kill and command.query_id:
            index, query_id = command.replica, command.query_id

            def kill_quietly() -> None:
                try:
                    with quiet_transport():
                        kill(index, query_id)
                except Exception as exc:
                    logger.debug("KILL QUERY %s on replica %d failed: %s", query_id, index, exc)

            check_executor().submit(kill_quietly)
