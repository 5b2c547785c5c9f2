"""ShardedPool: one object over a sharded cluster, a :class:`ReplicaPool` per shard.

Each shard is balanced and failed over by its own pool (the pool's strategy, error counts and
health probes, over that shard's replicas only). ``insert(..., sharding_key=...)`` splits the
rows as a ``Distributed`` table would (:mod:`clickhouse_lb.core.sharding`) and writes each
part to its shard's local table through that shard's failover.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.sharding import slot_table
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools._sharded_base import DEFAULT_KEY_TYPE_CACHE_MS, ShardedBase, key_type_cache_ms, routed_sync
from clickhouse_lb.pools._sharded_insert import RoutedInsert, ShardedInsertSummary
from clickhouse_lb.pools.pool import ReplicaPool, get_pool

__all__ = ["ShardedPool", "get_sharded_pool", "shard_layout", "shard_pool_arguments"]

HostList = str | Replica | Iterable[str | Replica]


class ShardedPool(ShardedBase[ReplicaPool]):
    """A pool per shard (``.shards``, in ``shard_num`` order) and inserts routed by sharding key.

    Statements other than routed inserts go to one shard's pool: ``sharded.shards[0].query(...)``
    (a ``Distributed`` table answers from any shard), ``sharded.shard(2).command(...)``.
    """

    def insert(
        self, table: str | None = None, data: Sequence[Any] | None = None, column_names: str | Sequence[str] = "*",
        *, sharding_key: str, database: str | None = None, column_type_names: Sequence[str] | None = None,
        column_oriented: bool = False, settings: Mapping[str, Any] | None = None, context: Any = None,
    ) -> ShardedInsertSummary:
        """Insert ``data`` into each shard's ``table`` (the shards' local table), every row on
        the shard a ``Distributed`` table with this ``sharding_key`` would put it on
        (``"id"``, ``"cityHash64(id)"``, ``"sipHash64(id)"``, ``"intHash64(id)"``, ``"rand()"``).

        The parts are written one after the other, each through its shard's failover and
        with its own deduplication token (derived from ``insert_deduplication_token`` when
        ``settings`` has one), so a retried part is never doubled. A part that fails does not
        stop the others: :class:`~clickhouse_lb.errors.ShardedInsertError` then names what was
        written and what failed. The column names and types are read once, from one shard,
        unless ``column_names`` and ``column_type_names`` are given. Row data is handed to
        each part's insert as columns (``column_oriented=True``: the same values, without
        clickhouse-connect transposing them again).

        ``context``: a prepared ``InsertContext`` (any shard pool's ``create_insert_context``),
        which then gives the table, the columns and the server settings, as in clickhouse-connect;
        ``data`` or the rows the context holds are routed, each part written with a copy of the
        context, and the context is empty afterwards (ready for the next batch)."""
        return self._route(self._plan_insert(
            table, data, column_names, sharding_key=sharding_key, database=database,
            column_type_names=column_type_names, column_oriented=column_oriented, settings=settings,
            context=context,
        ))

    insert_df = routed_sync(ShardedBase._plan_insert_df, "insert_df")
    insert_arrow = routed_sync(ShardedBase._plan_insert_arrow, "insert_arrow")
    insert_df_arrow = routed_sync(ShardedBase._plan_insert_df_arrow, "insert_df_arrow")
    data_insert = routed_sync(ShardedBase._plan_data_insert, "data_insert")

    def _route(self, plan: RoutedInsert[ReplicaPool]) -> ShardedInsertSummary:
        with plan:
            for pending in plan.pending(plan.describe and plan.describer.create_insert_context(*plan.describe)):
                part = pending.result()
                if plan.settled(part):
                    continue
                with plan.writing(part):
                    plan.done(part, part.send(plan.pool(part)))
        return plan.outcome()

    def _spawn_refresher(self, interval: float) -> None:
        self._stop = threading.Event()
        threading.Thread(target=_refresh_loop, args=(weakref.ref(self), self._stop, interval),
                         name="clickhouse-lb-shards", daemon=True).start()
        # A pool dropped without close(): the thread ends at its next wake, when its weak
        # reference is dead. No finalizer sets the event: set() takes the event's lock, and a
        # finalizer runs wherever the garbage collector does, inside that very lock included.

    def _refresh(self) -> None:
        """Re-read the shard set and replace the view when it changed (on the refresh thread)."""
        change = self._change(self._rediscover())
        if change is None:
            return
        added: list[ReplicaPool] = []
        try:
            for shard in change.added:
                added.append(get_pool(list(shard.replicas), cluster=self._cluster, shard=shard.shard_num,
                                      **self._options))
        except Exception as exc:  # a new shard not reachable yet: the next refresh tries again
            logger.warning("cluster %r: a new shard's pool could not be made; keeping the shards: %s",
                           self._cluster, exc)
            _close_pools(added)
            return
        self._install(change, added, _close_pools)

    def close(self) -> None:
        """Close every shard's pool (and stop following the cluster)."""
        with self._lock:
            self._closed = True
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        _close_pools(self._view.pools)

    def __enter__(self) -> ShardedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_pools(pools: Iterable[ReplicaPool]) -> None:
    for pool in pools:
        pool.close()


def _refresh_loop(ref: weakref.ref[ShardedPool], stop: threading.Event, interval: float) -> None:
    # Holds the pool only while refreshing, so that a pool dropped without close() can go.
    while not stop.wait(interval):
        pool = ref()
        if pool is None:
            return
        try:
            pool._refresh()
        except Exception:  # never let the thread die: the next refresh tries again
            logger.exception("cluster %r: refreshing the shards failed", pool._cluster)
        del pool


def shard_layout(
    hosts: HostList | None, shards: Sequence[HostList] | None, shard_weights: Sequence[int] | None,
    cluster: str | None, options: dict[str, Any],
) -> list[tuple[int, int, list[str | Replica] | HostList]]:
    """``[(shard_num, weight, hosts), ...]``: given shard by shard, or read from ``system.clusters``."""
    if "shard" in options:
        raise ConfigurationError("shard= picks one shard: a sharded pool takes them all (use get_pool for one)")
    if shards is not None:
        if hosts is not None or cluster is not None:
            raise ConfigurationError("Give the shards once: shards=[[...], [...]] or hosts= with cluster=, not both")
        if isinstance(shards, (str, bytes)) or not shards:
            raise ConfigurationError(f"Bad shards {shards!r}: expected a list with one list of hosts per shard")
        weights = list(shard_weights) if shard_weights is not None else [1] * len(shards)
        if len(weights) != len(shards):
            raise ConfigurationError(
                f"Bad shard_weights {weights!r}: expected one weight for each of the {len(shards)} shards"
            )
        slot_table(weights)  # refused before any shard's pool is made
        return [(number, weight, group) for number, (weight, group) in enumerate(zip(weights, shards), start=1)]
    if cluster is None:
        raise ConfigurationError("A sharded pool needs shards=[[...], [...]], or hosts= (seeds) with cluster=")
    if shard_weights is not None:
        raise ConfigurationError("shard_weights is read from system.clusters when the shards are discovered")
    from clickhouse_lb.pools._sharded_discovery import discover_shards

    discovered = discover_shards(hosts, cluster, options)
    slot_table([s.weight for s in discovered])  # every weight 0 in system.clusters: no pool made either
    return [(s.shard_num, s.weight, list(s.replicas)) for s in discovered]


def shard_pool_arguments(
    layout: Sequence[tuple[int, int, Any]], cluster: str | None, options: dict[str, Any]
) -> list[tuple[Any, dict[str, Any]]]:
    """Each shard's pool's hosts and keywords: discovered shards keep discovering their replicas."""
    return [(group, {**options, **({"cluster": cluster, "shard": number} if cluster is not None else {})})
            for number, _, group in layout]


def get_sharded_pool(
    hosts: HostList | None = None, *, cluster: str | None = None, shards: Sequence[HostList] | None = None,
    shard_weights: Sequence[int] | None = None, sharding_key_type_cache_ms: int = DEFAULT_KEY_TYPE_CACHE_MS,
    **options: Any,
) -> ShardedPool:
    """A :class:`ShardedPool` over every shard of ``cluster``, read from ``system.clusters`` on
    the first of ``hosts`` (seeds) that answers (each shard's pool then keeps discovering its
    own replicas, as ``get_pool(cluster=..., shard=N)`` does, and the sharded pool re-reads the
    shard set every ``cluster_discovery_interval_ms``, replacing its view whole when shards,
    weights or replicas changed: see docs/sharding.md), or over ``shards`` given shard
    by shard (``[["ch-1:8123", "ch-2:8123"], ["ch-3:8123", "ch-4:8123"]]``, weights 1 unless
    ``shard_weights``). ``sharding_key_type_cache_ms``: how long an Arrow insert's key column
    type, read from the first shard, is remembered per table (0: read for every insert). Every
    other keyword is ``get_pool``'s, for every shard's pool."""
    key_type_cache_ms(sharding_key_type_cache_ms)  # refused before any I/O
    layout = shard_layout(hosts, shards, shard_weights, cluster, options)
    pools: list[ReplicaPool] = []
    try:
        for group, extra in shard_pool_arguments(layout, cluster, options):
            pools.append(get_pool(group, **extra))
        sharded = ShardedPool(pools, [n for n, _, _ in layout], [w for _, w, _ in layout],
                              cluster=cluster, seeds=_seeds(hosts), options=options,
                              sharding_key_type_cache_ms=sharding_key_type_cache_ms)
        sharded._start_refresh()
    except BaseException:  # no pool made here outlives a failure: nobody else holds them
        _close_pools(pools)
        raise
    return sharded


def _seeds(hosts: HostList | None) -> list[str | Replica]:
    if hosts is None:
        return []
    return [hosts] if isinstance(hosts, (str, Replica)) else list(hosts)
