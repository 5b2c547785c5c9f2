"""Issue 13: every concrete bad input found by the hostile-user pass, one test each.

Each case used to leak a secret, escape as an internal error (TypeError, raw ValueError,
AttributeError, OverflowError), be accepted as nonsense, or fail only at the first statement.
Now each is a :class:`ConfigurationError` at construction, before any I/O, naming the
parameter and what is accepted, with every secret masked.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from clickhouse_lb import ConfigurationError, Replica, ReplicaPool
from clickhouse_lb import get_pool as _get_pool
from clickhouse_lb._redact import redact
from clickhouse_lb.config.settings import split_statement_settings
from clickhouse_lb.core.events import ListenerSet, PoolListener

SECRET = "hunter2"


def get_pool(*args: Any, **kwargs: Any) -> ReplicaPool:
    """get_pool without the creation check: these tests are about what happens before any I/O."""
    return _get_pool(*args, connect_on_create=False, **kwargs)


def _error(**kwargs: Any) -> str:
    with pytest.raises(ConfigurationError) as info:
        get_pool(**kwargs)
    message = str(info.value)
    assert SECRET not in message, message
    return message


# -- secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"hosts": f"clickhouse://ch-1:8123/db?password={SECRET}"}, "dsn="),
        ({"hosts": [f"h1:8123?password={SECRET}"]}, "host"),
        ({"dsn": f"clickhouse://default:{SECRET}/x@ch-1:8123/db"}, "percent-encode"),
        ({"dsn": f"clickhouse://default:hun#{SECRET}@ch-1:8123/db"}, "percent-encode"),
        ({"dsn": f"clickhouse://default:hun?{SECRET}@ch-1:8123/db"}, "percent-encode"),
        ({"dsn": f"clickhouse://default:{SECRET}@ch-1:99999/db"}, "1..65535"),
        ({"dsn": f"clickhouse://default:{SECRET}@/db"}, "No hosts"),
        ({"hosts": "h1", "password": SECRET, "compress": "banana"}, "compress"),
        ({"hosts": "h1", "settings": f"password={SECRET}"}, "settings"),
    ],
)
def test_no_secret_in_configuration_errors_built_from_user_input(kwargs: dict[str, Any], names: str) -> None:
    assert names in _error(**kwargs)


def test_a_password_with_every_special_character_parses_when_percent_encoded() -> None:
    from urllib.parse import quote

    password = "p@ss#wo?rd/%:x"
    pool = get_pool(dsn=f"clickhouse://default:{quote(password, safe='')}@ch-1:8123,ch-2/db")
    assert pool.config.client_options["password"] == password
    assert password not in repr(pool.config)


@pytest.mark.parametrize(
    "text",
    [
        f"clickhouse://u:{SECRET}@h1/db",
        f"clickhouse://u:p@ss#/?{SECRET}@h1/db",
        f"http://h1:8123/?user=u&password={SECRET}&query=1",
        f"password={SECRET}",
        f"{{'password': '{SECRET}', 'user': 'u'}}",
        f'{{"access_token": "{SECRET}"}}',
        f"Authorization: Bearer {SECRET}",
        f"X-ClickHouse-Key: {SECRET}",
        "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJodW50ZXIyIn0.c2lnbmF0dXJlaHVudGVyMg",
    ],
)
def test_redact_masks_every_form_of_secret(text: str) -> None:
    shown = redact(text)
    assert SECRET not in shown, shown
    assert "eyJzdWIi" not in shown, shown
    assert "***" in shown


@pytest.mark.parametrize("value", ["key", "token", "pass", "password", "secret"])
def test_a_bad_value_named_like_a_secret_keeps_the_message_that_explains_it(value: str) -> None:
    # The value is quoted and followed by ": expected ...": a dict item's shape, which the
    # redaction masked ("Bad failover_timeout 'token': '***' a number of seconds ...").
    message = _error(hosts=["ch-1:8123"], failover_timeout=value)
    assert f"'{value}': expected a number of seconds" in message, message


@pytest.mark.parametrize(
    "message",
    [
        "raw_insert cannot be routed by sharding key: its data is already encoded",
        "Bad sharding_key 'key': its String column needs a hash",
        "the insert token: a new one per call",
    ],
)
def test_the_pools_own_prose_is_not_taken_for_a_secret(message: str) -> None:
    assert str(ConfigurationError(message)) == message


@pytest.mark.parametrize(
    "text", [f"{{'key': '{SECRET}'}}", f'{{"token": "{SECRET}"}}', f"{{'token': {SECRET}}}", f"password: {SECRET}"]
)
def test_the_prose_words_are_still_masked_as_items(text: str) -> None:
    assert SECRET not in redact(text), redact(text)


def test_status_never_prints_a_dsn_password(capsys: pytest.CaptureFixture[str]) -> None:
    from clickhouse_lb.cli._main import main

    for dsn in (
        f"clickhouse://default:{SECRET}/x@ch-1:8123/db",
        f"clickhouse://default:a#{SECRET}@ch-1:8123/db",
        f"clickhouse://default:{SECRET}@ch-1:8123,ch-1:8123/db",
    ):
        assert main(["status", dsn]) == 2
        captured = capsys.readouterr()
        assert SECRET not in captured.out + captured.err, captured.err


# -- internal errors instead of ConfigurationError --------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"hosts": 123}, "hosts"),
        ({"hosts": ["h:¹²"]}, "port"),
        ({"hosts": "h1", "listeners": 5}, "listeners"),
        ({"hosts": "h1", "listeners": [5]}, "listener"),
        ({"dsn": 123}, "dsn"),
        ({"dsn": "clickhouse://[::1/db"}, "dsn"),
        ({"hosts": [None]}, "host"),
    ],
)
def test_wrong_types_are_configuration_errors(kwargs: dict[str, Any], names: str) -> None:
    assert names in _error(**kwargs)


# -- nonsense accepted ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["h:8123:9", "ch-1\r\nX-Injected: 1", "ch\x00-1", "ch\u200b-1", "-ch", "ch_1..x", "a" * 64 + ".example",
     "999.1.1.1:8123", "[::1", "[nonsense]:8123", "::1:zz", "h:", "h:0"],
)
def test_bad_host_strings_are_refused(host: str) -> None:
    message = _error(hosts=[host])
    assert "host" in message or "port" in message


@pytest.mark.parametrize(
    ("host", "address"),
    [("ch-1:8123", "ch-1:8123"), ("CH-1.example.com", "CH-1.example.com:8123"), ("10.0.0.1", "10.0.0.1:8123"),
     ("[::1]:9000", "[::1]:9000"), ("::1", "[::1]:8123"), ("[fe80::1%eth0]:8123", "[fe80::1%eth0]:8123"),
     ("localhost.", "localhost.:8123"), ("ch_1", "ch_1:8123")],
)
def test_valid_host_strings_still_parse(host: str, address: str) -> None:
    assert get_pool(hosts=[host]).addresses == [address]


def test_replica_objects_are_validated_like_host_strings() -> None:
    with pytest.raises(ConfigurationError, match="host"):
        Replica("ch\n1")
    with pytest.raises(ConfigurationError, match="priority"):
        Replica("ch-1", priority=10**30)


def test_repeated_dsn_parameter_is_refused() -> None:
    assert "priority" in _error(dsn="clickhouse://h1,h2/db?priority=0,1&priority=1,0")
    assert "load_balancing" in _error(dsn="clickhouse://h1,h2/db?load_balancing=random&load_balancing=in_order")


def test_dsn_and_hosts_together_take_the_hosts_and_keep_the_dsns_secret_out_of_sight() -> None:
    # Keywords win over the DSN, as get_client(dsn=..., host=...) takes its host.
    pool = get_pool(hosts="h3", dsn=f"clickhouse://u:{SECRET}@h1,h2/db")
    assert pool.addresses == ["h3:8123"]
    assert pool.config.client_options["password"] == SECRET
    assert SECRET not in repr(pool)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"distributed_replica_error_half_life": float("inf")}, "distributed_replica_error_half_life"),
        ({"distributed_replica_error_half_life": "nan"}, "distributed_replica_error_half_life"),
        ({"distributed_replica_error_half_life": -1}, "distributed_replica_error_half_life"),
        ({"distributed_replica_error_cap": 0}, "distributed_replica_error_cap"),
        ({"connections_with_failover_max_tries": 10**9}, "connections_with_failover_max_tries"),
        ({"connect_timeout_with_failover_ms": 10**15}, "connect_timeout_with_failover_ms"),
        ({"failover_backoff_ms": 10**12}, "failover_backoff_ms"),
        ({"failover_timeout": float("inf")}, "failover_timeout"),
        ({"load_balancing_first_offset": 2**70}, "load_balancing_first_offset"),
        ({"distributed_replica_max_ignored_errors": -1}, "distributed_replica_max_ignored_errors"),
    ],
)
def test_numbers_out_of_their_documented_bounds_are_refused(kwargs: dict[str, Any], names: str) -> None:
    message = _error(hosts="h1,h2", **kwargs)
    assert names in message
    assert ".." in message


# -- accepted at construction, failing only at the first statement ----------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"compress": "banana"}, "compress"),
        ({"compress": 5}, "compress"),
        ({"send_receive_timeout": -5}, "send_receive_timeout"),
        ({"send_receive_timeout": "soon"}, "send_receive_timeout"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"settings": "max_threads=4"}, "settings"),
        ({"settings": {1: 2}}, "settings"),
        ({"username": 5}, "username"),
        ({"query_limit": -1}, "query_limit"),
        ({"interface": "ftp"}, "interface"),
        ({"secure": "maybe"}, "secure"),
    ],
)
def test_client_options_are_checked_at_construction(kwargs: dict[str, Any], names: str) -> None:
    assert names in _error(hosts="h1,h2", **kwargs)


def test_valid_client_options_pass_and_dsn_strings_become_numbers() -> None:
    pool = get_pool(dsn="clickhouse://h1,h2/db?send_receive_timeout=30&compress=lz4&connect_timeout=2")
    options = pool.config.client_options
    # The timeouts are the pool's (it gives each client the exact value), as numbers.
    assert "send_receive_timeout" not in options
    assert "connect_timeout" not in options
    timeouts = pool.config.attempts.timeouts
    assert (timeouts.send, timeouts.receive) == (30.0, 30.0)
    one = get_pool(dsn="clickhouse://h1/db?connect_timeout=2")
    assert one.config.attempts.timeouts.connect == 2.0  # one replica: connect_timeout holds
    assert options["compress"] == "lz4"
    assert get_pool(hosts="h1", compress=True, settings={"max_threads": 4}).config.client_options["compress"] is True


@pytest.mark.parametrize(
    "settings",
    [
        {"load_balancing": "banana"},
        {"load_balancing_first_offset": 2**70},
        {"distributed_replica_max_ignored_errors": -1},
    ],
)
def test_per_statement_overrides_are_bounded(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        split_statement_settings(settings)


# -- races --------------------------------------------------------------------------------------


def test_listener_add_and_remove_from_many_threads_lose_nothing() -> None:
    listeners = ListenerSet()
    per_thread = 150
    batches = [[PoolListener() for _ in range(per_thread)] for _ in range(8)]
    for batch in batches:
        for listener in batch:
            listeners.add(listener)
    barrier = threading.Barrier(len(batches))

    def remove(batch: list[PoolListener]) -> None:
        barrier.wait()
        for listener in batch:
            listeners.remove(listener)

    threads = [threading.Thread(target=remove, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not listeners
    assert len(listeners) == 0


# -- the failover schedule ----------------------------------------------------------------------


def test_the_failover_schedule_is_computed_not_materialised() -> None:
    import tracemalloc

    from clickhouse_lb.config.replicas import parse_replicas
    from clickhouse_lb.config.settings import parse_balancing_settings
    from clickhouse_lb.core.balancer import Balancer
    from clickhouse_lb.core.failover import StatementAttempts

    replicas = parse_replicas([f"h{i}" for i in range(200)])
    balancer = Balancer(replicas, parse_balancing_settings({"connections_with_failover_max_tries": 1000}))
    order = list(range(200))[::-1]
    tracemalloc.start()
    attempts = StatementAttempts(balancer, order, operation="query", retry_after_send=True)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 100_000  # replicas x tries would be 200,000 entries (1.6 MB of pointers alone)
    assert attempts.policy.remaining == 200 * 1000
    assert [attempts.policy.scheduled(n) for n in range(450)] == (order * 3)[:450]
