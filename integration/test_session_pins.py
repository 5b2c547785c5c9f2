"""Statements that name a session in their settings (``settings={"session_id": ...}``), as
clickhouse-connect's own ``test_temporary_tables`` does, against the real engine (3 local
replicas): they stay on the replica the session's first statement landed on, even when the
strategy now prefers another, so the session's temporary table is seen; a killed session
replica raises SessionLostError, and the next statement with the id starts the session afresh."""

from __future__ import annotations

import asyncio
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


def test_a_temporary_table_is_seen_by_its_session_while_in_order_prefers_another_replica(cluster: ClusterBase) -> None:
    session = {"session_id": f"t-{uuid.uuid4()}"}
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", health_check_interval_ms=0) as pool:
        pool.command("CREATE TEMPORARY TABLE tmp_pins (field1 String, field2 String)", settings=session)
        home = pool.command(WHO, settings=session)
        assert home == "r1"  # in_order, every replica healthy
        # What a probe that failed once does: the first replica is no longer in_order's first pick.
        pool.balancer.record_error(0, "a health probe failed once")
        pool.balancer.record_error(0, "and again")
        assert pool.command(WHO) == "r2"  # statements without the session go elsewhere
        pool.command("INSERT INTO tmp_pins (field1, field2) VALUES ('test1', 'test2'), ('test3', 'test4')",
                     settings=session)
        rows = pool.query("SELECT * FROM tmp_pins", settings=session).result_rows
        pool.insert("tmp_pins", rows, settings=session)  # its column lookup runs in the session too
        assert pool.command("SELECT count() FROM tmp_pins", settings=session) == 4
        assert pool.command(WHO, settings=session) == home
        pool.command("DROP TABLE IF EXISTS tmp_pins", settings=session)


def test_a_killed_session_replica_raises_session_lost_and_the_session_starts_afresh(cluster: ClusterBase) -> None:
    session = {"session_id": f"k-{uuid.uuid4()}"}
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="random", send_receive_timeout=10) as pool:
        pool.command("CREATE TEMPORARY TABLE tmp_lost (n UInt32)", settings=session)
        pool.command("INSERT INTO tmp_lost VALUES (1), (2)", settings=session)
        home = pool.command(WHO, settings=session)
        assert {pool.command(WHO, settings=session) for _ in range(8)} == {home}  # random would spread 8
        cluster.kill(int(home[1:]) - 1)
        with pytest.raises(SessionLostError) as lost:
            pool.command("SELECT count() FROM tmp_lost", settings=session)
        assert lost.value.session_id == session["session_id"]
        assert lost.value.address == cluster.hosts[int(home[1:]) - 1]
        # Pinned anew where the next statement answers: the old session's table is gone with it.
        pool.command("CREATE TEMPORARY TABLE tmp_lost (n UInt32)", settings=session)
        moved = pool.command(WHO, settings=session)
        assert moved != home
        assert pool.command("SELECT count() FROM tmp_lost", settings=session) == 0


def test_async_pool_keeps_a_session_on_its_replica_and_reports_it_lost(cluster: ClusterBase) -> None:
    async def main() -> None:
        session = {"session_id": f"a-{uuid.uuid4()}"}
        pool = await clickhouse_lb.get_async_pool(cluster.hosts, load_balancing="in_order",
                                                  health_check_interval_ms=0)
        try:
            await pool.command("CREATE TEMPORARY TABLE tmp_apins (n UInt32)", settings=session)
            pool.balancer.record_error(0, "a health probe failed once")
            assert await pool.command(WHO) == "r2"
            await pool.command("INSERT INTO tmp_apins VALUES (7)", settings=session)
            assert await pool.command("SELECT sum(n) FROM tmp_apins", settings=session) == 7
            cluster.kill(0)
            with pytest.raises(SessionLostError):
                await pool.command("SELECT sum(n) FROM tmp_apins", settings=session)
        finally:
            await pool.close()

    asyncio.run(main())
