"""A pinned session's bodies, written once for both pools (see :mod:`clickhouse_lb.pools._steps`):
a statement on the one replica, its failure counted against that replica and raised as
:class:`~clickhouse_lb.errors.SessionLostError` (a query failure passes through unchanged)."""

from __future__ import annotations

from functools import partial
from typing import Any, TypeVar

from clickhouse_lb.core._driver_logs import handled_by_pool
from clickhouse_lb.pools._pinned_base import PinnedBase
from clickhouse_lb.pools._steps import Steps

__all__ = ["PinnedSteps"]

C = TypeVar("C")


class PinnedSteps(PinnedBase[C]):
    """What both pinned-session classes do around their client's I/O."""

    def _call_steps(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Steps[Any]:
        call = self._prepare(method, args, kwargs)
        try:
            with handled_by_pool():  # a failure here is reported as SessionLostError
                return (yield partial(getattr(self.client, method), *call.args, **call.kwargs))
        except Exception as exc:
            lost = self._lost(exc, call.write)
            if lost is None:
                raise
            raise lost from exc

    def _ping_steps(self, timeout: float | None) -> Steps[bool]:
        client: Any = self.client
        return bool((yield partial(client.ping, timeout) if timeout else client.ping))
