"""The retry budget (clickhouse_lb.core.retry_budget): its window, floor and ratio on a fake
clock, and what a spent budget does to a statement: no hedge, no re-send after a receive timeout, a
failover that would send the request again fails with RetryBudgetExhaustedError, a failover
after a refused connection still happens."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from clickhouse_lb.config.hedging import HedgePolicy
from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.retry_budget import RetryBudgetSettings
from clickhouse_lb.core._statements import prepare_call
from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.hedging import LatencyWindow
from clickhouse_lb.core.policy import NO_DEADLINE
from clickhouse_lb.core.retry_budget import RetryBudget
from clickhouse_lb.core.watch import AttemptWatch
from clickhouse_lb.errors import (
    AllReplicasUnavailableError,
    AttemptAbandonedError,
    ConfigurationError,
    RetryBudgetExhaustedError,
)

from .conftest import FakeClock
from .fakes import FakeCluster, make_pool, refused, reset_after_send
from .test_aio import AsyncFakeCluster
from .test_aio import make_pool as make_async_pool
from .test_watch import FakeDriver

#: No extra request allowed at all.
SPENT = {"retry_budget_ratio": 0, "retry_budget_min_per_second": 0}


def counts(cluster: FakeCluster) -> dict[str, int]:
    return {host: len(replica.calls) for host, replica in cluster.replicas.items()}


def budget(clock: FakeClock, *, ratio: float = 0.0, floor: float = 0.0, window_ms: int = 1000) -> RetryBudget:
    return RetryBudget(RetryBudgetSettings(ratio, floor, window_ms), clock=clock)


# -- the budget ------------------------------------------------------------------------------


def test_the_floor_allows_min_per_second_times_the_window(clock: FakeClock) -> None:
    spend = budget(clock, floor=2.0, window_ms=1000)
    assert [spend.try_spend() for _ in range(3)] == [True, True, False]
    assert not spend.available()


def test_each_statement_adds_its_ratio(clock: FakeClock) -> None:
    spend = budget(clock, ratio=0.5)
    for _ in range(10):
        spend.record_statement()
    assert sum(spend.try_spend() for _ in range(20)) == 5
    for _ in range(2):
        spend.record_statement()
    assert spend.try_spend()
    assert not spend.try_spend()


def test_the_window_slides(clock: FakeClock) -> None:
    spend = budget(clock, ratio=0.5, window_ms=1000)
    for _ in range(4):
        spend.record_statement()
    assert spend.try_spend()
    assert spend.try_spend()
    assert not spend.try_spend()
    clock.advance(0.5)
    assert not spend.try_spend()  # still within the window: statements and spends alike
    clock.advance(0.6)
    assert not spend.try_spend()  # the statements aged out with the spends: nothing to spend
    for _ in range(2):
        spend.record_statement()
    assert spend.try_spend()
    assert not spend.try_spend()


def test_a_window_of_zero_means_no_budget(clock: FakeClock) -> None:
    spend = budget(clock, window_ms=0)
    assert not spend.enabled
    assert all(spend.try_spend() for _ in range(1000))


# -- settings --------------------------------------------------------------------------------


def _config(**options: Any) -> Any:
    return resolve_pool_config(["a:8123"], dsn=None, balancing={}, client_options=options,
                               valid_client_options=sync_client_option_names())


def test_settings_default_and_come_from_keywords_or_a_dsn() -> None:
    assert _config().retry_budget == RetryBudgetSettings(0.1, 10.0, 10_000)
    assert _config(retry_budget_ratio=0.25, retry_budget_window_ms="2000").retry_budget == RetryBudgetSettings(
        0.25, 10.0, 2000
    )
    dsn = resolve_pool_config(None, dsn="clickhouse://a:8123/?retry_budget_min_per_second=0.5", balancing={},
                              client_options={}, valid_client_options=sync_client_option_names())
    assert dsn.retry_budget.min_per_second == 0.5


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("retry_budget_ratio", 1.5, "0..1"),
        ("retry_budget_ratio", "lots", "expected a number"),
        ("retry_budget_min_per_second", -1, "0..1e+06"),
        ("retry_budget_window_ms", 10**10, "ms (0: no budget)"),
    ],
)
def test_bad_settings_name_the_value_and_the_range(name: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _config(**{name: value})
    assert name in str(caught.value)
    assert repr(value) in str(caught.value)
    assert expected in str(caught.value)


# -- what a spent budget does ----------------------------------------------------------------


def _hedged_plan(clock: FakeClock, spend: RetryBudget) -> StatementPlan:
    pool = make_pool(FakeCluster("a", "b"))
    settings = dataclasses.replace(pool.config.attempts, hedging=HedgePolicy(enabled=True, delay=0.05))
    return StatementPlan(
        settings=settings, deadline=NO_DEADLINE, addresses=("r0:8123", "r1:8123"),
        statement=prepare_call("query", ("SELECT 1",), {}, None, auto_token=False), window=LatencyWindow(),
        count_failure=lambda index, exc: None, count_slowdown=lambda index: None,
        hedge_candidate=lambda running: 1 if 1 not in running else None, clock=clock, budget=spend,
    )


def test_a_hedge_gets_the_ratio_and_one_request_but_not_the_floor(clock: FakeClock) -> None:
    # Failovers may use the floor (10 per second by default): hedges, speculative, may not.
    spend = budget(clock, ratio=0.1, floor=10.0)
    for _ in range(10):
        spend.record_statement()
    assert spend.try_spend(hedge=True)  # 0.1 * 10 statements + 1
    assert spend.try_spend(hedge=True)
    assert not spend.try_spend(hedge=True)
    assert spend.try_spend()  # a failover still has the floor


def test_a_spent_budget_launches_no_hedge(clock: FakeClock) -> None:
    behaviour = {0: ("answer", 2.0), 1: ("answer", 0.01)}
    driver = FakeDriver(clock, behaviour, {0: True, 1: True})
    assert driver.drive(_hedged_plan(clock, budget(clock, floor=1.0)).spec(0)) == (1, "rows@1")  # hedged
    spent = FakeDriver(clock, behaviour, {0: True, 1: True})
    assert spent.drive(_hedged_plan(clock, budget(clock)).spec(0)) == (0, "rows@0")  # waited for replica 0
    assert [entry for entry in spent.log if entry.startswith("launch")] == ["launch 0"]


def test_a_read_shown_hung_is_given_up_whatever_the_budget(clock: FakeClock) -> None:
    # A failed check while the process ran is evidence the replica serves nothing: waiting on it
    # would only make the statement wait out its receive timeout.
    assert AttemptWatch(0.0, retry_safe=True, budget=budget(clock)).checked(False, 0.25) is True


def test_a_failover_from_a_hung_replica_is_not_charged() -> None:
    cluster = FakeCluster("a", "b")
    cluster["a"].outcomes = [lambda: AttemptAbandonedError("a:8123", "hung", "no answer to /ping"), "ok"]
    pool = make_pool(cluster, load_balancing="in_order", **SPENT)
    pool.query("SELECT 1")  # moved to b, although the budget allows no re-send
    assert counts(cluster) == {"a": 1, "b": 1}


def test_a_failover_after_the_request_was_sent_fails_with_the_budget_error() -> None:
    cluster = FakeCluster("a", "b")
    cluster["a"].outcomes = [reset_after_send]
    pool = make_pool(cluster, load_balancing="in_order", **SPENT)
    with pytest.raises(RetryBudgetExhaustedError) as caught:
        pool.query("SELECT 1")
    assert isinstance(caught.value, AllReplicasUnavailableError)
    assert "retry_budget_ratio" in str(caught.value)
    assert "retry_budget_min_per_second" in str(caught.value)
    assert counts(cluster) == {"a": 1, "b": 0}  # not sent again


def test_with_budget_left_the_same_failover_happens() -> None:
    cluster = FakeCluster("a", "b")
    cluster["a"].outcomes = [reset_after_send, "ok"]
    pool = make_pool(cluster, load_balancing="in_order")
    pool.query("SELECT 1")
    assert counts(cluster) == {"a": 1, "b": 1}


def test_a_refused_connection_fails_over_whatever_the_budget() -> None:
    cluster = FakeCluster("a", "b")
    cluster["a"].outcomes = [refused]
    pool = make_pool(cluster, load_balancing="in_order", **SPENT)
    for _ in range(5):
        pool.query("SELECT 1")  # nothing reached replica a: the failover costs the servers nothing
    assert counts(cluster)["b"] == 5


async def test_the_async_pool_keeps_the_same_budget() -> None:
    cluster = AsyncFakeCluster("a", "b")
    cluster["a"].outcomes = [reset_after_send]
    pool = make_async_pool(cluster, load_balancing="in_order", **SPENT)
    with pytest.raises(RetryBudgetExhaustedError):
        await pool.query("SELECT 1")
    assert cluster.counts() == {"a": 1, "b": 0}


def test_pools_that_share_their_state_share_one_budget_per_setting() -> None:
    from clickhouse_lb.core.balancer import new_replica_set_state
    from clickhouse_lb.core.shared_state import SharedReplicaSet

    shared = SharedReplicaSet(new_replica_set_state(2, _config().settings))
    settings = RetryBudgetSettings()
    first = RetryBudget.of_pool(settings, shared)
    assert RetryBudget.of_pool(settings, shared) is first
    assert RetryBudget.of_pool(RetryBudgetSettings(retry_budget_ratio=0.5), shared) is not first
    assert RetryBudget.of_pool(settings, None) is not first  # share_state=False: the pool's own
