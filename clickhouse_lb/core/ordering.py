"""The order in which one statement tries the replicas (pure functions).

ClickHouse sorts replicas ascending by ``(errors - max_ignored_errors floored at 0,
configured priority, strategy priority, random)``; hedged reads put ``slowdowns`` right
after the errors. The random term is drawn fresh per replica per selection, so exact ties
come out as a uniformly random permutation.

Speed matters (this runs once per statement): the static part of the key, ``(priority,
strategy priority)``, is reduced once per pool to a dense rank, and each selection builds one
float per replica: ``effective_errors * n + rank + random()``. Ranks are integers below n and
the random term lies in [0, 1), so the float orders exactly like the tuple.

``round_robin`` is not a sort key: see :func:`round_robin_order`.
"""

from __future__ import annotations

import itertools
import math
import random as _random
from collections.abc import Callable, Sequence

__all__ = [
    "MAX_LISTED_ORDERS", "least_loaded_order", "plan_order", "rank_order", "rank_orders", "round_robin_order",
    "round_robin_rotations", "static_ranks",
]


def static_ranks(priorities: Sequence[int], strategy_priorities: Sequence[int]) -> list[int]:
    """Dense rank of ``(priority, strategy_priority)`` per replica (equal pairs, equal rank)."""
    pairs = list(zip(priorities, strategy_priorities))
    rank_of = {pair: rank for rank, pair in enumerate(sorted(set(pairs)))}
    return [rank_of[pair] for pair in pairs]


#: A healthy set's possible orders are listed once (and one drawn per statement) when they are
#: at most this many: 5 replicas of one rank (120 orders), or any grouping with as few orders.
MAX_LISTED_ORDERS = 120


def rank_orders(ranks: Sequence[int]) -> list[list[int]] | None:
    """Every order :func:`rank_order` can give for ``ranks``: the replicas by rank, each group of
    equal ranks in each of its permutations (one order when no two ranks are equal: ``in_order``,
    ``first_or_random`` over distinct priorities ...), in lexicographic order; None when there
    are more than :data:`MAX_LISTED_ORDERS`. While no replica has errors or slowdowns,
    :func:`plan_order` gives each of them with the same probability, so drawing one of this list
    uniformly is the plan of a healthy replica set: one draw, where a sort needs one per replica."""
    groups: dict[int, list[int]] = {}
    for index, rank in enumerate(ranks):
        groups.setdefault(rank, []).append(index)
    ordered = [groups[rank] for rank in sorted(groups)]
    count = 1
    for group in ordered:
        count *= math.factorial(len(group))
        if count > MAX_LISTED_ORDERS:
            return None
    return [[index for part in parts for index in part]
            for parts in itertools.product(*(itertools.permutations(group) for group in ordered))]


def rank_order(ranks: Sequence[int], random: Callable[[], float] = _random.random) -> list[int]:
    """The order while no replica has an error or a slowdown: by rank, ties at random (a
    uniformly random permutation of each group of equal ranks)."""
    keys = [r + random() for r in ranks]
    return sorted(range(len(keys)), key=keys.__getitem__)


def plan_order(
    errors: Sequence[int],
    ranks: Sequence[int],
    max_ignored_errors: int = 0,
    random: Callable[[], float] = _random.random,
    slowdowns: Sequence[int] | None = None,
) -> list[int]:
    """Replica indices in the order to try them. ``slowdowns`` given: the hedged-read order."""
    n = len(errors)
    if slowdowns is not None:
        hedged_keys = [
            (max(0, errors[i] - max_ignored_errors), slowdowns[i], ranks[i], random()) for i in range(n)
        ]
        return sorted(range(n), key=hedged_keys.__getitem__)
    if not any(errors):
        return rank_order(ranks, random)
    if max_ignored_errors:
        keys = [
            (e - max_ignored_errors if e > max_ignored_errors else 0) * n + r + random()
            for e, r in zip(errors, ranks)
        ]
    else:
        keys = [e * n + r + random() for e, r in zip(errors, ranks)]
    return sorted(range(n), key=keys.__getitem__)


def round_robin_order(
    errors: Sequence[int],
    priority_ranks: Sequence[int],
    max_ignored_errors: int,
    counter: int,
) -> list[int]:
    """``round_robin`` as the documentation promises (not as the server does it).

    The replicas sharing the best ``(effective errors, priority)`` rank take turns: the k of
    them are rotated by ``counter mod k``, so each gets exactly 1/k of the statements. The
    others follow as failover candidates, by rank, in the rotation order of all n positions.
    ``priority_ranks``: the dense rank of each replica's configured priority (see
    :func:`static_ranks`), so that one integer per replica orders like the tuple.
    """
    n = len(errors)
    group = [
        (e - max_ignored_errors if e > max_ignored_errors else 0) * n + p for e, p in zip(errors, priority_ranks)
    ]
    best = min(group)
    leaders = [i for i, key in enumerate(group) if key == best]
    k = len(leaders)
    start = counter % k
    head = leaders[start:] + leaders[:start]
    if k == n:
        return head
    shift = counter % n
    rest = sorted((i for i in range(n) if group[i] != best), key=lambda i: group[i] * n + (i - shift) % n)
    return head + rest


def round_robin_rotations(priority_ranks: Sequence[int]) -> list[list[int]] | None:
    """:func:`round_robin_order` with every count zero, for counter 0, 1, ...: it depends on the
    counter only through ``counter mod k`` (the k replicas of the best priority) and ``counter
    mod n``, so the orders repeat every ``lcm(k, n)`` steps (n, when the priorities are equal),
    and ``orders[counter % len(orders)]`` is the order for any counter. None when more than
    :data:`MAX_LISTED_ORDERS`."""
    n = len(priority_ranks)
    k = list(priority_ranks).count(min(priority_ranks))
    period = math.lcm(k, n)
    if period > MAX_LISTED_ORDERS:
        return None
    zeros = [0] * n
    return [round_robin_order(zeros, priority_ranks, 0, counter) for counter in range(period)]


def least_loaded_order(
    errors: Sequence[int],
    priority_ranks: Sequence[int],
    max_ignored_errors: int,
    scores: Sequence[float],
    random: Callable[[], float] = _random.random,
) -> list[int]:
    """``least_loaded`` (an extension, not one of ClickHouse's strategies): power of two choices.

    Errors and configured priority come first, exactly as for the other strategies: only the
    replicas sharing the best ``(effective errors, priority)`` rank compete. Two of them are
    drawn at random and the one with the lower load ``scores`` entry goes first (an exact tie:
    the first drawn, itself random). The others follow as failover candidates: the rest of the
    best rank, then the other ranks, each by load score (ties in a rotation from a random start).
    ``priority_ranks``: as for :func:`round_robin_order`. ``scores``: the load scores, or any
    increasing function of them (the balancer passes logarithms, see
    :meth:`clickhouse_lb.core.load.ReplicaLoad.order_keys`).
    """
    n = len(errors)
    if n == 1:
        return [0]
    if any(errors) or any(priority_ranks):
        group = [
            (e - max_ignored_errors if e > max_ignored_errors else 0) * n + p for e, p in zip(errors, priority_ranks)
        ]
        best = min(group)
        leaders = [i for i, key in enumerate(group) if key == best]
    else:  # the usual case: every replica healthy, equal priorities
        group = None
        leaders = list(range(n))
    k = len(leaders)
    # One draw gives both choices: its integer part picks the first, its fraction the second.
    x = random() * k
    a = int(x)
    if k == 1:
        first = leaders[0]
    else:
        b = (a + 1 + int((x - a) * (k - 1))) % k  # a second, distinct replica
        first = leaders[a] if scores[leaders[a]] <= scores[leaders[b]] else leaders[b]
    # Failover candidates: a stable sort from a random starting point, so that equal scores
    # (an idle cold start) do not always fail over to the same replica first.
    rest = [*range(a, n), *range(a)]
    rest.remove(first)
    if group is None:
        rest.sort(key=scores.__getitem__)
    else:  # by group, then by score: two stable sorts on plain keys beat one on tuples
        rest.sort(key=scores.__getitem__)
        rest.sort(key=group.__getitem__)
    return [first, *rest]
