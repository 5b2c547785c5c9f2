"""Background health probes against the real engine: fast re-admission, marking down while
idle, and probes off keeping today's decay-only behaviour.

Times are asserted with bounds generous enough for a loaded 2-core machine yet far from what
the failure would take: decay alone keeps a restarted replica out for about a minute or more
(default half-life 60 s), a statement sent to a paused replica waits its whole timeout. The
real figures are in bench/bench_health.py (BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb import ReplicaPool
from clickhouse_lb.core.events import ReplicaDownEvent, ReplicaRecoveredEvent
from clickhouse_lb.testing import ClusterBase

WHO = "SELECT getMacro('replica')"
#: Generous bound for "back in rotation" / "marked down": the default probes take ~0.5 s.
BOUND = 5.0


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


class Events:
    """Listener: probe transitions with the monotonic time they happened."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, Any]] = []
        self.changed = threading.Condition()

    def _add(self, event: Any) -> None:
        with self.changed:
            self.seen.append((time.monotonic(), event))
            self.changed.notify_all()

    on_replica_down = _add
    on_replica_recovered = _add

    def wait_for(self, predicate: Callable[[Any], bool], timeout: float) -> float:
        """The time of the first event matching ``predicate`` (waits for it, up to ``timeout``)."""
        with self.changed:
            found = self.changed.wait_for(lambda: any(predicate(e) for _, e in self.seen), timeout)
            assert found, f"no matching event within {timeout}s; saw {[e for _, e in self.seen]}"
            return next(t for t, e in self.seen if predicate(e))


@contextmanager
def load(pool: ReplicaPool, threads: int = 4) -> Iterator[list[tuple[float, str]]]:
    """``threads`` threads running statements until the block ends; yields (time, who) records."""
    served: list[tuple[float, str]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                answer = str(pool.command(WHO))
            except BaseException as exc:  # every failure fails the test
                failures.append(exc)
                return
            served.append((time.monotonic(), answer))

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield served
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert failures == []


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.01)
    return time.monotonic()


def test_a_restarted_replica_is_back_in_rotation_soon_after_it_answers(cluster: ClusterBase) -> None:
    events = Events()
    with (
        clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", listeners=[events],
                               send_receive_timeout=5) as pool,
        load(pool) as served,
    ):
        wait_until(lambda: len(served) > 20, BOUND, "statements to run")
        cluster.kill(0)
        events.wait_for(lambda e: isinstance(e, ReplicaDownEvent) and e.address == cluster.hosts[0], BOUND)
        assert pool.replicas[0].errors_count >= 1
        cluster.restart(0)  # returns once it answers /ping
        answered = time.monotonic()
        back = events.wait_for(
            lambda e: isinstance(e, ReplicaRecoveredEvent) and e.address == cluster.hosts[0] and e.reason == "probe",
            BOUND * 4,
        )
        served_again = wait_until(
            lambda: any(t > back and who == cluster.names[0] for t, who in served), BOUND, "r1 to serve again"
        )
    assert back - answered < BOUND  # decay alone: ~60-155 s with the default half-life
    assert served_again - answered < BOUND
    status = pool.replicas[0]
    assert (status.errors_count, status.probe_state, status.is_up) == (0, "up", True)


def test_a_replica_killed_while_idle_is_marked_down_before_the_next_statement(cluster: ClusterBase) -> None:
    events = Events()
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", listeners=[events]) as pool:
        assert str(pool.command(WHO)) == cluster.names[0]  # starts the probes
        wait_until(lambda: all(r.probe_state == "up" for r in pool.replicas), BOUND, "a first sweep")
        killed = time.monotonic()
        cluster.kill(0)
        down = events.wait_for(lambda e: isinstance(e, ReplicaDownEvent), BOUND)
        assert down - killed < BOUND  # within one sweep interval (1 s by default)
        assert pool.plan()[0] == cluster.hosts[1]
        assert str(pool.command(WHO)) == cluster.names[1]
        assert pool.stats.failovers == 0  # no statement paid for finding out


def test_a_replica_paused_while_idle_is_avoided_without_any_statement_waiting(cluster: ClusterBase) -> None:
    timeout = 30  # what a statement sent to the paused replica would wait
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", send_receive_timeout=timeout) as pool:
        assert str(pool.command(WHO)) == cluster.names[0]
        wait_until(lambda: all(r.probe_state == "up" for r in pool.replicas), BOUND, "a first sweep")
        cluster.pause(0)
        wait_until(lambda: pool.replicas[0].probe_state == "down", BOUND, "the probes to see r1 hang")
        for _ in range(5):
            started = time.monotonic()
            assert str(pool.command(WHO)) == cluster.names[1]
            assert time.monotonic() - started < timeout / 3  # did not wait on the paused replica
        assert pool.stats.failovers == 0
        # A ping that got no answer in its time, with this process running (not a stall).
        assert "no answer to /ping" in (pool.replicas[0].last_probe_error or "").lower()
        cluster.resume(0)
        wait_until(lambda: pool.plan()[0] == cluster.hosts[0], BOUND, "r1 to be re-admitted after resuming")


def test_probes_off_keep_the_decay_only_behaviour(cluster: ClusterBase) -> None:
    with (
        clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", health_check_interval_ms=0) as pool,
        load(pool) as served,
    ):
        wait_until(lambda: len(served) > 20, BOUND, "statements to run")
        cluster.kill(0)
        wait_until(lambda: pool.replicas[0].errors_count > 0, BOUND, "statements to count r1's failure")
        cluster.restart(0)  # takes a while: every statement in flight at the kill has ended by now
        restarted = time.monotonic()
        counted = pool.replicas[0].errors_count
        wait_until(lambda: len([t for t, _ in served if t > restarted]) > 100, BOUND * 4, "statements after restart")
        assert all(who != cluster.names[0] for t, who in served if t > restarted)  # decay has not run out
        replica = pool.replicas[0]
        assert replica.errors_count == counted  # nothing but statements counted (none went to r1)
        assert replica.estimated_recovery_time > 30
        assert [r.probe_state for r in pool.replicas] == ["off"] * 3
    assert pool._prober is None  # no worker at all


async def test_the_async_pool_readmits_a_restarted_replica(cluster: ClusterBase) -> None:
    events = Events()
    async with clickhouse_lb.get_async_pool(
        cluster.hosts, load_balancing="in_order", listeners=[events], username="default", password=cluster.password
    ) as pool:
        assert str(await pool.command(WHO)) == cluster.names[0]
        cluster.kill(0)
        assert str(await pool.command(WHO)) == cluster.names[1]
        await asyncio.to_thread(cluster.restart, 0)
        answered = time.monotonic()
        back = await asyncio.to_thread(
            events.wait_for, lambda e: isinstance(e, ReplicaRecoveredEvent) and e.reason == "probe", BOUND * 4
        )
        assert back - answered < BOUND
        assert str(await pool.command(WHO)) == cluster.names[0]
        assert [t.get_name() for t in asyncio.all_tasks()].count("clickhouse-lb-health") == 1
    assert "clickhouse-lb-health" not in [t.get_name() for t in asyncio.all_tasks()]


def test_replication_delays_are_read_from_every_replica(cluster: ClusterBase) -> None:
    with clickhouse_lb.get_pool(cluster.hosts, health_check_delay_interval_ms=100, password=cluster.password) as pool:
        pool.command(WHO)
        wait_until(lambda: all(r.delay is not None for r in pool.replicas), BOUND, "every delay read")
        assert [r.delay for r in pool.replicas] == [0.0, 0.0, 0.0]  # nothing to replicate yet


@pytest.fixture
def replicated_table(cluster: ClusterBase) -> Iterator[str]:
    name = f"lag_{uuid.uuid4().hex[:10]}"
    cluster.query(0, f"CREATE TABLE {name} ON CLUSTER lb_cluster (x UInt32) ENGINE = ReplicatedMergeTree ORDER BY x")
    yield name
    cluster.heal()
    cluster.query(0, f"DROP TABLE IF EXISTS {name} ON CLUSTER lb_cluster SYNC")


def test_a_lagging_replica_gets_no_reads_while_fresh_ones_exist_and_gets_them_back_when_it_catches_up(
    cluster: ClusterBase, replicated_table: str
) -> None:
    if not hasattr(cluster, "stop_replication"):
        pytest.skip("needs LocalCluster's stop_replication")  # DockerCluster has no such fault
    with clickhouse_lb.get_pool(
        cluster.hosts, load_balancing="in_order", password=cluster.password,
        max_replica_delay_for_distributed_queries=1, health_check_delay_interval_ms=100,
    ) as pool:
        assert str(pool.command(WHO)) == cluster.names[0]  # starts the probes
        cluster.stop_replication(0)
        cluster.query(1, f"INSERT INTO {replicated_table} VALUES (1)")  # r1 does not apply it
        wait_until(lambda: (pool.replicas[0].delay or 0) >= 1, BOUND, "r1's delay to reach the 1 s limit")
        assert {str(pool.command(WHO)) for _ in range(10)} == {cluster.names[1]}
        assert pool.plan()[-1] == cluster.hosts[0]
        # Per statement: a higher limit takes r1 back, no fallback with a lower one skips it.
        assert str(pool.command(WHO, settings={"max_replica_delay_for_distributed_queries": 3600})) == cluster.names[0]
        assert pool.replicas[0].errors_count == 0  # lag is not an error
        cluster.start_replication(0)
        cluster.query(0, f"SYSTEM SYNC REPLICA {replicated_table}")
        wait_until(lambda: pool.replicas[0].delay == 0, BOUND, "r1's delay to read 0 again")
        assert {str(pool.command(WHO)) for _ in range(10)} == {cluster.names[0]}


def test_engine_per_query_pools_share_one_worker_that_outlives_them(cluster: ClusterBase) -> None:
    """As Superset does it: a new pool per query, closed right after. The probes run on the
    shared replica set's worker, so a replica that dies and comes back between two queries is
    marked down and re-admitted with no pool open and no statement paying for it."""

    def short_lived_look() -> Any:
        with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order") as pool:
            return pool.replicas[0]

    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order") as first:
        assert str(first.command(WHO)) == cluster.names[0]  # starts the shared worker
        wait_until(lambda: all(r.probe_state == "up" for r in first.replicas), BOUND, "a first sweep")
    cluster.kill(0)  # no pool open from here on, but for the short looks
    try:
        wait_until(lambda: short_lived_look().probe_state == "down", BOUND, "r1 marked down by the shared worker")
        assert short_lived_look().errors_count >= 1
    finally:
        cluster.restart(0)
    wait_until(lambda: short_lived_look().errors_count == 0, BOUND, "r1 re-admitted by the shared worker")
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order") as pool:
        assert (pool.replicas[0].probe_state, pool.replicas[0].is_up) == ("up", True)
        assert str(pool.command(WHO)) == cluster.names[0]
        assert pool.stats.failovers == 0
