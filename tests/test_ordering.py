"""plan_order and round_robin_order as pure functions; round_robin evenness."""

from __future__ import annotations

import random
from collections import Counter

from clickhouse_lb.core.ordering import plan_order, round_robin_order, static_ranks


def test_static_ranks_are_dense() -> None:
    assert static_ranks([1, 1, 0], [5, 2, 9]) == [2, 1, 0]
    assert static_ranks([1, 1], [0, 0]) == [0, 0]


def test_errors_then_priority_then_strategy() -> None:
    ranks = static_ranks([0, 5, -10], [0, 1, 2])
    assert plan_order([0, 0, 1], ranks, 0, random.Random(1).random) == [0, 1, 2]
    assert plan_order([0, 0, 0], ranks, 0, random.Random(1).random) == [2, 0, 1]


def test_max_ignored_errors_floors_at_zero() -> None:
    ranks = [0, 1, 2]
    assert plan_order([5, 2, 0], ranks, 2, random.Random(1).random) == [1, 2, 0]


def test_ties_are_a_uniform_permutation() -> None:
    rnd = random.Random(5).random
    firsts = Counter(plan_order([0, 0, 0, 0], [0, 0, 0, 0], 0, rnd)[0] for _ in range(4000))
    assert all(850 <= firsts[i] <= 1150 for i in range(4)), firsts


def test_round_robin_rotates_among_the_best_rank_only() -> None:
    firsts = Counter(round_robin_order([0, 1, 0, 0], [0, 0, 0, 0], 0, c)[0] for c in range(300))
    assert firsts == {0: 100, 2: 100, 3: 100}


def test_round_robin_respects_priority_and_puts_the_rest_last() -> None:
    order = round_robin_order([0, 0, 3, 0], static_ranks([1, 1, 1, 2], [0] * 4), 0, 7)
    assert sorted(order[:2]) == [0, 1]
    assert order[2:] == [3, 2]  # priority 2 before 3 errors


def test_round_robin_max_ignored_errors() -> None:
    assert Counter(round_robin_order([1, 0], [0, 0], 1, c)[0] for c in range(10)) == {0: 5, 1: 5}
