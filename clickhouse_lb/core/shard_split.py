"""An insert's data cut into one part per shard, without I/O.

The sharding key's column is taken once, as a NumPy array when its values are integers (the
shard of every row is then computed in NumPy, :mod:`clickhouse_lb.core.sharding`), and each
shard's part is taken by index from the data as given, in one step per shard and column:

- **rows** (a sequence of rows, clickhouse-connect's default): each part is a list of the same
  row objects (no row is copied; clickhouse-connect transposes a part as it would the whole);
- **columns** (``column_oriented=True``): each part is a list of columns; a NumPy column stays
  a NumPy array (``col[indices]``), so clickhouse-connect still writes it without a Python loop;
- **dataframe** (pandas, NumPy or Arrow dtypes): ``DataFrame.take``; **polars**: ``DataFrame.gather``;
  **arrow** (pyarrow): ``Table.take``.

Rows may also be handed on as columns (:func:`take_columns`): clickhouse-connect writes a
column-oriented insert without transposing it row block by row block, which for row data is most
of its work (and of the garbage collections a million live rows cost). Rows keep their order
within a part.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import compress, islice
from operator import itemgetter
from typing import Any, Literal

import numpy as np

from clickhouse_lb.core.sharding import IntegerType, KeyKind
from clickhouse_lb.errors import ConfigurationError

__all__ = [
    "Form", "check_column_lengths", "key_column", "pacer", "row_count", "take", "take_aside", "take_columns",
    "takes_aside", "transposable",
]

#: How the data of an insert is laid out (see the module doc).
Form = Literal["rows", "columns", "dataframe", "polars", "arrow"]


def row_count(data: Any, form: Form) -> int:
    if form == "columns":
        return len(data[0]) if len(data) else 0
    if form == "arrow":
        return int(data.num_rows)
    return len(data)  # a polars DataFrame's len() is its height


def check_column_lengths(columns: Any, names: Sequence[str] | None) -> None:
    """Refuse column-oriented data whose columns differ in length, naming each column's length:
    the rows are counted and routed by the key column's positions, so a longer column's extra
    values would be dropped without a word and a shorter one fail a part half way."""
    try:
        lengths = [len(column) for column in columns]
    except TypeError:  # not sized columns: clickhouse-connect reports them, as without routing
        return
    if len(set(lengths)) <= 1:
        return
    labels = [*(names or ())][:len(lengths)]
    labels += [f"column {i + 1}" for i in range(len(labels), len(lengths))]
    shown = ", ".join(f"{label}: {length}" for label, length in zip(labels, lengths))
    raise ConfigurationError(
        f"Bad column-oriented data: its columns differ in length ({shown}); every column needs one value per row"
    )


def key_column(data: Any, form: Form, index: int, kind: KeyKind) -> np.ndarray | Sequence[Any]:
    """The values of the column at ``index`` (of ``kind``), read once: an array for integers
    wherever the data allows it (which :func:`~clickhouse_lb.core.sharding.key_values` then
    converts without a Python loop)."""
    if form == "columns":
        column: Sequence[Any] = data[index]
        return column
    if form == "dataframe":
        return np.asarray(data.iloc[:, index].to_numpy())
    if form == "arrow":
        return np.asarray(data.column(index).to_numpy())
    if form == "polars":
        return np.asarray(data.to_series(index).to_numpy())
    if isinstance(data, np.ndarray):
        return np.asarray(data[:, index])
    getter = itemgetter(index)
    if isinstance(kind, IntegerType):
        try:  # straight from the rows into an array: no intermediate list
            return np.fromiter(map(getter, data), dtype=np.int64, count=len(data))
        except (OverflowError, TypeError, ValueError):
            pass  # UInt64 values of 2**63 and over, or bad values: key_values converts (or names them)
    return list(map(getter, data))


#: A part holding at least this share of a list's items is taken by a mask (``compress``):
#: one pass over the whole list, but no Python int per item; below, by index.
_MASKED_SHARE = 4


class _Picker:
    """How to take the items at ``indices`` (ascending) from lists of ``size`` items, made once
    for all the list columns of a part."""

    def __init__(self, indices: np.ndarray, size: int) -> None:
        self.indices = indices
        self.mask: bytes | None = None
        self.positions: list[int] | None = None
        if len(indices) * _MASKED_SHARE >= size:
            # compress walks the list in order (about half the time of indexing, 2 parts of 1M
            # items). Its selectors as bytes (one memcpy of the mask): iterating them gives the
            # interpreter's cached 0 and 1, no object per item, and no list of a million
            # pointers to build first (2 parts of 1M names: 50 ms against 80 ms with a list
            # of bools, medians of 21, load 8.6).
            selected = np.zeros(size, dtype=np.uint8)
            selected[indices] = 1
            self.mask = selected.tobytes()

    def take_slices(self, items: Sequence[Any], pause: Callable[[], None]) -> list[Any]:
        """:meth:`take`, :data:`_SLICE` items at a time, ``pause()`` after each slice."""
        selected: Iterator[Any]
        if self.mask is not None and isinstance(items, (list, tuple)) and len(items) == len(self.mask):
            selected = compress(items, self.mask)  # one walk, resumed slice by slice
        else:
            if self.positions is None:
                self.positions = self.indices.tolist()
            selected = map(items.__getitem__, self.positions)
        taken: list[Any] = []
        while True:
            before = len(taken)
            taken.extend(islice(selected, _SLICE))
            if len(taken) == before:
                return taken
            pause()

    def take(self, items: Sequence[Any]) -> list[Any]:
        if self.mask is not None and isinstance(items, (list, tuple)) and len(items) == len(self.mask):
            return list(compress(items, self.mask))
        if self.positions is None:
            self.positions = self.indices.tolist()
        # map of the sequence's own __getitem__ over Python ints: in C, and faster than
        # itemgetter(*indices), which builds a tuple first.
        return list(map(items.__getitem__, self.positions))


def take(data: Any, form: Form, indices: np.ndarray) -> Any:
    """The part of ``data`` made of the rows at ``indices`` (ascending), in the same form."""
    if form in {"dataframe", "arrow"}:
        return data.take(indices)
    if form == "polars":
        return data.gather(indices)
    if form == "columns":
        # Made once for all the list columns, and only if there is one.
        lists = [c for c in data if not isinstance(c, np.ndarray)]
        picker = _Picker(indices, len(lists[0])) if lists else None
        return [column[indices] if picker is None or isinstance(column, np.ndarray) else picker.take(column)
                for column in data]
    if isinstance(data, np.ndarray):
        return data[indices]
    return _Picker(indices, len(data)).take(data)


#: Items a list or an object array gives :func:`take_aside` at a time: a C call that holds the
#: GIL for about 0.2 ms (1M names: about 20 ms for a part in one call). The first part's insert
#: while the second's names were taken aside, against alone (paired medians of 21-31, load
#: 5-8, the spread about 20 ms): in one call +8 to +54 ms; 16k slices with 0.2 ms pauses +14 to
#: +27 ms; 4k slices with 0.5 ms pauses +5 ms (a part of 500k names then takes about 90 ms,
#: within a part's insert).
_SLICE = 4_096


#: Whether lists and object arrays are taken aside at all (False: every part is taken before the
#: first is written, as before 2026-12-02). On a busy machine (load 5-8) the first part's
#: insert was as much slower as the second's take hid (paired: +5 to +37 ms against 20-25 ms
#: of take): whether it pays at rest, the quiet-machine run of the bench shows.
_LISTS_ASIDE = True


def takes_aside(data: Any, form: Form, rows: int) -> bool:
    """Whether a part of ``data`` (``rows`` rows) can be taken on another thread while a part is
    written (:func:`take_aside`), raising nothing that taking it first would have raised
    before anything was written, and without stopping the writer for long:

    - **columns**: lists, tuples or NumPy arrays none shorter than the key's column (indexed
      by valid positions, in C: an IndexError is raised by taking first, as before). NumPy
      numbers are taken without the GIL; lists and object arrays, which need it (one C call of
      20 ms for a part of 1M names: taken whole on the thread it stopped the first part's
      serialisation each time that needed the interpreter back, 78-188 ms more for the
      inserts, load 8-13), a slice at a time, the thread pausing between slices;
    - **rows** (lists, tuples, NumPy arrays): their transposition is a long loop that gives the
      GIL up at the interpreter's switch interval (the routed call of 1M rows took 0.99-2.11 s
      with it on the critical path against 1.27-1.36 s hidden, load 11-12);
    - **DataFrames** without Python-object columns (pandas' ``str`` is Arrow-backed), **Arrow**
      tables and polars frames: their ``take`` runs without the GIL."""
    if form == "rows":
        return isinstance(data, (list, tuple, np.ndarray))
    if form == "columns":
        return isinstance(data, (list, tuple)) and all(
            isinstance(column, (list, tuple, np.ndarray)) and len(column) >= rows
            and (_LISTS_ASIDE or (isinstance(column, np.ndarray) and column.dtype.kind != "O")) for column in data)
    if form == "dataframe":
        return all(_frame_column_without_objects(dtype) for dtype in data.dtypes)
    return True


def _frame_column_without_objects(dtype: Any) -> bool:
    """Whether a DataFrame column of ``dtype`` is taken without the GIL: not NumPy ``object``,
    not a string dtype stored as Python objects."""
    if isinstance(dtype, np.dtype):
        return dtype.kind != "O"
    return getattr(dtype, "storage", None) != "python"


#: The thread taking parts aside pauses this long between slices (a sleep gives the GIL up, so
#: a writer waiting for it gets it, and the thread asks for it back only after), for at most
#: ``_PACED_S`` a part: on a busy machine a sleep can last milliseconds, and the part is
#: then finished in one go rather than kept from the writer when it is done with the first.
_PAUSE_S = 0.0005
_PACED_S = 0.1


def pacer() -> Callable[[], None]:
    """The ``pause`` of one :func:`take_aside` (see ``_PAUSE_S``)."""
    until = time.monotonic() + _PACED_S

    def pause() -> None:
        if time.monotonic() < until:
            time.sleep(_PAUSE_S)
    return pause


def take_aside(data: Any, form: Form, indices: np.ndarray, pause: Callable[[], None]) -> Any:
    """:func:`take` on a thread beside a writer: the same part, but a list or an object array
    among the columns is taken :data:`_SLICE` items at a time with ``pause()`` (which gives the
    GIL up) between the slices, so that the writer waits for the GIL a slice at most."""
    if form != "columns" or all(isinstance(c, np.ndarray) and c.dtype.kind != "O" for c in data):
        return take(data, form, indices)
    lists = [c for c in data if not isinstance(c, np.ndarray)]
    picker = _Picker(indices, len(lists[0])) if lists else None
    part: list[Any] = []
    for column in data:
        if isinstance(column, np.ndarray) and column.dtype.kind != "O":
            part.append(column[indices])
        elif isinstance(column, np.ndarray):
            taken = np.empty(len(indices), dtype=object)
            for start in range(0, len(indices), _SLICE):
                taken[start:start + _SLICE] = column[indices[start:start + _SLICE]]
                pause()
            part.append(taken)
        else:
            assert picker is not None
            part.append(picker.take_slices(column, pause))
    return part


def transposable(data: Any, width: int) -> bool:
    """Whether rows ``data`` can be handed on as columns (:func:`take_columns`): Python rows
    (not a NumPy matrix, which clickhouse-connect converts by itself) whose first row has
    ``width`` values, the one row clickhouse-connect checks the column count against (so a
    mismatch is still its error, raised by the part)."""
    if isinstance(data, np.ndarray) or not len(data):
        return False
    first = data[0]
    return not isinstance(first, (str, bytes, Mapping)) and isinstance(first, Sequence) and len(first) == width


#: Rows transposed at a time by :func:`take_columns`: a block's rows stay in the CPU's cache
#: while each of its columns is read (256 and 4096 were slower for a million rows).
_BLOCK = 1024


def take_columns(rows: Sequence[Sequence[Any]], indices: np.ndarray, width: int) -> list[list[Any]] | None:
    """The rows at ``indices`` as ``width`` columns, the form clickhouse-connect takes with
    ``column_oriented=True``: the same values it would get by transposing the rows itself
    (``zip(*rows)``: values past ``width`` are left out, as zip leaves them out). None when a
    row is shorter or not subscriptable: the part is then sent as rows, and clickhouse-connect
    reports the bad row as it would without routing.

    Block by block (``itemgetter`` gathers a block of rows, then each column is taken from the
    block while it is in cache), all in C: a part's rows are scattered over memory (a row's
    shard is a hash), so one column at a time over the whole part is slower; and not with
    ``zip(*block)``, which makes an iterator per row, a million GC-tracked objects for a million
    rows and a collection every 700 of them."""
    positions = indices.tolist()
    getters = [itemgetter(column) for column in range(width)]
    columns: list[list[Any]] = [[] for _ in range(width)]
    try:
        for start in range(0, len(positions), _BLOCK):
            chunk = positions[start:start + _BLOCK]
            block = itemgetter(*chunk)(rows) if len(chunk) > 1 else (rows[chunk[0]],)
            for getter, column in zip(getters, columns):
                column.extend(map(getter, block))
    except (IndexError, KeyError, TypeError):  # a short row, or not a row
        return None
    return columns
