"""One statement's attempts over the replicas, carried out by tenacity (sync and async).

The decisions are :class:`~clickhouse_lb.core.policy.FailoverPolicy`'s (immutable, from the
attempt history); :class:`StatementAttempts` holds the statement's current policy and is the one
place where an attempt's end has effects: the in-flight count, the error counted against the
replica at once (so that concurrent statements already route away), the retry budget, and the
log lines and listener events. tenacity is the one retry loop: its ``stop``, ``wait`` and
``retry`` callbacks read the verdict recorded for the last attempt, its ``before_sleep`` announces
the failover, its ``retry_error_callback`` raises the pool's error for a statement that stopped.

A statement ends with the error of its last attempt unchanged (a query failure: see
:mod:`clickhouse_lb.core.classify`), :class:`~clickhouse_lb.errors.WriteOutcomeUnknownError` (a
write whose request may have reached the server and that may not be repeated: give it an
``insert_deduplication_token`` or ``settings={"idempotent": True}``),
:class:`~clickhouse_lb.errors.AllReplicasUnavailableError` (no attempt left), its subclass
:class:`~clickhouse_lb.errors.StatementTimeoutError` (``failover_timeout`` ran out) or
:class:`~clickhouse_lb.errors.RetryBudgetExhaustedError` (a re-send refused by the retry budget).

**The direct first attempt** (:data:`DIRECT_FIRST_ATTEMPT`): the first attempt runs before
tenacity is entered, because tenacity's per-call bookkeeping (about 13-22 us, BENCHMARKS.md
"One policy, one loop") costs as much as the pool's whole work for a statement answered at once.
When it fails, tenacity starts from that failure (its first call replays it), so every decision
after it is tenacity's, exactly as without the shortcut.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar, cast

from tenacity import AsyncRetrying, RetryCallState, Retrying

from clickhouse_lb.config.attempt_settings import AttemptSettings
from clickhouse_lb.core._driver_logs import enter_pool, leave_pool, runs_attempts
from clickhouse_lb.core._statement_end import announce_failover, stopped_error, unconfirmed_write
from clickhouse_lb.core._statements import StatementKind
from clickhouse_lb.core._steps import Steps, drive, drive_async
from clickhouse_lb.core.attempt_specs import PlanContext, StatementPlan
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.deadline import Deadline
from clickhouse_lb.core.events import logger
from clickhouse_lb.core.load import ReplicaLoad
from clickhouse_lb.core.policy import NO_DEADLINE, STOPS, FailoverPolicy, Verdict
from clickhouse_lb.core.race import AttemptSpec, RaceFailure
from clickhouse_lb.core.retry_budget import RetryBudget
from clickhouse_lb.errors import AllReplicasUnavailableError

__all__ = ["DIRECT_FIRST_ATTEMPT", "StatementAttempts", "async_policy", "run_async", "run_sync", "sync_policy"]

T = TypeVar("T")

#: Run each statement's first attempt before entering tenacity (see the module doc); False:
#: tenacity runs every attempt (bench/bench_pool_overhead.py measures both).
DIRECT_FIRST_ATTEMPT = True


_new_attempts = object.__new__


class StatementAttempts:
    """One statement's current :class:`FailoverPolicy` and the effects of its attempts.

    No ``__slots__``: what most statements never change (no policy, no verdict, a read's or a
    prepared call's defaults) stays a class attribute, not a store per statement."""

    _policy: FailoverPolicy | None = None  # built when first asked: see :attr:`policy`
    #: The decision after the last attempt that ended (None: none ended yet).
    verdict: Verdict | None = None
    _retry_after_send = True
    _write = True
    _statement: StatementKind | None = None
    _budget: RetryBudget | None = None
    _replayed: BaseException | None = None
    _attempt_started = 0.0
    #: The replica whose answer ended a raced attempt when it was not the attempt's own (its success).
    answered_by: int | None = None
    #: The statement's deadline (its policy's, for the attempts' waits).
    deadline: Deadline = NO_DEADLINE
    #: The attempt settings in force (the pool's, or the statement's own applied to them) and
    #: what the plans of the pool's statements share: set by the pool for its statements, from
    #: which :attr:`plan` is built when first asked.
    settings: AttemptSettings
    plan_context: PlanContext
    #: The query id the statement gave in its settings (None: the pool's runs pick their own).
    query_id: str | None = None
    _plan: StatementPlan | None = None

    def __init__(
        self,
        balancer: Balancer,
        order: Sequence[int],
        *,
        operation: str,
        retry_after_send: bool = True,
        write: bool = True,
        statement: StatementKind | None = None,
        budget: RetryBudget | None = None,
    ) -> None:
        """``statement``: where ``write`` and ``retry_after_send`` come from instead (a
        :class:`~clickhouse_lb.core._statements.PreparedCall`: decided only when a failure asks).
        ``budget``: the pool's retry budget, which counts the statement (None: re-sends unlimited)."""
        self._balancer, self._order, self.operation = balancer, order, operation
        self._load = balancer.state.replica_load
        if budget is not None:
            self._budget = budget
            budget.record_statement()
        timeout = balancer.settings.failover_timeout
        #: The statement's deadline (its policy's, for the attempts' waits).
        self.deadline = NO_DEADLINE if timeout is None else Deadline(timeout)
        if statement is not None:
            self._statement = statement
        else:
            self._retry_after_send, self._write = retry_after_send, write

    _balancer: Balancer
    #: The balancer's in-flight counts and latencies (``_balancer.state.replica_load``).
    _load: ReplicaLoad
    #: The pool's ``failover_timeout`` (None: none), for :meth:`of` (a class of :meth:`of_pool`).
    _failover_timeout: float | None = None

    @classmethod
    def of_pool(
        cls, balancer: Balancer, budget: RetryBudget | None, settings: AttemptSettings, context: PlanContext,
    ) -> type[StatementAttempts]:
        """The class of one pool's statements' attempts over ``balancer``: what all of them share
        (the balancer, the retry budget, the attempt settings, the plans' context, the failover
        timeout) set once as its class attributes, not stored per statement (:meth:`of`). The pool
        makes a new one when discovery changes its replica set."""
        shared = {
            "_balancer": balancer, "_load": balancer.state.replica_load, "_budget": budget, "settings": settings,
            "plan_context": context,
            "_failover_timeout": balancer.settings.failover_timeout, "__doc__": cls.__doc__,
        }
        return type(cls.__name__, (cls,), shared)

    @classmethod
    def of(cls, order: Sequence[int], operation: str, statement: StatementKind) -> StatementAttempts:
        """The attempts of one statement of the pool (``cls``: a class of :meth:`of_pool`),
        counted as started by the retry budget."""
        attempts = _new_attempts(cls)
        attempts._order, attempts.operation, attempts._statement = order, operation, statement
        budget = cls._budget
        if budget is not None:
            budget.record_statement()
        timeout = cls._failover_timeout
        if timeout is not None:
            attempts.deadline = Deadline(timeout)
        return attempts

    @property
    def policy(self) -> FailoverPolicy:
        """The statement's failover policy now (built on first use: a statement answered at once never asks)."""
        policy = self._policy
        if policy is None:
            settings = self._balancer.settings
            policy = self._policy = FailoverPolicy(self._order, settings.connections_with_failover_max_tries,
                                                   settings.failover_backoff_ms, self.deadline)
        return policy

    @property
    def plan(self) -> StatementPlan:
        """How the statement's attempts wait (built on first use: an attempt answered before its
        first wake-up, not hedged, never asks)."""
        plan = self._plan
        if plan is None:
            statement = self._statement
            assert statement is not None, "a pool's statement: prepared, with its settings"
            plan = self._plan = StatementPlan.of(self.plan_context, self, statement, self.settings, self.deadline)
        return plan

    def spec(self, first: int) -> AttemptSpec:
        """The spec of an attempt starting on replica ``first`` (the plan's)."""
        return self.plan.spec(first)

    @property
    def write(self) -> bool:
        """The statement may change data: a failure after sending may have applied it."""
        return self._write if self._statement is None else self._statement.write

    @property
    def retry_after_send(self) -> bool:
        """The statement may be repeated after its request was sent."""
        return self._retry_after_send if self._statement is None else self._statement.retry_after_send

    # -- one attempt ------------------------------------------------------------------------

    def begin(self) -> int:
        """The replica index for the next attempt (every earlier attempt failed)."""
        policy = self._policy
        if policy is None:  # the first attempt (no failure yet): the plan's first replica
            done, index = 0, self._order[0]
        else:
            done, index = len(policy.history), policy.next_index()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s: attempt %d on %s", self.operation, done + 1, self._balancer.addresses[index])
        # The attempt is in flight from here until succeeded()/failed() (one at a time).
        self._attempt_started = self._load.start(index)
        return index

    def succeeded(self, index: int) -> None:
        self._load.finish(index, self._attempt_started)
        self._balancer.record_success(index if self.answered_by is None else self.answered_by)

    def enter(self) -> int:
        """The statement starts, and with it its first attempt, on the returned replica index
        (-1: none of its own, tenacity runs every attempt: see :data:`DIRECT_FIRST_ATTEMPT`)."""
        if not DIRECT_FIRST_ATTEMPT:
            return -1
        index = self._order[0]
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s: attempt 1 on %s", self.operation, self._balancer.addresses[index])
        self._attempt_started = self._load.start(index)
        return index

    def left(self, index: int, result: T) -> T:
        """The first attempt (:meth:`enter`) succeeded with ``result``: the statement's end."""
        self._load.finish(index, self._attempt_started)
        self._balancer.record_success(index if self.answered_by is None else self.answered_by)
        return result

    def failed(self, index: int, exc: BaseException, *, ran_on: int | None = None) -> BaseException:
        """An attempt ended with ``exc``: count it and decide (:attr:`verdict`); returns the error the
        attempt raises. A cancelled or interrupted attempt (not an ``Exception``) only leaves the
        in-flight count. ``ran_on``: the replica the attempt's last run failed on, when a hedge took
        it elsewhere (a run through :mod:`clickhouse_lb.core.race` ends with a :class:`RaceFailure`)."""
        self._load.finish(index, self._attempt_started)
        self.answered_by = None  # (a winner noted before the attempt failed is no later attempt's)
        if isinstance(exc, RaceFailure):
            ran_on, exc = exc.index, exc.error
        if not isinstance(exc, Exception):
            self.verdict = Verdict.RAISE
            return exc
        self.run_failed(index if ran_on is None else ran_on, exc)
        verdict = self.policy.verdict(retry_after_send=self.retry_after_send)
        budget = self._budget
        if verdict is Verdict.RETRY and budget is not None and self.policy.resends() and not budget.try_spend():
            verdict = Verdict.BUDGET
        self.verdict = verdict
        return exc

    def run_failed(self, index: int, exc: BaseException) -> None:
        """A run on replica ``index`` failed (a hedged read's other run may go on): counted,
        and it uses up its place in the schedule, as a failed attempt does (a cancelled run,
        not an ``Exception``, counts nothing)."""
        if isinstance(exc, Exception):
            self._policy = self.policy.increment(index, self._balancer.count_failure(index, exc))

    def hedge_candidate(self, running: set[int]) -> int | None:  # (a plan's, StatementPlan.of)
        return self.policy.hedge_candidate(running)

    def _attempt_steps(self, call: Callable[[int], Any]) -> Steps[Any]:
        """One attempt, for both runners: ``call(replica index)``, its end recorded (an attempt
        run through :mod:`clickhouse_lb.core.race` raises :class:`RaceFailure`: its error is raised)."""
        replayed = self._replayed  # the direct first attempt's error, for tenacity's first call
        if replayed is not None:
            self._replayed = None
            raise replayed
        index = self.begin()
        try:
            result = yield partial(call, index)
        except BaseException as exc:  # a cancelled attempt too must leave the in-flight count
            error = self.failed(index, exc)
            if error is exc:
                raise
        else:
            self.succeeded(index)
            return result
        raise error  # outside the handler: the race's wrapper is not chained to it

    def attempt(self, call: Callable[[int], T]) -> T:  # tenacity's function, sync
        return cast(T, drive(self._attempt_steps(call)))

    async def attempt_async(self, call: Callable[[int], Awaitable[T]]) -> T:  # async: ``call`` is awaited
        return cast(T, await drive_async(self._attempt_steps(call)))

    # -- tenacity's callbacks ---------------------------------------------------------------

    def goes_on(self) -> bool:
        """After a failed attempt: a retry, or the pool's own error (not the attempt's)."""
        verdict = self.verdict
        return verdict is Verdict.RETRY or verdict in STOPS

    def retry(self, retry_state: RetryCallState) -> bool:
        """Go on to ``stop`` (see :meth:`goes_on`); False: the attempt's outcome is the
        statement's (tenacity returns or raises it; :meth:`final_error` may translate an error)."""
        outcome = retry_state.outcome
        return outcome is not None and outcome.failed and self.goes_on()

    def stop(self, retry_state: RetryCallState) -> bool:
        return self.verdict in STOPS

    def wait(self, retry_state: RetryCallState) -> float:
        return self.policy.backoff()

    def announce(self, retry_state: RetryCallState) -> None:
        """tenacity's ``before_sleep``: the statement fails over (logged, and listeners hear of it)."""
        announce_failover(self.operation, self._balancer, self.policy)

    def give_up(self, retry_state: RetryCallState) -> Any:
        """tenacity's ``retry_error_callback``: the statement stopped with the pool's own error."""
        outcome = retry_state.outcome
        cause = outcome.exception() if outcome is not None else None
        raise self.stopped() from cause

    # -- the statement's end (worded by clickhouse_lb.core._statement_end) -------------------

    def final_error(self, exc: Exception) -> BaseException:
        """The error the statement raises for its last attempt's ``exc`` (itself, unless the
        attempt was a write that may have been applied)."""
        if self.verdict is not Verdict.UNCONFIRMED:
            return exc
        return unconfirmed_write(self.operation, self._balancer.addresses, self.policy, exc)

    def stopped(self) -> AllReplicasUnavailableError:
        """The error for a statement that stopped (:data:`~clickhouse_lb.core.policy.STOPS`)."""
        return stopped_error(self.operation, self._balancer.addresses, self.policy, self.verdict, write=self.write,
                             budget=self._budget)


def sync_policy() -> Retrying:
    """A sync pool's tenacity loop, built once; each statement gets a copy bound to its
    :class:`StatementAttempts` (as tenacity's own ``@retry`` copies per call)."""
    return Retrying(reraise=False)


def async_policy() -> AsyncRetrying:
    """The asyncio twin of :func:`sync_policy`."""
    return AsyncRetrying(reraise=False)


_SYNC_POLICY = sync_policy()
_ASYNC_POLICY = async_policy()


def _bound(loop: Any, attempts: StatementAttempts) -> Any:
    return loop.copy(stop=attempts.stop, wait=attempts.wait, retry=attempts.retry,
                     before_sleep=attempts.announce, retry_error_callback=attempts.give_up)


# The runners: the first attempt, as short as it can be; the rest is one body (_failing_over).

@runs_attempts
def run_sync(attempts: StatementAttempts, call: Callable[[int], T], policy: Retrying = _SYNC_POLICY) -> T:
    """Run ``call(replica_index)`` until it succeeds, per the statement's failover rules.
    clickhouse-connect's per-attempt transport warnings logged below this frame are the pool's
    to report (:mod:`clickhouse_lb.core._driver_logs` finds it on the stack: no mark to set)."""
    index = attempts.enter()
    failure: BaseException | None = None
    try:
        if index >= 0:  # the direct first attempt (see DIRECT_FIRST_ATTEMPT)
            return attempts.left(index, call(index))
    except BaseException as exc:
        failure = exc
    return cast(T, drive(_failing_over(attempts, index, failure, loop=policy, attempt=attempts.attempt, call=call)))


async def run_async(
    attempts: StatementAttempts, call: Callable[[int], Awaitable[T]], policy: AsyncRetrying = _ASYNC_POLICY
) -> T:
    """:func:`run_sync` on tenacity's AsyncRetrying. A cancelled attempt is not a replica
    failure: it counts nothing and cancels the statement. The statement is marked as the
    pool's with the context variable of :mod:`clickhouse_lb.core._driver_logs` (the async
    client logs from tasks of its own, which copy it but not this stack)."""
    token = enter_pool()
    try:
        index = attempts.enter()
        failure: BaseException | None = None
        try:
            if index >= 0:
                return attempts.left(index, await call(index))
        except BaseException as exc:
            failure = exc
        steps = _failing_over(attempts, index, failure, loop=policy, attempt=attempts.attempt_async, call=call)
        return cast(T, await drive_async(steps))
    finally:
        leave_pool(token)


def _failing_over(
    attempts: StatementAttempts, index: int, failure: BaseException | None, *, loop: Any,
    attempt: Callable[..., Any], call: Callable[[int], Any],
) -> Steps[Any]:
    """The statement after its first attempt on replica ``index`` failed with ``failure``
    (None: no direct first attempt, tenacity runs them all): one body for both runners. tenacity
    starts from that failure (its first call replays it), so
    every decision after it is tenacity's, exactly as without the direct first attempt."""
    try:
        if failure is not None:
            error = attempts.failed(index, failure)  # (a race's failure: its error, unwrapped)
            if not isinstance(error, Exception) or not attempts.goes_on():
                raise error
            attempts._replayed = error  # tenacity's first call raises it: see _attempt_steps
        return (yield partial(_bound(loop, attempts), attempt, call))
    except Exception as exc:
        error = attempts.final_error(exc)
        if error is exc:
            raise
        raise error from exc
