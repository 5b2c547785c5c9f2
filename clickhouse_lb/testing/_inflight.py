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

One file per replica (the applier sends one insert at a time); the record is replaced by a
rename, so a reader sees the old record or the new one, whole. It is never removed while the
replica runs: a record whose entries are all recorded as applied is simply stale.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "batch_in_progress.json"  # the name from when only batches were recorded


@dataclass(frozen=True)
class InFlight:
    """Log entries (``seqs``, in log order) sent to the engine as one insert under ``token``."""

    seqs: tuple[int, ...]
    token: str


def record(path: Path, flight: InFlight) -> None:
    """Write ``flight`` as the applier's insert in flight (before it is sent)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"seqs": list(flight.seqs), "token": flight.token}))
    os.replace(tmp, path)


def read(path: Path) -> InFlight | None:
    """The last insert recorded in flight, if any (stale or not: the caller knows)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return InFlight(tuple(int(s) for s in data["seqs"]), str(data["token"]))


def clear(path: Path) -> None:
    path.unlink(missing_ok=True)
