"""Read-your-writes, the decisions (pure: no I/O, the clock passed in).

Each thread or asyncio task remembers its own recent writes (a :class:`contextvars.ContextVar`:
a thread starts with none, a task starts with its parent's as they were when it was created):
for each, the replica that acknowledged it, when, its table when known (inserts), and the
replicas known to have it (the acknowledger, and any made to catch up since). A read under
read-your-writes then:

* tries first the replicas known to have every recent write of this replica set, in the order
  the strategy gave (the rest of the order unchanged: :func:`order_for_read`);
* on any other replica, first waits until that replica has the writes' tables as of now
  (``SYSTEM SYNC REPLICA``, :func:`sync_replica_sql`), within the read's bound.

A write stops steering reads once it is older than the window, or once every replica of the set
is known to have it. With no recent write, nothing here runs and the read is balanced as ever.

Writes are keyed by the acknowledging replica's address, not by pool: every pool over that
replica (for instance per-request pools, or a sharded pool's shard) sees the write, and a pool
over other replicas ignores it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from clickhouse_lb.core._statements import INSERT_METHODS, after_leading_noise

__all__ = [
    "RecentWrite",
    "caught_up",
    "forget_writes",
    "missing_on",
    "order_for_read",
    "qualified_table",
    "recent_writes",
    "record_write",
    "sync_replica_sql",
    "written_table",
]

#: At most this many writes are remembered per thread or task (the oldest go first): a read
#: checks each, and a loop of inserts into many tables must not make reads slower and slower.
MAX_REMEMBERED = 32


@dataclass(frozen=True)
class RecentWrite:
    """One acknowledged write, as a read needs it."""

    #: The replica that acknowledged it (``host:port``).
    address: str
    #: ``db.table`` (or ``table``, in the writing client's database) for an insert; None when
    #: not known (a ``command()``), and then no other replica can be made to catch up with it.
    table: str | None
    #: ``time.monotonic()`` when it was acknowledged.
    at: float
    #: The replicas known to have it: the acknowledger, and those made to catch up since.
    known: frozenset[str]


_WRITES: ContextVar[tuple[RecentWrite, ...]] = ContextVar("clickhouse_lb_recent_writes", default=())


def record_write(address: str, table: str | None, now: float, window: float) -> None:
    """Remember a write that ``address`` acknowledged (in this thread or task)."""
    kept = tuple(w for w in _WRITES.get() if now - w.at < window and not (w.table == table and w.address == address))
    _WRITES.set((*kept[-(MAX_REMEMBERED - 1) :], RecentWrite(address, table, now, frozenset((address,)))))


def recent_writes(addresses: Sequence[str], now: float, window: float) -> tuple[RecentWrite, ...]:
    """This thread's or task's writes that still steer a read over ``addresses``: acknowledged by
    one of them, within the window, and not yet known to be on all of them."""
    writes = _WRITES.get()
    if not writes:
        return ()
    members = frozenset(addresses)
    return tuple(w for w in writes if w.address in members and now - w.at < window and not members <= w.known)


def missing_on(writes: Iterable[RecentWrite], address: str) -> list[RecentWrite]:
    """The writes ``address`` is not known to have."""
    return [w for w in writes if address not in w.known]


def order_for_read(order: Sequence[int], addresses: Sequence[str], writes: Sequence[RecentWrite]) -> list[int]:
    """The plan with the replicas known to have every write first, each group in the plan's own
    order (a stable partition: with one writer, the writer first and the rest unchanged)."""
    first = [i for i in order if all(addresses[i] in w.known for w in writes)]
    if not first or len(first) == len(order):
        return list(order)
    chosen = set(first)
    return first + [i for i in order if i not in chosen]


def caught_up(writes: Iterable[RecentWrite], address: str) -> None:
    """``address`` now has ``writes`` (it synced their tables): later reads may go there too."""
    done = set(writes)
    _WRITES.set(tuple(replace(w, known=w.known | {address}) if w in done else w for w in _WRITES.get()))


def forget_writes() -> None:
    """Forget this thread's or task's writes (for tests and benchmarks that reuse a thread)."""
    _WRITES.set(())


# -- which table a write wrote ---------------------------------------------------------------

# Matched after the statement's leading comments and brackets (``/* tag */ INSERT ...``), or
# searched for after a leading ``WITH`` clause.
_INSERT_INTO = re.compile(
    r"\bINSERT\s+INTO\s+(?:TABLE\s+)?(?!FUNCTION\b)((?:`[^`]+`|\"[^\"]+\"|[\w$]+)(?:\.(?:`[^`]+`|\"[^\"]+\"|[\w$]+))?)",
    re.IGNORECASE,
)
_PLAIN = re.compile(r"^[A-Za-z_][\w$]*$")
#: Where each insert method takes ``database`` positionally (clickhouse-connect's Client and
#: AsyncClient agree; tests/test_read_your_writes.py checks it against both signatures).
DATABASE_POSITIONS = {"insert": 3, "insert_df": 2, "insert_arrow": 2, "insert_df_arrow": 2}


def _quoted(name: str) -> str:
    return name if _PLAIN.match(name) else "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def qualified_table(table: str, database: str | None) -> str:
    """``table`` as a client method takes it (``"t"``, ``"db.t"``, quoted or not) in SQL form,
    qualified with ``database`` when it has none."""
    text = table.strip()
    if text.startswith(("`", '"')) or "." in text:
        return text if database is None or "." in text else f"{_quoted(database)}.{text}"
    return f"{_quoted(database)}.{_quoted(text)}" if database else _quoted(text)


def written_table(method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], text: Any,
                  database: str | None) -> str | None:
    """The table a write wrote, when the call says (an insert method's ``table``, an insert
    context's, or ``INSERT INTO t`` in SQL); None otherwise (DDL, ``ALTER``, unknown)."""
    if method in INSERT_METHODS:
        context = kwargs.get("context") or (args[0] if method == "data_insert" and args else None)
        if context is not None and not isinstance(context, (str, bytes)):
            table = getattr(context, "table", None)
            database = getattr(context, "database", None) or database
        else:
            table = kwargs.get("table", args[0] if args else None)
            database = _given_database(method, args, kwargs) or database
        return qualified_table(table, database) if isinstance(table, str) and table.strip() else None
    if isinstance(text, bytes):
        text = text[:1024].decode("utf-8", "replace")
    if not isinstance(text, str):
        return None
    rest = after_leading_noise(text)
    match = _INSERT_INTO.search(rest) if rest[:4].upper() == "WITH" else _INSERT_INTO.match(rest)
    return qualified_table(match.group(1), database) if match else None


def _given_database(method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The ``database`` an insert method was given, by keyword or positionally."""
    if "database" in kwargs:
        return kwargs["database"]
    at = DATABASE_POSITIONS.get(method)
    return args[at] if at is not None and len(args) > at else None


def sync_replica_sql(table: str) -> str:
    """ClickHouse's own wait for a replica to process its replication queue as of now
    (src/Interpreters/InterpreterSystemQuery.cpp, ``SYNC REPLICA``): the write is in it, so
    once it returns the replica has the write. Bounded by the ``receive_timeout`` setting."""
    return f"SYSTEM SYNC REPLICA {table}"
