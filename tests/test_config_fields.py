"""The settings records' shared parsing (config/_fields.py) and the CLI's shared argument types."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from clickhouse_lb.cli._arguments import int_between
from clickhouse_lb.config._fields import InSeconds, parse_fields
from clickhouse_lb.config._values import bounded_int
from clickhouse_lb.config.health import HealthSettings, parse_health_settings
from clickhouse_lb.errors import ConfigurationError


def _upper(name: str, value: object) -> object:
    return str(value).upper()


def test_each_given_value_goes_through_its_parser_and_none_keeps_the_default() -> None:
    parsed = parse_fields({"a": "x", "b": None, "other": 1}, {"a": _upper, "b": _upper})
    assert parsed == {"a": "X"}  # b: not given; other: someone else's setting


def test_none_is_parsed_where_none_means_something() -> None:
    assert parse_fields({"b": None}, {"b": _upper}, none_is_default=False) == {"b": "NONE"}


def test_an_unknown_name_is_refused_where_the_record_says_so() -> None:
    def unknown(name: str, valid: Iterable[str]) -> Exception:
        return ConfigurationError(f"unknown {name} among {sorted(valid)}")

    with pytest.raises(ConfigurationError, match=r"unknown c among \['a'\]"):
        parse_fields({"a": 1, "c": 2}, {"a": _upper}, unknown=unknown)


def test_values_are_checked_in_the_order_given() -> None:
    with pytest.raises(ConfigurationError, match="health_check_rise"):
        parse_health_settings({"health_check_rise": 0, "health_check_fall": 0})
    with pytest.raises(ConfigurationError, match="health_check_fall"):
        parse_health_settings({"health_check_fall": 0, "health_check_rise": 0})


def test_bounded_int_takes_strings_and_checks_the_bounds() -> None:
    assert bounded_int("health_check_rise", " 3 ") == 3
    with pytest.raises(ConfigurationError, match="health_check_rise"):
        bounded_int("health_check_rise", 0)


@dataclass(frozen=True)
class _Record:
    window_ms: int = 1500
    window = InSeconds("window_ms")


def test_a_millisecond_field_reads_as_seconds_and_is_stored_once() -> None:
    assert _Record().window == 1.5
    assert _Record(window_ms=250).window == 0.25
    assert isinstance(_Record.window, InSeconds)  # on the class: the descriptor (documentation tools)
    assert HealthSettings(health_check_timeout_ms=750).timeout == 0.75


def test_int_between_names_the_value_only_where_the_message_asks() -> None:
    parse = int_between(1, 3, "expected 1 to 3, not {value}")
    assert parse("2") == 2
    with pytest.raises(argparse.ArgumentTypeError, match="expected 1 to 3, not 4"):
        parse("4")
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer, not 'x'"):
        parse("x")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^the demo needs more$"):
        int_between(2, 9, "the demo needs more")("1")
