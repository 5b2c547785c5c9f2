"""No traceback is formatted on the pool's own threads and tasks: a record logged there with an
exception keeps the exception's type and message, not its traceback.

Why: on CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 the AST constructor keeps its recursion counter
in interpreter-wide state (CPython gh-106905, fixed in 3.11.8 and 3.12.2), and 3.11's traceback
formatting builds ASTs (it parses each source line to place its ``^^^`` markers). A traceback
formatted on a probe, check or attempt thread while the application's thread builds an AST
(pytest's assertion rewriting and failure reports do; so does any formatting of its own) can
interleave with it when a garbage collection releases the GIL, and the application sees
``SystemError: AST constructor recursion depth mismatch``. The application's own thread keeps
its tracebacks: a listener that raises during a statement is logged with one there.

The pool's threads are named ``clickhouse-lb-...`` (workers, watchdog, probes) and so are its
asyncio tasks; :func:`install` attaches the filter to ``clickhouse_lb`` and clickhouse-connect's
transport loggers, whose records the pool's threads produce.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from clickhouse_lb.core._driver_logs import DRIVER_LOGGERS, attach_filter

__all__ = ["BACKGROUND_PREFIX", "install", "on_pool_background"]

#: The name every thread and asyncio task of the pool's own starts with.
BACKGROUND_PREFIX = "clickhouse-lb-"

#: Loggers whose records the pool's threads emit: the pool's own, and clickhouse-connect's
#: transport and response reader (which log with ``exc_info=True``).
LOGGERS = ("clickhouse_lb", *DRIVER_LOGGERS, "clickhouse_connect.driver.httputil")


def on_pool_background() -> bool:
    """Whether the running thread, or the running asyncio task, is one of the pool's own."""
    if threading.current_thread().name.startswith(BACKGROUND_PREFIX):
        return True
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop on this thread
        return False
    return task is not None and task.get_name().startswith(BACKGROUND_PREFIX)


class _TypeAndMessageOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc_info = record.exc_info
        if exc_info and exc_info[1] is not None and on_pool_background():
            exc = exc_info[1]
            # The message as rendered now (its arguments may not outlive this record's
            # changes), then what the traceback would have ended with.
            try:
                rendered = record.getMessage()
            except Exception:  # a bad format string: logging reports it when it emits
                return True
            record.msg = f"{rendered}: {type(exc).__name__}: {exc}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


_FILTER = _TypeAndMessageOnly()


def install() -> None:
    """Attach the filter to :data:`LOGGERS` (idempotent)."""
    attach_filter(_FILTER, LOGGERS)


install()
