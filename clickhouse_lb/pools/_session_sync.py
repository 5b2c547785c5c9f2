"""The sync pool's session route (see :mod:`clickhouse_lb.pools._session_mode`): every statement
of a pool given ``session_id=`` runs on the one replica its session is pinned to."""

from __future__ import annotations

import threading
from typing import Any

from clickhouse_lb.core.failover import run_sync
from clickhouse_lb.errors import SessionLostError

# The pool and its pinned-session class are typed Any: naming them would import the pool
# module this one is imported by.

__all__ = ["SessionRoute"]


class SessionRoute:
    """Pins the pool's session to a replica at the first statement, and again after a
    :class:`~clickhouse_lb.errors.SessionLostError`."""

    def __init__(self, pool: Any, pinned_class: Any) -> None:
        self._pool = pool
        self._pinned_class = pinned_class
        self._lock = threading.Lock()
        self._pinned: Any = None

    @property
    def address(self) -> str | None:
        """The replica the session is on now (None before the first statement, or once lost)."""
        pinned = self._pinned
        return None if pinned is None else pinned.address

    def _pin(self) -> Any:
        with self._lock:
            if self._pinned is None:
                pool = self._pool
                view = pool._view
                order = pool._fresh_first(view.balancer.plan_indices(), None, view)
                attempts = pool._attempts("session", order, retry_after_send=True, write=False, view=view)
                # The replica's pooled client carries the session id: creating it is the check
                # that the replica answers (an existing one is used as it is).
                index = run_sync(attempts, lambda i: (pool._client(i, view), i)[1], pool._policy)
                self._pinned = self._pinned_class(pool, index, pool._client(index, view), view.balancer)
            return self._pinned

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        pool = self._pool
        if pool._closed:
            raise pool._closed_error()
        pinned = self._pinned
        if pinned is None:
            pinned = self._pin()  # its attempts count the statement
        else:
            pool._started()
        try:
            return pinned._call(method, args, kwargs)
        except SessionLostError:
            with self._lock:
                if self._pinned is pinned:  # the next statement pins the session anew
                    self._pinned = None
            raise
