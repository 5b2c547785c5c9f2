"""Hedged reads: when to send the same read to a second replica (pure, apart from a lock).

ClickHouse's ``use_hedged_requests``, on the client side: a read-only statement whose replica has
not answered within ``receive_data_timeout_ms`` is sent to the next replica of the plan as well;
the first complete answer wins, the other attempt is cancelled (connection closed, and
``KILL QUERY`` sent to its replica), and the slower replica's ``slowdowns_count`` rises, which
orders it later while hedging is on (the hedged sort key: errors, slowdowns, priority,
strategy, random).

``receive_data_timeout_ms`` is a number of milliseconds, or ``"auto"``: ``AUTO_FACTOR`` times the
latency of the replica that answers fastest, bounded below by ``AUTO_MIN``. Each replica's
latency is the peak EWMA of its answers to hedged reads (the estimator ``least_loaded`` uses,
:func:`clickhouse_lb.core.load.peak_ewma`: a slower answer replaces it at once, a faster one is
blended in), and a run that lost a race raises its replica's figure to at least how long it ran
unanswered. The delay comes from the *fastest* replica because a pool's own window of latencies
fills with the slow replica's answers once it is slow: the 95th percentile of the winners was a
slow replica's 1.5 s, and the pool never hedged it.

Cold start: with no replica heard from in the last ``AUTO_HORIZON`` seconds the delay is
``AUTO_COLD`` (ClickHouse's ``receive_data_timeout_ms`` default: a new pool's first reads, which
also open connections, are not hedged); while only one replica is known it is at most
``AUTO_EXPLORE``: a read slower than that on the only replica the pool knows is sent to a second
one, which is how a slow replica is found from the second statement on (and costs one extra
request per ``AUTO_HORIZON`` on a cluster whose reads are all slow). Figures older than
``AUTO_HORIZON`` are forgotten: a replica idle for a minute may not answer as it did.

Latencies are measured on this process's clock: while another thread holds the GIL for
seconds, the answers it delays count as slow ones, and until the peak EWMA forgets them (its
10 s decay time) the delay can exceed a slow replica's lateness. Discounting this process's own
stalls is for the stall-aware judgement the probes and liveness checks use.

Off by default in the pool, unlike on the server: every hedge is a second full query on another
replica, and the pool cannot see the server's load; hedge when tail latency matters more than
cluster load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from clickhouse_lb.config.hedging import AUTO, HedgePolicy, parse_receive_data_timeout
from clickhouse_lb.core.load import DEFAULT_DECAY_TIME, peak_ewma

__all__ = ["AUTO", "HedgePolicy", "LatencyWindow", "adaptive_delay", "hedge_delay", "parse_receive_data_timeout"]

#: Seconds: the floor of the "auto" delay (jitter of a few ms is not worth a second request).
AUTO_MIN = 0.05
#: Seconds: the delay while no replica is known (ClickHouse's receive_data_timeout_ms default).
AUTO_COLD = 2.0
#: Seconds: the most the delay is while only one replica is known (time to look at another).
AUTO_EXPLORE = 0.2
#: The delay as a multiple of the fastest replica's latency (its peak EWMA is already near the
#: top of its recent answers; 3x of it leaves a healthy cluster's jitter unhedged: see
#: tests/test_hedge_delay.py for the lognormal check, BENCHMARKS.md for measured figures).
AUTO_FACTOR = 3.0
#: Seconds after which a replica's figure is forgotten.
AUTO_HORIZON = 60.0


def adaptive_delay(answered: list[float], known: int) -> float:
    """The "auto" delay given the latency figures of the replicas that answered recently and the
    number of replicas known at all (answered, or ran unanswered in a lost race)."""
    if not answered:
        return AUTO_COLD
    delay = max(AUTO_MIN, AUTO_FACTOR * min(answered))
    if known < 2:
        delay = min(delay, AUTO_EXPLORE)
    return delay


class _Figure:
    __slots__ = ("latency", "stamp")

    def __init__(self, latency: float | None, stamp: float) -> None:
        #: Peak EWMA of the replica's answers; None: it only ever lost races.
        self.latency = latency
        self.stamp = stamp


class LatencyWindow:
    """Recent latency figures per replica (by address: they survive a change of the replica set)
    of the pool's hedged reads, shared by threads and tasks; :meth:`delay` is the "auto" delay."""

    __slots__ = ("_clock", "_decay_time", "_figures", "_horizon", "_lock")

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, decay_time: float = DEFAULT_DECAY_TIME,
        horizon: float = AUTO_HORIZON,
    ) -> None:
        self._clock = clock
        self._decay_time = decay_time
        self._horizon = horizon
        self._figures: dict[str, _Figure] = {}
        self._lock = threading.Lock()

    def answered(self, address: str, seconds: float) -> None:
        """A read on ``address`` answered after ``seconds``."""
        now = self._clock()
        with self._lock:
            figure = self._figure(address, now)
            # A new figure (no latency yet, nothing elapsed) takes the answer as it is.
            figure.latency = peak_ewma(figure.latency, seconds, now - figure.stamp, self._decay_time)
            figure.stamp = now

    def unanswered(self, address: str, seconds: float) -> None:
        """A run on ``address`` lost a race after ``seconds`` without an answer: its latency is at
        least that (a lower bound only raises the figure; a replica with no answer yet keeps none)."""
        now = self._clock()
        with self._lock:
            figure = self._figure(address, now)
            if figure.latency is not None and seconds > figure.latency:
                figure.latency = seconds
            figure.stamp = now

    def _figure(self, address: str, now: float) -> _Figure:
        """``address``'s figure, a new one (no latency) if it has none; the lock is held."""
        figure = self._figures.get(address)
        if figure is None:
            figure = self._figures[address] = _Figure(None, now)
        return figure

    def latencies(self) -> dict[str, float | None]:
        """Each recently known replica's figure (None: it only lost races)."""
        now = self._clock()
        with self._lock:
            return {a: f.latency for a, f in self._figures.items() if now - f.stamp <= self._horizon}

    def delay(self) -> float:
        """The "auto" hedge delay now."""
        recent = self.latencies()
        return adaptive_delay([v for v in recent.values() if v is not None], len(recent))


def hedge_delay(policy: HedgePolicy, window: LatencyWindow) -> float | None:
    """Seconds to wait before hedging a read now; None: do not hedge."""
    if not policy.enabled:
        return None
    if policy.delay is not None:
        return policy.delay
    return window.delay()
