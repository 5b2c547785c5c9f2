"""The probe workers: started lazily, stopped by close(), never blocked by one hung replica,
safe across fork(); and the /ping helpers against tiny loopback servers.

Threads and tasks here are synchronised on events (a probe reported, a replica re-admitted),
never on sleeps; the timeouts only bound a failure.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import pytest

from clickhouse_lb.config.health import HealthSettings
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import BalancingSettings
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.events import ProbeEvent, ReplicaRecoveredEvent
from clickhouse_lb.core.health import HealthMonitor, ProbeOutcome
from clickhouse_lb.probes._ping import SyncPinger, delay_url, ping_url
from clickhouse_lb.probes.workers import ProbeWorker

from .fakes import refused

FAST = HealthSettings(
    health_check_interval_ms=50, health_check_fast_interval_ms=5, health_check_timeout_ms=200,
    health_check_delay_interval_ms=20,
)
WAIT = 30.0  # bounds a failure only (a condition never met); a busy process may need seconds


class ScriptedPinger:
    """Answers per URL: ``ok`` by default; ``hang`` blocks until released."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.release = threading.Event()
        self.calls: list[str] = []
        self.closed = False
        self.delays: dict[str, float] = {}
        self.delay_reads: list[str] = []

    def ping(self, url: str) -> ProbeOutcome:
        self.calls.append(url)
        answer = self.answers.get(url, "ok")
        if answer == "hang":
            self.release.wait(WAIT)
        return ProbeOutcome(answer == "ok", 0.001, None if answer == "ok" else answer)

    def delay(self, url: str) -> tuple[float | None, str | None]:
        self.delay_reads.append(url)
        return self.delays.get(url.partition("/?")[0], 0.0), None

    def close(self) -> None:
        self.closed = True


class Waiter:
    """A listener that lets a test wait for a condition on the events seen so far."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.changed = threading.Condition()

    def _add(self, event: Any) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    on_probe = _add
    on_replica_recovered = _add

    def wait_for(self, predicate: Any) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self.events), timeout=WAIT)


def probes_of(address: str, n: int) -> Any:
    return lambda events: sum(isinstance(e, ProbeEvent) and e.address == address for e in events) >= n


def sync_worker(settings: HealthSettings = FAST) -> tuple[Balancer, ProbeWorker, ScriptedPinger, Waiter]:
    waiter = Waiter()
    balancer = Balancer([Replica("a"), Replica("b")], BalancingSettings(), listeners=[waiter])
    pinger = ScriptedPinger()
    worker = ProbeWorker(HealthMonitor(balancer, settings), balancer.addresses, {}, pinger_factory=lambda: pinger)
    return balancer, worker, pinger, waiter


def test_the_worker_starts_only_when_asked_and_close_stops_it() -> None:
    _balancer, worker, pinger, waiter = sync_worker()
    assert not worker.running
    assert pinger.calls == []
    worker.ensure_started()
    worker.ensure_started()  # idempotent: one thread
    assert worker.running
    assert sum(t.name == "clickhouse-lb-health" for t in threading.enumerate()) >= 1
    thread = worker._thread
    assert waiter.wait_for(probes_of("a:8123", 2))
    worker.close()
    assert thread is not None
    assert not thread.is_alive()
    assert pinger.closed
    assert not worker.running
    worker.ensure_started()  # a closed pool stays closed
    assert not worker.running


def test_probing_off_starts_nothing() -> None:
    _, worker, _pinger, _ = sync_worker(HealthSettings(health_check_interval_ms=0))
    worker.ensure_started()
    assert not worker.running
    assert worker._thread is None
    worker.close()


def test_a_replica_that_answers_again_is_readmitted_by_the_worker() -> None:
    balancer, worker, _, waiter = sync_worker()
    balancer.count_failure(0, refused())
    worker.ensure_started()
    try:
        assert waiter.wait_for(lambda ev: ReplicaRecoveredEvent("a:8123", "probe") in ev)
        assert balancer.statuses()[0].errors_count == 0
    finally:
        worker.close()


def test_the_worker_reads_replication_delays() -> None:
    _, worker, pinger, waiter = sync_worker()
    pinger.delays["http://b:8123"] = 450.0
    worker.ensure_started()
    try:
        # Reads of one replica never overlap: a second read means the first was recorded.
        def read_twice(_: object) -> bool:
            return all(sum(u.startswith(f"http://{h}:8123/") for u in pinger.delay_reads) >= 2 for h in "ab")

        assert waiter.wait_for(read_twice)
        assert [s.delay for s in worker.monitor.statuses()] == [0.0, 450.0]
    finally:
        worker.close()


def test_a_hung_replica_does_not_delay_the_probes_of_the_others() -> None:
    _balancer, worker, pinger, waiter = sync_worker()
    pinger.answers["http://a:8123/ping"] = "hang"
    worker.ensure_started()
    try:
        assert waiter.wait_for(probes_of("b:8123", 5))
        assert pinger.calls.count("http://a:8123/ping") == 1  # one probe in flight per replica
    finally:
        pinger.release.set()
        worker.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX-only")
def test_a_forked_child_starts_its_own_worker_and_leaves_the_parents_alone() -> None:
    _balancer, worker, _pinger, waiter = sync_worker()
    worker.ensure_started()
    assert waiter.wait_for(probes_of("a:8123", 1))
    parent_thread = worker._thread
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        code = 0
        try:
            if worker.running or worker._thread is not None or worker._pinger is not None:
                code = 3  # inherited a dead worker
            else:
                seen = len(waiter.events)
                worker.ensure_started()
                if not (worker.running and worker._thread is not parent_thread):
                    code = 4
                elif not waiter.wait_for(lambda ev: len(ev) > seen + 2):
                    code = 5  # the child's worker does not probe
                worker.close()
        except BaseException:
            code = 6
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    try:
        assert os.waitstatus_to_exitcode(status) == 0
        assert worker.running
        assert worker._thread is parent_thread
        seen = len(waiter.events)
        assert waiter.wait_for(lambda ev: len(ev) > seen + 2)  # the parent's worker goes on
    finally:
        worker.close()


# -- /ping -----------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/?query="):  # the delay read: credentials in headers only
            authorized = self.headers.get("X-ClickHouse-User") == "u" and self.headers.get("X-ClickHouse-Key") == "pw"
            body = b"42\n" if authorized else b"Code: 516. AUTHENTICATION_FAILED"
            self.send_response(200 if authorized else 403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        body = b"Ok.\n" if self.path == "/ping" else b"nope"
        self.send_response(200 if self.path == "/ping" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_replica() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def silent_replica() -> Iterator[str]:
    """Accepts connections (the kernel does) and never answers: a hung replica."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def closed_port() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"127.0.0.1:{port}"


def test_ping_url_follows_the_clients_scheme() -> None:
    assert ping_url("ch-1:8123", {}) == "http://ch-1:8123/ping"
    assert ping_url("[::1]:8443", {"secure": True}) == "https://[::1]:8443/ping"
    assert ping_url("ch-1:8443", {"interface": "https"}) == "https://ch-1:8443/ping"


def test_delay_reads_with_the_pools_credentials(http_replica: str) -> None:
    url = delay_url(http_replica, {})
    assert "system.replicas" in unquote(url)
    # Patient timeouts: the in-process server answers when this process lets it run (a busy
    # machine can hold it past a sub-second timeout); what is checked is the answer.
    pinger = SyncPinger({"username": "u", "password": "pw"}, timeout=10)
    wrong = SyncPinger({"username": "u", "password": "nope"}, timeout=10)
    try:
        assert pinger.delay(url) == (42.0, None)
        delay, error = wrong.delay(url)
        assert delay is None
        assert "403" in str(error)
        assert "nope" not in str(error)
    finally:
        pinger.close()
        wrong.close()


def test_sync_ping(http_replica: str, silent_replica: str, closed_port: str) -> None:
    patient = SyncPinger({}, timeout=10)  # answers are checked, not how fast the in-process server is
    pinger = SyncPinger({}, timeout=0.3)
    try:
        assert patient.ping(f"http://{http_replica}/ping").ok
        wrong = patient.ping(f"http://{http_replica}/other")
        assert not wrong.ok
        assert "HTTP 404" in str(wrong.error)
        refused_ = patient.ping(f"http://{closed_port}/ping")
        assert not refused_.ok
        assert refused_.error
        hung = pinger.ping(f"http://{silent_replica}/ping")
        assert not hung.ok
        # The probe's own timeout (0.3 s), not the OS's: a silent listener is waited on forever
        # (10 s leaves room for a process whose GIL another thread holds for seconds).
        assert hung.latency < 10.0
    finally:
        patient.close()
        pinger.close()


def test_a_pool_takes_its_listener_off_a_shared_balancer_when_closed_or_dropped() -> None:
    import gc

    from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
    from clickhouse_lb.pools.pool import ReplicaPool

    config = resolve_pool_config(["a:8123", "b:8123"], dsn=None, balancing={}, client_options={},
                                 valid_client_options=sync_client_option_names())
    balancer = Balancer(config.replicas, config.settings)
    closed = ReplicaPool(config, balancer=balancer)
    assert len(balancer.listeners._listeners) == 1  # its stats
    closed.close()
    assert balancer.listeners._listeners == ()
    dropped = ReplicaPool(config, balancer=balancer)  # like the async dialect's pool of a finished loop
    assert len(balancer.listeners._listeners) == 1
    del dropped
    gc.collect()
    assert balancer.listeners._listeners == ()


def test_a_worker_ends_when_its_pool_is_gone_and_keeps_nothing_alive() -> None:
    import gc
    import weakref

    balancer, worker, _, waiter = sync_worker()
    worker.ensure_started()
    assert waiter.wait_for(probes_of("a:8123", 1))
    thread = worker._thread
    assert thread is not None
    gone = weakref.ref(balancer)
    del balancer  # the pool dropped without close(): nothing but the worker could hold it
    gc.collect()
    assert gone() is None  # the shared balancing state it held can be given back
    thread.join(WAIT)
    assert not thread.is_alive()
