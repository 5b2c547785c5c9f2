"""The local cluster's replication log: one append-only file on disk shared by every replica.

It plays the part of ClickHouse Keeper's replication log: every replicated write (an insert
block, an ALTER/TRUNCATE/DELETE of a replicated table, an ``ON CLUSTER`` statement, a replica
attaching to or leaving a table) is one *entry*, numbered by ``seq`` (1, 2, ...) in log order.

File format: records of ``MAGIC (4) | header length (4) | payload length (8) | crc32 (4)``
followed by the JSON header and the payload (an insert's data, as sent). The crc covers the
header and the payload, so a record torn by a writer's SIGKILL is recognised.

Locks (``flock``, so they are cluster-wide and a SIGKILLed holder releases them):

* ``log.lock`` is a readers-writer lock. Replicated *inserts* hold it shared (:meth:`ReplicationLog.shared`)
  from the moment they run on the receiving replica until they are logged: they commute, so
  any number of them, on any replica, run at once. Everything that must be ordered against them
  (ALTER/TRUNCATE/DELETE of a replicated table, ``ON CLUSTER`` statements, CREATE/DROP, the
  applier's ``ON CLUSTER`` entries) holds it exclusively (:meth:`ReplicationLog.locked`). A writer
  waiting for it first takes ``turnstile.lock``, which every reader passes through before taking
  ``log.lock`` shared, so a steady stream of inserts cannot starve it.
* ``append.lock`` serialises the appends themselves (a leaf lock, held only inside ``log.lock``):
  the appender reads every record it has not seen, drops a torn tail left by a killed writer,
  writes its record and releases the lock; it fsyncs *after* releasing it, so concurrent
  appenders share one journal commit instead of queueing one fsync each (group commit by the
  kernel), and still every entry is durable before the statement that wrote it is acknowledged.

Readers never lock: a record not yet complete (or a torn one) is simply not read yet.
:meth:`LocalCluster.pause` holds the turnstile and ``log.lock`` exclusively while it sends SIGSTOP
and waits for the stop, so a stopped replica holds none of these locks (at most it waits for one).
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"CHLB"
_HEAD = struct.Struct("<4sIQI")
LOG_NAME = "log.bin"
LOCK_NAME = "log.lock"
TURNSTILE_NAME = "turnstile.lock"
APPEND_LOCK_NAME = "append.lock"


@dataclass
class Entry:
    """One log record: its header (``seq``, ``kind``, ...) and where its payload is."""

    header: dict[str, Any]
    payload_offset: int
    payload_length: int

    @property
    def seq(self) -> int:
        return int(self.header["seq"])

    @property
    def kind(self) -> str:
        return str(self.header["kind"])


class ReplicationLog:
    """Read and append entries of the log file in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / LOG_NAME
        self.path.touch(exist_ok=True)
        self._lock_fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        self._append_fd = os.open(self.directory / APPEND_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        self._thread_lock = threading.RLock()
        self._append_thread_lock = threading.Lock()  # one appending thread per process at a time
        self._depth = 0  # nesting of locked() in the thread that holds it
        self._owner: int | None = None
        self._shared_here = threading.local()  # whether this thread holds shared()
        self._read_lock = threading.Lock()
        self._offset = 0  # end of the last complete record read
        self.entries: list[Entry] = []

    def close(self) -> None:
        os.close(self._lock_fd)
        os.close(self._append_fd)

    @property
    def last_seq(self) -> int:
        return len(self.entries)

    @property
    def held(self) -> bool:
        """Whether the calling thread holds :meth:`locked`."""
        return self._owner == threading.get_ident()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cluster-wide writer lock exclusively (re-entrant within a thread)."""
        if getattr(self._shared_here, "held", False):
            raise RuntimeError("locked() inside shared(): take the exclusive lock first")
        with self._thread_lock:
            if self._depth == 0:
                with _turnstile(self.directory):
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
                self._owner = threading.get_ident()
                self.refresh()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the writer lock shared (for a replicated insert); inside :meth:`locked`, a no-op.

        Each holder opens the lock file itself: flock locks belong to an open file description,
        so threads of one process sharing one descriptor would share one lock.
        """
        if self.held or getattr(self._shared_here, "held", False):
            yield
            return
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            with _turnstile(self.directory):
                fcntl.flock(fd, fcntl.LOCK_SH)
            self._shared_here.held = True
            try:
                yield
            finally:
                self._shared_here.held = False
        finally:
            os.close(fd)  # releases the lock

    def refresh(self, repair: bool = False) -> list[Entry]:
        """Read the records appended since the last call; return the new entries.

        ``repair`` (only under the writer lock): a torn record at the end is cut off.
        """
        with self._read_lock:
            new: list[Entry] = []
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
            pos = 0
            while pos + _HEAD.size <= len(data):
                magic, hlen, plen, crc = _HEAD.unpack_from(data, pos)
                end = pos + _HEAD.size + hlen + plen
                if magic != MAGIC or end > len(data):
                    break
                body = data[pos + _HEAD.size : end]
                if zlib.crc32(body) != crc:
                    break
                header = json.loads(body[:hlen])
                entry = Entry(header, self._offset + pos + _HEAD.size + hlen, plen)
                if entry.seq != len(self.entries) + 1:
                    break
                self.entries.append(entry)
                new.append(entry)
                pos = end
            self._offset += pos
            if repair and pos < len(data):
                with open(self.path, "r+b") as f:
                    f.truncate(self._offset)
                    os.fsync(f.fileno())
            return new

    def append(self, header: dict[str, Any], payload: bytes = b"") -> Entry:
        """Append one entry (caller holds :meth:`locked` or :meth:`shared`); its ``seq`` is
        assigned here. Returns once the entry is on disk (fsynced)."""
        with self._append_thread_lock:
            fcntl.flock(self._append_fd, fcntl.LOCK_EX)
            try:
                self.refresh(repair=True)  # nobody writes without this lock: a torn tail is a dead writer's
                header = dict(header, seq=self.last_seq + 1)
                raw = json.dumps(header, separators=(",", ":")).encode()
                body = raw + payload
                record = _HEAD.pack(MAGIC, len(raw), len(payload), zlib.crc32(body)) + body
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
                try:
                    written = os.write(fd, record)
                    while written < len(record):
                        written += os.write(fd, record[written:])
                except BaseException:
                    os.close(fd)
                    raise
            finally:
                fcntl.flock(self._append_fd, fcntl.LOCK_UN)
        try:
            # Outside the append lock: other appenders write their records meanwhile, and one
            # fsync (ours or theirs) commits them all.
            os.fsync(fd)
        finally:
            os.close(fd)
        self.refresh()
        return self.entries[int(header["seq"]) - 1]

    def payload(self, entry: Entry) -> bytes:
        if not entry.payload_length:
            return b""
        with open(self.path, "rb") as f:
            f.seek(entry.payload_offset)
            return f.read(entry.payload_length)


@contextmanager
def _turnstile(directory: Path) -> Iterator[None]:
    """Pass (or, for a writer, hold while waiting) the turnstile in front of ``log.lock``."""
    fd = os.open(directory / TURNSTILE_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextmanager
def writer_lock(directory: str | os.PathLike[str]) -> Iterator[None]:
    """The writer lock of the log in ``directory``, exclusively, for another process (the
    cluster's pause): once held, no replica is inside a logged write or an append.

    The turnstile stays held too: released early, a replica's thread could pass it and wait
    for the lock, and a replica stopped there would hold the turnstile, shutting every other
    writer out until it is resumed."""
    fd = os.open(Path(directory) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with _turnstile(Path(directory)):
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
    finally:
        os.close(fd)
