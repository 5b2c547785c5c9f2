"""The sharding key column's ClickHouse type per table, remembered for a while (no I/O).

An Arrow insert (``insert_arrow``, ``insert_df_arrow``) carries its own column types, so the only
thing a routed one needs from the server is the key column's type (it decides how an integer is
hashed): without a memo that is a DESCRIBE round trip per insert, 2-16 ms of a 1M-row insert's
0.2 s on a local cluster. A writer sending batch after batch to one table asks once per
``ttl`` instead. The server itself does not re-read the local tables' types per insert either: a
``Distributed`` table hashes by the types of its own declared columns.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["KeyTypeMemo"]


class KeyTypeMemo:
    """``(database, table, column)`` -> the column's type name, each for ``ttl`` seconds after
    it was read (0: never remembered). Safe across threads without a lock: one dict, whose
    entries are replaced whole (a reader sees an old entry or a new one)."""

    __slots__ = ("_entries", "ttl")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._entries: dict[Hashable, tuple[str, float]] = {}

    def lookup(self, key: Hashable, now: float) -> str | None:
        """The type read for ``key`` less than ``ttl`` seconds before ``now``, or None."""
        entry = self._entries.get(key)
        if entry is None or now >= entry[1]:
            return None
        return entry[0]

    def remember(self, key: Hashable, type_name: str, now: float) -> None:
        if self.ttl > 0:
            self._entries[key] = (type_name, now + self.ttl)

    def forget(self) -> None:
        """Every remembered type: the next insert of each table reads it again."""
        self._entries.clear()
