"""Liveness-checked waits, hedging delays and the attempt race, decided without I/O
(injected clock; fake runs stand for worker threads or tasks)."""

from __future__ import annotations

from typing import Any

import pytest

from clickhouse_lb.config.hedging import HedgePolicy, parse_receive_data_timeout
from clickhouse_lb.config.liveness import LivenessPolicy
from clickhouse_lb.core.hedging import AUTO_COLD, LatencyWindow, hedge_delay
from clickhouse_lb.core.race import Abandon, AttemptSpec, Launch, Ping, RaceFailure, Wait, run_attempt
from clickhouse_lb.core.watch import AttemptWatch, Wake
from clickhouse_lb.errors import AttemptAbandonedError, ConfigurationError

from .conftest import FakeClock

# -- the watch -------------------------------------------------------------------------------


def test_a_waiting_attempt_is_first_checked_after_100ms_by_default() -> None:
    watch = AttemptWatch(10.0)
    assert watch.next_wake(10.0) == (Wake.CHECK, pytest.approx(0.1))
    assert watch.ping_timeout(10.1) == pytest.approx(0.15)


def test_a_replica_that_answers_keeps_its_attempt_and_is_checked_again_later() -> None:
    watch = AttemptWatch(0.0)
    for now in (0.1, 1.1, 2.1, 3.1, 4.1):  # a 5 s query on a live replica: never abandoned
        wake, delay = watch.next_wake(now)
        assert (wake, delay) == (Wake.CHECK, pytest.approx(0.0))
        assert watch.checked(True, now) is False


def test_one_failed_check_abandons_a_retry_safe_attempt() -> None:
    watch = AttemptWatch(0.0, retry_safe=True)
    assert watch.checked(False, 0.4) is True


def test_an_unsafe_write_needs_consecutive_failed_checks() -> None:
    watch = AttemptWatch(0.0, retry_safe=False, liveness=LivenessPolicy(failed_checks_for_writes=3))
    assert watch.checked(False, 0.4) is False
    assert watch.next_wake(0.4) == (Wake.CHECK, pytest.approx(0.15))  # soon (a ping timeout), not a second later
    assert watch.checked(True, 0.6) is False  # an answer resets the count
    assert watch.checked(False, 1.8) is False
    assert watch.checked(False, 2.0) is False
    assert watch.checked(False, 2.2) is True


def test_a_read_whose_checks_all_go_unanswered_while_this_process_stalls_is_given_up_after_a_second() -> None:
    """Another thread holding the GIL back to back makes every check late: each failed one is
    inconclusive, and a read on a stopped replica would wait for it as long as the stalls last
    (measured: a reader stuck through a whole pause). Unanswered for STALLED_SILENCE, it moves on;
    an answer starts the count again, and a write never counts a stalled check."""
    read = AttemptWatch(0.0)
    assert read.checked(False, 0.25, stalled=True) is False
    assert read.checked(False, 0.9, stalled=True) is False
    assert read.checked(False, 1.2, stalled=True) is False
    assert read.checked(False, 1.26, stalled=True) is True  # silent 1.01 s since the first
    answered = AttemptWatch(0.0)
    assert answered.checked(False, 0.25, stalled=True) is False
    assert answered.checked(True, 0.9) is False  # alive: the silence ends
    assert answered.checked(False, 1.9, stalled=True) is False
    assert answered.checked(False, 2.5, stalled=True) is False
    write = AttemptWatch(0.0, retry_safe=False)
    for now in (0.25, 1.0, 2.0, 4.0, 8.0):
        assert write.checked(False, now, stalled=True) is False


def test_deadline_and_receive_timeout_come_before_checks_and_cut_the_ping() -> None:
    watch = AttemptWatch(0.0, receive_timeout=0.5, deadline_at=0.3)
    assert watch.next_wake(0.0) == (Wake.CHECK, pytest.approx(0.1))
    assert watch.ping_timeout(0.2) == pytest.approx(0.1)  # the ping ends by the deadline
    watch.checked(True, 0.25)
    assert watch.next_wake(0.25) == (Wake.DEADLINE, pytest.approx(0.05))
    no_deadline = AttemptWatch(0.0, receive_timeout=0.05)
    assert no_deadline.next_wake(0.0) == (Wake.RECEIVE_TIMEOUT, pytest.approx(0.05))


def test_liveness_off_leaves_only_the_deadline() -> None:
    watch = AttemptWatch(0.0, liveness=LivenessPolicy(check_after=None))
    assert watch.next_wake(0.0) == (Wake.DEADLINE, float("inf"))


# -- hedging ---------------------------------------------------------------------------------


def test_receive_data_timeout_ms_is_milliseconds_or_auto() -> None:
    assert parse_receive_data_timeout(150) == pytest.approx(0.15)
    assert parse_receive_data_timeout("2000") == pytest.approx(2.0)
    assert parse_receive_data_timeout("AUTO") is None
    for bad in (0, -5, "fast", True):
        with pytest.raises(ConfigurationError, match=r"receive_data_timeout_ms.*'auto'"):
            parse_receive_data_timeout(bad)


def test_hedge_policy_off_fixed_or_adaptive() -> None:
    window = LatencyWindow()
    assert hedge_delay(HedgePolicy(), window) is None
    assert hedge_delay(HedgePolicy(enabled=True, delay=0.05), window) == 0.05
    assert hedge_delay(HedgePolicy(enabled=True, delay=None), window) == AUTO_COLD  # nothing known yet


# -- the race --------------------------------------------------------------------------------


class FakeRun:
    def __init__(self, index: int) -> None:
        self.index = index
        self.outcome: tuple[bool, Any] | None = None
        self.abandoned = False
        self.killed: str | None = None

    def done(self) -> bool:
        return self.outcome is not None

    def exception(self) -> BaseException | None:
        assert self.outcome is not None
        return None if self.outcome[0] else self.outcome[1]

    def result(self) -> Any:
        assert self.outcome is not None
        assert self.outcome[0]
        return self.outcome[1]


class Answered:
    """A ping's handle, done: it answered ``ok``."""

    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def done(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> bool:
        return self.ok


class FakeDriver:
    """Plays the driver: replicas answer after a scripted time, fail, or hang; pings answer per
    a table. Waiting advances the fake clock."""

    def __init__(self, clock: FakeClock, behaviour: dict[int, tuple[str, float]], alive: dict[int, bool]) -> None:
        self.clock = clock
        self.behaviour = behaviour  # index -> ("answer"|"fail"|"hang", after seconds)
        self.alive = alive
        self.runs: list[FakeRun] = []
        self.started: dict[int, float] = {}
        self.pings: list[int] = []
        self.log: list[str] = []

    def _settle(self) -> None:
        for run in self.runs:
            kind, after = self.behaviour[run.index]
            if run.outcome is None and not run.abandoned and kind != "hang" and \
                    self.clock.now >= self.started[id(run)] + after:
                failure = ConnectionResetError("reset")
                run.outcome = (True, f"rows@{run.index}") if kind == "answer" else (False, failure)

    def drive(self, spec: AttemptSpec) -> tuple[int, Any]:
        steps = run_attempt(spec)
        reply: Any = None
        while True:
            try:
                command = steps.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply = None
            if isinstance(command, Launch):
                run = FakeRun(command.replica)
                self.runs.append(run)
                self.started[id(run)] = self.clock.now
                self.log.append(f"launch {command.replica}")
                reply = run
            elif isinstance(command, Wait):
                pending = [r for r in command.handles if not r.done()]
                next_done = min(
                    (self.started[id(r)] + self.behaviour[r.index][1] for r in pending
                     if self.behaviour[r.index][0] != "hang"),
                    default=float("inf"),
                )
                timeout = float("inf") if command.timeout is None else command.timeout  # None: no timeout
                self.clock.now = min(self.clock.now + timeout, max(self.clock.now, next_done))
                self._settle()
            elif isinstance(command, Ping):
                # The ping's answer comes before anything else happens (a blocking ping): its
                # handle is done when the machine next looks.
                self.pings.append(command.replica)
                self.log.append(f"ping {command.replica}")
                if self.alive[command.replica]:
                    self.clock.advance(0.001)
                    reply = Answered(True)
                else:
                    self.clock.advance(command.timeout)
                    reply = Answered(False)
                self._settle()
            elif isinstance(command, Abandon):
                command.handle.abandoned = True
                self.log.append(f"abandon {command.replica}{' kill ' + str(command.query_id) if command.kill else ''}")


def spec_for(clock: FakeClock, *, hedge_after: float | None = None, deadline_at: float | None = None,
             retry_safe: bool = True, **kwargs: Any) -> AttemptSpec:
    ids = iter(f"q{i}" for i in range(100))
    return AttemptSpec(
        first=0,
        clock=clock,
        watch=lambda index, started: AttemptWatch(
            started, hedge_after=hedge_after, deadline_at=deadline_at, retry_safe=retry_safe
        ),
        hedge_index=lambda running: next((i for i in (1, 2) if i not in running), None),  # never exhausted
        query_id=lambda: next(ids),
        address=lambda index: f"r{index}:8123",
        **kwargs,
    )


def test_a_quick_answer_needs_no_check(clock: FakeClock) -> None:
    driver = FakeDriver(clock, {0: ("answer", 0.05)}, {0: True})
    assert driver.drive(spec_for(clock)) == (0, "rows@0")
    assert driver.pings == []


def test_a_hung_replica_is_abandoned_after_one_failed_check_within_half_a_second(clock: FakeClock) -> None:
    driver = FakeDriver(clock, {0: ("hang", 0)}, {0: False})
    start = clock.now
    with pytest.raises(RaceFailure) as caught:
        driver.drive(spec_for(clock))
    assert caught.value.index == 0
    error = caught.value.error
    assert isinstance(error, AttemptAbandonedError)
    assert error.kind == "hung"
    assert clock.now - start <= 0.5
    assert driver.log == ["launch 0", "ping 0", "abandon 0"]  # no KILL for a replica that cannot answer


def test_a_long_query_on_a_live_replica_is_not_interrupted(clock: FakeClock) -> None:
    driver = FakeDriver(clock, {0: ("answer", 5.0)}, {0: True})
    assert driver.drive(spec_for(clock)) == (0, "rows@0")
    assert len(driver.pings) == 5  # at 0.2 s, then once a second


def test_the_deadline_abandons_and_kills_the_running_query(clock: FakeClock) -> None:
    driver = FakeDriver(clock, {0: ("answer", 5.0)}, {0: True})
    with pytest.raises(RaceFailure) as caught:
        driver.drive(spec_for(clock, deadline_at=clock.now + 1.5))
    assert isinstance(caught.value.error, AttemptAbandonedError)
    assert caught.value.error.kind == "deadline"
    assert clock.now == pytest.approx(1000.0 + 1.5)
    assert driver.log[-1] == "abandon 0 kill q0"


def test_an_unsafe_write_on_a_hung_replica_says_it_may_have_been_applied(clock: FakeClock) -> None:
    driver = FakeDriver(clock, {0: ("hang", 0)}, {0: False})
    with pytest.raises(RaceFailure) as caught:
        driver.drive(spec_for(clock, retry_safe=False, write=True))
    assert driver.pings == [0, 0, 0]
    assert "may have been applied" in str(caught.value.error)


def test_hedged_read_the_first_answer_wins_and_the_slow_one_is_killed_and_counted(clock: FakeClock) -> None:
    slower: list[int] = []
    latencies: list[tuple[int, float]] = []
    unanswered: list[tuple[int, float]] = []
    hedges: list[int] = []
    driver = FakeDriver(clock, {0: ("answer", 2.0), 1: ("answer", 0.03)}, {0: True, 1: True})
    spec = spec_for(clock, hedge_after=0.05, on_slower=slower.append,
                    on_latency=lambda index, seconds: latencies.append((index, seconds)),
                    on_unanswered=lambda index, seconds: unanswered.append((index, seconds)), on_hedge=hedges.append)
    assert driver.drive(spec) == (1, "rows@1")
    assert hedges == [1]
    assert clock.now - 1000.0 == pytest.approx(0.08)  # before the first liveness check (0.1 s)
    assert driver.log == ["launch 0", "launch 1", "abandon 0 kill q0"]  # one hedge, not one per run
    assert slower == [0]
    assert latencies == [(1, pytest.approx(0.03))]  # the winner's own latency
    assert unanswered == [(0, pytest.approx(0.08))]  # the loser ran that long without an answer


def test_a_failed_run_is_counted_while_the_other_keeps_going(clock: FakeClock) -> None:
    failed: list[int] = []
    driver = FakeDriver(clock, {0: ("answer", 0.5), 1: ("fail", 0.05)}, {0: True, 1: True})
    spec = spec_for(clock, hedge_after=0.1, on_failure=lambda index, exc: failed.append(index))
    assert driver.drive(spec) == (0, "rows@0")
    assert failed == [1]


def test_without_hedging_a_failure_ends_the_attempt_with_its_replica(clock: FakeClock) -> None:
    driver = FakeDriver(clock, {0: ("fail", 0.05)}, {0: True})
    with pytest.raises(RaceFailure) as caught:
        driver.drive(spec_for(clock))
    assert caught.value.index == 0
    assert isinstance(caught.value.error, ConnectionResetError)


def test_an_attempt_is_hedged_once_even_when_the_hedge_is_slow_too(clock: FakeClock) -> None:
    driver = FakeDriver(clock, {0: ("answer", 2.0), 1: ("answer", 1.0), 2: ("answer", 0.01)},
                        {0: True, 1: True, 2: True})
    assert driver.drive(spec_for(clock, hedge_after=0.1)) == (1, "rows@1")
    assert [entry for entry in driver.log if entry.startswith("launch")] == ["launch 0", "launch 1"]


def test_a_failed_ping_while_this_process_stalled_is_asked_again() -> None:
    watch = AttemptWatch(0.0, liveness=LivenessPolicy(max_inconclusive=2))
    assert watch.checked(False, 0.6, stalled=True) is False  # the check ran 0.45 s late: proves nothing
    assert watch.next_wake(0.6) == (Wake.CHECK, 0.0)  # ask again at once
    assert watch.checked(True, 0.62) is False  # it answers: the attempt keeps going
    assert watch.checked(False, 1.7, stalled=True) is False
    assert watch.checked(False, 1.9, stalled=True) is False  # a stalled check never counts ...
    assert watch.next_wake(1.9) == (Wake.CHECK, pytest.approx(0.15))  # ... past 2: asked a ping timeout later
    assert watch.checked(False, 2.1) is True  # a check that failed while the process ran does count


def test_the_race_tells_a_late_wake_up_from_a_hung_replica(clock: FakeClock) -> None:
    steps = run_attempt(spec_for(clock))
    command = steps.send(None)
    assert isinstance(command, Launch)
    run = FakeRun(0)
    command = steps.send(run)
    assert isinstance(command, Wait)
    clock.advance(command.timeout + 0.3)  # the wait overran: this process stalled
    command = steps.send(None)
    assert isinstance(command, Ping)
    clock.advance(command.timeout)
    command = steps.send(Answered(False))
    assert isinstance(command, Ping)  # inconclusive: asked again instead of abandoning
    clock.advance(0.01)
    command = steps.send(Answered(True))
    assert isinstance(command, Wait)  # alive after all: the attempt goes on
