"""Every golden vector of tests/golden/ordering.jsonl (derived from ClickHouse's code).

Exact orders are compared as lists. Tie groups are checked over many seeded selections:
each selection keeps the groups in order, every member of every group comes first within
its group at least once, and the first group's members share first place roughly evenly.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import LoadBalancing, parse_balancing_settings
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.ordering import plan_order, static_ranks
from clickhouse_lb.core.state import ReplicaSetState
from clickhouse_lb.core.strategies import hostname_scores, strategy_priorities
from clickhouse_lb.errors import AllReplicasUnavailableError

from .conftest import FakeClock, load_golden
from .fakes import FakeCluster, make_pool, refused

GOLDEN = load_golden()
ORDERING = [case for case in GOLDEN if "kind" not in case]
KINDS = ("decay_sequence", "system_clusters", "failover")
BY_KIND = {kind: [c for c in GOLDEN if c.get("kind") == kind] for kind in KINDS}
SELECTIONS = 600


def _balancer(case: dict[str, Any], seed: int = 1) -> tuple[Balancer, FakeClock]:
    clock = FakeClock()
    settings = parse_balancing_settings(
        {
            "load_balancing": case["strategy"],
            "local_hostname": case["local_hostname"],
            "load_balancing_first_offset": case["first_offset"],
            "distributed_replica_max_ignored_errors": case["max_ignored_errors"],
            "distributed_replica_error_half_life": case.get("half_life_s", 60),
        }
    )
    replicas = [Replica(r["host"], 8123, r["priority"]) for r in case["replicas"]]
    balancer = Balancer(replicas, settings, clock=clock, random=random.Random(seed).random)
    balancer.plan_indices(advance=False)  # starts the decay clock at "now"
    balancer.state.load([r["errors"] for r in case["replicas"]], [r.get("slowdowns", 0) for r in case["replicas"]])
    clock.advance(case.get("elapsed_since_last_decrease_s", 0))
    return balancer, clock


def _hosts(balancer: Balancer, order: list[int]) -> list[str]:
    return [balancer.replicas[i].host for i in order]


@pytest.mark.parametrize("case", ORDERING, ids=[f"case{c['id']}" for c in ORDERING])
def test_ordering_vector(case: dict[str, Any]) -> None:
    if case.get("hedged"):
        _check_hedged(case)
        return
    balancer, _ = _balancer(case)
    if "expected" in case:
        assert _hosts(balancer, balancer.plan_indices(advance=False)) == case["expected"]
        if "expected_errors_after_decay" in case:
            assert [r.errors_count for r in balancer.statuses()] == case["expected_errors_after_decay"]
        for _ in range(20):  # no randomness may disturb an exact order
            assert _hosts(balancer, balancer.plan_indices()) == case["expected"]
        return
    groups: list[list[str]] = case["order_groups"]
    firsts: list[Counter[str]] = [Counter() for _ in groups]
    for _ in range(SELECTIONS):
        order = _hosts(balancer, balancer.plan_indices())
        position = 0
        for g, group in enumerate(groups):
            chunk = order[position : position + len(group)]
            assert sorted(chunk) == sorted(group), f"{order} breaks the groups {groups}"
            firsts[g][chunk[0]] += 1
            position += len(group)
    for g, group in enumerate(groups):
        assert set(firsts[g]) == set(group), f"never first in group {group}: {set(group) - set(firsts[g])}"
    share = SELECTIONS / len(groups[0])
    for host in groups[0]:  # roughly uniform: within 25% of an even share
        assert 0.75 * share <= firsts[0][host] <= 1.25 * share, firsts[0]


def _check_hedged(case: dict[str, Any]) -> None:
    strategy = LoadBalancing.parse(case["strategy"])
    hosts = [r["host"] for r in case["replicas"]]
    scores = hostname_scores(strategy, case["local_hostname"], hosts)
    prios = strategy_priorities(strategy, len(hosts), first_offset=case["first_offset"], hostname_score=scores)
    ranks = static_ranks([r["priority"] for r in case["replicas"]], prios)
    errors = [r["errors"] for r in case["replicas"]]
    slowdowns = [r["slowdowns"] for r in case["replicas"]]
    rnd = random.Random(3).random
    hedged = plan_order(errors, ranks, case["max_ignored_errors"], rnd, slowdowns=slowdowns)
    assert [hosts[i] for i in hedged] == case["expected"]
    plain = plan_order(errors, ranks, case["max_ignored_errors"], rnd)
    assert [hosts[i] for i in plain] == case["expected_non_hedged"]
    # A pool's balancer orders with the stored slowdowns (pool.record_slowdown) as the hedged key.
    balancer, _ = _balancer(case)
    assert _hosts(balancer, balancer.plan_indices(advance=False)) == case["expected"]


@pytest.mark.parametrize("case", BY_KIND["decay_sequence"], ids=lambda c: f"case{c['id']}")
def test_decay_sequence(case: dict[str, Any]) -> None:
    clock = FakeClock(start=float(case["last_decrease_at"]))
    state = ReplicaSetState(1, half_life=case["half_life_s"], clock=clock)
    state.select(advance_round_robin=False)
    state.load([case["stored_errors_at_t0"]])
    seen = []
    for at in case["selection_calls_at"]:
        clock.now = float(at)
        seen.append(state.select(advance_round_robin=False).errors[0])
    assert seen == case["expected_errors_after_each_call"]


@pytest.mark.parametrize("case", BY_KIND["system_clusters"], ids=lambda c: f"case{c['id']}")
def test_system_clusters(case: dict[str, Any]) -> None:
    clock = FakeClock()
    state = ReplicaSetState(1, half_life=case["half_life_s"], clock=clock)
    state.select(advance_round_robin=False)
    state.load([case["stored_errors"]], [case["stored_slowdowns"]])
    clock.advance(case["seconds_since_last_decrease"])
    (counts,) = state.counts()
    assert counts.errors == case["expected_errors_count"]
    assert counts.estimated_recovery_time == case["expected_estimated_recovery_time"]


@pytest.mark.parametrize("case", BY_KIND["failover"], ids=lambda c: f"case{c['id']}")
def test_failover_vector(case: dict[str, Any]) -> None:
    hosts = case["sorted_order"]
    cluster = FakeCluster(*hosts)
    for host, outcomes in case["outcomes"].items():
        cluster[host].outcomes = ["ok" if o == "ok" else refused for o in outcomes]
    pool = make_pool(cluster, load_balancing="in_order")
    attempts: list[str] = []
    original = cluster.factory

    def tracking_factory(**options: Any) -> Any:
        client = original(**options)
        run = client._run

        def traced(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            attempts.append(options["host"])
            return run(method, args, kwargs)

        client._run = traced  # type: ignore[method-assign]
        return client

    pool._factory = tracking_factory
    all_fail = all(o == ["fail"] for o in case["outcomes"].values())
    if all_fail:
        with pytest.raises(AllReplicasUnavailableError):
            pool.query("SELECT 1")
    else:
        assert pool.query("SELECT 1") == f"query@{attempts[-1]}"
    assert attempts == case["attempts"]
    counts = {s.host: s.errors_count for s in pool.replicas}
    assert counts == case["error_increments"]
