"""The attempt machine is the one place that decides how an attempt waits: the sync pool's
watchdog and the drivers only carry out its commands. The machine is driven here as a pure
generator on an injected clock, and the watchdog's own code is driven through the same scripted
timelines (a fake clock, scripted ping answers) to show it reaches the same decisions, in the
same words, at the same moments."""

from __future__ import annotations

import concurrent.futures as cf
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from clickhouse_lb.config.liveness import LivenessPolicy
from clickhouse_lb.core.race import Abandon, AttemptMachine, AttemptSpec, Launch, Ping, RaceFailure, Wait
from clickhouse_lb.core.stalls import PingReading
from clickhouse_lb.core.watch import AttemptWatch
from clickhouse_lb.pools._drive_sync import kill_quietly
from clickhouse_lb.pools._watchdog import Watchdog
from clickhouse_lb.pools._watched import Watched

from .conftest import FakeClock

PACKAGE = Path(__file__).resolve().parents[1] / "clickhouse_lb"


class Pending:
    """A run (or ping) that has not answered; ``finish`` makes it answer."""

    def __init__(self) -> None:
        self.value: Any = None
        self.finished = False

    def finish(self, value: Any) -> None:
        self.value, self.finished = value, True

    def done(self) -> bool:
        return self.finished

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> Any:
        return self.value


DEFAULTS = LivenessPolicy()


def spec_of(clock: FakeClock, *, liveness: LivenessPolicy = DEFAULTS, deadline_at: float | None = None,
            receive_timeout: float | None = None, retry_safe: bool = True, write: bool = False) -> AttemptSpec:
    return AttemptSpec(
        first=0, clock=clock,
        watch=lambda index, started: AttemptWatch(started, liveness=liveness, receive_timeout=receive_timeout,
                                                  deadline_at=deadline_at, retry_safe=retry_safe),
        query_id=lambda: "q0", address=lambda index: "r0:8123", write=write,
    )


# -- the machine alone ---------------------------------------------------------------------------


def test_an_answer_that_comes_while_a_ping_is_out_is_returned_at_once(clock: FakeClock) -> None:
    machine = AttemptMachine(spec_of(clock))
    run = Pending()
    assert isinstance(machine.send(), Launch)
    wait = machine.send(run)
    assert isinstance(wait, Wait)
    clock.advance(wait.timeout or 0)
    ping = machine.send()
    assert isinstance(ping, Ping)
    pinging = Pending()
    wait = machine.send(pinging)
    assert isinstance(wait, Wait)
    assert wait.handles == [run, pinging]
    assert wait.timeout is None  # nothing but the run or its ping can end this wait
    clock.advance(0.01)
    run.finish("rows")
    assert machine.send() is None  # decided: the ping is not waited for
    assert machine.outcome == (0, "rows")


def test_the_deadline_ends_an_attempt_whose_ping_is_still_out(clock: FakeClock) -> None:
    start = clock.now
    machine = AttemptMachine(spec_of(clock, deadline_at=start + 0.2))
    run = Pending()
    machine.send()
    wait = machine.send(run)
    clock.advance(wait.timeout or 0)  # the first check, at 0.1 s
    ping = machine.send()
    assert isinstance(ping, Ping)
    assert ping.timeout == pytest.approx(0.1)
    wait = machine.send(Pending())  # a ping that never comes back (a slow adaptive timeout)
    assert isinstance(wait, Wait)
    assert wait.timeout == pytest.approx(0.1)
    clock.advance(wait.timeout or 0)
    abandon = machine.send()
    assert isinstance(abandon, Abandon)
    assert abandon.kill
    assert abandon.error is not None
    with pytest.raises(RaceFailure) as caught:
        machine.send()
    assert caught.value.error is abandon.error
    assert "(failover_timeout ran out after 0.200s)" in str(abandon.error)


def test_a_machine_started_on_a_running_call_begins_at_its_first_wake_up(clock: FakeClock) -> None:
    """The watchdog starts the machine only when an attempt outlives its first wake-up: the
    check then due is on time (not taken for a stall of this process), so one failed ping
    gives a read up."""
    started = clock.now
    clock.advance(0.1)
    machine = AttemptMachine(spec_of(clock), running=(Pending(), started, None))
    ping = machine.send()
    assert isinstance(ping, Ping)
    clock.advance(ping.timeout)
    failed = cf.Future[Any]()
    failed.set_result(False)
    abandon = machine.send(failed)
    assert isinstance(abandon, Abandon)
    assert not abandon.kill
    assert abandon.error is not None
    assert abandon.error.kind == "hung"


def test_a_hung_verdict_names_the_timeout_the_ping_was_given(clock: FakeClock) -> None:
    """The pinger adapts the check's timeout to the replica's history (a busy replica is given
    its tail): the verdict says how long the replica was really given, not the configured floor."""
    started = clock.now
    clock.advance(0.1)
    machine = AttemptMachine(spec_of(clock), running=(Pending(), started, None))
    ping = machine.send()
    assert isinstance(ping, Ping)
    assert ping.timeout == pytest.approx(0.15)
    clock.advance(0.45)
    failed = cf.Future[Any]()
    failed.set_result(PingReading(False, 0.45, 0.45, error="no answer to /ping within 0.45s"))
    abandon = machine.send(failed)
    assert isinstance(abandon, Abandon)
    assert abandon.error is not None
    assert "no answer to /ping within 0.45s after waiting 0.100s" in str(abandon.error)


# -- a read whose first check came due during a stall -------------------------------------------


def stalled_spec(clock: FakeClock, hedges: list[int], *, candidate: int | None = 1, **options: Any) -> AttemptSpec:
    """:func:`spec_of` for an attempt that may race a second run after a stall (on ``candidate``),
    the hedges it starts recorded in ``hedges``."""
    spec = spec_of(clock, **options)
    spec.stall_hedge_index = lambda running: candidate
    spec.on_hedge = hedges.append
    return spec


def late_first_wake(machine: AttemptMachine, clock: FakeClock, late: float) -> Pending:
    """Launch the first run; its first wake-up (the check, at 0.1 s) comes ``late`` seconds late."""
    run = Pending()
    assert isinstance(machine.send(), Launch)
    wait = machine.send(run)
    assert isinstance(wait, Wait)
    clock.advance((wait.timeout or 0) + late)
    return run


def test_a_read_whose_check_came_due_during_a_stall_races_another_replica_and_the_faster_answer_wins(
    clock: FakeClock,
) -> None:
    """A GIL held 0.8 s over a stopped replica: pinging first (150 ms after the stall) made the
    read miss the next gap between two holds, 1.9 s in all; racing it costs one more request."""
    hedges: list[int] = []
    machine = AttemptMachine(stalled_spec(clock, hedges))
    first = late_first_wake(machine, clock, 0.7)
    settle = machine.send()  # first a moment for an answer that came during the stall, unread
    assert isinstance(settle, Wait)
    assert settle.timeout == pytest.approx(DEFAULTS.stall_tolerance)
    assert settle.handles == [first]
    clock.advance(settle.timeout or 0)
    launch = machine.send()
    assert launch == Launch(1, "q0")
    assert hedges == [1]
    second = Pending()
    ping = machine.send(second)
    assert isinstance(ping, Ping)  # the stalled replica is still checked
    assert ping.replica == 0
    wait = machine.send(Pending())
    assert isinstance(wait, Wait)
    clock.advance(0.004)
    second.finish("rows@1")
    abandon = machine.send()
    assert isinstance(abandon, Abandon)
    assert (abandon.handle, abandon.kill, abandon.error) == (first, True, None)  # lost the race: no error
    assert machine.send() is None
    assert machine.outcome == (1, "rows@1")


def test_an_answer_that_came_during_the_stall_is_taken_without_a_second_run(clock: FakeClock) -> None:
    hedges: list[int] = []
    machine = AttemptMachine(stalled_spec(clock, hedges))
    first = late_first_wake(machine, clock, 0.7)
    assert isinstance(machine.send(), Wait)
    first.finish("rows@0")  # read by its thread once the stall ended
    clock.advance(0.01)
    assert machine.send() is None
    assert machine.outcome == (0, "rows@0")
    assert hedges == []


def test_a_settle_that_woke_late_settles_again_and_takes_the_answer_read_meanwhile(clock: FakeClock) -> None:
    """After a 0.8 s hold an event loop has many answers to read: where the driver cannot look at
    the socket (asyncio), the settle's own late wake-up says the process is still catching up,
    so the read settles again rather than being raced,
    and the answer its thread reads meanwhile is taken without a second run (a busy-machine run
    moved 2 of 10 concurrent nearest_hostname reads with a single fixed settle)."""
    hedges: list[int] = []
    machine = AttemptMachine(stalled_spec(clock, hedges))
    first = late_first_wake(machine, clock, 0.7)
    settle = machine.send()
    assert isinstance(settle, Wait)
    clock.advance((settle.timeout or 0) + 0.03)  # woke 30 ms late: still catching up
    again = machine.send()
    assert isinstance(again, Wait)
    assert again.handles == [first]
    assert again.timeout == pytest.approx(DEFAULTS.stall_tolerance)
    first.finish("rows@0")
    clock.advance(0.01)
    assert machine.send() is None
    assert machine.outcome == (0, "rows@0")
    assert hedges == []


def test_a_driver_that_sees_an_empty_socket_races_after_one_settle_however_late(clock: FakeClock) -> None:
    """Where the driver looks at the socket (the sync pool's watchdog), the socket decides, not
    the settle's lateness: a reader on a paused replica under holds 0.2 s apart lost 0.3 s to a
    second settle after a late one."""
    hedges: list[int] = []
    spec = stalled_spec(clock, hedges)
    spec.waiting_on_us = lambda handle: False
    machine = AttemptMachine(spec)
    late_first_wake(machine, clock, 0.7)
    settle = machine.send()
    assert isinstance(settle, Wait)
    clock.advance((settle.timeout or 0) + 0.03)
    assert machine.send() == Launch(1, "q0")
    assert hedges == [1]


def test_settling_ends_within_a_bound_while_the_process_keeps_running_late(clock: FakeClock) -> None:
    """Late wake-ups do not postpone the race for ever: after STALL_RACE_FACTOR tolerances of
    settling (150 ms by default) a read still unanswered is raced."""
    hedges: list[int] = []
    machine = AttemptMachine(stalled_spec(clock, hedges))
    late_first_wake(machine, clock, 0.7)
    settles = 0
    command = machine.send()
    while isinstance(command, Wait):
        settles += 1
        assert settles <= 3
        clock.advance((command.timeout or 0) + 0.02)  # every settle wakes 20 ms late
        command = machine.send()
    assert command == Launch(1, "q0")
    assert settles == 2
    assert hedges == [1]


def test_a_read_whose_answer_is_waiting_on_its_connection_is_not_raced(clock: FakeClock) -> None:
    """The answer's bytes are in the socket (the caller's thread has yet to get the GIL back to
    read them): the read settles while they wait, then is checked as usual, never raced; the
    check counts the stall it follows."""
    hedges: list[int] = []
    spec = stalled_spec(clock, hedges)
    asked: list[Any] = []
    spec.waiting_on_us = lambda handle: asked.append(handle) is None
    machine = AttemptMachine(spec)
    first = late_first_wake(machine, clock, 0.7)
    command = machine.send()
    while isinstance(command, Wait):  # on time, but the answer is waiting: settle again
        clock.advance(command.timeout or 0)
        command = machine.send()
    assert isinstance(command, Ping)
    assert command.replica == 0
    assert hedges == []
    assert asked
    assert all(handle is first for handle in asked)
    clock.advance(command.timeout)
    failed = cf.Future[Any]()
    failed.set_result(PingReading(False, command.timeout, command.timeout))
    assert isinstance(machine.send(failed), Ping)  # a stalled check: asked again, not abandoned


def test_the_watchdog_tells_a_run_that_waits_on_this_process_from_its_socket() -> None:
    """The sync pool's watchdog tells the machine whether the caller's run waits on this process:
    its request has not gone out yet, or its connection has bytes unread (the socket itself)."""
    import socket
    from types import SimpleNamespace

    from clickhouse_lb.pools._watched import _waiting_on_us

    ours, replica = socket.socketpair()
    try:
        entry: Watched = Watched.__new__(Watched)
        entry.connections = [SimpleNamespace(sock=ours)]  # type: ignore[list-item]
        assert _waiting_on_us(entry) is True  # the request has yet to go out
        entry.request_sent = True
        assert _waiting_on_us(entry) is False  # sent, nothing back: waiting on the replica
        replica.sendall(b"HTTP/1.1 200 OK\r\n")
        assert _waiting_on_us(entry) is True  # the answer is in the socket, unread
        entry.connections = [SimpleNamespace(sock=None)]  # type: ignore[list-item]
        assert _waiting_on_us(entry) is False
        assert _waiting_on_us(Pending()) is False  # a second run's handle: cannot tell
    finally:
        ours.close()
        replica.close()


def test_a_tracked_connection_marks_its_attempts_request_sent_once_it_went_out() -> None:
    from clickhouse_lb.pools._transport import AttemptConnections, _TrackedHTTPConnection

    listener = socket_listening()
    try:
        host, port = listener.getsockname()
        connection = _TrackedHTTPConnection(host, port)
        with AttemptConnections() as attempt:
            assert attempt.request_sent is False
            connection.request("GET", "/ping")
            assert attempt.request_sent is True
        connection.close()
    finally:
        listener.close()


def socket_listening() -> Any:
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


@pytest.mark.parametrize("case", ["on time", "a short stall", "a write", "no replica to race", "the budget is spent"])
def test_no_second_run_starts_where_racing_is_not_for(clock: FakeClock, case: str) -> None:
    """On time (no stall), late by less than a ping timeout (a loaded machine's lag: the ping
    answers as soon), a write (it cannot run twice), or nothing to race it on: the check alone,
    as before; with a candidate refused (the retry budget spent) after the settle."""
    hedges: list[int] = []
    options: dict[str, Any] = {"retry_safe": False, "write": True} if case == "a write" else {}
    spec = stalled_spec(clock, hedges, candidate=None if case == "the budget is spent" else 1, **options)
    if case == "no replica to race":
        spec.stall_hedge_index = None
    machine = AttemptMachine(spec)
    late_first_wake(machine, clock, {"on time": 0.0, "a short stall": 0.12}.get(case, 0.7))
    command = machine.send()
    if case == "the budget is spent":
        assert isinstance(command, Wait)  # the settle
        clock.advance(command.timeout or 0)
        command = machine.send()
    assert isinstance(command, Ping)
    assert hedges == []


def test_a_replica_that_answered_a_check_is_not_raced_after_a_later_stall(clock: FakeClock) -> None:
    """A long query on a live replica, checked once: a later check delayed by a stall leaves it alone."""
    hedges: list[int] = []
    machine = AttemptMachine(stalled_spec(clock, hedges))
    late_first_wake(machine, clock, 0.0)
    ping = machine.send()
    assert isinstance(ping, Ping)
    alive = cf.Future[Any]()
    alive.set_result(True)
    wait = machine.send(alive)
    assert isinstance(wait, Wait)
    clock.advance((wait.timeout or 0) + 0.7)  # the next check (a second later) comes 0.7 s late
    assert isinstance(machine.send(), Ping)
    assert hedges == []


def test_a_check_made_after_the_settle_still_counts_the_stall(clock: FakeClock) -> None:
    """The budget refused the second run; the check made after the settle started late as far
    as the replica is concerned: a ping that then fails without evidence (its socket not looked
    at in silence) proves nothing, and is asked again rather than taken as hung."""
    hedges: list[int] = []
    machine = AttemptMachine(stalled_spec(clock, hedges, candidate=None))
    late_first_wake(machine, clock, 0.7)
    settle = machine.send()
    assert isinstance(settle, Wait)
    clock.advance(settle.timeout or 0)
    ping = machine.send()
    assert isinstance(ping, Ping)
    clock.advance(ping.timeout)
    failed = cf.Future[Any]()
    failed.set_result(PingReading(False, ping.timeout, ping.timeout))
    again = machine.send(failed)
    assert isinstance(again, Ping)  # inconclusive: asked again at once, not abandoned


# -- the watchdog and a thread driver on the same timeline -----------------------------------------


class Outcome(NamedTuple):
    verdict: str | None
    pings: list[tuple[float, float]]  # (when, timeout) of each liveness check, from the start
    killed: list[str]


class Timeline:
    """What the world does: the run never answers; ping k answers (True, within 1 ms) or not
    (False, after its whole timeout) per ``answers``; before check k the waiter wakes ``late[k]``
    seconds late (this process stalled)."""

    def __init__(self, clock: FakeClock, answers: list[bool], late: dict[int, float] | None = None) -> None:
        self.clock = clock
        self.start = clock.now
        self.answers = list(answers)
        self.late = dict(late or {})
        self.pings: list[tuple[float, float]] = []
        self.killed: list[str] = []

    def sleep_until(self, due: float) -> None:
        self.clock.now = max(self.clock.now, due) + self.late.pop(len(self.pings), 0.0)

    def ping(self, timeout: float) -> cf.Future[Any]:
        self.pings.append((round(self.clock.now - self.start, 6), round(timeout, 6)))
        ok = self.answers.pop(0) if self.answers else True
        self.clock.advance(0.001 if ok else timeout)
        future = cf.Future[Any]()
        future.set_result(ok)
        return future

    def outcome(self, verdict: BaseException | None) -> Outcome:
        return Outcome(None if verdict is None else str(verdict), self.pings, self.killed)


def as_thread_driver(spec: AttemptSpec, timeline: Timeline) -> Outcome:
    """The machine's commands carried out the way :class:`SyncDriver` does, on the fake clock."""
    machine = AttemptMachine(spec)
    command = machine.send()
    error: BaseException | None = None
    try:
        while command is not None:
            reply: Any = None
            if isinstance(command, Launch):
                reply = Pending()
            elif isinstance(command, Wait):
                if command.timeout is None:
                    break
                timeline.sleep_until(timeline.clock.now + command.timeout)
            elif isinstance(command, Ping):
                reply = timeline.ping(command.timeout)
            elif isinstance(command, Abandon) and command.kill and command.query_id:
                timeline.killed.append(command.query_id)
            command = machine.send(reply)
    except RaceFailure as failure:
        error = failure.error
    return timeline.outcome(error)


class _Executor:
    """The watchdog's check threads, on the timeline."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline

    def submit(self, fn: Any, *args: Any) -> cf.Future[Any]:
        if fn is kill_quietly:
            self.timeline.killed.append(args[2])
            return cf.Future()
        return self.timeline.ping(args[1])


def as_watchdog(spec: AttemptSpec, timeline: Timeline) -> Outcome:
    """The watchdog's own code (its entry, its resume and carry-out steps), its thread's loop
    played by hand on the fake clock."""
    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None, clock=timeline.clock)
    watchdog._checks = _Executor(timeline)  # type: ignore[assignment]
    entry = Watched.of_spec(spec, spec.query_id(), timeline.clock.now)
    for _ in range(1000):
        if entry.verdict is not None or (entry.due == math.inf and not entry.woken):
            break
        if not entry.woken:
            timeline.sleep_until(entry.due)
        entry.woken, entry.due = False, math.inf
        watchdog._advance(entry)
    return timeline.outcome(entry.verdict)


SCENARIOS: dict[str, tuple[dict[str, Any], list[bool], dict[int, float]]] = {
    "a hung read": ({}, [False], {}),
    "a live replica, then a hung one": ({}, [True, True, False], {}),
    "an unsafe write on a hung replica": ({"retry_safe": False, "write": True}, [False, True, False, False, False], {}),
    "a stalled check is asked again": ({}, [False, False], {0: 0.3}),
    "the deadline": ({"deadline_at": 0.35}, [True] * 10, {}),
    "the receive timeout": ({"receive_timeout": 1.5}, [True] * 10, {}),
    "a late first check while the deadline is near": ({"deadline_at": 0.3}, [True] * 10, {0: 0.15}),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_watchdog_decides_as_the_thread_driver_does(name: str) -> None:
    settings, answers, late = SCENARIOS[name]
    outcomes = []
    for drive in (as_thread_driver, as_watchdog):
        clock = FakeClock()
        options = dict(settings)
        if "deadline_at" in options:
            options["deadline_at"] += clock.now
        outcomes.append(drive(spec_of(clock, **options), Timeline(clock, answers, late)))
    thread, watchdog = outcomes
    assert thread.verdict is not None  # every timeline ends the attempt
    assert watchdog == thread


def test_the_scenarios_end_as_their_names_say() -> None:
    """The comparison above is only worth something if the timelines exercise each rule."""
    verdicts = {}
    for name, (settings, answers, late) in SCENARIOS.items():
        clock = FakeClock()
        options = dict(settings)
        if "deadline_at" in options:
            options["deadline_at"] += clock.now
        verdicts[name] = as_thread_driver(spec_of(clock, **options), Timeline(clock, answers, late))
    assert "no answer to /ping within 0.15s after waiting 0.100s" in str(verdicts["a hung read"].verdict)
    assert [when for when, _ in verdicts["a live replica, then a hung one"].pings] == [0.1, 1.101, 2.102]
    assert len(verdicts["an unsafe write on a hung replica"].pings) == 5
    assert "may have been applied" in str(verdicts["an unsafe write on a hung replica"].verdict)
    # The verdict names the ping it rests on: the third failed check in a row, its timeout grown twice.
    assert "no answer to /ping within 2.4s" in str(verdicts["an unsafe write on a hung replica"].verdict)
    assert len(verdicts["a stalled check is asked again"].pings) == 2
    assert "failover_timeout ran out after 0.350s" in str(verdicts["the deadline"].verdict)
    assert verdicts["the deadline"].killed == ["q0"]
    assert "timed out: no answer within 1.5s" in str(verdicts["the receive timeout"].verdict)
    assert "failover_timeout" in str(verdicts["a late first check while the deadline is near"].verdict)


# -- each rule and message written once ----------------------------------------------------------


def _package_sources() -> dict[str, str]:
    return {str(path.relative_to(PACKAGE)): path.read_text() for path in PACKAGE.rglob("*.py")}


@pytest.mark.parametrize("pattern", [
    r"(?<!class )AttemptAbandonedError\(",  # every abandon verdict
    r"(?<!def )\bread_check\(",  # what a liveness check's answer means
    r"\.checked\(",  # counting failed checks
    r"\.defer_hedge\(",  # a hedge due during a stall
    r"failover_timeout ran out after \{",  # the abandon messages
    r"no answer within \{",
    r"after waiting \{",
])
def test_a_rule_of_the_attempt_machine_is_written_once(pattern: str) -> None:
    users = {name for name, text in _package_sources().items() if re.search(pattern, text)}
    assert users == {"core/race.py"}, f"{pattern!r} is also used in {sorted(users - {'core/race.py'})}"


def test_the_drivers_do_not_read_wake_reasons() -> None:
    """A driver that looks at why an attempt woke up decides for itself what to do about it."""
    for name, text in _package_sources().items():
        if name.startswith("pools/"):
            assert not re.search(r"\bWake\b", text), name


# -- the async driver: no machine before an attempt's first wake-up ------------------------------


def _plan(liveness: LivenessPolicy) -> Any:
    from clickhouse_lb.config.attempt_settings import AttemptSettings
    from clickhouse_lb.config.hedging import HedgePolicy
    from clickhouse_lb.config.timeouts import Timeouts
    from clickhouse_lb.core._statements import prepare_call
    from clickhouse_lb.core.attempt_specs import StatementPlan
    from clickhouse_lb.core.deadline import Deadline
    from clickhouse_lb.core.hedging import LatencyWindow

    return StatementPlan(
        settings=AttemptSettings(Timeouts(connect=1.0), liveness, HedgePolicy()), deadline=Deadline(None),
        addresses=("r0:8123",), statement=prepare_call("query", ("SELECT 1",), {}, 1, auto_token=True),
        window=LatencyWindow(), count_failure=lambda index, exc: None, count_slowdown=lambda index: None,
        hedge_candidate=lambda running: None,
    )


def machines_built(monkeypatch: pytest.MonkeyPatch, driver_module: Any) -> list[AttemptMachine]:
    """Every AttemptMachine the driver module builds from now on, in order."""
    built: list[AttemptMachine] = []

    class Counted(AttemptMachine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(driver_module, "AttemptMachine", Counted)
    return built


def test_the_async_driver_builds_a_machine_only_for_an_attempt_that_outlives_its_first_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from clickhouse_lb.pools import _drive_async

    built = machines_built(monkeypatch, _drive_async)
    cancelled: list[int] = []

    async def call(index: int, query_id: str | None) -> str:
        return "rows"

    async def hangs(index: int, query_id: str | None) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(index)
            raise
        return "late"

    async def ping(index: int, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    async def kill(index: int, query_id: str) -> None:
        return None

    async def main() -> None:
        driver = _drive_async.AsyncDriver()
        quick = LivenessPolicy(check_after=0.05, ping_timeout=0.05, stall_tolerance=60)
        assert await driver.run_planned(_plan(quick), 0, call, ping, kill) == (0, "rows")
        assert built == []  # answered before its first check: no machine, no spec
        outer = asyncio.current_task()

        async def on_this_task(index: int, query_id: str | None) -> bool:
            return asyncio.current_task() is outer

        # Nothing can wake it (no check, timeout or deadline): awaited in place, not as a task.
        assert await driver.run_planned(_plan(LivenessPolicy(check_after=None)), 0, on_this_task, ping, kill) == \
            (0, True)
        with pytest.raises(RaceFailure) as caught:
            await driver.run_planned(_plan(quick), 0, hangs, ping, kill)
        assert getattr(caught.value.error, "kind", None) == "hung"
        assert len(built) == 1  # built at its first check, on the run already out
        await asyncio.sleep(0)
        assert cancelled == [0]

    asyncio.run(main())


def test_the_thread_driver_builds_a_machine_only_for_an_attempt_that_outlives_its_first_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from clickhouse_lb.pools import _drive_sync

    built = machines_built(monkeypatch, _drive_sync)
    driver = _drive_sync.SyncDriver()
    quick = LivenessPolicy(check_after=0.05, ping_timeout=0.05, stall_tolerance=60)
    never = lambda index, query_id: None  # noqa: E731
    assert driver.run_planned(_plan(quick), 0, lambda index, query_id: "rows", lambda i, t: False, never) == \
        (0, "rows")
    assert built == []  # answered before its first check: no machine, no spec
    caller = threading.get_ident()
    # Nothing can wake it (no check, timeout or deadline): called on this thread, no worker.
    assert driver.run_planned(_plan(LivenessPolicy(check_after=None)), 0,
                              lambda index, query_id: threading.get_ident() == caller, lambda i, t: False, never) == \
        (0, True)
    release = threading.Event()
    try:
        with pytest.raises(RaceFailure) as caught:
            driver.run_planned(_plan(quick), 0, lambda index, query_id: release.wait(30), lambda i, t: False, never)
        assert getattr(caught.value.error, "kind", None) == "hung"
        assert len(built) == 1  # built at its first check, on the run already out
    finally:
        release.set()
