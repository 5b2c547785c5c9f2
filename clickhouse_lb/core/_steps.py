"""One body for both pools: code written once as a generator of steps, carried out by calling
each step (:func:`drive`, the sync pool) or by awaiting it (:func:`drive_async`, the async pool).

A step is a callable of no argument. The sync pool's I/O returns its result; the async pool's
returns an awaitable; both pools give their I/O the same names (``self._client(i)``,
``client.ping``, ``client.close``, ``lock.acquire``), so one generator serves both, and the
decisions between the I/O (what to call, what its outcome means, what to close) are written
once. An exception a step raises is thrown into the generator at its ``yield``, so ``try``,
``except`` and ``finally`` in a body behave as they would around the call or the ``await``.

psycopg_pool generates its sync code from its async code; here nothing is generated, both
conventions carry out the same source. Used by both pools' bodies
(:mod:`clickhouse_lb.pools._pool_steps`) and by a statement's failover after its first attempt
(:mod:`clickhouse_lb.core.failover`). A statement's first attempt is not written this way: it
runs for every statement, where a generator and its driver would cost more than the pool's own
bookkeeping, so each pool keeps its own few lines there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from typing import Any, TypeVar, cast

__all__ = ["Steps", "drive", "drive_async"]

T = TypeVar("T")

#: A body: yields steps, is sent each step's result, returns the outcome.
Steps = Generator[Callable[[], Any], Any, T]


async def drive_async(steps: Steps[T]) -> T:
    """Carry out ``steps``, awaiting each step's result when it is awaitable."""
    send: Callable[[Any], Callable[[], Any]] = steps.send
    value: Any = None
    while True:
        try:
            step = send(value)
        except StopIteration as done:
            return cast(T, done.value)
        try:
            value = step()
            if inspect.isawaitable(value):
                value = await value
            send = steps.send
        except BaseException as exc:  # handed to the body: its try/finally decides
            value, send = exc, steps.throw


def drive(steps: Steps[T]) -> T:
    """Carry out ``steps`` by calling each step: :func:`drive_async` run to its end at once,
    since no sync step returns an awaitable (the one loop serves both pools)."""
    coroutine = drive_async(steps)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("a step of a sync body returned an awaitable")
