"""What a pool tells the application: log records under ``clickhouse_lb``, listener events, and
no secret in any of them (nor in reprs, exception messages or ``clickhouse-lb status`` output).

No server: fake replicas (tests/fakes.py) fail the way clickhouse-connect does, a FakeClock drives
the decay.
"""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Iterable
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

import clickhouse_lb
from clickhouse_lb import ErrorRecordedEvent, FailoverEvent, PoolListener, ReplicaRecoveredEvent
from clickhouse_lb.cli._main import main
from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.settings import BALANCING_SETTING_NAMES
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.errors import AllReplicasUnavailableError, ConfigurationError, SessionLostError
from clickhouse_lb.pools.pool import ReplicaPool

from .conftest import FakeClock
from .fakes import FakeCluster, make_pool, refused, reset_after_send

SECRET = "s3cret-Pa55"
TOKEN = "tok-9f8e7d6c"


# -- helpers -------------------------------------------------------------------------------------


class Recorder(PoolListener):
    """Keeps every event it receives."""

    def __init__(self) -> None:
        self.events: list[object] = []

    def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
        self.events.append(event)

    def on_failover(self, event: FailoverEvent) -> None:
        self.events.append(event)

    def on_replica_recovered(self, event: ReplicaRecoveredEvent) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def pool_with_listeners(
    cluster: FakeCluster, listeners: Iterable[object], clock: FakeClock | None = None, **options: Any
) -> ReplicaPool:
    """Like fakes.make_pool, with listeners given at construction (``get_pool(listeners=...)``)."""
    balancing = {k: options.pop(k) for k in list(options) if k in BALANCING_SETTING_NAMES}
    options.setdefault("health_check_interval_ms", 0)  # fake replicas answer no /ping
    config = resolve_pool_config(
        [f"{h}:8123" for h in cluster.replicas], dsn=None, balancing=balancing,
        client_options=options, valid_client_options=sync_client_option_names(),
    )
    balancer = Balancer(config.replicas, config.settings, clock=clock or FakeClock(),
                        random=random.Random(7).random, listeners=listeners)
    return ReplicaPool(config, client_factory=cluster.factory, balancer=balancer)


def lb_records(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name.startswith("clickhouse_lb") and (level is None or r.levelno == level)]


def leaky_error() -> OperationalError:
    """A transport error whose text carries credentials and tokens in URLs and headers."""
    err = OperationalError(
        f"Error executing HTTP request http://default:{SECRET}@a:8123/?password={SECRET}"
        f"&access_token={TOKEN}&insert_deduplication_token={TOKEN} Authorization: Basic {SECRET}"
    )
    err.__cause__ = reset_after_send().__cause__
    return err


def assert_no_secret(*texts: object) -> None:
    for text in texts:
        assert SECRET not in str(text), text
        assert TOKEN not in str(text), text


@pytest.fixture
def abc() -> FakeCluster:
    return FakeCluster("a", "b", "c")


# -- logging -------------------------------------------------------------------------------------


def test_failover_is_a_warning_naming_the_replica_and_the_failure(
    abc: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    abc["a"].outcomes = [refused, "ok"]
    pool = make_pool(abc, load_balancing="in_order")
    with caplog.at_level(logging.DEBUG, logger="clickhouse_lb"):
        assert pool.query("SELECT 1") == "query@b"
    warnings = lb_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "a:8123" in message
    assert "Connection refused" in message
    assert "b:8123" in message  # where the statement went next
    assert "SELECT" not in message  # never the statement's SQL


def test_each_attempt_is_logged_at_debug(abc: FakeCluster, caplog: pytest.LogCaptureFixture) -> None:
    abc["a"].outcomes = [refused, "ok"]
    pool = make_pool(abc, load_balancing="in_order")
    with caplog.at_level(logging.DEBUG, logger="clickhouse_lb"):
        pool.query("SELECT 1")
    attempts = [r.getMessage() for r in lb_records(caplog, logging.DEBUG) if "attempt" in r.getMessage()]
    assert attempts == ["query: attempt 1 on a:8123", "query: attempt 2 on b:8123"]


def test_no_warning_when_nothing_fails(abc: FakeCluster, caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    with caplog.at_level(logging.INFO, logger="clickhouse_lb"):
        for _ in range(5):
            pool.query("SELECT 1")
    assert lb_records(caplog) == []


def test_recovery_by_decay_is_logged_at_info(abc: FakeCluster, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    pool = make_pool(abc, clock=clock, load_balancing="in_order", distributed_replica_error_half_life=10)
    pool.plan()  # the first selection starts the decay clock
    pool.record_error("a:8123")
    pool.record_error("a:8123")  # 2 errors: bits(2) = 2 half-lives to zero
    with caplog.at_level(logging.INFO, logger="clickhouse_lb"):
        clock.advance(10)
        assert pool.plan()[-1] == "a:8123"  # 1 error left: still last
        assert lb_records(caplog, logging.INFO) == []
        clock.advance(10)
        assert pool.plan()[0] == "a:8123"
    infos = lb_records(caplog, logging.INFO)
    assert [r.getMessage() for r in infos] == ["replica a:8123 is back in rotation (decayed)"]


def test_recovery_by_success_after_a_failure_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    solo = FakeCluster("a")
    solo["a"].outcomes = [refused, "ok"]
    pool = make_pool(solo)
    with caplog.at_level(logging.INFO, logger="clickhouse_lb"):
        assert pool.query("SELECT 1") == "query@a"  # attempt 1 refused, attempt 2 on a succeeds
    messages = [r.getMessage() for r in lb_records(caplog, logging.INFO)]
    assert messages == ["replica a:8123 is back in rotation (succeeded)"]


def test_every_replica_failing_is_an_error_record(abc: FakeCluster, caplog: pytest.LogCaptureFixture) -> None:
    for replica in abc.replicas.values():
        replica.outcomes = [refused]
    pool = make_pool(abc, load_balancing="in_order", connections_with_failover_max_tries=1)
    with caplog.at_level(logging.DEBUG, logger="clickhouse_lb"), pytest.raises(AllReplicasUnavailableError):
        pool.query("SELECT 1")
    errors = lb_records(caplog, logging.ERROR)
    assert len(errors) == 1
    assert all(address in errors[0].getMessage() for address in ("a:8123", "b:8123", "c:8123"))


# -- listeners -----------------------------------------------------------------------------------


def test_listeners_receive_the_three_events_with_their_fields(abc: FakeCluster) -> None:
    clock = FakeClock()
    recorder = Recorder()
    abc["a"].outcomes = [refused, "ok"]
    pool = pool_with_listeners(abc, [recorder], clock, load_balancing="in_order",
                               distributed_replica_error_half_life=5)
    assert pool.query("SELECT 1") == "query@b"

    (recorded,) = recorder.of(ErrorRecordedEvent)
    assert recorded.address == "a:8123"
    assert recorded.errors_count == 1
    assert "Connection refused" in recorded.error
    (failover,) = recorder.of(FailoverEvent)
    assert (failover.operation, failover.address, failover.attempt, failover.next_address) == (
        "query", "a:8123", 1, "b:8123")
    assert "Connection refused" in failover.error
    assert recorder.of(ReplicaRecoveredEvent) == []

    clock.advance(5)
    assert pool.query("SELECT 1") == "query@a"  # decayed, back first: then it succeeds
    # Two reasons, two events: back in the ordering (decayed), then answering again (succeeded).
    assert recorder.of(ReplicaRecoveredEvent) == [
        ReplicaRecoveredEvent("a:8123", "decayed"), ReplicaRecoveredEvent("a:8123", "succeeded")]


def test_recovered_by_success_event() -> None:
    solo = FakeCluster("a")
    solo["a"].outcomes = [refused, "ok"]
    recorder = Recorder()
    pool = pool_with_listeners(solo, [recorder])
    pool.query("SELECT 1")
    assert recorder.of(ReplicaRecoveredEvent) == [ReplicaRecoveredEvent("a:8123", "succeeded")]
    assert recorder.of(FailoverEvent)[0].next_address == "a:8123"  # the next try on the same replica


def test_listener_added_later_and_removed(abc: FakeCluster) -> None:
    recorder = Recorder()
    pool = make_pool(abc, load_balancing="in_order")
    pool.add_listener(recorder)
    pool.record_error("b:8123", "stale data")
    assert recorder.events == [ErrorRecordedEvent("b:8123", 1, "stale data")]
    pool.remove_listener(recorder)
    pool.record_error("b:8123")
    assert len(recorder.events) == 1


def test_get_pool_takes_listeners_and_any_object_with_some_of_the_methods() -> None:
    seen: list[ErrorRecordedEvent] = []

    class OnlyErrors:
        def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
            seen.append(event)

    with clickhouse_lb.get_pool(["a:8123", "b:8123"], listeners=[OnlyErrors()], connect_on_create=False) as pool:
        pool.record_error("a:8123")  # no I/O: counts an error, as a failed attempt would
    assert seen == [ErrorRecordedEvent("a:8123", 1, "recorded by the application")]


@pytest.mark.parametrize("method", ["on_error_recorded", "on_failover", "on_replica_recovered"])
def test_a_listener_that_raises_never_breaks_a_statement(
    abc: FakeCluster, caplog: pytest.LogCaptureFixture, method: str
) -> None:
    class Broken(PoolListener):
        pass

    def boom(event: object) -> None:
        raise RuntimeError("metrics backend down")

    broken = Broken()
    setattr(broken, method, boom)
    recorder = Recorder()
    clock = FakeClock()
    abc["a"].outcomes = [refused, "ok"]
    pool = pool_with_listeners(abc, [broken, recorder], clock, load_balancing="in_order",
                               distributed_replica_error_half_life=1)
    with caplog.at_level(logging.DEBUG, logger="clickhouse_lb"):
        assert pool.query("SELECT 1") == "query@b"
        clock.advance(1)
        assert pool.query("SELECT 1") == "query@a"
    # The other listener still got everything, and the failure was logged.
    assert [type(e).__name__ for e in recorder.events] == [
        "ErrorRecordedEvent", "FailoverEvent", "ReplicaRecoveredEvent", "ReplicaRecoveredEvent"]
    failures = [r for r in lb_records(caplog, logging.ERROR) if "listener" in r.getMessage()]
    assert failures
    assert all(method in r.getMessage() and r.exc_info for r in failures)


# -- secrets -------------------------------------------------------------------------------------


def test_no_secret_in_pool_or_config_reprs() -> None:
    pools = [
        clickhouse_lb.get_pool(
            ["a:8123", "b:8123"], username="u", password=SECRET, access_token=TOKEN, connect_on_create=False
        ),
        clickhouse_lb.get_pool(
            dsn=f"clickhouse://u:{SECRET}@a:8123,b:8123/db?load_balancing=in_order", connect_on_create=False
        ),
        clickhouse_lb.get_pool(dsn=f"clickhouse://a:8123,b:8123/db?password={SECRET}", connect_on_create=False),
    ]
    for pool in pools:
        assert_no_secret(repr(pool), str(pool), repr(pool.config), str(pool.config), repr(pool.settings))
        assert_no_secret(*(repr(status) for status in pool.replicas))
        pool.close()


def test_no_secret_in_logs_status_events_or_errors_when_failures_carry_them(
    abc: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    for replica in abc.replicas.values():
        replica.outcomes = [leaky_error]
    recorder = Recorder()
    pool = pool_with_listeners(abc, [recorder], load_balancing="in_order", password=SECRET)
    with caplog.at_level(logging.DEBUG, logger="clickhouse_lb"), pytest.raises(AllReplicasUnavailableError) as caught:
        pool.query("SELECT 1")
    assert lb_records(caplog)  # there was plenty to log ...
    assert_no_secret(*(r.getMessage() for r in caplog.records), caplog.text)  # ... and no secret in it
    assert_no_secret(str(caught.value), repr(caught.value), *caught.value.failures, *caught.value.last_errors.values())
    assert_no_secret(*(repr(e) for e in recorder.events))
    assert_no_secret(*(repr(s) for s in pool.replicas))


def test_no_deduplication_token_in_logs_when_an_insert_fails_over(
    abc: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    abc["a"].outcomes = [leaky_error, "ok"]
    pool = make_pool(abc, load_balancing="in_order")
    with caplog.at_level(logging.DEBUG, logger="clickhouse_lb"):
        pool.insert("t", [[1]], column_names=["x"], settings={"insert_deduplication_token": TOKEN})
    sent = abc["b"].calls[0][2]["settings"]["insert_deduplication_token"]
    assert sent == TOKEN  # the same token went to the next replica ...
    assert_no_secret(caplog.text)  # ... but never into a log line


def test_no_secret_in_configuration_errors() -> None:
    bad_dsns = [
        f"clickhouse://u:{SECRET}@/db",
        f"clickhouse://u:{SECRET}@a:notaport/db",
        f"clickhouse://u:{SECRET}@a:8123/db?load_balancing=bogus",
        f"ftp://u:{SECRET}@a:8123/db",
        f"clickhouse://u:{SECRET}@a:8123,a:8123/db",
    ]
    for dsn in bad_dsns:
        with pytest.raises(ConfigurationError) as caught:
            clickhouse_lb.get_pool(dsn=dsn)
        assert_no_secret(str(caught.value), repr(caught.value))


@pytest.mark.parametrize("hosts", [f"clickhouse://default:{SECRET}@a:8123", f"default:{SECRET}@a:8123"])
def test_no_secret_when_credentials_are_given_as_a_host(hosts: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        clickhouse_lb.get_pool(hosts)
    assert_no_secret(str(caught.value))


def test_no_secret_in_session_lost_error(abc: FakeCluster) -> None:
    pool = make_pool(abc, load_balancing="in_order")
    with pool.session() as session:
        abc["a"].outcomes = [leaky_error]
        with pytest.raises(SessionLostError) as caught:
            session.query("SELECT 1")
    assert_no_secret(str(caught.value))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("extra", [["--json"], [], ["-vv"]])
def test_no_secret_in_status_output(capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    dsn = f"clickhouse://default:{SECRET}@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/db?access_token={TOKEN}"
    assert main(["status", dsn, "--timeout", "1", *extra]) == 1
    out, err = capsys.readouterr()
    assert "127.0.0.1" in out
    assert_no_secret(out, err)


def test_no_secret_in_status_output_with_password_option(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLICKHOUSE_PASSWORD", TOKEN)
    port = free_port()
    assert main(["status", f"127.0.0.1:{port}", "--password", SECRET, "--timeout", "1", "-vv"]) == 1
    assert main(["status", f"127.0.0.1:{port}", "--timeout", "1", "--json"]) == 1  # password from the env
    out, err = capsys.readouterr()
    assert_no_secret(out, err)


def test_cli_never_echoes_credentials_given_as_a_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", f"default:{SECRET}@a:8123"]) == 2
    out, err = capsys.readouterr()
    assert "credentials" in err
    assert_no_secret(out, err)
