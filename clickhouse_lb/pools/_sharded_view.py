"""The shards of a sharded pool as one value (:class:`ShardView`), replaced whole when
discovery sees the cluster change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from clickhouse_lb.errors import ConfigurationError

if TYPE_CHECKING:
    from clickhouse_lb.pools._base import PoolBase

__all__ = ["ShardView"]

P = TypeVar("P", bound="PoolBase")


@dataclass(frozen=True)
class ShardView(Generic[P]):
    """The shards as one value: replaced whole when discovery sees the cluster change, and
    read once by each statement (a routed insert routes and writes over one view)."""

    pools: tuple[P, ...]
    shard_nums: tuple[int, ...]
    weights: tuple[int, ...]
    slots: tuple[int, ...]

    @classmethod
    def of(cls, pools: Sequence[P], shard_nums: Sequence[int], weights: Sequence[int]) -> ShardView[P]:
        from clickhouse_lb.core.sharding import slot_table

        if not (len(pools) == len(shard_nums) == len(weights)) or not pools:
            raise ConfigurationError("A sharded pool needs one pool, one shard number and one weight per shard")
        return cls(tuple(pools), tuple(shard_nums), tuple(weights), slot_table(list(weights)))
