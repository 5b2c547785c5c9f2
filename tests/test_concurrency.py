"""Many threads share one pool: statements, plan() and record_error() keep the counts exact."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from .fakes import FakeCluster, make_pool, refused


def test_threads_hammering_a_pool_keep_counts_consistent() -> None:
    cluster = FakeCluster("a", "b", "c", "d")
    cluster["d"].outcomes = [refused]  # every attempt on d fails, the others succeed
    pool = make_pool(cluster, load_balancing="round_robin", distributed_replica_error_cap=10**9,
                     distributed_replica_error_half_life=10**9)
    threads, per_thread = 16, 250
    start = threading.Barrier(threads)

    def work(n: int) -> int:
        start.wait()
        for i in range(per_thread):
            assert pool.query("SELECT 1").startswith("query@")
            pool.plan()
            if i % 10 == 0:
                pool.record_error("a:8123")
        return n

    with ThreadPoolExecutor(threads) as executor:
        assert sorted(executor.map(work, range(threads))) == list(range(threads))

    statements = threads * per_thread
    served = {h: len(r.calls) for h, r in cluster.replicas.items() if h != "d"}
    d_attempts = len(cluster["d"].calls)
    assert sum(served.values()) == statements  # every statement served exactly once
    counts = {s.host: s.errors_count for s in pool.replicas}
    assert counts["d"] == d_attempts  # one error per failed attempt, none lost
    assert counts["a"] == threads * (per_thread // 10)
    assert [c.replica.created for c in cluster.clients].count(1) == len(cluster.clients)
    assert len(cluster.clients) <= 4  # one shared client per replica, created once
