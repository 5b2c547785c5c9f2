"""The statement deadline: how much time is left, and what that cuts (pure; clock injected).

``failover_timeout`` bounds a whole statement, not just the decision to start another attempt:
every wait of the statement (an attempt's connect and receive timeouts, the backoff sleep
between passes, the wait for an answer) is cut to the time left, so the statement ends at the
deadline plus the time to notice it (the driver's own wake-up), never at the deadline plus a
whole attempt.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Deadline", "cut_timeout"]

Clock = Callable[[], float]


def cut_timeout(timeout: float | None, remaining: float | None) -> float | None:
    """The smaller of a timeout and the time left (``None``: unbounded), never negative."""
    if remaining is None:
        return timeout
    remaining = max(0.0, remaining)
    return remaining if timeout is None else min(timeout, remaining)


class Deadline:
    """When one statement must be over. ``seconds=None``: no deadline (every cut is a no-op)."""

    __slots__ = ("_clock", "at", "seconds")

    def __init__(self, seconds: float | None, *, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self.seconds = seconds
        self.at: float | None = None if seconds is None else clock() + seconds

    def remaining(self) -> float | None:
        """Seconds left (0 once expired); None without a deadline."""
        if self.at is None:
            return None
        return max(0.0, self.at - self._clock())

    @property
    def expired(self) -> bool:
        return self.at is not None and self._clock() >= self.at

    def cut(self, timeout: float | None) -> float | None:
        """``timeout`` cut to the time left (a connect or receive timeout, a wait)."""
        return cut_timeout(timeout, self.remaining())

    def cut_sleep(self, seconds: float) -> float:
        """A backoff sleep cut to the time left: a statement never sleeps past its deadline."""
        remaining = self.remaining()
        return seconds if remaining is None else max(0.0, min(seconds, remaining))

    def __repr__(self) -> str:
        return "Deadline(none)" if self.at is None else f"Deadline({self.seconds}s, {self.remaining():.3f}s left)"
