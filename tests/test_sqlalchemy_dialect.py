"""The dialect's connection handling without a server: pinning, failure accounting, disconnects.

The same behaviour against real replicas (kill one behind a pooled connection) is in
integration/test_sqlalchemy.py.
"""

from __future__ import annotations

import datetime
from typing import Any

import clickhouse_connect
import pytest
import sqlalchemy.exc
from clickhouse_connect.driver import exceptions as driver_exceptions
from sqlalchemy import create_engine

from clickhouse_lb.errors import AllReplicasUnavailableError, AttemptFailure, ConfigurationError, SessionLostError
from clickhouse_lb.pools.pool import ReplicaPool
from clickhouse_lb.sqlalchemy import ClickHouseLBDialect, EngineArgs, PinnedConnection, get_replica_pool

from .fakes import read_timeout, refused, reset_after_send, server_error


class StubClient:
    """Just enough of a clickhouse-connect client for a pinned DB-API connection."""

    def __init__(self, host: str, script: list[BaseException | None], **options: Any) -> None:
        self.host = host
        self.options = options
        self.script = script
        self.calls: list[str] = []
        self.tags: list[str] = []
        self.closed = False
        self.server_tz = datetime.timezone.utc

    def get_client_setting(self, name: str) -> Any:
        return self.options.get(name)

    def _add_integration_tag(self, name: str) -> None:
        self.tags.append(name)

    def create_query_context(self, **kwargs: Any) -> str:
        self.calls.append("create_query_context")
        return "context"

    def command(self, cmd: str, *args: Any, **kwargs: Any) -> str:
        self.calls.append(cmd)
        failure = self.script.pop(0) if self.script else None
        if failure is not None:
            raise failure
        return f"{cmd}@{self.host}"

    query = command  # the cursor's path; only failures matter here

    def close(self) -> None:
        self.closed = True


class StubCluster:
    def __init__(self) -> None:
        self.scripts: dict[str, list[BaseException | None]] = {}
        self.down: set[str] = set()
        self.clients: list[StubClient] = []

    def factory(self, **options: Any) -> StubClient:
        host = options.pop("host")
        if host in self.down:
            raise refused()
        client = StubClient(host, self.scripts.setdefault(host, []), **options)
        self.clients.append(client)
        return client


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch) -> StubCluster:
    cluster = StubCluster()
    monkeypatch.setattr(clickhouse_connect, "get_client", cluster.factory)
    return cluster


def connect(engine: Any) -> PinnedConnection:
    """What the engine's pool does to open a DB-API connection."""
    dialect = engine.dialect
    _, cparams = dialect.create_connect_args(engine.url)
    connection = dialect.connect(**cparams)
    assert isinstance(connection, PinnedConnection)
    return connection


# Stub replicas answer no /ping: background probes off.
URL = "clickhousedb+lb://u:pw@a,b,c:8123/db?load_balancing=in_order&health_check_interval_ms=0"


def test_each_connection_is_pinned_by_the_strategy_with_its_own_session(stubs: StubCluster) -> None:
    engine = create_engine(URL)
    first, second = connect(engine), connect(engine)
    assert first.address == second.address == "a:8123"
    assert first.session_id
    assert second.session_id
    assert first.session_id != second.session_id
    assert stubs.clients[0].options["username"] == "u"
    assert stubs.clients[0].tags == ["sqlalchemy"]
    assert first.timezone is datetime.timezone.utc
    assert first.client.command("SELECT 1") == "SELECT 1@a"
    assert first.client.create_query_context() == "context"  # the replica client's own, no I/O


def test_repin_moves_the_connection_to_the_new_session_and_closes_the_old(stubs: StubCluster) -> None:
    engine = create_engine(URL)
    moved, other = connect(engine), connect(engine)
    old = moved.pinned
    other.pinned.address = "b:8123"  # stands for a session pinned elsewhere (Alembic's migration replica)
    moved.repin(other.pinned)
    assert moved.pinned is other.pinned
    assert (moved.address, moved.session_id) == ("b:8123", other.session_id)
    assert moved.client.command("SELECT 2") == "SELECT 2@a"  # through the new session's client
    assert other.pinned.client.tags == ["sqlalchemy", "sqlalchemy"]  # tagged again, as a new connection is
    assert old.client.closed


def test_one_balancing_state_per_engine(stubs: StubCluster) -> None:
    engine = create_engine(URL)
    connect(engine)
    connect(engine)
    pool = engine.dialect.replica_pool
    assert isinstance(pool, ReplicaPool)
    assert get_replica_pool(engine) is pool
    other = create_engine(URL)
    connect(other)
    assert other.dialect.replica_pool is not pool


def test_sessions_can_be_turned_off(stubs: StubCluster) -> None:
    connection = connect(create_engine(URL + "&autogenerate_session_id=false"))
    assert connection.session_id is None
    assert stubs.clients[0].options["autogenerate_session_id"] is False


def test_a_replica_failure_is_counted_and_lost_and_the_next_connection_moves(stubs: StubCluster) -> None:
    engine = create_engine(URL)
    connection = connect(engine)
    stubs.scripts["a"].append(refused())
    with pytest.raises(SessionLostError) as info:
        connection.cursor().execute("SELECT 1")
    dialect = engine.dialect
    assert dialect.is_disconnect(info.value, connection, None)
    pool = get_replica_pool(engine)
    assert [r.errors_count for r in pool.replicas] == [1, 0, 0]
    assert connect(engine).address == "b:8123"  # errors outrank in_order


def test_a_query_failure_is_not_a_disconnect(stubs: StubCluster) -> None:
    engine = create_engine(URL)
    connection = connect(engine)
    error = server_error(60, "UNKNOWN_TABLE")
    stubs.scripts["a"].append(error)
    with pytest.raises(type(error)):
        connection.client.command("SELECT * FROM nowhere")
    assert not engine.dialect.is_disconnect(error, connection, None)
    assert [r.errors_count for r in get_replica_pool(engine).replicas] == [0, 0, 0]


def test_connecting_skips_a_dead_replica(stubs: StubCluster) -> None:
    stubs.down.add("a")
    engine = create_engine(URL)
    assert connect(engine).address == "b:8123"
    assert get_replica_pool(engine).replicas[0].errors_count == 1


def test_all_replicas_down(stubs: StubCluster) -> None:
    stubs.down.update({"a", "b", "c"})
    with pytest.raises(AllReplicasUnavailableError):
        connect(create_engine(URL))


def test_closing_the_connection_closes_the_pinned_client(stubs: StubCluster) -> None:
    connection = connect(create_engine(URL))
    connection.close()
    assert stubs.clients[0].closed


def test_connect_args_reach_the_pool(stubs: StubCluster) -> None:
    engine = create_engine(URL)
    _, cparams = engine.dialect.create_connect_args(engine.url)
    connection = engine.dialect.connect(**cparams, connections_with_failover_max_tries=1, send_receive_timeout=9)
    assert get_replica_pool(engine).settings.connections_with_failover_max_tries == 1
    assert stubs.clients[0].options["send_receive_timeout"] == 9
    assert connection.address == "a:8123"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (SessionLostError("a:8123", RuntimeError("boom")), True),
        (AllReplicasUnavailableError([AttemptFailure("a:8123", 1, "refused")], {"a:8123": "refused"}), True),
        (refused(), True),
        (reset_after_send(), True),
        (read_timeout(), True),
        (server_error(210, "NETWORK_ERROR"), True),
        (server_error(62, "SYNTAX_ERROR"), False),
        (server_error(60, "UNKNOWN_TABLE"), False),
    ],
)
def test_is_disconnect(error: Exception, expected: bool) -> None:
    assert ClickHouseLBDialect().is_disconnect(error, None, None) is expected


def test_the_dbapi_modules_errors_are_those_clickhouse_connect_and_clickhouse_lb_raise() -> None:
    """SQLAlchemy wraps, and asks is_disconnect about, instances of the DB-API module's Error
    only. clickhouse-connect 0.x's own dbapi module declares an unrelated Error: the dialect's
    module must be the one SQLAlchemy uses, on 1.4 (which calls the class's dbapi()) as on 2.x."""
    dialect = create_engine(URL).dialect
    module = dialect.dbapi
    assert module is ClickHouseLBDialect.import_dbapi()
    assert module.paramstyle == dialect.paramstyle == "pyformat"
    assert module.Error is driver_exceptions.Error
    assert module.OperationalError is driver_exceptions.OperationalError
    lost = SessionLostError("a:8123", "refused")
    for error in (lost, refused(), server_error(60, "UNKNOWN_TABLE"), ConfigurationError("bad")):
        assert isinstance(error, module.Error)
    wrapped = sqlalchemy.exc.DBAPIError.instance(
        "SELECT 1", None, lost, module.Error, connection_invalidated=True, dialect=dialect
    )
    assert isinstance(wrapped, sqlalchemy.exc.OperationalError)
    assert wrapped.orig is lost


def test_get_replica_pool_needs_our_dialect() -> None:
    with pytest.raises(TypeError):
        get_replica_pool(create_engine("sqlite://"))


def test_engine_args_type_is_what_connect_receives() -> None:
    engine = create_engine(URL)
    _, cparams = engine.dialect.create_connect_args(engine.url)
    assert all(isinstance(v, EngineArgs) for v in cparams.values())
