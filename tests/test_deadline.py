"""The statement deadline and the timeout model (pure; injected clock)."""

from __future__ import annotations

import pytest

from clickhouse_lb.config.timeouts import (
    Timeouts,
    client_timeout_arguments,
    pool_timeouts,
    split_statement_timeouts,
)
from clickhouse_lb.core.deadline import Deadline, cut_timeout
from clickhouse_lb.errors import AllReplicasUnavailableError, AttemptFailure, ConfigurationError, StatementTimeoutError

from .conftest import FakeClock


def test_deadline_cuts_timeouts_and_sleeps_to_the_time_left(clock: FakeClock) -> None:
    deadline = Deadline(2.5, clock=clock)
    assert deadline.remaining() == 2.5
    assert deadline.cut(10.0) == 2.5
    assert deadline.cut(0.3) == 0.3
    assert deadline.cut(None) == 2.5  # an unbounded wait is bounded by the deadline
    clock.advance(2.0)
    assert deadline.cut_sleep(8.0) == pytest.approx(0.5)  # a backoff never sleeps past it
    assert not deadline.expired
    clock.advance(0.5)
    assert deadline.expired
    assert deadline.remaining() == 0.0
    assert deadline.cut(1.0) == 0.0


def test_no_deadline_cuts_nothing(clock: FakeClock) -> None:
    deadline = Deadline(None, clock=clock)
    clock.advance(1e6)
    assert not deadline.expired
    assert deadline.remaining() is None
    assert deadline.cut(3.0) == 3.0
    assert deadline.cut(None) is None
    assert deadline.cut_sleep(8.0) == 8.0
    assert cut_timeout(None, None) is None


def test_statement_timeout_error_is_an_all_replicas_error_naming_every_replica() -> None:
    error = StatementTimeoutError(
        [AttemptFailure("a:8123", 1, "hung: no answer to /ping"), AttemptFailure("b:8123", 2, "deadline: ran out")],
        {"a:8123": "hung: no answer to /ping", "b:8123": "deadline: ran out", "c:8123": None},
        timeout=1.5,
        may_have_been_applied=True,
    )
    assert isinstance(error, AllReplicasUnavailableError)
    text = str(error)
    assert "failover_timeout=1.5s" in text
    assert "a:8123: hung" in text
    assert "b:8123: deadline" in text
    assert "c:8123: not tried" in text
    assert "may have been applied" in text
    assert "insert_deduplication_token" in text


def test_pool_timeouts_accept_fractions_under_both_naming_schemes() -> None:
    timeouts, rest = pool_timeouts(
        {"send_receive_timeout": 0.5, "compress": False}, connect_timeout_with_failover_ms=150, replicas=3
    )
    assert timeouts == Timeouts(connect=0.15, send=0.5, receive=0.5)
    assert rest == {"compress": False}  # the client gets them from the pool, exact
    timeouts, _ = pool_timeouts({"receive_timeout": "1.5", "send_timeout": 2}, connect_timeout_with_failover_ms=1000,
                                replicas=2)
    assert timeouts == Timeouts(connect=1.0, send=2.0, receive=1.5)
    assert timeouts.socket == 2.0  # one socket timeout for reads and writes: the larger


def test_pool_timeouts_defaults_are_clickhouse_connects_and_one_replica_keeps_connect_timeout() -> None:
    timeouts, _ = pool_timeouts({}, connect_timeout_with_failover_ms=1000, replicas=3)
    assert timeouts == Timeouts(connect=1.0, send=300.0, receive=300.0)
    single, _ = pool_timeouts({"connect_timeout": 0.25}, connect_timeout_with_failover_ms=1000, replicas=1)
    assert single.connect == 0.25


def test_client_constructor_gets_whole_seconds_rounded_up_never_zero() -> None:
    assert client_timeout_arguments(Timeouts(connect=0.15, send=0.3, receive=0.3)) == {
        "connect_timeout": 1,
        "send_receive_timeout": 1,
    }
    assert client_timeout_arguments(Timeouts(connect=2.5, send=1.5, receive=1.5)) == {
        "connect_timeout": 3,
        "send_receive_timeout": 2,
    }


def test_statement_timeouts_are_taken_out_of_its_settings() -> None:
    settings = {"receive_timeout": 0.5, "connect_timeout_with_failover_ms": 50, "max_threads": 2}
    timeouts, rest = split_statement_timeouts(settings)
    assert timeouts == Timeouts(connect=0.05, send=None, receive=0.5)
    assert rest == {"max_threads": 2}
    plain = {"max_threads": 2}
    assert split_statement_timeouts(plain) == (Timeouts(), plain)
    assert Timeouts(connect=1.0, send=300.0, receive=300.0).override(timeouts) == Timeouts(1.0 / 20, 300.0, 0.5)


@pytest.mark.parametrize("value", [0, -1, "soon", True, float("nan")])
def test_bad_timeouts_name_the_value(value: object) -> None:
    with pytest.raises(ConfigurationError, match="receive_timeout"):
        split_statement_timeouts({"receive_timeout": value})
    with pytest.raises(ConfigurationError, match="send_receive_timeout"):
        pool_timeouts({"send_receive_timeout": value}, connect_timeout_with_failover_ms=1000, replicas=2)
