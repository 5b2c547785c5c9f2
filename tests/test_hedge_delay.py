"""The automatic hedge delay (receive_data_timeout_ms="auto"): learnt from the replicas that
answer fast, per replica, with a cold start; decided on a fake clock, through the real race
(:func:`clickhouse_lb.core.race.run_attempt`) and the real statement plan."""

from __future__ import annotations

import math
import random

import pytest

from clickhouse_lb.config.attempt_settings import AttemptSettings
from clickhouse_lb.config.hedging import HedgePolicy
from clickhouse_lb.config.liveness import LivenessPolicy
from clickhouse_lb.config.timeouts import Timeouts
from clickhouse_lb.core._statements import prepare_call
from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.deadline import Deadline
from clickhouse_lb.core.hedging import AUTO_COLD, AUTO_EXPLORE, AUTO_HORIZON, AUTO_MIN, LatencyWindow, adaptive_delay

from .conftest import FakeClock
from .test_watch import FakeDriver

ADDRESSES = ("r0:8123", "r1:8123", "r2:8123")


def test_cold_start_then_one_replica_then_the_fastest_of_the_set(clock: FakeClock) -> None:
    window = LatencyWindow(clock=clock)
    assert window.delay() == AUTO_COLD  # nothing known: ClickHouse's receive_data_timeout_ms default
    window.answered("r0", 1.5)
    assert window.delay() == AUTO_EXPLORE  # one replica known, 1.5 s: worth a look at another
    window.answered("r1", 0.03)
    assert window.delay() == pytest.approx(0.09)  # 3x the fastest replica's, not the slow one's
    window.answered("r2", 0.001)
    assert window.delay() == AUTO_MIN
    clock.advance(AUTO_HORIZON + 1)
    assert window.delay() == AUTO_COLD  # an idle minute: forgotten


def test_a_replica_that_ran_unanswered_is_at_least_that_slow(clock: FakeClock) -> None:
    window = LatencyWindow(clock=clock)
    window.answered("r0", 0.02)
    window.answered("r1", 0.02)
    window.unanswered("r1", 0.5)  # lost a race after 0.5 s
    window.unanswered("r0", 0.001)  # a lower bound below the figure says nothing
    assert window.latencies() == {"r0": pytest.approx(0.02), "r1": pytest.approx(0.5)}
    window.unanswered("r2", 0.3)  # known (it was looked at), but it never answered
    assert window.latencies()["r2"] is None
    assert adaptive_delay([0.5], 2) == pytest.approx(1.5)  # no cap at 2 s: slow clusters are not hedged always
    assert adaptive_delay([1.5], 1) == AUTO_EXPLORE


# -- statements through the real race, on a fake clock ------------------------------------------


def plan(window: LatencyWindow, order: tuple[int, ...], clock: FakeClock) -> StatementPlan:
    statement = prepare_call("query", ("SELECT 1",), {}, 1, auto_token=True)
    settings = AttemptSettings(Timeouts(connect=1.0, receive=None), LivenessPolicy(check_after=None),
                               HedgePolicy(enabled=True, delay=None))
    return StatementPlan(
        settings=settings, deadline=Deadline(None, clock=clock), addresses=ADDRESSES, statement=statement,
        window=window, count_failure=lambda index, exc: None, count_slowdown=lambda index: None,
        hedge_candidate=lambda running: next((i for i in order if i not in running), None), clock=clock,
    )


def read(clock: FakeClock, window: LatencyWindow, latencies: dict[int, float], order: tuple[int, ...]) -> float:
    """One read, first on ``order[0]``, hedged to the next of ``order``: its duration."""
    driver = FakeDriver(clock, {i: ("answer", s) for i, s in latencies.items()}, dict.fromkeys(latencies, True))
    started = clock.now
    driver.drive(plan(window, order, clock).spec(order[0]))
    return clock.now - started


def test_a_slow_replica_is_hedged_from_the_second_statement(clock: FakeClock) -> None:
    # The case: in_order, replica 0 answers 1.5 s late. Before, every read took 1.5 s:
    # the adaptive delay learnt from the slow answers themselves. The order here never moves
    # the slow replica back (as round_robin would keep coming to it): each read is hedged.
    window = LatencyWindow(clock=clock)
    durations = [read(clock, window, {0: 1.5, 1: 0.01, 2: 0.012}, (0, 1, 2)) for _ in range(20)]
    assert durations[0] == pytest.approx(1.5)  # the first: nothing known, AUTO_COLD (2 s)
    assert durations[1] < 0.5  # the second: one replica known, hedged after AUTO_EXPLORE
    assert max(durations[2:]) < 0.1  # then after 3x the fast replica's latency (at least 50 ms)


@pytest.mark.parametrize("order_of", ["in_order", "round_robin"])
@pytest.mark.parametrize("median", [0.005, 0.05])
def test_a_healthy_cluster_with_jitter_is_hedged_at_most_3_times_per_100_statements(
    clock: FakeClock, order_of: str, median: float
) -> None:
    # Lognormal latencies, sigma 0.5 (p99 about 3.2x the median: a healthy cluster's jitter).
    # The failure this separates from: the delay too close to the usual latency, hedging a
    # tenth of the reads or more (the sigma-0.5 p90 is 1.9x the median).
    rng = random.Random(24)
    window = LatencyWindow(clock=clock)
    hedged = 0
    statements = 1000
    for i in range(statements):
        latencies = {r: median * math.exp(rng.gauss(0.0, 0.5)) for r in range(3)}
        order = (0, 1, 2) if order_of == "in_order" else tuple((i + k) % 3 for k in range(3))
        driver = FakeDriver(clock, {r: ("answer", s) for r, s in latencies.items()}, dict.fromkeys(latencies, True))
        driver.drive(plan(window, order, clock).spec(order[0]))
        hedged += len(driver.runs) - 1
        clock.advance(0.001)  # the application's own work between statements
    assert hedged <= 3 * statements / 100
