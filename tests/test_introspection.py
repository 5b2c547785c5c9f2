"""Generic introspection of a pool (what debuggers, IPython completion, pytest's assertion
rewriting and libraries that probe with ``hasattr`` do) raises nothing and opens no connection:
sync and async pools, before any replica answered (``connect_on_create=False``) and after."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb.errors import PoolMemberError
from clickhouse_lb.pools._client_members import MEMBERS

from .test_client_members import FLAVOURS, Flavour, MemberCluster, _async_available, connected


@pytest.fixture(params=list(FLAVOURS))
def flavour(request: pytest.FixtureRequest) -> Any:
    yield from FLAVOURS[request.param]()


def probe_everything(pool: Any) -> dict[str, Any]:
    """What generic tools do: every name of dir(), by hasattr, getattr with a default and
    inspect.getmembers (which only tolerates AttributeError)."""
    seen = {name: getattr(pool, name, None) for name in dir(pool)}
    for name in dir(pool):
        hasattr(pool, name)
    members = dict(inspect.getmembers(pool))
    assert set(members) <= set(seen)
    return seen


def calls(cluster: MemberCluster) -> int:
    """Connections made so far: a client made is a connection (the fakes count nothing else
    because a pool reads members only from clients it already has)."""
    return len(cluster.clients)


def test_introspecting_an_unconnected_pool_raises_nothing_and_connects_nothing(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = flavour.make_pool(cluster)
    seen = probe_everything(pool)
    assert calls(cluster) == 0
    assert not hasattr(pool, "url")
    assert getattr(pool, "uri", None) is None
    assert not hasattr(pool, "server_version")
    assert seen["addresses"] == ["a:8123", "b:8123", "c:8123"]


def test_introspecting_a_connected_pool_raises_nothing_and_connects_nothing_more(flavour: Flavour) -> None:
    cluster = MemberCluster()
    pool = connected(flavour, cluster)
    before = calls(cluster)
    seen = probe_everything(pool)
    assert calls(cluster) == before == 1
    assert seen["url"] == "http://a:8123"  # the reference replica's (clickhouse-connect's error scrub reads it)
    assert seen["server_version"] == "25.8.1"


def test_a_member_read_too_early_is_an_attribute_error_that_says_what_to_do(flavour: Flavour) -> None:
    pool = flavour.make_pool(MemberCluster())
    with pytest.raises(AttributeError, match="connect") as caught:
        _ = pool.server_tz
    assert isinstance(caught.value, PoolMemberError)


@pytest.mark.parametrize("name", [n for n, m in MEMBERS.items() if m.kind in ("state", "fact")])
def test_every_member_read_before_connecting_answers_or_raises_attribute_error(flavour: Flavour, name: str) -> None:
    cluster = MemberCluster()
    pool = flavour.make_pool(cluster)
    with contextlib.suppress(AttributeError):
        getattr(pool, name)
    assert calls(cluster) == 0


# Real clickhouse-connect clients: a replica address nothing listens on, so any I/O a read did
# would fail (before the fix: AllReplicasUnavailableError out of inspect.getmembers).
NOWHERE = ["127.0.0.1:1", "127.0.0.2:1"]


def test_getmembers_on_a_real_unconnected_sync_pool_does_no_io() -> None:
    pool = clickhouse_lb.get_pool(NOWHERE, connect_on_create=False, health_check_interval_ms=0)
    try:
        probe_everything(pool)
        assert pool.stats.failovers == 0
        assert [r.errors_count for r in pool.replicas] == [0, 0]
    finally:
        pool.close()


@pytest.mark.skipif(not _async_available(), reason="clickhouse-connect 0.x has no native AsyncClient")
def test_getmembers_on_a_real_unconnected_async_pool_does_no_io() -> None:
    async def main() -> None:
        pool = clickhouse_lb.get_async_pool(NOWHERE, connect_on_create=False, health_check_interval_ms=0)
        try:
            probe_everything(pool)
            assert [r.errors_count for r in pool.replicas] == [0, 0]
        finally:
            await pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("name", ["_apply_server_tz", "_autogenerate_query_id", "_session", "_initialized"])
def test_private_members_clickhouse_connects_suite_reads_are_the_reference_clients(flavour: Flavour, name: str) -> None:
    cluster = MemberCluster()
    pool = flavour.make_pool(cluster)
    assert not hasattr(pool, name)  # nothing to read before a replica answered, and no I/O
    assert cluster.clients == []
    flavour.run(pool.connect())
    setattr(cluster.clients[0], name, "value of a")
    assert getattr(pool, name) == "value of a"
    with pytest.raises(PoolMemberError, match="cannot be assigned"):
        setattr(pool, name, True)


def test_a_closed_async_pools_session_is_none_as_a_closed_async_clients_is(flavour: Flavour) -> None:
    """clickhouse-connect's suite checks a close by ``client._session is None``; a closed pool
    has no reference client to read it from. The sync Client has no ``_session``, closed or not."""
    cluster = MemberCluster()
    pool = flavour.make_pool(cluster)
    flavour.run(pool.connect())
    cluster.clients[0]._session = "a session"
    assert pool._session == "a session"
    flavour.run(pool.close())
    if flavour.name == "async":
        assert pool._session is None
    else:
        assert not hasattr(pool, "_session")
