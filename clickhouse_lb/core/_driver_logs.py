"""clickhouse-connect's per-attempt transport warnings, kept quiet while the pool handles them.

clickhouse-connect logs a WARNING ("Unexpected Http Driver Exception", with a traceback on some
versions; "Unexpected aiohttp transport error" on the async client) each time a request fails
at the transport level, then raises. Inside a pool statement that failure is the pool's to
handle: it fails over and logs one WARNING of its own that names the replica, the failure and
the next replica, or raises an exception that says all of it. With logging unconfigured,
Python's last-resort handler would print the driver's record (and traceback) for every attempt
as well, so one failover printed dozens of lines.

A filter on those driver loggers drops such records, but only:

* while a pool attempt runs, on the thread or task that runs it, so that other threads and
  tasks using plain clickhouse-connect clients are unaffected: a sync statement is found on
  the logging thread's stack (:func:`runs_attempts`), anything else is marked with a context
  variable (an async statement, whose client logs from tasks of its own that copy the
  variable but not the stack; a hedge's run on a worker thread), and
* when the application has not configured those loggers itself: a level or a handler set on
  ``clickhouse_connect`` or one of its children (``logging.getLogger("clickhouse_connect")
  .setLevel(logging.WARNING)``) shows them again, every one. Configuring only the root logger
  (``logging.basicConfig``) does not count: that is the "show me warnings" of an application,
  and the pool's own WARNING says what happened.

Records above WARNING are never dropped. A filter (rather than lowering the driver loggers'
levels) touches nothing the application can see or has set.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar, Token
from types import CodeType, FrameType
from typing import TypeVar

__all__ = [
    "DRIVER_LOGGERS", "attach_filter", "enter_pool", "handled_by_pool", "in_pool_attempt", "install", "leave_pool",
    "runs_attempts",
]

F = TypeVar("F", bound=Callable[..., object])

#: The loggers that report transport failures per attempt: clickhouse-connect 1.x sync and
#: async backends, and 0.x's HTTP client (the Superset line).
DRIVER_LOGGERS = (
    "clickhouse_connect.driver._backend.http_sync",
    "clickhouse_connect.driver._backend.http_async",
    "clickhouse_connect.driver.httpclient",
    "clickhouse_connect.driver.asyncclient",
)

_IN_POOL_ATTEMPT: ContextVar[bool] = ContextVar("clickhouse_lb_in_pool_attempt", default=False)


@contextlib.contextmanager
def handled_by_pool() -> Iterator[None]:
    """Mark the attempts run inside the block as the pool's (their transport failures are its)."""
    token = enter_pool()
    try:
        yield
    finally:
        leave_pool(token)


#: :func:`handled_by_pool` without the context manager, for the per-statement path: the
#: attempts from here on are the pool's, until :func:`leave_pool` with the returned token.
#: (The context variable's own C methods: no Python frame per statement.)
enter_pool: Callable[[], Token[bool]] = functools.partial(_IN_POOL_ATTEMPT.set, True)
leave_pool: Callable[[Token[bool]], None] = _IN_POOL_ATTEMPT.reset


#: The code of the functions that run a statement's attempts on the thread that called the pool
#: (:func:`runs_attempts`). Looking for them costs only when a driver logger logs (a failure),
#: where the context variable cost every sync statement a set and a reset, both cold between
#: statements (BENCHMARKS.md, "the driver-log marker").
_ATTEMPT_RUNNERS: set[CodeType] = set()


def runs_attempts(function: F) -> F:
    """Register ``function`` (returned as it is) as one that runs a statement's attempts on
    its caller's thread: a driver record logged on a thread whose stack holds its frame is the
    pool's to report, with no mark set per statement."""
    _ATTEMPT_RUNNERS.add(function.__code__)
    return function


def in_pool_attempt() -> bool:
    """Whether the calling thread or task is running a pool attempt: marked (the context
    variable), or below a registered runner on this thread's stack."""
    if _IN_POOL_ATTEMPT.get():
        return True
    frame: FrameType | None = sys._getframe(1)
    runners = _ATTEMPT_RUNNERS
    while frame is not None:
        if frame.f_code in runners:
            return True
        frame = frame.f_back
    return False


def configured_by_application(name: str) -> bool:
    """Whether ``name`` or an ancestor below the root has a level or a handler of its own."""
    logger: logging.Logger | None = logging.getLogger(name)
    while isinstance(logger, logging.Logger) and logger is not logging.root:
        if logger.level != logging.NOTSET or logger.handlers:
            return True
        logger = logger.parent
    return False


class _HandledByPool(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING or not in_pool_attempt():
            return True
        return configured_by_application(record.name)


_FILTER = _HandledByPool("clickhouse_lb")


def attach_filter(log_filter: logging.Filter, names: Iterable[str]) -> None:
    """Attach ``log_filter`` to each logger named, once (``addFilter`` skips a filter the
    logger already has: a second call adds nothing)."""
    for name in names:
        logging.getLogger(name).addFilter(log_filter)


def install() -> None:
    """Attach the filter to the driver loggers (idempotent)."""
    attach_filter(_FILTER, DRIVER_LOGGERS)


install()
