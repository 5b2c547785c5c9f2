"""One statement's attempts over the replicas: the first runs directly, tenacity drives the
failover after it (sync and async).

The attempts walk the plan in passes (r1, r2, r3, r1, r2, r3, ...), each replica at most
``connections_with_failover_max_tries`` times. After each failed attempt:

* a query failure (see :mod:`clickhouse_lb.core.classify`) is raised at once, unchanged;
* a replica failure counts an error against the replica at once (so that concurrent
  statements already route away), then the next attempt starts, unless the statement is
  not safe to repeat: a write whose request may have reached the server is retried only
  when it carries an ``insert_deduplication_token`` or ``settings={"idempotent": True}``;
  otherwise it raises :class:`~clickhouse_lb.errors.WriteOutcomeUnknownError` (also when
  the attempt was abandoned on a hung replica);
* when no attempt is left, one :class:`~clickhouse_lb.errors.AllReplicasUnavailableError`
  lists every replica with its last failure; when the statement's ``failover_timeout`` ran
  out, its subclass :class:`~clickhouse_lb.errors.StatementTimeoutError` does.

The deadline holds: each attempt is watched (:mod:`clickhouse_lb.core.race`,
:mod:`clickhouse_lb.pools._watchdog`), which stops waiting for it at the deadline (and closes its
connection), and the backoff is cut to it.

Between replicas there is no pause; between passes an optional exponential backoff with
full jitter (``failover_backoff_ms``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from tenacity import AsyncRetrying, RetryCallState, RetryError, Retrying

from clickhouse_lb.core._driver_logs import enter_pool, leave_pool
from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.classify import Failure
from clickhouse_lb.core.deadline import Deadline
from clickhouse_lb.core.events import FailoverEvent, logger
from clickhouse_lb.core.race import RaceFailure
from clickhouse_lb.errors import (
    AllReplicasUnavailableError,
    AttemptFailure,
    StatementTimeoutError,
    WriteOutcomeUnknownError,
)

__all__ = ["StatementAttempts", "async_policy", "run_async", "run_sync", "sync_policy"]

T = TypeVar("T")

_MAX_BACKOFF_SECONDS = 10.0

#: The deadline of every statement without a ``failover_timeout`` (it holds no state).
_NO_DEADLINE = Deadline(None)


class _Statement(Protocol):
    """What a statement's attempts ask of it, once one failed."""

    @property
    def write(self) -> bool: ...

    @property
    def retry_after_send(self) -> bool: ...


class StatementAttempts:
    """The failover state of one statement: its schedule, its failures, its decisions."""

    __slots__ = (
        "_attempt_started",
        "_balancer",
        "_load",
        "_retry_after_send",
        "_statement",
        "_write",
        "deadline",
        "failures",
        "operation",
        "order",
        "size",
        "started",
        "total",
    )

    def __init__(
        self,
        balancer: Balancer,
        order: Sequence[int],
        *,
        operation: str,
        retry_after_send: bool = True,
        write: bool = True,
        statement: _Statement | None = None,
    ) -> None:
        """``statement``: where ``write`` and ``retry_after_send`` come from instead (a
        :class:`~clickhouse_lb.core._statements.PreparedCall`: decided only when a failure asks)."""
        self._balancer = balancer
        self._load = balancer.state.replica_load
        self._attempt_started = 0.0
        tries = balancer.settings.connections_with_failover_max_tries
        self.size = len(order)
        # The schedule is the plan repeated ``tries`` times, computed (scheduled(n)), never
        # materialised: replicas x tries may be large.
        self.order = order
        self.total = self.size * tries
        self.operation = operation
        self._retry_after_send = retry_after_send
        self._write = write
        self._statement = statement
        self.failures: list[tuple[int, Failure]] = []
        self.started = time.monotonic()
        timeout = balancer.settings.failover_timeout
        self.deadline = _NO_DEADLINE if timeout is None else Deadline(timeout)

    @property
    def write(self) -> bool:
        """The statement may change data: a failure after sending may have applied it."""
        return self._write if self._statement is None else self._statement.write

    @property
    def retry_after_send(self) -> bool:
        """The statement may be repeated after its request was sent."""
        return self._retry_after_send if self._statement is None else self._statement.retry_after_send

    def scheduled(self, number: int) -> int:
        """The replica index of attempt ``number`` (0-based): the plan, pass after pass."""
        return self.order[number % self.size]

    def begin(self) -> int:
        """The replica index for the next attempt (every earlier attempt failed)."""
        number = len(self.failures)
        index = self.order[number % self.size]
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s: attempt %d on %s", self.operation, number + 1, self._balancer.addresses[index])
        # The attempt is in flight from here until succeeded()/failed() (one at a time).
        self._attempt_started = self._load.start(index)
        return index

    def succeeded(self, index: int) -> None:
        self._load.finish(index, self._attempt_started)
        self._balancer.record_success(index)

    def failed(self, index: int, exc: BaseException, *, ran_on: int | None = None) -> None:
        """Classify a failed attempt and, for a replica failure, count it at once. A cancelled
        or interrupted attempt (not an ``Exception``) only leaves the in-flight count.
        ``ran_on``: the replica the attempt's last run failed on, when a hedge took it elsewhere."""
        self._load.finish(index, self._attempt_started)
        if isinstance(exc, Exception):
            self.run_failed(index if ran_on is None else ran_on, exc)

    def run_failed(self, index: int, exc: Exception) -> None:
        """A run on replica ``index`` failed (a hedged read's other run may go on): counted,
        and it uses up its place in the schedule, as a failed attempt does."""
        self.failures.append((index, self._balancer.count_failure(index, exc)))

    def should_retry(self, exc: BaseException) -> bool:
        """tenacity's retry predicate: retry replica failures that are safe to repeat."""
        if not isinstance(exc, Exception) or not self.failures:
            return False  # cancellation, KeyboardInterrupt, or a failure we did not classify
        index, failure = self.failures[-1]
        if not failure.replica:
            return False
        if self.out_of_time():
            return True  # on to the stop: the statement ends with StatementTimeoutError
        if failure.sent and not self.retry_after_send:
            logger.warning(
                "%s on %s failed after the request was sent (%s); not retried: the write may "
                "have been applied (give inserts an insert_deduplication_token, other statements "
                "settings={'idempotent': True}, to make them retryable)",
                self.operation,
                self._balancer.addresses[index],
                failure.reason,
            )
            return False
        attempt = len(self.failures)
        if attempt < self.total:
            self._announce_failover(index, failure, attempt)
        return True

    def _announce_failover(self, index: int, failure: Failure, attempt: int) -> None:
        balancer = self._balancer
        address = balancer.addresses[index]
        next_address = balancer.addresses[self.scheduled(attempt)]
        # One WARNING per outage (this or the probes' "is down"); the rest of it at INFO.
        log = logger.warning if balancer.announce_outage(index) else logger.info
        log(
            "%s failed on replica %s (attempt %d/%d): %s; failing over to %s",
            self.operation,
            address,
            attempt,
            self.total,
            failure.reason,
            next_address,
        )
        if balancer.listeners:
            balancer.listeners.failover(FailoverEvent(self.operation, address, attempt, failure.reason, next_address))

    def wait(self, retry_state: RetryCallState) -> float:
        """No pause between replicas; backoff with full jitter before each new pass."""
        base_ms = self._balancer.settings.failover_backoff_ms
        done = len(self.failures)
        if not base_ms or done % self.size:
            return 0.0
        pass_number = done // self.size
        ceiling = min(_MAX_BACKOFF_SECONDS, base_ms / 1000.0 * 2 ** (pass_number - 1))
        return self.deadline.cut_sleep(random.uniform(0.0, ceiling))

    def remaining(self) -> int:
        return self.total - len(self.failures)

    def out_of_time(self) -> bool:
        """Past the statement's ``failover_timeout`` (counted from its first attempt)."""
        return self.deadline.expired

    def hedge_candidate(self, running: set[int]) -> int | None:
        """The replica a hedged read goes to: the next one of the schedule not already running."""
        for number in range(len(self.failures) + 1, self.total):
            index = self.scheduled(number)
            if index not in running:
                return index
        return None

    def unconfirmed_write(self, exc: BaseException) -> WriteOutcomeUnknownError | None:
        """The error for a write given up because its request was sent (None otherwise)."""
        if not self.failures or not isinstance(exc, Exception):
            return None
        index, failure = self.failures[-1]
        if not (failure.replica and failure.sent and not self.retry_after_send):
            return None
        error = WriteOutcomeUnknownError(self.operation, self._balancer.addresses[index], failure.reason)
        error.__cause__ = exc
        return error

    def exhausted(self) -> AllReplicasUnavailableError:
        """The error for a statement whose every attempt failed on a replica."""
        addresses = self._balancer.addresses
        last: dict[str, str | None] = dict.fromkeys(addresses)
        attempts = []
        for number, (index, failure) in enumerate(self.failures, 1):
            last[addresses[index]] = failure.reason
            attempts.append(AttemptFailure(addresses[index], number, failure.reason))
        logger.error("%s failed on every replica: %s", self.operation, "; ".join(map(str, attempts[-self.size :])))
        sent = any(failure.sent for _, failure in self.failures)
        may_have_been_applied = self.write and sent
        if self.deadline.seconds is not None and self.out_of_time():
            return StatementTimeoutError(
                attempts, last, timeout=self.deadline.seconds,
                may_have_been_applied=may_have_been_applied, write=self.write, operation=self.operation,
            )
        return AllReplicasUnavailableError(
            attempts, last, may_have_been_applied=may_have_been_applied, write=self.write, operation=self.operation
        )


# tenacity's stop, wait and retry callbacks: the statement's StatementAttempts is the first
# argument of the call tenacity drives (``policy(_attempt, attempts, call)``), so one policy
# object serves every statement of a pool.


def _attempts_of(retry_state: RetryCallState) -> StatementAttempts:
    attempts = retry_state.args[0]
    assert isinstance(attempts, StatementAttempts)
    return attempts


def _stop(retry_state: RetryCallState) -> bool:
    """After the schedule's last attempt, or at the statement's deadline."""
    attempts = _attempts_of(retry_state)
    return attempts.remaining() == 0 or attempts.out_of_time()


def _wait(retry_state: RetryCallState) -> float:
    return _attempts_of(retry_state).wait(retry_state)


def _retry(retry_state: RetryCallState) -> bool:
    outcome = retry_state.outcome
    if outcome is None or not outcome.failed:
        return False
    exc = outcome.exception()
    return exc is not None and _attempts_of(retry_state).should_retry(exc)


def sync_policy() -> Retrying:
    """The failover policy of a sync pool: built once, copied per statement that fails over
    (as tenacity's own ``@retry`` does per call)."""
    return Retrying(stop=_stop, wait=_wait, retry=_retry, reraise=False)


def async_policy() -> AsyncRetrying:
    """The asyncio twin of :func:`sync_policy`."""
    return AsyncRetrying(stop=_stop, wait=_wait, retry=_retry, reraise=False)


_SYNC_POLICY = sync_policy()
_ASYNC_POLICY = async_policy()


def _first_attempt_failed(attempts: StatementAttempts, index: int, exc: BaseException) -> None:
    """Decide after a failed first attempt: raise, give up, or let tenacity go on."""
    ran_on, error = _unwrap(exc)
    attempts.failed(index, error, ran_on=ran_on)
    if not attempts.should_retry(error):
        unconfirmed = attempts.unconfirmed_write(error)
        if unconfirmed is not None:
            raise unconfirmed from error
        if error is not exc:  # not chained to the race's wrapper (we are inside its handler)
            raise error from error.__cause__
        raise error
    if attempts.remaining() == 0 or attempts.out_of_time():
        raise attempts.exhausted() from error


def _unwrap(exc: BaseException) -> tuple[int | None, BaseException]:
    """An attempt run through :mod:`clickhouse_lb.core.race` names the replica its last run failed
    on (a hedge may have run elsewhere): ``(that replica or None, the error)``."""
    if isinstance(exc, RaceFailure):
        return exc.index, exc.error
    return None, exc


def _attempt(attempts: StatementAttempts, call: Callable[[int], T]) -> T:
    index = attempts.begin()
    try:
        result = call(index)
    except BaseException as exc:
        ran_on, error = _unwrap(exc)
        attempts.failed(index, error, ran_on=ran_on)
        if error is exc:
            raise
    else:
        attempts.succeeded(index)
        return result
    raise error  # outside the handler: the race's wrapper is not chained to it


async def _async_attempt(attempts: StatementAttempts, call: Callable[[int], Awaitable[T]]) -> T:
    index = attempts.begin()
    try:
        result = await call(index)
    except BaseException as exc:
        ran_on, error = _unwrap(exc)
        attempts.failed(index, error, ran_on=ran_on)
        if error is exc:
            raise
    else:
        attempts.succeeded(index)
        return result
    raise error  # outside the handler: the race's wrapper is not chained to it


def run_sync(attempts: StatementAttempts, call: Callable[[int], T], policy: Retrying = _SYNC_POLICY) -> T:
    """Run ``call(replica_index)`` until it succeeds, per the statement's failover rules.

    The first attempt runs directly (the common case: it succeeds, and tenacity's per-call
    bookkeeping would cost as much as the statement's own client work); once it fails,
    ``policy`` (:func:`sync_policy`) drives the remaining attempts. clickhouse-connect's
    per-attempt transport warnings are the pool's to report meanwhile
    (:mod:`clickhouse_lb.core._driver_logs`)."""
    token = enter_pool()
    try:
        return _run_sync(attempts, call, policy)
    finally:
        leave_pool(token)


def _run_sync(attempts: StatementAttempts, call: Callable[[int], T], policy: Retrying) -> T:
    index = attempts.begin()
    try:
        result = call(index)
    except BaseException as exc:  # a cancelled attempt too must leave the in-flight count
        _first_attempt_failed(attempts, index, exc)
    else:
        attempts.succeeded(index)
        return result
    try:
        retried: T = policy.copy()(_attempt, attempts, call)
        return retried
    except RetryError as exc:
        raise attempts.exhausted() from exc.last_attempt.exception()
    except Exception as exc:
        unconfirmed = attempts.unconfirmed_write(exc)
        if unconfirmed is None:
            raise
        raise unconfirmed from exc


async def run_async(
    attempts: StatementAttempts, call: Callable[[int], Awaitable[T]], policy: AsyncRetrying = _ASYNC_POLICY
) -> T:
    """The asyncio twin of :func:`run_sync` (tenacity's AsyncRetrying). A cancelled attempt
    is not a replica failure: it counts nothing and cancels the statement."""
    token = enter_pool()
    try:
        return await _run_async(attempts, call, policy)
    finally:
        leave_pool(token)


async def _run_async(attempts: StatementAttempts, call: Callable[[int], Awaitable[T]], policy: AsyncRetrying) -> T:
    index = attempts.begin()
    try:
        result = await call(index)
    except BaseException as exc:  # a cancelled attempt too must leave the in-flight count
        _first_attempt_failed(attempts, index, exc)
    else:
        attempts.succeeded(index)
        return result
    try:
        retried: T = await policy.copy()(_async_attempt, attempts, call)
        return retried
    except RetryError as exc:
        raise attempts.exhausted() from exc.last_attempt.exception()
    except Exception as exc:
        unconfirmed = attempts.unconfirmed_write(exc)
        if unconfirmed is None:
            raise
        raise unconfirmed from exc
