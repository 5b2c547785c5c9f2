"""``cluster_host_map`` without a cluster: parsing (mapping and text forms, clear errors),
which discovered replicas it maps, and that get_pool, DSNs and engine URLs accept it."""

from __future__ import annotations

import pytest

from clickhouse_lb import ConfigurationError
from clickhouse_lb.config.discovery import HostMapping, map_address, parse_discovery_settings, parse_host_map
from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.core.discovery import ClusterRow, replicas_from_rows

ROWS = [ClusterRow(1, n, f"ch-{n}", f"172.18.0.{n + 1}", 9000) for n in (1, 2, 3)]


def test_the_mapping_and_the_text_form_are_the_same() -> None:
    mapping = parse_host_map({"ch-1:8123": "127.0.0.1:8123", "CH-2": "127.0.0.12"})
    text = parse_host_map("ch-1:8123=127.0.0.1:8123, CH-2=127.0.0.12")
    assert mapping == text == (
        HostMapping("ch-1", 8123, "127.0.0.1", 8123),
        HostMapping("ch-2", None, "127.0.0.12", None),
    )
    assert parse_host_map(None) == parse_host_map("") == parse_host_map({}) == ()


def test_discovered_replicas_go_by_their_mapped_address() -> None:
    host_map = parse_host_map({"ch-1:8123": "127.0.0.1:8123", "ch-2:8123": "127.0.0.1:8124", "ch-3": "localhost"})
    replicas = replicas_from_rows(ROWS, cluster="lb_cluster", host_map=host_map)
    assert [r.address for r in replicas] == ["127.0.0.1:8123", "127.0.0.1:8124", "localhost:8123"]
    # The key is the HTTP port after the port rule, not the native port system.clusters lists.
    assert replicas_from_rows(ROWS, cluster="lb_cluster", host_map=parse_host_map("ch-1:9000=x:1"))[0].address == (
        "ch-1:8123"
    )
    assert [r.address for r in replicas_from_rows(ROWS, cluster="lb_cluster")] == ["ch-1:8123", "ch-2:8123",
                                                                                    "ch-3:8123"]


def test_an_exact_entry_wins_over_a_host_entry() -> None:
    host_map = parse_host_map("ch-1=a,ch-1:8124=b:9")
    assert map_address(host_map, "CH-1", 8124) == ("b", 9)
    assert map_address(host_map, "ch-1", 8123) == ("a", 8123)
    assert map_address(host_map, "ch-9", 8123) == ("ch-9", 8123)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ch-1:8123", r"'ch-1:8123' has no '='"),
        ({"ch-1": 8123}, r"reachable 8123 is not a host"),
        ({"ch-1:99999": "a"}, r"listed 'ch-1:99999'.*expected 1\.\.65535"),
        ("a=b,A=c", r"'A' is mapped twice"),
        (["ch-1", "a"], r"expected a mapping \{'ch-1:8123': '127\.0\.0\.1:8123', \.\.\.\}"),
        ({"user:pw@ch-1": "a"}, r"a host is 'host:port'"),
    ],
)
def test_bad_maps_name_the_bad_part_and_the_forms(value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        parse_discovery_settings({"cluster": "lb_cluster", "cluster_host_map": value})
    assert str(caught.value).startswith("Bad cluster_host_map")
    assert "pw@" not in str(caught.value)


def test_the_map_needs_a_cluster() -> None:
    with pytest.raises(ConfigurationError, match="cluster_host_map given without cluster="):
        parse_discovery_settings({"cluster_host_map": "a=b"})


def test_get_pool_keyword_and_dsn_parameter_are_accepted() -> None:
    names = sync_client_option_names()
    by_keyword = resolve_pool_config(
        ["seed:8123"], dsn=None, balancing={},
        client_options={"cluster": "lb_cluster", "cluster_host_map": {"ch-1:8123": "127.0.0.1:8123"}},
        valid_client_options=names,
    )
    by_dsn = resolve_pool_config(
        None, dsn="clickhouse://seed:8123/db?cluster=lb_cluster&cluster_host_map=ch-1:8123%3D127.0.0.1:8123",
        balancing={}, client_options={}, valid_client_options=names,
    )
    expected = (HostMapping("ch-1", 8123, "127.0.0.1", 8123),)
    assert by_keyword.discovery.cluster_host_map == by_dsn.discovery.cluster_host_map == expected
    assert "cluster_host_map" not in by_dsn.client_options


def test_an_engine_url_takes_it() -> None:
    from sqlalchemy.engine import make_url

    from clickhouse_lb.sqlalchemy.url import engine_args_from_url

    url = make_url("clickhousedb+lb://u@seed:8123/db?cluster=lb_cluster&cluster_host_map=ch-1:8123=127.0.0.1:8123")
    config = engine_args_from_url(url).config
    assert config.discovery.cluster_host_map == (HostMapping("ch-1", 8123, "127.0.0.1", 8123),)
