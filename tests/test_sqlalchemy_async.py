"""The async dialect (``clickhousedb+lb_async``) without a server: URL handling, pinning,
failure accounting, disconnects, one balancing state per engine.

The same behaviour against real replicas (Core, ORM, reflection, kill one behind a pooled
connection) is in integration/test_sqlalchemy_async.py.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import sys
from types import SimpleNamespace
from typing import Any

import aiohttp
import clickhouse_connect
import pytest
from aiohttp.client_reqrep import ConnectionKey
from clickhouse_connect.cc_sqlalchemy.asyncio import ClickHouseAsyncDialect
from clickhouse_connect.cc_sqlalchemy.dialect import ClickHouseDialect
from clickhouse_connect.driver.exceptions import OperationalError
from sqlalchemy import create_engine
from sqlalchemy.dialects import registry
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from clickhouse_lb.errors import AllReplicasUnavailableError, AttemptFailure, ConfigurationError, SessionLostError
from clickhouse_lb.pools.aio import AsyncPinnedSession, AsyncReplicaPool
from clickhouse_lb.sqlalchemy.aio import ClickHouseLBAsyncDialect, get_async_replica_pool, pinned_session

from .fakes import server_error

# The pyproject entry point registers it once installed; registering here too keeps the tests
# independent of how the package was installed.
registry.register("clickhousedb.lb_async", "clickhouse_lb.sqlalchemy.aio", "ClickHouseLBAsyncDialect")

URL = "clickhousedb+lb_async://u:pw@a,b,c:8123/db?load_balancing=in_order"


def refused() -> OperationalError:
    """What clickhouse-connect's AsyncClient raises when a replica refuses the connection."""
    error = OperationalError("Network Error")
    key = ConnectionKey("a", 8123, False, True, None, None, None)
    error.__cause__ = aiohttp.ClientConnectorError(key, OSError(111, "Connect call failed"))
    return error


class StubAsyncClient:
    """Just enough of a clickhouse-connect AsyncClient for clickhouse-connect's async DB-API
    connection adapter."""

    def __init__(self, host: str, script: list[BaseException | None], **options: Any) -> None:
        self.host = host
        self.options = options
        self.script = script
        self.calls: list[str] = []
        self.tags: list[str] = []
        self.closed = False
        self.server_tz = datetime.timezone.utc
        self._session: SimpleNamespace | None = SimpleNamespace(closed=False)  # what is_closed() looks at

    def get_client_setting(self, name: str) -> Any:
        return self.options.get(name)

    def _add_integration_tag(self, name: str) -> None:
        self.tags.append(name)

    async def command(self, cmd: str, *args: Any, **kwargs: Any) -> str:
        self.calls.append(cmd)
        failure = self.script.pop(0) if self.script else None
        if failure is not None:
            raise failure
        return f"{cmd}@{self.host}"

    async def close(self) -> None:
        self.closed = True
        self._session = None


class StubCluster:
    def __init__(self) -> None:
        self.scripts: dict[str, list[BaseException | None]] = {}
        self.down: set[str] = set()
        self.clients: list[StubAsyncClient] = []

    async def factory(self, **options: Any) -> StubAsyncClient:
        host = options.pop("host")
        if host in self.down:
            raise refused()
        client = StubAsyncClient(host, self.scripts.setdefault(host, []), **options)
        self.clients.append(client)
        return client


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch) -> StubCluster:
    cluster = StubCluster()
    monkeypatch.setattr(clickhouse_connect, "get_async_client", cluster.factory)
    return cluster


def dialect_of(engine: AsyncEngine) -> ClickHouseLBAsyncDialect:
    dialect = engine.sync_engine.dialect
    assert isinstance(dialect, ClickHouseLBAsyncDialect)
    return dialect


async def connect(engine: AsyncEngine, **connect_args: Any) -> Any:
    """What the engine's pool does to open a DB-API connection (inside SQLAlchemy's greenlet)."""
    dialect = dialect_of(engine)
    _, cparams = dialect.create_connect_args(engine.sync_engine.url)
    return await greenlet_spawn(dialect.connect, **cparams, **connect_args)


async def command(connection: Any, sql: str) -> Any:
    """A statement on a DB-API connection, from the greenlet side as SQLAlchemy runs it."""
    return await greenlet_spawn(connection.command, sql)


# -- the dialect and its URL -------------------------------------------------------------------


def test_the_scheme_gives_clickhouse_connects_async_dialect_with_its_async_dbapi() -> None:
    engine = create_async_engine(URL)
    dialect = dialect_of(engine)
    assert isinstance(dialect, ClickHouseAsyncDialect)
    assert (dialect.name, dialect.driver, dialect.is_async) == ("clickhousedb", "lb_async", True)
    # the async adapter, not the sync DB-API the inherited legacy dbapi() would give
    assert dialect.loaded_dbapi is ClickHouseAsyncDialect.import_dbapi()
    assert engine.sync_engine.pool.__class__ is ClickHouseAsyncDialect.poolclass


def test_the_sync_scheme_still_gives_the_sync_dialect() -> None:
    dialect = create_engine(URL.replace("+lb_async", "+lb")).dialect
    assert isinstance(dialect, ClickHouseDialect)
    assert not isinstance(dialect, ClickHouseAsyncDialect)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("clickhousedb+lb_async://u@/db", "No hosts in URL"),
        ("clickhousedb+lb_async://u@/db?host=a:70000", "Bad port 70000"),
        ("clickhousedb+lb_async://u@a,b:8123/db?load_balancing=fastest", "Unknown load_balancing 'fastest'"),
        ("clickhousedb+lb_async://u@a,b:8123/db?load_balancng=in_order", "Did you mean load_balancing?"),
        ("clickhousedb+lb_async://u@a,b,c:8123/db?priority=0,1", "priority has 2 values for 3 hosts"),
        ("clickhousedb+lb_async://u@a,b:8123/db?session_id=x", "'session_id' is not accepted"),
        ("clickhousedb+lb_async://u@a,b:8123/db?pool_mgr=x", "pool_mgr"),  # the sync client's only
        ("clickhousedb+lb_async://u@/db?host=a:8123&port=9000", "every host= has a port of its own"),
        ("clickhousedb+lb_async://u@/db?host=[::1&port=9000", "Bad host .\\[::1."),
        ("clickhousedb+lb_async://u@a,b:8123/db?connector_limit=1&connector_limit=2", "given 2 times"),
    ],
)
def test_a_bad_url_fails_at_create_async_engine(stubs: StubCluster, url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        create_async_engine(url)
    assert stubs.clients == []  # no I/O


def test_a_password_is_not_shown_in_url_errors() -> None:
    with pytest.raises(ConfigurationError) as info:
        create_async_engine("clickhousedb+lb_async://u:s3cret@/db")
    assert "s3cret" not in str(info.value)


async def test_url_parameters_reach_the_async_clients(stubs: StubCluster) -> None:
    """The URL means what it means to the sync dialect; the async client's own options
    (connector_limit ...) are client options, not server settings."""
    engine = create_async_engine(
        "clickhousedb+lb_async://u:p%40ss@/db?host=a:9000&host=b&secure=true&load_balancing=in_order"
        "&connector_limit=2&keepalive_timeout=5&send_receive_timeout=9&max_threads=3&ch_priority=5"
    )
    await connect(engine)
    options = stubs.clients[0].options
    assert (stubs.clients[0].host, options["port"]) == ("a", 9000)
    assert options["username"] == "u"
    assert options["password"] == "p@ss"
    assert options["database"] == "db"
    assert options["secure"] is True
    names = ("connector_limit", "keepalive_timeout", "send_receive_timeout")
    assert [options[name] for name in names] == [2, 5.0, 9.0]  # checked, and typed as the client wants
    assert options["settings"] == {"max_threads": "3", "priority": "5"}
    assert (await get_async_replica_pool(engine)).addresses == ["a:9000", "b:8443"]


async def test_connect_args_are_merged_into_the_url(stubs: StubCluster) -> None:
    engine = create_async_engine(URL + "&max_threads=3")
    connection = await connect(
        engine, connections_with_failover_max_tries=1, connector_limit_per_host=1, settings={"max_memory_usage": 1}
    )
    assert dialect_of(engine).replica_pool is not None
    pool = await get_async_replica_pool(engine)
    assert pool.settings.connections_with_failover_max_tries == 1
    options = stubs.clients[0].options
    assert options["connector_limit_per_host"] == 1
    assert options["settings"] == {"max_threads": "3", "max_memory_usage": 1}
    assert pinned_session(connection).address == "a:8123"


async def test_a_bad_connect_arg_fails_at_the_first_connection(stubs: StubCluster) -> None:
    engine = create_async_engine(URL)
    with pytest.raises(ConfigurationError, match="pool_mgr"):
        await connect(engine, pool_mgr=object())


# -- connections -------------------------------------------------------------------------------


async def test_each_connection_is_pinned_by_the_strategy_with_its_own_session(stubs: StubCluster) -> None:
    engine = create_async_engine(URL)
    first, second = await connect(engine), await connect(engine)
    first_pinned, second_pinned = pinned_session(first), pinned_session(second)
    assert isinstance(first_pinned, AsyncPinnedSession)
    assert first_pinned.address == second_pinned.address == "a:8123"
    assert first_pinned.session_id
    assert second_pinned.session_id
    assert first_pinned.session_id != second_pinned.session_id
    assert stubs.clients[0].tags == ["sqlalchemy"]
    assert first.timezone is datetime.timezone.utc
    assert await command(first, "SELECT 1") == "SELECT 1@a"


async def test_one_balancing_state_per_engine(stubs: StubCluster) -> None:
    engine = create_async_engine(URL)
    await connect(engine)
    await connect(engine)
    pool = dialect_of(engine).replica_pool
    assert isinstance(pool, AsyncReplicaPool)
    assert await get_async_replica_pool(engine) is pool
    other = create_async_engine(URL)
    await connect(other)
    assert dialect_of(other).replica_pool is not pool


async def test_sessions_can_be_turned_off(stubs: StubCluster) -> None:
    connection = await connect(create_async_engine(URL + "&autogenerate_session_id=false"))
    assert pinned_session(connection).session_id is None
    assert stubs.clients[0].options["autogenerate_session_id"] is False


async def test_a_replica_failure_is_counted_and_lost_and_the_next_connection_moves(stubs: StubCluster) -> None:
    engine = create_async_engine(URL)
    connection = await connect(engine)
    stubs.scripts["a"].append(refused())
    with pytest.raises(SessionLostError) as info:
        await command(connection, "SELECT 1")
    assert dialect_of(engine).is_disconnect(info.value, connection, None)
    pool = await get_async_replica_pool(engine)
    assert [r.errors_count for r in pool.replicas] == [1, 0, 0]
    assert pinned_session(await connect(engine)).address == "b:8123"  # errors outrank in_order


async def test_a_query_failure_is_not_a_disconnect(stubs: StubCluster) -> None:
    engine = create_async_engine(URL)
    connection = await connect(engine)
    error = server_error(60, "UNKNOWN_TABLE")
    stubs.scripts["a"].append(error)
    with pytest.raises(type(error)):
        await command(connection, "SELECT * FROM nowhere")
    assert not dialect_of(engine).is_disconnect(error, connection, None)
    assert [r.errors_count for r in (await get_async_replica_pool(engine)).replicas] == [0, 0, 0]


async def test_connecting_skips_a_dead_replica(stubs: StubCluster) -> None:
    stubs.down.add("a")
    engine = create_async_engine(URL)
    assert pinned_session(await connect(engine)).address == "b:8123"
    assert (await get_async_replica_pool(engine)).replicas[0].errors_count == 1


async def test_all_replicas_down(stubs: StubCluster) -> None:
    stubs.down.update({"a", "b", "c"})
    with pytest.raises(AllReplicasUnavailableError):
        await connect(create_async_engine(URL))


async def test_closing_the_connection_closes_the_pinned_client(stubs: StubCluster) -> None:
    connection = await connect(create_async_engine(URL))
    assert not connection.is_closed()
    await greenlet_spawn(connection.close)
    assert stubs.clients[0].closed
    assert connection.is_closed()


def test_another_event_loop_gets_its_own_pool_over_the_same_balancing_state(stubs: StubCluster) -> None:
    """An AsyncReplicaPool belongs to one event loop; an engine may outlive one (asyncio.run
    twice). Its error counts carry over."""
    engine = create_async_engine(URL)
    stubs.down.add("a")
    asyncio.run(connect(engine))
    first = dialect_of(engine).replica_pool
    stubs.down.clear()
    connection = asyncio.run(connect(engine))
    second = dialect_of(engine).replica_pool
    assert first is not None
    assert second is not None
    assert second is not first
    assert second.balancer is first.balancer
    assert pinned_session(connection).address == "b:8123"  # a's error was remembered


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (SessionLostError("a:8123", "refused"), True),
        (AllReplicasUnavailableError([AttemptFailure("a:8123", 1, "refused")], {"a:8123": "refused"}), True),
        (refused(), True),
        (server_error(210, "NETWORK_ERROR"), True),
        (server_error(62, "SYNTAX_ERROR"), False),
        (server_error(60, "UNKNOWN_TABLE"), False),
    ],
)
def test_is_disconnect(error: Exception, expected: bool) -> None:
    assert ClickHouseLBAsyncDialect().is_disconnect(error, None, None) is expected


def test_a_missing_async_dialect_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without greenlet (or with SQLAlchemy < 2.0.44) clickhouse-connect's async dialect does not
    import; the scheme then fails with what to install. The sync dialect does not need it."""
    monkeypatch.setitem(sys.modules, "clickhouse_connect.cc_sqlalchemy.asyncio", None)
    monkeypatch.delitem(sys.modules, "clickhouse_lb.sqlalchemy.aio")
    with pytest.raises(ImportError, match=r"greenlet and aiohttp.*clickhouse-lb\[sqlalchemy,async\]"):
        importlib.import_module("clickhouse_lb.sqlalchemy.aio")


def test_pinned_session_needs_our_connection() -> None:
    with pytest.raises(TypeError):
        pinned_session(object())


async def test_get_async_replica_pool_needs_our_dialect() -> None:
    engine = create_async_engine(URL.replace("+lb_async", "+async"))
    with pytest.raises(TypeError):
        await get_async_replica_pool(engine)
