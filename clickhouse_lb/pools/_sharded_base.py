"""What the sync and async sharded pools share: the view of the shards, and a routed insert
as a plan without I/O (which parts go where, with which token, and what the outcome is); the
two pools only drive it, one with calls and one with awaits."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from clickhouse_lb.core.discovery import InFlight
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.shard_split import Form
from clickhouse_lb.errors import ConfigurationError, ShardedInsertError

if TYPE_CHECKING:
    from clickhouse_lb.config.replicas import Replica
    from clickhouse_lb.pools._base import PoolBase
    from clickhouse_lb.pools._read_your_writes import ReadYourWritesMember
    from clickhouse_lb.pools._sharded_discovery import LayoutChange

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


@dataclass(frozen=True)
class InsertPart:
    """The rows of one insert that go to one shard, ready for that shard's pool."""

    shard_num: int
    position: int
    rows: int
    data: Any
    settings: dict[str, Any] | None
    method: str = "insert"
    table: str = ""
    options: Mapping[str, Any] | None = None

    def send(self, pool: Any) -> Any:
        """Write this part through ``pool`` (a coroutine to await for an async pool)."""
        return getattr(pool, self.method)(self.table, self.data, settings=self.settings, **(self.options or {}))


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


class _NotSent(Exception):
    """The outcome of a part the driver never reached (cannot happen when it drives every part)."""


_NOT_SENT = _NotSent("the part was not sent")


class RoutedInsert(Generic[P]):
    """One routed insert over one view. The driver, inside ``with plan:``, asks the first shard
    for the insert context when :attr:`describe` is set and passes it to :meth:`parts`, writes
    each part through :meth:`pool` inside ``with plan.writing(part):`` (:meth:`done` with the
    result; an exception becomes the part's outcome), and returns :meth:`outcome`."""

    def __init__(
        self, in_flight: InFlight[ShardView[P]], view: ShardView[P], method: str, table: str, data: Any, *,
        form: Form, sharding_key: str, column_names: Sequence[str] | None, column_type_names: Sequence[str] | None,
        settings: Mapping[str, Any] | None, options: dict[str, Any], describe: bool,
    ) -> None:
        from clickhouse_lb.core.sharding import parse_sharding_key

        self.key = parse_sharding_key(sharding_key)
        if settings is not None and not isinstance(settings, Mapping):
            raise ConfigurationError(f"Bad settings {settings!r}: expected a mapping of setting names to values")
        self._in_flight = in_flight
        self.view, self.method, self.table, self.data, self.form = view, method, table, data, form
        self.settings = dict(settings or {})
        self.options = options
        self.names = list(column_names) if column_names is not None else None
        self.types = list(column_type_names) if column_type_names is not None else None
        #: ``(table, column_names, database)`` to ask the first shard for, or None.
        self.describe: tuple[str, Any, Any] | None = (
            (table, column_names if column_names is not None else "*", options.get("database")) if describe else None
        )
        self._parts: list[InsertPart] = []
        #: Each part's outcome by shard position: its summary, or the exception it raised.
        self._results: dict[int, Any] = {}

    def __enter__(self) -> None:
        """While the insert runs, its view counts it in flight (see :meth:`ShardedBase._install`)."""
        self._in_flight.acquire(self.view)

    def __exit__(self, *exc: object) -> None:
        self._in_flight.release(self.view)

    @property
    def describer(self) -> P:
        return self.view.pools[0]

    def pool(self, part: InsertPart) -> P:
        return self.view.pools[part.position]

    @contextmanager
    def writing(self, part: InsertPart) -> Iterator[None]:
        """A part that fails does not stop the others: its exception is its outcome."""
        try:
            yield
        except Exception as exc:
            self.done(part, exc)

    def parts(self, context: Any = None) -> list[InsertPart]:
        """The parts to write, in shard order; ``context``: the insert context of
        :attr:`describe` when it was set (the columns as clickhouse-connect has them)."""
        from clickhouse_lb.core.shard_split import key_column, row_count, take
        from clickhouse_lb.core.sharding import part_token, route, value_type

        if context:
            self.names = list(context.column_names)
            self.types = [t.name for t in context.column_types]
        view, key, rows = self.view, self.key, row_count(self.data, self.form)
        values, kind = None, None
        if key.column is not None:
            if self.names is None or self.types is None:
                raise ConfigurationError(f"The columns of {self.table} are needed to route by {key.text}")
            index = _column_index(self.names, key.column, self.table)
            kind = value_type(self.types[index])
            values = key_column(self.data, self.form, index, kind)
        groups = route(key, values, kind, rows, slots=view.slots, shards=len(view.pools))
        token = self.settings.get("insert_deduplication_token")
        for position, indices in enumerate(groups):
            if not len(indices):
                continue
            number = view.shard_nums[position]
            own = dict(self.settings)
            if token is not None:
                own["insert_deduplication_token"] = part_token(token, number)
            self._parts.append(InsertPart(
                number, position, len(indices), take(self.data, self.form, indices), own or None,
                self.method, self.table, self._part_options(),
            ))
        return list(self._parts)

    def _part_options(self) -> dict[str, Any]:
        options = dict(self.options)
        if self.form != "arrow":  # the parts need not describe the table again
            options["column_names"], options["column_type_names"] = self.names, self.types
        return options

    def done(self, part: InsertPart, result: Any) -> None:
        self._results[part.position] = result

    def outcome(self) -> ShardedInsertSummary:
        """The summary when every part was written, else ShardedInsertError naming each part."""
        parts = self._parts
        results = [self._results.get(p.position, _NOT_SENT) for p in parts]
        failed = {p.shard_num: r for p, r in zip(parts, results) if isinstance(r, Exception)}
        rows = {p.shard_num: p.rows for p in parts}
        written = {p.shard_num: p.rows for p, r in zip(parts, results) if not isinstance(r, Exception)}
        if failed:
            error = ShardedInsertError(self.table, written, failed, rows)
            raise error from next(iter(failed.values()))
        return ShardedInsertSummary({p.shard_num: r for p, r in zip(parts, results)}, rows)


class ShardedReadYourWrites:
    """``with sharded.read_your_writes():`` (``async with`` too): the block of every shard's
    pool at once (see :meth:`ShardedBase.read_your_writes`)."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks: Sequence[Any]) -> None:
        self._blocks = list(blocks)

    def __enter__(self) -> ShardedReadYourWrites:
        entered: list[Any] = []
        try:
            for block in self._blocks:
                block.__enter__()
                entered.append(block)
        except BaseException:
            for block in reversed(entered):
                block.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for block in reversed(self._blocks):
            block.__exit__(*exc)

    async def __aenter__(self) -> ShardedReadYourWrites:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)


class ShardedBase(Generic[P]):
    """Shards in ``shard_num`` order, each a pool of its own, with the cluster's weights."""

    def __init__(
        self, shards: Sequence[P], shard_nums: Sequence[int], weights: Sequence[int], *,
        cluster: str | None = None, seeds: Sequence[str | Replica] = (), options: Mapping[str, Any] | None = None,
    ) -> None:
        self._view: ShardView[P] = ShardView.of(shards, shard_nums, weights)
        #: Discovery of the shard set (None: given shard by shard, fixed).
        self._cluster = cluster
        self._seeds = list(seeds)
        self._options = dict(options or {})
        #: Routed inserts running per view: a removed shard's pool closes once they are done.
        self._in_flight: InFlight[ShardView[P]] = InFlight()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def shards(self) -> list[P]:
        """One pool per shard, in ``shard_num`` order."""
        return list(self._view.pools)

    @property
    def shard_nums(self) -> tuple[int, ...]:
        return self._view.shard_nums

    @property
    def weights(self) -> tuple[int, ...]:
        return self._view.weights

    def shard(self, shard_num: int) -> P:
        """The pool of the shard numbered ``shard_num`` (as in ``system.clusters``)."""
        view = self._view
        try:
            return view.pools[view.shard_nums.index(shard_num)]
        except ValueError:
            raise ConfigurationError(
                f"No shard {shard_num!r}; the shards are {', '.join(map(str, view.shard_nums))}"
            ) from None

    def read_your_writes(self) -> ShardedReadYourWrites:
        """``with sharded.read_your_writes():``: statements of the block in this thread or task,
        on every shard's pool, are under read-your-writes: a routed insert's part is remembered
        with the replica of its shard that acknowledged it, and a read through a shard's pool
        (``sharded.shard(n).query(...)``) goes to a replica of that shard that has it. The
        shards are those of the view when the block opens. See docs/sharding.md."""
        pools = cast("tuple[ReadYourWritesMember, ...]", self._view.pools)
        return ShardedReadYourWrites([pool.read_your_writes() for pool in pools])

    # -- the shard set follows the cluster ------------------------------------------------

    def _refresh_interval(self) -> float | None:
        """Seconds between re-reads of the shard set: the pools' ``cluster_discovery_interval_ms``
        (None: not discovered, or 0, read once)."""
        if self._cluster is None:
            return None
        interval: float | None = self._view.pools[0].config.discovery.interval
        return interval

    def _start_refresh(self) -> None:
        interval = self._refresh_interval()
        if interval is not None:
            self._spawn_refresher(interval)

    def _spawn_refresher(self, interval: float) -> None:
        raise NotImplementedError

    def _change(self, layout: Sequence[Any] | None) -> LayoutChange | None:
        """What a re-read ``layout`` changes (None: nothing, or it could not be read)."""
        from clickhouse_lb.pools._sharded_discovery import layout_change

        if layout is None or self._closed:
            return None
        view = self._view
        addresses = [pool.addresses for pool in view.pools]
        change = layout_change(view.shard_nums, view.weights, addresses, layout)
        return None if change.unchanged else change

    def _install(self, change: LayoutChange, added: Sequence[P], close: Callable[[list[P]], None]) -> None:
        """Replace the view whole: kept shards keep their pools (a kept shard whose replicas
        moved has its pool's replica set replaced, its kept replicas' counts carried over),
        ``added`` are the new shards' pools, removed shards' pools are closed (``close``) once
        the routed inserts running on the old view are done."""
        new = dict(zip((s.shard_num for s in change.added), added))
        with self._lock:
            if self._closed:
                close(list(added))
                return
            old = self._view
            for number, replicas in change.moved.items():
                old.pools[change.kept[number]]._apply_discovered(list(replicas))
            pools = [old.pools[change.kept[s.shard_num]] if s.shard_num in change.kept else new[s.shard_num]
                     for s in change.layout]
            self._view = ShardView.of(pools, [s.shard_num for s in change.layout], [s.weight for s in change.layout])
        logger.info(
            "cluster %r: shards now %s (weights %s; added %s, removed %s)", self._cluster,
            list(self._view.shard_nums), list(self._view.weights), list(new) or "none",
            [old.shard_nums[i] for i in change.removed] or "none",
        )
        removed = [old.pools[i] for i in change.removed]
        if removed:
            self._in_flight.retire(old, lambda: close(removed))

    def _rediscover(self) -> list[Any] | None:
        """The layout now (blocking I/O; None when no one answered)."""
        from clickhouse_lb.pools._sharded_discovery import rediscover

        assert self._cluster is not None
        addresses = [pool.addresses for pool in self._view.pools]
        return rediscover(self._seeds, addresses, self._cluster, self._options)

    # The plans of the three routed inserts; the pools' public methods drive them.

    def _plan_insert(
        self, table: str, data: Any, column_names: str | Sequence[str], *, sharding_key: str,
        database: str | None, column_type_names: Sequence[str] | None, column_oriented: bool,
        settings: Mapping[str, Any] | None,
    ) -> RoutedInsert[P]:
        names = None if column_names == "*" else [column_names] if isinstance(column_names, str) else column_names
        options: dict[str, Any] = {"database": database, "column_oriented": column_oriented}
        return RoutedInsert(
            self._in_flight, self._view, "insert", table, data, form="columns" if column_oriented else "rows",
            sharding_key=sharding_key, column_names=names, column_type_names=column_type_names,
            settings=settings, options=options, describe=names is None or column_type_names is None,
        )

    def _plan_insert_df(
        self, table: str, df: Any, *, sharding_key: str, database: str | None,
        settings: Mapping[str, Any] | None, column_names: Sequence[str] | None,
        column_type_names: Sequence[str] | None,
    ) -> RoutedInsert[P]:
        if column_names is not None and len(column_names) != len(df.columns):
            raise ConfigurationError(
                f"DataFrame column count ({len(df.columns)}) does not match column_names ({len(column_names)})"
            )
        names = list(column_names) if column_names is not None else [str(c) for c in df.columns]
        return RoutedInsert(
            self._in_flight, self._view, "insert_df", table, df, form="dataframe", sharding_key=sharding_key,
            column_names=names, column_type_names=column_type_names, settings=settings, options={"database": database},
            describe=column_type_names is None,
        )

    def _plan_insert_arrow(
        self, table: str, arrow_table: Any, *, sharding_key: str, database: str | None,
        settings: Mapping[str, Any] | None,
    ) -> RoutedInsert[P]:
        plan: RoutedInsert[P] = RoutedInsert(
            self._in_flight, self._view, "insert_arrow", table, arrow_table, form="arrow", sharding_key=sharding_key,
            column_names=list(arrow_table.column_names), column_type_names=None, settings=settings,
            options={"database": database}, describe=True,
        )
        if plan.key.column is None:  # rand(): no type to know, and Arrow carries the parts' own
            plan.describe = None
        return plan
