"""A read raced on a second replica (a hedge, or the race after a stall) that the second replica
answers is that replica's success, not the first's: the first replica was slow or stopped, and
a success recorded for it cleared its failed mark and announced it "back in rotation" while it
was still failing (noticed in four stops' notes, left until now)."""

from __future__ import annotations

import threading

from clickhouse_lb.core.events import ReplicaRecoveredEvent
from tests.fakes import FakeCluster, make_pool, refused


class _Recoveries:
    def __init__(self) -> None:
        self.events: list[ReplicaRecoveredEvent] = []

    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        self.events.append(event)


def test_a_hedge_that_answers_first_is_its_replicas_success_not_the_slow_ones() -> None:
    cluster = FakeCluster("a", "b")
    recoveries = _Recoveries()
    # One error of "a" is ignored when ordering (ClickHouse's setting): "a" stays first after failing.
    pool = make_pool(cluster, load_balancing="in_order", use_hedged_requests=1, receive_data_timeout_ms=20,
                     distributed_replica_max_ignored_errors=1, listeners=[recoveries])
    cluster["a"].outcomes = [refused, "ok"]
    assert pool.command("SELECT 1", settings={"use_hedged_requests": 0}) == "command@b"  # "a" failed once
    assert not pool.replicas[0].is_up

    gate = cluster["a"].answer_gate = threading.Event()  # "a" now answers only when let go: slow
    try:
        assert pool.command("SELECT 1") == "command@b"  # hedged after 20 ms, answered by "b"
    finally:
        gate.set()
    assert pool.hedged_requests == 1
    assert not pool.replicas[0].is_up  # still marked as failing: its read never answered
    assert [event.address for event in recoveries.events] == []  # and never announced back
    pool.close()
