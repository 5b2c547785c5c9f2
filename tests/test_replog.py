"""The replication log file: ordering, durability framing, torn tails, the writer lock."""

from __future__ import annotations

import threading
from pathlib import Path

from clickhouse_lb.testing._replog import ReplicationLog, writer_lock


def test_entries_are_numbered_and_read_by_another_reader(tmp_path: Path) -> None:
    writer, reader = ReplicationLog(tmp_path), ReplicationLog(tmp_path)
    with writer.locked():
        first = writer.append({"kind": "insert"}, b"\x00\x01payload")
        second = writer.append({"kind": "table", "sql": "é"})
    assert (first.seq, second.seq) == (1, 2)
    new = reader.refresh()
    assert [e.seq for e in new] == [1, 2]
    assert reader.payload(new[0]) == b"\x00\x01payload"
    assert new[1].header["sql"] == "é"
    assert reader.refresh() == []


def test_a_torn_record_is_not_read_and_the_next_writer_cuts_it(tmp_path: Path) -> None:
    log = ReplicationLog(tmp_path)
    with log.locked():
        log.append({"kind": "insert"}, b"x" * 100)
    good_size = log.path.stat().st_size
    with log.locked():
        log.append({"kind": "insert"}, b"y" * 100)
    data = log.path.read_bytes()
    log.path.write_bytes(data[: good_size + 30])  # a writer SIGKILLed mid-write
    reader = ReplicationLog(tmp_path)
    assert [e.seq for e in reader.refresh()] == [1]
    with reader.locked():
        entry = reader.append({"kind": "insert"}, b"z")
    assert entry.seq == 2
    fresh = ReplicationLog(tmp_path)
    entries = fresh.refresh()
    assert [e.seq for e in entries] == [1, 2]
    assert fresh.payload(entries[1]) == b"z"


def test_the_writer_lock_excludes_other_processes_lockers(tmp_path: Path) -> None:
    log = ReplicationLog(tmp_path)
    order: list[str] = []
    with log.locked():
        thread = threading.Thread(target=lambda: _take(tmp_path, order))
        thread.start()
        thread.join(timeout=0.3)
        order.append("log released")
    thread.join(timeout=10)
    assert order == ["log released", "other got it"]


def _take(directory: Path, order: list[str]) -> None:
    with writer_lock(directory):
        order.append("other got it")


def test_locked_is_reentrant(tmp_path: Path) -> None:
    log = ReplicationLog(tmp_path)
    with log.locked():
        with log.locked():
            assert log.held
        assert log.held
        log.append({"kind": "attach"})
    assert not log.held
