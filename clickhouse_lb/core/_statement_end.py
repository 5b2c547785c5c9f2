"""How a statement's failover and end are worded (no I/O but logging and listeners): the
failover line and event, the error of a write that may have been applied, and the error of a
statement that stopped. :class:`~clickhouse_lb.core.failover.StatementAttempts` decides when;
this module says it, from the statement's :class:`~clickhouse_lb.core.policy.FailoverPolicy`."""

from __future__ import annotations

from collections.abc import Sequence

from clickhouse_lb.core.balancer import Balancer
from clickhouse_lb.core.events import FailoverEvent, logger
from clickhouse_lb.core.policy import FailoverPolicy, Verdict
from clickhouse_lb.core.retry_budget import RetryBudget
from clickhouse_lb.errors import (
    AllReplicasUnavailableError,
    AttemptFailure,
    RetryBudgetExhaustedError,
    StatementTimeoutError,
    WriteOutcomeUnknownError,
)

__all__ = ["announce_failover", "stopped_error", "unconfirmed_write"]


def announce_failover(operation: str, balancer: Balancer, policy: FailoverPolicy) -> None:
    """The statement fails over (one WARNING per outage, this or the probes' "is down"; the rest
    of it at INFO) and listeners hear of it."""
    last = policy.last
    assert last is not None
    address = balancer.addresses[last.replica]
    attempt = len(policy.history)
    next_address = balancer.addresses[policy.next_index()]
    log = logger.warning if balancer.announce_outage(last.replica) else logger.info
    log("%s failed on replica %s (attempt %d/%d): %s; failing over to %s",
        operation, address, attempt, policy.total, last.failure.reason, next_address)
    if balancer.listeners:
        balancer.listeners.failover(FailoverEvent(operation, address, attempt, last.failure.reason, next_address))


def unconfirmed_write(
    operation: str, addresses: Sequence[str], policy: FailoverPolicy, exc: Exception
) -> WriteOutcomeUnknownError:
    """The error of a write whose last attempt failed after its request was sent (not repeated)."""
    last = policy.last
    assert last is not None
    address = addresses[last.replica]
    logger.warning(
        "%s on %s failed after the request was sent (%s); not retried: the write may have been applied "
        "(give inserts an insert_deduplication_token, other statements settings={'idempotent': True}, "
        "to make them retryable)", operation, address, last.failure.reason,
    )
    error = WriteOutcomeUnknownError(operation, address, last.failure.reason)
    error.__cause__ = exc
    return error


def stopped_error(
    operation: str, addresses: Sequence[str], policy: FailoverPolicy, verdict: Verdict | None, *, write: bool,
    budget: RetryBudget | None,
) -> AllReplicasUnavailableError:
    """The error of a statement that stopped (:data:`~clickhouse_lb.core.policy.STOPS`), logged."""
    last: dict[str, str | None] = dict.fromkeys(addresses)
    attempts = []
    for number, (index, failure) in enumerate(policy.history, 1):
        last[addresses[index]] = failure.reason
        attempts.append(AttemptFailure(addresses[index], number, failure.reason))
    shown = "; ".join(map(str, attempts[-len(policy.order):]))
    may_have_been_applied = write and policy.sent_any()
    if verdict is Verdict.TIMEOUT and policy.deadline.seconds is not None:
        logger.error("%s failed on every replica: %s", operation, shown)
        return StatementTimeoutError(attempts, last, timeout=policy.deadline.seconds,
                                     may_have_been_applied=may_have_been_applied, write=write, operation=operation)
    if verdict is Verdict.BUDGET:
        spent = repr(budget)
        logger.error("%s not sent again, the retry budget is spent (%s): %s", operation, spent, shown)
        return RetryBudgetExhaustedError(attempts, last, budget=spent,
                                         may_have_been_applied=may_have_been_applied, write=write,
                                         operation=operation)
    logger.error("%s failed on every replica: %s", operation, shown)
    return AllReplicasUnavailableError(attempts, last, may_have_been_applied=may_have_been_applied, write=write,
                                       operation=operation)
