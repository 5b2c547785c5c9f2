"""The session route of a pool given ``session_id=`` (see :mod:`clickhouse_lb.pools._session_mode`):
every statement runs on the one replica its session is pinned to. Written once for both pools
(:mod:`clickhouse_lb.pools._steps`); only the lock differs (a thread's, or a task's made on the
pool's loop at the first statement)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from clickhouse_lb.errors import SessionLostError
from clickhouse_lb.pools._steps import Steps

# The pool is typed Any: naming it would import the pool module this one is imported by.

__all__ = ["SessionRoute"]


class SessionRoute:
    """Pins the pool's session to a replica at the first statement, and again after a
    :class:`~clickhouse_lb.errors.SessionLostError`."""

    def __init__(self, pool: Any, new_lock: Callable[[], Any]) -> None:
        self._pool = pool
        self._new_lock = new_lock
        self._lock: Any = None
        self._pinned: Any = None

    @property
    def address(self) -> str | None:
        """The replica the session is on now (None before the first statement, or once lost)."""
        pinned = self._pinned
        return None if pinned is None else pinned.address

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The statement on the session's replica: its result (the sync pool), or an awaitable."""
        return self._pool._drive(self._call_steps(method, args, kwargs))

    def _locked(self) -> Any:
        if self._lock is None:  # made at the first statement (an asyncio lock: on the pool's loop)
            self._lock = self._new_lock()
        return self._lock

    def _pin_steps(self) -> Steps[Any]:
        lock = self._locked()
        yield lock.acquire
        try:
            if self._pinned is None:
                pool = self._pool
                view = pool._view
                attempts = yield from pool._session_attempts(view)
                # The replica's pooled client carries the session id: creating it is the check
                # that the replica answers (an existing one is used as it is).
                index = yield partial(pool._run_attempts, attempts, partial(self._reached, view), pool._policy)
                client = yield partial(pool._client, index, view)
                self._pinned = pool._pinned_class(pool, index, client, view.balancer)
            return self._pinned
        finally:
            lock.release()

    def _reached(self, view: Any, index: int) -> Any:
        return self._pool._drive(self._reach_steps(view, index))

    def _reach_steps(self, view: Any, index: int) -> Steps[int]:
        yield partial(self._pool._client, index, view)
        return index

    def _call_steps(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Steps[Any]:
        pool = self._pool
        pool._check_open()
        pinned = self._pinned
        if pinned is None:
            pinned = yield from self._pin_steps()  # its attempts count the statement
        else:
            pool._started()
        try:
            return (yield partial(pinned._call, method, args, kwargs))
        except SessionLostError:
            lock = self._locked()
            yield lock.acquire
            try:
                if self._pinned is pinned:  # the next statement pins the session anew
                    self._pinned = None
            finally:
                lock.release()
            raise
