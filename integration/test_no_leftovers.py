"""Nothing the pool abandons raises later, from a destructor or the garbage collector
(clickhouse_lb.pools._leftovers): attempts abandoned on a hung replica, cut by a deadline, hedges
that lost, and query results dropped unread inside a reference cycle (as a failed test's traceback
keeps them). Each scenario records ``sys.unraisablehook`` calls through a full collection; the
last one runs clickhouse-connect's suite's own pattern under pytest, in a pytest of its own."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb.testing import ClusterBase

#: Streams its 30 blocks over about 3 s: a deadline cuts it mid-answer.
SLOW = "SELECT randomString(100000), sleepEachRow(0.1) FROM numbers(30) SETTINGS max_block_size=1"


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


@pytest.fixture
def unraisable() -> Iterator[list[str]]:
    seen: list[str] = []
    previous = sys.unraisablehook

    def record(info: Any) -> None:
        seen.append(f"{info.exc_type.__name__}: {info.exc_value} in {info.object!r}")

    gc.collect()
    sys.unraisablehook = record
    try:
        yield seen
    finally:
        sys.unraisablehook = previous


def drop_in_a_cycle(value: object) -> None:
    holder: dict[str, object] = {"value": value}
    holder["self"] = holder  # only the garbage collector frees it now


def test_abandoned_and_dropped_responses_raise_nothing_later(cluster: ClusterBase, unraisable: list[str]) -> None:
    # Only SLOW goes through the pool with a deadline: a statement that should succeed has none
    # (in a busy process a GIL hold of 0.8 s and a loaded replica took a plain query past 1 s).
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", failover_timeout=1.0) as cutting, \
            clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order") as pool:
        for _ in range(3):
            pool.command("SELECT 1")
            with contextlib.suppress(clickhouse_lb.AllReplicasUnavailableError):  # (as below)
                cutting.command("SELECT 1")
        for _ in range(3):
            drop_in_a_cycle(pool.query("SELECT number FROM numbers(1000)"))
            try:
                cutting.query(SLOW)  # cut by the deadline mid-answer
            except clickhouse_lb.AllReplicasUnavailableError as exc:
                drop_in_a_cycle(exc)
        cluster.pause(0)
        try:
            for _ in range(3):
                drop_in_a_cycle(pool.query("SELECT 1"))  # abandoned as hung on replica 0
        finally:
            cluster.resume(0)
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", use_hedged_requests=1,
                                receive_data_timeout_ms=50) as pool:
        pool.command("SELECT 1", settings={"use_hedged_requests": 0})
        cluster.set_delay(0, 0.5)
        try:
            for _ in range(3):
                drop_in_a_cycle(pool.query("SELECT 1"))  # the hedge wins, replica 0's run is abandoned
        finally:
            cluster.set_delay(0, 0)
    gc.collect()
    assert unraisable == []


async def test_abandoned_and_dropped_responses_raise_nothing_later_async(
    cluster: ClusterBase, unraisable: list[str]
) -> None:
    # As in the sync test, only SLOW has a deadline.
    async with clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="in_order",
                                            failover_timeout=1.5) as cutting, \
            clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="in_order") as pool:
        for _ in range(3):
            await pool.command("SELECT 1")
            # (the first client's creation may take the whole deadline on a loaded machine)
            with contextlib.suppress(clickhouse_lb.AllReplicasUnavailableError):
                await cutting.command("SELECT 1")
        for _ in range(3):
            drop_in_a_cycle(await pool.query("SELECT number FROM numbers(1000)"))
            try:
                await cutting.query(SLOW)
            except clickhouse_lb.AllReplicasUnavailableError as exc:
                drop_in_a_cycle(exc)
        cluster.pause(0)
        try:
            for _ in range(3):
                drop_in_a_cycle(await pool.query("SELECT 1"))
        finally:
            cluster.resume(0)
    gc.collect()
    assert unraisable == []


#: clickhouse-connect's ``test_sync_retry_on_connection_reset[2]`` through a pool, as it failed
#: there (the pool's failover made more requests than the test counts), and a test that fails
#: before reading its result: pytest keeps each failed test's traceback, whose frame holds the
#: unread result, in reference cycles, and the garbage collector later frees them in an
#: arbitrary order. Then a test that collects.
SUITE_PATTERN = textwrap.dedent("""
    import gc
    import os

    import pytest
    import urllib3

    import clickhouse_lb

    HOSTS = os.environ["LEFTOVER_HOSTS"].split(",")


    @pytest.fixture(scope="module")
    def pool():
        with clickhouse_lb.get_pool(HOSTS, load_balancing="in_order", share_state=False) as pool:
            yield pool


    def test_retry_on_connection_reset_counts_requests(pool, monkeypatch):
        real_request = pool.http.request
        attempts = 0

        def flaky_request(method, url, **kwargs):
            nonlocal attempts
            attempts += 1
            if attempts <= 2:
                try:
                    raise ConnectionResetError("Connection reset by peer")
                except ConnectionResetError:
                    raise urllib3.exceptions.ProtocolError("Connection aborted.")
            return real_request(method, url, **kwargs)

        monkeypatch.setattr(pool.http, "request", flaky_request)
        result = pool.query("SELECT 13")
        assert attempts == -1  # fails, with the result unread
        assert result.result_rows[0][0] == 13


    @pytest.mark.parametrize("n", range(5))
    def test_fails_before_reading_its_result(pool, n):
        result = pool.query("SELECT number, toString(number) FROM numbers(1000)")
        assert result is None


    def test_collect():
        gc.collect()
""")


def test_a_failed_tests_unread_results_raise_nothing_when_collected(cluster: ClusterBase, tmp_path: Path) -> None:
    """The crash of clickhouse-connect's suite through pools (pytest INTERNALERROR, "AST constructor
    recursion depth mismatch", after "Exception ignored in: ResponseBuffer.__dealloc__"): its
    first cause was these results, whose responses the garbage collector took apart."""
    (tmp_path / "test_suite_pattern.py").write_text(SUITE_PATTERN)
    root = Path(clickhouse_lb.__file__).resolve().parent.parent
    env = {**os.environ, "LEFTOVER_HOSTS": ",".join(cluster.hosts),
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=",
         "-o", "asyncio_default_fixture_loop_scope=function",
         "-W", "error::pytest.PytestUnraisableExceptionWarning", "test_suite_pattern.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    output = run.stdout + run.stderr
    assert "Exception ignored" not in output, output[-4000:]
    assert "INTERNALERROR" not in output, output[-4000:]
    # The scenario ran as meant: the 6 tests fail on their assertions, the collection passes.
    assert "6 failed, 1 passed" in output, output[-4000:]


class _Records(logging.Handler):
    """The ``clickhouse_lb`` records of listener failures, and an event per thread kind seen."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        self.from_background = threading.Event()
        self.from_caller = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "listener" not in record.getMessage():
            return
        self.records.append(record)
        (self.from_background if record.threadName.startswith("clickhouse-lb-") else self.from_caller).set()


class _Raising:
    def on_probe(self, event: object) -> None:
        raise ZeroDivisionError("a listener's bug, on the probe thread")

    def on_error_recorded(self, event: object) -> None:
        raise ZeroDivisionError("a listener's bug, on the application's thread")


def test_the_pools_threads_log_an_errors_type_and_message_never_its_traceback(cluster: ClusterBase) -> None:
    """clickhouse_lb.core._background_logs: a traceback formatted on a probe thread can
    interleave with an AST the application builds (CPython 3.11 before 3.11.8); the caller's
    thread keeps its traceback."""
    records = _Records()
    logger = logging.getLogger("clickhouse_lb")
    logger.addHandler(records)
    try:
        with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", share_state=False,
                                    health_check_interval_ms=200, listeners=[_Raising()]) as pool:
            assert records.from_background.wait(30), "no probe ran"
            pool.record_error(pool.addresses[0])  # its listener runs on this thread
            assert records.from_caller.is_set(), "the error's listener was not called"
    finally:
        logger.removeHandler(records)
    background = [r for r in records.records if r.threadName.startswith("clickhouse-lb-")]
    caller = [r for r in records.records if not r.threadName.startswith("clickhouse-lb-")]
    assert [r.getMessage() for r in background if r.exc_info is not None] == []
    assert "ZeroDivisionError: a listener's bug, on the probe thread" in background[0].getMessage()
    assert caller[0].exc_info is not None, caller[0].getMessage()
    assert caller[0].exc_info[0] is ZeroDivisionError
