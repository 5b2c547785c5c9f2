"""clickhouse-connect's per-attempt transport warnings, kept quiet while the pool handles them.

clickhouse-connect logs a WARNING ("Unexpected Http Driver Exception", with a traceback on some
versions; "Unexpected aiohttp transport error" on the async client) each time a request fails
at the transport level, then raises. Inside a pool statement that failure is the pool's to
handle: it fails over and logs one WARNING of its own that names the replica, the failure and
the next replica, or raises an exception that says all of it. With logging unconfigured,
Python's last-resort handler would print the driver's record (and traceback) for every attempt
as well, so one failover printed dozens of lines.

A filter on those driver loggers drops such records, but only:

* while a pool attempt runs (a context variable, so other threads and tasks using plain
  clickhouse-connect clients are unaffected), and
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
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar, Token

__all__ = ["DRIVER_LOGGERS", "attach_filter", "enter_pool", "handled_by_pool", "install", "leave_pool"]

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
        if record.levelno > logging.WARNING or not _IN_POOL_ATTEMPT.get():
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
