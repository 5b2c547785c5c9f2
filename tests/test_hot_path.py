"""The shortcuts of the per-statement path give what the general path gives: the plan of a
healthy replica set computed once, the lock-free statement count, the automatic insert token."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from clickhouse_lb.config.replicas import parse_host
from clickhouse_lb.config.settings import LoadBalancing, parse_balancing_settings, split_statement_settings
from clickhouse_lb.core._statements import new_insert_token, prepare_call
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.ordering import (
    MAX_LISTED_ORDERS,
    plan_order,
    rank_orders,
    round_robin_order,
    round_robin_rotations,
)
from clickhouse_lb.core.state import ReplicaSetState
from clickhouse_lb.core.stats import PoolStats


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def balancer(
    strategy: str, clock: Clock, *, half_life: int = 60, seed: int = 3, draw: Callable[[], float] | None = None
) -> Balancer:
    replicas = [parse_host(f"r{i}.example:8123") for i in range(4)]
    settings = parse_balancing_settings({
        "load_balancing": strategy, "distributed_replica_error_half_life": half_life, "local_hostname": "r2.example",
    })
    return Balancer(replicas, settings, clock=clock, random=draw or random.Random(seed).random)


def test_tie_free_ranks_are_the_plan_of_a_healthy_set_whatever_random_draws() -> None:
    ranks = [2, 0, 3, 1]
    assert rank_orders(ranks) == [[1, 3, 0, 2]]
    draws = random.Random(5)
    for _ in range(50):
        assert plan_order([0, 0, 0, 0], ranks, 0, draws.random) == [1, 3, 0, 2]


def test_the_listed_orders_are_those_a_healthy_sort_draws() -> None:
    """rank_orders lists exactly the orders plan_order gives with zero counts (every tie in
    every permutation), and none when they are too many to list."""
    for ranks in ([0, 1, 1], [0, 0, 0], [1, 0, 1, 0], [2, 0, 2, 1, 2]):
        listed = rank_orders(ranks)
        assert listed is not None
        assert len(listed) == len({tuple(order) for order in listed})
        draws = random.Random(7)
        drawn = {tuple(plan_order([0] * len(ranks), ranks, 0, draws.random)) for _ in range(2000)}
        assert drawn == {tuple(order) for order in listed}
    assert len(rank_orders([0] * 5) or []) == MAX_LISTED_ORDERS
    assert rank_orders([0] * 6) is None


@pytest.mark.parametrize("strategy", [s.value for s in LoadBalancing])
def test_every_strategy_plans_as_the_general_path_does(strategy: str) -> None:
    """Drawing 0.0 every time, the general path's sort keeps tied replicas in index order and the
    shortcut draws the first listed order: the two agree step by step (healthy, with errors,
    with a slowdown), so the shortcut changes no order, only how it is drawn."""
    clock = Clock()
    fast, general = balancer(strategy, clock, draw=lambda: 0.0), balancer(strategy, clock, draw=lambda: 0.0)
    general._clear_ranks = general._clear_rotations = None  # the general path only
    general._clear_least_loaded = False
    general.state._set.round_robin = fast.state._set.round_robin  # (a random start per state)
    for step in range(40):
        clock.now += 7.0
        if step in (10, 25):
            for b in (fast, general):
                b.record_error(step % 4, "down")
        if step == 30:
            for b in (fast, general):
                b.record_slowdown(1)
        assert fast.plan_indices() == general.plan_indices(), (strategy, step)
    overrides, _ = split_statement_settings({"load_balancing": "in_order"})
    assert fast.plan_indices(overrides) == general.plan_indices(overrides)


def test_least_loaded_on_a_healthy_set_orders_as_the_general_path_does() -> None:
    """With loads recorded (answers of 300, 100, 200 and 50 ms, one in flight), the shortcut
    (no snapshot of the counts) makes the same draws and gives the same orders as the general
    path, statement by statement, until an error brings the snapshot back."""
    clock = Clock()
    fast, general = balancer("least_loaded", clock, seed=5), balancer("least_loaded", clock, seed=5)
    general._clear_least_loaded = False
    loads = [b.state.replica_load for b in (fast, general)]
    for b in (fast, general):
        b.plan_indices()
    for index, latency in enumerate([0.3, 0.1, 0.2, 0.05]):
        started = [load.start(index) for load in loads]
        clock.now += latency
        for load, start in zip(loads, started):
            load.finish(index, start)
    for load in loads:
        load.start(3)  # one statement in flight on the fastest
    plans = []
    for step in range(30):
        clock.now += 0.5
        if step == 20:
            for b in (fast, general):
                b.record_error(1, "down")
        plans.append(fast.plan_indices())
        assert plans[-1] == general.plan_indices(), step
    assert len({plan[0] for plan in plans}) > 1  # the two choices are drawn, not fixed


def test_round_robins_listed_orders_repeat_with_the_counter() -> None:
    """The orders listed once are round_robin_order's for every counter (their period: the lcm
    of the best priority's replica count and n), and none when the period is too long to list."""
    for ranks in ([0, 0, 0, 0], [0, 1, 0, 1], [1, 0, 0, 2, 0], [0, 1, 2]):
        rotations = round_robin_rotations(ranks)
        assert rotations is not None
        for counter in range(3 * len(rotations) + 5):
            expected = round_robin_order([0] * len(ranks), ranks, 0, counter)
            assert rotations[counter % len(rotations)] == expected, (ranks, counter)
    assert len(round_robin_rotations([0] * 7 + [1] * 4) or []) == 77  # lcm(7, 11)
    assert round_robin_rotations([0] * 11 + [1] * 2) is None  # lcm(11, 13) = 143: too many to list


def test_a_healthy_round_robin_set_takes_exact_turns_across_threads() -> None:
    """The shortcut steps the shared counter under the set's lock: 4 threads of 250 plans each
    give each of 4 replicas exactly 250 first places, as the snapshot's step did."""
    clock = Clock()
    b = balancer("round_robin", clock)
    b.plan_indices()  # the first look starts the decay clock
    firsts: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def plans() -> None:
        start.wait()
        mine = [b.plan_indices()[0] for _ in range(250)]
        with lock:
            firsts.extend(mine)

    threads = [threading.Thread(target=plans) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(Counter(firsts).values()) == [250, 250, 250, 250]


def test_a_healthy_random_set_draws_every_order_uniformly() -> None:
    """The shortcut's one draw per statement gives each of random's 24 orders of 4 replicas
    (as the sort's four draws would): each within a loose band of its 1/24 share."""
    clock = Clock()
    b = balancer("random", clock, seed=11)
    b.plan_indices()  # the first look starts the decay clock
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(24_000):
        order = tuple(b.plan_indices())
        counts[order] = counts.get(order, 0) + 1
    assert len(counts) == 24
    assert all(800 <= n <= 1200 for n in counts.values()), counts


@pytest.mark.parametrize(
    "strategy", ["random", "nearest_hostname", "first_or_random", "in_order", "round_robin", "least_loaded"]
)
def test_a_healthy_set_is_planned_without_a_snapshot_of_the_counts(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks that tie (random, the hostname strategies, first_or_random's others) take the
    shortcut too: no snapshot while every count is zero, ties drawn at random; a count
    recorded brings the snapshot back."""
    clock = Clock()
    b = balancer(strategy, clock)
    b.plan_indices()  # the first look starts the decay clock (a snapshot)
    snapshots: list[bool] = []
    original = ReplicaSetState.select

    def counted(state: ReplicaSetState, **kwargs: Any) -> Any:
        snapshots.append(True)
        return original(state, **kwargs)

    monkeypatch.setattr(ReplicaSetState, "select", counted)
    firsts = set()
    for _ in range(40):
        clock.now += 1.0
        plan = b.plan_indices()
        assert sorted(plan) == [0, 1, 2, 3]
        firsts.add(plan[0])
    assert snapshots == []
    if strategy == "random":
        assert firsts == {0, 1, 2, 3}  # ties broken at random, not in one fixed order
    b.record_error(firsts.pop(), "down")
    b.plan_indices()
    assert snapshots == [True]


def test_the_shortcut_keeps_the_decay_clock_as_a_snapshot_would() -> None:
    """A healthy set planned from the computed list still restarts the decay clock once per
    half-life, so an error counted later decays a whole half-life after that restart."""
    clock = Clock()
    b = balancer("in_order", clock)
    assert b._clear_orders == [[0, 1, 2, 3]]
    b.plan_indices()  # the first look starts the decay clock
    for _ in range(7):  # 70 s of healthy statements: one restart at 60 s
        clock.now += 10.0
        assert b.plan_indices() == [0, 1, 2, 3]
    clock.now += 5.0
    b.record_error(0, "down")
    clock.now += 35.0  # 50 s after the restart (110 s after the first look): the error still holds
    assert b.plan_indices() == [1, 2, 3, 0]
    assert b.error_counts()[0] == 1


def test_a_clear_set_is_remembered_until_an_error_or_a_half_life(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found clear once, the set is not read again per statement; an error counted at any
    moment, even between the look that found it clear and the remembering, is planned around
    from the next statement on."""
    clock = Clock()
    b = balancer("in_order", clock)
    looks: list[bool] = []
    original = ReplicaSetState._clear_now

    def counted(state: ReplicaSetState) -> bool:
        looks.append(original(state))
        return looks[-1]

    monkeypatch.setattr(ReplicaSetState, "_clear_now", counted)
    b.plan_indices()  # starts the decay clock
    for _ in range(5):
        clock.now += 10.0
        assert b.plan_indices() == [0, 1, 2, 3]
    assert looks.count(True) == 2  # found clear once (looked at twice), then remembered
    b.record_error(2, "down")
    assert b.plan_indices() == [0, 1, 3, 2]

    # Another thread counts an error between the look that finds the set clear and the remembering.
    monkeypatch.undo()
    b, looks[:] = balancer("in_order", clock), []
    b.plan_indices()  # starts the decay clock (not clear before it has a stamp)

    def raced(state: ReplicaSetState) -> bool:
        clear = original(state)
        if not looks:
            b.record_error(0, "down")  # just after the first look found the set clear
        looks.append(clear)
        return clear

    monkeypatch.setattr(ReplicaSetState, "_clear_now", raced)
    assert b.plan_indices() == [1, 2, 3, 0]
    assert looks == [True, False]
    monkeypatch.undo()
    for _ in range(3):
        clock.now += 1.0
        assert b.plan_indices() == [1, 2, 3, 0]


def test_the_statement_count_is_exact_across_threads_and_reads() -> None:
    stats = PoolStats()
    seen: list[int] = []

    def run() -> None:
        for i in range(2000):
            stats.count_statement()
            if i % 500 == 0:
                seen.append(stats.snapshot().statements)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.snapshot().statements == 8000
    assert stats.snapshot().statements == 8000
    assert all(0 < count <= 8000 for count in seen)


def test_the_automatic_insert_token_is_a_uuid4_hex() -> None:
    tokens = {new_insert_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        parsed = uuid.UUID(hex=token)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert parsed.hex == token



def _fields(call: Any) -> tuple[Any, ...]:
    return (call.args, call.kwargs, call.settings, call.overrides, call.attempt_settings, call.query_id,
            call.read_your_writes, call.text, call.write, call.retry_after_send, call.settings_position)


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    [
        ("insert", ("t", [[1]]), {"column_names": ["x"]}),
        ("insert", ("t",), {"data": [[1]], "settings": None}),
        ("insert_df", ("t",), {"context": "t"}),
        ("raw_insert", ("t", ["x"], b"1\n"), {}),
    ],
)
def test_an_insert_without_settings_is_prepared_as_with_empty_settings(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    # prepare_call's shortcut for an insert given no settings (only the automatic token to add)
    # must build the call its general path builds for the same insert with settings={}.
    quick = prepare_call(method, args, kwargs, None, auto_token=True, new_token=lambda: "t0")
    general = prepare_call(method, args, {**kwargs, "settings": {}}, None, auto_token=True, new_token=lambda: "t0")
    assert _fields(quick) == _fields(general)
    assert quick.kwargs["settings"] == {"insert_deduplication_token": "t0"}
    assert quick.retry_after_send


def test_a_statement_asks_no_process_id_of_the_probe_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe worker is started by a pool's first statement and checked by every later one;
    a forked child forgets it by itself (``os.register_at_fork``), so the check asks no
    ``os.getpid()``, a system call (0.9 us on this machine, several in a cold statement)."""
    from clickhouse_lb.probes import workers

    from .fakes import FakeCluster, make_pool

    if not workers.FORGETS_AT_FORK:  # pragma: no cover - Windows
        pytest.skip("no os.register_at_fork: the pid is compared")
    pool = make_pool(FakeCluster("a", "b"), health_check_interval_ms=60_000)
    try:
        pool.query("SELECT 1")  # starts the worker
        assert pool._prober is not None
        assert pool._prober.running
        asked: list[int] = []
        real = workers.os.getpid
        monkeypatch.setattr(workers.os, "getpid", lambda: asked.append(1) or real())
        for _ in range(20):
            pool.query("SELECT 1")
        assert asked == []
    finally:
        pool.close()
