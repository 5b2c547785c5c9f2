"""Startup repair of the engine's insert deduplication logs, before the engine opens them.

Every local replica of a replicated table is a plain MergeTree table with
``non_replicated_deduplication_window``, so the engine itself drops a block whose id it has
seen: that is what makes re-applying a replication entry harmless. But the engine records the
block id (``deduplication_logs/deduplication_log_N.txt``: ``action TAB part TAB block id``)
*before* the part is committed (MergeTreeSink: the log's ``addPart``, then
``renameTempPartAndAdd``). A SIGKILL between the two leaves a record naming a part that never
reached the disk; after the restart the engine takes the block for a duplicate when the replica
applies the write again, and the row is lost on that replica only (found by the chaos test).
ClickHouse's replicated tables keep block ids in Keeper, committed with the part, so they cannot
diverge this way.

:func:`drop_uncommitted_records` removes, from every table's log, the records whose block number
no part directory on disk covers (a part and the parts merged from it cover their block range),
with the engine closed: the replica calls it before it starts its engine.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger("clickhouse_lb.testing.replication")

#: ``<partition id>_<min block>_<max block>_<level>[_<mutation>]`` (partition ids have no ``_``).
_PART = re.compile(r"^(?P<partition>[^_]+)_(?P<min>\d+)_(?P<max>\d+)_\d+(?:_\d+)?$")
_ADD = "1"
_ACTIONS = ("1", "2")  # ADD, DROP


def _covered_blocks(table_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """Block ranges of the parts on disk, by partition (temporary and detached parts excluded)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for entry in os.scandir(table_dir):
        match = _PART.match(entry.name)
        if match and entry.is_dir():
            ranges.setdefault(match["partition"], []).append((int(match["min"]), int(match["max"])))
    return ranges


def _is_committed(part: str, ranges: dict[str, list[tuple[int, int]]]) -> bool:
    match = _PART.match(part)
    if match is None:
        return True  # not a name we understand: keep the record
    block = int(match["min"])
    return any(low <= block <= high for low, high in ranges.get(match["partition"], ()))


def drop_uncommitted_records(engine_dir: str | os.PathLike[str]) -> list[str]:
    """Remove deduplication records of parts that are not on disk, in every table under
    ``engine_dir`` (the engine must not be running). Returns the records removed."""
    removed: list[str] = []
    for logs_dir in sorted(Path(engine_dir).glob("store/*/*/deduplication_logs")):
        ranges = _covered_blocks(logs_dir.parent)
        for log_file in sorted(logs_dir.glob("deduplication_log_*.txt")):
            lines = log_file.read_text().splitlines()
            records = [line.split("\t") for line in lines]
            if any(len(fields) != 3 or fields[0] not in _ACTIONS for fields in records):
                log.warning("%s: unexpected record format, left as it is", log_file)
                continue
            orphans = [
                i for i, (action, part, _) in enumerate(records) if action == _ADD and not _is_committed(part, ranges)
            ]
            if not orphans:
                continue
            keep = [line for i, line in enumerate(lines) if i not in orphans]
            tmp = log_file.with_suffix(".tmp")
            tmp.write_text("".join(f"{line}\n" for line in keep))
            os.replace(tmp, log_file)
            for i in sorted(orphans):
                log.warning("dropped the deduplication record of uncommitted part %s (%s)", records[i][1], log_file)
                removed.append(lines[i])
    return removed
