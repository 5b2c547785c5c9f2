"""The per-statement path does only what the statement's outcome needs: whether a statement
writes is decided when a failure (or hedging, or a deadline) asks, not for every statement;
an attempt with nothing to wait for is not handed to the watchdog; the watchdog plans an
attempt's first wake-up exactly as its watch would."""

from __future__ import annotations

from typing import Any

import pytest

from clickhouse_lb.config.attempt_settings import AttemptSettings
from clickhouse_lb.config.hedging import HedgePolicy
from clickhouse_lb.config.liveness import LivenessPolicy
from clickhouse_lb.config.timeouts import Timeouts
from clickhouse_lb.core import _statements
from clickhouse_lb.core._statements import prepare_call
from clickhouse_lb.core.attempt_specs import StatementPlan
from clickhouse_lb.core.deadline import Deadline
from clickhouse_lb.core.hedging import LatencyWindow
from clickhouse_lb.core.watch import AttemptWatch, first_wake
from clickhouse_lb.errors import WriteOutcomeUnknownError
from clickhouse_lb.pools._watchdog import Watchdog

from .fakes import FakeCluster, make_pool, reset_after_send


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The statements whose SQL the pool parsed to tell a read from a write."""
    seen: list[Any] = []
    original = _statements.is_read_only

    def counting(sql: Any) -> bool:
        seen.append(sql)
        return original(sql)

    monkeypatch.setattr(_statements, "is_read_only", counting)
    return seen


def test_a_statement_answered_at_once_is_not_parsed(parsed: list[Any]) -> None:
    cluster = FakeCluster("a", "b")
    pool = make_pool(cluster, load_balancing="in_order")
    assert pool.query("SELECT 1") == "query@a"
    assert pool.command("DROP TABLE t") == "command@a"
    assert parsed == []


def test_a_failed_attempt_decides_whether_the_statement_may_be_repeated(parsed: list[Any]) -> None:
    cluster = FakeCluster("a", "b")
    cluster["a"].outcomes = [reset_after_send, "ok"]
    pool = make_pool(cluster, load_balancing="in_order")
    with pytest.raises(WriteOutcomeUnknownError):
        pool.command("DROP TABLE t")  # a write whose request was sent: not repeated
    assert parsed == ["DROP TABLE t"]
    cluster["a"].outcomes = ["ok"]
    cluster["b"].outcomes = [reset_after_send, "ok"]  # b goes first now (a has an error)
    assert pool.query("SELECT 1") == "query@a"  # a read: failed over
    assert parsed == ["DROP TABLE t", "SELECT 1"]


def test_hedging_decides_at_once_whether_a_statement_reads(parsed: list[Any]) -> None:
    cluster = FakeCluster("a", "b")
    pool = make_pool(cluster, load_balancing="in_order", use_hedged_requests=True)
    pool.query("SELECT 1")
    assert parsed == ["SELECT 1"]


def test_lazily_decided_statements_read_and_write_as_before() -> None:
    for sql, write in [("SELECT 1", False), ("  -- c\n(WITH x AS (SELECT 1) SELECT * FROM x)", False),
                       ("INSERT INTO t VALUES (1)", True), (b"SHOW TABLES", False), ("OPTIMIZE TABLE t", True)]:
        call = prepare_call("query", (sql,), {}, 1, auto_token=True)
        assert (call.write, call.read_only, call.retry_after_send) == (write, not write, not write), sql
    idempotent = prepare_call("command", ("DROP TABLE t", {"idempotent": 1}), {}, 1, auto_token=True)
    assert (idempotent.write, idempotent.retry_after_send, idempotent.settings) == (True, True, {})


def test_a_statement_that_is_not_sql_still_fails_before_any_attempt() -> None:
    with pytest.raises(TypeError):
        prepare_call("query", (), {"query": 42}, 1, auto_token=True)


def plan_of(settings: AttemptSettings, deadline: Deadline) -> StatementPlan:
    statement = prepare_call("query", ("SELECT 1",), {}, 1, auto_token=True)
    return StatementPlan(
        settings=settings, deadline=deadline, addresses=("a:8123",), statement=statement, window=LatencyWindow(),
        count_failure=lambda index, exc: None, count_slowdown=lambda index: None,
        hedge_candidate=lambda running: None,
    )


@pytest.mark.parametrize("check_after", [None, 0.1, 2.0])
@pytest.mark.parametrize("receive", [None, 0.05, 1.0])
@pytest.mark.parametrize("deadline_in", [None, -1.0, 0.02, 0.5, 5.0])
def test_the_first_wake_is_the_watchs(check_after: float | None, receive: float | None,
                                      deadline_in: float | None) -> None:
    now = 1000.0
    deadline = Deadline(deadline_in, clock=lambda: now)
    settings = AttemptSettings(Timeouts(connect=1.0, receive=receive), LivenessPolicy(check_after=check_after),
                               HedgePolicy())
    started = now + 0.01
    watch = AttemptWatch(started, liveness=settings.liveness, receive_timeout=receive, deadline_at=deadline.at)
    assert first_wake(started, settings.liveness, receive, deadline.at) == watch.next_wake(started)[1] + started


def test_an_attempt_with_nothing_to_wait_for_starts_no_watchdog() -> None:
    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None)
    nothing = plan_of(AttemptSettings(Timeouts(connect=1.0), LivenessPolicy(check_after=None), HedgePolicy()),
                      Deadline(None))
    assert watchdog.run_planned(nothing, 0, lambda index, query_id: "rows") == "rows"
    assert watchdog._thread is None
    checked = plan_of(AttemptSettings(Timeouts(connect=1.0), LivenessPolicy(), HedgePolicy()), Deadline(None))
    assert watchdog.run_planned(checked, 0, lambda index, query_id: "rows") == "rows"
    assert watchdog._thread is not None
    watchdog.close()


def test_statements_spaced_apart_do_not_wake_the_watchdog_one_by_one() -> None:
    """Once the watchdog has found nothing to watch, it plans its next look one first wake-up
    ahead: attempts started after that look are due no sooner, so none of them wakes its
    thread (planned "never", every statement that followed a look woke it: a thread wake-up
    per statement spaced apart from the next, 994 in 1000 measured)."""
    import threading

    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None, idle_exit=120.0)
    checked = plan_of(AttemptSettings(Timeouts(connect=1.0), LivenessPolicy(check_after=60.0), HedgePolicy()),
                      Deadline(None))
    looked = threading.Event()
    idle_look = watchdog._idle_look

    def noted(now: float) -> float | None:
        tick = idle_look(now)
        looked.set()
        return tick

    watchdog._idle_look = noted  # type: ignore[method-assign]
    notified: list[float] = []
    notify = watchdog._notify

    def counted(first: float, started: float) -> None:
        notified.append(first)
        notify(first, started)

    watchdog._notify = counted  # type: ignore[method-assign]
    try:
        assert watchdog.run_planned(checked, 0, lambda index, query_id: "rows") == "rows"
        assert len(notified) == 1  # the first attempt starts the thread
        with watchdog._cond:  # (its first look may have seen the attempt running: look again now)
            watchdog._cond.notify()
        assert looked.wait(30)  # a look found nothing left to watch
        for _ in range(50):
            assert watchdog.run_planned(checked, 0, lambda index, query_id: "rows") == "rows"
        assert len(notified) == 1
    finally:
        watchdog.close()


def test_an_idle_watchdog_does_not_spin_after_an_attempt_due_at_once() -> None:
    """An attempt whose deadline has passed is due at its start (a lead of zero): the idle
    thread's next look is still a while ahead, not at once over and over."""
    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None, idle_exit=120.0)
    past = plan_of(AttemptSettings(Timeouts(connect=1.0), LivenessPolicy(), HedgePolicy()), Deadline(-1.0))
    try:
        assert watchdog.run_planned(past, 0, lambda index, query_id: "rows") == "rows"
        with watchdog._cond:  # (what the thread holds when it looks)
            assert watchdog._lead <= 0
            assert watchdog._idle_look(1000.0) == pytest.approx(0.05)
    finally:
        watchdog.close()
