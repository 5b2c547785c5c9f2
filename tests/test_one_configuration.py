"""One configuration (issue 23): resolved once, each setting stored once, derived values
computed from an input that is never stripped; TLS decided in one place; one keyword list for
both factories; a statement's bad ``settings=`` and internationalised hosts."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

import clickhouse_lb
from clickhouse_lb import ConfigurationError, Replica
from clickhouse_lb.config.pool_config import POOL_SETTING_NAMES, resolve_pool_config, sync_client_option_names
from clickhouse_lb.config.tls import uses_tls
from clickhouse_lb.pools._factory_arguments import FACTORY_OWN_NAMES, factory_arguments
from tests.fakes import FakeCluster, make_pool


def _config(hosts: list[str], **options: Any) -> Any:
    balancing = {name: options.pop(name) for name in list(options) if name in POOL_SETTING_NAMES}
    return resolve_pool_config(hosts, dsn=None, balancing=balancing, client_options=options,
                               valid_client_options=sync_client_option_names())


def test_a_re_derived_configuration_keeps_every_option_given() -> None:
    """What discovery does (replace the replicas): the timeouts were lost before, 300 s again."""
    seed = _config(["seed:8123"], send_receive_timeout=7, connect_timeout=4, compress=False,
                   liveness_check_after_ms=250, settings={"max_threads": 3})
    assert seed.attempts.timeouts.connect == 4.0  # one replica: its connect_timeout holds
    grown = dataclasses.replace(seed, replicas=[Replica("a"), Replica("b"), Replica("c")])
    assert (grown.attempts.timeouts.send, grown.attempts.timeouts.receive) == (7.0, 7.0)
    assert grown.attempts.timeouts.connect == 1.0  # more replicas: connect_timeout_with_failover_ms
    assert grown.attempts.liveness.check_after == 0.25
    assert grown.client_options == seed.client_options == {"compress": False, "settings": {"max_threads": 3}}
    back = dataclasses.replace(grown, replicas=[Replica("seed")])
    assert back.attempts == seed.attempts


def test_each_setting_is_stored_once_in_its_unit() -> None:
    config = _config(["a", "b"], liveness_ping_timeout_ms=300, receive_timeout="1.5")
    assert config.settings.liveness_ping_timeout_ms == 300.0  # stored: milliseconds, its name's unit
    assert config.attempts.liveness.ping_timeout == 0.3  # computed from it: seconds
    assert config.timeout_options == {"receive_timeout": 1.5}
    assert "receive_timeout" not in config.client_options  # not a clickhouse-connect option
    with pytest.raises(ValueError, match="timeout_options"):
        dataclasses.replace(config, client_options={"send_receive_timeout": 3})


@pytest.mark.parametrize(
    ("options", "secure"),
    [
        ({}, False),
        ({"secure": True}, True),
        ({"secure": "true"}, True),
        ({"secure": "0"}, False),
        ({"interface": "HTTPS"}, True),
        ({"interface": "http", "secure": False}, False),
    ],
)
def test_tls_is_decided_in_one_place(options: dict[str, Any], secure: bool) -> None:
    assert uses_tls(options) is secure
    config = _config(["a"], **options)
    assert config.secure is secure
    assert config.replicas[0].port == (8443 if secure else 8123)  # the default port follows


def test_a_string_secure_false_keeps_the_http_port() -> None:
    """``bool("false")`` is True: the default port was decided from the raw string before."""
    assert _config(["a"], secure="false").replicas[0].port == 8123


def test_both_factories_share_one_keyword_list() -> None:
    sync = inspect.signature(clickhouse_lb.get_pool)
    aio = inspect.signature(clickhouse_lb.get_async_pool)
    assert sync.parameters == aio.parameters
    assert (sync.return_annotation, aio.return_annotation) == ("ReplicaPool", "AsyncReplicaPool")
    named = {name for name, p in sync.parameters.items() if p.kind is not p.VAR_KEYWORD}
    # Every keyword is one the factories hand on: a pool setting, or the factory's own.
    assert named == set(POOL_SETTING_NAMES) | set(FACTORY_OWN_NAMES)


def test_a_call_binds_to_the_keyword_list_with_its_defaults() -> None:
    given = factory_arguments(["a:8123"], {"load_balancing": "in_order", "username": "bob"})
    assert given.connect_on_create is True
    assert given.listeners == ()
    assert given.balancing["load_balancing"] == "in_order"
    assert given.balancing["failover_timeout"] is None  # not given: the DSN's value or the default
    assert given.client_options == {"username": "bob"}


@pytest.mark.parametrize("bad", [["a"], "max_threads=1", 3, ("a", 1)])
def test_a_statements_settings_that_are_not_a_mapping_are_a_clear_error(bad: object) -> None:
    pool = make_pool(FakeCluster("a", "b"))
    with pytest.raises(ConfigurationError, match=r"Bad settings .* for query\(\): expected a mapping"):
        pool.query("SELECT 1", settings=bad)
    with pytest.raises(ConfigurationError, match=r"for insert\(\): expected a mapping"):
        pool.insert("t", [[1]], column_names=["x"], settings=bad)


async def test_the_async_pool_refuses_such_settings_too() -> None:
    # Refused before any I/O: the hosts do not exist.
    pool = clickhouse_lb.get_async_pool(["nowhere-1:8123", "nowhere-2:8123"], connect_on_create=False)
    try:
        with pytest.raises(ConfigurationError, match=r"Bad settings \['a'\] for command\(\)"):
            await pool.command("SELECT 1", settings=["a"])
    finally:
        await pool.close()


def test_an_internationalised_host_name_is_idna_encoded_as_urllib3_does() -> None:
    pool = clickhouse_lb.get_pool(hosts=["bücher.example:8123", "BÜCHER.example.org"], connect_on_create=False)
    assert pool.addresses == ["xn--bcher-kva.example:8123", "xn--bcher-kva.example.org:8123"]
    assert Replica("bücher.example").host == "xn--bcher-kva.example"
    assert Replica("bücher.example") == Replica("xn--bcher-kva.example")


@pytest.mark.parametrize("host", ["ch\u200b-1", "bü cher.example", "ﬁ.example"])
def test_a_name_idna_refuses_is_still_a_clear_error(host: str) -> None:
    with pytest.raises(ConfigurationError, match=r"Bad replica host.*internationalised host name"):
        clickhouse_lb.get_pool(hosts=[host], connect_on_create=False)
