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

from clickhouse_lb.errors import AllReplicasUnavailableError, ConfigurationError

from . import fakes
from .conftest import FakeClock


def _async_available() -> bool:
    try:
        from clickhouse_lb.aio import require_native_async_client

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
    assert abc["b"].calls == []
    assert errors(pool) == [1, 0, 0]  # the replica still failed


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
