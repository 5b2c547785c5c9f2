"""The async probe worker and the aiohttp pings (the ``async`` extra: not in the compat job,
whose clickhouse-connect 0.x has no async client). Synchronised on listener events, never
on sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import BalancingSettings
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.events import ReplicaRecoveredEvent
from clickhouse_lb.core.health import HealthMonitor, ProbeOutcome
from clickhouse_lb.probes._ping import AsyncPinger, delay_url
from clickhouse_lb.probes.workers import AsyncProbeWorker

from .fakes import refused, reply
from .test_probing import FAST, WAIT, closed_port, http_replica, silent_replica

__all__ = ["closed_port", "http_replica", "silent_replica"]  # fixtures, shared


class AsyncScriptedPinger:
    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.closed = False

    async def ping(self, url: str) -> ProbeOutcome:
        answer = self.answers.get(url, "ok")
        return ProbeOutcome(answer == "ok", 0.001, None if answer == "ok" else answer)

    async def delay(self, url: str) -> tuple[float | None, str | None]:
        return 7.0, None

    async def close(self) -> None:
        self.closed = True


class AsyncWaiter:
    """Listener events on the loop; a test waits on them without polling."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._changed: asyncio.Event | None = None

    def on_probe(self, event: Any) -> None:
        self.events.append(event)
        if self._changed is not None:
            self._changed.set()

    on_replica_recovered = on_probe

    async def wait_for(self, predicate: Any) -> None:
        async def until() -> None:
            while not predicate(self.events):
                self._changed = asyncio.Event()
                await self._changed.wait()

        await asyncio.wait_for(until(), WAIT)


def async_worker() -> tuple[Balancer, AsyncProbeWorker, AsyncScriptedPinger, AsyncWaiter]:
    waiter = AsyncWaiter()
    balancer = Balancer([Replica("a"), Replica("b")], BalancingSettings(), listeners=[waiter])
    pinger = AsyncScriptedPinger()
    worker = AsyncProbeWorker(HealthMonitor(balancer, FAST), balancer.addresses, {}, pinger_factory=lambda: pinger)
    return balancer, worker, pinger, waiter


async def test_the_async_worker_readmits_and_close_cancels_its_task() -> None:
    balancer, worker, pinger, waiter = async_worker()
    balancer.count_failure(0, refused())
    assert not worker.running
    worker.ensure_started()
    task = worker._task
    worker.ensure_started()
    assert worker._task is task
    await waiter.wait_for(lambda ev: ReplicaRecoveredEvent("a:8123", "probe") in ev)
    assert balancer.statuses()[0].errors_count == 0
    await worker.close()
    assert task is not None
    assert task.done()
    assert pinger.closed


def test_the_async_worker_follows_the_pool_to_a_new_event_loop() -> None:
    _balancer, worker, _, waiter = async_worker()

    async def use() -> None:
        worker.ensure_started()
        seen = len(waiter.events)
        await waiter.wait_for(lambda ev: len(ev) > seen + 1)

    asyncio.run(use())  # the first loop ends (and its task with it)
    asyncio.run(use())  # a statement on a new loop starts a new task there

    async def close() -> None:
        await worker.close()

    asyncio.run(close())




async def test_async_ping(http_replica: str, silent_replica: str, closed_port: str) -> None:
    patient = AsyncPinger({}, timeout=10)  # answers are checked, not how fast the in-process server is
    pinger = AsyncPinger({}, timeout=0.3)
    try:
        assert (await patient.ping(f"http://{http_replica}/ping")).ok
        assert not (await patient.ping(f"http://{closed_port}/ping")).ok
        hung = await pinger.ping(f"http://{silent_replica}/ping")
        assert not hung.ok
        assert hung.error
        assert hung.latency < 10.0  # its own 0.3 s timeout: a silent listener is waited on forever
    finally:
        await patient.close()
        await pinger.close()


async def test_async_delay_read(http_replica: str) -> None:
    pinger = AsyncPinger({"username": "u", "password": "pw"}, timeout=10)  # the answer is checked, not its speed
    try:
        assert await pinger.delay(delay_url(http_replica, {})) == (42.0, None)
    finally:
        await pinger.close()


async def test_a_ping_does_not_wait_behind_a_slow_delay_read() -> None:
    """A busy replica answers its replication-delay read (a SQL query) late but ``/ping`` at
    once: the ping must not queue behind the delay read for a connection (it did, and its
    timeout ran out in the queue: a healthy replica's probe failed)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    reading, release = threading.Event(), threading.Event()

    class Busy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/?query="):
                reading.set()
                release.wait(30)
            reply(self, b"Ok.\n" if self.path == "/ping" else b"0\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    pinger = AsyncPinger({}, timeout=3.0)
    try:
        delay = asyncio.ensure_future(pinger.delay(delay_url(address, {})))
        assert await asyncio.get_running_loop().run_in_executor(None, reading.wait, 10)  # the delay read is out
        answer = await pinger.ping(f"http://{address}/ping")
        assert answer.ok, answer.error
        # Milliseconds, not the delay read's 3 s timeout (queued behind it, the ping got the
        # connection only when that read gave up).
        assert answer.latency < 1.0, answer.latency
        release.set()
        await delay
    finally:
        release.set()
        await pinger.close()
        server.shutdown()
        server.server_close()


class SlowToCancelPinger(AsyncScriptedPinger):
    """A ping that hangs, and on cancellation takes a moment to let go (as an aiohttp request
    does while its connection is torn down)."""

    def __init__(self) -> None:
        super().__init__()
        self.pinging = asyncio.Event()
        self.letting_go = asyncio.Event()
        self.release = asyncio.Event()

    async def ping(self, url: str) -> ProbeOutcome:
        self.pinging.set()
        try:
            await asyncio.Event().wait()  # no answer, ever
        except asyncio.CancelledError:
            self.letting_go.set()
            await self.release.wait()
            raise
        raise AssertionError("unreachable")


async def test_the_worker_closes_its_pinger_when_cancelled_again_while_its_probes_end() -> None:
    """The worker's end waits for its probes; a second cancellation meanwhile (the loop shutting
    down as asyncio.run ends, after a dropped pool's worker began to stop) must not skip closing
    the pinger: its aiohttp sessions were left open ("Unclosed client session" at exit)."""
    waiter = AsyncWaiter()
    balancer = Balancer([Replica("a"), Replica("b")], BalancingSettings(), listeners=[waiter])
    pinger = SlowToCancelPinger()
    worker = AsyncProbeWorker(HealthMonitor(balancer, FAST), balancer.addresses, {}, pinger_factory=lambda: pinger)
    worker.ensure_started()
    task = worker._task
    assert task is not None
    await asyncio.wait_for(pinger.pinging.wait(), WAIT)
    task.cancel()  # the worker stops: its probes are cancelled and awaited
    await asyncio.wait_for(pinger.letting_go.wait(), WAIT)
    task.cancel()  # cancelled again while it waits for them
    pinger.release.set()
    done, _ = await asyncio.wait([task], timeout=WAIT)
    assert task in done
    assert task.cancelled()
    assert pinger.closed
    await worker.close()
