"""The sync pool's hold on urllib3: exact timeouts on a clickhouse-connect client, and an
attempt abandoned on a listener that accepts connections but never answers (a hung replica:
the kernel completes the handshake for a stopped process too)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from urllib3 import Timeout

from clickhouse_lb.config.liveness import LivenessPolicy
from clickhouse_lb.config.timeouts import Timeouts
from clickhouse_lb.core.race import AttemptSpec, RaceFailure
from clickhouse_lb.core.watch import AttemptWatch
from clickhouse_lb.errors import AttemptAbandonedError
from clickhouse_lb.pools._drive_sync import SyncDriver
from clickhouse_lb.pools._transport import (
    AttemptConnections,
    current_attempt,
    set_client_timeouts,
    tracking_pool_manager,
)

#: Quick liveness checks that never take the machine's own stalls into account (these tests are
#: about what an abandon does, not about telling a stall from a hang).
QUICK_CHECKS = LivenessPolicy(check_after=0.1, ping_timeout=0.1, stall_tolerance=60)


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """127.0.0.1:port that accepts and then never reads or answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def test_abandoning_an_attempt_closes_the_connection_its_thread_is_blocked_on(silent_listener: str) -> None:
    manager = tracking_pool_manager({})
    assert manager is not None
    connections = AttemptConnections()
    outcome: list[BaseException | str] = []

    def blocked_request() -> None:
        with connections:
            try:
                manager.request("GET", f"http://{silent_listener}/", timeout=Timeout(connect=1, read=30), retries=False)
                outcome.append("answered")
            except Exception as exc:
                outcome.append(exc)

    thread = threading.Thread(target=blocked_request)
    thread.start()
    deadline = time.monotonic() + 5
    while not connections.connections and time.monotonic() < deadline:
        time.sleep(0.01)  # wait for the request to be on the wire (polling a condition, bounded)
    started = time.monotonic()
    connections.abandon()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 10.0  # a third of the 30 s read timeout it would otherwise wait
    assert isinstance(outcome[0], Exception)


def test_sync_driver_abandons_a_hung_attempt_after_a_failed_ping(silent_listener: str) -> None:
    manager = tracking_pool_manager({})
    assert manager is not None
    driver = SyncDriver()
    pings: list[float] = []

    def call(index: int, query_id: str | None) -> Any:
        return manager.request("GET", f"http://{silent_listener}/", timeout=Timeout(connect=1, read=30), retries=False)

    def ping(index: int, timeout: float) -> bool:
        pings.append(timeout)
        try:
            manager.request("GET", f"http://{silent_listener}/ping", timeout=Timeout(total=timeout), retries=False)
        except Exception:
            return False
        return True

    spec = AttemptSpec(
        first=0,
        clock=time.monotonic,
        watch=lambda index, started: AttemptWatch(started, liveness=QUICK_CHECKS),
        address=lambda index: silent_listener,
    )
    started = time.monotonic()
    with pytest.raises(RaceFailure) as caught:
        driver.run(spec, call, ping, lambda index, query_id: None)
    assert time.monotonic() - started < 10.0  # a third of the 30 s read timeout it would otherwise wait
    assert getattr(caught.value.error, "kind", None) == "hung"
    assert pings == [pytest.approx(0.1)]


def test_no_tracking_where_clickhouse_connect_builds_its_own_transport() -> None:
    assert tracking_pool_manager({"http_proxy": "http://proxy:3128"}) is None
    assert tracking_pool_manager({"ca_cert": "/etc/ssl/ca.pem"}) is None
    assert tracking_pool_manager({"verify": False}) is None
    assert tracking_pool_manager({"compress": True}) is not None


class _ClientLike:
    def __init__(self) -> None:
        self.timeout = Timeout(connect=1, read=300)


def test_exact_timeouts_are_set_where_every_clickhouse_connect_keeps_them() -> None:
    client = _ClientLike()
    assert set_client_timeouts(client, Timeouts(connect=0.15, send=0.5, receive=0.5))
    assert client.timeout.connect_timeout == 0.15
    assert client.timeout.read_timeout == 0.5


def test_a_client_without_a_urllib3_timeout_is_left_alone() -> None:
    class Other:
        timeout = 5

    other = Other()
    assert not set_client_timeouts(other, Timeouts(connect=0.15, send=0.5, receive=0.5))
    assert other.timeout == 5


def test_async_driver_cancels_a_hung_run_and_kills_a_lost_hedge() -> None:
    import asyncio

    from clickhouse_lb.pools._drive_async import AsyncDriver

    cancelled: list[int] = []
    killed: list[tuple[int, str]] = []

    async def call(index: int, query_id: str | None) -> str:
        try:
            await asyncio.sleep(0.05 if index == 1 else 30)
        except asyncio.CancelledError:
            cancelled.append(index)
            raise
        return f"rows@{index}"

    async def ping(index: int, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    async def kill(index: int, query_id: str) -> None:
        killed.append((index, query_id))

    async def main() -> None:
        driver = AsyncDriver()
        hung = AttemptSpec(first=0, clock=time.monotonic, watch=lambda index, started: AttemptWatch(started))
        started = time.monotonic()
        with pytest.raises(RaceFailure) as caught:
            await driver.run(hung, call, ping, kill)
        assert getattr(caught.value.error, "kind", None) == "hung"
        assert time.monotonic() - started < 10.0  # a third of the 30 s the call would otherwise sleep
        await asyncio.sleep(0)
        assert cancelled == [0]
        assert killed == []  # a hung replica is not asked to kill anything

        ids = iter(["q-slow", "q-fast"])
        hedged = AttemptSpec(
            first=0,
            clock=time.monotonic,
            watch=lambda index, started: AttemptWatch(
                started, hedge_after=0.05, liveness=LivenessPolicy(check_after=None)  # the hedge alone
            ),
            hedge_index=lambda running: None if 1 in running else 1,
            query_id=lambda: next(ids),
        )
        assert await driver.run(hedged, call, ping, kill) == (1, "rows@1")
        for _ in range(3):
            await asyncio.sleep(0)
        assert cancelled == [0, 0]
        assert killed == [(0, "q-slow")]

    asyncio.run(main())


def test_the_watchdog_abandons_a_hung_call_running_on_the_callers_thread(silent_listener: str) -> None:
    from clickhouse_lb.pools._watchdog import Watchdog

    manager = tracking_pool_manager({})
    assert manager is not None
    pings: list[int] = []

    def ping(index: int, timeout: float) -> bool:
        pings.append(index)
        time.sleep(timeout)  # a hung replica: no answer within the timeout
        return False

    watchdog = Watchdog(ping, lambda index, query_id: None)

    def call(index: int, query_id: str | None) -> Any:
        return manager.request("GET", f"http://{silent_listener}/", timeout=Timeout(connect=1, read=30), retries=False)

    spec = AttemptSpec(
        first=0,
        clock=time.monotonic,
        watch=lambda index, started: AttemptWatch(started, liveness=QUICK_CHECKS),
        address=lambda index: silent_listener,
    )
    started = time.monotonic()
    with pytest.raises(AttemptAbandonedError) as caught:
        watchdog.run(spec, call)
    assert time.monotonic() - started < 10.0  # a third of the 30 s read timeout it would otherwise wait
    assert caught.value.kind == "hung"
    assert pings == [0]
    # A quick call is not disturbed and costs no check.
    assert watchdog.run(spec, lambda index, query_id: "rows") == (0, "rows")
    assert pings == [0]
    watchdog.close()


def test_the_watchdog_abandons_a_planned_attempt_on_a_hung_replica(silent_listener: str) -> None:
    """The pool's path (an attempt of a statement's plan, its watch built by the watchdog
    thread when it first looks) keeps the liveness checks of :meth:`Watchdog.run`."""
    from clickhouse_lb.config.attempt_settings import AttemptSettings
    from clickhouse_lb.config.hedging import HedgePolicy
    from clickhouse_lb.core._statements import prepare_call
    from clickhouse_lb.core.attempt_specs import StatementPlan
    from clickhouse_lb.core.deadline import Deadline
    from clickhouse_lb.core.hedging import LatencyWindow
    from clickhouse_lb.pools._watchdog import Watchdog

    manager = tracking_pool_manager({})
    assert manager is not None
    watchdog = Watchdog(lambda index, timeout: False, lambda index, query_id: None)
    plan = StatementPlan(
        settings=AttemptSettings(Timeouts(connect=1.0), QUICK_CHECKS, HedgePolicy()), deadline=Deadline(None),
        addresses=(silent_listener,), statement=prepare_call("command", ("DROP TABLE t",), {}, 1, auto_token=True),
        window=LatencyWindow(), count_failure=lambda index, exc: None, count_slowdown=lambda index: None,
        hedge_candidate=lambda running: None,
    )

    def call(index: int, query_id: str | None) -> Any:
        return manager.request("GET", f"http://{silent_listener}/", timeout=Timeout(connect=1, read=30), retries=False)

    started = time.monotonic()
    with pytest.raises(AttemptAbandonedError) as caught:
        watchdog.run_planned(plan, 0, call)
    assert time.monotonic() - started < 10.0  # not the 30 s read timeout (a write waits for 3 failed checks)
    assert caught.value.kind == "hung"
    assert caught.value.address == silent_listener
    assert caught.value.write  # decided from the statement when the verdict was given
    watchdog.close()


def test_the_watchdog_cuts_a_call_at_the_deadline(silent_listener: str) -> None:
    from clickhouse_lb.pools._watchdog import Watchdog

    manager = tracking_pool_manager({})
    assert manager is not None
    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None)
    deadline = time.monotonic() + 0.3
    spec = AttemptSpec(
        first=0,
        clock=time.monotonic,
        watch=lambda index, started: AttemptWatch(started, deadline_at=deadline),
        address=lambda index: silent_listener,
    )

    def call(index: int, query_id: str | None) -> Any:
        return manager.request("GET", f"http://{silent_listener}/", timeout=Timeout(connect=1, read=30), retries=False)

    with pytest.raises(AttemptAbandonedError) as caught:
        watchdog.run(spec, call)
    assert caught.value.kind == "deadline"
    assert time.monotonic() - deadline < 10.0  # a third of the 30 s read timeout it would otherwise wait
    watchdog.close()


def test_the_watchdog_plans_an_attempts_first_check_when_it_starts() -> None:
    """A check is stalled when it runs later than planned; the first one is planned at the
    attempt's start plus check_after (planned at the start itself, every hung read would be
    taken for a stall and cost a second ping)."""
    from clickhouse_lb.pools._watchdog import Watchdog
    from clickhouse_lb.pools._watched import Watched

    now = [100.0]
    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None, clock=lambda: now[0])
    spec = AttemptSpec(first=0, clock=lambda: now[0], watch=lambda index, started: AttemptWatch(started))
    entry = Watched.of_spec(spec, None, 100.0)
    assert entry.planned == pytest.approx(100.1)
    watchdog.close()


def test_an_idle_watchdog_ends_its_thread() -> None:
    """A pool nobody closes (an engine per request) must not keep a thread per pool."""
    from clickhouse_lb.pools._watchdog import Watchdog

    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None, idle_exit=0.05)
    spec = AttemptSpec(first=0, clock=time.monotonic, watch=lambda index, started: AttemptWatch(started))
    assert watchdog.run(spec, lambda index, query_id: "rows") == (0, "rows")
    thread = watchdog._thread
    assert thread is not None
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert watchdog.run(spec, lambda index, query_id: "again") == (0, "again")  # a new one starts
    watchdog.close()


def test_an_attempt_with_nothing_to_wait_for_does_not_keep_the_watchdog_awake() -> None:
    """The watchdog sees every running attempt of its own (the threads' running attempts); one it
    will never act on (no check, no timeout, no deadline) must not keep its thread from ending."""
    from clickhouse_lb.pools._watchdog import Watchdog

    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None, idle_exit=0.05)
    never = AttemptSpec(first=0, clock=time.monotonic,
                        watch=lambda index, started: AttemptWatch(started, liveness=LivenessPolicy(check_after=None)))
    checked = AttemptSpec(first=0, clock=time.monotonic, watch=lambda index, started: AttemptWatch(started))
    running, release = threading.Event(), threading.Event()

    def waits(index: int, query_id: str | None) -> str:
        running.set()
        release.wait(30)
        return "rows"

    outcome: list[Any] = []
    caller = threading.Thread(target=lambda: outcome.append(watchdog.run(never, waits)))
    caller.start()
    try:
        assert running.wait(10)
        assert watchdog._thread is None  # nothing to wait for: the watchdog is not even started
        assert watchdog.run(checked, lambda index, query_id: "checked") == (0, "checked")
        thread = watchdog._thread
        assert thread is not None
        thread.join(timeout=5)
        assert not thread.is_alive()  # ended while the attempt with nothing to wait for still runs
    finally:
        release.set()
        caller.join(timeout=10)
        watchdog.close()
    assert outcome == [(0, "rows")]


def test_a_connect_that_timed_out_is_not_waited_for_twice_in_one_attempt(silent_listener: str) -> None:
    """urllib3 retries a connect once; the pool fails over instead of waiting the timeout again."""
    from urllib3.exceptions import ConnectTimeoutError

    from clickhouse_lb.pools._transport import _TrackedHTTPConnection

    host, port = silent_listener.split(":")
    attempt = AttemptConnections(connect_timeout=0.05)
    connection = _TrackedHTTPConnection(host, int(port), timeout=30)
    with attempt:
        connection.connect()  # the listener accepts: this one connects
        assert connection.timeout == 0.05  # the attempt's exact connect timeout, not the client's 30 s
        attempt.connect_timed_out = True
        started = time.monotonic()
        with pytest.raises(ConnectTimeoutError):
            _TrackedHTTPConnection(host, int(port), timeout=30).connect()
        # Refused without connecting (the raise: this listener would accept); the bound is a
        # third of the client's 30 s timeout, the longest a connect here could wait.
        assert time.monotonic() - started < 10.0
    connection.close()


def test_a_refused_connect_is_not_taken_for_a_timeout() -> None:
    from urllib3.exceptions import NewConnectionError

    from clickhouse_lb.pools._transport import _TrackedHTTPConnection

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: refused
    attempt = AttemptConnections(connect_timeout=1.0)
    with attempt, pytest.raises(NewConnectionError):
        _TrackedHTTPConnection("127.0.0.1", port).connect()
    assert not attempt.connect_timed_out  # the error keeps saying "refused"


class _StallingClock:
    """time.monotonic, moved ahead by hand: the watchdog then wakes up as late as a process
    that stalled for that long (its waits are real, its readings of the time are these)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead


def _stall_spec(clock: _StallingClock, address: str) -> AttemptSpec:
    return AttemptSpec(
        first=0, clock=clock, address=lambda index: address,
        watch=lambda index, started: AttemptWatch(started, liveness=LivenessPolicy(check_after=0.1, ping_timeout=0.1)),
        stall_hedge_index=lambda running: None if 1 in running else 1,
    )


def test_the_watchdog_races_a_read_whose_check_came_due_during_a_stall(silent_listener: str) -> None:
    """The caller's read hangs on replica 0; this process "stalls" 0.5 s (the clock jumps) just
    as it is sent: the watchdog starts the same read on replica 1 on a thread of its own, whose
    answer the caller returns, its own connection shut down (it lost the race, no error)."""
    from clickhouse_lb.pools._watchdog import Watchdog

    manager = tracking_pool_manager({})
    assert manager is not None
    clock = _StallingClock()
    pings: list[int] = []
    pinged = threading.Event()

    def ping(index: int, timeout: float) -> bool:
        pings.append(index)
        pinged.set()
        time.sleep(timeout)
        return False

    watchdog = Watchdog(ping, lambda index, query_id: None, clock=clock)
    lost: list[str] = []

    def call(index: int, query_id: str | None) -> Any:
        if index == 1:
            return "rows@1"
        clock.ahead = 0.5  # the stall, as the request goes out
        try:
            return manager.request("GET", f"http://{silent_listener}/", timeout=Timeout(connect=1, read=30),
                                   retries=False)
        except Exception as exc:
            lost.append(type(exc).__name__)
            raise

    started = time.monotonic()
    assert watchdog.run(_stall_spec(clock, silent_listener), call) == (1, "rows@1")
    assert time.monotonic() - started < 10.0  # a third of the 30 s read timeout replica 0 would cost
    assert len(lost) == 1  # replica 0's request was cut, not left running
    assert pinged.wait(10)  # replica 0 was still checked (on a check thread, maybe after the race ended)
    assert pings == [0]
    watchdog.close()


def test_a_raced_read_that_answers_first_keeps_its_answer_and_the_second_run_is_abandoned(
    silent_listener: str,
) -> None:
    from clickhouse_lb.pools._watchdog import Watchdog

    manager = tracking_pool_manager({})
    assert manager is not None
    clock = _StallingClock()
    watchdog = Watchdog(lambda index, timeout: True, lambda index, query_id: None, clock=clock)
    second_started, second_ended = threading.Event(), threading.Event()

    def call(index: int, query_id: str | None) -> Any:
        if index == 1:  # the second run hangs until it is abandoned
            second_started.set()
            try:
                return manager.request("GET", f"http://{silent_listener}/", timeout=Timeout(connect=1, read=30),
                                       retries=False)
            finally:
                second_ended.set()
        attempt = current_attempt()
        assert attempt is not None
        attempt.request_sent = True  # as the transport marks a request that went out (no answer yet)
        clock.ahead = 0.5
        assert second_started.wait(10)  # the race is on
        return "rows@0"

    assert watchdog.run(_stall_spec(clock, silent_listener), call) == (0, "rows@0")
    assert second_ended.wait(10)  # abandoned, not left to its 30 s read timeout
    watchdog.close()


def test_a_pool_read_raced_after_a_stall_names_the_winner_for_its_success(silent_listener: str) -> None:
    """The sync pool's per-statement path (``partial(watchdog.run_at, attempts, run)``): a read
    on replica 0 stalls, is raced on replica 1, and replica 1 answers first. The statement's
    attempts are told so, and their success is replica 1's: recorded for replica 0, a stopped
    replica that had failed before was announced back in rotation (see tests/test_race_winner.py)."""
    from clickhouse_lb.pools._watchdog import Watchdog
    from tests.fakes import FakeCluster, make_pool

    manager = tracking_pool_manager({})
    assert manager is not None
    clock = _StallingClock()
    pool = make_pool(FakeCluster("a", "b"), load_balancing="in_order", liveness_check_after_ms=100,
                     liveness_ping_timeout_ms=100)
    watchdog = Watchdog(lambda index, timeout: time.sleep(timeout) or False, lambda index, query_id: None,
                        clock=clock)

    def call(index: int, query_id: str | None) -> Any:
        if index == 1:
            return "rows@b"
        clock.ahead = 0.5  # the stall, as the request goes out
        return manager.request("GET", f"http://{silent_listener}/", timeout=Timeout(connect=1, read=30),
                               retries=False)

    _, attempts, _ = pool._begin("query", ("SELECT 1",), {}, pool._view)
    attempts.plan_context = attempts.plan_context._replace(clock=clock)  # the plan on the stalling clock too
    first = attempts.enter()
    assert first == 0
    started = time.monotonic()
    assert watchdog.run_at(attempts, call, first) == "rows@b"
    assert time.monotonic() - started < 10.0  # raced, not left to the 30 s read timeout
    assert attempts.answered_by == 1
    attempts.left(first, "rows@b")
    watchdog.close()
    pool.close()


def test_a_pools_manager_is_registered_while_open_and_released_when_closed_or_dropped() -> None:
    # clickhouse-connect reads its registry of managers on every request (max_connection_age), so
    # an open pool's manager stays in it; a closed or dropped pool's kept its sockets there for
    # the life of the process.
    import gc

    from clickhouse_connect.driver import httputil

    import clickhouse_lb

    closed = clickhouse_lb.get_pool(["ch-1:8123"], connect_on_create=False)
    dropped = clickhouse_lb.get_pool(["ch-2:8123"], connect_on_create=False)
    managers = [closed._manager, dropped._manager]
    assert all(manager in httputil.all_managers for manager in managers)
    closed.close()
    del dropped
    gc.collect()
    assert not any(manager in httputil.all_managers for manager in managers)
