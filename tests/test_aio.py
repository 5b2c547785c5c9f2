"""AsyncReplicaPool's logic against fake async replicas: routing, failover, error accounting,
cancellation, concurrency, writes, sessions, streaming. (Against real servers: integration/.)"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from clickhouse_connect.driver.common import StreamContext
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError, ProgrammingError

import clickhouse_lb
from clickhouse_lb.config.pool_config import async_client_option_names
from clickhouse_lb.config.settings import BALANCING_SETTING_NAMES
from clickhouse_lb.core.classify import classify
from clickhouse_lb.core.events import FailoverEvent, ReplicaRecoveredEvent
from clickhouse_lb.errors import ConfigurationError, ReplicaConnectError, SessionLostError
from clickhouse_lb.pools._base import connect_failure
from clickhouse_lb.pools.aio import AsyncReplicaPool

from .conftest import FakeClock
from .fakes import FakeClient, FakeReplica, pool_parts, server_error

# -- what clickhouse-connect's AsyncClient raises (aiohttp errors wrapped in OperationalError) --


def _network_error(cause: BaseException) -> OperationalError:
    error = OperationalError("Network Error")
    error.__cause__ = cause
    return error


def refused() -> OperationalError:
    """A killed replica: the connection is refused before anything is sent."""
    key = ConnectionKey("a", 8123, False, True, None, None, None)
    return _network_error(aiohttp.ClientConnectorError(key, OSError(111, "Connect call failed")))


def read_timeout() -> OperationalError:
    """A paused replica: connected, request sent, no answer within send_receive_timeout."""
    return _network_error(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))


def disconnected() -> OperationalError:
    """The replica closed the connection after the request went out."""
    return _network_error(aiohttp.ServerDisconnectedError())


# -- fake async replicas ---------------------------------------------------------------------


class FakeAsyncClient(FakeClient):
    """The sync fake, awaited: every AsyncClient method answers per its replica's script;
    ``*_stream`` methods return a real StreamContext over an async generator of two rows."""

    def __init__(self, cluster: AsyncFakeCluster, replica: FakeReplica, options: dict[str, Any]) -> None:
        super().__init__(replica, options)
        self.cluster = cluster

    async def _run(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:  # type: ignore[override]
        self.replica.calls.append((method, args, kwargs))
        gate = self.cluster.gates.get(self.replica.host)
        if gate is not None:
            self.cluster.waiting.add(self.replica.host)
            try:
                await gate.wait()
            except asyncio.CancelledError:
                self.cluster.cancelled.append(self.replica.host)
                raise
            finally:
                self.cluster.waiting.discard(self.replica.host)
        outcome = self.replica.next_outcome()
        if outcome != "ok":
            raise outcome()  # type: ignore[operator]
        if method.endswith("_stream"):
            return _stream(self.replica.host)
        return f"{method}@{self.replica.host}"

    async def ping(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        return bool(await self._run("ping", (), {}))

    async def close(self) -> None:  # type: ignore[override]
        self.closed = True


class _Source:
    closed = False

    def close(self) -> None:
        self.closed = True


def _stream(host: str) -> StreamContext:
    async def rows() -> AsyncIterator[tuple[str, int]]:
        for i in range(2):
            yield host, i

    return StreamContext(_Source(), rows())


class AsyncFakeCluster:
    """An async client factory over named fake replicas; ``gates[host]`` holds that replica's
    calls (``creation_gates[host]`` its client creation) until the event is set."""

    def __init__(self, *hosts: str) -> None:
        self.replicas = {h: FakeReplica(h) for h in hosts}
        self.clients: list[FakeAsyncClient] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.creation_gates: dict[str, asyncio.Event] = {}
        self.waiting: set[str] = set()
        self.cancelled: list[str] = []

    def __getitem__(self, host: str) -> FakeReplica:
        return self.replicas[host]

    async def factory(self, **options: Any) -> FakeAsyncClient:
        replica = self.replicas[options["host"]]
        replica.created += 1
        gate = self.creation_gates.get(replica.host)
        if gate is not None:
            await gate.wait()
        if replica.fail_creation is not None:
            raise replica.fail_creation()
        client = FakeAsyncClient(self, replica, options)
        self.clients.append(client)
        return client

    def counts(self) -> dict[str, int]:
        return {h: len(r.calls) for h, r in self.replicas.items()}


def make_pool(
    cluster: AsyncFakeCluster, *, clock: FakeClock | None = None, seed: int = 7, **options: Any
) -> AsyncReplicaPool:
    config, balancer = pool_parts(cluster.replicas, options, async_client_option_names(), clock=clock, seed=seed)
    return AsyncReplicaPool(config, client_factory=cluster.factory, balancer=balancer)


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the loop run until ``condition()`` holds (a deadline, not a guess)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0)


def errors(pool: AsyncReplicaPool) -> list[int]:
    return [s.errors_count for s in pool.replicas]


@pytest.fixture
def abc() -> AsyncFakeCluster:
    return AsyncFakeCluster("a", "b", "c")


# -- construction ----------------------------------------------------------------------------


def test_get_async_pool_is_a_plain_function_with_get_pools_arguments() -> None:
    assert not inspect.iscoroutinefunction(clickhouse_lb.get_async_pool)
    pool_params = inspect.signature(clickhouse_lb.get_pool).parameters
    assert inspect.signature(clickhouse_lb.get_async_pool).parameters.keys() == pool_params.keys()
    # The same names, kinds, defaults and types (help() and type checkers see them all) ...
    described = [(p.name, p.kind, p.default, p.annotation) for p in pool_params.values()]
    async_params = inspect.signature(clickhouse_lb.get_async_pool).parameters.values()
    assert [(p.name, p.kind, p.default, p.annotation) for p in async_params] == described
    # ... and every balancing setting is one of them.
    assert set(BALANCING_SETTING_NAMES) <= pool_params.keys()
    # No running loop, no I/O: the hosts do not even exist.
    pool = clickhouse_lb.get_async_pool("nowhere-1:8123,nowhere-2:8123", load_balancing="IN_ORDER",
                                        connector_limit_per_host=50, send_receive_timeout=1.5)
    assert isinstance(pool, clickhouse_lb.AsyncReplicaPool)
    assert pool.plan() == ["nowhere-1:8123", "nowhere-2:8123"]
    assert pool.config.client_options["connector_limit_per_host"] == 50
    assert "in_order" in repr(pool)


def test_get_async_pool_validates_like_get_pool() -> None:
    with pytest.raises(ConfigurationError, match=r"load_balancng.*load_balancing"):
        clickhouse_lb.get_async_pool(["a:8123"], load_balancng="in_order")
    with pytest.raises(ConfigurationError, match="pool_mgr"):  # a sync-only option
        clickhouse_lb.get_async_pool(["a:8123"], pool_mgr=object())
    with pytest.raises(ConfigurationError, match="valid choices"):
        clickhouse_lb.get_async_pool(["a:8123"], load_balancing="nope")
    pool = clickhouse_lb.get_async_pool(dsn="clickhouse://u:p@a:8123,b:8124/db?load_balancing=in_order")
    assert pool.plan() == ["a:8123", "b:8124"]


async def test_clients_are_created_lazily_once_per_replica(abc: AsyncFakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", compress=False, connect_timeout_with_failover_ms=250)
    assert abc.clients == []
    for _ in range(5):
        assert await pool.query("SELECT 1") == "query@a"
    assert [r.created for r in abc.replicas.values()] == [1, 0, 0]
    options = abc.clients[0].options
    assert options["autogenerate_session_id"] is False
    assert options["compress"] is False
    assert options["query_retries"] == 0
    assert options["connect_timeout"] == 0.25  # the async client takes fractional seconds
    assert (await pool.client("a:8123")) is abc.clients[0]


# -- routing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "first"),
    [
        ({"load_balancing": "in_order"}, "a"),
        ({"load_balancing": "first_or_random", "load_balancing_first_offset": 2}, "c"),
        ({"load_balancing": "nearest_hostname", "local_hostname": "ch-b"}, "ch-b"),
        ({"load_balancing": "hostname_levenshtein_distance", "local_hostname": "CH-C"}, "ch-c"),
    ],
)
async def test_strategies_choose_the_replica_the_sync_pool_would(options: dict[str, Any], first: str) -> None:
    hosts = ("ch-a", "ch-b", "ch-c") if first.startswith("ch-") else ("a", "b", "c")
    cluster = AsyncFakeCluster(*hosts)
    pool = make_pool(cluster, **options)
    assert pool.plan()[0] == f"{first}:8123"
    for _ in range(10):
        assert await pool.query("SELECT 1") == f"query@{first}"


async def test_round_robin_gives_each_healthy_replica_an_exact_share(abc: AsyncFakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    await asyncio.gather(*(pool.query("SELECT 1") for _ in range(300)))
    assert abc.counts() == {"a": 100, "b": 100, "c": 100}
    first = pool.plan()
    assert all(pool.plan() == first for _ in range(3))  # a look does not advance it


async def test_hostname_lookup_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []

    def lookup() -> str:
        threads.append(threading.current_thread())
        return "b"

    monkeypatch.setattr("clickhouse_lb.core.balancer.default_local_hostname", lookup)
    cluster = AsyncFakeCluster("a", "b")
    pool = make_pool(cluster, load_balancing="nearest_hostname")
    assert await pool.query("SELECT 1") == "query@b"
    assert await pool.query("SELECT 1") == "query@b"
    assert len(threads) == 1
    assert threads[0] is not threading.main_thread()


# -- failover and accounting -----------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.failovers: list[FailoverEvent] = []

    def on_failover(self, event: FailoverEvent) -> None:
        self.failovers.append(event)


@pytest.mark.parametrize("failure", [refused, read_timeout, disconnected])
async def test_replica_failure_fails_over_and_counts_one_error(
    abc: AsyncFakeCluster, failure: Callable[[], BaseException]
) -> None:
    recorder = Recorder()
    abc["a"].outcomes = [failure, "ok"]
    pool = make_pool(abc, load_balancing="in_order", listeners=[recorder])
    assert await pool.query("SELECT 1") == "query@b"
    assert errors(pool) == [1, 0, 0]
    assert pool.replicas[0].is_up is False
    assert [(e.address, e.next_address) for e in recorder.failovers] == [("a:8123", "b:8123")]
    assert pool.plan() == ["b:8123", "c:8123", "a:8123"]  # routed away until it decays


class Recoveries:
    def __init__(self) -> None:
        self.addresses: list[str] = []

    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        self.addresses.append(event.address)


async def test_a_hedge_that_answers_first_is_its_replicas_success_not_the_slow_ones() -> None:
    """As tests/test_race_winner.py for the sync pool: replica "a" failed once (one ignored error
    keeps it first), then is slow; the hedge on "b" answers. The success is b's: "a" stays marked
    as failing and is not announced back in rotation."""
    cluster = AsyncFakeCluster("a", "b")
    recoveries = Recoveries()
    pool = make_pool(cluster, load_balancing="in_order", use_hedged_requests=1, receive_data_timeout_ms=20,
                     distributed_replica_max_ignored_errors=1, listeners=[recoveries])
    cluster["a"].outcomes = [refused, "ok"]
    assert await pool.command("SELECT 1", settings={"use_hedged_requests": 0}) == "command@b"
    assert pool.replicas[0].is_up is False
    gate = cluster.gates["a"] = asyncio.Event()  # "a" answers only when let go: slow
    try:
        assert await pool.command("SELECT 1") == "command@b"
    finally:
        gate.set()
    assert pool.hedged_requests == 1
    assert pool.replicas[0].is_up is False
    assert recoveries.addresses == []
    await pool.close()


# -- cancellation ----------------------------------------------------------------------------


async def test_cancelled_statement_counts_nothing_and_leaves_no_attempt_running(abc: AsyncFakeCluster) -> None:
    abc.gates["a"] = asyncio.Event()
    pool = make_pool(abc, load_balancing="in_order")
    task = asyncio.create_task(pool.query("SELECT sleep(3)"))
    await wait_until(lambda: "a" in abc.waiting)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert abc.cancelled == ["a"]  # the attempt itself was cancelled, not abandoned
    assert abc.waiting == set()
    assert errors(pool) == [0, 0, 0]
    assert all(s.is_up for s in pool.replicas)
    assert abc["b"].calls == []  # and it did not fail over
    abc.gates.clear()
    assert await pool.query("SELECT 1") == "query@a"


async def test_timeout_around_a_statement_counts_nothing(abc: AsyncFakeCluster) -> None:
    abc.gates["a"] = asyncio.Event()
    pool = make_pool(abc, load_balancing="in_order")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(pool.query("SELECT 1"), 0.05)
    assert abc.cancelled == ["a"]
    assert errors(pool) == [0, 0, 0]


async def test_cancelled_client_creation_counts_nothing_and_is_retried_later(abc: AsyncFakeCluster) -> None:
    abc.creation_gates["a"] = asyncio.Event()
    pool = make_pool(abc, load_balancing="in_order")
    task = asyncio.create_task(pool.query("SELECT 1"))
    await wait_until(lambda: abc["a"].created == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert errors(pool) == [0, 0, 0]
    abc.creation_gates.clear()
    assert await pool.query("SELECT 1") == "query@a"
    assert abc["a"].created == 2


# -- concurrency -----------------------------------------------------------------------------


async def test_200_tasks_keep_counts_consistent(abc: AsyncFakeCluster) -> None:
    cluster = AsyncFakeCluster("a", "b", "c", "d")
    cluster["d"].outcomes = [refused]
    cluster.creation_gates = {h: asyncio.Event() for h in cluster.replicas}
    pool = make_pool(cluster, load_balancing="round_robin", distributed_replica_error_cap=10**9,
                     distributed_replica_error_half_life=10**9)

    async def work(i: int) -> str:
        if i % 10 == 0:
            pool.record_error("a:8123")
        return await pool.query("SELECT 1")  # type: ignore[no-any-return]

    tasks = [asyncio.create_task(work(i)) for i in range(200)]
    await asyncio.sleep(0)
    for gate in cluster.creation_gates.values():  # every task now races for the same clients
        gate.set()
    results = await asyncio.gather(*tasks)
    assert all(r.startswith("query@") for r in results)
    served = {h: n for h, n in cluster.counts().items() if h != "d"}
    assert sum(served.values()) == 200  # every statement served exactly once
    counts = {s.host: s.errors_count for s in pool.replicas}
    assert counts["d"] == len(cluster["d"].calls) > 0  # one error per failed attempt, none lost
    assert counts["a"] == 20
    # One shared client per replica used, created once however many tasks raced for it.
    assert [r.created for r in cluster.replicas.values()] == [int(bool(r.calls)) for r in cluster.replicas.values()]
    assert len(cluster.clients) >= 3


async def test_tasks_waiting_on_a_failing_creation_fail_over_at_once(abc: AsyncFakeCluster) -> None:
    abc.creation_gates["a"] = asyncio.Event()
    abc["a"].fail_creation = read_timeout
    pool = make_pool(abc, load_balancing="in_order")
    tasks = [asyncio.create_task(pool.query("SELECT 1")) for _ in range(10)]
    await wait_until(lambda: abc["a"].created == 1)
    abc.creation_gates["a"].set()  # the one creation times out...
    assert await asyncio.gather(*tasks) == ["query@b"] * 10
    assert abc["a"].created == 1  # ...and the other nine did not wait out their own
    assert errors(pool) == [10, 0, 0]  # every statement's attempt on a failed


def test_a_failed_client_creation_is_a_replica_failure_before_sending() -> None:
    for cause in (refused(), read_timeout(), server_error(210, "NETWORK_ERROR")):
        error = connect_failure("a:8123", cause)
        assert isinstance(error, ReplicaConnectError)
        assert error.__cause__ is cause
        failure = classify(error)
        assert (failure.replica, failure.sent) == (True, False)  # the statement never left
        assert classify(cause).reason in str(error)
    assert connect_failure("a:8123", server_error(516, "AUTHENTICATION_FAILED")) is None  # a query failure


# -- writes ----------------------------------------------------------------------------------


# -- streaming -------------------------------------------------------------------------------


async def test_streams_fail_over_on_opening_and_iterate_like_asyncclient(abc: AsyncFakeCluster) -> None:
    abc["a"].outcomes = [refused, "ok"]
    pool = make_pool(abc, load_balancing="in_order")
    stream = await pool.query_rows_stream("SELECT number FROM numbers(2)")
    async with stream:
        rows = [row async for row in stream]
    assert rows == [("b", 0), ("b", 1)]
    assert isinstance(stream.source, _Source)
    assert stream.source.closed
    assert errors(pool) == [1, 0, 0]


# -- sessions --------------------------------------------------------------------------------


async def test_session_pins_one_replica_and_reports_loss(abc: AsyncFakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    async with pool.session() as session:
        assert session.address == "a:8123"
        assert session.session_id
        assert [await session.query(f"SELECT {i}") for i in range(3)] == ["query@a"] * 3
        abc["a"].outcomes = [lambda: server_error(62, "SYNTAX_ERROR")]
        with pytest.raises(DatabaseError) as caught:
            await session.query("SELEC")
        assert not isinstance(caught.value, SessionLostError)
        abc["a"].outcomes = [refused]
        with pytest.raises(SessionLostError, match=r"a:8123"):
            await session.query("SELECT 2")
    assert abc["b"].calls == []  # never moved silently
    assert errors(pool) == [1, 0, 0]
    assert session.client.closed


async def test_session_options_override_the_pools(abc: AsyncFakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", autogenerate_session_id=True)
    async with pool.session() as session:
        assert session.client.options["session_id"] == session.session_id
        assert session.get_client_setting("session_id") == session.session_id  # the client's own
    await pool.query("SELECT 1")
    # autogenerate_session_id=True given to the pool: the pool's own statements run in its one
    # session (clickhouse_lb.pools._session_mode), not in the pinned session's.
    pooled = abc.clients[-1].options["session_id"]
    assert pooled
    assert pooled != session.session_id


async def test_sessions_get_their_own_clients_and_ids(abc: AsyncFakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    async with pool.session() as one, pool.session() as two:
        assert one.client is not two.client
        assert one.session_id != two.session_id
        assert one.address != two.address  # round_robin advanced per session


async def test_session_skips_replicas_that_cannot_be_reached(abc: AsyncFakeCluster) -> None:
    abc["a"].fail_creation = refused
    pool = make_pool(abc, load_balancing="in_order")
    async with pool.session() as session:
        assert session.address == "b:8123"
    assert errors(pool) == [1, 0, 0]


# -- lifecycle -------------------------------------------------------------------------------


async def test_close_during_client_creation_closes_the_new_client(abc: AsyncFakeCluster) -> None:
    abc.creation_gates["a"] = asyncio.Event()
    pool = make_pool(abc, load_balancing="in_order")
    task = asyncio.create_task(pool.query("SELECT 1"))
    await wait_until(lambda: abc["a"].created == 1)
    await pool.close()
    abc.creation_gates["a"].set()
    with pytest.raises(ProgrammingError, match="closed"):
        await task
    assert all(c.closed for c in abc.clients)


def test_a_pool_belongs_to_one_event_loop(abc: AsyncFakeCluster) -> None:
    pool = make_pool(abc)
    assert asyncio.run(pool.query("SELECT 1")).startswith("query@")
    with pytest.raises(ProgrammingError, match="event loop"):
        asyncio.run(pool.query("SELECT 1"))


@pytest.mark.parametrize("installed", ["0.15.1", "1.9.0", "0.13.0"])
def test_a_clickhouse_connect_without_the_native_async_client_is_refused_with_the_fix(installed: str) -> None:
    from clickhouse_lb.pools.aio import require_native_async_client

    with pytest.raises(ConfigurationError, match=rf">= 1\.10 .*{re.escape(installed)} is installed.*\[async\]"):
        require_native_async_client(installed)
    require_native_async_client("1.10.0")
    require_native_async_client("2.0")


def test_async_pool_accepts_least_loaded() -> None:
    pool = clickhouse_lb.get_async_pool(["a:8123", "b:8123"], load_balancing="least_loaded", share_state=False)
    assert pool.settings.load_balancing.value == "least_loaded"
    assert sorted(pool.plan()) == ["a:8123", "b:8123"]
