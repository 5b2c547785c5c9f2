"""What the sync and async sharded pools share: the view of the shards, and the plans of the
routed inserts (:mod:`clickhouse_lb.pools._sharded_insert`: without I/O); the two pools only
drive them, one with calls and one with awaits."""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, cast

from clickhouse_lb.config._values import as_int
from clickhouse_lb.core.discovery import InFlight
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.key_types import KeyTypeMemo
from clickhouse_lb.core.shard_split import Form
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools._sharded_insert import InsertPart, RoutedInsert, ShardedInsertSummary
from clickhouse_lb.pools._sharded_view import ShardView

if TYPE_CHECKING:
    from clickhouse_lb.config.replicas import Replica
    from clickhouse_lb.pools._base import PoolBase
    from clickhouse_lb.pools._read_your_writes import ReadYourWritesMember
    from clickhouse_lb.pools._sharded_discovery import LayoutChange

P = TypeVar("P", bound="PoolBase")
A = ParamSpec("A")
M = TypeVar("M", bound=Callable[..., Any])

__all__ = [
    "InsertPart", "RoutedInsert", "ShardView", "ShardedBase", "ShardedInsertSummary", "routed_async", "routed_sync",
]

#: How long an Arrow insert's sharding key type is remembered: ``sharding_key_type_cache_ms``.
DEFAULT_KEY_TYPE_CACHE_MS = 60_000


def key_type_cache_ms(value: object) -> int:
    """``sharding_key_type_cache_ms`` checked (the factories call it before any I/O)."""
    return as_int("sharding_key_type_cache_ms", value)


#: A plan method of :class:`ShardedBase`: a routed insert's parameters in, its plan out.
Plan = Callable[Concatenate[Any, A], "RoutedInsert[Any]"]


def routed_sync(plan: Plan[A], name: str) -> Callable[Concatenate[Any, A], ShardedInsertSummary]:
    """The public method ``name`` of a sync sharded pool: ``plan``'s parameters and
    docstring (written once, for both pools), the plan driven by ``self._route``."""
    def method(self: Any, /, *args: A.args, **kwargs: A.kwargs) -> ShardedInsertSummary:
        return cast(ShardedInsertSummary, self._route(plan(self, *args, **kwargs)))
    return _public(method, plan, name)


def routed_async(plan: Plan[A], name: str) -> Callable[Concatenate[Any, A], Awaitable[ShardedInsertSummary]]:
    """The coroutine twin of :func:`routed_sync`, for the async sharded pool."""
    async def method(self: Any, /, *args: A.args, **kwargs: A.kwargs) -> ShardedInsertSummary:
        return cast(ShardedInsertSummary, await self._route(plan(self, *args, **kwargs)))
    return _public(method, plan, name)


def _public(method: M, plan: Callable[..., Any], name: str) -> M:
    functools.update_wrapper(method, plan)  # help() and IDEs show the plan's parameters
    method.__name__ = name
    method.__qualname__ = name
    # ... and the method's own result, not the plan's.
    method.__signature__ = inspect.signature(plan).replace(  # type: ignore[attr-defined]
        return_annotation=ShardedInsertSummary.__name__
    )
    return method


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
        sharding_key_type_cache_ms: int = DEFAULT_KEY_TYPE_CACHE_MS,
    ) -> None:
        #: The key column's type per table, for Arrow inserts (see clickhouse_lb.core.key_types).
        self._key_types = KeyTypeMemo(key_type_cache_ms(sharding_key_type_cache_ms) / 1000.0)
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

    def __repr__(self) -> str:  # both pools: each shard's number, weight and replica addresses
        view = self._view
        shards = ", ".join(f"{n}(w{w}): {p.addresses}" for n, w, p in zip(view.shard_nums, view.weights, view.pools))
        return f"<{type(self).__name__} {shards}>"

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

    # The plans of the routed inserts; the pools' public methods drive them.

    def _routed(self, method: str, table: str | None, data: Any, form: Form, **kwargs: Any) -> RoutedInsert[P]:
        return RoutedInsert(self._in_flight, self._view, method, table, data, form=form, **kwargs)

    def _plan_insert(
        self, table: str | None = None, data: Sequence[Any] | None = None, column_names: str | Sequence[str] = "*",
        *, sharding_key: str, database: str | None = None, column_type_names: Sequence[str] | None = None,
        column_oriented: bool = False, settings: Mapping[str, Any] | None = None, context: Any = None,
    ) -> RoutedInsert[P]:
        """The plan of :meth:`ShardedPool.insert <clickhouse_lb.pools.sharded.ShardedPool.insert>`
        (its parameters, for both pools)."""
        if context is not None:
            return self._plan_with_context(data, context, sharding_key=sharding_key, settings=settings)
        if table is None:
            raise ConfigurationError("No table specified for insert (give table=, or context=)")
        if data is None:
            raise ConfigurationError("No data specified for insert")
        names = None if column_names == "*" else [column_names] if isinstance(column_names, str) else column_names
        options: dict[str, Any] = {"database": database, "column_oriented": column_oriented}
        # A pandas DataFrame, which clickhouse-connect's insert takes too (its columns by position):
        # split by DataFrame.take, each part written with the shard pool's insert, as the context plan does.
        form: Form = "dataframe" if _is_pandas(data) else "columns" if column_oriented else "rows"
        return self._routed(
            "insert", table, data, form, sharding_key=sharding_key,
            column_names=names, column_type_names=column_type_names, settings=settings, options=options,
            describe=names is None or column_type_names is None,
        )

    def _plan_data_insert(self, context: Any, *, sharding_key: str) -> RoutedInsert[P]:
        """``insert(context=context, sharding_key=...)``: the rows the prepared ``InsertContext``
        holds (from any shard pool's ``create_insert_context``), routed; each part is written
        with a copy of the context, which is empty afterwards, as after clickhouse-connect's."""
        return self._plan_insert(context=context, sharding_key=sharding_key)

    def _plan_with_context(
        self, data: Any, context: Any, *, sharding_key: str, settings: Mapping[str, Any] | None
    ) -> RoutedInsert[P]:
        """An insert with a prepared clickhouse-connect ``InsertContext`` (``create_insert_context``
        of any shard's pool): the context names the table, the columns and their types."""
        if not all(hasattr(context, a) for a in ("table", "column_names", "column_types", "column_oriented")):
            raise ConfigurationError(f"Bad context {type(context).__name__}: expected an InsertContext "
                                     "(from create_insert_context)")
        if data is not None and not context.empty:
            raise ConfigurationError("Attempting to insert new data with non-empty insert context")
        if data is None:
            data = context.data
            if data is None:
                raise ConfigurationError("No data specified for insert")
        form: Form = "columns" if context.column_oriented else "rows"
        if _is_pandas(data):
            form = "dataframe"
        return self._routed(
            "insert", context.table, data, form, sharding_key=sharding_key,
            column_names=list(context.column_names), column_type_names=[t.name for t in context.column_types],
            settings=settings, options={}, describe=False, context=context,
        )

    def _plan_insert_df(
        self, table: str | None = None, df: Any = None, *, sharding_key: str, database: str | None = None,
        settings: Mapping[str, Any] | None = None, column_names: Sequence[str] | None = None,
        column_type_names: Sequence[str] | None = None, context: Any = None,
    ) -> RoutedInsert[P]:
        """``insert`` of a pandas DataFrame: split by the key column (``DataFrame.take``),
        each part written with its shard pool's ``insert_df``."""
        if context is not None:
            return self._plan_with_context(df, context, sharding_key=sharding_key, settings=settings)
        if table is None or df is None:
            raise ConfigurationError("insert_df needs a table and a DataFrame (or context=)")
        if column_names is not None and len(column_names) != len(df.columns):
            raise ConfigurationError(
                f"DataFrame column count ({len(df.columns)}) does not match column_names ({len(column_names)})"
            )
        names = list(column_names) if column_names is not None else [str(c) for c in df.columns]
        return self._routed(
            "insert_df", table, df, "dataframe", sharding_key=sharding_key, column_names=names,
            column_type_names=column_type_names, settings=settings, options={"database": database},
            describe=column_type_names is None,
        )

    def _plan_insert_arrow(
        self, table: str, arrow_table: Any, *, sharding_key: str, database: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> RoutedInsert[P]:
        """``insert`` of a pyarrow Table: split by the key column (``Table.take``), each part
        written with its shard pool's ``insert_arrow``."""
        return self._typed_by_server(self._routed(
            "insert_arrow", table, arrow_table, "arrow", sharding_key=sharding_key,
            column_names=list(arrow_table.column_names), column_type_names=None, settings=settings,
            options={"database": database}, describe=True,
        ))

    def _plan_insert_df_arrow(
        self, table: str, df: Any, *, sharding_key: str, database: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> RoutedInsert[P]:
        """``insert`` of a pandas DataFrame of Arrow dtypes or a polars DataFrame: split by the
        key column (``DataFrame.take`` / ``DataFrame.gather``), each part written with its shard
        pool's ``insert_df_arrow``."""
        if _is_pandas(df):
            form: Form = "dataframe"
            import pandas as pd

            plain = [str(c) for c, dtype in df.dtypes.items() if not isinstance(dtype, pd.ArrowDtype)]
            if plain:  # clickhouse-connect's own check, before any part is written
                raise ConfigurationError(
                    f"insert_df_arrow requires all columns to use PyArrow dtypes. Non-Arrow columns found: "
                    f"[{', '.join(plain)}] (insert_df takes them)"
                )
        elif type(df).__module__.split(".")[0] == "polars":
            form = "polars"
        else:
            raise ConfigurationError(
                f"df must be either a pandas DataFrame or polars DataFrame, got {type(df).__name__}"
            )
        return self._typed_by_server(self._routed(
            "insert_df_arrow", table, df, form, sharding_key=sharding_key,
            column_names=[str(c) for c in df.columns], column_type_names=None, settings=settings,
            options={"database": database}, describe=True,
        ))

    def _typed_by_server(self, plan: RoutedInsert[P]) -> RoutedInsert[P]:
        """An Arrow insert: its parts carry their own types, so the DESCRIBE is only for the key
        column's type, which is remembered per table (:class:`~clickhouse_lb.core.key_types.KeyTypeMemo`)."""
        if plan.key.column is None:  # rand(): no type to know
            plan.describe = None
            return plan
        memo, entry = self._key_types, (plan.options.get("database"), plan.table, plan.key.column)
        plan.key_type = memo.lookup(entry, time.monotonic())
        if plan.key_type is not None:
            plan.describe = None
        else:
            plan.on_key_type = lambda type_name: memo.remember(entry, type_name, time.monotonic())
        return plan

    def forget_key_types(self) -> None:
        """Forget the sharding key columns' types read for Arrow inserts (kept
        ``sharding_key_type_cache_ms``): after changing a key column's type, the next Arrow
        insert of each table reads it again."""
        self._key_types.forget()

    def raw_insert(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: ``raw_insert``'s data is already encoded in a format (``fmt``), so it cannot
        be split by sharding key without parsing it."""
        raise ConfigurationError(
            "raw_insert cannot be routed by sharding key: its data is already encoded (fmt=...) and would have to "
            "be parsed to be split. Write it to one shard with sharded.shard(n).raw_insert(...), or pass the "
            "rows to insert(), insert_df(), insert_arrow() or insert_df_arrow() with sharding_key="
        )


def _is_pandas(data: Any) -> bool:
    return type(data).__module__.split(".")[0] == "pandas" and hasattr(data, "iloc")
