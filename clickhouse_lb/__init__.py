"""clickhouse-lb: ClickHouse's ``load_balancing`` on the client side, over clickhouse-connect.

>>> import clickhouse_lb
>>> pool = clickhouse_lb.get_pool(["ch-1:8123", "ch-2:8123", "ch-3:8123"], load_balancing="in_order")
>>> pool.query("SELECT 1").result_rows  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from . import errors
    from .aio import AsyncReplicaPool, get_async_pool
    from .balancer import ReplicaStatus
    from .errors import (
        AllReplicasStaleError,
        AllReplicasUnavailableError,
        AttemptAbandonedError,
        ConfigurationError,
        SessionLostError,
        StatementTimeoutError,
        WriteOutcomeUnknownError,
    )
    from .events import (
        ErrorRecordedEvent,
        FailoverEvent,
        PoolListener,
        ProbeEvent,
        ReplicaDownEvent,
        ReplicaRecoveredEvent,
    )
    from .pool import PinnedSession, ReplicaPool, get_pool
    from .replicas import Replica
    from .settings import BalancingSettings, LoadBalancing

__all__ = [
    "AllReplicasStaleError",
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
    "ProbeEvent",
    "Replica",
    "ReplicaDownEvent",
    "ReplicaPool",
    "ReplicaRecoveredEvent",
    "ReplicaStatus",
    "SessionLostError",
    "StatementTimeoutError",
    "WriteOutcomeUnknownError",
    "__version__",
    "errors",
    "get_async_pool",
    "get_pool",
    "version",
]

version = __version__


# Every public name is loaded on first use (PEP 562), so that importing a part that needs none
# of them, such as the test cluster (clickhouse_lb.testing, whose replica processes start
# often), does not load clickhouse-connect and the pool; and the async pool, which imports
# aiohttp, only when asked for.
_EXPORTS = {
    "AllReplicasStaleError": ".errors",
    "AllReplicasUnavailableError": ".errors",
    "AsyncReplicaPool": ".aio",
    "AttemptAbandonedError": ".errors",
    "BalancingSettings": ".settings",
    "ConfigurationError": ".errors",
    "ErrorRecordedEvent": ".events",
    "FailoverEvent": ".events",
    "LoadBalancing": ".settings",
    "PinnedSession": ".pool",
    "PoolListener": ".events",
    "ProbeEvent": ".events",
    "Replica": ".replicas",
    "ReplicaDownEvent": ".events",
    "ReplicaPool": ".pool",
    "ReplicaRecoveredEvent": ".events",
    "ReplicaStatus": ".balancer",
    "SessionLostError": ".errors",
    "StatementTimeoutError": ".errors",
    "WriteOutcomeUnknownError": ".errors",
    "get_async_pool": ".aio",
    "get_pool": ".pool",
}


def __getattr__(name: str) -> Any:
    if name == "errors":
        value: Any = importlib.import_module(".errors", __name__)
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    else:
        raise AttributeError(f"module 'clickhouse_lb' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
