"""The sharding key type memo of Arrow inserts: remembered for its time, then read again."""

from __future__ import annotations

from clickhouse_lb.core.key_types import KeyTypeMemo

ENTRY = (None, "events_local", "id")


def test_a_type_is_remembered_until_its_time_runs_out() -> None:
    memo = KeyTypeMemo(60.0)
    assert memo.lookup(ENTRY, 100.0) is None
    memo.remember(ENTRY, "Int32", 100.0)
    assert memo.lookup(ENTRY, 159.9) == "Int32"
    assert memo.lookup(ENTRY, 160.0) is None  # read again
    assert memo.lookup((None, "events_local", "v"), 100.0) is None  # per column
    assert memo.lookup(("other_db", "events_local", "id"), 100.0) is None  # and per database


def test_a_type_read_again_replaces_the_old_one() -> None:
    memo = KeyTypeMemo(10.0)
    memo.remember(ENTRY, "Int32", 0.0)
    memo.remember(ENTRY, "UInt64", 20.0)
    assert memo.lookup(ENTRY, 25.0) == "UInt64"


def test_zero_remembers_nothing_and_forget_empties_it() -> None:
    off = KeyTypeMemo(0.0)
    off.remember(ENTRY, "Int32", 0.0)
    assert off.lookup(ENTRY, 0.0) is None
    memo = KeyTypeMemo(60.0)
    memo.remember(ENTRY, "Int32", 0.0)
    memo.forget()
    assert memo.lookup(ENTRY, 1.0) is None
