"""Nothing the pool abandons raises later, from a destructor or the garbage collector
(clickhouse_lb.pools._leftovers): attempts abandoned on a hung replica, cut by a deadline, hedges
that lost, and query results dropped unread inside a reference cycle (as a failed test's traceback
keeps them). Each scenario records ``sys.unraisablehook`` calls through a full collection."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
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
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", failover_timeout=1.0) as pool:
        for _ in range(3):
            pool.command("SELECT 1")
        for _ in range(3):
            drop_in_a_cycle(pool.query("SELECT number FROM numbers(1000)"))
            try:
                pool.query(SLOW)  # cut by the deadline mid-answer
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
    async with clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="in_order", failover_timeout=1.5) as pool:
        for _ in range(3):
            # (the first client's creation may take the whole deadline on a loaded machine)
            with contextlib.suppress(clickhouse_lb.AllReplicasUnavailableError):
                await pool.command("SELECT 1")
        for _ in range(3):
            drop_in_a_cycle(await pool.query("SELECT number FROM numbers(1000)"))
            try:
                await pool.query(SLOW)
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
