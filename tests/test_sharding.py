"""The shard a row goes to, checked against the ClickHouse engine itself (chdb computes the
same sharding expressions over the same values), and the slot rule of a Distributed table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clickhouse_lb.core.shard_split import Form, key_column
from clickhouse_lb.core.sharding import (
    FixedStringType,
    IntegerType,
    key_values,
    parse_sharding_key,
    shard_indices,
    slot_table,
    value_type,
)
from clickhouse_lb.errors import ConfigurationError

chdb = pytest.importorskip("chdb")

INTEGER_TYPES = ["UInt8", "UInt16", "UInt32", "UInt64", "Int8", "Int16", "Int32", "Int64"]


def _literal(value: object) -> str:
    # Strings travel as hex of their (UTF-8) bytes: no quoting or escaping to get wrong.
    if isinstance(value, (str, bytes)):
        return f"unhex('{(value.encode() if isinstance(value, str) else value).hex()}')"
    return str(value)


def engine(expression: str, type_name: str, values: list[Any]) -> list[int]:
    """``expression`` over ``values`` cast to ``type_name``, computed by ClickHouse's engine."""
    literal = ", ".join(map(_literal, values))
    sql = f"SELECT {expression} FROM (SELECT arrayJoin(CAST([{literal}] AS Array({type_name}))) AS x)"
    return [int(line) for line in chdb.query(sql, "CSV").data().split()]


def integers(type_name: str) -> st.SearchStrategy[int]:
    kind = value_type(type_name)
    assert isinstance(kind, IntegerType)
    low = -(1 << (kind.bits - 1)) if kind.signed else 0
    high = (1 << (kind.bits - 1)) - 1 if kind.signed else (1 << kind.bits) - 1
    return st.integers(low, high)


@pytest.mark.parametrize("type_name", INTEGER_TYPES)
@pytest.mark.parametrize("function", ["intHash64", "cityHash64", "sipHash64"])
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_hashes_of_integers_equal_the_engines(type_name: str, function: str, data: st.DataObject) -> None:
    values = data.draw(st.lists(integers(type_name), min_size=1, max_size=40))
    key = parse_sharding_key(f"{function}(id)")
    ours = key_values(key, values, value_type(type_name), len(values)).tolist()
    assert ours == engine(f"{function}(x)", type_name, values)


@pytest.mark.parametrize("function", ["cityHash64", "sipHash64"])
@settings(max_examples=10, deadline=None)
@given(values=st.lists(st.text(max_size=30), min_size=1, max_size=30))
def test_hashes_of_strings_equal_the_engines(function: str, values: list[str]) -> None:
    key = parse_sharding_key(f"{function}(name)")
    ours = key_values(key, values, value_type("String"), len(values)).tolist()
    assert ours == engine(f"{function}(x)", "String", values)


@pytest.mark.parametrize("type_name", INTEGER_TYPES)
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_a_bare_integer_column_is_converted_as_the_selector_converts_it(type_name: str, data: st.DataObject) -> None:
    # createBlockSelector: a value of 32 bits or fewer is taken as UInt32, a wider one as UInt64.
    values = data.draw(st.lists(integers(type_name), min_size=1, max_size=40))
    kind = value_type(type_name)
    assert isinstance(kind, IntegerType)
    target = "UInt32" if kind.bits <= 32 else "UInt64"
    ours = key_values(parse_sharding_key("id"), values, kind, len(values)).tolist()
    assert ours == engine(f"CAST(x AS {target})", type_name, values)


def test_slots_follow_the_weights_in_shard_order() -> None:
    assert slot_table([1, 2]) == (0, 1, 1)
    assert slot_table([2, 0, 1]) == (0, 0, 2)  # a weight-0 shard gets no rows
    keys = key_values(parse_sharding_key("id"), list(range(6)), IntegerType(64, False), 6)
    assert shard_indices(keys, slot_table([1, 2])).tolist() == [0, 1, 1, 0, 1, 1]


def test_a_negative_key_picks_the_slot_of_its_unsigned_value() -> None:
    # Int32 -1 is 2**32 - 1 to the selector (not -1, and not 2**64 - 1): slot (2**32 - 1) % 3 == 0.
    keys = key_values(parse_sharding_key("id"), [-1], IntegerType(32, True), 1)
    assert keys.tolist() == [2**32 - 1]
    assert shard_indices(keys, slot_table([1, 1, 1])).tolist() == [(2**32 - 1) % 3]


def test_rand_spreads_rows_over_every_shard() -> None:
    keys = key_values(parse_sharding_key("rand()"), None, None, 3000)
    assert set(shard_indices(keys, slot_table([1, 1, 1])).tolist()) == {0, 1, 2}


@pytest.mark.parametrize(
    ("text", "function", "column"),
    [("id", None, "id"), ("`user id`", None, "user id"), ("cityHash64(name)", "cityHash64", "name"),
     (" sipHash64( `k` ) ", "sipHash64", "k"), ("rand()", "rand", None)],
)
def test_sharding_keys_are_parsed(text: str, function: str | None, column: str | None) -> None:
    key = parse_sharding_key(text)
    assert (key.function, key.column) == (function, column)


@pytest.mark.parametrize("text", ["", "xxHash64(id)", "cityHash64(a, b)", "rand(id)", "cityHash64()", "id + 1"])
def test_other_sharding_keys_are_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ConfigurationError, match="cityHash64"):
        parse_sharding_key(text)


@pytest.mark.parametrize("type_name", ["Float64", "Date", "UUID", "Array(UInt8)"])
def test_key_columns_of_other_types_are_refused(type_name: str) -> None:
    with pytest.raises(ConfigurationError, match=type_name.split("(", maxsplit=1)[0]):
        value_type(type_name)


def test_wrapped_types_are_seen_through() -> None:
    assert value_type("Nullable(Int16)") == IntegerType(16, True)
    assert value_type("LowCardinality(String)") == "string"
    assert value_type("FixedString(4)") == FixedStringType(4)
    assert value_type("Nullable(FixedString( 16 ))") == FixedStringType(16)


@pytest.mark.parametrize("text", ["name", "intHash64(name)"])
@pytest.mark.parametrize("type_name", ["String", "FixedString(4)"])
def test_a_string_column_needs_a_string_hash(text: str, type_name: str) -> None:
    # The engine refuses intHash64 of a string ("Illegal type String of argument").
    if text != "name":
        with pytest.raises(chdb.ChdbError, match="Illegal type"):
            engine("intHash64(x)", type_name, ["a"])
    with pytest.raises(ConfigurationError, match=r"cityHash64\(name\) or sipHash64\(name\)"):
        key_values(parse_sharding_key(text), ["a"], value_type(type_name), 1)


@pytest.mark.parametrize("weights", [[], [0, 0], [1, -1], [1.5]])
def test_bad_weights_are_refused(weights: list[object]) -> None:
    with pytest.raises(ConfigurationError, match="weight"):
        slot_table(weights)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.integers(0, 5), min_size=1, max_size=9).filter(any),
    power_of_two=st.sampled_from([None, 1, 2, 4, 8, 256, 512]),
    rows=st.integers(0, 70_000),
    step=st.sampled_from([1, 3]),
)
def test_route_picks_slots_of_the_selector_value_modulo_the_slot_count(
    weights: list[int], power_of_two: int | None, rows: int, step: int
) -> None:
    # The shortcuts (the low byte read in place for a power of two up to 256 slots, one mask
    # for two shards, the hash block by block past 32k values) against the rule itself.
    import numpy as np

    from clickhouse_lb.core.sharding import route

    if power_of_two is not None:  # e.g. 256 slots over 2 shards: the low byte alone decides
        weights = [power_of_two // 2, power_of_two - power_of_two // 2] if power_of_two > 1 else [1]
    slots = slot_table(weights)
    values = np.random.default_rng(rows).integers(-(2**63), 2**63 - 1, size=rows * step, dtype=np.int64)[::step]
    for text in ("id", "cityHash64(id)"):
        key = parse_sharding_key(text)
        hashed = key_values(key, values, IntegerType(64, True), rows)
        expected = [slots[int(h) % len(slots)] for h in hashed.tolist()]
        groups = route(key, values, IntegerType(64, True), rows, slots=slots, shards=len(weights))
        got = [0] * rows
        for shard, indices in enumerate(groups):
            assert indices.tolist() == sorted(indices.tolist())
            for i in indices.tolist():
                got[i] = shard
        assert sorted(i for g in groups for i in g.tolist()) == list(range(rows))
        assert got == expected


#: Every data form a FixedString key column reaches the hash in: ``(values, N) -> (data, form)``
#: of one column, read back by :func:`key_column` as the routed insert reads it.
FIXED_FORMS: dict[str, Callable[[list[bytes], int], tuple[Any, Form]]] = {
    "rows of bytes": lambda v, n: ([[x] for x in v], "rows"),
    "rows of str": lambda v, n: ([[x.decode()] for x in v], "rows"),
    "column of bytes": lambda v, n: ([v], "columns"),
    # NumPy drops a bytes value's trailing zeros (b"a\0" is stored as b"a"): padded again.
    "NumPy S": lambda v, n: ([np.array(v, dtype=f"S{n}")], "columns"),
    "NumPy U": lambda v, n: ([np.array([x.decode() for x in v], dtype=f"U{n}")], "columns"),
    "NumPy object": lambda v, n: ([np.array(v, dtype=object)], "columns"),
    "pandas object": lambda v, n: (_pandas().DataFrame({"k": [x.decode() for x in v]}), "dataframe"),
    "pandas string[pyarrow]": lambda v, n: (
        _pandas().DataFrame({"k": _pandas().array([x.decode() for x in v], dtype="string[pyarrow]")}), "dataframe"),
    "Arrow string": lambda v, n: (_arrow().table({"k": _arrow().array([x.decode() for x in v])}), "arrow"),
    "Arrow binary": lambda v, n: (_arrow().table({"k": _arrow().array(v, _arrow().binary())}), "arrow"),
    # A fixed-size binary column holds N bytes a value: what the server would store.
    "Arrow fixed-size binary": lambda v, n: (
        _arrow().table({"k": _arrow().array([x.ljust(n, b"\0") for x in v], _arrow().binary(n))}), "arrow"),
}


def _pandas() -> Any:
    return pytest.importorskip("pandas")


def _arrow() -> Any:
    return pytest.importorskip("pyarrow")


def _utf8_within(length: int) -> st.SearchStrategy[bytes]:
    """UTF-8 text of at most ``length`` bytes, as bytes (so every form above can hold it)."""
    return st.text(max_size=length).map(str.encode).filter(lambda b: len(b) <= length)


@pytest.mark.parametrize("function", ["cityHash64", "sipHash64"])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_hashes_of_fixed_strings_equal_the_engines_of_the_zero_padded_values_in_every_form(
    function: str, data: st.DataObject
) -> None:
    # ClickHouse stores a shorter value padded with zero bytes to N and hashes all N bytes.
    length = data.draw(st.integers(1, 24), label="N")
    values = data.draw(st.lists(_utf8_within(length), min_size=1, max_size=12), label="values")
    type_name = f"FixedString({length})"
    expected = engine(f"{function}(x)", type_name, values)
    key, kind = parse_sharding_key(f"{function}(k)"), value_type(type_name)
    for name, make in FIXED_FORMS.items():
        column = key_column(*make(values, length), 0, kind)
        assert key_values(key, column, kind, len(values)).tolist() == expected, name


@pytest.mark.parametrize("function", ["cityHash64", "sipHash64"])
def test_fixed_string_edges_hash_as_the_engine(function: str) -> None:
    # Empty, one byte, exactly N bytes, N bytes ending in zeros, multi-byte characters at N.
    values = [b"", b"a", b"abcd", b"ab\0\0", b"\0", "\u00e9\u00e9".encode()]
    key, kind = parse_sharding_key(f"{function}(k)"), value_type("FixedString(4)")
    assert key_values(key, values, kind, len(values)).tolist() == engine(f"{function}(x)", "FixedString(4)", values)


@pytest.mark.parametrize("value", ["abcde", b"abcde", "\u00e9\u00e9\u00e9"])
def test_a_fixed_string_value_longer_than_its_column_is_refused_naming_its_length_and_n(value: str | bytes) -> None:
    # The server refuses it too ("Too large value for FixedString(4)").
    key = parse_sharding_key("cityHash64(k)")
    with pytest.raises(ConfigurationError, match=r"5 bytes|6 bytes") as caught:
        key_values(key, ["ab", value], value_type("FixedString(4)"), 2)
    assert "FixedString(4)" in str(caught.value)
    assert repr(value) in str(caught.value)
