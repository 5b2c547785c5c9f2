"""An insert's data cut into one part per shard, without I/O.

The sharding key's column is taken once, as a NumPy array when its values are integers (the
shard of every row is then computed in NumPy, :mod:`clickhouse_lb.core.sharding`), and each
shard's part is taken by index from the data as given, in one step per shard and column:

- **rows** (a sequence of rows, clickhouse-connect's default): each part is a list of the same
  row objects (no row is copied; clickhouse-connect transposes a part as it would the whole);
- **columns** (``column_oriented=True``): each part is a list of columns; a NumPy column stays
  a NumPy array (``col[indices]``), so clickhouse-connect still writes it without a Python loop;
- **dataframe** (pandas): ``DataFrame.take``; **arrow** (pyarrow): ``Table.take``.

Rows keep their order within a part.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any, Literal

import numpy as np

from clickhouse_lb.core.sharding import IntegerType

__all__ = ["Form", "key_column", "row_count", "take"]

#: How the data of an insert is laid out (see the module doc).
Form = Literal["rows", "columns", "dataframe", "arrow"]


def row_count(data: Any, form: Form) -> int:
    if form == "columns":
        return len(data[0]) if len(data) else 0
    if form == "arrow":
        return int(data.num_rows)
    return len(data)


def key_column(data: Any, form: Form, index: int, kind: IntegerType | str) -> np.ndarray | Sequence[Any]:
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
    if isinstance(data, np.ndarray):
        return np.asarray(data[:, index])
    getter = itemgetter(index)
    if isinstance(kind, IntegerType):
        try:  # straight from the rows into an array: no intermediate list
            return np.fromiter(map(getter, data), dtype=np.int64, count=len(data))
        except (OverflowError, TypeError, ValueError):
            pass  # UInt64 values of 2**63 and over, or bad values: key_values converts (or names them)
    return list(map(getter, data))


def _take_items(items: Sequence[Any], indices: np.ndarray) -> list[Any]:
    if len(indices) == 1:  # itemgetter of one index returns the item, not a tuple
        return [items[int(indices[0])]]
    if not len(indices):
        return []
    return list(itemgetter(*indices.tolist())(items))


def take(data: Any, form: Form, indices: np.ndarray) -> Any:
    """The part of ``data`` made of the rows at ``indices`` (ascending), in the same form."""
    if form in {"dataframe", "arrow"}:
        return data.take(indices)
    if form == "columns":
        return [column[indices] if isinstance(column, np.ndarray) else _take_items(column, indices) for column in data]
    if isinstance(data, np.ndarray):
        return data[indices]
    return _take_items(data, indices)
