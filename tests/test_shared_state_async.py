"""The shared balancing state across the async pool and the sync one (clickhouse_lb.core.shared_state).

Needs clickhouse_lb.pools.aio (clickhouse-connect >= 1.10): not run in .ci/compat."""

from __future__ import annotations

import asyncio

import clickhouse_lb
from clickhouse_lb.core import shared_state
from clickhouse_lb.core.shared_state import state_key

HOSTS = ["ch-1:8123", "ch-2:8123", "ch-3:8123"]


def test_async_and_sync_pools_over_the_same_replicas_share_one_state() -> None:
    sync_pool = clickhouse_lb.get_pool(HOSTS, username="u", database="db", load_balancing="in_order",
                                      connect_on_create=False)
    async_pool = clickhouse_lb.get_async_pool(HOSTS, username="u", database="db", load_balancing="in_order")
    assert async_pool.balancer.state is sync_pool.balancer.state
    async_pool.record_error("ch-1:8123")
    assert sync_pool.plan() == ["ch-2:8123", "ch-3:8123", "ch-1:8123"]
    assert clickhouse_lb.get_async_pool(HOSTS, username="u", database="db", load_balancing="in_order",
                                        share_state=False).plan() == HOSTS


def test_closing_an_async_pool_gives_the_state_back() -> None:
    pool = clickhouse_lb.get_async_pool(HOSTS, load_balancing="round_robin")
    k = state_key(pool.config)
    assert shared_state.registry.users(k) == 1
    asyncio.run(pool.close())
    assert shared_state.registry.users(k) == 0


def test_async_pools_per_request_rotate_round_robin_evenly() -> None:
    async def main() -> list[int]:
        firsts = []
        for _ in range(30):
            pool = clickhouse_lb.get_async_pool(HOSTS, load_balancing="round_robin")
            firsts.append(pool.balancer.plan_indices()[0])
            await pool.close()
        return firsts

    firsts = asyncio.run(main())
    assert sorted(firsts.count(i) for i in range(3)) == [10, 10, 10]
