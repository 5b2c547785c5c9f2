"""The pool's defaults inside a busy process: a thread holding the GIL 0.8 s at a time, back to
back, and two CPU hogs in other processes (clickhouse_lb.testing.load). Healthy replicas must get
no error counted against them (no false "hung", no failed probe) and a write must never be given
up; a SIGSTOPped replica must still be routed around.

``CLICKHOUSE_LB_LOAD_SECONDS`` sets how long the load runs (default 6 s per test; the issue's
figure is 60). The measured figures, before and after, are in BENCHMARKS.md
(bench/bench_stalls.py).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import clickhouse_lb
from clickhouse_lb.core.events import ErrorRecordedEvent
from clickhouse_lb.testing import ClusterBase
from clickhouse_lb.testing.load import busy_process

SECONDS = float(os.environ.get("CLICKHOUSE_LB_LOAD_SECONDS", "6"))
WHO = "SELECT getMacro('replica')"
#: Long enough for liveness checks to run while it waits (they start after 100 ms).
SLOW_READ = "SELECT sleep(0.3)"


class Errors:
    def __init__(self) -> None:
        self.events: list[ErrorRecordedEvent] = []

    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        self.events.append(event)


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    healthy_clickhouse_cluster.on_all("DROP TABLE IF EXISTS lb_stall_writes")
    healthy_clickhouse_cluster.on_all("CREATE TABLE lb_stall_writes (id UInt32) ENGINE = MergeTree ORDER BY id")
    return healthy_clickhouse_cluster


#: The pause test's GIL holder leaves 0.2 s between its 0.8 s holds: held back to back, every
#: GIL hand-back to a reader waits out a whole hold, so any statement (several hand-backs) takes
#: seconds on a healthy replica too, and a per-thread gap says nothing about routing (measured
#: 8.7-9.8 s with the replica paused, BENCHMARKS.md).
GAP_PAUSE = 0.2


def test_a_busy_process_gets_no_error_counted_against_healthy_replicas(cluster: ClusterBase) -> None:
    errors = Errors()
    failures: list[BaseException] = []
    with clickhouse_lb.get_pool(cluster.hosts, listeners=[errors]) as pool:
        for _ in range(6):
            pool.command(WHO)
        stop = threading.Event()
        done = [0, 0]

        def read() -> None:
            while not stop.is_set():
                try:
                    pool.command(SLOW_READ)
                    done[0] += 1
                except BaseException as exc:  # every failure is a test failure
                    failures.append(exc)

        def write() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:  # a write that waits long enough to be checked, not safe to repeat
                    pool.command(f"INSERT INTO lb_stall_writes SELECT {n} + sleep(0.3)")
                    done[1] += 1
                except BaseException as exc:
                    failures.append(exc)

        with busy_process(gil_hold=0.8, hogs=2) as holds, ThreadPoolExecutor(4) as executor:
            futures = [executor.submit(read) for _ in range(3)] + [executor.submit(write)]
            time.sleep(SECONDS)
            stop.set()
            for future in futures:
                future.result()
    assert max(holds, default=0.0) > 0.4, "the GIL holder did not hold the GIL"
    assert failures == []
    assert errors.events == []
    assert done[0] > 0
    assert done[1] > 0


async def test_a_busy_process_gets_no_error_counted_against_healthy_replicas_async(cluster: ClusterBase) -> None:
    errors = Errors()
    failures: list[BaseException] = []
    async with clickhouse_lb.get_async_pool(cluster.hosts, listeners=[errors]) as pool:
        for _ in range(6):
            await pool.command(WHO)
        stop = asyncio.Event()
        done = [0, 0]

        async def read() -> None:
            while not stop.is_set():
                try:
                    await pool.command(SLOW_READ)
                    done[0] += 1
                except BaseException as exc:
                    failures.append(exc)

        async def write() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    await pool.command(f"INSERT INTO lb_stall_writes SELECT {n} + sleep(0.3)")
                    done[1] += 1
                except BaseException as exc:
                    failures.append(exc)

        # Held back to back, aiohttp's connect timeout (a timer on the loop) can fire in a stall
        # (seen in CI as 'OperationalError: CancelledError', kind connect): the loop's heartbeat
        # shows the stall and the run is tried again on its replica (pools/_liveness.py).
        with busy_process(gil_hold=0.8, hogs=2) as holds:
            tasks = [asyncio.ensure_future(read()) for _ in range(3)] + [asyncio.ensure_future(write())]
            await asyncio.sleep(SECONDS)
            stop.set()
            await asyncio.gather(*tasks)
    assert max(holds, default=0.0) > 0.4, "the GIL holder did not hold the GIL"
    assert failures == []
    assert errors.events == []
    assert done[0] > 0
    assert done[1] > 0




def test_a_healthy_clusters_writes_never_fail_in_a_busy_process(cluster: ClusterBase) -> None:
    """Writes that cannot fail over (no token, not idempotent) from 3 threads, each waiting long
    enough for liveness checks: none is given up as hung, none counts an error, each
    acknowledged one is in the table once."""
    errors = Errors()
    failures: list[BaseException] = []
    written: list[int] = []
    with clickhouse_lb.get_pool(cluster.hosts, listeners=[errors]) as pool:
        for _ in range(6):
            pool.command(WHO)
        stop = threading.Event()

        def write(first: int) -> None:
            n = first
            while not stop.is_set():
                n += 1
                try:
                    pool.command(f"INSERT INTO lb_stall_writes SELECT {n} + sleep(0.2)")
                    written.append(n)
                except BaseException as exc:
                    failures.append(exc)

        with busy_process(gil_hold=0.8, hogs=2) as holds, ThreadPoolExecutor(3) as executor:
            futures = [executor.submit(write, k * 1_000_000) for k in range(3)]
            time.sleep(SECONDS)
            stop.set()
            for future in futures:
                future.result()
    assert max(holds, default=0.0) > 0.4, "the GIL holder did not hold the GIL"
    assert failures == []
    assert errors.events == []
    assert written
    # The table is a plain MergeTree on each replica: each write landed where it was acknowledged.
    rows = sorted(int(n) for text in cluster.on_all("SELECT id FROM lb_stall_writes") for n in text.split())
    assert rows == sorted(written)


def test_a_paused_replica_is_still_routed_around_in_a_busy_process(cluster: ClusterBase) -> None:
    failures: list[BaseException] = []
    with clickhouse_lb.get_pool(cluster.hosts) as pool:
        for _ in range(30):
            pool.command(WHO)
        stop = threading.Event()
        running = threading.Barrier(5)
        worst = [0.0] * 4

        def reader(n: int) -> None:
            pool.command(WHO)
            running.wait()
            last = time.monotonic()
            while not stop.is_set():
                try:
                    pool.command(WHO)
                except BaseException as exc:
                    failures.append(exc)
                now = time.monotonic()
                worst[n] = max(worst[n], now - last)
                last = now

        with busy_process(gil_hold=0.8, hogs=2, pause=GAP_PAUSE) as holds, ThreadPoolExecutor(4) as executor:
            futures = [executor.submit(reader, n) for n in range(4)]
            running.wait()
            # A statement on a healthy replica can straddle two holds (two GIL hand-backs), and a
            # loaded machine stretches a hold sized for 0.8 s to seconds (measured 4.2 s at load
            # 30, and from 0.8 to 2.1 s within one run at load 5): the pause lasts until it is
            # long against every hold seen so far, so that a reader stuck on the paused replica
            # (it waits the whole pause) and one routed around stay apart.
            holds.first.wait()
            cluster.pause(0)
            paused = time.monotonic()
            while (pause := time.monotonic() - paused) < max(9.0, 4.5 * (2 * max(holds) + GAP_PAUSE)):
                stop.wait(0.05)  # (a duration, re-sized as holds end: nothing to synchronise with)
            cluster.resume(0)
            stop.set()
            for future in futures:
                future.result()
    assert failures == []
    # Measured gaps: 1.5-2.2 s at load 10-20 with 0.8 s holds (BENCHMARKS.md); a third of the
    # pause separates them from a reader that waited on the paused replica.
    assert max(worst) < pause / 3, f"worst per-thread gap {max(worst):.2f}s, holds up to {max(holds):.2f}s"
