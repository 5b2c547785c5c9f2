"""Discovery settings: keywords, DSN and SQLAlchemy URL parameters, validation."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from clickhouse_lb.config.discovery import DiscoverySettings, parse_discovery_settings
from clickhouse_lb.config.pool_config import resolve_pool_config, sync_client_option_names
from clickhouse_lb.errors import ConfigurationError
from clickhouse_lb.sqlalchemy import engine_args_from_url


def _config(hosts: object = None, dsn: str | None = None, **balancing: object):  # type: ignore[no-untyped-def]
    return resolve_pool_config(
        hosts,  # type: ignore[arg-type]
        dsn=dsn,
        balancing=balancing,
        client_options={},
        valid_client_options=sync_client_option_names(),
    )


def test_defaults_are_off() -> None:
    settings = _config(["ch-1"]).discovery
    assert not settings.enabled
    assert settings == DiscoverySettings()


def test_keywords() -> None:
    config = _config(["ch-1"], cluster="c", shard=2, cluster_http_port=8124, cluster_discovery_interval_ms=0)
    settings = config.discovery
    assert settings == DiscoverySettings("c", 2, 8124, 0)
    assert settings.interval is None


def test_dsn_parameters() -> None:
    config = _config(dsn="clickhouse://ch-1:8123,ch-2:8123/db?cluster=lb&shard=1&cluster_discovery_interval_ms=500")
    assert config.discovery == DiscoverySettings("lb", 1, None, 500)
    assert config.discovery.interval == 0.5
    assert "cluster" not in (config.client_options.get("settings") or {})


def test_sqlalchemy_url_parameters() -> None:
    args = engine_args_from_url(make_url("clickhousedb+lb://u@ch-1,ch-2/db?cluster=lb&cluster_http_port=8123"))
    assert args.config.discovery == DiscoverySettings("lb", None, 8123)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"cluster": ""}, "Bad cluster ''"),
        ({"shard": 1}, "shard given without cluster="),
        ({"cluster": "c", "shard": 0}, r"Bad shard 0: expected 1\.\.4294967295 \(a shard_num of system\.clusters\)"),
        ({"cluster": "c", "shard": "x"}, "Bad shard 'x'"),
        ({"cluster": "c", "cluster_http_port": -1}, "Bad cluster_http_port -1"),
        ({"cluster": "c", "cluster_discovery_interval_ms": -5}, "Bad cluster_discovery_interval_ms -5"),
    ],
)
def test_bad_values_name_the_value(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_discovery_settings(values)
