"""Lag-aware ordering (pure): stale replicas after the fresh ones, or skipped, as the server does.

In the pools: tests/test_lag_routing.py (delays handed in) and integration/test_health.py (real lag).
"""

from __future__ import annotations

import pytest

from clickhouse_lb.config.lag import LagSettings, parse_lag_settings, statement_lag_settings
from clickhouse_lb.core.lag import order_by_freshness
from clickhouse_lb.errors import AllReplicasStaleError, ConfigurationError

ADDRESSES = ["a:8123", "b:8123", "c:8123", "d:8123"]
DEFAULT = LagSettings()
NO_FALLBACK = LagSettings(fallback_to_stale_replicas_for_distributed_queries=False)


def test_server_defaults() -> None:
    assert LagSettings(300, True) == DEFAULT


def test_fresh_replicas_keep_the_plans_order_and_stale_ones_follow_least_stale_first() -> None:
    delays = [400.0, 0.0, 1000.0, None]  # None: not known, counts as fresh
    assert order_by_freshness([2, 0, 1, 3], delays, DEFAULT, ADDRESSES) == [1, 3, 0, 2]


def test_a_delay_equal_to_the_limit_is_stale_as_on_the_server() -> None:
    assert order_by_freshness([0, 1], [300.0, 299.0], DEFAULT, ADDRESSES) == [1, 0]


def test_stale_ties_keep_the_plans_order() -> None:
    assert order_by_freshness([2, 0, 1], [500.0, 0.0, 500.0], DEFAULT, ADDRESSES) == [1, 2, 0]


def test_without_fallback_stale_replicas_are_skipped() -> None:
    assert order_by_freshness([0, 1, 2], [400.0, 1.0, 2.0], NO_FALLBACK, ADDRESSES) == [1, 2]


def test_without_fallback_and_no_fresh_replica_the_error_names_every_delay_and_the_remedy() -> None:
    with pytest.raises(AllReplicasStaleError) as info:
        order_by_freshness([0, 1], [400.0, 301.0], NO_FALLBACK, ADDRESSES)
    message = str(info.value)
    assert "a:8123: 400 s" in message
    assert "b:8123: 301 s" in message
    assert "max_replica_delay_for_distributed_queries=300" in message
    assert "fallback_to_stale_replicas_for_distributed_queries=1" in message
    assert info.value.code == 369  # ALL_REPLICAS_ARE_STALE


def test_zero_turns_the_check_off() -> None:
    off = LagSettings(0, fallback_to_stale_replicas_for_distributed_queries=False)
    assert order_by_freshness([0, 1], [10_000.0, 5.0], off, ADDRESSES) == [0, 1]


def test_a_statements_settings_win_over_the_pools() -> None:
    pool = LagSettings(60, True)
    assert statement_lag_settings(None, pool) is pool
    assert statement_lag_settings({"max_threads": 2}, pool) is pool
    own = statement_lag_settings({"fallback_to_stale_replicas_for_distributed_queries": "0"}, pool)
    assert own == LagSettings(60, False)
    assert statement_lag_settings({"max_replica_delay_for_distributed_queries": 5}, pool) == LagSettings(5, True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_replica_delay_for_distributed_queries": -1}, r"expected 0\.\.1000000000 seconds \(0: not checked\)"),
        ({"max_replica_delay_for_distributed_queries": "soon"}, "expected an integer"),
        ({"fallback_to_stale_replicas_for_distributed_queries": "maybe"}, "expected true or false"),
    ],
)
def test_bad_values_are_named(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_lag_settings(values)
