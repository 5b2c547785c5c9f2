"""The failover policy of one statement: an immutable value that decides, from the history of
its failed attempts, whether to retry, where, after what pause, and when to stop (pure).

urllib3's ``Retry`` is the model: the policy is never changed in place; recording a failed
attempt (:meth:`FailoverPolicy.increment`) returns a new policy whose ``history`` holds one
more :class:`AttemptRecord`, and :meth:`FailoverPolicy.verdict` reads that history. The loop
that carries the decisions out (tenacity's, :mod:`clickhouse_lb.core.failover`) and its side
effects (counting, logging, listener events) live elsewhere; nothing here does I/O or logs.

The attempts walk the plan in passes (r1, r2, r3, r1, r2, r3, ...), each replica at most
``tries`` times. After a failed attempt, in this order:

* not a replica failure (a query failure, a cancellation): :attr:`Verdict.RAISE`, the error
  unchanged;
* past the deadline (``failover_timeout``): :attr:`Verdict.TIMEOUT`;
* a replica failure after the request was sent, of a statement that may not be repeated:
  :attr:`Verdict.UNCONFIRMED` (a write that may have been applied);
* no attempt left: :attr:`Verdict.EXHAUSTED`;
* else :attr:`Verdict.RETRY` on the next replica of the schedule. A retry that re-sends a
  request that reached a replica (:meth:`FailoverPolicy.resends`) is extra load; the retry
  budget (:mod:`clickhouse_lb.core.retry_budget`) may turn it into :attr:`Verdict.BUDGET`.

Between replicas there is no pause; before each new pass an optional exponential backoff with
full jitter (``failover_backoff_ms``), cut to the deadline.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from enum import Enum
from typing import NamedTuple

from clickhouse_lb.core.classify import Failure
from clickhouse_lb.core.deadline import Deadline

__all__ = ["NO_DEADLINE", "STOPS", "AttemptRecord", "FailoverPolicy", "Verdict"]

_MAX_BACKOFF_SECONDS = 10.0

#: The deadline of every statement without a ``failover_timeout`` (it holds no state).
NO_DEADLINE = Deadline(None)


class Verdict(str, Enum):
    RETRY = "retry"
    RAISE = "raise"
    UNCONFIRMED = "unconfirmed"
    EXHAUSTED = "exhausted"
    TIMEOUT = "timeout"
    BUDGET = "budget"


#: The verdicts that end a statement with an error of the pool's own (not the attempt's).
STOPS = frozenset({Verdict.EXHAUSTED, Verdict.TIMEOUT, Verdict.BUDGET})


class AttemptRecord(NamedTuple):
    """One failed attempt (or one failed run of a hedged attempt): where, and what it means."""

    replica: int
    failure: Failure


class FailoverPolicy(NamedTuple):
    """The failover state of one statement, as a value. ``order``: the plan (replica indices);
    the schedule is the plan repeated ``tries`` times, computed (:meth:`scheduled`), never
    materialised (replicas x tries may be large)."""

    order: Sequence[int]
    tries: int
    backoff_ms: int = 0
    deadline: Deadline = NO_DEADLINE
    history: tuple[AttemptRecord, ...] = ()

    @property
    def total(self) -> int:
        return len(self.order) * self.tries

    @property
    def remaining(self) -> int:
        return self.total - len(self.history)

    def scheduled(self, number: int) -> int:
        """The replica index of attempt ``number`` (0-based): the plan, pass after pass."""
        order = self.order
        return order[number % len(order)]

    def next_index(self) -> int:
        """The replica of the next attempt (every earlier one failed)."""
        return self.scheduled(len(self.history))

    def increment(self, index: int, failure: Failure) -> FailoverPolicy:
        """The policy after a failed attempt (or run) on replica ``index``."""
        return self._replace(history=(*self.history, AttemptRecord(index, failure)))

    @property
    def last(self) -> AttemptRecord | None:
        history = self.history
        return history[-1] if history else None

    def verdict(self, *, retry_after_send: bool) -> Verdict:
        """What to do after the last failed attempt (see the module doc for the order).
        ``retry_after_send``: the statement may be repeated after its request was sent."""
        last = self.last
        if last is None or not last.failure.replica:
            return Verdict.RAISE
        if self.deadline.expired:
            return Verdict.TIMEOUT
        if last.failure.sent and not retry_after_send:
            return Verdict.UNCONFIRMED
        if self.remaining <= 0:
            return Verdict.EXHAUSTED
        return Verdict.RETRY

    def resends(self) -> bool:
        """The retry the last failure calls for repeats a request that reached a replica (extra
        load on the servers, which the retry budget limits); a connection refused before
        anything was sent costs the servers nothing and does not count, nor does a re-send from
        a replica shown hung (its /ping failed while this process ran: it serves nothing, so the
        request moves load to the live replicas rather than adding any)."""
        last = self.last
        return last is not None and last.failure.sent and last.failure.kind != "hung"

    def backoff(self, uniform: Callable[[float, float], float] = random.uniform) -> float:
        """Seconds to pause before the next attempt: none between replicas; before each new
        pass, full jitter up to ``failover_backoff_ms * 2**(pass - 1)`` (at most 10 s), cut to
        the deadline."""
        done = len(self.history)
        size = len(self.order)
        if not self.backoff_ms or done % size:
            return 0.0
        ceiling = min(_MAX_BACKOFF_SECONDS, self.backoff_ms / 1000.0 * 2 ** (done // size - 1))
        return self.deadline.cut_sleep(uniform(0.0, ceiling))

    def hedge_candidate(self, running: set[int]) -> int | None:
        """The replica a hedged read goes to: the next one of the schedule not already running."""
        for number in range(len(self.history) + 1, self.total):
            index = self.scheduled(number)
            if index not in running:
                return index
        return None

    def sent_any(self) -> bool:
        """Some failed attempt's request had reached a replica."""
        return any(record.failure.sent for record in self.history)
