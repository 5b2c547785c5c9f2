"""One record per replica, one owner: a discovery change moves a kept replica's counts, load,
probe verdict, replication delay and client together; threads updating the records while the
set is replaced lose nothing; a pool built without discovery and without connecting does no I/O."""

from __future__ import annotations

import dataclasses
import socket
import threading
from typing import Any

import pytest

from clickhouse_lb.config.discovery import DiscoverySettings
from clickhouse_lb.config.pool_config import sync_client_option_names
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.health import ProbeOutcome
from clickhouse_lb.core.records import remap
from clickhouse_lb.core.state import ReplicaSetState
from clickhouse_lb.pools.pool import ReplicaPool

from .conftest import FakeClock
from .fakes import FakeCluster, pool_parts


def _discovered_pool(cluster: FakeCluster, hosts: list[str], clock: FakeClock, **options: Any) -> ReplicaPool:
    """A pool as discovery leaves it after construction (over ``hosts``, seeds remembered)."""
    options.setdefault("load_balancing", "in_order")
    options.setdefault("distributed_replica_error_half_life", 3600)
    config, balancer = pool_parts(hosts, options, sync_client_option_names(), clock=clock)
    config = dataclasses.replace(
        config, discovery=DiscoverySettings("c"), seeds=(Replica(hosts[0], 8123),), share_state=False
    )
    return ReplicaPool(config, client_factory=cluster.factory, balancer=balancer)


def test_a_kept_replica_keeps_its_counts_load_probe_verdict_delay_and_client_together(clock: FakeClock) -> None:
    cluster = FakeCluster("a", "b", "c")
    pool = _discovered_pool(cluster, ["a", "b"], clock, health_check_interval_ms=1000, health_check_fall=1)
    b = pool.balancer.index_of("b:8123")
    for _ in range(2):
        pool.record_error("b:8123")
    pool.record_slowdown("b:8123")
    load = pool.balancer.state.replica_load
    load.finish(b, load.start(b) - 0.25)  # one answer in 250 ms: the latency average
    load.start(b)  # and one attempt still running there
    health = pool._health
    assert health is not None
    health.finish(b, ProbeOutcome(False, 0.01, "refused"))  # fall=1: down, one more error
    health.finish_delay(b, 42.0)
    client = pool.client("b:8123")

    pool._apply_discovered([Replica("c", 8123), Replica("b", 8123)])  # a leaves, c comes: b moves to 0

    assert pool.addresses == ["b:8123", "c:8123"]
    row = {r.address: r for r in pool.replicas}
    kept, added = row["b:8123"], row["c:8123"]
    assert (kept.errors_count, kept.slowdowns_count) == (3, 1)
    assert (kept.in_flight, kept.latency_ewma) == (1, pytest.approx(0.25))
    assert (kept.probe_state, kept.last_probe_error, kept.delay) == ("down", "refused", 42.0)
    assert pool.client("b:8123") is client
    assert (added.errors_count, added.slowdowns_count, added.in_flight, added.latency_ewma) == (0, 0, 0, None)
    assert (added.probe_state, added.delay) == ("unknown", None)
    pool.close()


def test_statements_still_running_on_the_old_set_count_on_the_moved_records(clock: FakeClock) -> None:
    old = ReplicaSetState(3, clock=clock)
    started = old.replica_load.start(2)
    new = old.carried_over({2: 0, 0: 1}, 3)  # replica 1 removed, one added at 2
    old.record_error(2, "refused")  # an attempt of a statement that began before the change
    old.replica_load.finish(2, started)
    assert new.records[0] is old.records[2]
    assert new.counts()[0].errors == 1
    assert new.replica_load.snapshot()[0].in_flight == 0
    assert new.records[2] is not old.records[1]
    assert new.counts()[2].errors == 0


def test_threads_updating_records_while_the_set_is_replaced_lose_no_update(clock: FakeClock) -> None:
    """Every thread counts on the set it started with (as a statement does) while the main
    thread replaces the set over and over, permuting it: the last set's records hold every
    error, slowdown and finished attempt, because the records move whole and one lock
    guards them all."""
    size, threads, rounds = 4, 4, 2000
    first = ReplicaSetState(size, half_life=3600, error_cap=10**9, clock=clock)
    first.select(advance_round_robin=False)
    barrier = threading.Barrier(threads + 1)

    def work(seed: int) -> None:
        barrier.wait()
        load = first.replica_load
        for i in range(rounds):
            index = (seed + i) % size
            started = load.start(index)
            first.record_error(index)
            first.record_slowdown(index)
            load.finish(index, started)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    state = first
    shift = {i: (i + 1) % size for i in range(size)}  # every replica kept, each one place on
    for _ in range(200):
        state = state.carried_over(shift, size)
    for worker in workers:
        worker.join()
    counts, snapshot = state.counts(), state.replica_load.snapshot()
    assert sum(c.errors for c in counts) == threads * rounds
    assert sum(c.slowdowns for c in counts) == threads * rounds
    assert sum(s.in_flight for s in snapshot) == 0
    assert sorted(state.health_marks()[0]) == [threads * rounds // size] * size
    assert set(map(id, state.records)) == set(map(id, first.records))


def test_remap_moves_kept_values_and_makes_fresh_ones() -> None:
    made: list[object] = []

    def fresh() -> object:
        made.append(object())
        return made[-1]

    values = ["a", "b", "c"]
    assert remap(values, {2: 0, 0: 2}, 4, fresh)[0::2] == ["c", "a"]
    assert len(made) == 2  # one fresh value per added position, never shared


def test_a_pool_without_discovery_and_without_connecting_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    from clickhouse_lb import get_pool

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"I/O while building the pool: {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    threads = threading.active_count()
    pool = get_pool(hosts=["ch-1.invalid:8123", "ch-2.invalid:8123"], connect_on_create=False,
                    load_balancing="nearest_hostname")  # a hostname strategy: its DNS lookup waits for use
    assert threading.active_count() == threads  # the probe worker starts with the first statement
    assert pool.addresses == ["ch-1.invalid:8123", "ch-2.invalid:8123"]
    pool.close()


def test_shared_records_and_per_pool_client_slots() -> None:
    from clickhouse_lb import get_pool

    first = get_pool(hosts=["r-1.invalid:8123", "r-2.invalid:8123"], connect_on_create=False)
    second = get_pool(hosts=["r-1.invalid:8123", "r-2.invalid:8123"], connect_on_create=False)
    try:
        assert first.balancer.state.records is second.balancer.state.records  # counts: one per replica set
        assert first._view.slots[0] is not second._view.slots[0]  # clients: one per pool
        first.record_error("r-2.invalid:8123")
        assert [r.errors_count for r in second.replicas] == [0, 1]
    finally:
        first.close()
        second.close()


def test_a_balancer_over_carried_records_orders_by_them(clock: FakeClock) -> None:
    replicas = [Replica("a"), Replica("b"), Replica("c")]
    balancer = Balancer(replicas, pool_parts(["a", "b", "c"], {"load_balancing": "in_order"},
                                             sync_client_option_names())[0].settings, clock=clock)
    balancer.record_error(0, "refused")
    state = balancer.state.carried_over({0: 1, 1: 0}, 2)  # a and b swap places, c leaves
    moved = Balancer([replicas[1], replicas[0]], balancer.settings, clock=clock, state=state)
    assert moved.plan() == ["b:8123", "a:8123"]  # a keeps its error at its new position
