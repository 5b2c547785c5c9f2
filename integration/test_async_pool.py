"""AsyncReplicaPool against a real cluster (local replicas by default): routing per strategy,
zero failed statements while a replica is killed or paused under 50 concurrent tasks, error
counts that rise and decay, sessions that stay put, cancellation that counts nothing."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb import AsyncReplicaPool, ErrorRecordedEvent, SessionLostError
from clickhouse_lb.testing import ClusterBase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WHO = "SELECT getMacro('replica')"
TASKS = 50
#: Read timeout of the pools that meet a paused replica: how long an attempt waits on it (long
#: enough that "did not wait for it" can be told from "waited once" by 3x on a busy machine: 50
#: cold tasks took 2.01 s there, a GIL held 0.8 s at a time in the test process, load 6-8).
PAUSE_TIMEOUT = 12.0


def make_pool(cluster: ClusterBase, **options: Any) -> AsyncReplicaPool:
    options.setdefault("send_receive_timeout", 10)
    return clickhouse_lb.get_async_pool(cluster.hosts, username="default", password=cluster.password, **options)


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    """The session's cluster, healed before and after each test."""
    return healthy_clickhouse_cluster


async def who(pool: AsyncReplicaPool | Any, **kwargs: Any) -> str:
    """The name of the replica that answered one statement."""
    return str(await pool.command(WHO, **kwargs))


async def many(pool: AsyncReplicaPool, n: int = TASKS) -> Counter[str]:
    """Run ``n`` statements as concurrent tasks; count who answered (any failure fails the test)."""
    return Counter(await asyncio.gather(*(who(pool) for _ in range(n))))


async def eventually(condition: Callable[[], bool], timeout: float) -> None:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


class RecordedErrors:
    """A listener keeping every error counted (a health probe's too, kind "probe")."""

    def __init__(self) -> None:
        self.events: list[ErrorRecordedEvent] = []

    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        self.events.append(event)

    def statement_errors(self) -> list[str]:
        """The statements' errors (not the probes'), as "address kind", in order."""
        return [f"{e.address} {e.kind}" for e in self.events if e.kind != "probe"]


def errors(pool: AsyncReplicaPool) -> list[int]:
    return [s.errors_count for s in pool.replicas]


# -- routing ---------------------------------------------------------------------------------


async def test_strategies_route_as_specified(cluster: ClusterBase) -> None:
    names = cluster.names
    async with make_pool(cluster, load_balancing="in_order") as pool:
        assert await many(pool, 20) == {names[0]: 20}
        # A statement may choose its own strategy, as on the server.
        offset = {"load_balancing": "first_or_random", "load_balancing_first_offset": 1}
        assert await who(pool, settings=offset) == names[1]
    async with make_pool(cluster, load_balancing="round_robin") as pool:
        assert await many(pool, 30) == dict.fromkeys(names, 10)
    async with make_pool(cluster, load_balancing="random") as pool:
        assert set(await many(pool, 60)) == set(names)
    last_host = cluster.hosts[-1].rpartition(":")[0]
    async with make_pool(cluster, load_balancing="nearest_hostname", local_hostname=last_host) as pool:
        assert pool.plan()[0] == cluster.hosts[-1]
        assert await many(pool, 10) == {names[-1]: 10}


async def test_the_pool_mirrors_asyncclient(cluster: ClusterBase) -> None:
    table = "aio_mirror"
    cluster.on_all(f"DROP TABLE IF EXISTS {table}")
    cluster.on_all(f"CREATE TABLE {table} (x UInt32, s String) ENGINE = MergeTree ORDER BY x")
    async with make_pool(cluster, load_balancing="in_order") as pool:
        assert await pool.ping() is True
        summary = await pool.insert(table, [[1, "a"], [2, "b"], [3, "c"]], column_names=["x", "s"])
        assert summary.written_rows == 3
        assert (await pool.query(f"SELECT sum(x) FROM {table}")).result_rows == [(6,)]
        assert await pool.raw_query(f"SELECT s FROM {table} ORDER BY x", fmt="TabSeparated") == b"a\nb\nc\n"
        frame = await pool.query_df(f"SELECT x FROM {table} ORDER BY x")
        assert list(frame["x"]) == [1, 2, 3]
        arrow = await pool.query_arrow(f"SELECT x FROM {table} ORDER BY x")
        assert arrow.column("x").to_pylist() == [1, 2, 3]
        stream = await pool.query_rows_stream("SELECT number FROM system.numbers LIMIT 5")
        async with stream:
            assert [row[0] async for row in stream] == [0, 1, 2, 3, 4]
    cluster.on_all(f"DROP TABLE IF EXISTS {table}")


# -- faults under load -----------------------------------------------------------------------


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
async def test_a_killed_replica_costs_no_failed_statement(cluster: ClusterBase, warm: bool) -> None:
    async with make_pool(cluster, load_balancing="round_robin") as pool:
        if warm:  # every replica's client exists, with keep-alive connections
            assert len(await many(pool, 30)) == 3
        cluster.kill(0)
        answered = await many(pool)
        assert sum(answered.values()) == TASKS
        assert cluster.names[0] not in answered
        status = pool.replicas
        assert status[0].errors_count >= 1
        assert not status[0].is_up
        assert [s.errors_count for s in status[1:]] == [0, 0]


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
async def test_a_paused_replica_costs_no_failed_statement(cluster: ClusterBase, warm: bool) -> None:
    recorded = RecordedErrors()
    async with make_pool(cluster, load_balancing="random", send_receive_timeout=PAUSE_TIMEOUT,
                         listeners=[recorded]) as pool:
        if warm:
            assert len(await many(pool, 30)) == 3
        cluster.pause(1)
        started = time.monotonic()
        answered = await many(pool)
        elapsed = time.monotonic() - started
        assert sum(answered.values()) == TASKS
        assert cluster.names[1] not in answered
        assert errors(pool)[1] >= 1
        assert [errors(pool)[0], errors(pool)[2]] == [0, 0]
        # Every statement waited on the paused replica at most once (about one read timeout),
        # even when 50 tasks needed its client at the same moment.
        assert elapsed < 3 * PAUSE_TIMEOUT
        # Later statements route around it without waiting at all: none is sent there (one that
        # was would be given up as hung, an error counted: its answer would still come from
        # another replica), and the batch takes well under one read timeout.
        before = len(recorded.statement_errors())
        started = time.monotonic()
        assert cluster.names[1] not in await many(pool)
        assert time.monotonic() - started < PAUSE_TIMEOUT / 3
        assert recorded.statement_errors()[before:] == []


async def test_a_replica_paused_before_its_client_exists_is_given_up_on_its_liveness_check(
    cluster: ClusterBase,
) -> None:
    # The client of a replica is made by the first attempt that needs it, and that creation is
    # what waits on a hung replica. The liveness check asked the (missing) client, took "no
    # client" for alive, and the attempt waited out the whole read timeout; the sync pool pings on
    # a connection of its own and gave up on it in under a second.
    async with make_pool(cluster, load_balancing="in_order", send_receive_timeout=PAUSE_TIMEOUT,
                         connect_on_create=False, health_check_interval_ms=0) as pool:
        cluster.pause(0)
        started = time.monotonic()
        assert await who(pool) == cluster.names[1]
        assert time.monotonic() - started < PAUSE_TIMEOUT / 3
        assert errors(pool)[0] == 1


async def test_statements_queued_beyond_the_connection_limit_do_not_make_a_busy_replica_hung(
    cluster: ClusterBase,
) -> None:
    # 40 statements at once on one replica, its client allowing 20 connections to it (aiohttp's
    # connector_limit_per_host, clickhouse-connect's default): 20 wait for a connection. The
    # liveness pings went through that same client and queued behind the running statements: no
    # answer within the ping timeout, the busy replica was called hung and its reads sent again.
    async with make_pool(cluster, load_balancing="in_order", health_check_interval_ms=0) as pool:
        await who(pool)
        answered = await asyncio.gather(*(pool.command("SELECT getMacro('replica'), sleep(0.5)") for _ in range(40)))
        assert {row[0] for row in answered} == {cluster.names[0]}
        assert errors(pool) == [0, 0, 0]


async def test_error_counts_rise_and_decay(cluster: ClusterBase) -> None:
    async with make_pool(
        cluster,
        load_balancing="in_order",
        # 3 s, not 1: the four statements below must end well within one half-life (a busy
        # machine took over 1 s for them, and the count had already halved).
        distributed_replica_error_half_life=3,
        distributed_replica_max_ignored_errors=10,  # keep r1 first while it fails
        health_check_delay_interval_ms=0,  # the injected failures are for statements, not delay reads
    ) as pool:
        cluster.fail_next(0, n=3, code=210)  # NETWORK_ERROR: a replica failure
        assert [await who(pool) for _ in range(4)] == [cluster.names[1]] * 3 + [cluster.names[0]]
        status = pool.replicas[0]
        assert status.errors_count == 3
        assert "210" in (status.last_error or "")
        assert 0 < status.estimated_recovery_time <= 6
        # Halved every 3 s: 3 -> 1 -> 0.
        await eventually(lambda: errors(pool)[0] == 1, timeout=9)
        await eventually(lambda: errors(pool)[0] == 0, timeout=9)
        assert pool.replicas[0].estimated_recovery_time == 0
        assert errors(pool) == [0, 0, 0]


async def test_a_query_failure_is_raised_and_counts_nothing(cluster: ClusterBase) -> None:
    from clickhouse_connect.driver.exceptions import DatabaseError

    async with make_pool(cluster, load_balancing="in_order") as pool:
        with pytest.raises(DatabaseError, match=r"UNKNOWN_TABLE|Code: 60"):
            await pool.query("SELECT * FROM no_such_table_anywhere")
        assert errors(pool) == [0, 0, 0]


# -- sessions --------------------------------------------------------------------------------


async def test_sessions_stay_put(cluster: ClusterBase) -> None:
    async with make_pool(cluster, load_balancing="round_robin") as pool:
        async with pool.session() as session:
            home = await who(session)
            await session.command("CREATE TEMPORARY TABLE tmp (x UInt8)")
            await session.command("INSERT INTO tmp VALUES (1), (2)")

            async def session_statements() -> list[Any]:
                # One ClickHouse session runs one statement at a time: these go in sequence.
                return [(await session.query("SELECT count() FROM tmp")).result_rows for _ in range(10)]

            # Other tasks keep being balanced meanwhile; the session's statements do not move.
            counts, spread = await asyncio.gather(session_statements(), many(pool, 30))
            assert counts == [[(2,)]] * 10
            assert await who(session) == home
            assert spread == dict.fromkeys(cluster.names, 10)
            cluster.kill(cluster.names.index(home))
            with pytest.raises(SessionLostError, match=f"Session lost.*{session.address}"):
                await session.query("SELECT count() FROM tmp")
        assert errors(pool)[cluster.names.index(home)] >= 1


# -- cancellation ----------------------------------------------------------------------------


async def test_cancellation_leaves_the_counts_untouched(cluster: ClusterBase) -> None:
    async with make_pool(cluster, load_balancing="in_order") as pool:
        assert await who(pool) == cluster.names[0]
        cluster.set_delay(0, 5)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(who(pool), 0.5)
        task = asyncio.create_task(many(pool, 10))
        done, _ = await asyncio.wait({task}, timeout=0.5)
        assert not done  # held by the delay
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert errors(pool) == [0, 0, 0]
        assert all(s.is_up for s in pool.replicas)
        assert [s.in_flight for s in pool.replicas] == [0, 0, 0]  # cancelled attempts left the load
        # No attempt left running (the pool's health-probe task is not an attempt).
        left = {t for t in asyncio.all_tasks() if not t.get_name().startswith("clickhouse-lb-")}
        assert left == {asyncio.current_task()}
        cluster.set_delay(0, 0)
        assert await who(pool) == cluster.names[0]  # still first: nothing was held against it
