"""ClickHouse's strategy priorities as pure functions (src/Common/GetPriorityForLoadBalancing.cpp).

Lower is preferred. Nothing here reads a clock, draws a random number or resolves a name:
randomness and the round-robin counter belong to :mod:`clickhouse_lb.core.ordering`, and the
local host name is passed in. The hostname scores depend only on names, so a pool computes
them once per strategy, never per statement.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Sequence

from clickhouse_lb.config.settings import LoadBalancing

__all__ = [
    "common_prefix_length",
    "common_suffix_length",
    "default_local_hostname",
    "hostname_differences",
    "hostname_scores",
    "levenshtein_distance",
    "strategy_priorities",
]


def hostname_differences(local: str, host: str) -> int:
    """``nearest_hostname``: positions k < min(len) where the characters differ
    (case-sensitive; the longer name's tail is ignored)."""
    return sum(1 for a, b in zip(local, host) if a != b)


def levenshtein_distance(local: str, host: str) -> int:
    """``hostname_levenshtein_distance``: edit distance of the whole names, ASCII case-insensitive."""
    a = local.encode().lower()
    b = host.encode().lower()
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def common_prefix_length(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def common_suffix_length(a: str, b: str) -> int:
    return common_prefix_length(a[::-1], b[::-1])


def hostname_scores(strategy: LoadBalancing, local_hostname: str, hosts: Sequence[str]) -> list[int]:
    """Per-replica priority of a hostname strategy; all zeros for the others."""
    if strategy is LoadBalancing.NEAREST_HOSTNAME:
        return [hostname_differences(local_hostname, h) for h in hosts]
    if strategy is LoadBalancing.HOSTNAME_LEVENSHTEIN_DISTANCE:
        return [levenshtein_distance(local_hostname, h) for h in hosts]
    if strategy is LoadBalancing.HOSTNAME_LONGEST_COMMON_PREFIX:
        return [-common_prefix_length(local_hostname, h) for h in hosts]
    if strategy is LoadBalancing.HOSTNAME_LONGEST_COMMON_SUFFIX:
        return [-common_suffix_length(local_hostname, h) for h in hosts]
    return [0] * len(hosts)


def strategy_priorities(
    strategy: LoadBalancing,
    n: int,
    *,
    first_offset: int = 0,
    hostname_score: Sequence[int] | None = None,
) -> list[int]:
    """Priority of replica i (its position in the configured list) under ``strategy``.

    ``round_robin`` is not a static priority (it rotates per statement, see
    :func:`clickhouse_lb.core.ordering.round_robin_order`); like ``random`` it is 0 here.
    """
    if strategy is LoadBalancing.IN_ORDER:
        return list(range(n))
    if strategy is LoadBalancing.FIRST_OR_RANDOM:
        first = first_offset % n if n else 0
        return [0 if i == first else 1 for i in range(n)]
    if strategy.uses_hostnames:
        if hostname_score is None or len(hostname_score) != n:
            raise ValueError("hostname strategies need one hostname score per replica")
        return list(hostname_score)
    return [0] * n


@functools.cache
def default_local_hostname() -> str:
    """This machine's canonical name, as the server uses its FQDN: ``getaddrinfo(gethostname(),
    AI_CANONNAME)``, falling back to ``gethostname()`` when the lookup fails. Cached per process."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, flags=socket.AI_CANONNAME)
    except OSError:
        return name
    for info in infos:
        if info[3]:
            return info[3]
    return name
