"""What the sync and the async pool promise alike, asserted once for both (psycopg_pool's
``pool_cls`` pattern): each test takes the ``flavour`` fixture, which builds a pool of either
kind over fake replicas and runs its statements (awaiting them for the async one)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError, ProgrammingError

from clickhouse_lb.errors import AllReplicasUnavailableError, ConfigurationError, WriteOutcomeUnknownError

from . import fakes
from .conftest import FakeClock


def _async_available() -> bool:
    try:
        from clickhouse_lb.pools.aio import require_native_async_client

        require_native_async_client()
    except (ImportError, ConfigurationError):  # clickhouse-connect 0.x (the compat job)
        return False
    return True


@dataclass
class Flavour:
    name: str
    cluster: Callable[..., Any]
    make_pool: Callable[..., Any]
    #: A replica that refuses the connection (nothing sent), and the words its error carries.
    refused: Callable[[], BaseException]
    refused_words: str
    #: The connection dropped after the request went out.
    dropped_after_send: Callable[[], BaseException]
    run: Callable[[Any], Any]


def _sync() -> Iterator[Flavour]:
    yield Flavour("sync", fakes.FakeCluster, fakes.make_pool, fakes.refused, "Connection refused",
                  fakes.reset_after_send, lambda result: result)


def _async() -> Iterator[Flavour]:
    from . import test_aio

    loop = asyncio.new_event_loop()  # one loop per test: an async pool belongs to its loop

    def run(result: Any) -> Any:
        return loop.run_until_complete(result) if inspect.isawaitable(result) else result

    try:
        yield Flavour("async", test_aio.AsyncFakeCluster, test_aio.make_pool, test_aio.refused,
                      "Connect call failed", test_aio.disconnected, run)
    finally:
        loop.close()


FLAVOURS = {"sync": _sync, **({"async": _async} if _async_available() else {})}


@pytest.fixture(params=list(FLAVOURS))
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    yield from FLAVOURS[request.param]()


def errors(pool: Any) -> list[int]:
    return [s.errors_count for s in pool.replicas]


def test_query_failure_is_raised_unchanged_and_counts_nothing(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    error = fakes.server_error(60, "UNKNOWN_TABLE")
    abc["a"].outcomes = [lambda: error]
    pool = flavour.make_pool(abc, load_balancing="in_order")
    with pytest.raises(DatabaseError) as caught:
        flavour.run(pool.query("SELECT * FROM missing"))
    assert caught.value is error
    assert errors(pool) == [0, 0, 0]
    assert abc["b"].calls == []  # not retried elsewhere: it would only repeat


def test_all_replicas_down_raises_one_error_listing_every_replica(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    for replica in abc.replicas.values():
        replica.outcomes = [flavour.refused]
    pool = flavour.make_pool(abc, load_balancing="in_order", connections_with_failover_max_tries=2)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        flavour.run(pool.query("SELECT 1"))
    error = caught.value
    assert isinstance(error, OperationalError)  # existing except clauses keep working
    assert [f.address for f in error.failures] == ["a:8123", "b:8123", "c:8123"] * 2
    assert set(error.last_errors) == {"a:8123", "b:8123", "c:8123"}
    for address in error.last_errors:
        assert address in str(error)
    assert flavour.refused_words in str(error)
    assert errors(pool) == [2, 2, 2]


def test_write_is_not_retried_after_the_request_was_sent(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    abc["a"].outcomes = [flavour.dropped_after_send]
    pool = flavour.make_pool(abc, load_balancing="in_order")
    with pytest.raises(OperationalError) as caught:
        flavour.run(pool.command("ALTER TABLE t DELETE WHERE 1"))
    assert not isinstance(caught.value, AllReplicasUnavailableError)
    assert isinstance(caught.value, WriteOutcomeUnknownError)
    assert caught.value.may_have_been_applied is True
    assert "may have been applied" in str(caught.value)
    assert "a:8123" in str(caught.value)
    assert abc["b"].calls == []
    assert errors(pool) == [1, 0, 0]  # the replica still failed


def test_a_write_declared_idempotent_fails_over_after_sending(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    abc["a"].outcomes = [flavour.dropped_after_send]
    pool = flavour.make_pool(abc, load_balancing="in_order")
    flavour.run(pool.command("CREATE TABLE IF NOT EXISTS t (x UInt8) ENGINE Memory", settings={"idempotent": 1}))
    assert len(abc["b"].calls) == 1
    assert "idempotent" not in (abc["b"].calls[0][2].get("settings") or {})  # never reaches the server


def test_every_failed_write_says_whether_it_may_have_been_applied(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b")
    abc["a"].outcomes = [flavour.refused] * 6
    abc["b"].outcomes = [flavour.refused] * 6
    pool = flavour.make_pool(abc, load_balancing="in_order")
    with pytest.raises(AllReplicasUnavailableError) as never_sent:
        flavour.run(pool.command("INSERT INTO t SELECT 1"))
    assert never_sent.value.may_have_been_applied is False
    assert "not applied" in str(never_sent.value)
    abc["a"].outcomes = [flavour.dropped_after_send] * 6
    abc["b"].outcomes = [flavour.refused] * 6
    with pytest.raises(AllReplicasUnavailableError) as sent:
        flavour.run(pool.command("INSERT INTO t SELECT 1", settings={"idempotent": True}))
    assert sent.value.may_have_been_applied is True
    assert "may have been applied" in str(sent.value)
    abc["a"].outcomes = [flavour.refused] * 6
    with pytest.raises(AllReplicasUnavailableError) as read:
        flavour.run(pool.query("SELECT 1"))
    assert read.value.may_have_been_applied is False
    assert "applied" not in str(read.value)


def test_errors_decay_and_the_replica_returns(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    clock = FakeClock()
    abc["a"].outcomes = [flavour.refused, "ok"]
    pool = flavour.make_pool(abc, clock=clock, load_balancing="in_order", distributed_replica_error_half_life=10)
    assert flavour.run(pool.query("SELECT 1")) == "query@b"
    assert pool.replicas[0].estimated_recovery_time == 10
    clock.advance(9.5)
    assert flavour.run(pool.query("SELECT 1")) == "query@b"
    clock.advance(0.5)
    assert flavour.run(pool.query("SELECT 1")) == "query@a"
    assert errors(pool) == [0, 0, 0]


def test_closed_pool_refuses_statements(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    pool = flavour.make_pool(abc)
    flavour.run(pool.query("SELECT 1"))
    flavour.run(pool.close())
    assert abc.clients
    assert all(c.closed for c in abc.clients)
    with pytest.raises(ProgrammingError, match="closed"):
        flavour.run(pool.query("SELECT 1"))


def test_a_slowed_replica_goes_behind_its_peers_until_the_count_decays(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    clock = FakeClock()
    pool = flavour.make_pool(abc, clock=clock, load_balancing="in_order", distributed_replica_error_half_life=10)
    assert pool.record_slowdown("a:8123") == 1
    assert pool.replicas[0].slowdowns_count == 1
    assert pool.plan() == ["b:8123", "c:8123", "a:8123"]
    assert flavour.run(pool.query("SELECT 1")) == "query@b"
    pool.record_error("c:8123")
    assert pool.plan() == ["b:8123", "a:8123", "c:8123"]  # errors rank before slowdowns
    clock.advance(10)
    assert flavour.run(pool.query("SELECT 1")) == "query@a"


def test_replica_down_at_client_creation_is_just_a_failed_attempt(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    abc["a"].fail_creation = flavour.refused
    pool = flavour.make_pool(abc, load_balancing="in_order")
    assert flavour.run(pool.query("SELECT 1")) == "query@b"
    assert errors(pool) == [1, 0, 0]


def test_ping_tries_replicas_in_order(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    abc["a"].fail_creation = flavour.refused
    pool = flavour.make_pool(abc, load_balancing="in_order")
    assert flavour.run(pool.ping()) is True
    assert errors(pool) == [1, 0, 0]
    assert abc["b"].calls[0][0] == "ping"


def test_write_is_retried_when_it_failed_before_sending(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    abc["a"].outcomes = [flavour.refused]
    pool = flavour.make_pool(abc, load_balancing="in_order")
    assert flavour.run(pool.command("ALTER TABLE t DELETE WHERE 1")) == "command@b"


def test_insert_gets_one_stable_deduplication_token_and_is_retried(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    abc["a"].outcomes = [flavour.dropped_after_send]
    pool = flavour.make_pool(abc, load_balancing="in_order")
    assert flavour.run(pool.insert("t", [[1]], column_names=["x"])) == "insert@b"
    (_, _, first), (_, _, second) = abc["a"].calls[0], abc["b"].calls[0]
    token = first["settings"]["insert_deduplication_token"]
    assert token
    assert second["settings"]["insert_deduplication_token"] == token
    flavour.run(pool.insert("t", [[2]], column_names=["x"]))
    assert abc["b"].calls[1][2]["settings"]["insert_deduplication_token"] != token  # one per logical insert


@pytest.mark.parametrize("sent_failure", ["unknown_status_of_insert", "dropped_after_send"])
def test_insert_without_token_is_not_retried_after_sending(flavour: Flavour, sent_failure: str) -> None:
    abc = flavour.cluster("a", "b", "c")
    failure = (
        (lambda: fakes.server_error(319, "UNKNOWN_STATUS_OF_INSERT"))
        if sent_failure == "unknown_status_of_insert"
        else flavour.dropped_after_send
    )
    abc["a"].outcomes = [failure]
    pool = flavour.make_pool(abc, load_balancing="in_order", auto_insert_deduplication_token=False)
    with pytest.raises(DatabaseError):  # OperationalError is one too
        flavour.run(pool.insert("t", [[1]]))
    assert abc["b"].calls == []
    assert "settings" not in abc["a"].calls[0][2]


def test_statement_settings_choose_the_strategy_and_do_not_reach_the_server(flavour: Flavour) -> None:
    abc = flavour.cluster("a", "b", "c")
    pool = flavour.make_pool(abc, load_balancing="in_order")
    result = flavour.run(pool.query("SELECT 1", settings={"load_balancing": "first_or_random",
                                                          "load_balancing_first_offset": 2, "max_threads": 1}))
    assert result == "query@c"
    assert abc["c"].calls[0][2]["settings"] == {"max_threads": 1}
    # Given positionally, too.
    result = flavour.run(pool.query("SELECT 1", None, {"load_balancing": "first_or_random",
                                                       "load_balancing_first_offset": 1, "max_threads": 1}))
    assert result == "query@b"
    assert abc["b"].calls[0][1] == ("SELECT 1", None, {"max_threads": 1})
