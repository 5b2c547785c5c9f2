"""The async pool's session route (see :mod:`clickhouse_lb.pools._session_mode`): every
statement of a pool given ``session_id=`` runs on the one replica its session is pinned to."""

from __future__ import annotations

import asyncio
from typing import Any

from clickhouse_lb.core.failover import run_async
from clickhouse_lb.errors import SessionLostError

# The pool and its pinned-session class are typed Any: naming them would import the pool
# module this one is imported by.

__all__ = ["AsyncSessionRoute"]


class AsyncSessionRoute:
    """Pins the pool's session to a replica at the first statement, and again after a
    :class:`~clickhouse_lb.errors.SessionLostError`."""

    def __init__(self, pool: Any, pinned_class: Any) -> None:
        self._pool = pool
        self._pinned_class = pinned_class
        self._lock: asyncio.Lock | None = None  # made on the pool's loop, at the first statement
        self._pinned: Any = None

    @property
    def address(self) -> str | None:
        """The replica the session is on now (None before the first statement, or once lost)."""
        pinned = self._pinned
        return None if pinned is None else pinned.address

    async def _pin(self) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._pinned is None:
                pool = self._pool
                view = pool._view
                order = pool._fresh_first(await pool._plan(view=view), None, view)
                attempts = pool._attempts("session", order, retry_after_send=True, write=False, view=view)

                async def connect(index: int) -> int:
                    await pool._client(index, view)
                    return index

                index = await run_async(attempts, connect, pool._policy)
                self._pinned = self._pinned_class(pool, index, await pool._client(index, view), view.balancer)
            return self._pinned

    async def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        pool = self._pool
        pool._check_open()
        pinned = self._pinned
        if pinned is None:
            pinned = await self._pin()  # its attempts count the statement
        else:
            pool._started()
        try:
            return await pinned._call(method, args, kwargs)
        except SessionLostError:
            if self._pinned is pinned:  # the next statement pins the session anew
                self._pinned = None
            raise
