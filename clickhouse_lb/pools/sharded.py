"""ShardedPool: one object over a sharded cluster, a :class:`ReplicaPool` per shard.

Each shard is balanced and failed over by its own pool (the pool's strategy, error counts and
health probes, over that shard's replicas only). ``insert(..., sharding_key=...)`` splits the
rows as a ``Distributed`` table would (:mod:`clickhouse_lb.core.sharding`) and writes each
part to its shard's local table through that shard's failover.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools._sharded_base import ShardedBase, ShardedInsertSummary
from clickhouse_lb.pools.pool import ReplicaPool, get_pool

__all__ = ["ShardedPool", "get_sharded_pool", "shard_layout"]

HostList = str | Replica | Iterable[str | Replica]


class ShardedPool(ShardedBase[ReplicaPool]):
    """A pool per shard (``.shards``, in ``shard_num`` order) and inserts routed by sharding key.

    Statements other than routed inserts go to one shard's pool: ``sharded.shards[0].query(...)``
    (a ``Distributed`` table answers from any shard), ``sharded.shard(2).command(...)``.
    """

    def insert(
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
        """Insert ``data`` into each shard's ``table`` (the shards' local table), every row on
        the shard a ``Distributed`` table with this ``sharding_key`` would put it on
        (``"id"``, ``"cityHash64(id)"``, ``"sipHash64(id)"``, ``"intHash64(id)"``, ``"rand()"``).

        The parts are written one after the other, each through its shard's failover and
        with its own deduplication token (derived from ``insert_deduplication_token`` when
        ``settings`` has one), so a retried part is never doubled. A part that fails does not
        stop the others: :class:`~clickhouse_lb.errors.ShardedInsertError` then names what was
        written and what failed. The column names and types are read once, from one shard,
        unless ``column_names`` and ``column_type_names`` are given."""
        names, types = self._columns(table, column_names, column_type_names, database)
        parts = self._parts(
            table, data, names, types,
            sharding_key=sharding_key, column_oriented=column_oriented, settings=settings,
        )
        results: list[Any] = []
        for part in parts:
            try:
                results.append(self.shards[part.position].insert(
                    table, part.data, column_names=names, database=database, column_type_names=types,
                    column_oriented=column_oriented, settings=part.settings,
                ))
            except Exception as exc:  # reported with the other parts' outcomes
                results.append(exc)
        return self._outcome(table, parts, results)

    def _columns(
        self, table: str, column_names: str | Sequence[str], column_type_names: Sequence[str] | None,
        database: str | None,
    ) -> tuple[list[str], list[str]]:
        if column_names != "*" and column_type_names is not None:
            return list(column_names), list(column_type_names)
        context = self._describer().create_insert_context(table, column_names, database)
        return list(context.column_names), [t.name for t in context.column_types]

    def _describer(self) -> ReplicaPool:
        return self.shards[0]

    def close(self) -> None:
        """Close every shard's pool."""
        for pool in self.shards:
            pool.close()

    def __enter__(self) -> ShardedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        shards = ", ".join(f"{n}(w{w}): {p.addresses}" for n, w, p in zip(self.shard_nums, self.weights, self.shards))
        return f"<ShardedPool {shards}>"


def shard_layout(
    hosts: HostList | None, shards: Sequence[HostList] | None, shard_weights: Sequence[int] | None,
    cluster: str | None, options: dict[str, Any],
) -> list[tuple[int, int, list[str | Replica] | HostList]]:
    """``[(shard_num, weight, hosts), ...]``: given shard by shard, or read from ``system.clusters``."""
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
        return [(number, weight, group) for number, (weight, group) in enumerate(zip(weights, shards), start=1)]
    if cluster is None:
        raise ConfigurationError("A sharded pool needs shards=[[...], [...]], or hosts= (seeds) with cluster=")
    if shard_weights is not None:
        raise ConfigurationError("shard_weights is read from system.clusters when the shards are discovered")
    from clickhouse_lb.pools._sharded_discovery import discover_shards

    return [(s.shard_num, s.weight, list(s.replicas)) for s in discover_shards(hosts, cluster, options)]


def get_sharded_pool(
    hosts: HostList | None = None,
    *,
    cluster: str | None = None,
    shards: Sequence[HostList] | None = None,
    shard_weights: Sequence[int] | None = None,
    **options: Any,
) -> ShardedPool:
    """A :class:`ShardedPool` over every shard of ``cluster``, read from ``system.clusters`` on
    the first of ``hosts`` (seeds) that answers (each shard's pool then keeps discovering its
    own replicas, as ``get_pool(cluster=..., shard=N)`` does), or over ``shards`` given shard
    by shard (``[["ch-1:8123", "ch-2:8123"], ["ch-3:8123", "ch-4:8123"]]``, weights 1 unless
    ``shard_weights``). Every other keyword is ``get_pool``'s, for every shard's pool."""
    if "shard" in options:
        raise ConfigurationError("shard= picks one shard: a sharded pool takes them all (use get_pool for one)")
    layout = shard_layout(hosts, shards, shard_weights, cluster, options)
    pools: list[ReplicaPool] = []
    try:
        for number, _, group in layout:
            extra: dict[str, Any] = {"cluster": cluster, "shard": number} if cluster is not None else {}
            pools.append(get_pool(group, **extra, **options))
    except BaseException:
        for pool in pools:
            pool.close()
        raise
    return ShardedPool(pools, [n for n, _, _ in layout], [w for _, w, _ in layout])
