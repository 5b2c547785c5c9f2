"""Read a cluster's shards (numbers, weights, replicas) from a seed, with the options a pool
would use to reach it: the same validation, credentials, TLS and timeouts as ``get_pool``; and
how a re-read layout replaces a sharded pool's view (decided without I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clickhouse_lb.config.discovery import DiscoveryError
from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.discovery import ShardLayout
from clickhouse_lb.core.events import logger
from clickhouse_lb.pools._base import discovery_reader
from clickhouse_lb.pools._factory_arguments import factory_arguments


def discover_shards(
    hosts: str | Replica | Iterable[str | Replica] | None, cluster: str, options: dict[str, Any]
) -> list[ShardLayout]:
    arguments = factory_arguments(hosts, {**options, "cluster": cluster})
    config = resolve_pool_config(
        arguments.hosts, dsn=arguments.dsn, balancing=arguments.balancing,
        client_options=arguments.client_options, valid_client_options=sync_client_option_names(),
        share_state=arguments.share_state,
    )
    reader = discovery_reader(config)
    try:
        return reader.shards(config.replicas)
    finally:
        reader.close()


def rediscover(
    seeds: Sequence[str | Replica], shards: Sequence[Sequence[str]], cluster: str, options: dict[str, Any]
) -> list[ShardLayout] | None:
    """The layout now, asking the seeds and then every replica known (so that the pool still
    follows the cluster when every seed is gone); None when no one answered (logged: the view
    is kept, and the next refresh tries again)."""
    known = {str(s).lower() for s in seeds}
    asked: Any = list(seeds) + [a for addresses in shards for a in addresses if a.lower() not in known]
    if any(isinstance(s, str) and "://" in s for s in seeds):
        asked = seeds[0]  # a DSN: its own hosts, options and credentials, as given
    try:
        return discover_shards(asked, cluster, options)
    except DiscoveryError as exc:
        logger.warning("discovery of cluster %r's shards failed; keeping the current shards: %s", cluster, exc)
        return None


@dataclass(frozen=True)
class LayoutChange:
    """How a re-read layout replaces the current shards. ``layout``: the new shards in
    ``shard_num`` order; ``kept``: a kept shard's number -> its current position (its pool,
    error counts and all, stays); ``moved``: the kept shards whose replicas changed, with the
    new ones; ``added``: the new shards' layouts; ``removed``: the current positions that go."""

    layout: tuple[ShardLayout, ...]
    kept: dict[int, int]
    moved: dict[int, tuple[Replica, ...]]
    added: tuple[ShardLayout, ...]
    removed: tuple[int, ...]
    reweighted: bool

    @property
    def unchanged(self) -> bool:
        return not (self.moved or self.added or self.removed or self.reweighted)


def layout_change(
    shard_nums: Sequence[int], weights: Sequence[int], addresses: Sequence[Sequence[str]],
    layout: Sequence[ShardLayout],
) -> LayoutChange:
    """Compare the current shards (numbers, weights, each pool's replica addresses) with
    ``layout``; replicas compare by address, case-insensitively (as a pool does)."""
    current = {number: position for position, number in enumerate(shard_nums)}
    kept: dict[int, int] = {}
    moved: dict[int, tuple[Replica, ...]] = {}
    added: list[ShardLayout] = []
    for shard in layout:
        position = current.get(shard.shard_num)
        if position is None:
            added.append(shard)
            continue
        kept[shard.shard_num] = position
        if sorted(a.lower() for a in addresses[position]) != sorted(r.address.lower() for r in shard.replicas):
            moved[shard.shard_num] = shard.replicas
    wanted = {s.shard_num for s in layout}
    removed = tuple(position for number, position in current.items() if number not in wanted)
    reweighted = [s.weight for s in layout] != list(weights)
    return LayoutChange(tuple(layout), kept, moved, tuple(added), removed, reweighted)
