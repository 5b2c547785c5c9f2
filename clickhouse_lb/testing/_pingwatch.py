"""Watch a replica's ``/ping`` from another process: how long did it go unanswered?

A server's health endpoint must answer within milliseconds while it runs other work (the pool
fails a write as hung when its ``/ping`` checks go unanswered for seconds). The watcher is a
separate process so that the caller's own GIL cannot delay it: it pings every 10 ms on one
keep-alive connection, opening a fresh connection every 10th ping (the accept path too), and
reports the longest wait for an answer.

    with ping_watch(host, port) as watch:
        ...  # the workload, e.g. temporary_table_round(client) in a loop
    watch.longest, watch.pings

:func:`temporary_table_round` is the workload that once froze the local replica's ``/ping`` for
seconds (see :mod:`clickhouse_lb.testing._sqltext`): clickhouse-connect's ``test_temporary_tables``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_WATCHER = r"""
import json, selectors, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
request = f"GET /ping HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()

def connect():
    sock = socket.create_connection((host, port), timeout=300)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock

def ping(sock):
    sock.sendall(request)
    data = b""
    while not data.endswith(b"Ok.\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("connection closed")
        data += chunk

sock = connect()
ping(sock)
print("ready", flush=True)
longest, count = 0.0, 0
stdin = selectors.DefaultSelector()
stdin.register(sys.stdin, selectors.EVENT_READ)
while not stdin.select(timeout=0.01):  # stdin closed (EOF reads as ready): stop
    started = time.monotonic()
    if count % 10 == 9:
        sock.close()
        sock = connect()
    ping(sock)
    longest = max(longest, time.monotonic() - started)
    count += 1
print(json.dumps({"longest": longest, "pings": count}), flush=True)
"""


@dataclass
class PingWatch:
    """Filled in when the ``with`` block ends: the longest wait for a ``/ping`` answer (seconds)
    and how many pings were answered meanwhile."""

    longest: float = 0.0
    pings: int = 0


@contextmanager
def ping_watch(host: str, port: int) -> Iterator[PingWatch]:
    """Ping ``host:port`` from another process for the duration of the block (it has answered
    once when the block starts)."""
    watch = PingWatch()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, host, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the /ping watcher of {host}:{port} did not start")
        yield watch
        proc.stdin.close()
        figures = json.loads(proc.stdout.readline() or "{}")
        if proc.wait(timeout=300) != 0 or "longest" not in figures:
            raise RuntimeError(f"the /ping watcher of {host}:{port} failed")
        watch.longest, watch.pings = float(figures["longest"]), int(figures["pings"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# clickhouse-connect's test_temporary_tables, statement for statement (its indentation included).
_CREATE = """
                        CREATE
                        TEMPORARY TABLE temp_test_table
            (
                field1 String,
                field2 String
            )"""
_INSERT = "INSERT INTO temp_test_table (field1, field2) VALUES ('test1', 'test2'), ('test3', 'test4')"


def temporary_table_round(client: Any) -> None:
    """One round of clickhouse-connect's ``test_temporary_tables`` through ``client`` (a
    clickhouse-connect client or a pool): a new session, a temporary table, inserts (SQL and a
    DataFrame), reads, the drop. Raises AssertionError if the table does not hold the 4 rows."""
    settings = {"session_id": f"pingwatch-{uuid.uuid4()}"}
    client.command(_CREATE, settings=settings)
    client.command(_INSERT, settings=settings)
    frame = client.query_df("SELECT * FROM temp_test_table", settings=settings)
    client.insert_df("temp_test_table", frame, settings=settings)
    frame = client.query_df("SELECT * FROM temp_test_table", settings=settings)
    assert len(frame["field1"]) == 4, f"expected 4 rows, got {len(frame['field1'])}"
    client.command("DROP TABLE IF EXISTS temp_test_table", settings=settings)
