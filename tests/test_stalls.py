"""The failure detector (clickhouse_lb.core.stalls) and the pings that feed it: a ping that failed
while this process stalled is not evidence against the replica; "slow" is judged against the
replica's own history; a write is only given up on evidence."""

from __future__ import annotations

import asyncio
import functools
import itertools
import socket
import time

import pytest

from clickhouse_lb.config.liveness import LivenessPolicy
from clickhouse_lb.core.stalls import (
    Evidence,
    LatencyHistory,
    PingReading,
    ReplicaDetector,
    StallLog,
    judge,
    read_check,
)
from clickhouse_lb.core.watch import AttemptWatch, Wake
from clickhouse_lb.probes import _stall_ping
from clickhouse_lb.probes._stall_ping import StallAwarePinger, stall_aware_wait

TOLERANCE = 0.05

#: Needs a process that runs on time: skipped under tools/busy_machine_tests.py's GIL holder.
on_time_process = pytest.mark.on_time_process


def test_a_failed_ping_whose_waiter_woke_late_proves_nothing() -> None:
    assert judge(PingReading(True, 0.9, 0.15), TOLERANCE) is Evidence.ALIVE
    assert judge(PingReading(False, 0.15, 0.15, late=0.002), TOLERANCE) is Evidence.DOWN
    assert judge(PingReading(False, 0.95, 0.15, late=0.8), TOLERANCE) is Evidence.INCONCLUSIVE
    # Refused or reset: the replica is gone, whatever this process was doing.
    assert judge(PingReading(False, 0.95, 0.15, late=0.8, hard=True), TOLERANCE) is Evidence.DOWN


def test_the_timeout_adapts_to_a_replica_that_is_always_slow_and_never_falls_under_the_floor() -> None:
    far, near = LatencyHistory(), LatencyHistory()
    assert far.timeout(0.15) == 0.15  # no history yet: the configured timeout
    for latency in itertools.islice(itertools.cycle([0.30, 0.32, 0.31, 0.33]), 20):
        far.record(latency)
        near.record(latency / 300)
    assert 0.33 < far.timeout(0.15) < 0.6
    assert near.timeout(0.15) == 0.15


def test_a_few_stalled_readings_do_not_teach_the_detector_that_a_replica_is_slow() -> None:
    history = LatencyHistory()
    for n in range(30):
        history.record(0.12 if n % 5 == 0 else 0.001, timeout=0.15)  # one in five stalled
        history.record(0.8, timeout=0.15)  # longer than its timeout: only a stall reads that long
    assert history.timeout(0.15) == 0.15


#: 32 consecutive /ping latencies (ms) of a LocalCluster replica saturated by 12 threads of
#: CPU-heavy reads (load 14 on 2 cores); over 350 such pings: p50 13 ms, p90 73 ms, p99 0.30 s.
SATURATED_MS = [118, 4, 7, 21, 34, 0, 28, 1, 1, 73, 36, 9, 68, 1, 22, 25, 28, 13, 32, 1, 5, 1, 19, 21, 59, 28,
                1, 146, 2, 46, 24, 10]


def test_a_saturated_replica_that_answers_late_is_given_its_tail_and_an_idle_one_is_not() -> None:
    """Busy is not hung: a replica whose pings answer in milliseconds and sometimes in tenths of
    a second is given more than its p99 (0.3 s; at the 150 ms floor it was called hung about
    once in 40 pings); a replica answering in ~1 ms keeps the floor, so a stopped one is still
    caught after 150 ms."""
    busy, idle = LatencyHistory(), LatencyHistory()
    for ms in SATURATED_MS:
        busy.record(ms / 1000, timeout=0.15)
        idle.record(0.001 + (ms % 3) / 10_000, timeout=0.15)
    assert busy.timeout(0.15, cap=0.6) > 0.3
    assert idle.timeout(0.15, cap=0.6) == 0.15


def test_an_answer_read_after_a_stall_of_this_process_is_not_learnt_as_a_latency() -> None:
    detector = ReplicaDetector()
    detector.observe("a:1", PingReading(True, 0.12, 0.15, late=0.1), TOLERANCE)
    assert detector.observe("a:1", PingReading(True, 0.12, 0.15, late=0.1), TOLERANCE) is Evidence.ALIVE
    assert detector.history("a:1").count == 0
    detector.observe("a:1", PingReading(True, 0.002, 0.15), TOLERANCE)
    assert detector.history("a:1").count == 1


def test_the_detector_caps_an_adapted_timeout() -> None:
    detector = ReplicaDetector(cap_factor=4)
    for _ in range(10):
        detector.observe("a:1", PingReading(True, 5.0, 10.0), TOLERANCE)
    assert detector.ping_timeout("a:1", 0.15) == pytest.approx(0.6)
    detector.observe("b:1", PingReading(False, 0.15, 0.15), TOLERANCE)  # a failure is not a latency
    assert detector.history("b:1").count == 0


def test_a_check_reads_a_bare_bool_by_its_timing_and_a_reading_by_its_own_lateness() -> None:
    assert read_check(False, woke_late=0.0, elapsed=0.9, timeout=0.15, tolerance=TOLERANCE).stalled
    assert not read_check(False, woke_late=0.0, elapsed=0.15, timeout=0.15, tolerance=TOLERANCE).stalled
    # A reading that waited two timeouts on time (it looked again after a stall) is evidence.
    silent = PingReading(False, 0.9, 0.15, late=0.01)
    assert read_check(silent, woke_late=0.0, elapsed=0.9, timeout=0.15, tolerance=TOLERANCE) == (False, False, False)
    # A check that started 0.8 s late whose ping then waited on time: asked again (see read_check).
    assert read_check(silent, woke_late=0.8, elapsed=0.9, timeout=0.15, tolerance=TOLERANCE).stalled
    refused = PingReading(False, 0.001, 0.15, hard=True)
    assert read_check(refused, woke_late=0.5, elapsed=0.5, timeout=0.15, tolerance=TOLERANCE).hard


def test_a_write_is_never_given_up_on_stalled_checks() -> None:
    watch = AttemptWatch(0.0, retry_safe=False)
    now = 0.1
    for _ in range(50):
        assert watch.checked(False, now, stalled=True) is False
        wake, delay = watch.next_wake(now)
        assert wake is Wake.CHECK
        now += delay + 0.8
    # Shown gone: abandoned at once.
    assert watch.checked(False, now, hard=True) is True


def test_a_write_is_given_up_after_failed_checks_that_did_not_stall() -> None:
    watch = AttemptWatch(0.0, liveness=LivenessPolicy(failed_checks_for_writes=3), retry_safe=False)
    assert watch.checked(False, 0.25) is False
    assert watch.checked(False, 0.4, stalled=True) is False  # does not count, does not reset
    assert watch.checked(False, 0.55) is False
    assert watch.checked(False, 0.7) is True


def test_a_hedge_due_after_a_stall_waits_once_for_an_answer_already_in_hand() -> None:
    watch = AttemptWatch(0.0, liveness=LivenessPolicy(check_after=None), hedge_after=0.1)
    assert watch.defer_hedge(0.9, woke_late=0.8) is True
    assert watch.next_wake(0.9) == (Wake.HEDGE, pytest.approx(TOLERANCE))
    assert watch.defer_hedge(0.95, woke_late=0.8) is False  # once only
    assert AttemptWatch(0.0, hedge_after=0.1).defer_hedge(0.11, woke_late=0.01) is False


@on_time_process
def test_a_sync_ping_answered_while_its_waiter_stalled_counts_as_answered(
    slow_ping_server: tuple[str, list[float]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = slow_ping_server
    on_time = StallAwarePinger(tolerance=TOLERANCE)
    missed = on_time.ping(url, 0.15)  # answered after 0.2 s, waited on time: a real timeout
    assert not missed.ok
    assert missed.late < 0.05
    on_time.close()
    # The waiter's first wait ends at 0.15 s, then it does not run for 0.3 s (as behind a thread
    # holding the GIL): the answer came at 0.2 s, it is in the socket when the waiter looks again.
    real = _stall_ping._readable
    calls = [0]

    def stalled_after_first_wait(sock: socket.socket, timeout: float) -> bool:
        ready = real(sock, timeout)
        calls[0] += 1
        if calls[0] == 1:
            time.sleep(0.3)
        return ready

    monkeypatch.setattr(_stall_ping, "_readable", stalled_after_first_wait)
    stalled = StallAwarePinger(tolerance=TOLERANCE)
    reading = stalled.ping(url, 0.15)
    stalled.close()
    assert reading.ok, reading


@on_time_process
def test_a_sync_ping_of_a_silent_replica_fails_on_time(slow_ping_server: tuple[str, list[float]]) -> None:
    url, delay = slow_ping_server
    delay[0] = 5.0
    pinger = StallAwarePinger(tolerance=TOLERANCE)
    started = time.monotonic()
    reading = pinger.ping(url, 0.15)
    pinger.close()
    assert not reading.ok
    assert judge(reading, TOLERANCE) is Evidence.DOWN
    assert time.monotonic() - started < 1.5  # the 5 s answer is not waited for


def test_a_refused_ping_is_hard_evidence() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        reading = StallAwarePinger().ping(f"http://127.0.0.1:{port}/ping", 0.15)
    assert not reading.ok
    assert reading.hard


@on_time_process
def test_an_async_ping_answered_while_the_loop_was_blocked_counts_as_answered() -> None:
    async def ping(timeout: float) -> bool:
        await asyncio.sleep(0.2)
        return True

    async def blocked_then_ping() -> PingReading:
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, time.sleep, 0.3)  # the loop does not run from 0.01 to 0.31 s
        return await stall_aware_wait(ping, 0.15, TOLERANCE)

    async def on_time_ping() -> PingReading:
        return await stall_aware_wait(ping, 0.15, TOLERANCE)

    assert asyncio.run(blocked_then_ping()).ok
    missed = asyncio.run(on_time_ping())
    assert not missed.ok
    assert judge(missed, TOLERANCE) is Evidence.DOWN


def test_a_stall_log_says_how_much_of_a_window_the_loop_was_stalled() -> None:
    log = StallLog()
    log.record(1.0, 1.8)  # a beat due at 1.0 ran at 1.8: the loop did not run in between
    log.record(2.0, 2.01)  # 10 ms late: a time slice of a busy machine, not a stall
    log.record(3.0, 3.5)
    assert log.stalled(0.0, 10.0) == pytest.approx(1.3)
    assert log.stalled(1.5, 3.2) == pytest.approx(0.5)
    assert log.stalled(1.9, 2.9) == 0.0


def _timed_out_connect(timeout: BaseException | None = None) -> Exception:
    """What clickhouse-connect raises for aiohttp's connect timeout: OperationalError from
    ConnectionTimeoutError from the TimeoutError of asyncio.timeout (from its CancelledError)."""
    aiohttp = pytest.importorskip("aiohttp")
    from clickhouse_connect.driver.exceptions import OperationalError

    if timeout is None:
        timeout = TimeoutError()
        timeout.__context__ = asyncio.CancelledError()
    error = aiohttp.ConnectionTimeoutError("Connection timeout to host http://127.0.0.1:1")
    error.__cause__ = timeout
    wrapped = OperationalError("Network Error")
    wrapped.__cause__ = error
    return wrapped


@on_time_process
def test_an_async_connect_timeout_in_a_loop_stall_is_tried_again_and_a_real_one_raises() -> None:
    from clickhouse_lb.pools._liveness import connect_timed_out, stall_tolerant_run

    assert connect_timed_out(_timed_out_connect())
    refused = OSError("Cannot connect")
    refused.__cause__ = ConnectionRefusedError()
    assert not connect_timed_out(refused)
    calls: list[int] = []

    async def connect(index: int, query_id: str | None, *, connect_takes: float, block: float) -> str:
        # A connect taking ``connect_takes`` under aiohttp's 100 ms timer, the loop blocked
        # ``block`` seconds (another thread holding the GIL) on the first try only.
        calls.append(index)
        if block and len(calls) == 1:
            asyncio.get_running_loop().call_soon(time.sleep, block)
        try:
            async with asyncio.timeout(0.1):
                await asyncio.sleep(connect_takes)
        except TimeoutError as exc:
            raise _timed_out_connect(exc)  # noqa: B904 - its cause is set as aiohttp sets it
        return "answered"

    async def stalled() -> str:
        return await stall_tolerant_run(functools.partial(connect, connect_takes=0.01, block=0.3), 1, "q")

    async def black_hole() -> str:
        return await stall_tolerant_run(functools.partial(connect, connect_takes=5.0, block=0.0), 1, "q")

    # The loop did not run for 0.3 s: the 10 ms connect timed out in the stall, and ran again.
    assert asyncio.run(stalled()) == "answered"
    assert calls == [1, 1]
    # The loop ran on time through a whole connect timeout: evidence, raised at once.
    calls.clear()
    with pytest.raises(Exception, match="Network Error") as raised:
        asyncio.run(black_hole())
    assert connect_timed_out(raised.value)
    assert calls == [1]


@on_time_process
def test_the_loop_heartbeat_beats_only_while_watched() -> None:
    from clickhouse_lb.probes._loop_stalls import loop_meter

    async def main() -> tuple[float, float, bool]:
        meter = loop_meter()
        with meter.watching() as since:
            await asyncio.sleep(0.05)
            time.sleep(0.3)  # the loop blocked
            await asyncio.sleep(0.05)
            blocked = meter.stalled(since)
        quiet_since = meter.now()
        await asyncio.sleep(0.1)
        return blocked, meter.stalled(quiet_since), meter._handle is None

    blocked, quiet, stopped = asyncio.run(main())
    assert blocked > 0.2  # 0.3 s less at most one beat interval
    assert quiet == 0.0
    assert stopped


@on_time_process
def test_an_async_ping_delayed_by_a_stall_inside_its_wait_is_asked_again() -> None:
    async def ping(timeout: float) -> bool:
        # Two steps of I/O, 140 ms in all: within the 150 ms wait on a loop that runs.
        await asyncio.sleep(0.1)
        await asyncio.sleep(0.04)
        return True

    async def stalled_in_the_middle() -> PingReading:
        # Blocked from 10 to 120 ms: the second step ends at 160 ms, after the wait, whose own
        # timer still runs on time (its lateness alone shows no stall).
        asyncio.get_running_loop().call_later(0.01, time.sleep, 0.11)
        return await stall_aware_wait(ping, 0.15, TOLERANCE)

    assert asyncio.run(stalled_in_the_middle()).ok


def test_a_write_is_shown_gone_by_a_growing_silence_not_three_short_ones() -> None:
    write = AttemptWatch(0.0, retry_safe=False)
    timeouts = []
    now = 0.1
    for _ in range(3):
        wake, delay = write.next_wake(now)
        now += delay
        assert wake is Wake.CHECK
        timeouts.append(write.ping_timeout(now))
        now += timeouts[-1]
        hung = write.checked(False, now)
    assert timeouts == pytest.approx([0.15, 0.6, 2.4])
    assert hung  # silent through all three: shown gone, about 3.55 s after the write started
    assert now == pytest.approx(3.55)
    # A replica busy for 2 s (its own work held its GIL; measured on a LocalCluster replica
    # running clickhouse-connect's suite) answers the third check: kept.
    busy = AttemptWatch(0.0, retry_safe=False)
    assert busy.checked(False, 0.25) is False
    assert busy.checked(False, 1.0) is False
    assert busy.ping_timeout(1.15) == pytest.approx(2.4)  # the third check waits until 3.55 s
    assert busy.checked(True, 2.1) is False
    assert busy.ping_timeout(1.9) == pytest.approx(0.15)  # answered: back to the configured timeout
    # A read still moves on after one failed check.
    assert AttemptWatch(0.0).ping_timeout(0.1) == pytest.approx(0.15)


def test_a_replica_without_ping_history_is_judged_against_the_cap() -> None:
    detector = ReplicaDetector(cap_factor=4)
    assert detector.ping_timeout("cold:1", 0.15) == pytest.approx(0.6)
    # Answered in milliseconds once: held to the floor from then on.
    detector.observe("fast:1", PingReading(True, 0.002, 0.6), TOLERANCE)
    assert detector.ping_timeout("fast:1", 0.15) == pytest.approx(0.15)
    # A just-started replica's first answer took 0.25 s: it keeps the cap until the history is long enough.
    detector.observe("slow:1", PingReading(True, 0.25, 0.6), TOLERANCE)
    for _ in range(LatencyHistory.WARMUP - 2):
        detector.observe("slow:1", PingReading(True, 0.01, 0.6), TOLERANCE)
    assert detector.ping_timeout("slow:1", 0.15) == pytest.approx(0.6)
