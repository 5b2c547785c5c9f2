"""The strategy priority functions, against ClickHouse's definitions."""

from __future__ import annotations

import pytest

from clickhouse_lb.config.settings import LoadBalancing
from clickhouse_lb.core.strategies import (
    common_prefix_length,
    common_suffix_length,
    default_local_hostname,
    hostname_differences,
    hostname_scores,
    levenshtein_distance,
    strategy_priorities,
)


@pytest.mark.parametrize(
    ("local", "host", "expected"),
    [
        ("example01-01-1", "example01-01-2", 1),
        ("example01-01-1", "example01-02-2", 2),
        ("ch-1", "ch-1.dc1.example.com", 0),  # the longer name's tail is ignored
        ("NODE-1", "node-1", 4),  # case-sensitive
        ("", "anything", 0),
    ],
)
def test_nearest_hostname_counts_differing_positions(local: str, host: str, expected: int) -> None:
    assert hostname_differences(local, host) == expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("example-clickhouse-0-0", "ample-clickhouse-0-0", 2),  # the docs say 1
        ("example-clickhouse-0-0", "example-clickhouse-1-10", 2),  # the docs say 2
        ("example-clickhouse-0-0", "example-clickhouse-12-0", 2),  # the docs say 3
        ("CH-Node-01", "ch-node-01", 0),  # ASCII case-insensitive
        ("kitten", "sitting", 3),
        ("", "abc", 3),
        ("abc", "", 3),
    ],
)
def test_levenshtein_is_the_real_edit_distance(a: str, b: str, expected: int) -> None:
    assert levenshtein_distance(a, b) == expected
    assert levenshtein_distance(b, a) == expected


def test_common_prefix_and_suffix() -> None:
    assert common_prefix_length("sfe301", "sfe10101") == 3
    assert common_prefix_length("DC1-ch-01", "dc1-ch-02") == 0
    assert common_suffix_length("et46gtghn.qc.localdomain", "ab999.qc.localdomain") == 15
    assert common_suffix_length("et46gtghn.qc.localdomain", "tr676ddgh.td.localdomain") == 12


def test_hostname_scores_are_lower_for_closer_names() -> None:
    hosts = ["sde301", "sfe10101", "sde505"]
    assert hostname_scores(LoadBalancing.HOSTNAME_LONGEST_COMMON_PREFIX, "sfe301", hosts) == [-1, -3, -1]
    assert hostname_scores(LoadBalancing.RANDOM, "sfe301", hosts) == [0, 0, 0]


def test_static_strategy_priorities() -> None:
    assert strategy_priorities(LoadBalancing.IN_ORDER, 3) == [0, 1, 2]
    assert strategy_priorities(LoadBalancing.FIRST_OR_RANDOM, 3, first_offset=4) == [1, 0, 1]
    assert strategy_priorities(LoadBalancing.FIRST_OR_RANDOM, 3, first_offset=-1) == [1, 1, 0]
    assert strategy_priorities(LoadBalancing.RANDOM, 2) == [0, 0]
    assert strategy_priorities(LoadBalancing.ROUND_ROBIN, 2) == [0, 0]
    with pytest.raises(ValueError, match="hostname score"):
        strategy_priorities(LoadBalancing.NEAREST_HOSTNAME, 2)


def test_default_local_hostname_is_a_name() -> None:
    name = default_local_hostname()
    assert isinstance(name, str)
    assert name
