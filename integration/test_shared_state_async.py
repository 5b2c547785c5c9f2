"""Engine-per-query applications on the test cluster, asyncio side: the balancing state outlives
each ``clickhousedb+lb_async`` engine and each ``get_async_pool`` pool (see test_shared_state.py).

Needs the async dialect (SQLAlchemy 2, clickhouse-connect >= 1.10): not run in .ci/compat.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import pytest
from shared_state_scenarios import HALF_LIFE, Served, check_in_order, check_round_robin, in_order_after_kill_async
from sqlalchemy import text
from sqlalchemy.dialects import registry
from sqlalchemy.ext.asyncio import create_async_engine

import clickhouse_lb
from clickhouse_lb.sqlalchemy.aio import get_async_replica_pool
from clickhouse_lb.testing import ClusterBase

# As in test_sqlalchemy_async.py: independent of how the package was installed.
registry.register("clickhousedb.lb_async", "clickhouse_lb.sqlalchemy.aio", "ClickHouseLBAsyncDialect")

pytestmark = pytest.mark.integration

WHO = "SELECT getMacro('replica')"


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


def engine_url(cluster: ClusterBase, query: str) -> str:
    password = quote(getattr(cluster, "password", ""), safe="")
    hosts = "&".join(f"host={h}" for h in cluster.hosts)
    # These scenarios pin the state's server-style counts and error times (decay only): no health
    # probes, which would count failed probes and re-admit the killed replica on their own.
    return f"clickhousedb+lb_async://default:{password}@/default?{hosts}&health_check_interval_ms=0&{query}"


def engine_per_query(url: str) -> Callable[[], Awaitable[Served]]:
    async def serve() -> Served:
        engine = create_async_engine(url)
        async with engine.connect() as connection:
            replica = str((await connection.execute(text(WHO))).scalar())
        r1 = (await get_async_replica_pool(engine)).replicas[0]  # the engine's pool on this loop: no new connection
        await engine.dispose()
        return Served(replica, r1.errors_count, r1.last_error_time)

    return serve


def pool_per_query(cluster: ClusterBase, **options: Any) -> Callable[[], Awaitable[Served]]:
    async def serve() -> Served:
        pool = clickhouse_lb.get_async_pool(  # no probes: see engine_url
            cluster.hosts, password=getattr(cluster, "password", ""), health_check_interval_ms=0, **options
        )
        async with pool:
            replica = str(await pool.command(WHO))
            r1 = pool.replicas[0]
        return Served(replica, r1.errors_count, r1.last_error_time)

    return serve


async def test_engine_per_query_round_robin_rotates(cluster: ClusterBase) -> None:
    serve = engine_per_query(engine_url(cluster, "load_balancing=round_robin"))
    check_round_robin([await serve() for _ in range(30)], cluster.names)


async def test_engine_per_query_in_order_skips_a_killed_replica_until_readmitted(cluster: ClusterBase) -> None:
    query = f"load_balancing=in_order&distributed_replica_error_half_life={HALF_LIFE}"
    check_in_order(await in_order_after_kill_async(cluster, engine_per_query(engine_url(cluster, query))))


async def test_pool_per_query_round_robin_rotates(cluster: ClusterBase) -> None:
    serve = pool_per_query(cluster, load_balancing="round_robin")
    check_round_robin([await serve() for _ in range(30)], cluster.names)


async def test_pool_per_query_in_order_skips_a_killed_replica_until_readmitted(cluster: ClusterBase) -> None:
    serve = pool_per_query(cluster, load_balancing="in_order", distributed_replica_error_half_life=HALF_LIFE)
    check_in_order(await in_order_after_kill_async(cluster, serve))


async def test_sync_and_async_engines_from_one_url_share(cluster: ClusterBase) -> None:
    from sqlalchemy import create_engine

    from clickhouse_lb.sqlalchemy import get_replica_pool

    query = "load_balancing=round_robin"
    async_engine = create_async_engine(engine_url(cluster, query))
    sync_engine = create_engine(engine_url(cluster, query).replace("+lb_async://", "+lb://"))
    try:
        async_pool = await get_async_replica_pool(async_engine)
        assert async_pool.balancer.state is get_replica_pool(sync_engine).balancer.state
    finally:
        await async_engine.dispose()
        sync_engine.dispose()
