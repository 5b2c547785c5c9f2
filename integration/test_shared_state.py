"""Engine-per-query applications (Superset, Airflow hooks, notebooks) on the test cluster: the
balancing state outlives each engine, for the ``clickhousedb+lb`` dialect and ``get_pool``.

Each "query" builds a new engine (or pool) from the same URL, runs one statement and drops it
(garbage-collected before the next one is made, as in Superset), so the only thing carrying
the error counts and the round-robin position from one query to the next is the shared state.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from shared_state_scenarios import HALF_LIFE, Served, check_in_order, check_round_robin, in_order_after_kill
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import clickhouse_lb
from clickhouse_lb.core import shared_state
from clickhouse_lb.core.shared_state import state_key
from clickhouse_lb.sqlalchemy import get_replica_pool
from clickhouse_lb.sqlalchemy.url import engine_args_from_url
from clickhouse_lb.testing import ClusterBase

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
    return f"clickhousedb+lb://default:{password}@/default?{hosts}&health_check_interval_ms=0&{query}"


def engine_per_query(url: str, *, collect_every: int = 0) -> Callable[[], Served]:
    """One Superset query: a new engine, one statement, the engine dropped. Every
    ``collect_every``-th engine is also garbage-collected, and the state is then checked to be
    held by no engine (idle, kept for the next one). Not after failures: pytest's log capture
    keeps the failover warnings' tracebacks, and with them the engine."""
    key = state_key(engine_args_from_url(make_url(url)).config)
    made = 0

    def serve() -> Served:
        nonlocal made
        engine = create_engine(url)
        with engine.connect() as connection:
            replica = str(connection.execute(text(WHO)).scalar())
        r1 = get_replica_pool(engine).replicas[0]
        engine.dispose()
        del engine, connection
        made += 1
        if collect_every and made % collect_every == 0:
            gc.collect()
            assert shared_state.registry.users(key) == 0
        return Served(replica, r1.errors_count, r1.last_error_time)

    return serve


def pool_per_query(cluster: ClusterBase, **options: Any) -> Callable[[], Served]:
    def serve() -> Served:
        pool = clickhouse_lb.get_pool(  # no probes: see engine_url
            cluster.hosts, password=getattr(cluster, "password", ""), health_check_interval_ms=0, **options
        )
        with pool:
            replica = str(pool.command(WHO))
            r1 = pool.replicas[0]
        return Served(replica, r1.errors_count, r1.last_error_time)

    return serve


def test_engine_per_query_round_robin_rotates(cluster: ClusterBase) -> None:
    serve = engine_per_query(engine_url(cluster, "load_balancing=round_robin"), collect_every=10)
    check_round_robin([serve() for _ in range(30)], cluster.names)


def test_engine_per_query_in_order_skips_a_killed_replica_until_readmitted(cluster: ClusterBase) -> None:
    query = f"load_balancing=in_order&distributed_replica_error_half_life={HALF_LIFE}"
    serve = engine_per_query(engine_url(cluster, query))
    check_in_order(in_order_after_kill(cluster, serve))


def test_engine_per_query_without_sharing_retries_the_killed_replica_every_time(cluster: ClusterBase) -> None:
    # What Superset saw before: every engine starts fresh and tries the dead replica first.
    serve = engine_per_query(engine_url(cluster, "load_balancing=in_order&share_state=0"))
    cluster.kill(0)
    for _ in range(3):
        served = serve()
        assert served.replica == "r2"
        assert served.r1_errors == 1  # its own first attempt, in a state of its own


def test_pool_per_query_round_robin_rotates(cluster: ClusterBase) -> None:
    serve = pool_per_query(cluster, load_balancing="round_robin")
    check_round_robin([serve() for _ in range(30)], cluster.names)


def test_pool_per_query_in_order_skips_a_killed_replica_until_readmitted(cluster: ClusterBase) -> None:
    serve = pool_per_query(cluster, load_balancing="in_order", distributed_replica_error_half_life=HALF_LIFE)
    check_in_order(in_order_after_kill(cluster, serve))


def test_engines_and_pools_over_the_same_replicas_share(cluster: ClusterBase) -> None:
    url = engine_url(cluster, "load_balancing=round_robin")
    engine = create_engine(url)
    with engine.connect() as connection:
        connection.execute(text(WHO))
    pool = clickhouse_lb.get_pool(cluster.hosts, username="default", database="default",
                                  password=getattr(cluster, "password", ""), load_balancing="round_robin")
    assert pool.balancer.state is get_replica_pool(engine).balancer.state
    engine.dispose()
    pool.close()
