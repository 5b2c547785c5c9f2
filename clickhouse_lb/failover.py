"""One statement's attempts over the replicas: the first runs directly, tenacity drives the
failover after it (sync and async).

The attempts walk the plan in passes (r1, r2, r3, r1, r2, r3, ...), each replica at most
``connections_with_failover_max_tries`` times. After each failed attempt:

* a query failure (see :mod:`clickhouse_lb.classify`) is raised at once, unchanged;
* a replica failure counts an error against the replica at once (so that concurrent
  statements already route away), then the next attempt starts, unless the statement is
  not safe to repeat: a write whose request may have reached the server is retried only
  when it carries an ``insert_deduplication_token``;
* when no attempt is left, or the total ``failover_timeout`` ran out, one
  :class:`~clickhouse_lb.errors.AllReplicasUnavailableError` lists every replica with its
  last failure.

Between replicas there is no pause; between passes an optional exponential backoff with
full jitter (``failover_backoff_ms``).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
)
from tenacity.stop import stop_base

from ._driver_logs import handled_by_pool
from .balancer import Balancer
from .classify import Failure, classify
from .errors import AllReplicasUnavailableError, AttemptFailure
from .events import FailoverEvent, logger

__all__ = ["StatementAttempts", "is_read_only", "run_async", "run_sync"]

T = TypeVar("T")

_LEADING_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$)|/\*.*?\*/|\()*", re.DOTALL)
_READ_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "VALUES"})
_MAX_BACKOFF_SECONDS = 10.0


def is_read_only(sql: str | bytes | None) -> bool:
    """Whether a statement only reads (so repeating it elsewhere is harmless)."""
    if sql is None:
        return False
    if isinstance(sql, (bytes, bytearray)):
        sql = bytes(sql[:4096]).decode("utf-8", "replace")
    start = _LEADING_NOISE.match(sql)
    rest = sql[start.end() if start else 0 :]
    word = rest[:8].split(None, 1)[0] if rest.strip() else ""
    return re.sub(r"[^A-Za-z].*", "", word).upper() in _READ_KEYWORDS


class StatementAttempts:
    """The failover state of one statement: its schedule, its failures, its decisions."""

    __slots__ = ("_balancer", "failures", "operation", "retry_after_send", "schedule", "size", "started")

    def __init__(
        self,
        balancer: Balancer,
        order: Sequence[int],
        *,
        operation: str,
        retry_after_send: bool,
    ) -> None:
        self._balancer = balancer
        tries = balancer.settings.connections_with_failover_max_tries
        self.size = len(order)
        self.schedule: list[int] = list(order) * tries
        self.operation = operation
        self.retry_after_send = retry_after_send
        self.failures: list[tuple[int, Failure]] = []
        self.started = time.monotonic()

    def begin(self) -> int:
        """The replica index for the next attempt (every earlier attempt failed)."""
        number = len(self.failures)
        index = self.schedule[number]
        logger.debug("%s: attempt %d on %s", self.operation, number + 1, self._balancer.addresses[index])
        return index

    def succeeded(self, index: int) -> None:
        self._balancer.record_success(index)

    def failed(self, index: int, exc: BaseException) -> None:
        """Classify a failed attempt and, for a replica failure, count it at once."""
        failure = classify(exc)
        self.failures.append((index, failure))
        if failure.replica:
            self._balancer.record_failure(index, failure)

    def should_retry(self, exc: BaseException) -> bool:
        """tenacity's retry predicate: retry replica failures that are safe to repeat."""
        if not isinstance(exc, Exception) or not self.failures:
            return False  # cancellation, KeyboardInterrupt, or a failure we did not classify
        index, failure = self.failures[-1]
        if not failure.replica:
            return False
        if failure.sent and not self.retry_after_send:
            logger.warning(
                "%s on %s failed after the request was sent (%s); not retried: the write may "
                "have been applied (give inserts an insert_deduplication_token to make them retryable)",
                self.operation,
                self._balancer.addresses[index],
                failure.reason,
            )
            return False
        attempt = len(self.failures)
        if attempt < len(self.schedule):
            self._announce_failover(index, failure, attempt)
        return True

    def _announce_failover(self, index: int, failure: Failure, attempt: int) -> None:
        balancer = self._balancer
        address = balancer.addresses[index]
        next_address = balancer.addresses[self.schedule[attempt]]
        logger.warning(
            "%s failed on replica %s (attempt %d/%d): %s; failing over to %s",
            self.operation,
            address,
            attempt,
            len(self.schedule),
            failure.reason,
            next_address,
        )
        if balancer.listeners:
            balancer.listeners.emit(
                "on_failover", FailoverEvent(self.operation, address, attempt, failure.reason, next_address)
            )

    def wait(self, retry_state: RetryCallState) -> float:
        """No pause between replicas; backoff with full jitter before each new pass."""
        base_ms = self._balancer.settings.failover_backoff_ms
        done = len(self.failures)
        if not base_ms or done % self.size:
            return 0.0
        pass_number = done // self.size
        ceiling = min(_MAX_BACKOFF_SECONDS, base_ms / 1000.0 * 2 ** (pass_number - 1))
        return random.uniform(0.0, ceiling)

    def stop(self) -> stop_base:
        """After the schedule's last attempt, or at the statement's deadline (counted from its
        first attempt, which ran before tenacity took over)."""
        stop: stop_base = stop_after_attempt(len(self.schedule) - len(self.failures))
        timeout = self._balancer.settings.failover_timeout
        if timeout is not None:
            stop = stop | _StopAtDeadline(self.started + timeout)
        return stop

    def remaining(self) -> int:
        return len(self.schedule) - len(self.failures)

    def tenacity_options(self) -> dict[str, Any]:
        return {
            "stop": self.stop(),
            "wait": self.wait,
            "retry": retry_if_exception(self.should_retry),
            "reraise": False,
        }

    def exhausted(self) -> AllReplicasUnavailableError:
        """The error for a statement whose every attempt failed on a replica."""
        addresses = self._balancer.addresses
        last: dict[str, str | None] = dict.fromkeys(addresses)
        attempts = []
        for number, (index, failure) in enumerate(self.failures, 1):
            last[addresses[index]] = failure.reason
            attempts.append(AttemptFailure(addresses[index], number, failure.reason))
        logger.error("%s failed on every replica: %s", self.operation, "; ".join(map(str, attempts[-self.size :])))
        return AllReplicasUnavailableError(attempts, last)


class _StopAtDeadline(stop_base):
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return time.monotonic() >= self.deadline


def _first_attempt_failed(attempts: StatementAttempts, index: int, exc: Exception) -> None:
    """Decide after a failed first attempt: raise, give up, or let tenacity go on."""
    attempts.failed(index, exc)
    if not attempts.should_retry(exc):
        raise exc
    if attempts.remaining() == 0:
        raise attempts.exhausted() from exc


def run_sync(attempts: StatementAttempts, call: Callable[[int], T]) -> T:
    """Run ``call(replica_index)`` until it succeeds, per the statement's failover rules.

    The first attempt runs directly (the common case: it succeeds, and tenacity's per-call
    bookkeeping would cost as much as the statement's own client work); once it fails,
    tenacity drives the remaining attempts. clickhouse-connect's per-attempt transport warnings
    are the pool's to report meanwhile (:mod:`clickhouse_lb._driver_logs`)."""
    with handled_by_pool():
        return _run_sync(attempts, call)


def _run_sync(attempts: StatementAttempts, call: Callable[[int], T]) -> T:
    index = attempts.begin()
    try:
        result = call(index)
    except Exception as exc:
        _first_attempt_failed(attempts, index, exc)
    else:
        attempts.succeeded(index)
        return result
    try:
        for attempt in Retrying(**attempts.tenacity_options()):
            with attempt:
                index = attempts.begin()
                try:
                    result = call(index)
                except Exception as exc:
                    attempts.failed(index, exc)
                    raise
                attempts.succeeded(index)
                return result
    except RetryError as exc:
        raise attempts.exhausted() from exc.last_attempt.exception()
    raise AssertionError("unreachable: tenacity ended without an outcome")  # pragma: no cover


async def run_async(attempts: StatementAttempts, call: Callable[[int], Awaitable[T]]) -> T:
    """The asyncio twin of :func:`run_sync` (tenacity's AsyncRetrying). A cancelled attempt
    is not a replica failure: it counts nothing and cancels the statement."""
    with handled_by_pool():
        return await _run_async(attempts, call)


async def _run_async(attempts: StatementAttempts, call: Callable[[int], Awaitable[T]]) -> T:
    index = attempts.begin()
    try:
        result = await call(index)
    except Exception as exc:
        _first_attempt_failed(attempts, index, exc)
    else:
        attempts.succeeded(index)
        return result
    try:
        async for attempt in AsyncRetrying(**attempts.tenacity_options()):
            with attempt:
                index = attempts.begin()
                try:
                    result = await call(index)
                except Exception as exc:
                    attempts.failed(index, exc)
                    raise
                attempts.succeeded(index)
                return result
    except RetryError as exc:
        raise attempts.exhausted() from exc.last_attempt.exception()
    raise AssertionError("unreachable: tenacity ended without an outcome")  # pragma: no cover
