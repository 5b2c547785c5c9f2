"""Read-your-writes settings (pure): whether a pool sends a read that follows a write of the same
thread or task to a replica known to have that write, for how long, and how long a read may wait
for another replica to catch up (see :mod:`clickhouse_lb.core.read_your_writes`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clickhouse_lb.config._fields import InSeconds, parse_fields
from clickhouse_lb.config._values import as_bool, bounded_int

__all__ = [
    "DEFAULT_READ_YOUR_WRITES",
    "READ_YOUR_WRITES",
    "READ_YOUR_WRITES_SETTING_NAMES",
    "ReadYourWritesSettings",
    "parse_read_your_writes_settings",
]

#: The pool setting, and the per-statement setting of the same name (taken out of ``settings=``).
READ_YOUR_WRITES = "read_your_writes"


@dataclass(frozen=True)
class ReadYourWritesSettings:
    """Ours (the server has no equivalent: its answer is ``insert_quorum`` with
    ``select_sequential_consistency``)."""

    #: Off by default: reads are balanced as if nothing had been written.
    read_your_writes: bool = False
    #: How long a write steers the reads after it (ms): longer than replication usually lags.
    read_your_writes_window_ms: int = 5000
    #: How long a read whose writer failed may wait for another replica to catch up (ms).
    read_your_writes_timeout_ms: int = 5000

    window = InSeconds("read_your_writes_window_ms")
    timeout = InSeconds("read_your_writes_timeout_ms")


#: Each setting and its parser.
_PARSERS = {
    READ_YOUR_WRITES: as_bool,
    "read_your_writes_window_ms": bounded_int,
    "read_your_writes_timeout_ms": bounded_int,
}

READ_YOUR_WRITES_SETTING_NAMES: tuple[str, ...] = tuple(_PARSERS)

DEFAULT_READ_YOUR_WRITES = ReadYourWritesSettings()


def parse_read_your_writes_settings(values: Mapping[str, Any]) -> ReadYourWritesSettings:
    """From names and values (strings allowed, as from a DSN or URL); missing ones are defaults."""
    return ReadYourWritesSettings(**parse_fields(values, _PARSERS))
