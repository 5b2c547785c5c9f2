"""clickhouse-lb: ClickHouse's ``load_balancing`` on the client side, over clickhouse-connect.

>>> import clickhouse_lb
>>> pool = clickhouse_lb.get_pool(["ch-1:8123", "ch-2:8123", "ch-3:8123"], load_balancing="in_order")
>>> pool.query("SELECT 1").result_rows  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from clickhouse_lb._version import __version__

if TYPE_CHECKING:
    from clickhouse_lb import errors
    from clickhouse_lb.config.replicas import Replica
    from clickhouse_lb.config.settings import BalancingSettings, LoadBalancing
    from clickhouse_lb.core.balancer import ReplicaStatus
    from clickhouse_lb.core.events import (
        ErrorRecordedEvent,
        FailoverEvent,
        PoolListener,
        ProbeEvent,
        ReplicaDownEvent,
        ReplicaRecoveredEvent,
    )
    from clickhouse_lb.errors import (
        AllReplicasStaleError,
        AllReplicasUnavailableError,
        AttemptAbandonedError,
        ConfigurationError,
        SessionLostError,
        StatementTimeoutError,
        WriteOutcomeUnknownError,
    )
    from clickhouse_lb.pools.aio import AsyncReplicaPool, get_async_pool
    from clickhouse_lb.pools.pool import PinnedSession, ReplicaPool, get_pool
    from clickhouse_lb.pools.sharded import ShardedPool, get_sharded_pool
    from clickhouse_lb.pools.sharded_aio import AsyncShardedPool, get_async_sharded_pool

__all__ = [
    "AllReplicasStaleError",
    "AllReplicasUnavailableError",
    "AsyncReplicaPool",
    "AsyncShardedPool",
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
    "ShardedPool",
    "StatementTimeoutError",
    "WriteOutcomeUnknownError",
    "__version__",
    "errors",
    "get_async_pool",
    "get_async_sharded_pool",
    "get_pool",
    "get_sharded_pool",
    "version",
]

version = __version__


# Every public name is loaded on first use (PEP 562), so that importing a part that needs none
# of them, such as the test cluster (clickhouse_lb.testing, whose replica processes start
# often), does not load clickhouse-connect and the pool; and the async pool, which imports
# aiohttp, only when asked for.
_EXPORTS = {
    "AllReplicasStaleError": "clickhouse_lb.errors",
    "AllReplicasUnavailableError": "clickhouse_lb.errors",
    "AsyncReplicaPool": "clickhouse_lb.pools.aio",
    "AsyncShardedPool": "clickhouse_lb.pools.sharded_aio",
    "AttemptAbandonedError": "clickhouse_lb.errors",
    "BalancingSettings": "clickhouse_lb.config.settings",
    "ConfigurationError": "clickhouse_lb.errors",
    "ErrorRecordedEvent": "clickhouse_lb.core.events",
    "FailoverEvent": "clickhouse_lb.core.events",
    "LoadBalancing": "clickhouse_lb.config.settings",
    "PinnedSession": "clickhouse_lb.pools.pool",
    "PoolListener": "clickhouse_lb.core.events",
    "ProbeEvent": "clickhouse_lb.core.events",
    "Replica": "clickhouse_lb.config.replicas",
    "ReplicaDownEvent": "clickhouse_lb.core.events",
    "ReplicaPool": "clickhouse_lb.pools.pool",
    "ReplicaRecoveredEvent": "clickhouse_lb.core.events",
    "ReplicaStatus": "clickhouse_lb.core.balancer",
    "SessionLostError": "clickhouse_lb.errors",
    "ShardedPool": "clickhouse_lb.pools.sharded",
    "StatementTimeoutError": "clickhouse_lb.errors",
    "WriteOutcomeUnknownError": "clickhouse_lb.errors",
    "get_async_pool": "clickhouse_lb.pools.aio",
    "get_async_sharded_pool": "clickhouse_lb.pools.sharded_aio",
    "get_pool": "clickhouse_lb.pools.pool",
    "get_sharded_pool": "clickhouse_lb.pools.sharded",
}


def __getattr__(name: str) -> Any:
    if name == "errors":
        value: Any = importlib.import_module("clickhouse_lb.errors")
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'clickhouse_lb' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
