"""Regenerate the expected outputs of ``ordering.jsonl`` from a reference implementation of
ClickHouse's load balancing, written from ClickHouse's source (and from nothing in
``clickhouse_lb``, so that the library is checked against an independent reading).

    python tests/golden/generate.py          # rewrite the expected fields in place
    python tests/golden/generate.py --check  # exit 1 when a committed vector differs

Each case's inputs (strategy, replicas with their errors/slowdowns/priorities, offsets, times,
outcomes) are kept; its outputs are recomputed: ``expected`` or ``order_groups``,
``expected_errors_after_decay``, ``expected_non_hedged``, ``expected_errors_after_each_call``,
``expected_errors_count``/``expected_estimated_recovery_time``, ``attempts``/``error_increments``.

Sources (ClickHouse/ClickHouse on GitHub):

- ``src/Common/PoolWithFailoverBase.h`` at 008c1f9173d8428eae4c00830fbb20015281dd53:
  ``PoolState::compare`` (the sort key ``(error_count, [slowdown_count,] config_priority,
  priority, random)``), ``updatePoolStates`` (``distributed_replica_max_ignored_errors``
  subtracted with a floor at 0), ``updateErrorCounts`` (the lazy decay: one right shift per
  whole period elapsed, the clock moved only when something shifted, 64 shifts or more clear),
  ``getMany`` (the failover passes: each replica at most ``max_tries`` times, in sorted order).
- ``src/Common/GetPriorityForLoadBalancing.cpp`` at 1669377d423f029e2ba390a2381dec91a0873ace:
  ``nearest_hostname``, ``hostname_levenshtein_distance``, ``in_order``, ``random``,
  ``first_or_random`` priorities. ``hostname_longest_common_prefix``/``_suffix`` (the negated
  common length) are from a later revision of that file and of ``src/Common/isLocalAddress.cpp``
  (``getHostNamePrefixDistance``, ``getHostNameLevenshteinDistance`` = case-insensitive
  Levenshtein, ``getHostNameLongestCommonPrefix``/``Suffix``, case-sensitive) whose commit the
  code index we read did not attribute.
- ``src/Client/ConnectionPoolWithFailover.cpp`` at b91317059d668efe12fc19f87f4137565009e489:
  ``getStatus`` (``system.clusters``: counts decayed to now; ``estimated_recovery_time`` =
  ``max(bits(errors), bits(slowdowns)) * period - seconds since the last decrease``, at least 0,
  on the stored counts) and ``load_balancing_first_offset % pool size``.

``round_robin`` is left out on purpose: the library does what the documentation promises, not
what the server does (see ``docs/differences.md``, item 4).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

VECTORS = Path(__file__).with_name("ordering.jsonl")
MAX_BITS = 64  # UInt64 error counts
DEFAULT_MAX_TRIES = 3  # connections_with_failover_max_tries


# -- src/Common/isLocalAddress.cpp -------------------------------------------------------------


def prefix_distance(local: str, host: str) -> int:
    return sum(local[i] != host[i] for i in range(min(len(local), len(host))))


def levenshtein_case_insensitive(a: str, b: str) -> int:
    a, b = a.lower(), b.lower()
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        diagonal, row[0] = row[0], i
        for j in range(1, len(b) + 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1]))
    return row[len(b)]


def longest_common_prefix(local: str, host: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(local, host)) if x != y), min(len(local), len(host)))


def longest_common_suffix(local: str, host: str) -> int:
    return longest_common_prefix(local[::-1], host[::-1])


# -- src/Common/GetPriorityForLoadBalancing.cpp ------------------------------------------------


def priority_function(strategy: str, local: str, hosts: Sequence[str], offset: int) -> Callable[[int], int] | None:
    """``getPriorityFunc``: None for ``random`` (every priority stays 0)."""
    offset %= len(hosts)  # ConnectionPoolWithFailover: load_balancing_first_offset % pool size
    table: dict[str, Callable[[int], int] | None] = {
        "nearest_hostname": lambda i: prefix_distance(local, hosts[i]),
        "hostname_levenshtein_distance": lambda i: levenshtein_case_insensitive(local, hosts[i]),
        "hostname_longest_common_prefix": lambda i: -longest_common_prefix(local, hosts[i]),
        "hostname_longest_common_suffix": lambda i: -longest_common_suffix(local, hosts[i]),
        "in_order": lambda i: i,
        "random": None,
        "first_or_random": lambda i: 1 if i != offset else 0,
    }
    return table[strategy]


# -- src/Common/PoolWithFailoverBase.h ---------------------------------------------------------


def decay(counts: Sequence[int], elapsed: int, period: int) -> tuple[list[int], bool]:
    """``updateErrorCounts`` after ``elapsed`` seconds: the counts, and whether the clock moved."""
    if elapsed < 0:
        return list(counts), False
    shifts = elapsed // period if period else MAX_BITS
    if shifts >= MAX_BITS:
        return [0] * len(counts), True
    return [c >> shifts for c in counts], shifts > 0


def sort_keys(case: dict[str, Any], errors: Sequence[int], hedged: bool) -> list[tuple[int, ...]]:
    """``PoolState::compare`` without its random member, per replica."""
    replicas = case["replicas"]
    hosts = [r["host"] for r in replicas]
    priority = priority_function(case["strategy"], case["local_hostname"], hosts, case["first_offset"])
    ignored = case["max_ignored_errors"]
    keys = []
    for i, replica in enumerate(replicas):
        effective = errors[i] - ignored if errors[i] > ignored else 0
        strategy_priority = priority(i) if priority else 0
        slowdown = (replica.get("slowdowns", 0),) if hedged else ()
        keys.append((effective, *slowdown, replica["priority"], strategy_priority))
    return keys


def tie_groups(hosts: Sequence[str], keys: Sequence[tuple[int, ...]]) -> list[list[str]]:
    """Replicas by ascending key; equal keys share a group (the random member orders them)."""
    order = sorted(range(len(hosts)), key=lambda i: (keys[i], i))
    return [[hosts[i] for i in group] for _, group in itertools.groupby(order, key=lambda i: keys[i])]


def ordering(case: dict[str, Any]) -> dict[str, Any]:
    hosts = [r["host"] for r in case["replicas"]]
    errors = [r["errors"] for r in case["replicas"]]
    out: dict[str, Any] = {}
    if "half_life_s" in case:
        errors, _ = decay(errors, case.get("elapsed_since_last_decrease_s", 0), case["half_life_s"])
        out["expected_errors_after_decay"] = errors
    hedged = bool(case.get("hedged"))
    groups = tie_groups(hosts, sort_keys(case, errors, hedged))
    if all(len(g) == 1 for g in groups):
        out["expected"] = [g[0] for g in groups]
    else:
        out["order_groups"] = groups
    if hedged:
        plain = tie_groups(hosts, sort_keys(case, errors, hedged=False))
        out["expected_non_hedged"] = [g[0] for g in plain] if all(len(g) == 1 for g in plain) else plain
    return out


def decay_sequence(case: dict[str, Any]) -> dict[str, Any]:
    errors, last = [case["stored_errors_at_t0"]], case["last_decrease_at"]
    seen = []
    for now in case["selection_calls_at"]:
        errors, moved = decay(errors, now - last, case["half_life_s"])
        if moved:
            last = now
        seen.append(errors[0])
    return {"expected_errors_after_each_call": seen}


def system_clusters(case: dict[str, Any]) -> dict[str, Any]:
    """``ConnectionPoolWithFailover::getStatus``."""
    period, since = case["half_life_s"], case["seconds_since_last_decrease"]
    stored_errors, stored_slowdowns = case["stored_errors"], case["stored_slowdowns"]
    (errors,), _ = decay([stored_errors], since, period)
    rounds = max(stored_errors.bit_length(), stored_slowdowns.bit_length())
    return {"expected_errors_count": errors, "expected_estimated_recovery_time": max(0, rounds * period - since)}


def failover(case: dict[str, Any]) -> dict[str, Any]:
    """``getMany`` for one entry (``min_entries = max_entries = 1``) over replicas already sorted."""
    pools = case["sorted_order"]
    outcomes = {host: list(script) for host, script in case["outcomes"].items()}
    error_count = dict.fromkeys(pools, 0)
    attempts: list[str] = []
    entries = failed_pools = 0
    while True:
        for host in pools:
            if entries >= 1 or entries + failed_pools >= len(pools):
                return {"attempts": attempts, "error_increments": error_count}
            if error_count[host] >= DEFAULT_MAX_TRIES:
                continue
            script = outcomes[host]
            outcome = script.pop(0) if len(script) > 1 else script[0]
            attempts.append(host)
            if outcome == "ok":
                entries += 1
            else:
                error_count[host] += 1
                if error_count[host] >= DEFAULT_MAX_TRIES:
                    failed_pools += 1


GENERATORS: dict[str | None, Callable[[dict[str, Any]], dict[str, Any]]] = {
    None: ordering,
    "decay_sequence": decay_sequence,
    "system_clusters": system_clusters,
    "failover": failover,
}
OUTPUT_FIELDS = frozenset({
    "expected", "order_groups", "expected_errors_after_decay", "expected_non_hedged",
    "expected_errors_after_each_call", "expected_errors_count", "expected_estimated_recovery_time",
    "attempts", "error_increments",
})


def regenerate(case: dict[str, Any]) -> dict[str, Any]:
    """The case with its outputs recomputed (fields kept in their place; an exact order that
    became tie groups, or the reverse, takes the other's place)."""
    outputs = GENERATORS[case.get("kind")](case)
    result: dict[str, Any] = {}
    for key, value in case.items():
        if key in ("expected", "order_groups"):
            for name in ("expected", "order_groups"):
                if name in outputs:
                    result[name] = outputs.pop(name)
        elif key in OUTPUT_FIELDS:
            result[key] = outputs.pop(key, value)
        else:
            result[key] = value
    result.update(outputs)
    return result


def load(path: Path = VECTORS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dump(cases: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(case, separators=(",", ":"), ensure_ascii=False) + "\n" for case in cases)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed vectors; change nothing")
    parser.add_argument("--path", type=Path, default=VECTORS)
    args = parser.parse_args(argv)
    cases = load(args.path)
    regenerated = [regenerate(case) for case in cases]
    differing = [new["id"] for old, new in zip(cases, regenerated) if old != new]
    if args.check:
        if differing:
            print(f"golden vectors differ from the reference for ids {differing}", file=sys.stderr)
            return 1
        print(f"{len(cases)} golden vectors agree with the reference")
        return 0
    args.path.write_text(dump(regenerated))
    print(f"{len(cases)} golden vectors written; {len(differing)} changed: {differing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
