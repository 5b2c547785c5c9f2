"""Parsing the attempt settings (timeouts, liveness, hedging), per pool and per statement."""

from __future__ import annotations

import pytest

from clickhouse_lb.config.attempt_settings import (
    derive_attempt_settings,
    normalize_attempt_setting,
    split_statement_attempt_settings,
)
from clickhouse_lb.config.hedging import HedgePolicy
from clickhouse_lb.config.liveness import LivenessPolicy
from clickhouse_lb.config.settings import parse_balancing_settings
from clickhouse_lb.config.timeouts import Timeouts, pool_timeouts
from clickhouse_lb.errors import ConfigurationError


def parse(values: dict[str, object], options: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    # As a pool of 3 replicas derives them: the settings stored once (ms), then computed.
    timeouts, rest = pool_timeouts(options or {}, connect_timeout_with_failover_ms=1000, replicas=3)
    return derive_attempt_settings(parse_balancing_settings(values), timeouts), rest


def test_defaults_check_liveness_and_do_not_hedge() -> None:
    settings, rest = parse({}, {"compress": True})
    assert settings.liveness == LivenessPolicy(check_after=0.1, ping_timeout=0.15, interval=1.0)
    assert settings.hedging == HedgePolicy(enabled=False, delay=None)
    assert settings.timeouts == Timeouts(connect=1.0, send=300.0, receive=300.0)
    assert rest == {"compress": True}


def test_names_and_units() -> None:
    settings, rest = parse(
        {"use_hedged_requests": "1", "receive_data_timeout_ms": 150, "liveness_check_after_ms": 0,
         "liveness_ping_timeout_ms": "100", "liveness_check_interval_ms": 500},
        {"send_receive_timeout": 0.5},
    )
    assert settings.hedging == HedgePolicy(enabled=True, delay=0.15)
    assert settings.liveness.check_after is None  # 0: off
    assert settings.liveness.ping_timeout == 0.1
    assert settings.liveness.interval == 0.5
    assert settings.timeouts.receive == 0.5
    assert rest == {}


def test_a_statement_changes_its_own_attempts_only() -> None:
    pool, _ = parse({})
    overrides, rest = split_statement_attempt_settings(
        {"use_hedged_requests": 1, "receive_data_timeout_ms": "auto", "receive_timeout": 2, "max_threads": 1}
    )
    assert rest == {"max_threads": 1}
    mine = overrides.apply(pool)
    assert mine.hedging == HedgePolicy(enabled=True, delay=None)
    assert mine.timeouts.receive == 2.0
    assert mine.timeouts.send == 300.0
    untouched = {"max_threads": 1}
    none, same = split_statement_attempt_settings(untouched)
    assert same is untouched
    assert none.apply(pool) is pool


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"use_hedged_requests": 2}, "use_hedged_requests 2: expected 0 or 1"),
        ({"receive_data_timeout_ms": "soon"}, "receive_data_timeout_ms 'soon'.*'auto'"),
        ({"liveness_ping_timeout_ms": -1}, "liveness_ping_timeout_ms -1"),
        ({"hedge": 1}, "Unknown balancing setting 'hedge'.*configuration reference"),
    ],
)
def test_bad_values_name_the_value_and_the_choices(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse(values)


def test_values_are_normalized_where_every_setting_is_validated() -> None:
    assert normalize_attempt_setting("use_hedged_requests", "true") is True
    assert normalize_attempt_setting("receive_data_timeout_ms", "Auto") == "auto"
    assert normalize_attempt_setting("receive_data_timeout_ms", "150") == pytest.approx(150.0)
    assert normalize_attempt_setting("liveness_check_after_ms", "0") == 0.0
    with pytest.raises(ConfigurationError, match="liveness_check_interval_ms 'x'"):
        normalize_attempt_setting("liveness_check_interval_ms", "x")


def test_the_pools_defaults_are_the_policys() -> None:
    """One source of truth: a pool built with no liveness keyword gets LivenessPolicy's defaults."""
    import clickhouse_lb

    pool = clickhouse_lb.get_pool(["a:8123", "b:8123"], connect_on_create=False)
    assert pool.config.attempts.liveness == LivenessPolicy()
