"""Which replicated inserts an applier may apply as one engine insert, and under which token.

A replica applies the other replicas' inserts with its applier thread; each engine insert of a
MergeTree table writes a part (about 10 ms of CPU in chdb even for one row). Under many
concurrent writers the appliers, not the writers, then bound the cluster's insert rate. So an
applier takes the inserts of one table that are due, one after the other in the log (entries of
other tables in between do not matter: inserts into different tables commute, and so do
inserts into one table), and sends them to the engine as one insert when they carry the same
statement tail (columns, ``FORMAT``), the same settings, and data in a format whose
concatenation is the data of all of them.

Deduplication stays exact:

* the batch is inserted with a token made from its members' tokens, and recorded (which entries,
  which token) before it runs; a replica killed meanwhile re-applies exactly that batch at
  restart, which the engine drops if it had committed (see :mod:`clickhouse_lb.testing._inflight`);
  an entry sent alone is recorded the same way, so it is not sent again inside a batch;
* an entry whose block id an earlier entry of its table already logged (two inserts of one
  block on two replicas, each logged before it saw the other: a client's retry while the first
  replica was still running it) is not sent by any applier: the earlier entry brought the block
  (it may have gone in a batch, so the later one alone would be new rows), and the replica that
  ran the later one has it already;
* an entry whose block this replica's engine may already hold under the entry's own token is
  applied alone: a write rolled forward at restart, this replica's own write left unmarked by a
  crash after it was logged, a block this replica ran before a crash while a retry on another
  replica logged it, the earlier of two entries of one block (the other's replica ran it under
  its token), and a block this replica is running itself now (see ``Replication._may_batch``).
"""

from __future__ import annotations

import hashlib
from typing import Any

#: Formats whose payloads, concatenated, are one valid payload with all the rows: binary
#: formats without a header, and text formats one row per line (when each payload ends a line).
BINARY = frozenset({"native", "rowbinary", "rowbinarywithdefaults"})
_LINES = frozenset({"tabseparated", "tsv", "tabseparatedraw", "tsvraw", "csv", "jsoneachrow", "jsoncompacteachrow"})
#: A batch stays below these (entries, bytes of data).
MAX_ENTRIES = 1000
MAX_BYTES = 16 << 20


def batchable(header: dict[str, Any], payload_length: int) -> bool:
    """Whether this insert entry may be applied together with others."""
    fmt = str(header.get("format") or "").lower()
    if header.get("rolled_forward") or header.get("kind") != "insert" or payload_length > MAX_BYTES:
        return False
    return fmt in BINARY or fmt in _LINES


def same_statement(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two insert entries differ only by their data (and tokens)."""
    return (
        a.get("path") == b.get("path")
        and a.get("rest") == b.get("rest")
        and a.get("format") == b.get("format")
        and (a.get("settings") or {}) == (b.get("settings") or {})
    )


def joinable(fmt: str, payload: bytes) -> bool:
    """Whether this payload can be followed by another one (a text format's last line is ended)."""
    return fmt.lower() in BINARY or not payload or payload.endswith(b"\n")


def token(tokens: list[str]) -> str:
    """The deduplication token of a batch: the same members, the same token."""
    digest = hashlib.sha256("\0".join(tokens).encode())
    return f"clickhouse-lb-batch-{digest.hexdigest()}"
