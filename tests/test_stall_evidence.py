"""Evidence that survives a stall of this process (clickhouse_lb.core.stalls, the pings of
clickhouse_lb.probes._stall_ping): the kernel receives while this process does not run, so a
ping whose socket is still silent when its late waiter looks at it shows a silent replica, and
only an answer already waiting makes the lateness this process's own. And a cold start: a
replica never pinged before answering late is not hung."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from clickhouse_lb.core.stalls import Evidence, PingReading, judge, read_check
from clickhouse_lb.probes import _stall_ping
from clickhouse_lb.probes._stall_ping import StallAwarePinger, stall_aware_wait

TOLERANCE = 0.05

#: Needs a process that runs on time: skipped under tools/busy_machine_tests.py's GIL holder.
on_time_process = pytest.mark.on_time_process


def test_a_silent_socket_is_evidence_however_late_its_waiter_woke() -> None:
    silent = PingReading(False, 0.95, 0.15, late=0.8, silent=True)
    assert judge(silent, TOLERANCE) is Evidence.DOWN
    # Only an answer already waiting, or a waiter that cannot tell, makes the lateness ours.
    assert judge(silent._replace(silent=False), TOLERANCE) is Evidence.INCONCLUSIVE
    # A read: counted even when the check itself started late (a hold before the check).
    assert read_check(silent, woke_late=0.8, elapsed=0.95, timeout=0.15, tolerance=TOLERANCE) == (False, False, False)
    # A write is given up only on checks that ran on time: a stalled one never counts.
    assert read_check(silent, woke_late=0.0, elapsed=0.95, timeout=0.15, tolerance=TOLERANCE, retry_safe=False).stalled
    on_time = PingReading(False, 0.15, 0.15, late=0.01, silent=True)
    assert not read_check(on_time, woke_late=0.0, elapsed=0.15, timeout=0.15, tolerance=TOLERANCE,
                          retry_safe=False).stalled


def test_a_sync_ping_of_a_silent_replica_stalled_in_every_wait_is_evidence(
    slow_ping_server: tuple[str, list[float]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every blocking wait is followed by 0.3 s without the GIL (another thread's holds back to
    back): no wait of the ping ever ends on time, yet its socket, looked at without blocking
    after the first, holds nothing: the replica was silent for the whole real time."""
    url, delay = slow_ping_server
    delay[0] = 5.0
    real = _stall_ping._readable

    def stalled_after_each_wait(sock: socket.socket, timeout: float) -> bool:
        ready = real(sock, timeout)
        if timeout > 0:
            time.sleep(0.3)
        return ready

    monkeypatch.setattr(_stall_ping, "_readable", stalled_after_each_wait)
    pinger = StallAwarePinger(tolerance=TOLERANCE)
    reading = pinger.ping(url, 0.15)
    pinger.close()
    assert not reading.ok
    assert reading.late > TOLERANCE
    assert reading.silent
    assert judge(reading, TOLERANCE) is Evidence.DOWN
    # (An answer that came in such a stall is found: tests/test_stalls.py, "answered while its waiter stalled".)


@on_time_process
def test_a_silence_through_a_stall_spent_waiting_for_a_cpu_proves_nothing(
    slow_ping_server: tuple[str, list[float]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same stalled waits, but the thread spent them runnable, waiting for a CPU (as behind
    CPU hogs): the machine was short of CPU, a replica on it may have been starved alike."""
    url, delay = slow_ping_server
    delay[0] = 5.0
    real = _stall_ping._readable
    runnable = [0.0]

    def starved_after_each_wait(sock: socket.socket, timeout: float) -> bool:
        ready = real(sock, timeout)
        if timeout > 0:
            time.sleep(0.3)
            runnable[0] += 0.3 + timeout  # (every second of it on a run queue)
        return ready

    monkeypatch.setattr(_stall_ping, "_readable", starved_after_each_wait)
    monkeypatch.setattr(_stall_ping, "run_delay", lambda: runnable[0])
    pinger = StallAwarePinger(tolerance=TOLERANCE)
    reading = pinger.ping(url, 0.15)
    pinger.close()
    assert not reading.ok
    assert not reading.silent
    assert judge(reading, TOLERANCE) is Evidence.INCONCLUSIVE


@on_time_process
def test_an_async_ping_of_a_silent_replica_is_evidence_after_the_loop_had_one_look() -> None:
    """The loop is blocked 0.4 s inside the ping's wait, and again 0.2 s after it woke: the
    first look after the stall (``tolerance``) is enough to call a silent replica down; a
    whole second timeout would have run into the second block and proved nothing."""

    async def silent(timeout: float) -> bool:
        await asyncio.sleep(5)
        return True

    async def blocked_twice() -> PingReading:
        loop = asyncio.get_running_loop()
        loop.call_later(0.15, time.sleep, 0.4)  # the request went out at once: 0.15 s on time first
        loop.call_later(0.75, time.sleep, 0.3)
        return await stall_aware_wait(silent, 0.3, 0.1)

    reading = asyncio.run(blocked_twice())
    assert not reading.ok
    assert reading.silent
    assert judge(reading, 0.1) is Evidence.DOWN


@on_time_process
def test_an_async_ping_stalled_before_its_request_could_go_gets_a_whole_timeout() -> None:
    """A stall from the ping's first moment: its request may have been sent only when the stall
    ended, so one look is not evidence; a replica answering 0.1 s after that is alive."""

    async def answers_after_a_tenth(timeout: float) -> bool:
        await asyncio.sleep(0.1)
        return True

    async def blocked_at_once() -> PingReading:
        asyncio.get_running_loop().call_soon(time.sleep, 0.3)  # runs before the ping's first step
        return await stall_aware_wait(answers_after_a_tenth, 0.15, TOLERANCE)

    assert asyncio.run(blocked_at_once()).ok


@on_time_process  # its replica is a thread of this process: a GIL hold delays the answers too
def test_a_just_started_replica_answering_its_first_pings_late_is_not_hung(
    slow_ping_server: tuple[str, list[float]],
) -> None:
    """Sync and async liveness checks of a replica never pinged before (a fresh port), which
    answers 0.3 s late: over the 150 ms floor, under the cap."""
    from clickhouse_lb.pools._liveness import SyncLiveness, async_reading

    url, delay = slow_ping_server
    delay[0] = 0.3
    address = url.split("//", 1)[1].split("/", 1)[0]
    liveness = SyncLiveness()
    reading = liveness.ping(url, address, 0.15)
    liveness.close()
    assert reading.ok, reading

    async def answers_late(timeout: float) -> bool:
        await asyncio.sleep(0.3)
        return True

    assert asyncio.run(async_reading(answers_late, f"async-{address}", 0.15)).ok
