"""Settings, hosts and DSNs: what is accepted, and the errors for what is not."""

from __future__ import annotations

from typing import Any

import pytest

from clickhouse_lb import ConfigurationError, LoadBalancing, Replica, get_pool
from clickhouse_lb._redact import redact_dsn
from clickhouse_lb.config.replicas import parse_dsn, parse_host, parse_replicas
from clickhouse_lb.config.settings import BalancingSettings, parse_balancing_settings, split_statement_settings
from clickhouse_lb.pools._sharded_base import key_type_cache_ms


def test_defaults_are_clickhouses() -> None:
    s = BalancingSettings()
    assert s.load_balancing is LoadBalancing.RANDOM
    assert s.load_balancing_first_offset == 0
    assert s.distributed_replica_error_half_life == 60
    assert s.distributed_replica_error_cap == 1000
    assert s.distributed_replica_max_ignored_errors == 0
    assert s.connections_with_failover_max_tries == 3
    assert s.connect_timeout_with_failover_ms == 1000


@pytest.mark.parametrize("name", ["IN_ORDER", "In_Order", " in_order "])
def test_strategy_names_are_case_insensitive(name: str) -> None:
    assert LoadBalancing.parse(name) is LoadBalancing.IN_ORDER


def test_strings_are_accepted_for_numbers() -> None:
    s = parse_balancing_settings(
        {"load_balancing_first_offset": "2", "distributed_replica_error_half_life": "0.5",
         "failover_timeout": "0", "auto_insert_deduplication_token": "false"}
    )
    assert s.load_balancing_first_offset == 2
    assert s.distributed_replica_error_half_life == 0.5
    assert s.failover_timeout is None
    assert s.auto_insert_deduplication_token is False


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"load_balancing": "fastest"}, r"Unknown load_balancing 'fastest'; valid choices: random, nearest_hostname"),
        ({"load_balancing": "round_robbin"},
         r"Unknown load_balancing 'round_robbin' \(did you mean 'round_robin'\?\); valid choices: random, "),
        ({"load_balancing": "Nearest_Hostnme"}, r"did you mean 'nearest_hostname'\?"),
        ({"auto_insert_deduplication_token": "ture"}, r"'ture' \(did you mean 'true'\?\): expected true or false"),
        ({"distributed_replica_error_cap": -1}, r"distributed_replica_error_cap -1: expected 1..1000000000 errors"),
        ({"connections_with_failover_max_tries": 0}, r"failover_max_tries 0: expected 1..1000 tries per replica"),
        ({"distributed_replica_error_half_life": "soon"}, r"half_life 'soon': expected a number of seconds"),
        ({"distributed_replica_error_half_life": -5}, r"half_life -5: expected 0\.\.1e\+10 seconds"),
        ({"connect_timeout_with_failover_ms": True}, r"expected an integer"),
        ({"distributed_replica_max_ignored_errors": "1.5"}, r"'1.5': expected an integer"),
        ({"load_balancing_frist_offset": 1}, r"Unknown balancing setting 'load_balancing_frist_offset'.*"
                                             r"Did you mean load_balancing_first_offset"),
        ({"local_hostname": ""}, r"local_hostname"),
    ],
)
def test_bad_settings_name_the_value_and_the_choices(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_balancing_settings(values)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ch-1:8123", Replica("ch-1", 8123)),
        ("ch-1", Replica("ch-1", 8123)),
        ("[::1]:9000", Replica("::1", 9000)),
        ("::1", Replica("::1", 8123)),
        (" 10.0.0.1:18123 ", Replica("10.0.0.1", 18123)),
    ],
)
def test_host_forms(text: str, expected: Replica) -> None:
    assert parse_host(text) == expected


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ([], "No replicas given"),
        ("", "No replicas given"),
        (["ch-1:http"], r"Bad port 'http' in host 'ch-1:http'"),
        (["ch-1:0"], r"Bad port 0"),
        (["ch-1:8123", "CH-1:8123"], r"Duplicate replica 'CH-1:8123'"),
        (["ch 1"], r"Bad replica host 'ch 1'"),
        ([8123], r"Bad host 8123"),
    ],
)
def test_bad_hosts(hosts: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_replicas(hosts)


def test_replica_objects_and_priorities() -> None:
    got = parse_replicas(["a:1", Replica("b", 2, priority=-3)])
    assert [(r.address, r.priority) for r in got] == [("a:1", 1), ("b:2", -3)]
    assert [r.priority for r in parse_replicas("a,b,c", priorities=[0, 1, 1])] == [0, 1, 1]
    with pytest.raises(ConfigurationError, match="priority has 2 values for 3 hosts"):
        parse_replicas("a,b,c", priorities=[0, 1])


RANGE = "expected an integer -2^63..2^63-1 (lower is preferred, negative allowed)"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: parse_dsn("clickhouse://a/db?priority=x"), f"Bad priority 'x': {RANGE}"),
        (lambda: parse_dsn("clickhouse://a,b/db?priority=0,x"), f"Bad priority 'x' in priority='0,x': {RANGE}"),
        (lambda: Replica("ch-1", priority="x"), f"Bad priority 'x' for replica 'ch-1': {RANGE}"),
        (lambda: get_pool(hosts=[Replica("ch-1", priority=1.5)], connect_on_create=False),
         f"Bad priority 1.5 for replica 'ch-1': {RANGE}"),
    ],
)
def test_a_bad_priority_is_said_once_with_what_is_valid(make: Any, message: str) -> None:
    """Not 'Bad priority in priority='x' 'x': expected an integer an integer -9223372036854775808..'."""
    with pytest.raises(ConfigurationError) as caught:
        make()
    assert str(caught.value) == message


def test_dsn_with_hosts_credentials_database_and_settings() -> None:
    parts = parse_dsn("clickhouse://u%40x:p%3Aw@h1:8123,h2:8124/analytics?load_balancing=in_order&compress=0"
                      "&max_threads=2&host=h3:8125&priority=0,1,1")
    assert [r.address for r in parts.replicas] == ["h1:8123", "h2:8124", "h3:8125"]
    assert [r.priority for r in parts.replicas] == [0, 1, 1]
    assert (parts.username, parts.password, parts.database) == ("u@x", "p:w", "analytics")
    assert parts.balancing == {"load_balancing": "in_order"}
    assert parts.options == {"compress": "0", "max_threads": "2"}
    assert parts.secure is False


def test_dsn_shared_port_and_https() -> None:
    assert [r.address for r in parse_dsn("clickhouse://ch-1,ch-2,ch-3:9123/db").replicas] == [
        "ch-1:9123", "ch-2:9123", "ch-3:9123"]
    parts = parse_dsn("https://ch-1,ch-2")
    assert parts.secure
    assert [r.port for r in parts.replicas] == [8443, 8443]


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("mysql://h1/db", r"Bad DSN scheme 'mysql'; valid: "),
        ("clickhouse:///db", r"No hosts in DSN"),
        ("clickhouse://h1:99999/db", r"Bad port 99999"),
    ],
)
def test_bad_dsns(dsn: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_dsn(dsn)


def test_redact_dsn() -> None:
    assert redact_dsn("clickhouse://u:secret@h1/db?password=x&a=1") == "clickhouse://u:***@h1/db?password=***&a=1"


def test_statement_settings_split() -> None:
    settings = {"max_threads": 1}
    overrides, rest = split_statement_settings(settings)
    assert not overrides
    assert rest is settings
    overrides, rest = split_statement_settings({"load_balancing": "IN_ORDER", "max_threads": 1,
                                                "distributed_replica_max_ignored_errors": "2"})
    assert overrides.load_balancing is LoadBalancing.IN_ORDER
    assert overrides.distributed_replica_max_ignored_errors == 2
    assert rest == {"max_threads": 1}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hosts": ["a"], "load_balancing": "nope"}, "Unknown load_balancing 'nope'"),
        ({"hosts": ["a"], "compres": True}, "Unknown option 'compres'. Did you mean compress"),
        ({"hosts": ["a"], "host": "b"}, "hosts="),
        ({"hosts": None}, "No replicas given"),
        ({"hosts": ["a"], "distributed_replica_error_half_life": "x"}, "expected a number of seconds"),
    ],
)
def test_get_pool_rejects_bad_configuration_before_any_io(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_pool(**kwargs)


def test_get_pool_merges_dsn_and_keywords_keywords_winning() -> None:
    pool = get_pool(dsn="clickhouse://u:pw@h1,h2:9000/db?load_balancing=in_order&max_threads=2&compress=false",
                    load_balancing="round_robin", username="other", connect_on_create=False)
    assert pool.settings.load_balancing is LoadBalancing.ROUND_ROBIN
    assert pool.config.client_options["username"] == "other"
    assert pool.config.client_options["password"] == "pw"
    assert pool.config.client_options["database"] == "db"
    assert pool.config.client_options["settings"] == {"max_threads": "2"}
    assert pool.config.client_options["compress"] is False  # a DSN's string, as the client's type
    assert pool.addresses == ["h1:9000", "h2:9000"]


def test_an_integer_setting_without_a_description_says_an_integer_once() -> None:
    with pytest.raises(ConfigurationError) as caught:
        key_type_cache_ms("x")
    assert str(caught.value) == "Bad sharding_key_type_cache_ms 'x': expected an integer 0..18446744073709551615"
