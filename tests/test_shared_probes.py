"""One health worker per shared replica set (sync pools): shared by the pools over the set,
left running when a pool closes, stopped when the registry drops the set; its events reach
the listeners of every open pool. No thread is started here but where a test says so."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.core import shared_state
from clickhouse_lb.core.events import ReplicaDownEvent
from clickhouse_lb.core.health import ProbeOutcome
from clickhouse_lb.pools.pool import ReplicaPool


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    shared_state.registry.clear()
    yield
    shared_state.registry.clear()


def _refusing() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


HOSTS = [_refusing(), _refusing()]


def pool(listeners: Any = (), share_state: bool = True, **options: Any) -> ReplicaPool:
    config = resolve_pool_config(
        HOSTS, dsn=None, balancing={}, client_options=options, valid_client_options=sync_client_option_names(),
        share_state=share_state,
    )
    return ReplicaPool(config, listeners=listeners)


def test_pools_over_one_set_share_one_worker() -> None:
    a, b = pool(), pool()
    assert a._prober is not None
    assert a._prober is b._prober
    assert a._health is b._health
    c = pool(health_check_interval_ms=2000)  # other probe settings: a worker of their own
    assert c._prober is not a._prober
    assert pool(share_state=False)._prober is not a._prober


def test_closing_a_pool_leaves_the_shared_worker_running_until_the_set_is_dropped() -> None:
    a = pool()
    worker = a._prober
    assert worker is not None
    a._started()  # what a statement does: starts the worker
    assert worker.running
    a.close()
    assert worker.running  # the next pool (the next query's engine) still has its probes
    b = pool()
    assert b._prober is worker
    b.close()
    shared_state.registry.clear()  # the set is dropped (idle_ttl, or clear())
    thread = worker._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()


def test_the_shared_workers_events_reach_every_open_pool() -> None:
    seen: dict[str, list[Any]] = {"a": [], "b": []}

    class Listener:
        def __init__(self, name: str) -> None:
            self.name = name

        def on_replica_down(self, event: ReplicaDownEvent) -> None:
            seen[self.name].append(event)

    a, b = pool([Listener("a")]), pool([Listener("b")])
    assert a._health is not None
    a._health.finish(0, ProbeOutcome(False, 0.001, "refused"))  # what the worker does
    assert [e.address for e in seen["a"]] == [HOSTS[0]]
    assert [e.address for e in seen["b"]] == [HOSTS[0]]
    assert a.replicas[0].errors_count == b.replicas[0].errors_count == 1
    assert (a.stats.failed_probes, b.stats.failed_probes) == (1, 1)
    b.close()
    a._health.finish(1, ProbeOutcome(False, 0.001, "refused"))
    assert [e.address for e in seen["a"]] == [HOSTS[0], HOSTS[1]]
    assert [e.address for e in seen["b"]] == [HOSTS[0]]  # a closed pool hears nothing more
    a.close()
