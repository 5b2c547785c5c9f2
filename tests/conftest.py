"""Shared helpers for the unit tests (no server needed)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import LoadBalancing
from clickhouse_lb.core import shared_state

#: Hypothesis keeps its example database and its cache of the code's constants here, under the
#: checkout's ignored .pytest_cache/, instead of a .hypothesis/ folder in the working directory.
HYPOTHESIS_DIR = Path(__file__).resolve().parents[1] / ".pytest_cache" / "hypothesis"
set_hypothesis_home_dir(HYPOTHESIS_DIR)

GOLDEN_CANDIDATES = [
    Path(__file__).resolve().parent / "golden" / "ordering.jsonl",
]


def load_golden() -> list[dict[str, Any]]:
    for path in GOLDEN_CANDIDATES:
        if path.exists():
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    raise FileNotFoundError(f"golden vectors not found in {GOLDEN_CANDIDATES}")


@pytest.fixture(autouse=True)
def _fresh_shared_balancing_state() -> Iterator[None]:
    """Pools and engines over the same replicas share their balancing state for the life of the
    process (clickhouse_lb.core.shared_state): each test starts from none, as a new process would."""
    shared_state.registry.clear()
    yield
    shared_state.registry.clear()


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def replicas(*hosts: str, priorities: list[int] | None = None) -> list[Replica]:
    prios = priorities or [1] * len(hosts)
    return [Replica(h, 8123, p) for h, p in zip(hosts, prios)]


__all__ = ["FakeClock", "LoadBalancing", "load_golden", "replicas"]


@pytest.fixture
def slow_ping_server() -> Iterator[tuple[str, list[float]]]:
    """An HTTP server answering ``/ping`` after a delay (seconds, settable through the list): the
    stall detector's tests (tests/test_stalls.py, tests/test_stall_evidence.py)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    delay = [0.2]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):  # a client that gave up closed it
                while conn.recv(4096):
                    time.sleep(delay[0])
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\nOk.\n")

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/ping", delay
    listener.close()
