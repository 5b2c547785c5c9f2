"""Pure summaries of outcomes: ratios over interleaved rounds, per-replica throughput over
time, the worst gap a thread saw, when a revived replica got traffic again, load shares."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .load import Outcome

__all__ = [
    "RatioSummary",
    "percentile",
    "ratio_summary",
    "readmit_delay",
    "replica_shares",
    "throughput_bins",
    "worst_gap",
]


@dataclass(frozen=True)
class RatioSummary:
    """A contender's cost against a reference over rounds: the median of per-round ratios, their
    quartiles and extremes (each round measures both side by side, so the spread of the
    per-round ratios is the noise band)."""

    median: float
    q1: float
    q3: float
    low: float
    high: float
    rounds: int

    def verdict(self) -> int:
        """+1 slower, -1 faster, 0 no difference: a difference is claimed only when at least
        three quarters of the rounds agree on its sign."""
        if self.q1 > 1.0:
            return 1
        if self.q3 < 1.0:
            return -1
        return 0

    def text(self) -> str:
        return f"{self.median:.2f}x ({self.q1:.2f}-{self.q3:.2f})"


def ratio_summary(values: Sequence[float], reference: Sequence[float]) -> RatioSummary:
    """``values[i] / reference[i]`` per round (same round, same noise), summarised."""
    if len(values) != len(reference) or not values:
        raise ValueError(f"need the same non-zero number of rounds, got {len(values)} and {len(reference)}")
    ratios = [v / r for v, r in zip(values, reference)]
    if len(ratios) > 1:
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    else:
        q1 = q3 = ratios[0]
    return RatioSummary(statistics.median(ratios), q1, q3, min(ratios), max(ratios), len(ratios))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def throughput_bins(outcomes: Iterable[Outcome], replicas: Sequence[str], end: float,
                    width: float = 0.1) -> dict[str, list[float]]:
    """Statements per second answered by each replica, per ``width``-second bin of completion
    time over ``[0, end)``; failed statements under the key ``"failed"``."""
    n = max(1, math.ceil(end / width))
    bins: dict[str, list[float]] = {name: [0.0] * n for name in [*replicas, "failed"]}
    for o in outcomes:
        i = int(o.end // width)
        if not 0 <= i < n:
            continue
        key = "failed" if not o.ok else o.replica
        if key in bins:
            bins[key][i] += 1 / width
    return bins


def worst_gap(outcomes: Iterable[Outcome], start: float = 0.0) -> float:
    """The longest time any thread went without a statement succeeding, from ``start`` (the
    load's start) to each success in turn; a thread that never succeeded counts to its last end."""
    by_thread: dict[int, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_thread[o.thread].append(o)
    worst = 0.0
    for thread_outcomes in by_thread.values():
        last = start
        for o in sorted(thread_outcomes, key=lambda x: x.end):
            if o.ok:
                worst = max(worst, o.end - last)
                last = o.end
        if not any(o.ok for o in thread_outcomes):
            worst = max(worst, max(o.end for o in thread_outcomes) - start)
    return worst


def readmit_delay(outcomes: Iterable[Outcome], replica: str, back_at: float) -> float | None:
    """Seconds from ``back_at`` (the replica answers again) to the start of the first statement
    it answered that was sent after that moment; None when it got none. A statement sent before
    (stuck on a paused replica) does not count: that is not the balancer sending work back."""
    starts = [o.start for o in outcomes if o.ok and o.replica == replica and o.start >= back_at]
    return min(starts) - back_at if starts else None


def waiting_at(outcomes: Iterable[Outcome], replica: str, at: float) -> list[Outcome]:
    """Statements ``replica`` answered that were sent before ``at`` and still waiting then (for
    a stopped replica resumed at ``at``: the ones stuck on it, including any sent while it was
    being stopped, before the fault's recorded time)."""
    return [o for o in outcomes if o.ok and o.replica == replica and o.start < at <= o.end]


def replica_shares(outcomes: Iterable[Outcome], replicas: Sequence[str]) -> dict[str, float]:
    """Fraction of the successful statements each replica answered."""
    counts = Counter(o.replica for o in outcomes if o.ok)
    total = sum(counts.values())
    return {name: (counts[name] / total if total else 0.0) for name in replicas}


def failed_count(outcomes: Iterable[Outcome]) -> int:
    return sum(1 for o in outcomes if not o.ok)


def error_kinds(outcomes: Iterable[Outcome]) -> dict[str, int]:
    return dict(Counter(o.error for o in outcomes if o.error))


def summarize_timeline(outcomes: Sequence[Outcome], events: Mapping[str, float], fault: str,
                       replica: str) -> dict[str, Any]:
    """A failover run in figures. ``events``: ``fault``, ``recover`` (restart or resume begins),
    ``back`` (``replica`` answers again), ``end``; ``fault``: ``kill`` or ``pause``.

    ``stuck``: statements waiting on the stopped replica until it answered again (a killed
    replica answers nothing in flight); ``never_left``: the balancer kept the replica in
    rotation for the whole fault: a stuck statement was sent in its second half, or nothing at
    all was (every thread was waiting on the replica). Then ``readmit`` means nothing: the
    first statement after the resume finds the replica it never left."""
    down_until = events["recover"] if fault == "kill" else events["back"]
    stuck = waiting_at(outcomes, replica, down_until)
    late = (events["fault"] + down_until) / 2
    sent_late = any(late <= o.start < down_until for o in outcomes)
    return {
        "statements": sum(1 for o in outcomes if o.ok),
        "stuck": len(stuck),
        "never_left": bool(stuck) and (not sent_late or any(o.start >= late for o in stuck)),
        "failed": failed_count(outcomes),
        "errors": error_kinds(outcomes),
        "worst_gap": worst_gap(outcomes),
        "readmit": readmit_delay(outcomes, replica, events["back"]),
        "window_after_back": events["end"] - events["back"],
    }


def latency_quantiles(outcomes: Iterable[Outcome]) -> Mapping[str, float]:
    times = [o.end - o.start for o in outcomes if o.ok]
    return {"p50": percentile(times, 50), "p99": percentile(times, 99)}
