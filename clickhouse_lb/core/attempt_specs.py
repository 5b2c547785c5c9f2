"""From a statement's settings to the :class:`~clickhouse_lb.core.race.AttemptSpec` of each of its
attempts (pure; shared by the sync and async pools).

Per statement: the timeouts, liveness policy and hedging policy in force (the pool's, changed
by the statement's own ``settings=``), its deadline, whether it may be hedged (read-only, not
pinned), and where the outcomes go (error and slowdown counts, the per-replica latency figures
of the adaptive hedge delay).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from clickhouse_lb.config.attempt_settings import AttemptSettings
from clickhouse_lb.core._statements import StatementKind
from clickhouse_lb.core.deadline import Deadline
from clickhouse_lb.core.hedging import LatencyWindow, hedge_delay
from clickhouse_lb.core.race import AttemptSpec
from clickhouse_lb.core.retry_budget import RetryBudget
from clickhouse_lb.core.watch import AttemptWatch

__all__ = ["PlanContext", "StatementPlan"]


class PlanContext(NamedTuple):
    """What the plans of one pool's statements share, built once per replica set (not per
    statement): the replicas' addresses, where slowdowns, hedges and latencies go, the retry
    budget and the clock."""

    addresses: tuple[str, ...]
    window: LatencyWindow
    count_slowdown: Callable[[int], object]
    count_hedge: Callable[[int], object] = lambda index: None
    budget: RetryBudget | None = None
    clock: Callable[[], float] = time.monotonic


class _Failures(NamedTuple):
    """The statement's side of a plan given as two callables (what a :class:`StatementAttempts`
    gives as its methods of these names)."""

    run_failed: Callable[[int, BaseException], object]
    hedge_candidate: Callable[[set[int]], int | None]


class StatementPlan:
    """How the attempts of one statement wait. ``hedge_candidate(running)``: the next replica
    of the statement's plan not already running (None: none left).

    Whether the statement writes (``statement.write``, ``statement.retry_after_send``) is asked
    only when a wait depends on it (hedging, a deadline, an abandoned attempt): deciding it
    parses the SQL, which the common statement, answered at once, never needs. A pool's
    statement builds its plan only when an attempt asks for it
    (:attr:`~clickhouse_lb.core.failover.StatementAttempts.plan`: a hedged read, a wake-up that
    came due); :meth:`of` stores six values and two references (the pool's :class:`PlanContext`,
    the statement's attempts), the rest is read through them when asked."""

    __slots__ = ("_context", "_failures", "clock", "deadline", "hedgeable", "query_id", "settings", "stall_hedgeable",
                 "statement")

    def __init__(
        self,
        *,
        settings: AttemptSettings,
        deadline: Deadline,
        addresses: tuple[str, ...],
        statement: StatementKind,
        window: LatencyWindow,
        count_failure: Callable[[int, BaseException], object],
        count_slowdown: Callable[[int], object],
        hedge_candidate: Callable[[set[int]], int | None],
        count_hedge: Callable[[int], object] = lambda index: None,
        query_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        budget: RetryBudget | None = None,
    ) -> None:
        self._context = PlanContext(addresses, window, count_slowdown, count_hedge, budget, clock)
        self.clock = clock
        self._failures: Any = _Failures(count_failure, hedge_candidate)
        self.settings = settings
        self.deadline = deadline
        self.statement = statement
        #: A read (not pinned) under hedged requests: its attempts may race a second run.
        self.hedgeable = settings.hedging.enabled and not statement.write
        #: A read may race a second run when its first check came due during a stall of this
        #: process (see :meth:`~clickhouse_lb.core.watch.AttemptWatch.after_stall`); False for a
        #: read that must stay on the replicas it was sent to (read-your-writes).
        self.stall_hedgeable = True
        #: The statement's own query id (from its settings), used for every run; None: the pool
        #: gives each run a fresh one where it may have to KILL it.
        self.query_id = query_id

    @classmethod
    def of(
        cls, context: PlanContext, attempts: Any, statement: Any, settings: AttemptSettings, deadline: Deadline,
    ) -> StatementPlan:
        """The plan of a statement prepared by the pool (a ``PreparedCall``: its ``query_id``),
        whose ``attempts`` (a :class:`~clickhouse_lb.core.failover.StatementAttempts`) count a
        failed run and give a hedge's replica: the per-statement path, no keyword arguments."""
        plan = cls.__new__(cls)
        plan._context = context
        plan.clock = context.clock
        plan._failures = attempts
        plan.settings = settings
        plan.deadline = deadline
        plan.statement = statement
        plan.hedgeable = settings.hedging.enabled and not statement.write
        plan.stall_hedgeable = True
        plan.query_id = statement.query_id
        return plan

    def hedge_after(self) -> float | None:
        if not self.hedgeable:
            return None
        return hedge_delay(self.settings.hedging, self._context.window)

    def _answered(self, index: int, seconds: float) -> None:
        context = self._context
        context.window.answered(context.addresses[index], seconds)

    def _unanswered(self, index: int, seconds: float) -> None:
        context = self._context
        context.window.unanswered(context.addresses[index], seconds)

    def run_query_id(self, hedge_after: float | None) -> Callable[[], str | None]:
        """Where each run's query id comes from: the statement's own; a fresh one of the pool's
        only where the pool may have to KILL the run (a hedge that lost, a deadline: reads only,
        a write is never cut short on a live replica); else none (the client picks)."""
        fixed = self.query_id
        if fixed is not None:
            return lambda: fixed
        statement = self.statement  # (whether it writes: decided here, when first asked)
        killable = (hedge_after is not None or self.deadline.at is not None) and statement.retry_after_send \
            and not statement.write
        return _new_query_id if killable else _no_query_id

    def connect_timeout(self) -> float | None:
        """A run's exact connect timeout, cut to the statement's deadline."""
        deadline = self.deadline
        timeout = self.settings.timeouts.connect
        return timeout if deadline.at is None else deadline.cut(timeout)

    def spec(self, first: int) -> AttemptSpec:
        """The spec of an attempt starting on replica ``first``."""
        settings = self.settings
        hedge_after = self.hedge_after()
        deadline_at = self.deadline.at
        receive = settings.timeouts.receive
        retry_safe = self.statement.retry_after_send
        context = self._context
        budget = context.budget

        def watch(index: int, started: float) -> AttemptWatch:
            return AttemptWatch(
                started,
                liveness=settings.liveness,
                receive_timeout=receive,
                deadline_at=deadline_at,
                hedge_after=hedge_after,
                retry_safe=retry_safe,
                budget=budget,
            )

        return AttemptSpec(
            first=first,
            clock=context.clock,
            watch=watch,
            hedge_index=self._hedge_index if hedge_after is not None else _no_hedge,
            stall_hedge_index=self._hedge_index if self._stall_hedges(retry_safe) else None,
            query_id=self.run_query_id(hedge_after),
            address=context.addresses.__getitem__,
            write=self.statement.write,
            connect_timeout=self.connect_timeout(),
            on_failure=self._failures.run_failed,
            on_slower=context.count_slowdown,
            on_latency=self._answered if self.hedgeable else _ignore,
            on_unanswered=self._unanswered if self.hedgeable else _ignore,
            on_hedge=context.count_hedge,
        )

    def _stall_hedges(self, retry_safe: bool) -> bool:
        """Whether the attempts may race a second run after a stall: reads only (never a write,
        whatever its ``idempotent`` setting: two runs at once are not one run repeated), under
        liveness checks (their first check is what a stall delays)."""
        return (self.stall_hedgeable and retry_safe and self.settings.liveness.check_after is not None
                and not self.statement.write)

    def _hedge_index(self, running: set[int]) -> int | None:
        """The replica to launch a hedge on, if the retry budget allows one more request."""
        index: int | None = self._failures.hedge_candidate(running)
        budget = self._context.budget
        if index is None or budget is None or budget.try_spend(hedge=True):
            return index
        return None


def _no_hedge(running: set[int]) -> int | None:
    return None


def _new_query_id() -> str | None:
    return f"clickhouse-lb-{uuid.uuid4().hex}"


def _no_query_id() -> str | None:
    return None


def _ignore(index: int, seconds: float) -> None:
    return None
