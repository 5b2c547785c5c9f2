"""An insert cut into parts by shard, without I/O: every form of data (rows, columns, NumPy
columns, a pandas DataFrame, a pyarrow Table) gives each shard the same rows, in their order,
as the routing of the key's values says; and a re-read layout replaces the view as it should."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from clickhouse_lb.config.replicas import Replica, parse_host
from clickhouse_lb.core.discovery import ShardLayout
from clickhouse_lb.core.shard_split import key_column, row_count, take, take_columns, transposable
from clickhouse_lb.core.sharding import parse_sharding_key, route, slot_table, value_type
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.pools._sharded_base import ShardedBase
from clickhouse_lb.pools._sharded_discovery import layout_change

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
try:
    import polars as pl
except ImportError:  # optional: the polars form is then not checked
    pl = None

IDS = [-5, 0, 1, 2, 3, 7, 11, 2**40, -(2**40), 123456789]
NAMES = [f"user-{i}" for i in IDS]


def forms() -> dict[str, tuple[str, Any]]:
    rows = [[i, n, k] for k, (i, n) in enumerate(zip(IDS, NAMES))]
    columns = [list(IDS), list(NAMES), list(range(len(IDS)))]
    numpy_columns = [np.array(IDS, dtype=np.int64), list(NAMES), np.arange(len(IDS), dtype=np.uint32)]
    frame = pd.DataFrame({"id": IDS, "name": NAMES, "v": range(len(IDS))})
    out = {
        "rows": ("rows", rows), "columns": ("columns", columns), "numpy columns": ("columns", numpy_columns),
        "dataframe": ("dataframe", frame), "arrow": ("arrow", pa.Table.from_pandas(frame, preserve_index=False)),
    }
    if pl is not None:
        out["polars"] = ("polars", pl.DataFrame({"id": IDS, "name": NAMES, "v": list(range(len(IDS)))}))
    return out


def rows_of(part: Any, form: str) -> list[tuple[Any, ...]]:
    """A part as a list of (id, name, v) tuples, whatever its form."""
    if form == "rows":
        return [tuple(r) for r in part]
    if form == "columns":
        return list(zip(*[list(c) for c in part]))
    if form == "dataframe":
        return list(part.itertuples(index=False, name=None))
    if form == "polars":
        return list(part.iter_rows())
    return list(zip(*[part.column(i).to_pylist() for i in range(part.num_columns)]))


@pytest.mark.parametrize("name", list(forms()))
@pytest.mark.parametrize("key", ["cityHash64(id)", "intHash64(id)", "sipHash64(name)", "id"])
def test_every_form_gives_each_shard_the_rows_the_keys_values_route_there(name: str, key: str) -> None:
    form, data = forms()[name]
    parsed = parse_sharding_key(key)
    index = ["id", "name", "v"].index(parsed.column or "id")
    kind = value_type(["Int64", "String", "UInt32"][index])
    expected_groups = route(parsed, [IDS, NAMES][index], kind, len(IDS), slots=slot_table([1, 2]), shards=2)
    groups = route(parsed, key_column(data, form, index, kind), kind, row_count(data, form),  # type: ignore[arg-type]
                   slots=slot_table([1, 2]), shards=2)
    assert [g.tolist() for g in groups] == [g.tolist() for g in expected_groups]
    everything = list(zip(IDS, NAMES, range(len(IDS))))
    for indices in groups:
        assert rows_of(take(data, form, indices), form) == [everything[i] for i in indices]  # type: ignore[arg-type]
    assert sum(len(g) for g in groups) == len(IDS)


def test_numpy_columns_stay_numpy_so_clickhouse_connect_writes_them_without_a_loop() -> None:
    _, data = forms()["numpy columns"]
    part = take(data, "columns", np.array([0, 3, 4]))
    assert isinstance(part[0], np.ndarray)
    assert part[0].tolist() == [IDS[0], IDS[3], IDS[4]]
    assert part[1] == [NAMES[0], NAMES[3], NAMES[4]]


def test_one_row_and_no_row_parts() -> None:
    rows = [[1, "a"], [2, "b"]]
    assert take(rows, "rows", np.array([1])) == [[2, "b"]]
    assert take(rows, "rows", np.array([], dtype=np.int64)) == []


def test_uint64_values_over_2_63_in_rows_are_taken_as_the_server_takes_them() -> None:
    rows = [[2**64 - 1], [2**63], [5]]
    kind = value_type("UInt64")
    values = key_column(rows, "rows", 0, kind)
    groups = route(parse_sharding_key("id"), values, kind, 3, slots=(0, 1, 2), shards=3)
    # The value modulo 3 slots: (2**64 - 1) % 3 == 0, 2**63 % 3 == 2, 5 % 3 == 2.
    assert [g.tolist() for g in groups] == [[0], [], [1, 2]]


def test_a_float_key_column_from_a_dataframe_with_missing_values_is_refused() -> None:
    frame = pd.DataFrame({"id": [1, None, 3]})
    kind = value_type("Int64")
    with pytest.raises(ConfigurationError, match="expected integers"):
        route(parse_sharding_key("id"), key_column(frame, "dataframe", 0, kind), kind, 3, slots=(0, 1), shards=2)


def layout(*shards: tuple[int, int, list[str]]) -> list[ShardLayout]:
    return [ShardLayout(n, w, tuple(parse_host(a) for a in r)) for n, w, r in shards]


def test_a_re_read_layout_says_what_is_kept_moved_added_and_removed() -> None:
    current = ([1, 2], [1, 1], [["a:1", "b:1"], ["c:1", "d:1"]])
    assert layout_change(*current, layout((1, 1, ["b:1", "A:1"]), (2, 1, ["c:1", "d:1"]))).unchanged
    change = layout_change(*current, layout((1, 1, ["a:1"]), (3, 2, ["e:1"])))
    assert change.kept == {1: 0}
    assert list(change.moved) == [1]
    assert [s.shard_num for s in change.added] == [3]
    assert change.removed == (1,)
    reweighted = layout_change(*current, layout((1, 1, ["a:1", "b:1"]), (2, 3, ["c:1", "d:1"])))
    assert reweighted.reweighted
    assert not reweighted.unchanged


class FakePool:
    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.closed = False
        self.applied: list[list[Replica]] = []

    def _apply_discovered(self, replicas: list[Replica]) -> None:
        self.applied.append(replicas)
        self.addresses = [r.address for r in replicas]


def test_a_removed_shards_pool_closes_only_once_the_routed_inserts_on_the_old_view_are_done() -> None:
    one, two, three = FakePool(["a:1"]), FakePool(["c:1"]), FakePool(["e:1"])
    sharded: ShardedBase[Any] = ShardedBase([one, two], [1, 2], [1, 1], cluster="lb")
    closed: list[FakePool] = []
    plan = sharded._plan_insert("t", [[1]], ["id"], sharding_key="id", database=None,
                                column_type_names=["Int64"], column_oriented=False, settings=None)
    with plan:  # an insert running on the current view
        change = sharded._change(layout((1, 1, ["a:1", "b:1"]), (3, 2, ["e:1"])))
        assert change is not None
        sharded._install(change, [three], closed.extend)
        assert sharded.shards == [one, three]
        assert sharded.shard_nums == (1, 3)
        assert sharded.weights == (1, 2)
        assert [p.addresses for p in sharded.shards] == [["a:1", "b:1"], ["e:1"]]  # shard 1's pool kept, its set moved
        assert closed == []  # shard 2's pool still serves the insert in flight
        assert plan.pool(plan.parts()[0]) in (one, two)  # the insert keeps its own view
    assert closed == [two]


def _native_bytes(data: Any, column_oriented: bool) -> bytes:
    """What clickhouse-connect writes for an insert of ``data`` (its Native format, no server)."""
    from clickhouse_connect.datatypes.registry import get_from_name
    from clickhouse_connect.driver.insert import InsertContext
    from clickhouse_connect.driver.transform import NativeTransform

    types = [get_from_name(t) for t in ("Int64", "String", "UInt32")]
    context = InsertContext("t", ["id", "name", "v"], types, data=data, column_oriented=column_oriented)
    return b"".join(NativeTransform().build_insert(context))


def test_rows_handed_on_as_columns_are_written_byte_for_byte_as_the_rows_would_be() -> None:
    rows = [(i, f"user-{i}", i % 7) for i in range(-300, 300)] + [[2**40, "", 6]]
    indices = np.flatnonzero(np.arange(len(rows)) % 3 != 1)
    columns = take_columns(rows, indices, 3)
    assert columns is not None
    assert _native_bytes(columns, True) == _native_bytes(take(rows, "rows", indices), False)


def test_rows_are_transposed_as_clickhouse_connect_transposes_them_or_left_to_it() -> None:
    rows = [[1, "a", 2], [3, "b", 4, "extra"], [5, "c", 6]]
    # zip(*rows), clickhouse-connect's own transposition, leaves out values past the first row's width
    assert take_columns(rows, np.array([0, 1, 2]), 3) == [list(c) for c in zip(*rows)]
    assert take_columns([[1, "a", 2], [3, "b"]], np.array([0, 1]), 3) is None  # a short row: sent as rows
    assert take_columns([[1, "a", 2], 5], np.array([0, 1]), 3) is None  # not a row at all
    many = [(i, str(i), -i) for i in range(2049)]  # two full blocks and one of a single row
    picked = np.arange(0, 2049, 2)
    assert take_columns(many, picked, 3) == [list(c) for c in zip(*(many[i] for i in picked))]
    assert take_columns([*many[:2000], (1, "short"), *many[2001:]], np.arange(2049), 3) is None
    assert transposable(rows, 3)
    assert not transposable(rows, 2)  # clickhouse-connect's column count check then raises, as without routing
    assert not transposable(np.zeros((2, 3)), 3)  # a NumPy matrix: clickhouse-connect converts it itself
    assert not transposable([], 3)
    assert not transposable(["abc"], 3)


def test_a_routed_inserts_row_parts_go_as_columns_with_column_oriented() -> None:
    from clickhouse_lb.core.discovery import InFlight
    from clickhouse_lb.pools._sharded_insert import RoutedInsert
    from clickhouse_lb.pools._sharded_view import ShardView

    rows = [[i, f"n{i}", 0] for i in range(20)]
    view = ShardView.of([object(), object()], [1, 2], [1, 1])  # type: ignore[type-var]
    plan: RoutedInsert[Any] = RoutedInsert(
        InFlight(), view, "insert", "t", rows, form="rows", sharding_key="id", column_names=["id", "name", "v"],
        column_type_names=["Int64", "String", "UInt32"], settings=None, options={"database": None}, describe=False,
    )
    parts = plan.parts()
    assert [p.options and p.options["column_oriented"] for p in parts] == [True, True]
    assert [list(zip(*p.data)) for p in parts] == [[tuple(r) for r in rows if r[0] % 2 == s] for s in (0, 1)]


def test_columns_are_written_as_the_rows_would_be_for_nested_nullable_and_dated_types() -> None:
    import datetime
    import decimal
    import uuid

    from clickhouse_connect.datatypes.registry import get_from_name
    from clickhouse_connect.driver.insert import InsertContext
    from clickhouse_connect.driver.transform import NativeTransform

    types = ["Int64", "Nullable(String)", "Array(Int32)", "DateTime", "Decimal(10, 2)", "Map(String, UInt8)",
             "Tuple(Int8, String)", "LowCardinality(String)", "UUID", "Float64", "Bool", "Enum8('a' = 1, 'b' = 2)"]
    names = [f"c{i}" for i in range(len(types))]
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    rows = [
        (i, None if i % 3 == 0 else f"s{i}", list(range(i % 4)), start + datetime.timedelta(seconds=i),
         decimal.Decimal(i) / 4, {f"k{i % 2}": i % 7}, (i % 100, f"t{i}"), ["x", "y"][i % 2],
         uuid.UUID(int=i), i / 3, i % 2 == 0, "ab"[i % 2])
        for i in range(3000)
    ]
    indices = np.flatnonzero(np.arange(len(rows)) % 4 != 2)

    def native(data: Any, oriented: bool) -> bytes:
        context = InsertContext("t", names, [get_from_name(t) for t in types], data=data, column_oriented=oriented)
        return b"".join(NativeTransform().build_insert(context))

    columns = take_columns(rows, indices, len(types))
    assert columns is not None
    assert native(columns, True) == native(take(rows, "rows", indices), False)


class InsertingPool:
    """A shard pool that records what it is asked to insert (``fail``: raises instead)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.inserted: list[Any] = []
        self.fail = fail

    def insert(self, table: str, data: Any, settings: Any = None, **options: Any) -> str:
        if self.fail is not None:
            raise self.fail
        self.inserted.append(data)
        return f"summary of {table}"


LARGE = 60_000  # enough rows for the parts after the first to be taken on a thread


def large_plan(data: Any, form: str) -> Any:
    from clickhouse_lb.core.discovery import InFlight
    from clickhouse_lb.pools._sharded_insert import RoutedInsert
    from clickhouse_lb.pools._sharded_view import ShardView

    view = ShardView.of([InsertingPool(), InsertingPool(), InsertingPool()], [1, 2, 3], [1, 2, 1])  # type: ignore[type-var]
    method = {"dataframe": "insert_df", "arrow": "insert_arrow"}.get(form, "insert")
    return RoutedInsert(
        InFlight(), view, method, "t", data, form=form, sharding_key="cityHash64(id)",
        column_names=["id", "name", "v"], column_type_names=["Int64", "String", "UInt32"], settings=None,
        options={"database": None}, describe=False,
    )


def same_data(a: Any, b: Any) -> bool:
    if hasattr(a, "equals"):
        return bool(a.equals(b))
    if isinstance(a, list) and a and isinstance(a[0], (list, np.ndarray)):
        return all(np.array_equal(np.asarray(x, dtype=object), np.asarray(y, dtype=object)) for x, y in zip(a, b))
    return bool(a == b)


@pytest.mark.parametrize("form", ["rows", "columns", "numpy objects", "dataframe", "arrow"])
def test_the_parts_taken_while_the_first_is_written_are_the_parts_taken_at_once(form: str) -> None:
    ids = np.arange(LARGE, dtype=np.int64)
    names = [f"u{i}" for i in range(LARGE)]
    v = (ids % 9).astype(np.uint32)
    data = {"rows": [[int(i), names[i], int(v[i])] for i in range(LARGE)], "columns": [ids, names, v],
            "numpy objects": [ids, np.array(names, dtype=object), v],
            "dataframe": pd.DataFrame({"id": ids, "name": names, "v": v}),
            "arrow": pa.table({"id": ids, "name": names, "v": v})}[form]
    form = "columns" if form == "numpy objects" else form
    at_once = large_plan(data, form).parts()
    plan = large_plan(data, form)
    pending = plan.pending()
    assert pending[0].done()  # the first is taken before anything is written
    parts = [future.result(timeout=60) for future in pending]
    assert [(p.shard_num, p.rows, p.options) for p in parts] == [(p.shard_num, p.rows, p.options) for p in at_once]
    assert len(parts) == 3
    assert sum(p.rows for p in parts) == LARGE
    for part, expected in zip(parts, at_once):
        assert same_data(part.data, expected.data), part.shard_num
        assert not plan.settled(part)


def taking_threads(monkeypatch: pytest.MonkeyPatch, data: Any, form: str) -> list[str]:
    """The thread each part of a large routed insert of ``data`` was taken on, in shard order."""
    import threading

    from clickhouse_lb.core import shard_split

    threads: list[str] = []
    inside: set[str] = set()  # the threads inside a take (take_aside may call take)
    for name in ("take", "take_aside", "take_columns"):
        real = getattr(shard_split, name)

        def recording(*args: Any, _real: Any = real) -> Any:
            thread = threading.current_thread().name
            if thread in inside:
                return _real(*args)
            threads.append(thread)
            inside.add(thread)
            try:
                return _real(*args)
            finally:
                inside.discard(thread)

        monkeypatch.setattr(shard_split, name, recording)
    for future in large_plan(data, form).pending():
        future.result(timeout=60)
    return threads


def test_parts_of_a_frame_whose_take_holds_the_gil_are_all_taken_before_the_first_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Taken on a thread in one call, they held up the first part's serialisation (BENCHMARKS.md).
    import threading

    ids = np.arange(LARGE, dtype=np.int64)
    data = pd.DataFrame({"id": ids, "name": pd.Series([f"u{i}" for i in range(LARGE)], dtype=object), "v": ids})
    threads = taking_threads(monkeypatch, data, "dataframe")
    assert len(threads) >= 3
    assert set(threads) == {threading.current_thread().name}


@pytest.mark.parametrize("form", ["columns", "numpy objects"])
def test_lists_and_object_arrays_after_the_first_part_are_taken_aside_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch, form: str,
) -> None:
    # One C call over a part's names held the GIL throughout, and stopped the first part's
    # serialisation; between two slices the thread pauses, giving the GIL up.
    import threading

    from clickhouse_lb.core import shard_split

    ids = np.arange(LARGE, dtype=np.int64)
    names = [f"u{i}" for i in range(LARGE)]
    data = [ids, names if form == "columns" else np.array(names, dtype=object), (ids % 9).astype(np.uint32)]
    pauses: list[str] = []
    monkeypatch.setattr(shard_split, "pacer", lambda: lambda: pauses.append(threading.current_thread().name))
    plan = large_plan(data, "columns")
    threads = taking_threads(monkeypatch, data, "columns")
    if not shard_split._LISTS_ASIDE:  # switched off: every part taken before the first is written
        assert threads == [threading.current_thread().name] * 3
        assert not pauses
        return
    assert threads == [threading.current_thread().name, "clickhouse-lb-parts", "clickhouse-lb-parts"]
    later = sum(len(indices) for indices in route_of(plan)[1:])
    assert len(pauses) >= later // shard_split._SLICE >= 2
    assert set(pauses) == {"clickhouse-lb-parts"}


def route_of(plan: Any) -> list[np.ndarray]:
    return [spec.indices for spec in plan._route(None)]


@pytest.mark.parametrize("form", ["rows", "columns", "dataframe", "arrow"])
def test_rows_and_parts_taken_without_the_gil_are_taken_on_a_thread_after_the_first(
    monkeypatch: pytest.MonkeyPatch, form: str,
) -> None:
    import threading

    ids = np.arange(LARGE, dtype=np.int64)
    v = (ids % 9).astype(np.uint32)
    names = [f"u{i}" for i in range(LARGE)]
    data = {"rows": [[int(i), names[i], int(v[i])] for i in range(LARGE)], "columns": [ids, ids, v],
            # (Arrow-backed strings, as pandas 3's default str: pandas 2 would make them objects)
            "dataframe": pd.DataFrame({"id": ids, "name": pd.Series(names, dtype="string[pyarrow]"), "v": v}),
            "arrow": pa.table({"id": ids, "name": names, "v": v})}[form]
    threads = taking_threads(monkeypatch, data, form)
    assert threads == [threading.current_thread().name, "clickhouse-lb-parts", "clickhouse-lb-parts"]


def test_a_part_that_cannot_be_taken_after_the_first_was_written_fails_naming_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clickhouse_lb.core import shard_split
    from clickhouse_lb.errors import ShardedInsertError
    from clickhouse_lb.pools.sharded import ShardedPool

    one, two = InsertingPool(), InsertingPool()
    sharded = ShardedPool([one, two], [1, 2], [1, 1])  # type: ignore[list-item]
    real_take, calls = shard_split.take, []

    def take(data: Any, form: Any, indices: Any) -> Any:
        calls.append(len(indices))
        if len(calls) == 2:  # the second part, taken on the thread
            raise MemoryError("no room for the second part")
        return real_take(data, form, indices)

    monkeypatch.setattr(shard_split, "take", take)
    ids = np.arange(LARGE, dtype=np.int64)
    with pytest.raises(ShardedInsertError) as raised:
        sharded.insert("t", [ids, ids.astype(np.uint32)], column_names=["id", "v"],
                       column_type_names=["Int64", "UInt32"], column_oriented=True, sharding_key="id")
    assert raised.value.written == {1: LARGE // 2}  # the first part was written
    assert list(raised.value.failed) == [2]
    assert "no room for the second part" in repr(raised.value.failed[2])
    assert len(one.inserted) == 1
    assert two.inserted == []


def test_columns_shorter_than_the_keys_are_refused_before_anything_is_written_in_a_large_insert() -> None:
    from clickhouse_lb.pools.sharded import ShardedPool

    one, two = InsertingPool(), InsertingPool()
    sharded = ShardedPool([one, two], [1, 2], [1, 1])  # type: ignore[list-item]
    ids = np.arange(LARGE, dtype=np.int64)
    with pytest.raises(ConfigurationError, match=f"differ in length \\(id: {LARGE}, name: {LARGE - 1}\\)"):
        sharded.insert("t", [ids, [f"n{i}" for i in range(LARGE - 1)]], column_names=["id", "name"],
                       column_type_names=["Int64", "String"], column_oriented=True, sharding_key="id")
    assert one.inserted == two.inserted == []


@pytest.mark.parametrize("share", [1, 2, 3, 5, 50])
def test_list_items_are_taken_by_mask_or_by_index_alike_for_every_kind_of_sequence(share: int) -> None:
    size = 1000
    indices = np.flatnonzero(np.arange(size) % share == 1 % share)  # one item in `share`
    values = [f"v{i}" for i in range(size)]
    expected = [values[i] for i in indices]
    for items in (values, tuple(values), StrSequence(values)):
        assert take(items, "rows", indices) == expected, type(items)
    numbers = np.arange(size, dtype=np.int64)
    longer = [*values, "past the rows"]  # a column longer than the key's: its extra values are left out
    part = take([numbers, values, longer, tuple(values)], "columns", indices)
    assert part[0].tolist() == indices.tolist()
    assert part[1] == part[2] == part[3] == expected
    with pytest.raises(IndexError):  # a list column shorter than the key's, as indexing it raises
        take([numbers, values[:-1]], "columns", np.array([0, size - 1]))


class StrSequence(Sequence[str]):
    """A sequence that is neither a list nor a tuple (taken by index, never iterated)."""

    def __init__(self, values: list[str]) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, i: Any) -> Any:
        return self._values[i]

    def __iter__(self) -> Any:
        raise AssertionError("taken by index")


class Described:
    """What the driver's DESCRIBE gives the plan: the table's column names and types."""

    def __init__(self, names: list[str], types: list[str]) -> None:
        self.column_names = names
        self.column_types = [type("T", (), {"name": t})() for t in types]


@pytest.mark.parametrize("table_type", ["Int64", "Int32", "UInt64"])
@pytest.mark.parametrize("form", ["columns", "dataframe", "arrow"])
def test_rows_routed_while_the_types_are_read_go_by_the_tables_type(
    monkeypatch: pytest.MonkeyPatch, form: str, table_type: str,
) -> None:
    # The key column is int64 in the data; the table's type alone decides the hash: routed on
    # the thread by the dtype's type, the parts are those of the table's type all the same.
    import threading

    from clickhouse_lb.core import sharding
    from clickhouse_lb.core.discovery import InFlight
    from clickhouse_lb.pools._sharded_insert import RoutedInsert
    from clickhouse_lb.pools._sharded_view import ShardView

    ids = np.arange(-LARGE // 2, LARGE - LARGE // 2, dtype=np.int64)
    v = (ids % 9).astype(np.uint32)
    data = {"columns": [ids, v], "dataframe": pd.DataFrame({"id": ids, "v": v}),
            "arrow": pa.table({"id": ids, "v": v})}[form]
    routed_on, real_route = [], sharding.route

    def route(*args: Any, **kwargs: Any) -> Any:
        routed_on.append(threading.current_thread().name)
        return real_route(*args, **kwargs)

    from clickhouse_lb.core import shard_split

    taken_on, real_take = [], shard_split.take

    def take(*args: Any) -> Any:
        taken_on.append(threading.current_thread().name)
        return real_take(*args)

    monkeypatch.setattr(sharding, "route", route)
    monkeypatch.setattr(shard_split, "take", take)
    view = ShardView.of([InsertingPool(), InsertingPool()], [1, 2], [1, 1])  # type: ignore[type-var]
    method = {"dataframe": "insert_df", "arrow": "insert_arrow"}.get(form, "insert")
    plan = RoutedInsert(
        InFlight(), view, method, "t", data, form=form, sharding_key="cityHash64(id)", column_names=["id", "v"],
        column_type_names=None, settings=None, options={"database": None}, describe=True,
    )
    with plan:
        parts = [future.result(timeout=60) for future in plan.pending(Described(["id", "v"], [table_type, "UInt32"]))]
    expected = real_route(parse_sharding_key("cityHash64(id)"), ids, value_type(table_type), len(ids),
                          slots=(0, 1), shards=2)
    assert [p.rows for p in parts] == [len(e) for e in expected]
    for part, indices in zip(parts, expected):
        taken = part.data[0] if form == "columns" else np.asarray(part.data.column(0) if form == "arrow"
                                                                 else part.data["id"])
        assert np.array_equal(np.asarray(taken), ids[indices])
    again = [] if table_type == "Int64" else [threading.current_thread().name]  # routed again by the table's
    assert routed_on == ["clickhouse-lb-route", *again]
    # The first part is taken on the routing thread too, and kept with its routing only.
    if again:
        assert threading.current_thread().name in taken_on
    else:
        assert taken_on[0] == "clickhouse-lb-route"
        assert threading.current_thread().name not in taken_on


def test_rows_that_could_not_be_routed_while_the_types_were_read_are_routed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from clickhouse_lb.core import sharding
    from clickhouse_lb.core.discovery import InFlight
    from clickhouse_lb.pools._sharded_insert import RoutedInsert
    from clickhouse_lb.pools._sharded_view import ShardView

    real_route = sharding.route

    def route(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "clickhouse-lb-route":
            raise MemoryError("no room to route on the thread")
        return real_route(*args, **kwargs)

    monkeypatch.setattr(sharding, "route", route)
    ids = np.arange(LARGE, dtype=np.int64)
    view = ShardView.of([InsertingPool(), InsertingPool()], [1, 2], [1, 1])  # type: ignore[type-var]
    plan = RoutedInsert(
        InFlight(), view, "insert", "t", [ids, ids], form="columns", sharding_key="cityHash64(id)",
        column_names=["id", "v"], column_type_names=None, settings=None, options={"database": None}, describe=True,
    )
    with plan:
        parts = [future.result(timeout=60) for future in plan.pending(Described(["id", "v"], ["Int64", "UInt32"]))]
    expected = real_route(parse_sharding_key("cityHash64(id)"), ids, value_type("Int64"), LARGE, slots=(0, 1),
                          shards=2)
    assert [list(p.data[0]) for p in parts] == [list(ids[e]) for e in expected]
