"""The hung/slow-replica decisions inside the failover loop and the pool, on fake replicas:
the deadline (StatementTimeoutError, the backoff cut), the attempt settings a statement gives
(taken out before the server sees them), where a hedge goes, which replica a failure is
counted against."""

from __future__ import annotations

import pytest

from clickhouse_lb.core._statements import prepare_call
from clickhouse_lb.core.failover import StatementAttempts, run_sync
from clickhouse_lb.core.race import RaceFailure
from clickhouse_lb.errors import (
    AllReplicasUnavailableError,
    AttemptAbandonedError,
    StatementTimeoutError,
    WriteOutcomeUnknownError,
)

from .fakes import FakeCluster, make_pool, refused


@pytest.fixture
def abc() -> FakeCluster:
    return FakeCluster("a", "b", "c")


def test_the_deadline_ends_a_statement_in_statement_timeout_error(abc: FakeCluster) -> None:
    for replica in abc.replicas.values():
        replica.outcomes = [refused]
    pool = make_pool(abc, failover_timeout=0.000001, connections_with_failover_max_tries=100)
    with pytest.raises(StatementTimeoutError) as caught:
        pool.query("SELECT 1")
    assert isinstance(caught.value, AllReplicasUnavailableError)
    assert caught.value.timeout == pytest.approx(0.000001)
    assert not caught.value.may_have_been_applied  # a read
    assert "failover_timeout=1e-06s" in str(caught.value)


def test_without_a_deadline_exhaustion_is_the_plain_error(abc: FakeCluster) -> None:
    for replica in abc.replicas.values():
        replica.outcomes = [refused]
    pool = make_pool(abc, connections_with_failover_max_tries=1)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        pool.query("SELECT 1")
    assert not isinstance(caught.value, StatementTimeoutError)


def test_backoff_is_cut_at_the_deadline(abc: FakeCluster) -> None:
    pool = make_pool(abc, failover_backoff_ms=8000, failover_timeout=0.5, load_balancing="in_order")
    attempts = StatementAttempts(pool.balancer, [0, 1, 2], operation="query", retry_after_send=True)
    for index in (0, 1, 2):
        attempts.failed(index, refused())
    assert 0.0 <= attempts.wait(None) <= 0.5  # type: ignore[arg-type]  # a pass is over: backoff, cut


def test_a_hedge_goes_to_the_next_replica_of_the_schedule_not_running(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    attempts = StatementAttempts(pool.balancer, [0, 1, 2], operation="query", retry_after_send=True)
    assert attempts.hedge_candidate({0}) == 1
    assert attempts.hedge_candidate({0, 1}) == 2
    attempts.failed(0, refused())
    assert attempts.hedge_candidate({1}) == 2


def test_a_failure_is_counted_against_the_replica_its_run_was_on(abc: FakeCluster) -> None:
    """The last run of a hedged attempt may be the hedge: its replica gets the error, and the
    statement fails over past it."""
    pool = make_pool(abc, load_balancing="in_order")
    attempts = StatementAttempts(pool.balancer, [0, 1, 2], operation="query", retry_after_send=True)
    calls: list[int] = []

    def attempt(index: int) -> str:
        calls.append(index)
        if index == 0:
            attempts.failed(0, refused())  # the first run failed while the hedge ran on b
            raise RaceFailure(1, AttemptAbandonedError("b:8123", "hung", "no answer to /ping"))
        return f"rows@{index}"

    assert run_sync(attempts, attempt) == "rows@2"
    assert calls == [0, 2]
    errors = {status.host: status.errors_count for status in pool.replicas}
    assert errors == {"a": 1, "b": 1, "c": 0}


def test_attempt_settings_of_a_statement_never_reach_the_server(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    settings = {"receive_timeout": 0.5, "send_timeout": 1, "connect_timeout_with_failover_ms": 50,
                "use_hedged_requests": 1, "receive_data_timeout_ms": "auto", "max_threads": 2}
    assert pool.query("SELECT 1", settings=settings) == "query@a"
    sent = dict(abc["a"].calls[0][2]["settings"])
    # A hedged read carries a query id of the pool's, so that a lost run can be killed.
    assert sent.pop("query_id").startswith("clickhouse-lb-")
    assert sent == {"max_threads": 2}


def test_pool_timeouts_are_given_to_each_client(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", send_receive_timeout=0.5,
                     connect_timeout_with_failover_ms=150)
    pool.query("SELECT 1")
    options = abc.clients[0].options
    assert options["connect_timeout"] == 1  # whole seconds at construction ...
    assert options["send_receive_timeout"] == 1
    assert pool.config.attempts.timeouts.receive == 0.5  # ... the exact values kept by the pool
    assert pool.config.attempts.timeouts.connect == 0.15


def test_hedging_settings_are_validated_at_get_pool(abc: FakeCluster) -> None:
    from clickhouse_lb.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="receive_data_timeout_ms 'fast'"):
        make_pool(abc, use_hedged_requests=1, receive_data_timeout_ms="fast")
    pool = make_pool(abc, use_hedged_requests="1", receive_data_timeout_ms=120)
    assert pool.config.attempts.hedging.enabled
    assert pool.config.attempts.hedging.delay == pytest.approx(0.12)
    assert pool.hedged_requests == 0


def _abandoned(address: str) -> AttemptAbandonedError:
    return AttemptAbandonedError(address, "hung", "no answer to /ping", write=True)


def test_a_hung_write_that_is_not_repeatable_raises_write_outcome_unknown(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    attempts = StatementAttempts(pool.balancer, [0, 1, 2], operation="command", retry_after_send=False, write=True)
    calls: list[int] = []

    def attempt(index: int) -> str:
        calls.append(index)
        raise _abandoned(pool.balancer.addresses[index])

    with pytest.raises(WriteOutcomeUnknownError) as caught:
        run_sync(attempts, attempt)
    assert calls == [0]  # not repeated elsewhere
    assert caught.value.may_have_been_applied
    assert isinstance(caught.value.__cause__, AttemptAbandonedError)
    assert caught.value.__cause__.may_have_been_applied


def test_a_hung_idempotent_write_fails_over_like_a_read(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    call = prepare_call("command", ("INSERT INTO t SELECT 1",), {"settings": {"idempotent": True}}, None,
                        auto_token=False)
    assert call.write
    assert not call.read_only  # never hedged
    assert call.retry_after_send
    attempts = StatementAttempts(pool.balancer, [0, 1, 2], operation="command",
                                 retry_after_send=call.retry_after_send, write=call.write)

    def attempt(index: int) -> str:
        if index == 0:
            raise _abandoned(pool.balancer.addresses[0])
        return f"done@{index}"

    assert run_sync(attempts, attempt) == "done@1"


def test_a_write_past_its_deadline_may_have_been_applied(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", failover_timeout=0.000001)
    attempts = StatementAttempts(pool.balancer, [0, 1, 2], operation="command", retry_after_send=False, write=True)

    def attempt(index: int) -> str:
        raise AttemptAbandonedError(pool.balancer.addresses[index], "deadline", "failover_timeout ran out", write=True)

    with pytest.raises(StatementTimeoutError) as caught:
        run_sync(attempts, attempt)
    assert caught.value.may_have_been_applied
    assert "may have been applied" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [("liveness_ping_timeout_ms", 10**9), ("liveness_check_after_ms", 0.5), ("receive_data_timeout_ms", 10**12)],
)
def test_hung_replica_settings_are_bounded_by_the_limits_table(abc: FakeCluster, name: str, value: float) -> None:
    from clickhouse_lb.config._values import LIMITS
    from clickhouse_lb.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=name) as caught:
        make_pool(abc, **{name: value})
    assert LIMITS[name].describe() in str(caught.value)


def test_a_hedged_read_on_worker_threads_is_the_pools_for_driver_logging(abc: FakeCluster) -> None:
    """A hedged read's runs happen on worker threads, which do not inherit the statement's
    context: each must mark itself as the pool's attempt, or clickhouse-connect's per-attempt
    warnings would be printed for failures the pool handles."""
    from clickhouse_lb.core._driver_logs import _IN_POOL_ATTEMPT

    seen: list[bool] = []

    def failing() -> BaseException:
        seen.append(_IN_POOL_ATTEMPT.get())
        return refused()

    abc["a"].outcomes = [failing, "ok"]
    pool = make_pool(abc, load_balancing="in_order", use_hedged_requests=1)
    assert pool.query("SELECT 1") == "query@b"
    assert seen == [True]
