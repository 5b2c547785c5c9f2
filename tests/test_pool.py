"""ReplicaPool's logic against fake replicas: routing, failover, error accounting, safety of
writes, sessions, configuration errors. (Against real servers: integration/.)"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clickhouse_lb.errors import AllReplicasUnavailableError, ConfigurationError, SessionLostError

from .fakes import FakeCluster, make_pool, read_timeout, refused, server_error


@pytest.fixture
def abc() -> FakeCluster:
    return FakeCluster("a", "b", "c")


def test_statement_runs_on_the_first_replica_of_the_plan(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.query("SELECT 1") == "query@a"
    assert pool.command("SELECT 2") == "command@a"
    assert [c[0] for c in abc["a"].calls] == ["query", "command"]


def test_clients_are_created_lazily_once_per_replica_without_session_ids(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", compress=False)
    assert all(r.created == 0 for r in abc.replicas.values())
    for _ in range(5):
        pool.query("SELECT 1")
    assert [r.created for r in abc.replicas.values()] == [1, 0, 0]
    options = abc.clients[0].options
    assert options["autogenerate_session_id"] is False
    assert options["compress"] is False  # the user's options reach every replica's client
    assert options["query_retries"] == 0  # failover is the pool's job
    assert options["connect_timeout"] == 1  # connect_timeout_with_failover_ms=1000, whole seconds


def test_replica_failure_fails_over_and_counts_one_error(abc: FakeCluster) -> None:
    abc["a"].outcomes = [refused]
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.query("SELECT 1") == "query@b"
    status = {s.host: s for s in pool.replicas}
    assert status["a"].errors_count == 1
    assert status["a"].is_up is False
    assert "Connection refused" in (status["a"].last_error or "")
    assert status["b"].errors_count == 0
    # The next statement avoids the replica with an error until it decays.
    assert pool.plan() == ["b:8123", "c:8123", "a:8123"]
    assert pool.query("SELECT 1") == "query@b"


@pytest.mark.parametrize(("code", "name"), [(210, "NETWORK_ERROR"), (209, "SOCKET_TIMEOUT"),
                                            (202, "TOO_MANY_SIMULTANEOUS_QUERIES"), (999, "KEEPER_EXCEPTION")])
def test_server_errors_that_mean_replica_unavailable_fail_over(abc: FakeCluster, code: int, name: str) -> None:
    abc["a"].outcomes = [lambda: server_error(code, name), "ok"]
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.query("SELECT 1") == "query@b"
    assert pool.replicas[0].errors_count == 1


def test_pool_recovers_when_replicas_come_back(abc: FakeCluster) -> None:
    for replica in abc.replicas.values():
        replica.outcomes = [refused]
    pool = make_pool(abc, load_balancing="in_order")
    with pytest.raises(AllReplicasUnavailableError):
        pool.query("SELECT 1")
    for replica in abc.replicas.values():
        replica.outcomes = ["ok"]
    assert pool.query("SELECT 1").startswith("query@")
    assert any(s.is_up for s in pool.replicas)


def test_read_is_retried_after_a_timeout(abc: FakeCluster) -> None:
    abc["a"].outcomes = [read_timeout]
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.query("  /* c */ (SELECT 1)") == "query@b"


def test_insert_keeps_the_users_settings_and_token(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    pool.insert("t", [[1]], settings={"async_insert": 1, "insert_deduplication_token": "mine"})
    assert abc["a"].calls[0][2]["settings"] == {"async_insert": 1, "insert_deduplication_token": "mine"}


def test_statement_settings_given_positionally_are_handled_too(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.query("SELECT 1", None, {"load_balancing": "first_or_random",
                                         "load_balancing_first_offset": 1}) == "query@b"
    assert abc["b"].calls[0][1] == ("SELECT 1", None, {})


def test_bad_statement_setting_is_a_clear_error(abc: FakeCluster) -> None:
    pool = make_pool(abc)
    with pytest.raises(ConfigurationError, match=r"nope.*valid choices"):
        pool.query("SELECT 1", settings={"load_balancing": "nope"})


def test_record_error_moves_a_replica_back(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.record_error("a:8123", "stale data") == 1
    assert pool.plan()[0] == "b:8123"
    assert pool.replicas[0].last_error == "stale data"
    with pytest.raises(ConfigurationError, match=r"Unknown replica 'zz:1'.*a:8123"):
        pool.record_error("zz:1")


def test_session_pins_one_replica_and_reports_loss(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    with pool.session() as session:
        assert session.address == "a:8123"
        assert session.query("SELECT 1") == "query@a"
        assert session.client.options["session_id"]
        abc["a"].outcomes = [refused]
        with pytest.raises(SessionLostError, match=r"a:8123"):
            session.query("SELECT 2")
        abc["a"].outcomes = [lambda: server_error(62, "SYNTAX_ERROR")]
        with pytest.raises(DatabaseError) as caught:
            session.query("SELEC")
        assert not isinstance(caught.value, SessionLostError)
    assert abc["b"].calls == []  # never moved silently
    assert pool.replicas[0].errors_count == 1
    assert session.client.closed


def test_session_skips_replicas_that_cannot_be_reached(abc: FakeCluster) -> None:
    abc["a"].fail_creation = refused
    pool = make_pool(abc, load_balancing="in_order")
    with pool.session() as session:
        assert session.address == "b:8123"


def test_round_robin_gives_each_healthy_replica_an_exact_share(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    for _ in range(300):
        pool.query("SELECT 1")
    assert [len(r.calls) for r in abc.replicas.values()] == [100, 100, 100]
    pool.record_error("b:8123")
    for _ in range(300):
        pool.query("SELECT 1")
    assert [len(r.calls) for r in abc.replicas.values()] == [250, 100, 250]


def test_plan_does_not_advance_round_robin(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="round_robin")
    first = pool.plan()
    assert all(pool.plan() == first for _ in range(5))
    pool.query("SELECT 1")
    assert pool.plan() != first


def test_failover_timeout_bounds_a_statement(abc: FakeCluster) -> None:
    for replica in abc.replicas.values():
        replica.outcomes = [refused]
    pool = make_pool(abc, failover_timeout=0.000001, connections_with_failover_max_tries=100)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        pool.query("SELECT 1")
    assert len(caught.value.failures) < 300


def test_secrets_never_appear_in_repr_or_errors(abc: FakeCluster) -> None:
    def leaky() -> BaseException:
        error = refused()
        error.args = ("Error for url http://default:hunter2@a:8123/?password=hunter2&query=x",)
        return error

    for replica in abc.replicas.values():
        replica.outcomes = [leaky]
    pool = make_pool(abc, password="hunter2", connections_with_failover_max_tries=1)
    assert "hunter2" not in repr(pool) + repr(pool.config)
    with pytest.raises(AllReplicasUnavailableError) as caught:
        pool.query("SELECT 1")
    assert "http://default:***@a:8123/ " in str(caught.value)  # the password masked, the query string dropped
    assert "hunter2" not in str(caught.value)
    assert all("hunter2" not in (s.last_error or "") for s in pool.replicas)


def test_session_options_may_override_the_pools(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order", autogenerate_session_id=True)
    with pool.session() as session:
        assert session.client.options["session_id"]
    pinned = pool.pin(session=False)
    assert pinned.client.options["autogenerate_session_id"] is False
    assert pinned.get_client_setting("autogenerate_session_id") is False  # falls through to the client
    pinned.close()


def test_write_is_retried_when_the_replica_failed_while_its_client_was_created(abc: FakeCluster) -> None:
    abc["a"].fail_creation = read_timeout  # the client talks to the server at creation
    pool = make_pool(abc, load_balancing="in_order")
    assert pool.command("ALTER TABLE t DELETE WHERE 1") == "command@b"  # never sent to a
    assert pool.replicas[0].errors_count == 1


def _threads_blocked_in(function: str) -> int:
    """Threads whose innermost Python frame is ``function`` (blocked there on a C-level lock)."""
    return sum(1 for frame in sys._current_frames().values() if frame.f_code.co_name == function)


def test_threads_waiting_on_a_failing_client_creation_share_its_failure(abc: FakeCluster) -> None:
    abc["a"].fail_creation = read_timeout
    abc["a"].creation_gate = gate = threading.Event()
    pool = make_pool(abc, load_balancing="in_order")
    with ThreadPoolExecutor(8) as executor:
        futures = [executor.submit(pool.query, "SELECT 1") for _ in range(8)]
        deadline = time.monotonic() + 10
        # one thread creates the client (held at the gate), seven wait for the slot's lock (a
        # step of the client's creation, taken where clickhouse_lb.pools._steps carries it out)
        while not (abc["a"].created == 1 and _threads_blocked_in("drive_async") == 7):
            assert time.monotonic() < deadline, "the threads never lined up"
            time.sleep(0.001)
        gate.set()  # ...and the creation times out
        assert [f.result(timeout=10) for f in futures] == ["query@b"] * 8
    assert abc["a"].created == 1  # the other seven did not each wait out their own timeout
    assert pool.replicas[0].errors_count == 8  # every statement's attempt on a failed
