"""Statements that name a session in their settings (``settings={"session_id": ...}``) stay on
the replica that session lives on: the first is balanced as usual, later ones follow it, a replica
failure there is a SessionLostError (never a failover), and the pin expires with the session's
idle timeout (fake replicas; the real engine: integration/test_session_pins.py)."""

from __future__ import annotations

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clickhouse_lb.errors import SessionLostError
from clickhouse_lb.pools._session_pins import SessionPins, statement_session

from .conftest import FakeClock
from .fakes import FakeCluster, make_pool, refused, server_error

S1 = {"session_id": "s-1"}


@pytest.fixture
def abc() -> FakeCluster:
    return FakeCluster("a", "b", "c")


def test_statements_with_a_session_id_follow_the_replica_the_first_landed_on(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    first = pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1)
    served = [pool.query("SELECT * FROM t", settings=S1) for _ in range(6)]
    assert {s.split("@")[1] for s in served} == {first.split("@")[1]}  # round_robin would have spread 6
    # The session id goes to the server with the statement: that is what opens the session there.
    assert all(kw["settings"]["session_id"] == "s-1" for r in abc.replicas.values() for _, _, kw in r.calls)


def test_the_session_replica_is_kept_whatever_the_error_counts_say(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1) == "command@a"
    pool.balancer.record_error(0, "a probe failed once")  # in_order now prefers b for other statements
    assert pool.query("SELECT 1") == "query@b"
    assert pool.command("INSERT INTO t VALUES (1)", settings=S1) == "command@a"
    assert pool.query("SELECT * FROM t", settings=S1) == "query@a"


def test_the_first_statement_of_a_session_fails_over_and_pins_where_it_answered(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    abc["a"].outcomes = [refused, "ok"]
    assert pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1) == "command@b"
    assert pool.query("SELECT 1") == "query@b"  # a has an error counted
    abc["a"].outcomes = ["ok"]
    assert pool.query("SELECT * FROM t", settings=S1) == "query@b"  # its session is on b, not a


def test_a_failed_session_replica_raises_session_lost_and_the_next_statement_starts_afresh(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1) == "command@a"
    abc["a"].outcomes = [refused]
    with pytest.raises(SessionLostError) as lost:
        pool.command("INSERT INTO t VALUES (1)", settings=S1)
    assert lost.value.address == "a:8123"
    assert lost.value.session_id == "s-1"
    assert "'s-1'" in str(lost.value)
    assert "a:8123" in str(lost.value)
    assert len(abc["b"].calls) == 0
    assert len(abc["c"].calls) == 0
    assert pool.balancer.error_counts()[0] == 1  # counted against a, as any replica failure
    # The pin is gone: the next statement is balanced again (a has an error: in_order picks b).
    assert pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1) == "command@b"
    abc["a"].outcomes = ["ok"]
    assert pool.query("SELECT * FROM t", settings=S1) == "query@b"


def test_a_query_failure_on_the_session_replica_passes_through_and_keeps_the_pin(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1)
    pool.balancer.record_error(0, "probe")
    abc["a"].outcomes = [lambda: server_error(62, "SYNTAX_ERROR"), "ok"]
    with pytest.raises(DatabaseError) as failed:
        pool.query("SELEC 1", settings=S1)
    assert failed.value.code == 62  # the server's own error, unchanged
    assert pool.query("SELECT * FROM t", settings=S1) == "query@a"


def test_a_pin_expires_after_the_sessions_idle_timeout(abc: FakeCluster) -> None:
    clock = FakeClock()
    pool = make_pool(abc, load_balancing="in_order")
    pool._session_pins._clock = clock  # (the pool's pins on the test's clock)
    pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1)
    pool.balancer.record_error(0, "probe")  # in_order prefers b from here on
    clock.advance(59)
    assert pool.query("SELECT 1", settings=S1) == "query@a"  # used again: idle time starts over
    clock.advance(59)
    assert pool.query("SELECT 1", settings=S1) == "query@a"
    clock.advance(61)  # idle past ClickHouse's default 60 s: the server dropped the session too
    assert pool.query("SELECT 1", settings=S1) == "query@b"
    short = {"session_id": "s-2", "session_timeout": 5}
    assert pool.query("SELECT 1", settings=short) == "query@b"
    pool.balancer.record_error(1, "probe")
    clock.advance(4)
    assert pool.query("SELECT 1", settings=short) == "query@b"
    clock.advance(6)
    assert pool.query("SELECT 1", settings=short) == "query@c"


def test_sessions_are_independent_and_an_empty_session_id_is_no_session(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    homes = {sid: pool.query("SELECT 1", settings={"session_id": sid}).split("@")[1] for sid in ("x", "y", "z")}
    assert len(set(homes.values())) == 3  # each first statement balanced on its own
    for sid, home in reversed(homes.items()):  # (round_robin alone would now answer a for z)
        assert pool.query("SELECT 2", settings={"session_id": sid}) == f"query@{home}"
    spread = {pool.query("SELECT 1", settings={"session_id": ""}).split("@")[1] for _ in range(3)}
    assert spread == {"a", "b", "c"}


def test_the_pin_map_is_an_lru_of_bounded_size() -> None:
    clock = FakeClock()
    pins = SessionPins(max_pins=3, clock=clock)
    for sid in ("s1", "s2", "s3"):
        pins.pin(sid, "a:8123", 60)
    assert pins.replica("s1") == "a:8123"  # s1 used: s2 is now the least recently used
    pins.pin("s4", "b:8123", 60)
    assert len(pins) == 3
    assert pins.replica("s2") is None
    assert [pins.replica(s) for s in ("s1", "s3", "s4")] == ["a:8123", "a:8123", "b:8123"]
    pins.drop("s4", "a:8123")  # pinned elsewhere since: kept
    assert pins.replica("s4") == "b:8123"
    pins.drop("s4", "b:8123")
    assert pins.replica("s4") is None


def test_a_session_s_timeout_comes_from_its_settings() -> None:
    assert statement_session({"session_id": "s", "session_timeout": "5"}) == ("s", 5.0)
    assert statement_session({"session_id": "s"}) == ("s", 60.0)
    assert statement_session({"session_id": None})[0] is None
    assert statement_session({"session_id": ""})[0] is None


async def test_async_pool_pins_follows_and_loses_the_same_way() -> None:
    from . import test_aio  # (here, not at the top: .ci/compat runs this file without aiohttp)

    cluster = test_aio.AsyncFakeCluster("a", "b", "c")
    pool = test_aio.make_pool(cluster, load_balancing="in_order")
    assert await pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1) == "command@a"
    pool.balancer.record_error(0, "a probe failed once")
    assert await pool.query("SELECT 1") == "query@b"
    assert await pool.query("SELECT * FROM t", settings=S1) == "query@a"
    cluster["a"].outcomes = [test_aio.refused]
    with pytest.raises(SessionLostError) as lost:
        await pool.query("SELECT * FROM t", settings=S1)
    assert lost.value.session_id == "s-1"
    assert lost.value.address == "a:8123"
    assert await pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1) == "command@b"
    await pool.close()


def test_an_insert_context_of_a_session_reads_its_columns_on_the_sessions_replica(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    pool.command("CREATE TEMPORARY TABLE t (x UInt8)", settings=S1)
    pool.balancer.record_error(0, "a probe failed once")
    assert pool.create_insert_context("t", settings=S1) == "create_insert_context@a"
    assert pool.create_insert_context("events") == "create_insert_context@b"
    abc["a"].outcomes = [refused]
    with pytest.raises(SessionLostError):
        pool.create_insert_context("t", settings=S1)
