"""A retry budget: how many requests a pool may send on its own (pure; the clock is injected).

A hedge, a re-send after a hung attempt was abandoned, a failover after a request reached a
replica: each is a request the application did not ask for, sent to servers that may be slow
precisely because they are overloaded. Unlimited, they multiply the load when every replica is
slow. As Finagle's ``RetryBudget``, Envoy's retry budgets and gRPC's retry throttling, the
pool's extra requests are limited to a share of its statements in a sliding window, plus a
small floor so that a pool that runs few statements can still fail over:

    allowed in the window = retry_budget_ratio * statements in the window
                            + retry_budget_min_per_second * window seconds

Hedges, being speculative, get the ratio's share and one request only (not the floor): with
every replica slow, they are what would multiply the load. Failovers after a request was sent
(a replica killed mid-request, a receive timeout) get the floor too (10 per second by default,
Finagle's): a pool running few statements must still ride out a replica's failure.

The window is ``retry_budget_window_ms`` long, kept as 10 buckets (a statement or a spend
leaves the window within a tenth of it after it ages out). ``retry_budget_ratio=0`` with
``retry_budget_min_per_second=0`` allows no extra request at all; the budget is off (unlimited)
when ``retry_budget_window_ms=0``.

What counts: hedges, re-sends after an abandoned attempt (hung, receive timeout), failovers
after a failure that came once the request was sent. What does not: a failover after a
connection was refused or could not be made (nothing reached the server: cheap, and exactly
what failover is for), and the statement's first attempt.

Thread-safe. Counting a statement is one clock read and an addition (no lock: two threads
adding at once may lose a count, which only makes the budget a little stricter).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from clickhouse_lb.config.retry_budget import RetryBudgetSettings

__all__ = ["RetryBudget"]

_BUCKETS = 10
#: What a hedge may use beyond the ratio's share of the window's statements: one request.
_HEDGE_FLOOR = 1.0


class _Shared(Protocol):
    """What pools share (:class:`clickhouse_lb.core.shared_state.SharedReplicaSet`)."""

    def retry_budget(self, settings: RetryBudgetSettings) -> RetryBudget: ...


class RetryBudget:
    """The budget of one pool (or of the pools that share a balancing state)."""

    __slots__ = ("_clock", "_current", "_current_end", "_epoch", "_lock", "_retries", "_statements", "_width",
                 "settings")

    def __init__(self, settings: RetryBudgetSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        window = settings.window
        self._width = window / _BUCKETS if window else 0.0
        # Bucket n of the ring counts what happened during [n * width, (n + 1) * width);
        # ``_epoch[i]`` is the n bucket i holds now (a stale one is reset when reused).
        self._epoch = [-1] * _BUCKETS
        self._statements = [0] * _BUCKETS
        self._retries = [0] * _BUCKETS
        self._lock = threading.Lock()
        # The bucket statements go to until ``_current_end`` (no division per statement).
        self._current = 0
        self._current_end = -1.0

    @classmethod
    def of_pool(cls, settings: RetryBudgetSettings, shared: _Shared | None) -> RetryBudget:
        """A pool's budget: the one of the pools it shares its balancing state with, if any."""
        return cls(settings) if shared is None else shared.retry_budget(settings)

    @property
    def enabled(self) -> bool:
        return self._width > 0.0

    def _bucket(self, now: float) -> int:
        """The ring slot for ``now``, reset if it still held an older bucket."""
        number = int(now / self._width)
        slot = number % _BUCKETS
        if self._epoch[slot] != number:
            with self._lock:
                if self._epoch[slot] != number:
                    self._epoch[slot] = number
                    self._statements[slot] = 0
                    self._retries[slot] = 0
        return slot

    def record_statement(self) -> None:
        """A statement started (it adds ``retry_budget_ratio`` to the budget)."""
        if not self._width:
            return
        now = self._clock()
        if now < self._current_end:  # the usual case: still in the bucket of the last statement
            self._statements[self._current] += 1
            return
        slot = self._current = self._bucket(now)
        self._current_end = (int(now / self._width) + 1) * self._width
        self._statements[slot] += 1

    def _balance(self, now: float, *, hedge: bool) -> float:
        oldest = int(now / self._width) - _BUCKETS + 1
        statements = retries = 0
        for slot in range(_BUCKETS):
            if self._epoch[slot] >= oldest:
                statements += self._statements[slot]
                retries += self._retries[slot]
        settings = self.settings
        # A hedge is speculative: it gets the ratio's share and one request, never the floor,
        # which is there so that a pool running few statements can still fail over.
        floor = settings.min_per_second * settings.window
        if hedge:
            floor = min(floor, _HEDGE_FLOOR)
        return settings.ratio * statements + floor - retries

    def available(self, *, hedge: bool = False) -> bool:
        """Would one more extra request fit (without spending it)?"""
        if not self._width:
            return True
        with self._lock:
            return self._balance(self._clock(), hedge=hedge) >= 1.0

    def try_spend(self, *, hedge: bool = False) -> bool:
        """Spend one extra request if it fits; False: the budget is spent. ``hedge``: a
        speculative request (the ratio's share only, see :func:`_balance`)."""
        if not self._width:
            return True
        now = self._clock()
        slot = self._bucket(now)
        with self._lock:
            if self._balance(now, hedge=hedge) < 1.0:
                return False
            self._retries[slot] += 1
            return True

    def __repr__(self) -> str:
        settings = self.settings
        return (
            f"RetryBudget(ratio={settings.ratio:g}, min_per_second={settings.min_per_second:g}, "
            f"window={settings.window:g}s)"
        )
