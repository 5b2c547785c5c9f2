"""What the sync and async sharded pools share: the layout, and how an insert is cut into parts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Generic, TypeVar

from clickhouse_lb.errors import ConfigurationError, ShardedInsertError

P = TypeVar("P")


@dataclass(frozen=True)
class InsertPart:
    """The rows of one insert that go to one shard, ready for that shard's pool."""

    shard_num: int
    position: int
    rows: int
    data: Any
    settings: dict[str, Any] | None


@dataclass(frozen=True)
class ShardedInsertSummary:
    """What a routed insert wrote: ``summaries`` by shard number (clickhouse-connect's
    QuerySummary of each part), ``rows`` by shard number."""

    summaries: dict[int, Any]
    rows: dict[int, int]

    @property
    def written_rows(self) -> int:
        return sum(self.rows.values())


def _column_index(column_names: Sequence[str], column: str, table: str) -> int:
    try:
        return list(column_names).index(column)
    except ValueError:
        raise ConfigurationError(
            f"The sharding key's column {column!r} is not among the columns inserted into {table}: "
            f"{', '.join(column_names)}"
        ) from None


class ShardedBase(Generic[P]):
    """Shards in ``shard_num`` order, each a pool of its own, with the cluster's weights."""

    def __init__(self, shards: Sequence[P], shard_nums: Sequence[int], weights: Sequence[int]) -> None:
        from clickhouse_lb.core.sharding import slot_table

        if not (len(shards) == len(shard_nums) == len(weights)) or not shards:
            raise ConfigurationError("A sharded pool needs one pool, one shard number and one weight per shard")
        #: One pool per shard, in ``shard_num`` order.
        self.shards: list[P] = list(shards)
        self.shard_nums: tuple[int, ...] = tuple(shard_nums)
        self.weights: tuple[int, ...] = tuple(weights)
        self._slots = slot_table(self.weights)

    def shard(self, shard_num: int) -> P:
        """The pool of the shard numbered ``shard_num`` (as in ``system.clusters``)."""
        try:
            return self.shards[self.shard_nums.index(shard_num)]
        except ValueError:
            raise ConfigurationError(
                f"No shard {shard_num!r}; the shards are {', '.join(map(str, self.shard_nums))}"
            ) from None

    def _parts(
        self,
        table: str,
        data: Sequence[Any],
        column_names: Sequence[str],
        column_type_names: Sequence[str],
        *,
        sharding_key: str,
        column_oriented: bool,
        settings: Mapping[str, Any] | None,
    ) -> list[InsertPart]:
        from clickhouse_lb.core.sharding import parse_sharding_key, part_token, route, value_type

        key = parse_sharding_key(sharding_key)
        if settings is not None and not isinstance(settings, Mapping):
            raise ConfigurationError(f"Bad settings {settings!r}: expected a mapping of setting names to values")
        rows = len(data[0]) if column_oriented and len(data) else len(data)
        values: Sequence[Any] | None = None
        kind = None
        if key.column is not None:
            index = _column_index(column_names, key.column, table)
            values = data[index] if column_oriented else list(map(itemgetter(index), data))
            kind = value_type(column_type_names[index])
        groups = route(key, values, kind, rows, slots=self._slots, shards=len(self.shards))
        token = (settings or {}).get("insert_deduplication_token")
        parts = []
        for position, indices in enumerate(groups):
            if not indices:
                continue
            number = self.shard_nums[position]
            if column_oriented:
                part: Any = [[column[i] for i in indices] for column in data]
            else:
                part = list(map(data.__getitem__, indices))
            own = dict(settings or {})
            if token is not None:
                own["insert_deduplication_token"] = part_token(token, number)
            parts.append(InsertPart(number, position, len(indices), part, own or None))
        return parts

    @staticmethod
    def _outcome(table: str, parts: Sequence[InsertPart], results: Sequence[Any]) -> ShardedInsertSummary:
        """The summary when every part was written, else ShardedInsertError naming each part."""
        failed = {p.shard_num: r for p, r in zip(parts, results) if isinstance(r, Exception)}
        rows = {p.shard_num: p.rows for p in parts}
        written = {p.shard_num: p.rows for p, r in zip(parts, results) if not isinstance(r, Exception)}
        if failed:
            error = ShardedInsertError(table, written, failed, rows)
            raise error from next(iter(failed.values()))
        return ShardedInsertSummary({p.shard_num: r for p, r in zip(parts, results)}, rows)
