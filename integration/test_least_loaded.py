"""least_loaded against a real 3-replica cluster: a replica slowed by ``set_delay`` gets a clearly
smaller share under concurrent load, and wins it back once the delay is removed.

Shares are counted by asking each answering replica its name. ``random`` and ``round_robin``
would give the slow replica a third of the statements whatever its latency; the bounds below
(under 12% while slow; after, over 10% and twice its slowed share) sit far from both that third and from what
least_loaded does (a few percent, then about a third), so that a loaded 2-core machine does not
flake them. Everything is driven by statements: no sleep waits for the balancer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb import ReplicaPool
from clickhouse_lb.testing import ClusterBase

WHO = "SELECT getMacro('replica')"
THREADS = 6
SLOW = 2  # the replica slowed down
DELAY = 0.2  # seconds: ~20x a statement's time on an idle machine
#: A short decay time, so that the slow replica is tried again within a second or two (10 s by default).
DECAY = 1.0


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


def make_pool(cluster: ClusterBase, **options: Any) -> ReplicaPool:
    return clickhouse_lb.get_pool(
        cluster.hosts, load_balancing="least_loaded", least_loaded_decay_time=DECAY, share_state=False,
        send_receive_timeout=10, **options,
    )


def answers(pool: ReplicaPool, statements: int) -> Counter[str]:
    """Who answered ``statements`` statements run by THREADS threads at once."""
    per_thread = statements // THREADS

    def work(_: int) -> list[str]:
        return [str(pool.command(WHO)) for _ in range(per_thread)]

    with ThreadPoolExecutor(THREADS) as executor:
        return Counter(name for names in executor.map(work, range(THREADS)) for name in names)


def share(counts: Counter[str], name: str) -> float:
    return counts[name] / sum(counts.values())


def test_a_slow_replica_gets_a_smaller_share_and_wins_it_back(cluster: ClusterBase) -> None:
    slow = cluster.names[SLOW]
    with make_pool(cluster) as pool:
        answers(pool, 60)  # every replica answers once at least (cold start), clients created
        cluster.set_delay(SLOW, DELAY)
        slowed = answers(pool, 360)
        assert share(slowed, slow) < 0.12, slowed
        # The fast ones share the rest (unevenly on a loaded machine: a replica process that is
        # descheduled for a moment answers slowly too, and least_loaded sees it).
        assert all(share(slowed, name) > 0.15 for name in cluster.names if name != slow), slowed

        cluster.set_delay(SLOW, 0)
        # Its idle average decays (DECAY s) until it is drawn again; its fast answer then
        # brings it back. Generous bound: a few seconds are expected.
        deadline = time.monotonic() + 30
        while share(answers(pool, 60), slow) < 0.2:
            assert time.monotonic() < deadline, "the replica's share did not recover within 30 s"
        recovered = answers(pool, 360)
        # About a third on an idle machine; while slow it had a few percent (under 12%). On a busy
        # machine the fast replicas share unevenly too (a busy-machine run: 188 / 120 / 52, the
        # recovered one 14%), so the bound is twice its slowed share and over 10%, not a third.
        assert share(recovered, slow) > max(0.10, 2 * share(slowed, slow)), (recovered, slowed)
        assert [r.in_flight for r in pool.replicas] == [0, 0, 0]


# A stall of the test process (tools/busy_machine_tests.py's GIL holder) races the statement away
# from the slow replica (docs/busy-process.md), and its 2 s answer is then never waited for.
@pytest.mark.on_time_process
def test_pool_replicas_show_in_flight_and_the_latency_average(cluster: ClusterBase) -> None:
    with make_pool(cluster) as pool:
        answers(pool, 12)
        assert all(r.latency_ewma is not None for r in pool.replicas)
        cluster.set_delay(SLOW, 2.0)
        # One statement sent to the slow replica (per-statement strategy), watched from outside.
        pinned = {"load_balancing": "first_or_random", "load_balancing_first_offset": SLOW}
        done = threading.Event()
        thread = threading.Thread(target=lambda: (pool.command(WHO, settings=pinned), done.set()))
        thread.start()
        try:
            # The statement takes 2 s on the replica: in_flight must show it before it ends.
            while pool.replicas[SLOW].in_flight != 1:
                assert not done.is_set(), "the statement ended and in_flight never showed it"
                time.sleep(0.01)  # polling a condition, not waiting for the balancer
        finally:
            thread.join(30)
        statuses = pool.replicas
        assert [r.in_flight for r in statuses] == [0, 0, 0]
        latency = statuses[SLOW].latency_ewma
        assert latency is not None
        assert latency > 1.0  # the 2 s answer, barely decayed
        assert all((r.latency_ewma or 0) < latency for i, r in enumerate(statuses) if i != SLOW)
        cluster.set_delay(SLOW, 0)


async def test_async_pool_avoids_the_slow_replica(cluster: ClusterBase) -> None:
    pytest.importorskip("aiohttp")
    slow = cluster.names[SLOW]
    pool = clickhouse_lb.get_async_pool(
        cluster.hosts, load_balancing="least_loaded", least_loaded_decay_time=DECAY, share_state=False,
    )
    async with pool:

        async def work(statements: int) -> list[str]:
            return [str(await pool.command(WHO)) for _ in range(statements)]

        await asyncio.gather(*(work(10) for _ in range(THREADS)))
        cluster.set_delay(SLOW, DELAY)
        batches = await asyncio.gather(*(work(60) for _ in range(THREADS)))
        assert [r.in_flight for r in pool.replicas] == [0, 0, 0]
    counts = Counter(name for batch in batches for name in batch)
    assert share(counts, slow) < 0.12, counts
