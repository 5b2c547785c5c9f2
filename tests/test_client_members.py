"""Every public member of the installed clickhouse-connect Client (and AsyncClient) on the pools,
each with its pool meaning (clickhouse_lb.pools._client_members): state applied to every replica's
client and replayed on clients made later, facts from the reference replica, per-replica
members refused with what to use instead, unknown assignments refused.

The member lists are read from the installed clickhouse-connect (its classes and the ``self.x =``
assignments of their methods), so a release that adds a member fails here until the pools have it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from clickhouse_connect.driver.exceptions import ProgrammingError

from clickhouse_lb.config.pool_config import async_client_option_names, sync_client_option_names
from clickhouse_lb.errors import ConfigurationError, PoolMemberError
from clickhouse_lb.pools._client_members import MEMBERS
from clickhouse_lb.pools.pool import ReplicaPool

from . import fakes


def public_members(client_class: type) -> set[str]:
    """The public members of a clickhouse-connect client class: its attributes and methods, and
    every ``self.name = ...`` its classes' methods make (instance attributes)."""
    names = {n for n in dir(client_class) if not n.startswith("_")}
    for cls in client_class.__mro__:
        if cls is object or not cls.__module__.startswith("clickhouse_connect"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and not node.attr.startswith("_")
            ):
                names.add(node.attr)
    return names


def _async_available() -> bool:
    try:
        from clickhouse_lb.pools.aio import require_native_async_client

        require_native_async_client()
    except (ImportError, ConfigurationError):  # clickhouse-connect 0.x (the compat job)
        return False
    return True


def test_the_sync_pool_has_every_public_member_of_the_installed_client() -> None:
    from clickhouse_connect.driver.httpclient import HttpClient

    members = public_members(HttpClient)
    assert {"query", "database", "server_version", "url"} <= members  # the enumeration works
    assert members - set(dir(ReplicaPool)) == set()
    assert members - set(MEMBERS) - {"query", "command", "insert"} <= set(dir(ReplicaPool))


@pytest.mark.skipif(not _async_available(), reason="clickhouse-connect 0.x has no native AsyncClient")
def test_the_async_pool_has_every_public_member_of_the_installed_async_client() -> None:
    from clickhouse_connect.driver.asyncclient import AsyncClient

    from clickhouse_lb.pools.aio import AsyncReplicaPool

    members = public_members(AsyncClient)
    assert {"query", "database", "server_version", "create_insert_context"} <= members
    assert members - set(dir(AsyncReplicaPool)) == set()
    for name in ("create_insert_context", "close_connections", "close", "ping"):
        assert inspect.iscoroutinefunction(getattr(AsyncReplicaPool, name)) == inspect.iscoroutinefunction(
            getattr(AsyncClient, name)
        ), name


def test_every_member_not_on_the_pool_class_itself_is_in_the_table() -> None:
    """The table's members are on the pools as properties or methods (none is left to __getattr__)."""
    for name in MEMBERS:
        assert hasattr(ReplicaPool, name), name


# -- a fake client with real attribute semantics ------------------------------------------------


class MemberClient:
    """A stand-in for a clickhouse-connect client: plain attributes as on a Client, settings,
    a version, and statements that report the state they ran with."""

    valid_transport_settings = frozenset({"database", "buffer_size"})
    optional_transport_settings = frozenset({"send_progress_in_http_headers"})

    def __init__(self, host: str, version: str, options: dict[str, Any]) -> None:
        self.host = host
        self.options = options
        self.server_version = version
        self.server_tz: Any = ZoneInfo("Europe/Berlin") if host == "b" else timezone.utc
        self.server_settings = {"max_threads": "4"}
        self.protocol_version = 54460
        self.database = options.get("database")
        self.query_limit = options.get("query_limit", 0)
        self.query_retries = options.get("query_retries", 2)
        self.tz_source = "auto"
        self.tz_mode = "naive_utc"
        self.show_clickhouse_errors = True
        self.max_error_message = 0
        self.compression = None
        self.write_compression = None
        self.form_encode_query_params = False
        self.http_retries = 0
        self.timeout = 10
        self.http = "shared pool manager"
        self.server_host_name = None
        self.apply_server_timezone = True
        self.utc_tz_aware = False
        self.headers: dict[str, str] = {"User-Agent": "test"}
        self.params: dict[str, str] = {}
        self.uri = self.url = f"http://{host}:8123"
        self.settings: dict[str, str] = {}
        self.connections_closed = 0
        self.closed = False
        self.insert_contexts: list[str] = []

    def set_client_setting(self, key: str, value: Any) -> None:
        if key == "readonly":
            raise ProgrammingError("Setting readonly is readonly")
        self.settings[key] = str(value)

    def get_client_setting(self, key: str) -> str | None:
        return self.settings.get(key)

    def set_access_token(self, access_token: str) -> None:
        self.headers["Authorization"] = f"Bearer {access_token}"

    def min_version(self, version_str: str) -> bool:
        def parts(text: str) -> tuple[int, ...]:
            return tuple(int(p) for p in text.split("."))

        return parts(self.server_version) >= parts(version_str)

    def create_query_context(self, query: str | None = None, **kwargs: Any) -> Any:
        return {"query": query, "server_tz": self.server_tz, "made_on": self.host, **kwargs}

    def create_insert_context(self, table: str, **kwargs: Any) -> Any:
        self.insert_contexts.append(table)
        return {"table": table, "made_on": self.host}

    def command(self, cmd: str | None = None, **kwargs: Any) -> Any:
        return {"host": self.host, "database": self.database, "settings": dict(self.settings),
                "headers": dict(self.headers), "context": kwargs.get("context")}

    query = command

    def insert(self, table: str | None = None, data: Any = None, **kwargs: Any) -> Any:
        return {"host": self.host, "context": kwargs.get("context")}

    def close_connections(self) -> None:
        self.connections_closed += 1

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


class AsyncMemberClient(MemberClient):
    """The same, with AsyncClient's coroutine methods."""

    async def command(self, cmd: str | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        return MemberClient.command(self, cmd, **kwargs)

    query = command

    async def insert(self, table: str | None = None, data: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        return MemberClient.insert(self, table, data, **kwargs)

    async def create_insert_context(self, table: str, **kwargs: Any) -> Any:  # type: ignore[override]
        return MemberClient.create_insert_context(self, table, **kwargs)

    async def close_connections(self) -> None:  # type: ignore[override]
        MemberClient.close_connections(self)

    async def ping(self) -> bool:  # type: ignore[override]
        return True

    async def close(self) -> None:  # type: ignore[override]
        self.closed = True


class MemberCluster:
    """A client factory over replicas a, b, c (versions below); ``down`` refuse connections."""

    client_class: type[MemberClient] = MemberClient

    def __init__(self, versions: dict[str, str] | None = None) -> None:
        self.versions = versions or {"a": "25.8.1", "b": "24.3.2", "c": "25.8.1"}
        self.down: set[str] = set()
        self.clients: list[MemberClient] = []

    def make(self, **options: Any) -> MemberClient:
        host = options["host"]
        if host in self.down:
            raise fakes.refused()
        client = self.client_class(host, self.versions[host], options)
        self.clients.append(client)
        return client

    def of(self, host: str) -> list[MemberClient]:
        return [c for c in self.clients if c.host == host]


@dataclass
class Flavour:
    name: str
    make_pool: Callable[..., Any]
    #: Runs a pool call: awaits it for the async pool.
    run: Callable[[Any], Any]


def _sync() -> Iterator[Flavour]:
    def make_pool(cluster: MemberCluster, **options: Any) -> ReplicaPool:
        options.setdefault("load_balancing", "in_order")
        config, balancer = fakes.pool_parts("abc", options, sync_client_option_names())
        return ReplicaPool(config, client_factory=cluster.make, balancer=balancer)

    yield Flavour("sync", make_pool, lambda result: result)


def _async() -> Iterator[Flavour]:
    from clickhouse_lb.pools.aio import AsyncReplicaPool

    loop = asyncio.new_event_loop()

    def make_pool(cluster: MemberCluster, **options: Any) -> AsyncReplicaPool:
        options.setdefault("load_balancing", "in_order")
        config, balancer = fakes.pool_parts("abc", options, async_client_option_names())

        cluster.client_class = AsyncMemberClient

        async def factory(**client_options: Any) -> MemberClient:
            return cluster.make(**client_options)

        return AsyncReplicaPool(config, client_factory=factory, balancer=balancer)

    def run(result: Any) -> Any:
        if inspect.iscoroutine(result):
            return loop.run_until_complete(result)
        return result

    try:
        yield Flavour("async", make_pool, run)
    finally:
        loop.close()


FLAVOURS = {"sync": _sync, **({"async": _async} if _async_available() else {})}


@pytest.fixture(params=list(FLAVOURS))
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    yield from FLAVOURS[request.param]()


def connected(flavour: Flavour, cluster: MemberCluster, **options: Any) -> Any:
    pool = flavour.make_pool(cluster, **options)
    flavour.run(pool.connect())
    return pool


def use_every_replica(flavour: Flavour, pool: Any) -> list[Any]:
    """One statement on each replica, in order (creating each one's client)."""
    return [flavour.run(pool.command("SELECT 1", settings={"load_balancing": "first_or_random",
                                                            "load_balancing_first_offset": i}))
            for i in range(3)]


# -- state: every client, present and future ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("database", "analytics"),
        ("query_limit", 100),
        ("query_retries", 1),
        ("tz_source", "local"),
        ("tz_mode", "aware"),
        ("show_clickhouse_errors", False),
        ("max_error_message", 500),
        ("compression", "zstd"),
        ("write_compression", "lz4"),
        ("form_encode_query_params", True),
        ("http_retries", 3),
        ("timeout", 42),
        ("http", "my pool manager"),
        ("server_host_name", "ch.internal"),
        ("server_tz", ZoneInfo("Asia/Tokyo")),
        ("apply_server_timezone", False),
        ("utc_tz_aware", True),
    ],
)
def test_assigning_state_sets_it_on_every_client_now_and_later(flavour: Flavour, name: str, value: Any) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)  # a's client exists; b's and c's come later
    setattr(pool, name, value)
    assert getattr(pool, name) == value
    use_every_replica(flavour, pool)
    assert [getattr(c, name) for c in cluster.clients] == [value, value, value]


def test_a_client_recreated_after_a_restart_gets_the_changes_replayed_in_order(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    pool.database = "first"
    pool.set_client_setting("max_threads", 2)
    pool.database = "second"
    pool.headers["X-Team"] = "data"
    pool.set_access_token("t0k3n")
    pool._clients[0].client = None  # the replica restarted; its client is made again
    result = flavour.run(pool.command("SELECT 1"))
    assert len(cluster.of("a")) == 2
    assert result["database"] == "second"
    assert result["settings"] == {"max_threads": "2"}
    assert result["headers"]["X-Team"] == "data"
    assert result["headers"]["Authorization"] == "Bearer t0k3n"


def test_a_change_made_while_a_client_is_being_made_reaches_it() -> None:
    """Another thread changes the pool after the new client replayed the record but before it
    is in its slot: the change is neither applied to it (not in a slot yet) nor in its replay."""
    cluster = MemberCluster()
    pool = next(_sync()).make_pool(cluster)
    pool.query_limit = 1

    class Racing(MemberClient):
        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)
            if name == "query_limit" and value == 1:  # the replay, in the creating thread
                pool.database = "during"

    cluster.client_class = Racing
    pool.command("SELECT 1")
    assert cluster.clients[0].database == "during"


def test_database_switch_is_what_the_next_statements_use(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster, database="old")
    assert pool.database == "old"
    pool.database = "new"
    assert {r["database"] for r in use_every_replica(flavour, pool)} == {"new"}


def test_state_read_before_any_client_is_the_recorded_value(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = flavour.make_pool(cluster)
    pool.query_limit = 7
    assert pool.query_limit == 7
    assert cluster.clients == []  # recorded, nothing connected
    flavour.run(pool.command("SELECT 1"))
    assert cluster.clients[0].query_limit == 7


def test_a_value_the_client_refuses_is_refused_on_the_pool_and_not_recorded(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    with pytest.raises(ProgrammingError, match="readonly"):
        pool.set_client_setting("readonly", 1)
    use_every_replica(flavour, pool)
    assert all("readonly" not in c.settings for c in cluster.clients)


def test_client_settings_go_to_every_client_and_read_back(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    pool.set_client_setting("max_threads", 2)
    assert pool.get_client_setting("max_threads") == "2"
    use_every_replica(flavour, pool)
    assert [c.settings for c in cluster.clients] == [{"max_threads": "2"}] * 3


def test_headers_and_params_are_views_whose_writes_reach_every_client(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    pool.headers["X-Team"] = "data"
    pool.params["role"] = "reader"
    assert pool.headers["X-Team"] == "data"
    assert dict(pool.params) == {"role": "reader"}
    use_every_replica(flavour, pool)
    del pool.headers["X-Team"]
    assert [c.headers.get("X-Team") for c in cluster.clients] == [None, None, None]
    assert [c.params for c in cluster.clients] == [{"role": "reader"}] * 3
    pool.headers = {"X-Only": "1"}
    assert [c.headers for c in cluster.clients] == [{"X-Only": "1"}] * 3
    with pytest.raises(KeyError):
        del pool.headers["absent"]


def test_access_token_goes_to_every_client(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    pool.set_access_token("abc")
    use_every_replica(flavour, pool)
    assert {c.headers["Authorization"] for c in cluster.clients} == {"Bearer abc"}


# -- facts: from the reference replica ----------------------------------------------------------


def test_facts_come_from_the_first_replica_connected_to_consistently(flavour: Flavour) -> None:
    cluster = MemberCluster()
    cluster.down.add("a")
    pool = connected(flavour, cluster)  # a refuses: b answers the check and is the reference
    assert pool.server_version == "24.3.2"
    assert pool.server_tz == ZoneInfo("Europe/Berlin")
    assert pool.protocol_version == 54460
    assert dict(pool.server_settings) == {"max_threads": "4"}
    cluster.down.clear()
    use_every_replica(flavour, pool)  # a and c connected now: the facts still come from b
    assert pool.server_version == "24.3.2"
    assert pool.valid_transport_settings == MemberClient.valid_transport_settings


@pytest.mark.parametrize("name", ["server_version", "server_settings", "protocol_version", "valid_transport_settings"])
def test_facts_cannot_be_assigned(flavour: Flavour, name: str) -> None:
    pool = connected(flavour, MemberCluster())
    with pytest.raises(PoolMemberError, match=f"{name}.*cannot be assigned"):
        setattr(pool, name, "x")


def test_server_settings_cannot_be_changed_in_place(flavour: Flavour) -> None:
    pool = connected(flavour, MemberCluster())
    with pytest.raises(TypeError):
        pool.server_settings["max_threads"] = "1"


def test_min_version_answers_for_the_lowest_version_seen(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)  # a: 25.8
    assert pool.min_version("25.1") is True
    use_every_replica(flavour, pool)  # b: 24.3 seen now
    assert pool.min_version("25.1") is False
    assert pool.min_version("24.3") is True


# -- url/uri: the reference replica's ---------------------------------------------------------


@pytest.mark.parametrize("name", ["url", "uri"])
def test_url_and_uri_are_the_reference_replicas_and_cannot_be_assigned(flavour: Flavour, name: str) -> None:
    cluster = MemberCluster()
    cluster.down.add("a")
    pool = connected(flavour, cluster)  # b answered the check: the reference
    assert getattr(pool, name) == "http://b:8123"
    with pytest.raises(PoolMemberError, match="cannot be assigned"):
        setattr(pool, name, "http://x:8123")


def test_assigning_an_unknown_attribute_raises_with_a_suggestion(flavour: Flavour) -> None:
    pool = flavour.make_pool(MemberCluster())
    with pytest.raises(AttributeError, match=r"'datbase'.*did you mean database"):
        pool.datbase = "x"


# -- contexts, connections ----------------------------------------------------------------------


def test_query_context_is_made_on_the_reference_client_and_runs_through_the_pool(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    context = pool.create_query_context("SELECT 1", settings={"max_threads": 1})
    assert context["made_on"] == "a"
    assert flavour.run(pool.query(context=context))["context"] is context


def test_insert_context_is_a_read_with_failover_and_inserts_through_the_pool(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = flavour.make_pool(cluster)
    cluster.down.add("a")
    context = flavour.run(pool.create_insert_context("events"))
    assert context == {"table": "events", "made_on": "b"}  # a refused: failed over to b
    assert pool.replicas[0].errors_count == 1
    assert flavour.run(pool.insert(context=context))["context"] is context


def test_close_connections_reaches_every_client_and_the_pool_stays_open(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    use_every_replica(flavour, pool)
    flavour.run(pool.close_connections())
    assert [c.connections_closed for c in cluster.clients] == [1, 1, 1]
    assert flavour.run(pool.command("SELECT 1"))["host"] == "a"


# -- creation -----------------------------------------------------------------------------------


def test_connect_skips_replicas_that_are_down_and_counts_them(flavour: Flavour) -> None:
    cluster = MemberCluster()
    cluster.down.update({"a", "b"})
    pool = connected(flavour, cluster)
    assert [c.host for c in cluster.clients] == ["c"]
    assert [s.errors_count for s in pool.replicas] == [1, 1, 0]


def test_connect_when_no_replica_answers_names_every_replicas_reason(flavour: Flavour) -> None:
    from clickhouse_lb.errors import AllReplicasUnavailableError

    cluster = MemberCluster()
    cluster.down.update({"a", "b", "c"})
    pool = flavour.make_pool(cluster, connections_with_failover_max_tries=1)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        flavour.run(pool.connect())
    assert all(f"{h}:8123" in str(caught.value) for h in "abc")


def test_connect_raises_a_query_failure_unchanged_as_get_client_would(flavour: Flavour) -> None:
    cluster = MemberCluster()
    auth = fakes.server_error(516, "AUTHENTICATION_FAILED")

    def refuse_credentials(**options: Any) -> MemberClient:
        raise auth

    cluster.make = refuse_credentials  # type: ignore[method-assign]
    pool = flavour.make_pool(cluster)
    with pytest.raises(type(auth)) as caught:
        flavour.run(pool.connect())
    assert caught.value is auth
    assert [s.errors_count for s in pool.replicas] == [0, 0, 0]  # not the replicas' fault


# -- pinned sessions ----------------------------------------------------------------------------


def test_pinned_session_members_are_its_clients_and_new_sessions_get_the_pools_changes(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    pool.database = "analytics"
    pinned = flavour.run(pool.pin(session=False))
    assert pinned.database == "analytics"
    pinned.database = "own"
    assert pinned.client.database == "own"
    assert pool.database == "analytics"
    with pytest.raises(AttributeError, match="did you mean database"):
        pinned.databse = "x"


# -- the constructor: what get_client accepts -------------------------------------------------


def _factories() -> list[Callable[..., Any]]:
    import clickhouse_lb

    factories: list[Callable[..., Any]] = [clickhouse_lb.get_pool]
    if _async_available():
        factories.append(clickhouse_lb.get_async_pool)
    return factories


@pytest.fixture(params=_factories(), ids=lambda f: f.__name__)
def factory(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return request.param  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"user": "bob"}, {"username": "bob"}),
        ({"user_name": "bob"}, {"username": "bob"}),
        ({"user": "bob", "username": "alice"}, {"username": "alice"}),
        ({"compression": "zstd"}, {"compress": "zstd"}),
        ({"interface": "https"}, {"interface": "https"}),
        (
            {"generic_args": {"user": "bob", "query_limit": "5", "compression": "lz4", "max_threads": "2",
                              "ch_max_memory_usage": "1000"}},
            # a string for a checked option becomes the type the client takes (issue 13)
            {"username": "bob", "query_limit": 5, "compress": "lz4",
             "settings": {"max_threads": "2", "max_memory_usage": "1000"}},
        ),
    ],
)
def test_the_constructor_reads_options_as_get_client_does(
    factory: Callable[..., Any], given: dict[str, Any], expected: dict[str, Any]
) -> None:
    pool = factory(["a:8123", "b:8123"], connect_on_create=False, **given)
    assert pool.config.client_options == expected


@pytest.mark.skipif("headers" not in sync_client_option_names(), reason="clickhouse-connect 0.x takes no headers=")
def test_generic_args_headers_are_the_clients_headers(factory: Callable[..., Any]) -> None:
    pool = factory(["a:8123"], connect_on_create=False, generic_args={"headers": {"X-A": "1"}})
    assert pool.config.client_options == {"headers": {"X-A": "1"}}


def test_a_dsn_in_clickhouse_connects_form_with_user_in_the_query(factory: Callable[..., Any]) -> None:
    pool = factory(dsn="clickhouse://a:8123/db?user=bob&compression=zstd&max_threads=2", connect_on_create=False)
    assert pool.addresses == ["a:8123"]
    assert pool.config.client_options == {"database": "db", "username": "bob", "compress": "zstd",
                                          "settings": {"max_threads": "2"}}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"host": "x"}, "hosts="),
        ({"port": 9000}, "host:port"),
        ({"generic_args": {"port": 9000}}, "host:port"),
        ({"interface": "chdb"}, "in-process engine"),
        ({"generic_args": "port=1"}, "expected a dict"),
    ],
)
def test_the_constructor_still_refuses_what_a_pool_decides(
    factory: Callable[..., Any], given: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        factory(["a:8123"], connect_on_create=False, **given)


@pytest.mark.skipif(not _async_available(), reason="clickhouse-connect 0.x has no native AsyncClient")
def test_async_facts_before_any_replica_answered_say_to_await_the_pool() -> None:
    flavours = _async()  # kept: the generator closes its loop when dropped
    flavour = next(flavours)
    pool = flavour.make_pool(MemberCluster())
    with pytest.raises(PoolMemberError, match=r"await get_async_pool"):
        _ = pool.server_version
    assert flavour.run(pool.connect()) is pool
    assert pool.server_version == "25.8.1"
    flavours.close()


def test_sync_facts_before_any_client_say_to_connect_and_connect_nothing() -> None:
    cluster = MemberCluster()
    pool = next(_sync()).make_pool(cluster)
    with pytest.raises(PoolMemberError, match=r"pool\.connect\(\)"):
        _ = pool.server_version
    assert cluster.clients == []  # a property read opened no connection
    assert pool.connect().server_version == "25.8.1"
    assert [c.host for c in cluster.clients] == ["a"]
