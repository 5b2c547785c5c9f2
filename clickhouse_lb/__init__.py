"""clickhouse-lb: ClickHouse's ``load_balancing`` on the client side, over clickhouse-connect.

>>> import clickhouse_lb
>>> pool = clickhouse_lb.get_pool(["ch-1:8123", "ch-2:8123", "ch-3:8123"], load_balancing="in_order")
>>> pool.query("SELECT 1").result_rows  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors
from ._version import __version__
from .balancer import ReplicaStatus
from .errors import (
    AllReplicasUnavailableError,
    AttemptAbandonedError,
    ConfigurationError,
    SessionLostError,
    StatementTimeoutError,
)
from .events import ErrorRecordedEvent, FailoverEvent, PoolListener, ReplicaRecoveredEvent
from .pool import PinnedSession, ReplicaPool, get_pool
from .settings import BalancingSettings, LoadBalancing, Replica

if TYPE_CHECKING:
    from .aio import AsyncReplicaPool, get_async_pool

__all__ = [
    "AllReplicasUnavailableError",
    "AsyncReplicaPool",
    "AttemptAbandonedError",
    "BalancingSettings",
    "ConfigurationError",
    "ErrorRecordedEvent",
    "FailoverEvent",
    "LoadBalancing",
    "PinnedSession",
    "PoolListener",
    "Replica",
    "ReplicaPool",
    "ReplicaRecoveredEvent",
    "ReplicaStatus",
    "SessionLostError",
    "StatementTimeoutError",
    "__version__",
    "errors",
    "get_async_pool",
    "get_pool",
    "version",
]

version = __version__


def __getattr__(name: str) -> Any:
    # The async pool imports aiohttp through clickhouse-connect: load it only when asked for.
    if name in ("AsyncReplicaPool", "get_async_pool"):
        from . import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'clickhouse_lb' has no attribute {name!r}")
