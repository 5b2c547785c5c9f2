"""What the sync and async dialects share (neither imports the other: the async one needs
aiohttp and SQLAlchemy 2's asyncio extension, the sync one runs on SQLAlchemy 1.4)."""

from __future__ import annotations

from clickhouse_lb.core.classify import classify
from clickhouse_lb.errors import AllReplicasUnavailableError, SessionLostError

__all__ = ["ENGINE_ARGS", "is_replica_failure"]

#: The connect parameter that carries a URL's validated EngineArgs from create_connect_args
#: to connect.
ENGINE_ARGS = "clickhouse_lb_engine_args"


def is_replica_failure(e: BaseException) -> bool:
    """A failure that means the connection's replica is gone (with its session): SQLAlchemy
    should invalidate the connection rather than return it to its pool."""
    return isinstance(e, (SessionLostError, AllReplicasUnavailableError)) or classify(e).replica
