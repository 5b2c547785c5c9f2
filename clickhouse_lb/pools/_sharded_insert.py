"""A routed insert as a plan without I/O: which parts go to which shard, each with its token,
in which form, and what the outcome is. The sync and async sharded pools only drive it."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from clickhouse_lb.core.discovery import InFlight
from clickhouse_lb.core.shard_split import Form
from clickhouse_lb.errors import ConfigurationError, ShardedInsertError

if TYPE_CHECKING:
    from clickhouse_lb.pools._base import PoolBase
    from clickhouse_lb.pools._sharded_view import ShardView

P = TypeVar("P", bound="PoolBase")

_TOKEN = "insert_deduplication_token"

#: The routed methods whose parts are told the column names and types (read once for the
#: whole insert), so that each part's insert does not ask its shard for them again.
_DESCRIBED_PARTS = ("insert", "insert_df")


@dataclass(frozen=True)
class InsertPart:
    """The rows of one insert that go to one shard, ready for that shard's pool."""

    shard_num: int
    position: int
    rows: int
    data: Any
    settings: dict[str, Any] | None
    method: str = "insert"
    table: str | None = ""
    options: Mapping[str, Any] | None = None

    def send(self, pool: Any) -> Any:
        """Write this part through ``pool`` (a coroutine to await for an async pool)."""
        options = self.options or {}
        if "context" in options:  # the part's own copy of the insert's context; data apart,
            # so that a retry on another replica starts the part over (clickhouse-connect
            # empties a context after each attempt)
            return getattr(pool, self.method)(data=self.data, **options)
        return getattr(pool, self.method)(self.table, self.data, settings=self.settings, **options)


@dataclass(frozen=True)
class _Spec:
    """A part before its data is taken: its shard, its rows' indices, its settings."""

    position: int
    number: int
    indices: Any
    settings: dict[str, Any]


#: Rows from which the parts after the first are taken on a thread while the first is written,
#: and the rows routed while the table's types are read (below, the thread costs more).
_TAKEN_AHEAD = 50_000


@dataclass(frozen=True)
class _Guess:
    """The rows routed by the key column at ``index`` taken as ``kind``, on a thread."""

    index: int
    kind: Any
    groups: Future[list[Any]]
    #: The first part's (position, data), taken on the same thread once routed.
    first: Future[tuple[int, Any]]

    def groups_for(self, index: int, kind: Any) -> list[Any] | None:
        """The routed rows if the table's column is the one guessed, of the type guessed."""
        if (index, kind) != (self.index, self.kind):
            return None
        try:
            return self.groups.result()
        except Exception:  # routed again on the caller's thread, which raises it as its own
            return None

    def first_part(self) -> tuple[int, Any] | None:
        """The first part's (position, data), when it could be taken (else None)."""
        try:
            return self.first.result()
        except Exception:  # taken again on the caller's thread, which raises it as its own
            return None


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
    result; an exception becomes the part's outcome), and returns :meth:`outcome`.

    ``context``: the caller's prepared clickhouse-connect ``InsertContext`` (table, columns,
    settings, formats); each part then gets a copy of it with the part's own settings, and the
    caller's context is emptied at the end, as clickhouse-connect empties it after an insert."""

    def __init__(
        self, in_flight: InFlight[ShardView[P]], view: ShardView[P], method: str, table: str | None, data: Any, *,
        form: Form, sharding_key: str, column_names: Sequence[str] | None, column_type_names: Sequence[str] | None,
        settings: Mapping[str, Any] | None, options: dict[str, Any], describe: bool, context: Any = None,
    ) -> None:
        from clickhouse_lb.core.sharding import parse_sharding_key

        self.key = parse_sharding_key(sharding_key)
        if settings is not None and not isinstance(settings, Mapping):
            raise ConfigurationError(f"Bad settings {settings!r}: expected a mapping of setting names to values")
        self._in_flight = in_flight
        self.view, self.method, self.form = view, method, form
        self.table: str = table if table is not None else str(getattr(context, "table", ""))
        self.data = data
        self.context = context
        self.settings = dict(settings or {})
        self.options = options
        self.names = list(column_names) if column_names is not None else None
        self.types = list(column_type_names) if column_type_names is not None else None
        #: ``(table, column_names, database)`` to ask the first shard for, or None.
        self.describe: tuple[str, Any, Any] | None = (
            (self.table, column_names if column_names is not None else "*", options.get("database"))
            if describe else None
        )
        #: Each part's shard, position and row count (without its data), in shard order.
        self._parts: list[InsertPart] = []
        self._rows = 0
        self._width = 0
        self._transpose = False
        #: Each part's outcome by shard position: its summary, or the exception it raised.
        self._results: dict[int, Any] = {}
        #: The rows routed while the table's types are read (:meth:`_route_while_described`).
        self._guess: _Guess | None = None
        #: The first part's (position, data) taken with the guess, when it was kept.
        self._first: tuple[int, Any] | None = None
        #: The key column's ClickHouse type (from the DESCRIBE, or remembered), and who is told
        #: the type a DESCRIBE read (:meth:`ShardedBase._typed_by_server`).
        self.key_type: str | None = None
        self.on_key_type: Callable[[str], None] | None = None

    def __enter__(self) -> None:
        """While the insert runs, its view counts it in flight (see :meth:`ShardedBase._install`)."""
        self._in_flight.acquire(self.view)
        if self.describe is not None:
            self._guess = self._route_while_described()

    def _route_while_described(self) -> _Guess | None:
        """For a large insert whose key column is a NumPy integer array (NumPy columns, pandas,
        Arrow, polars), the rows routed on a thread by the type the array's dtype suggests
        while the driver reads the table's types (the DESCRIBE, a round trip): NumPy's hash and
        selector run without the GIL. :meth:`_route` takes the result only if the table's type
        is that one (it alone decides the hash), else routes again; an error there is raised
        by routing again, as without the guess."""
        from clickhouse_lb.core.shard_split import key_column, row_count, take
        from clickhouse_lb.core.sharding import STRING, dtype_kind, route

        key, names = self.key, self.names
        if key.column is None or names is None or self.form == "rows" or key.column not in names:
            return None
        try:
            rows = row_count(self.data, self.form)
            index = names.index(key.column)
            values = key_column(self.data, self.form, index, STRING) if rows >= _TAKEN_AHEAD else None
        except Exception:  # bad data: the insert's own routing names it
            return None
        kind = dtype_kind(values)
        if kind is None:
            return None
        groups: Future[list[Any]] = Future()
        slots, shards = self.view.slots, len(self.view.pools)

        first: Future[tuple[int, Any]] = Future()
        data, form = self.data, self.form

        def run() -> None:
            try:
                routed = route(key, values, kind, rows, slots=slots, shards=shards)
            except BaseException as exc:
                groups.set_exception(exc)
                first.set_exception(exc)
                return
            groups.set_result(routed)
            try:  # the first part's rows too: the take depends on the indices alone
                position = next(p for p, indices in enumerate(routed) if len(indices))
                first.set_result((position, take(data, form, routed[position])))
            except BaseException as exc:  # (or none: no rows) taken again on the caller's thread
                first.set_exception(exc)

        threading.Thread(target=run, name="clickhouse-lb-route", daemon=True).start()
        return _Guess(index, kind, groups, first)

    def __exit__(self, *exc: object) -> None:
        self._in_flight.release(self.view)
        if self.context is not None:  # reusable for the next batch, as after clickhouse-connect's insert
            self.context.data = None

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

    def parts(self, described: Any = None) -> list[InsertPart]:
        """The parts to write, in shard order, every one taken here; ``described``: the insert
        context of :attr:`describe` when it was set (the columns as clickhouse-connect has them)."""
        return [self._part(spec) for spec in self._route(described)]

    def pending(self, described: Any = None) -> list[Future[InsertPart]]:
        """:meth:`parts` as futures, in shard order: the first taken here, and, for a large
        insert whose parts can be taken aside
        (:func:`~clickhouse_lb.core.shard_split.takes_aside`), the others on a thread of their
        own while the first ones are written (done one after the other, the take and the insert
        before it add up; see BENCHMARKS.md); otherwise every part here. A
        part whose rows could not be taken on the thread is a part that failed: its future
        holds it with that exception as its outcome (:meth:`settled`)."""
        from clickhouse_lb.core.shard_split import takes_aside

        specs = self._route(described)
        futures: list[Future[InsertPart]] = [Future() for _ in specs]
        if not specs:
            return futures
        ahead = len(specs) > 1 and self._rows >= _TAKEN_AHEAD and takes_aside(self.data, self.form, self._rows)
        for spec, future in zip(specs if not ahead else specs[:1], futures):
            future.set_result(self._part(spec))
        if ahead:
            threading.Thread(target=self._take_ahead, args=(specs[1:], futures[1:]),
                             name="clickhouse-lb-parts", daemon=True).start()
        return futures

    def _take_ahead(self, specs: list[_Spec], futures: list[Future[InsertPart]]) -> None:
        for spec, future in zip(specs, futures):
            try:
                future.set_result(self._part(spec, aside=True))
            except BaseException as exc:  # the part fails, naming itself; the others go on
                part = InsertPart(spec.number, spec.position, len(spec.indices), None, spec.settings or None,
                                  self.method, self.table)
                self.done(part, exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                future.set_result(part)

    def settled(self, part: InsertPart) -> bool:
        """Whether ``part`` already has its outcome (its rows could not be taken)."""
        return part.position in self._results

    def _route(self, described: Any) -> list[_Spec]:
        """Which rows go to which shard, with each part's settings: everything but the parts' data."""
        from clickhouse_lb.core.shard_split import check_column_lengths, key_column, row_count, transposable
        from clickhouse_lb.core.sharding import part_token, route, value_type

        if described:
            self.names = list(described.column_names)
            self.types = [t.name for t in described.column_types]
        if self.form == "columns":  # before the rows are counted by the first column
            check_column_lengths(self.data, self.names)
        view, key, rows = self.view, self.key, row_count(self.data, self.form)
        self._rows = rows
        values, kind, groups = None, None, None
        if key.column is not None:
            if self.names is None or (self.types is None and self.key_type is None):
                raise ConfigurationError(f"The columns of {self.table} are needed to route by {key.text}")
            index = _column_index(self.names, key.column, self.table)
            if self.key_type is None:
                self.key_type = cast("list[str]", self.types)[index]
                if self.on_key_type is not None:
                    self.on_key_type(self.key_type)
            kind = value_type(self.key_type)
            groups = self._guess.groups_for(index, kind) if self._guess is not None else None
            if groups is not None and self._guess is not None:
                self._first = self._guess.first_part()
            if groups is None:
                values = key_column(self.data, self.form, index, kind)
        if groups is None:
            groups = route(key, values, kind, rows, slots=view.slots, shards=len(view.pools))
        settings = self._context_settings() if self.context is not None else self.settings
        token = settings.get(_TOKEN)
        # Rows are handed on as columns (column_oriented=True): clickhouse-connect then writes
        # them without transposing each block itself, most of a row insert's cost.
        self._width = len(self.names) if self.names is not None else 0
        self._transpose = (self.form == "rows" and self.method == "insert" and self._width > 0
                           and transposable(self.data, self._width))
        specs: list[_Spec] = []
        for position, indices in enumerate(groups):
            if not len(indices):
                continue
            number = view.shard_nums[position]
            own = dict(settings)
            if token is not None:
                own[_TOKEN] = part_token(token, number)
            elif self.context is not None and self.pool_adds_tokens(position):
                own[_TOKEN] = _fresh_token()  # the pool gives a context insert none of its own
            specs.append(_Spec(position, number, indices, own))
        self._parts = [InsertPart(s.number, s.position, len(s.indices), None, None) for s in specs]
        return specs

    def _part(self, spec: _Spec, *, aside: bool = False) -> InsertPart:
        """``aside``: on the thread beside the writer (lists a slice at a time, pausing)."""
        from clickhouse_lb.core.shard_split import pacer, take, take_aside, take_columns

        data = take_columns(self.data, spec.indices, self._width) if self._transpose else None
        oriented = data is not None
        if data is None and self._first is not None and spec.position == self._first[0]:
            data = self._first[1]  # taken by the routing thread during the DESCRIBE
        if data is None:
            data = (take_aside(self.data, self.form, spec.indices, pacer()) if aside
                    else take(self.data, self.form, spec.indices))
        return InsertPart(spec.number, spec.position, len(spec.indices), data, spec.settings or None,
                          self.method, self.table, self._part_options(spec.settings, oriented))

    def pool_adds_tokens(self, position: int) -> bool:
        pool = self.view.pools[position]
        return bool(pool.config.settings.auto_insert_deduplication_token)

    def _context_settings(self) -> dict[str, Any]:
        own = dict(getattr(self.context, "settings", None) or {})
        if self.settings:  # given with the call too: the call's win, as for a plain insert
            own.update(self.settings)
        return own

    def _part_options(self, settings: dict[str, Any], oriented: bool) -> dict[str, Any]:
        if self.context is not None:
            part = copy.copy(self.context)  # the caller's context stays as it was given
            part.data = None
            part.settings = settings
            if oriented:
                part.column_oriented = True
            return {"context": part}
        options = dict(self.options)
        if self.method in _DESCRIBED_PARTS:  # the parts need not describe the table again
            options["column_names"], options["column_type_names"] = self.names, self.types
        if oriented:
            options["column_oriented"] = True
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


def _fresh_token() -> str:
    from clickhouse_lb.core._statements import new_insert_token

    return new_insert_token()
