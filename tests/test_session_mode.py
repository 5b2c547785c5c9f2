"""A pool given ``session_id=`` (or ``autogenerate_session_id=True``) runs every statement in that
one ClickHouse session, on one replica chosen by the strategy; a replica failure raises
SessionLostError and the next statement pins the session anew elsewhere (fake replicas; the real
engine's temporary tables and SET: integration/test_session_mode.py)."""

from __future__ import annotations

import uuid

import pytest

import clickhouse_lb
from clickhouse_lb.errors import SessionLostError

from . import test_aio
from .fakes import FakeCluster, make_pool, refused


@pytest.fixture
def abc() -> FakeCluster:
    return FakeCluster("a", "b", "c")


def hosts_served(cluster: FakeCluster) -> set[str]:
    return {h for h, r in cluster.replicas.items() if r.calls}


def test_session_id_puts_every_statement_on_one_replica_in_that_session(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="random", session_id="s-1")
    for _ in range(12):
        pool.query("SELECT 1")
    assert len(hosts_served(abc)) == 1  # random balancing would have spread 12 statements
    assert {c.options["session_id"] for c in abc.clients} == {"s-1"}
    assert all("autogenerate_session_id" not in c.options for c in abc.clients)
    assert pool.get_client_setting("session_id") == "s-1"


def test_without_a_session_option_statements_are_balanced_without_a_session(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    for _ in range(6):
        pool.query("SELECT 1")
    assert hosts_served(abc) == {"a", "b", "c"}
    assert all(c.options["autogenerate_session_id"] is False and "session_id" not in c.options for c in abc.clients)


def test_a_lost_session_replica_raises_and_the_next_statement_pins_another(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", session_id="s-2")
    assert pool.query("SELECT 1") == "query@a"
    abc["a"].outcomes = [refused]
    with pytest.raises(SessionLostError) as lost:
        pool.command("INSERT INTO t VALUES (1)")
    assert lost.value.address == "a:8123"
    assert pool.query("SELECT 1") == "query@b"  # a has an error counted: the strategy picks b
    assert pool.query("SELECT 2") == "query@b"
    assert abc.clients[-1].options["session_id"] == "s-2"  # the same session id, on b


def test_autogenerate_session_id_given_makes_one_session_with_a_uuid(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="random", autogenerate_session_id=True)
    for _ in range(8):
        pool.query("SELECT 1")
    assert len(hosts_served(abc)) == 1
    uuid.UUID(pool.get_client_setting("session_id") or "")


def test_a_dsn_session_id_is_the_pools_session() -> None:
    pool = clickhouse_lb.get_pool(dsn="clickhouse://u@a:8123,b:8123/db?session_id=from-dsn", connect_on_create=False)
    assert pool._session_id == "from-dsn"
    pool.close()


async def test_async_session_id_pins_and_moves_only_after_session_lost() -> None:
    cluster = test_aio.AsyncFakeCluster("a", "b", "c")
    pool = test_aio.make_pool(cluster, load_balancing="random", session_id="s-3")
    first = {await pool.query("SELECT 1") for _ in range(8)}
    assert len(first) == 1
    pinned = next(iter(first)).split("@")[1]
    cluster[pinned].outcomes = [test_aio.refused]
    with pytest.raises(SessionLostError):
        await pool.query("SELECT 1")
    after = {await pool.query("SELECT 1") for _ in range(4)}
    assert len(after) == 1
    assert after != first
    assert {c.options["session_id"] for c in cluster.clients} == {"s-3"}
    await pool.close()


def test_hosts_given_with_a_dsn_are_the_replicas_and_the_dsn_gives_the_rest() -> None:
    # clickhouse-connect's own suite does get_client(dsn=...) where a pool also gets its hosts.
    pool = clickhouse_lb.get_pool(
        ["x:8123", "y:8123"], dsn="clickhouse://bob:pw@z:9000/db?session_id=s-4", connect_on_create=False
    )
    assert pool.addresses == ["x:8123", "y:8123"]
    assert pool.config.client_options["database"] == "db"
    assert pool.config.client_options["username"] == "bob"
    assert pool._session_id == "s-4"
    pool.close()
