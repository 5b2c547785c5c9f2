"""least_loaded: the load bookkeeping (clickhouse_lb.core.load), the power-of-two-choices order
(ordering.least_loaded_order) and their wiring into the balancer, the attempts and the settings.
Clock and random source are injected everywhere: no test waits for real time."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

import clickhouse_lb
from clickhouse_lb.config.settings import BalancingSettings, LoadBalancing, parse_balancing_settings
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.failover import StatementAttempts, run_async, run_sync
from clickhouse_lb.core.load import ReplicaLoad, decay_factor, decayed, load_scores, peak_ewma
from clickhouse_lb.core.ordering import least_loaded_order
from clickhouse_lb.core.shared_state import state_key
from clickhouse_lb.errors import ConfigurationError

from .conftest import FakeClock, replicas
from .fakes import FakeCluster, make_pool, refused


def scripted(*values: float) -> object:
    """A random source that returns ``values`` in turn, then 0.5 forever."""
    it = iter(values)
    return lambda: next(it, 0.5)


# -- the average -------------------------------------------------------------------------------


def test_first_sample_is_the_average() -> None:
    assert peak_ewma(None, 0.25, 0.0, 10.0) == 0.25


def test_a_higher_sample_replaces_the_average_at_once() -> None:
    # Peak: a replica that turns slow is avoided from its first slow answer.
    assert peak_ewma(0.01, 0.5, 0.001, 10.0) == 0.5


def test_a_lower_sample_is_blended_by_elapsed_time() -> None:
    weight = math.exp(-5.0 / 10.0)
    assert peak_ewma(1.0, 0.0, 5.0, 10.0) == pytest.approx(weight)
    # Right after the previous sample the average barely moves; long after, the sample wins.
    assert peak_ewma(1.0, 0.1, 0.001, 10.0) == pytest.approx(1.0, abs=1e-3)
    assert peak_ewma(1.0, 0.1, 100.0, 10.0) == pytest.approx(0.1, abs=1e-4)


def test_idle_decay_halves_every_decay_time_ln2() -> None:
    assert decayed(0.8, 10.0 * math.log(2), 10.0) == pytest.approx(0.4)
    assert decayed(0.8, 0.0, 10.0) == 0.8
    assert decayed(0.8, -1.0, 10.0) == 0.8  # a clock that went back changes nothing


@given(
    elapsed=st.one_of(st.floats(min_value=-1.0, max_value=1e6), st.floats(min_value=0.0, max_value=0.2)),
    decay_time=st.floats(min_value=0.001, max_value=1000.0),
)
def test_the_decay_factor_is_exp_to_within_float_noise(elapsed: float, decay_time: float) -> None:
    """The series used for short gaps (no libm table read per statement) agrees with exp on
    both sides of the switch, and a clock that went back decays nothing."""
    expected = math.exp(-elapsed / decay_time) if elapsed > 0 else 1.0
    assert decay_factor(elapsed, decay_time) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_finishing_an_attempt_blends_as_the_pure_functions_do(clock: FakeClock) -> None:
    """finish() inlines decayed(), peak_ewma() and decay_factor(): the same average, for gaps on
    either side of the series' switch."""
    load = ReplicaLoad(1, decay_time=10.0, clock=clock)
    expected: float | None = None
    stamp = clock()
    for gap, latency in [(0.0, 0.5), (0.02, 0.1), (0.5, 0.05), (3.0, 0.2), (0.001, 0.01)]:
        clock.advance(gap)
        started = load.start(0)
        clock.advance(latency)
        load.finish(0, started)
        now = clock()
        expected = latency if expected is None else peak_ewma(decayed(expected, now - stamp, 10.0), latency,
                                                               now - stamp, 10.0)
        stamp = now
        assert load.snapshot()[0].latency_ewma == pytest.approx(expected, rel=1e-12)


def test_scores_weight_in_flight_by_the_average() -> None:
    assert load_scores([0, 2, 1], [0.1, 0.1, 0.3]) == pytest.approx([0.1, 0.3, 0.6])


def test_no_history_anywhere_is_least_in_flight() -> None:
    assert load_scores([3, 0, 1], [None, None, None]) == [3.0, 0.0, 1.0]


def test_cold_replica_is_free_when_idle_and_priced_at_the_mean_when_busy() -> None:
    # Idle and never answered: score 0, tried at once.
    assert load_scores([0, 0, 0], [None, 0.1, 0.3])[0] == 0.0
    # Two in flight and still no answer: priced at the others' mean (0.2) * 3, so an idle warm
    # replica (0.1) beats it and the cold one is not flooded before its first answer.
    assert load_scores([2, 0, 0], [None, 0.1, 0.3]) == pytest.approx([0.6, 0.1, 0.3])


# -- the bookkeeping ---------------------------------------------------------------------------


def test_in_flight_and_latency_follow_start_and_finish(clock: FakeClock) -> None:
    load = ReplicaLoad(2, decay_time=10.0, clock=clock)
    first = load.start(0)
    second = load.start(0)
    assert [s.in_flight for s in load.snapshot()] == [2, 0]
    clock.advance(0.2)
    load.finish(0, first)
    clock.advance(0.1)
    load.finish(0, second)  # 0.3 s: above the average, so it becomes the average
    snap = load.snapshot()
    assert snap[0].in_flight == 0
    assert snap[0].latency_ewma == pytest.approx(0.3)
    assert snap[1].in_flight == 0
    assert snap[1].latency_ewma is None


def test_reads_change_nothing(clock: FakeClock) -> None:
    load = ReplicaLoad(2, decay_time=10.0, clock=clock)
    started = load.start(1)
    clock.advance(0.5)
    load.finish(1, started)
    clock.advance(3.0)
    before = (load.snapshot(), load.scores())
    for _ in range(5):
        load.snapshot()
        load.scores()
    assert (load.snapshot(), load.scores()) == before
    # The average decays while idle, as a read shows it.
    assert before[0][1].latency_ewma == pytest.approx(0.5 * math.exp(-0.3))


def test_decay_time_must_be_positive() -> None:
    with pytest.raises(ValueError, match="decay_time"):
        ReplicaLoad(1, decay_time=0)


# -- the order ---------------------------------------------------------------------------------


def test_picks_the_less_loaded_of_two_random_replicas() -> None:
    # One draw, 0.2 * 3 = 0.6: first index 0, second (0 + 1 + int(0.6 * 2)) % 3 = 2: replica 2
    # (score 1) beats replica 0 (score 5).
    order = least_loaded_order([0, 0, 0], [0, 0, 0], 0, [5.0, 3.0, 1.0], scripted(0.2))  # type: ignore[arg-type]
    assert order[0] == 2
    # The others follow by load score.
    assert order == [2, 1, 0]


def test_power_of_two_choices_shares() -> None:
    # Three equal-rank replicas: the least loaded wins every pair it is in (2/3 of the
    # statements), the middle one 1/3, the most loaded one never goes first.
    rng = random.Random(3)
    firsts = Counter(least_loaded_order([0, 0, 0], [0, 0, 0], 0, [1.0, 2.0, 3.0], rng.random)[0] for _ in range(6000))
    assert firsts[2] == 0
    assert 3700 < firsts[0] < 4300
    assert 1700 < firsts[1] < 2300


def test_exact_ties_go_to_the_first_drawn_so_stay_uniform() -> None:
    rng = random.Random(5)
    firsts = Counter(least_loaded_order([0] * 4, [0] * 4, 0, [1.0] * 4, rng.random)[0] for _ in range(8000))
    assert set(firsts) == {0, 1, 2, 3}
    assert all(1700 < count < 2300 for count in firsts.values())


def test_errors_come_before_load() -> None:
    # Replica 0 is idle but has one more error: it is never first, and it is the last candidate.
    rng = random.Random(1)
    for _ in range(500):
        order = least_loaded_order([1, 0, 0], [0, 0, 0], 0, [0.0, 50.0, 90.0], rng.random)
        assert order[0] in (1, 2)
        assert order[-1] == 0


def test_max_ignored_errors_puts_replicas_back_in_the_draw() -> None:
    order = least_loaded_order([1, 0], [0, 0], 1, [0.0, 50.0], scripted(0.0, 0.0))  # type: ignore[arg-type]
    assert order[0] == 0


def test_configured_priority_comes_before_load() -> None:
    rng = random.Random(2)
    for _ in range(200):
        order = least_loaded_order([0, 0, 0], [1, 0, 1], 0, [0.0, 99.0, 0.0], rng.random)
        assert order[0] == 1


def test_single_leader_and_single_replica() -> None:
    assert least_loaded_order([0, 2, 1], [0, 0, 0], 0, [9.0, 0.0, 0.0], random.random) == [0, 2, 1]
    assert least_loaded_order([0], [0], 0, [0.0], random.random) == [0]


# -- the balancer, attempts and pools ----------------------------------------------------------


def _balancer(clock: FakeClock, n: int = 3, seed: int = 1, **settings: object) -> Balancer:
    values = {"load_balancing": "least_loaded", **settings}
    return Balancer(
        replicas(*[f"ch-{i}" for i in range(1, n + 1)]),
        parse_balancing_settings(values),
        clock=clock,
        random=random.Random(seed).random,
    )


def _run(balancer: Balancer, clock: FakeClock, index: int, seconds: float) -> None:
    attempts = StatementAttempts(balancer, [index], operation="query", retry_after_send=True)

    def call(i: int) -> None:
        clock.advance(seconds)

    run_sync(attempts, call)


def test_a_slow_replica_loses_its_share_and_wins_it_back_once_fast_again(clock: FakeClock) -> None:
    """Sequential statements on a simulated clock: replica 3 answers in 0.5 s, the others in
    0.01 s; then replica 3 is fast again. Its idle average decays until it is tried again, and
    its next (fast) answer brings its share back."""
    balancer = _balancer(clock, least_loaded_decay_time=2.0)
    latency = [0.01, 0.01, 0.5]

    def shares(statements: int) -> list[int]:
        served = []
        for _ in range(statements):
            index = balancer.plan_indices()[0]
            _run(balancer, clock, index, latency[index])
            clock.advance(0.01)  # the application's own work between statements
            served.append(index)
        return served

    slow_phase = shares(500)
    assert slow_phase.count(2) < 15  # cold start, then about once per 4 decay times
    latency[2] = 0.01
    recovery = shares(1500)
    assert recovery[-500:].count(2) > 100  # about a third once recovered


def test_a_cold_replica_is_tried_without_starving_the_others(clock: FakeClock) -> None:
    balancer = _balancer(clock)
    _run(balancer, clock, 0, 0.05)
    _run(balancer, clock, 1, 0.05)
    # ch-3 never answered: idle, it wins every pair it is drawn in.
    firsts = Counter(balancer.plan_indices()[0] for _ in range(600))
    assert 320 < firsts[2] < 480
    # With statements in flight there and still no answer, it is priced at the mean of the
    # others: idle warm replicas go first, it is not flooded.
    load = balancer.state.replica_load
    load.start(2)
    load.start(2)
    firsts = Counter(balancer.plan_indices()[0] for _ in range(600))
    assert firsts[2] == 0
    # ch-1's average is the older, so the more decayed: it wins its pairs (2/3), ch-2 gets 1/3.
    assert firsts[0] > 320
    assert firsts[1] > 120


def test_plan_is_a_look_only(clock: FakeClock) -> None:
    balancer = _balancer(clock)
    _run(balancer, clock, 0, 0.2)
    before = balancer.statuses()
    plans = {tuple(balancer.plan()) for _ in range(50)}
    assert balancer.statuses() == before
    assert all(len(p) == 3 for p in plans)


def test_attempts_count_in_flight_and_latency_even_when_they_fail(clock: FakeClock) -> None:
    balancer = _balancer(clock)
    seen: list[int] = []

    def call(i: int) -> str:
        seen.append(balancer.statuses()[i].in_flight)
        clock.advance(0.3)
        if i == order[0]:
            raise refused()
        return "ok"

    order = balancer.plan_indices()
    attempts = StatementAttempts(balancer, order, operation="query", retry_after_send=True)
    assert run_sync(attempts, call) == "ok"
    assert seen == [1, 1]
    statuses = balancer.statuses()
    assert [s.in_flight for s in statuses] == [0, 0, 0]
    # 0.3 s, decayed over the 0.3 s the next attempt took (decay time 10 s).
    assert statuses[order[0]].latency_ewma == pytest.approx(0.3 * math.exp(-0.03))
    assert statuses[order[0]].errors_count == 1
    # After the failure the replica with the error is last, whatever its load.
    assert balancer.plan_indices()[-1] == order[0]


def test_an_interrupted_attempt_leaves_the_in_flight_count(clock: FakeClock) -> None:
    balancer = _balancer(clock)

    def call(i: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sync(StatementAttempts(balancer, [1, 0], operation="query", retry_after_send=True), call)
    status = balancer.statuses()[1]
    assert status.in_flight == 0
    assert status.errors_count == 0


def test_a_cancelled_async_attempt_leaves_the_in_flight_count(clock: FakeClock) -> None:
    balancer = _balancer(clock)

    async def call(i: int) -> None:
        raise asyncio.CancelledError

    async def main() -> None:
        await run_async(StatementAttempts(balancer, [2, 0], operation="query", retry_after_send=True), call)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    status = balancer.statuses()[2]
    assert status.in_flight == 0
    assert status.errors_count == 0


def test_every_strategy_keeps_the_load_so_a_statement_can_switch(clock: FakeClock) -> None:
    cluster = FakeCluster("a", "b", "c")
    with make_pool(cluster, clock=clock, load_balancing="in_order") as pool:
        pool.query("SELECT 1")
        assert pool.replicas[0].latency_ewma is not None
        assert [r.in_flight for r in pool.replicas] == [0, 0, 0]
        pool.query("SELECT 1", settings={"load_balancing": "LEAST_LOADED"})
        assert len(cluster["a"].calls) + len(cluster["b"].calls) + len(cluster["c"].calls) == 2
        # The balancing setting is taken out of the settings sent to the server.
        for replica in cluster.replicas.values():
            for _, _, kwargs in replica.calls:
                assert "load_balancing" not in (kwargs.get("settings") or {})


# -- settings ----------------------------------------------------------------------------------


def test_least_loaded_is_accepted_everywhere_a_strategy_is() -> None:
    assert LoadBalancing.parse(" Least_Loaded ") is LoadBalancing.LEAST_LOADED
    pool = clickhouse_lb.get_pool(["a:8123", "b:8123"], load_balancing="least_loaded", share_state=False,
                                  connect_on_create=False)
    assert pool.settings.load_balancing is LoadBalancing.LEAST_LOADED
    assert sorted(pool.plan()) == ["a:8123", "b:8123"]
    assert sorted(pool.plan("least_loaded")) == ["a:8123", "b:8123"]
    pool.close()
    dsn = "clickhouse://u@a:8123,b:8123/db?load_balancing=least_loaded&least_loaded_decay_time=2.5"
    pool = clickhouse_lb.get_pool(dsn=dsn, share_state=False, connect_on_create=False)
    assert pool.settings.least_loaded_decay_time == 2.5
    assert pool.balancer.state.replica_load.decay_time == 2.5
    pool.close()


@pytest.mark.parametrize("value", [0, "0", -1, "soon"])
def test_bad_decay_time_names_the_value(value: object) -> None:
    with pytest.raises(ConfigurationError, match="least_loaded_decay_time"):
        parse_balancing_settings({"least_loaded_decay_time": value})


def test_unknown_strategy_lists_least_loaded_among_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="least_loaded"):
        LoadBalancing.parse("least_busy")


def test_pools_with_another_decay_time_do_not_share_load() -> None:
    from clickhouse_lb.config.pool_config import resolve_pool_config

    def key(decay: float) -> object:
        config = resolve_pool_config(
            ["a:8123"], dsn=None, balancing={"least_loaded_decay_time": decay}, client_options={},
            valid_client_options=frozenset(),
        )
        return state_key(config)

    assert key(2.0) != key(3.0)
    assert BalancingSettings().least_loaded_decay_time == 10.0


def test_order_keys_order_like_the_decayed_scores(clock: FakeClock) -> None:
    """The plan's cheap keys (logarithms, no exp per replica) must rank exactly like the scores."""
    rng = random.Random(11)
    load = ReplicaLoad(6, decay_time=3.0, clock=clock)
    assert load.order_keys() == load.scores()  # cold: the scores themselves
    for _ in range(400):
        index = rng.randrange(6)
        started = load.start(index)
        clock.advance(rng.random() * 0.3)
        if rng.random() < 0.8:
            load.finish(index, started)
        clock.advance(rng.random() * 2)
        scores, keys = load.scores(), load.order_keys()
        if None not in [s.latency_ewma for s in load.snapshot()]:
            by_score = sorted(range(6), key=lambda i: (scores[i], i))
            by_key = sorted(range(6), key=lambda i: (keys[i], i))
            assert by_key == by_score


def test_sqlalchemy_url_takes_least_loaded_and_its_decay_time() -> None:
    from sqlalchemy.engine import make_url

    from clickhouse_lb.sqlalchemy.url import engine_args_from_url

    query = "host=a:8123&host=b:8123&load_balancing=least_loaded&least_loaded_decay_time=3"
    settings = engine_args_from_url(make_url(f"clickhousedb+lb://u:p@/db?{query}")).config.settings
    assert settings.load_balancing is LoadBalancing.LEAST_LOADED
    assert settings.least_loaded_decay_time == 3.0
    with pytest.raises(ConfigurationError, match="least_loaded_decay_time"):
        engine_args_from_url(make_url("clickhousedb+lb://u:p@/db?host=a:8123&least_loaded_decay=3"))


def test_the_demo_can_show_every_strategy() -> None:
    from clickhouse_lb.cli._demo import DESCRIPTIONS

    assert set(DESCRIPTIONS) == set(LoadBalancing)
