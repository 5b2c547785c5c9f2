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


def test_shared_holders_run_together_and_the_writer_lock_waits_for_them(tmp_path: Path) -> None:
    log = ReplicationLog(tmp_path)
    inside = threading.Barrier(3)  # two shared holders at once, and this thread
    release = threading.Event()

    def insert() -> None:
        with log.shared():
            inside.wait(timeout=10)
            release.wait(timeout=10)

    holders = [threading.Thread(target=insert) for _ in range(2)]
    for t in holders:
        t.start()
    inside.wait(timeout=10)  # both are inside: shared holders do not exclude each other
    order: list[str] = []
    writer = threading.Thread(target=lambda: _take(tmp_path, order))
    writer.start()
    writer.join(timeout=0.3)
    assert order == []  # the writer waits for them
    release.set()
    writer.join(timeout=10)
    assert order == ["other got it"]
    for t in holders:
        t.join(timeout=10)


def test_a_replica_stopped_while_waiting_for_the_lock_does_not_shut_writers_out(tmp_path: Path) -> None:
    # pause() SIGSTOPs a replica under writer_lock. A replica thread that wants the lock at that
    # moment must be stopped *waiting at* the turnstile: had it passed it (released early by the
    # pause), it would be stopped holding it, and the next pause or writer would wait forever.
    import os
    import signal
    import subprocess
    import sys
    import time

    root = str(Path(__file__).resolve().parents[1])
    code = "import sys; from clickhouse_lb.testing._replog import ReplicationLog\n"
    code += "with ReplicationLog(sys.argv[1]).shared(): print('in', flush=True)\n"
    with writer_lock(tmp_path):
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": root}
        )
        deadline = time.monotonic() + 20
        while f" {child.pid} " not in "".join(
            line for line in Path("/proc/locks").read_text().splitlines(True) if "->" in line
        ):
            assert time.monotonic() < deadline, "the child never waited for a lock"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGSTOP)
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
            assert time.monotonic() < deadline, "the child did not stop"  # SIGSTOP lands asynchronously
            time.sleep(0.01)
    try:
        taken = threading.Event()

        def again() -> None:
            with writer_lock(tmp_path):
                taken.set()

        thread = threading.Thread(target=again, daemon=True)
        thread.start()
        assert taken.wait(timeout=10), "a stopped waiter holds the turnstile"
    finally:
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=20)
    assert out == b"in\n"
