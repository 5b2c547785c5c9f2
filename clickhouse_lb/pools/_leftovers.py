"""Nothing the pool abandons may raise later, from a destructor or the garbage collector.

When the pool gives up on an attempt (a hung replica, a hedge that lost, a deadline), the
attempt's code fails inside clickhouse-connect, and its exception's traceback keeps the frames
that held the half-read response: clickhouse-connect's ``ResponseBuffer``, its ``ResponseSource``
and urllib3's and http.client's response objects. Such an exception is easily part of a reference
cycle (an exception kept in a list by a frame its own traceback holds), and then the garbage
collector frees the whole group in an arbitrary order: it first empties the instance dictionaries
of the group's objects, so that when ``ResponseBuffer.__dealloc__`` closes its source, urllib3's
``response.closed`` finds an http.client response without its ``fp`` and raises
(``Exception ignored in: 'clickhouse_connect.driverc.buffer.ResponseBuffer.__dealloc__'``,
``AttributeError: 'HTTPResponse' object has no attribute 'fp'``).

The same happens to a query's result that is never read while a cycle holds it: pytest keeps a
failed test's traceback, whose frame holds the test's unread result. That is what crashed
clickhouse-connect's suite through pools (docs/busy-process.md, "Nothing raises later").

On CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 that is worse than a line on stderr: a collection can
start while ``ast`` builds a tree (3.11's tracebacks parse source to draw their ``^^^`` markers,
pytest parses source to show a failure), and the destructor's exception is formatted (with
``ast``) from inside it; both share one interpreter-wide recursion counter (CPython gh-106905,
fixed by gh-113035 in 3.11.8 and 3.12.2), and pytest stops with ``INTERNALERROR ... SystemError:
AST constructor recursion depth mismatch``.

So the pool releases what it abandons itself, at once, on the thread or task that ran it:
:func:`release` clears the local variables of the exception's frames (the traceback stays
printable), so the response objects are freed by reference counting, whole, and close cleanly;
:class:`~clickhouse_lb.pools._transport.AttemptConnections` closes an abandoned attempt's
connections when the attempt ends.
"""

from __future__ import annotations

import traceback
from typing import TypeVar

from clickhouse_connect.driver.query import QueryResult

__all__ = ["release", "settled"]

T = TypeVar("T")


def release(exc: BaseException | None) -> None:
    """Free the local variables of the frames ``exc`` (and the exceptions chained to it) went
    through; frames still running (the caller's own) are left alone."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 16:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def settled(result: T) -> T:
    """A ``QueryResult`` read whole and its response closed, inside the attempt (as
    clickhouse-connect's async client does for every query): a response left open in a result
    that is never read (a test that failed before reading it, a result dropped on an exception)
    would otherwise be closed by the garbage collector, in the state described above. Reading it
    inside the attempt also puts the body's reading under the attempt's failover and deadline."""
    if isinstance(result, QueryResult):
        _ = result.result_set  # (rows, or columns for a column-oriented result: read once, kept)
        result.close()  # the rows stay; the response is released
    return result
