"""clickhouse_lb.core._driver_logs: which clickhouse-connect records a pool attempt keeps quiet.

The end-to-end view (stderr of a program doing one failover) is integration/test_quiet_logging.py;
here the filter's rules, one at a time, through the driver's real logger names.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import clickhouse_lb  # noqa: F401  (importing the library installs the filter)
from clickhouse_lb.core._driver_logs import DRIVER_LOGGERS, handled_by_pool, in_pool_attempt

from .fakes import FakeCluster, make_pool, refused

SYNC_DRIVER = "clickhouse_connect.driver._backend.http_sync"


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.getMessage()}")


@pytest.fixture
def root_handler() -> Iterator[Collect]:
    """An application that configured only the root logger (basicConfig-like)."""
    handler = Collect()
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    names = ("clickhouse_connect", "clickhouse_connect.driver", "clickhouse_connect.driver._backend", *DRIVER_LOGGERS)
    saved_levels = {name: logging.getLogger(name).level for name in names}
    yield handler
    root.removeHandler(handler)
    root.setLevel(saved)
    for name, level in saved_levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("name", DRIVER_LOGGERS)
def test_a_transport_warning_inside_a_pool_attempt_is_dropped(root_handler: Collect, name: str) -> None:
    with handled_by_pool():
        logging.getLogger(name).warning("Unexpected Http Driver Exception")
    assert root_handler.messages == []


def test_outside_a_pool_attempt_the_driver_logs_as_always(root_handler: Collect) -> None:
    logging.getLogger(SYNC_DRIVER).warning("Unexpected Http Driver Exception")
    assert root_handler.messages == ["WARNING Unexpected Http Driver Exception"]


def test_errors_are_never_dropped(root_handler: Collect) -> None:
    with handled_by_pool():
        logging.getLogger(SYNC_DRIVER).error("something else went wrong")
    assert root_handler.messages == ["ERROR something else went wrong"]


@pytest.mark.parametrize("configured", ["clickhouse_connect", "clickhouse_connect.driver", SYNC_DRIVER])
def test_an_application_that_configured_the_driver_logger_sees_every_record(
    root_handler: Collect, configured: str
) -> None:
    logging.getLogger(configured).setLevel(logging.WARNING)
    with handled_by_pool():
        logging.getLogger(SYNC_DRIVER).warning("Unexpected Http Driver Exception")
    assert root_handler.messages == ["WARNING Unexpected Http Driver Exception"]


def test_the_mark_belongs_to_the_task_that_runs_the_attempt(root_handler: Collect) -> None:
    """A concurrent task (or thread) using a plain client is not silenced by a pool's attempt."""

    async def pool_attempt(started: asyncio.Event, done: asyncio.Event) -> None:
        with handled_by_pool():
            started.set()
            await done.wait()
            logging.getLogger(SYNC_DRIVER).warning("inside the pool")

    async def plain_client(started: asyncio.Event, done: asyncio.Event) -> None:
        await started.wait()
        logging.getLogger(SYNC_DRIVER).warning("plain client")
        done.set()

    async def main() -> None:
        started, done = asyncio.Event(), asyncio.Event()
        await asyncio.gather(pool_attempt(started, done), plain_client(started, done))

    asyncio.run(main())
    assert root_handler.messages == ["WARNING plain client"]


# A sync statement sets no mark: its frame on the logging thread's stack is the mark.

def _logs_then_refuses(message: str) -> Callable[[], BaseException]:
    def outcome() -> BaseException:
        logging.getLogger(SYNC_DRIVER).warning(message)
        return refused()
    return outcome


def test_a_sync_statements_failed_attempt_logs_nothing_of_the_drivers(root_handler: Collect) -> None:
    cluster = FakeCluster("a", "b")
    cluster.replicas["a"].outcomes = [_logs_then_refuses("Unexpected Http Driver Exception"), "ok"]
    pool = make_pool(cluster, load_balancing="in_order")
    try:
        assert pool.query("SELECT 1") == "query@b"
    finally:
        pool.close()
    assert not [m for m in root_handler.messages if "Unexpected Http Driver Exception" in m]
    assert any("a" in m and "b" in m for m in root_handler.messages)  # the pool's own WARNING says it


def test_a_sync_statement_does_not_silence_another_thread(root_handler: Collect) -> None:
    """While a statement's attempt runs on one thread, a plain client's warning on another
    thread is shown: the stack looked at is the logging thread's own."""
    entered, logged = threading.Event(), threading.Event()

    def waits_then_refuses() -> BaseException:
        entered.set()
        logged.wait(timeout=30)
        logging.getLogger(SYNC_DRIVER).warning("inside the attempt")
        return refused()

    cluster = FakeCluster("a", "b")
    cluster.replicas["a"].outcomes = [waits_then_refuses, "ok"]
    pool = make_pool(cluster, load_balancing="in_order", liveness_check_after_ms=0)
    answered: list[Any] = []
    statement = threading.Thread(target=lambda: answered.append(pool.query("SELECT 1")))
    statement.start()
    try:
        assert entered.wait(timeout=30)  # the attempt is in the client, on the other thread
        logging.getLogger(SYNC_DRIVER).warning("plain client")
    finally:
        logged.set()
        statement.join(timeout=30)
        pool.close()
    assert answered == ["query@b"]
    assert "WARNING plain client" in root_handler.messages
    assert not [m for m in root_handler.messages if "inside the attempt" in m]


def test_outside_a_statement_the_pool_on_the_stack_does_not_count(root_handler: Collect) -> None:
    """Only a frame of a registered runner counts: a listener called after the statement, or any
    code of the pool's, is not an attempt."""
    assert not in_pool_attempt()
    with handled_by_pool():
        assert in_pool_attempt()
    assert not in_pool_attempt()
