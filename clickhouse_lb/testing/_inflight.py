"""The engine insert a replica's applier has in flight: which log entries, under which token.

A replica applies another replica's insert by sending it to its engine with a deduplication
token, and then records the entry as applied; a SIGKILL between the two leaves an entry that is
in the engine but not recorded, and the restarted replica sends it again. That is harmless only
under the *same* token: the engine drops a block whose token it has seen. But which token an
entry is sent under depends on what else is due at that moment (alone it carries its own token,
joined with the inserts after it a batch token, see :mod:`clickhouse_lb.testing._batching`), and
after a restart more inserts are due: an entry sent alone before the kill would be sent again
inside a batch, under a token the engine has never seen, and its rows land twice on that replica
(the numbered-batches test found it, once in about 15 runs).

So the applier writes down what it is about to send (the entries and the token) before it sends
it, and a restarted replica sends exactly that again before anything else. ClickHouse needs no
such record: a replica fetches a part by its name, the same name every time.

A non-insert entry (ALTER, DELETE, TRUNCATE, ...) has no token, and sending a mutation twice is
not harmless (``UPDATE x = x + 1``). The engine writes a mutation to disk
(``mutation_<n>.txt``, ``n`` from the table's block numbers) before the statement returns, so the
record holds each target table's newest mutation number before the entry was sent: a higher one
at restart means the entry ran there. The other non-insert entries leave no such trace and are
sent again, as before (running them again in log order changes nothing, or fails harmlessly:
an ``ADD COLUMN`` of a column that is there).

One file per replica (the applier sends one statement at a time); the record is replaced by a
rename, so a reader sees the old record or the new one, whole. It is never removed while the
replica runs: a record whose entries are all recorded as applied is simply stale.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

FILE_NAME = "batch_in_progress.json"  # the name from when only batches were recorded


@dataclass(frozen=True)
class InFlight:
    """Log entries (``seqs``, in log order) sent to the engine as one insert under ``token``, or
    one non-insert entry with ``mutations``: each target table's (``db.table``) newest mutation
    number before it was sent."""

    seqs: tuple[int, ...]
    token: str = ""
    mutations: dict[str, int] = field(default_factory=dict)

    def ran_on(self, table: str, newest_mutation: int) -> bool:
        """Whether the non-insert entry ran on ``table``, whose newest mutation is now that."""
        return table in self.mutations and newest_mutation > self.mutations[table]


def record(path: Path, flight: InFlight) -> None:
    """Write ``flight`` as the applier's statement in flight (before it is sent)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"seqs": list(flight.seqs), "token": flight.token, "mutations": flight.mutations}))
    os.replace(tmp, path)


def read(path: Path) -> InFlight | None:
    """The last statement recorded in flight, if any (stale or not: the caller knows)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    mutations = {str(t): int(n) for t, n in dict(data.get("mutations") or {}).items()}
    return InFlight(tuple(int(s) for s in data["seqs"]), str(data["token"]), mutations)


def clear(path: Path) -> None:
    path.unlink(missing_ok=True)
