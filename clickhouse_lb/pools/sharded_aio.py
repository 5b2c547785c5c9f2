"""AsyncShardedPool: the async twin of :class:`~clickhouse_lb.pools.sharded.ShardedPool`, an
:class:`~clickhouse_lb.pools.aio.AsyncReplicaPool` per shard. Layout, routing and outcomes are
the shared ones (:mod:`clickhouse_lb.pools._sharded_base`); only the awaits differ."""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Sequence
from typing import Any

from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools._sharded_base import ShardedBase, ShardedInsertSummary
from clickhouse_lb.pools.aio import AsyncReplicaPool, get_async_pool
from clickhouse_lb.pools.sharded import HostList, shard_layout

__all__ = ["AsyncShardedPool", "get_async_sharded_pool"]


class AsyncShardedPool(ShardedBase[AsyncReplicaPool]):
    """An async pool per shard (``.shards``, in ``shard_num`` order) and routed inserts."""

    async def insert(
        self,
        table: str,
        data: Sequence[Any],
        column_names: str | Sequence[str] = "*",
        *,
        sharding_key: str,
        database: str | None = None,
        column_type_names: Sequence[str] | None = None,
        column_oriented: bool = False,
        settings: dict[str, Any] | None = None,
    ) -> ShardedInsertSummary:
        """As :meth:`ShardedPool.insert <clickhouse_lb.pools.sharded.ShardedPool.insert>`."""
        if column_names != "*" and column_type_names is not None:
            names, types = list(column_names), list(column_type_names)
        else:
            context = await self.shards[0].create_insert_context(table, column_names, database)
            names, types = list(context.column_names), [t.name for t in context.column_types]
        parts = self._parts(
            table, data, names, types, sharding_key=sharding_key, column_oriented=column_oriented, settings=settings,
        )
        results: list[Any] = []
        for part in parts:
            try:
                results.append(await self.shards[part.position].insert(
                    table, part.data, column_names=names, database=database, column_type_names=types,
                    column_oriented=column_oriented, settings=part.settings,
                ))
            except Exception as exc:  # reported with the other parts' outcomes
                results.append(exc)
        return self._outcome(table, parts, results)

    async def close(self) -> None:
        """Close every shard's pool."""
        await asyncio.gather(*(pool.close() for pool in self.shards))

    async def __aenter__(self) -> AsyncShardedPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Pending:
    """``await get_async_sharded_pool(...)``: builds (and connects) every shard's pool."""

    def __init__(self, hosts: HostList | None, cluster: str | None, shards: Sequence[HostList] | None,
                 shard_weights: Sequence[int] | None, options: dict[str, Any]) -> None:
        self._args = (hosts, cluster, shards, shard_weights, options)

    def __await__(self) -> Generator[Any, None, AsyncShardedPool]:
        return self._build().__await__()

    async def _build(self) -> AsyncShardedPool:
        hosts, cluster, shards, weights, options = self._args
        if "shard" in options:
            raise ConfigurationError("shard= picks one shard: a sharded pool takes them all (use get_async_pool)")
        # Reading system.clusters blocks: off the loop.
        layout = await asyncio.to_thread(shard_layout, hosts, shards, weights, cluster, options)
        pools: list[AsyncReplicaPool] = []
        try:
            for number, _, group in layout:
                extra: dict[str, Any] = {"cluster": cluster, "shard": number} if cluster is not None else {}
                pools.append(await get_async_pool(group, **extra, **options))
        except BaseException:
            await asyncio.gather(*(pool.close() for pool in pools))
            raise
        return AsyncShardedPool(pools, [n for n, _, _ in layout], [w for _, w, _ in layout])


def get_async_sharded_pool(
    hosts: HostList | None = None,
    *,
    cluster: str | None = None,
    shards: Sequence[HostList] | None = None,
    shard_weights: Sequence[int] | None = None,
    **options: Any,
) -> _Pending:
    """``sharded = await get_async_sharded_pool(...)``: as :func:`~clickhouse_lb.get_sharded_pool`,
    with an :class:`~clickhouse_lb.AsyncReplicaPool` per shard (``get_async_pool``'s keywords)."""
    return _Pending(hosts, cluster, shards, shard_weights, dict(options))
