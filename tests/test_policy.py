"""The failover policy as a value (clickhouse_lb.core.policy): recording a failure returns a new
policy, and the verdict is read from the history alone."""

from __future__ import annotations

import pytest

from clickhouse_lb.core.classify import Failure
from clickhouse_lb.core.deadline import Deadline
from clickhouse_lb.core.policy import FailoverPolicy, Verdict

from .conftest import FakeClock

REFUSED = Failure(replica=True, sent=False, code=None, reason="refused", kind="connect")
RESET = Failure(replica=True, sent=True, code=None, reason="reset", kind="disconnect")
QUERY = Failure(replica=False, sent=True, code=62, reason="syntax error")


def test_increment_returns_a_new_policy_and_leaves_the_old_one_as_it_was() -> None:
    policy = FailoverPolicy([2, 0, 1], tries=2)
    after = policy.increment(2, REFUSED)
    assert policy.history == ()
    assert policy.next_index() == 2
    assert len(after.history) == 1
    assert after.next_index() == 0
    with pytest.raises(AttributeError):
        after.tries = 5  # type: ignore[misc]


def test_the_verdict_follows_the_history() -> None:
    policy = FailoverPolicy([0, 1], tries=1)
    assert policy.increment(0, QUERY).verdict(retry_after_send=True) is Verdict.RAISE
    once = policy.increment(0, REFUSED)
    assert once.verdict(retry_after_send=False) is Verdict.RETRY  # nothing was sent: safe for a write too
    assert not once.resends()
    sent = policy.increment(0, RESET)
    assert sent.verdict(retry_after_send=False) is Verdict.UNCONFIRMED
    assert sent.verdict(retry_after_send=True) is Verdict.RETRY
    assert sent.resends()
    assert once.increment(1, REFUSED).verdict(retry_after_send=True) is Verdict.EXHAUSTED


def test_past_the_deadline_the_verdict_is_timeout(clock: FakeClock) -> None:
    policy = FailoverPolicy([0, 1], tries=3, deadline=Deadline(0.5, clock=clock)).increment(0, RESET)
    assert policy.verdict(retry_after_send=True) is Verdict.RETRY
    clock.advance(0.6)
    assert policy.verdict(retry_after_send=True) is Verdict.TIMEOUT


def test_backoff_only_before_a_new_pass_and_cut_to_the_deadline(clock: FakeClock) -> None:
    policy = FailoverPolicy([0, 1], tries=3, backoff_ms=8000, deadline=Deadline(0.5, clock=clock))
    first = policy.increment(0, REFUSED)
    assert first.backoff(lambda low, high: high) == 0.0  # between replicas: no pause
    assert first.increment(1, REFUSED).backoff(lambda low, high: high) == 0.5  # 8 s, cut to the deadline
