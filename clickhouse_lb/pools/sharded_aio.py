"""AsyncShardedPool: the async twin of :class:`~clickhouse_lb.pools.sharded.ShardedPool`, an
:class:`~clickhouse_lb.pools.aio.AsyncReplicaPool` per shard. Layout, routing and outcomes are
the shared ones (:mod:`clickhouse_lb.pools._sharded_base`); only the awaits differ."""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Sequence
from typing import Any

from clickhouse_lb.core.events import logger
from clickhouse_lb.pools._sharded_base import DEFAULT_KEY_TYPE_CACHE_MS, ShardedBase, key_type_cache_ms, routed_async
from clickhouse_lb.pools._sharded_insert import RoutedInsert, ShardedInsertSummary
from clickhouse_lb.pools.aio import AsyncReplicaPool, get_async_pool
from clickhouse_lb.pools.sharded import HostList, _seeds, shard_layout, shard_pool_arguments

__all__ = ["AsyncShardedPool", "get_async_sharded_pool"]


class AsyncShardedPool(ShardedBase[AsyncReplicaPool]):
    """An async pool per shard (``.shards``, in ``shard_num`` order) and routed inserts:
    ``insert``, ``insert_df``, ``insert_arrow``, ``insert_df_arrow`` and ``data_insert`` take
    :class:`~clickhouse_lb.pools.sharded.ShardedPool`'s parameters (the same plans) and are
    awaited."""

    _refresher: asyncio.Task[None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Removed shards' pools being closed (held: the loop keeps only weak references to tasks).
        self._closing: set[asyncio.Task[None]] = set()

    insert = routed_async(ShardedBase._plan_insert, "insert")
    insert_df = routed_async(ShardedBase._plan_insert_df, "insert_df")
    insert_arrow = routed_async(ShardedBase._plan_insert_arrow, "insert_arrow")
    insert_df_arrow = routed_async(ShardedBase._plan_insert_df_arrow, "insert_df_arrow")
    data_insert = routed_async(ShardedBase._plan_data_insert, "data_insert")

    async def _route(self, plan: RoutedInsert[AsyncReplicaPool]) -> ShardedInsertSummary:
        with plan:
            for pending in plan.pending(plan.describe and await plan.describer.create_insert_context(*plan.describe)):
                part = pending.result() if pending.done() else await asyncio.wrap_future(pending)
                if plan.settled(part):
                    continue
                with plan.writing(part):
                    plan.done(part, await part.send(plan.pool(part)))
        return plan.outcome()

    def _spawn_refresher(self, interval: float) -> None:
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop(interval))

    async def _refresh_loop(self, interval: float) -> None:
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                await self._refresh()
            except Exception:  # never let the task die: the next refresh tries again
                logger.exception("cluster %r: refreshing the shards failed", self._cluster)

    async def _refresh(self) -> None:
        """Re-read the shard set (in a thread: the read blocks) and replace the view on the loop."""
        change = self._change(await asyncio.to_thread(self._rediscover))
        if change is None:
            return
        added: list[AsyncReplicaPool] = []
        try:
            for shard in change.added:
                added.append(await get_async_pool(list(shard.replicas), cluster=self._cluster,
                                                  shard=shard.shard_num, **self._options))
        except Exception as exc:  # a new shard not reachable yet: the next refresh tries again
            logger.warning("cluster %r: a new shard's pool could not be made; keeping the shards: %s",
                           self._cluster, exc)
            await _close_pools(added)
            return
        self._install(change, added, self._close_later)

    def _close_later(self, pools: list[AsyncReplicaPool]) -> None:
        """Runs on the loop (a routed insert's end, or the refresh): the closing is a task."""
        task = asyncio.get_running_loop().create_task(_close_pools(pools))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every shard's pool (and stop following the cluster)."""
        with self._lock:
            self._closed = True
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)
        await _close_pools(self._view.pools)

    async def __aenter__(self) -> AsyncShardedPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _close_pools(pools: Sequence[AsyncReplicaPool]) -> None:
    await asyncio.gather(*(pool.close() for pool in pools))


class _Pending:
    """``await get_async_sharded_pool(...)``: builds (and connects) every shard's pool."""

    def __init__(self, hosts: HostList | None, cluster: str | None, shards: Sequence[HostList] | None,
                 shard_weights: Sequence[int] | None, options: dict[str, Any], *, cache_ms: int) -> None:
        self._key_type_cache_ms = key_type_cache_ms(cache_ms)  # refused before any I/O
        self._args = (hosts, cluster, shards, shard_weights, options)

    def __await__(self) -> Generator[Any, None, AsyncShardedPool]:
        return self._build().__await__()

    async def _build(self) -> AsyncShardedPool:
        hosts, cluster, shards, weights, options = self._args
        # Reading system.clusters blocks: off the loop.
        layout = await asyncio.to_thread(shard_layout, hosts, shards, weights, cluster, options)
        pools: list[AsyncReplicaPool] = []
        try:
            for group, extra in shard_pool_arguments(layout, cluster, options):
                pools.append(await get_async_pool(group, **extra))
            sharded = AsyncShardedPool(pools, [n for n, _, _ in layout], [w for _, w, _ in layout],
                                       cluster=cluster, seeds=_seeds(hosts), options=options,
                                       sharding_key_type_cache_ms=self._key_type_cache_ms)
            sharded._start_refresh()
        except BaseException:  # no pool made here outlives a failure: nobody else holds them
            await _close_pools(pools)
            raise
        return sharded


def get_async_sharded_pool(
    hosts: HostList | None = None, *, cluster: str | None = None, shards: Sequence[HostList] | None = None,
    shard_weights: Sequence[int] | None = None, sharding_key_type_cache_ms: int = DEFAULT_KEY_TYPE_CACHE_MS,
    **options: Any,
) -> _Pending:
    """``sharded = await get_async_sharded_pool(...)``: as :func:`~clickhouse_lb.get_sharded_pool`,
    with an :class:`~clickhouse_lb.AsyncReplicaPool` per shard (``get_async_pool``'s keywords)."""
    return _Pending(hosts, cluster, shards, shard_weights, dict(options), cache_ms=sharding_key_type_cache_ms)
