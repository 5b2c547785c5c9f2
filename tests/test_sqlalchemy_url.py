"""The ``clickhousedb+lb://`` URL: every documented form, what the dialect keeps for itself,
what it hands on to clickhouse-connect, and the errors raised at ``create_engine``."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import pytest
import urllib3
from clickhouse_connect.cc_sqlalchemy.dialect import ClickHouseDialect
from sqlalchemy import create_engine
from sqlalchemy.engine import URL, make_url

import clickhouse_lb
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.config.settings import BALANCING_SETTING_NAMES, LoadBalancing
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.sqlalchemy import ClickHouseLBDialect, EngineArgs, engine_args_from_url
from clickhouse_lb.sqlalchemy.url import DIALECT_PARAMETERS


def args(url: str) -> EngineArgs:
    """What create_engine hands to the dialect's connect() for this URL."""
    engine = create_engine(url)
    _, cparams = engine.dialect.create_connect_args(engine.url)
    (value,) = cparams.values()
    assert isinstance(value, EngineArgs)
    return value


def addresses(engine_args: EngineArgs) -> list[str]:
    return [r.address for r in engine_args.config.replicas]


# -- registration ----------------------------------------------------------------------------


def test_entry_point_is_registered() -> None:
    names = {ep.name: ep.value for ep in entry_points(group="sqlalchemy.dialects")}
    assert names["clickhousedb.lb"] == "clickhouse_lb.sqlalchemy.dialect:ClickHouseLBDialect"


def test_create_engine_uses_the_lb_dialect_built_on_clickhouse_connects() -> None:
    engine = create_engine("clickhousedb+lb://u:pw@ch-1,ch-2:8123/db")
    assert isinstance(engine.dialect, ClickHouseLBDialect)
    assert isinstance(engine.dialect, ClickHouseDialect)
    assert (engine.dialect.name, engine.dialect.driver) == ("clickhousedb", "lb")
    assert engine.dialect.replica_pool is None  # nothing connects before the first checkout


def test_clickhouse_connect_compiler_and_types_are_inherited() -> None:
    from clickhouse_connect.cc_sqlalchemy.datatypes.sqltypes import UInt32
    from sqlalchemy import Column, MetaData, Table, select

    engine = create_engine("clickhousedb+lb://u@ch-1/db")
    table = Table("t", MetaData(), Column("x", UInt32))
    sql = str(select(table.c.x).limit(3).compile(engine))
    assert "LIMIT" in sql
    assert "`t`" in sql or "t." in sql


# -- URL forms -------------------------------------------------------------------------------


def test_repeated_host_parameters() -> None:
    got = args("clickhousedb+lb://user:pw@/db?host=ch-1:8123&host=ch-2:8124&load_balancing=in_order")
    assert addresses(got) == ["ch-1:8123", "ch-2:8124"]
    assert got.config.settings.load_balancing is LoadBalancing.IN_ORDER
    options = got.config.client_options
    assert (options["username"], options["password"], options["database"]) == ("user", "pw", "db")


def test_one_shared_port_in_the_authority() -> None:
    got = args("clickhousedb+lb://user:pw@ch-1,ch-2,ch-3:9000/db")
    assert addresses(got) == ["ch-1:9000", "ch-2:9000", "ch-3:9000"]


def test_authority_without_port_uses_the_default_port() -> None:
    assert addresses(args("clickhousedb+lb://u@ch-1,ch-2/db")) == ["ch-1:8123", "ch-2:8123"]


def test_alt_hosts_like_clickhouse_driver_and_superset() -> None:
    got = args("clickhousedb+lb://u@ch-1:8123/db?alt_hosts=ch-2:8123,ch-3:8125")
    assert addresses(got) == ["ch-1:8123", "ch-2:8123", "ch-3:8125"]


def test_host_order_is_authority_then_host_then_alt_hosts() -> None:
    got = args("clickhousedb+lb://u@a:1/db?alt_hosts=d:4&host=b:2&host=c:3")
    assert addresses(got) == ["a:1", "b:2", "c:3", "d:4"]


def test_ipv6_hosts() -> None:
    assert addresses(args("clickhousedb+lb://u@[::1]:8123/db?host=[::2]:8124")) == ["[::1]:8123", "[::2]:8124"]


@pytest.mark.parametrize("flag", ["secure=true", "https=1", "secure=yes", "interface=https"])
def test_tls_switches_the_default_port_and_the_clients(flag: str) -> None:
    got = args(f"clickhousedb+lb://u@ch-1,ch-2/db?{flag}&host=ch-3:9443")
    assert addresses(got) == ["ch-1:8443", "ch-2:8443", "ch-3:9443"]
    assert got.config.client_options["secure"] is True


def test_secure_false_is_plain_http() -> None:
    got = args("clickhousedb+lb://u@ch-1/db?secure=false")
    assert addresses(got) == ["ch-1:8123"]
    assert "secure" not in got.config.client_options


def test_balancing_settings_by_their_clickhouse_names() -> None:
    got = args(
        "clickhousedb+lb://u@ch-1,ch-2,ch-3:8123/db?load_balancing=First_Or_Random"
        "&load_balancing_first_offset=2&local_hostname=ch-2.example&distributed_replica_error_half_life=30"
        "&distributed_replica_error_cap=50&distributed_replica_max_ignored_errors=1"
        "&connections_with_failover_max_tries=2&connect_timeout_with_failover_ms=250"
    )
    settings = got.config.settings
    assert settings.load_balancing is LoadBalancing.FIRST_OR_RANDOM
    assert settings.load_balancing_first_offset == 2
    assert settings.local_hostname == "ch-2.example"
    assert settings.distributed_replica_error_half_life == 30.0
    assert settings.distributed_replica_error_cap == 50
    assert settings.distributed_replica_max_ignored_errors == 1
    assert settings.connections_with_failover_max_tries == 2
    assert settings.connect_timeout_with_failover_ms == 250


def test_per_replica_priority_one_per_host_in_order() -> None:
    got = args("clickhousedb+lb://u@ch-1,ch-2,ch-3:8123/db?priority=0,1,-1")
    assert got.config.replicas == [Replica("ch-1", 8123, 0), Replica("ch-2", 8123, 1), Replica("ch-3", 8123, -1)]


def test_user_password_and_database_are_decoded() -> None:
    got = args("clickhousedb+lb://us%40er:p%40ss%3Aw@ch-1/my%20db")
    options = got.config.client_options
    assert (options["username"], options["password"], options["database"]) == ("us@er", "p@ss:w", "my db")


@pytest.mark.parametrize(
    ("path", "database"), [("my%2520db", "my%20db"), ("a%2Fb%3Fc", "a/b?c"), ("100%", "100%"), ("plain", "plain")]
)
def test_the_database_is_decoded_exactly_once(path: str, database: str) -> None:
    """SQLAlchemy 2.1 decodes the database itself, 1.4 and 2.0 leave it to the dialect: the
    result is the same on every version, and never decoded twice."""
    assert args(f"clickhousedb+lb://u@ch-1/{path}").config.client_options["database"] == database


def test_a_url_object_keeps_its_database_as_given() -> None:
    url = URL.create("clickhousedb+lb", username="u", host="ch-1", database="my db")
    assert engine_args_from_url(url).config.client_options["database"] == "my db"


# -- what is handed on to clickhouse-connect --------------------------------------------------


def test_the_dialects_own_parameters_are_stripped() -> None:
    ours = "&".join(
        [
            "host=ch-2:8123",
            "alt_hosts=ch-3:8123",
            "priority=0,1,1",
            "secure=false",
            "https=false",
            "autogenerate_session_id=true",
            "load_balancing=round_robin",
            "load_balancing_first_offset=1",
            "local_hostname=x",
            "distributed_replica_error_half_life=5",
            "distributed_replica_error_cap=9",
            "distributed_replica_max_ignored_errors=0",
            "connections_with_failover_max_tries=2",
            "connect_timeout_with_failover_ms=100",
            "failover_backoff_ms=0",
            "failover_timeout=3",
            "auto_insert_deduplication_token=false",
        ]
    )
    got = args(f"clickhousedb+lb://u@ch-1:8123/db?{ours}")
    options = got.config.client_options
    handed_on = set(options) | set(options.get("settings") or {})
    assert not handed_on & (set(BALANCING_SETTING_NAMES) | set(DIALECT_PARAMETERS))
    assert set(options) == {"username", "database"}


def test_client_options_and_server_settings_are_split_like_clickhouse_connect() -> None:
    got = args(
        "clickhousedb+lb://u@ch-1/db?compress=false&send_receive_timeout=30&max_execution_time=5"
        "&ch_load_balancing=nearest_hostname&ch_priority=3&connect_timeout_with_failover_secure_ms=200"
    )
    options = got.config.client_options
    assert options["compress"] is False  # checked at create_engine, typed as the client wants
    assert "send_receive_timeout" not in options  # the pool's: it gives each client the exact value
    assert got.config.attempts.timeouts.receive == 30.0
    assert options["settings"] == {
        "max_execution_time": "5",
        # ch_ sends a name the dialect owns to the server (its own load_balancing, query priority)
        "load_balancing": "nearest_hostname",
        "priority": "3",
        "connect_timeout_with_failover_secure_ms": "200",
    }
    assert got.config.settings.load_balancing is LoadBalancing.RANDOM  # ch_load_balancing is not ours


def test_compression_is_clickhouse_connects_url_spelling_of_compress() -> None:
    assert args("clickhousedb+lb://u@ch-1/db?compression=zstd").config.client_options["compress"] == "zstd"


@pytest.mark.parametrize(
    ("query", "expected"), [("", True), ("?autogenerate_session_id=false", False), ("?autogenerate_session_id=1", True)]
)
def test_one_session_per_connection_unless_turned_off(query: str, expected: bool) -> None:
    got = args(f"clickhousedb+lb://u@ch-1/db{query}")
    assert got.session is expected
    assert "autogenerate_session_id" not in got.config.client_options


def test_connect_args_merge_into_the_url() -> None:
    got = args("clickhousedb+lb://u@ch-1,ch-2/db?load_balancing=in_order&max_threads=2")
    merged = got.with_connect_args(
        {
            "distributed_replica_error_cap": 7,
            "send_receive_timeout": 10,
            "settings": {"readonly": 1},
            "autogenerate_session_id": False,
        }
    )
    assert merged.config.settings.load_balancing is LoadBalancing.IN_ORDER
    assert merged.config.settings.distributed_replica_error_cap == 7
    assert merged.config.attempts.timeouts.receive == 10.0
    assert merged.config.client_options["settings"] == {"max_threads": "2", "readonly": 1}
    assert merged.session is False
    assert got.with_connect_args({}) is got


def test_engine_args_from_a_url_object() -> None:
    got = engine_args_from_url(make_url("clickhousedb+lb://u@ch-1/db"), default_session=False)
    assert got.session is False


# -- errors at create_engine -----------------------------------------------------------------


def raises_at_create_engine(url: str, **kwargs: Any) -> str:
    with pytest.raises(ConfigurationError) as info:
        create_engine(url, **kwargs)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_no_host() -> None:
    message = raises_at_create_engine("clickhousedb+lb://user:secret@/db")
    assert "No hosts" in message
    assert "host=ch-1:8123" in message
    assert "secret" not in message


def test_port_without_host() -> None:
    assert "no host" in raises_at_create_engine("clickhousedb+lb://u@:8123/db")


@pytest.mark.parametrize(
    ("url", "bad"),
    [
        ("clickhousedb+lb://u@/db?host=ch-1:80x", "'80x'"),
        ("clickhousedb+lb://u@/db?host=ch-1:0", "0"),
        ("clickhousedb+lb://u@ch-1:70000/db", "70000"),
        ("clickhousedb+lb://u@ch-1/db?alt_hosts=ch-2:-1", "'-1'"),
    ],
)
def test_bad_port(url: str, bad: str) -> None:
    message = raises_at_create_engine(url)
    assert "port" in message
    assert bad in message
    assert "1..65535" in message


def test_unknown_strategy_lists_the_valid_ones() -> None:
    message = raises_at_create_engine("clickhousedb+lb://u@ch-1,ch-2/db?load_balancing=fastest")
    assert "'fastest'" in message
    for strategy in LoadBalancing:
        assert strategy.value in message


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("load_balancng", "load_balancing"),
        ("distributed_replica_error_halflife", "distributed_replica_error_half_life"),
        ("connections_with_failover_max_retries", "connections_with_failover_max_tries"),
        ("load_balancing_offset", "load_balancing_first_offset"),
        ("alt_host", "alt_hosts"),
    ],
)
def test_unknown_balancing_parameter(name: str, suggestion: str) -> None:
    message = raises_at_create_engine(f"clickhousedb+lb://u@ch-1/db?{name}=1")
    assert repr(name) in message
    assert suggestion in message
    assert f"ch_{name}" in message  # how to send it to the server instead


def test_bad_balancing_value() -> None:
    message = raises_at_create_engine("clickhousedb+lb://u@ch-1/db?connections_with_failover_max_tries=many")
    assert "'many'" in message


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("host=ch-1&priority=x", "Bad priority 'x': expected an integer -2^63..2^63-1"),
        ("host=ch-1,ch-2&priority=0,x", "Bad priority 'x' in priority='0,x': expected an integer -2^63..2^63-1"),
    ],
)
def test_a_bad_priority_is_said_once(query: str, message: str) -> None:
    assert raises_at_create_engine(f"clickhousedb+lb://u@/db?{query}").startswith(message)


def test_priority_count_must_match_the_hosts() -> None:
    assert "one per host" in raises_at_create_engine("clickhousedb+lb://u@a,b,c/db?priority=0,1")
    assert "'x'" in raises_at_create_engine("clickhousedb+lb://u@a,b/db?priority=0,x")


def test_duplicate_replica() -> None:
    assert "Duplicate replica" in raises_at_create_engine("clickhousedb+lb://u@ch-1:8123/db?host=ch-1:8123")


def test_a_parameter_given_twice() -> None:
    assert "2 times" in raises_at_create_engine(
        "clickhousedb+lb://u@ch-1/db?load_balancing=random&load_balancing=in_order"
    )


def test_session_id_is_refused_with_the_reason() -> None:
    assert "own ClickHouse session" in raises_at_create_engine("clickhousedb+lb://u@ch-1/db?session_id=abc")


def test_pool_mgr_in_a_url_is_refused_at_create_engine_with_the_reason() -> None:
    """A URL carries a string, never the PoolManager object pool_mgr takes: it failed at the first
    connect with AttributeError ('str' object has no attribute 'clear')."""
    message = raises_at_create_engine("clickhousedb+lb://u@ch-1/db?pool_mgr=x")
    assert "Bad pool_mgr 'x'" in message
    assert "connect_args={'pool_mgr'" in message
    with pytest.raises(ConfigurationError, match="Bad pool_mgr 'x'"):
        clickhouse_lb.get_pool(dsn="clickhouse://ch-1:8123/db?pool_mgr=x", connect_on_create=False)


def test_pool_mgr_in_connect_args_is_still_taken() -> None:
    manager = urllib3.PoolManager()
    merged = args("clickhousedb+lb://u@ch-1/db").with_connect_args({"pool_mgr": manager})
    assert merged.config.client_options["pool_mgr"] is manager


def test_bad_boolean() -> None:
    assert "'maybe'" in raises_at_create_engine("clickhousedb+lb://u@ch-1/db?secure=maybe")


def test_password_never_shown() -> None:
    got = args("clickhousedb+lb://u:topsecret@ch-1/db")
    assert "topsecret" not in repr(got)
    assert "topsecret" not in repr(create_engine("clickhousedb+lb://u:topsecret@ch-1/db"))


def test_hung_replica_settings_come_from_the_url() -> None:
    got = args(
        "clickhousedb+lb://u@ch-1,ch-2/db?use_hedged_requests=1&receive_data_timeout_ms=auto"
        "&liveness_check_after_ms=100&receive_timeout=0.5&failover_timeout=2.5"
    )
    attempts = got.config.attempts
    assert attempts.hedging.enabled
    assert attempts.hedging.delay is None  # auto
    assert attempts.liveness.check_after == 0.1
    assert attempts.timeouts.receive == 0.5
    assert got.config.settings.failover_timeout == 2.5
    assert "receive_timeout" not in (got.config.client_options.get("settings") or {})  # not a server setting


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("load_balancing=round_robbin", r"Unknown load_balancing 'round_robbin' \(did you mean 'round_robin'\?\)"),
        ("secure=flase", r"Bad secure 'flase' \(did you mean 'false'\?\): expected true or false"),
        ("interface=htps", r"Bad interface 'htps' \(did you mean 'https' or 'http'\?\): expected http or https"),
    ],
)
def test_misspelt_values_get_a_did_you_mean(query: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        create_engine(f"clickhousedb+lb://u@ch-1,ch-2:8123/db?{query}")


def test_per_host_ports_in_the_authority_fail_in_sqlalchemy_as_documented() -> None:
    """SQLAlchemy parses the URL before any dialect is loaded, so the dialect cannot replace
    this error; docs/sqlalchemy.md quotes it and gives the host= form, which works."""
    with pytest.raises(ValueError, match=r"invalid literal for int\(\) with base 10: '8123,ch-2:9123'"):
        create_engine("clickhousedb+lb://u@ch-1:8123,ch-2:9123/db")
    assert addresses(args("clickhousedb+lb://u@/db?host=ch-1:8123&host=ch-2:9123")) == ["ch-1:8123", "ch-2:9123"]
