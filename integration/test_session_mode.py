"""A pool given ``session_id=`` against the real engine (3 local replicas): every statement runs in
that one ClickHouse session (a temporary table and a SET are seen by the next statements), on one
replica; killing it raises SessionLostError and the next statement works on another replica.
Also: generic introspection of a connected pool does no I/O (its replicas killed, nothing fails)."""

from __future__ import annotations

import asyncio
import inspect
import uuid

import pytest

import clickhouse_lb
from clickhouse_lb.errors import SessionLostError
from clickhouse_lb.testing import ClusterBase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

WHO = "SELECT getMacro('replica')"


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


def test_session_id_keeps_temporary_tables_and_set_and_moves_only_on_session_lost(cluster: ClusterBase) -> None:
    session = f"s-{uuid.uuid4()}"
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="random", session_id=session,
                                send_receive_timeout=10) as pool:
        assert pool.get_client_setting("session_id") == session
        pool.command("CREATE TEMPORARY TABLE tmp_session (n UInt32)")
        pool.command("INSERT INTO tmp_session VALUES (1), (2)")
        pool.command("SET max_threads = 3")
        # Random balancing would spread these; the session keeps them on one replica.
        replicas = {pool.command(WHO) for _ in range(10)}
        assert len(replicas) == 1
        assert pool.command("SELECT count() FROM tmp_session") == 2
        assert pool.command("SELECT getSetting('max_threads')") == 3
        pinned = int(next(iter(replicas))[1:]) - 1

        cluster.kill(pinned)
        with pytest.raises(SessionLostError):
            pool.command("SELECT count() FROM tmp_session")
        moved = pool.command(WHO)  # pinned anew: the strategy's pick among the live replicas
        assert moved != f"r{pinned + 1}"
        assert {pool.command(WHO) for _ in range(5)} == {moved}
        pool.command("CREATE TEMPORARY TABLE tmp_session (n UInt32)")  # a new session: the old one's table is gone
        assert pool.command("SELECT count() FROM tmp_session") == 0


def test_async_session_id_keeps_a_temporary_table_on_one_replica(cluster: ClusterBase) -> None:
    async def main() -> None:
        session = f"a-{uuid.uuid4()}"
        pool = await clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="random", session_id=session)
        try:
            await pool.command("CREATE TEMPORARY TABLE tmp_async (n UInt32)")
            await pool.command("INSERT INTO tmp_async VALUES (7)")
            assert len({await pool.command(WHO) for _ in range(8)}) == 1
            assert await pool.command("SELECT sum(n) FROM tmp_async") == 7
        finally:
            await pool.close()

    asyncio.run(main())


def test_introspecting_a_connected_pool_sends_nothing(cluster: ClusterBase) -> None:
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", health_check_interval_ms=0) as pool:
        url = pool.url
        for i in range(len(cluster.hosts)):
            cluster.kill(i)  # any request a member read made would now fail and be counted
        members = dict(inspect.getmembers(pool))
        assert members["url"] == url == f"http://{cluster.hosts[0]}"
        assert hasattr(pool, "server_version")
        assert getattr(pool, "uri", None) == url
        assert [r.errors_count for r in pool.replicas] == [0] * len(cluster.hosts)
