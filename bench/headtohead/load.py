"""Threads of statements against one target, and what each statement did.

Times are ``time.perf_counter()`` seconds relative to a common origin ``t0`` chosen by the
caller, so outcomes of a run and the faults injected during it share one time line.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Outcome", "run_count", "run_until"]


@dataclass(frozen=True)
class Outcome:
    """One statement: its thread, start and end (s since t0), the replica that answered (when
    the statement asks for it) and whether it succeeded (``error``: the exception's class)."""

    thread: int
    start: float
    end: float
    replica: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


_HTTP_STATUS = re.compile(r"HTTP status (\d{3})")


def error_kind(exc: BaseException) -> str:
    """The exception's class, with the HTTP status when there is one (HAProxy's 503 "no server
    is available" and 504 "gateway timeout" are different stories)."""
    status = _HTTP_STATUS.search(str(exc))
    return f"{type(exc).__name__} HTTP {status.group(1)}" if status else type(exc).__name__


def _one(query: Callable[[str], Sequence[Sequence[Any]]], sql: str, thread: int, t0: float,
         want_replica: bool) -> Outcome:
    start = time.perf_counter()
    try:
        rows = query(sql)
    except Exception as exc:
        return Outcome(thread, start - t0, time.perf_counter() - t0, None, error_kind(exc))
    end = time.perf_counter()
    replica = str(rows[0][0]) if want_replica and rows else None
    return Outcome(thread, start - t0, end - t0, replica)


def run_count(query: Callable[[str], Sequence[Sequence[Any]]], sql: str, threads: int, total: int,
              *, want_replica: bool = False) -> tuple[list[Outcome], float]:
    """``total`` statements split over ``threads`` threads started together; returns the
    outcomes and the wall time from the common start to the last statement's end."""
    per_thread = [total // threads + (1 if i < total % threads else 0) for i in range(threads)]
    results: list[list[Outcome]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    t0_box: list[float] = []

    def work(i: int) -> None:
        barrier.wait()
        t0 = t0_box[0]
        out = results[i]
        for _ in range(per_thread[i]):
            out.append(_one(query, sql, i, t0, want_replica))

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    t0_box.append(time.perf_counter())
    barrier.wait()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0_box[0]
    return [o for r in results for o in r], wall


def run_until(query: Callable[[str], Sequence[Sequence[Any]]], sql: str, threads: int, t0: float,
              stop: threading.Event, *, want_replica: bool = True) -> Callable[[], list[Outcome]]:
    """Start ``threads`` threads running ``sql`` back to back until ``stop`` is set; returns a
    function that joins them and gives every outcome (a statement under way when ``stop`` is set
    finishes first: its end is part of the picture)."""
    results: list[list[Outcome]] = [[] for _ in range(threads)]

    def work(i: int) -> None:
        out = results[i]
        while not stop.is_set():
            out.append(_one(query, sql, i, t0, want_replica))

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()

    def join(timeout: float = 120.0) -> list[Outcome]:
        for w in workers:
            w.join(timeout)
        return [o for r in results for o in r]

    return join


def pack_outcome(o: Outcome) -> list[Any]:
    """One outcome as a JSON row (results.json); :func:`unpack_outcome` reads it back."""
    return [o.thread, round(o.start, 5), round(o.end, 5), o.replica, o.error]


def unpack_outcome(row: Sequence[Any]) -> Outcome:
    return Outcome(int(row[0]), float(row[1]), float(row[2]), row[3], row[4])
