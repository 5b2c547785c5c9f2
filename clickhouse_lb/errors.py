"""The exceptions clickhouse-lb raises.

Every one derives from clickhouse-connect's own hierarchy, so an application's existing
``except clickhouse_connect.driver.exceptions.Error`` (or ``DatabaseError``/``OperationalError``)
clauses keep working when a single client is swapped for a pool. The server's own query
errors (syntax, unknown table, ``throwIf`` ...) are never wrapped: they reach the caller
unchanged, exactly as clickhouse-connect raised them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from clickhouse_connect.driver.exceptions import NotSupportedError, OperationalError, ProgrammingError

from clickhouse_lb._part_outcome import may_have_been_applied, part_line
from clickhouse_lb._redact import brief, redact

if TYPE_CHECKING:  # typing.Unpack is Python 3.11's; the annotations are never evaluated
    from typing_extensions import Unpack

__all__ = [
    "AllReplicasStaleError",
    "AllReplicasUnavailableError",
    "AttemptAbandonedError",
    "AttemptFailure",
    "ConfigurationError",
    "PoolMemberError",
    "ReadYourWritesError",
    "ReplicaConnectError",
    "RetryBudgetExhaustedError",
    "SessionLostError",
    "ShardedInsertError",
    "StatementTimeoutError",
    "WriteOutcomeUnknownError",
    "did_you_mean",
]

#: Where every setting and option is listed (unknown-name errors point there).
CONFIGURATION_REFERENCE = "https://github.com/clickhouse-lb/clickhouse-lb/blob/main/docs/configuration.md"

#: The operation of the check ``get_pool`` makes at creation (``pool.connect()``).
CREATION_CHECK = "connect"

_MAY_HAVE_BEEN_APPLIED = (
    "The write may have been applied: its request reached a replica before the failure. Check before "
    "repeating it, or make it repeatable (inserts: insert_deduplication_token; other statements: "
    "settings={'idempotent': True})."
)


def did_you_mean(value: object, choices: Iterable[str]) -> str:
    """`` (did you mean 'round_robin'?)`` for a misspelt value of a closed set, else ``""``.

    For the messages that name a bad value and list the valid ones: the closest choices
    (difflib, case-insensitive), at most three, so a typo is fixed at a glance."""
    if not isinstance(value, str) or not value.strip():
        return ""
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(value.strip().lower(), list(by_lower), n=3, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(by_lower[c]) for c in close)}?)"


_E = TypeVar("_E", bound="_Remade")


def _remade(cls: type[BaseException], args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseException:
    return cls(*args, **kwargs)


class _Remade(Exception):
    """An error made again from its constructor's arguments when unpickled (``multiprocessing``,
    process pools, task queues): ``BaseException`` pickles ``args``, the message here, which
    these constructors do not take, so such an error could not cross a process boundary."""

    _made_with: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls: type[_E], *args: Any, **kwargs: Any) -> _E:
        error = super().__new__(cls, *args)
        error._made_with = (args, kwargs)
        return error

    def __reduce__(self) -> tuple[Any, ...]:
        args, kwargs = self._made_with
        return _remade, (type(self), args, kwargs), self.__dict__


class ConfigurationError(ProgrammingError, ValueError):
    """Bad pool configuration: raised at ``get_pool``/``create_engine``, before any I/O.

    The message names the bad value and, where there is a closed set, the valid choices.
    It is also a ``ValueError`` so generic argument validation code catches it. The message
    always goes through :func:`clickhouse_lb._redact.redact`: it quotes what the user wrote,
    which may hold a password.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(redact(str(message)))


@dataclass(frozen=True)
class AttemptFailure:
    """One failed attempt of a statement: which replica, which try, and why."""

    address: str
    attempt: int
    error: str

    def __str__(self) -> str:
        return f"{self.address} (attempt {self.attempt}): {self.error}"


def _count(number: int, what: str) -> str:
    return f"{number} {what}{'s' if number != 1 else ''}"


def _per_replica(last_errors: dict[str, str | None]) -> str:
    return "\n".join(
        f"  {address}: {brief(error) if error is not None else 'not tried'}" for address, error in last_errors.items()
    )


class _StatementOutcome(TypedDict, total=False):
    """The keywords every :class:`AllReplicasUnavailableError` takes besides what failed (its
    subclasses add their own and pass these on): whether the statement was a write, whether its
    request may have been applied, and the client method (``operation``)."""

    may_have_been_applied: bool
    write: bool
    operation: str | None


class AllReplicasUnavailableError(_Remade, OperationalError):
    """Every attempt of one statement failed with a replica failure.

    ``failures`` lists each attempt in order; ``last_errors`` maps every replica of the pool to
    the last failure seen for it (``None`` for a replica this statement did not reach, for
    example because the total failover timeout ran out first). ``operation``: what failed
    (``"connect"`` for the check ``get_pool`` makes at creation, else the client method).
    """

    def __init__(
        self,
        failures: Sequence[AttemptFailure],
        last_errors: dict[str, str | None],
        *,
        may_have_been_applied: bool = False,
        write: bool = False,
        operation: str | None = None,
    ) -> None:
        self.failures = list(failures)
        self.last_errors = dict(last_errors)
        self.operation = operation
        #: For a write: True when some attempt's request reached a replica before it failed
        #: (the write may have been applied there); False: no replica received it. Always
        #: False for a read.
        self.may_have_been_applied = may_have_been_applied
        super().__init__(self._head() + _per_replica(self.last_errors) + _write_outcome(write, may_have_been_applied))

    def _head(self) -> str:
        """The message's first line(s), before the last error per replica."""
        attempts = _count(len(self.failures), "attempt")
        if self.operation == CREATION_CHECK:
            return (
                f"The pool's creation check failed: none of its {len(self.last_errors)} replicas answered "
                f"({attempts}; get_pool checks that one does, as clickhouse_connect.get_client does; "
                "connect_on_create=False skips the check). Last error per replica:\n"
            )
        return f"All {len(self.last_errors)} replicas are unavailable ({attempts} failed); last error per replica:\n"


class StatementTimeoutError(AllReplicasUnavailableError):
    """The statement's ``failover_timeout`` ran out before any attempt succeeded.

    Like its base class it names what each replica did (``failures``, ``last_errors``); the
    attempt cut at the deadline is among them. ``timeout`` is the deadline in seconds;
    ``may_have_been_applied`` is True for a write whose request had reached a replica (the
    pool did not repeat it elsewhere: give inserts an ``insert_deduplication_token``).
    """

    def __init__(
        self,
        failures: Sequence[AttemptFailure],
        last_errors: dict[str, str | None],
        *,
        timeout: float,
        **outcome: Unpack[_StatementOutcome],
    ) -> None:
        self.timeout = timeout
        if outcome.get("may_have_been_applied"):
            outcome["write"] = True  # only a write may have been applied
        super().__init__(failures, last_errors, **outcome)

    def _head(self) -> str:
        what = "The pool's creation check" if self.operation == CREATION_CHECK else "Statement"
        return (
            f"{what} timed out: failover_timeout={self.timeout:g}s ran out after "
            f"{_count(len(self.failures), 'attempt')}. Last error per replica:\n"
        )


class RetryBudgetExhaustedError(AllReplicasUnavailableError):
    """A failover that would have sent the statement again was refused: the pool's retry budget
    (``retry_budget_ratio``, ``retry_budget_min_per_second``, ``retry_budget_window_ms``) is
    spent, because many statements needed extra requests lately (every replica slow or
    failing). Like its base class it names what each replica did."""

    def __init__(
        self,
        failures: Sequence[AttemptFailure],
        last_errors: dict[str, str | None],
        *,
        budget: str,
        **outcome: Unpack[_StatementOutcome],
    ) -> None:
        #: The budget's settings, as text.
        self.budget = budget
        super().__init__(failures, last_errors, **outcome)

    def _head(self) -> str:
        return (
            f"Retry budget spent ({self.budget}): after {_count(len(self.failures), 'failed attempt')} the pool "
            "did not send the statement again. Raise retry_budget_ratio or retry_budget_min_per_second if the "
            "replicas can take the extra load (retry_budget_window_ms=0 turns the budget off). Last error per "
            "replica:\n"
        )


class AttemptAbandonedError(_Remade, OperationalError):
    """The pool stopped waiting for one attempt's answer and closed its connection.

    ``kind`` says why: ``"hung"`` (the replica did not answer ``/ping`` while the attempt
    waited: a stopped process, a black hole), ``"receive_timeout"`` (no answer within the
    attempt's receive timeout), ``"deadline"`` (the statement's ``failover_timeout`` ran out),
    ``"hedged"`` (another replica answered the same read first). The request had been sent,
    so a write may have been applied: the message says so when the statement was a write.
    A replica failure for failover (except ``"hedged"``, which counts a slowdown instead).
    """

    def __init__(self, address: str, kind: str, detail: str, *, write: bool = False) -> None:
        self.address = address
        self.kind = kind
        self.reason = f"{kind}: {detail}"
        self.write = write
        #: True when the abandoned attempt was a write: its request had been sent.
        self.may_have_been_applied = write
        applied = "; " + _MAY_HAVE_BEEN_APPLIED if write else ""
        super().__init__(f"Attempt on replica {address} abandoned ({detail}){applied}")


def _write_outcome(write: bool, may_have_been_applied: bool) -> str:
    if not write:
        return ""
    if may_have_been_applied:
        return "\n" + _MAY_HAVE_BEEN_APPLIED
    return "\nThe write was not applied: no replica received it."


class WriteOutcomeUnknownError(_Remade, OperationalError):
    """A write failed on a replica after its request was sent, and was not retried elsewhere
    (it is not repeatable: no ``insert_deduplication_token``, not declared idempotent). It may
    have been applied: ``may_have_been_applied`` is always True. ``address`` is the replica,
    ``reason`` the failure (redacted); the original exception is ``__cause__``."""

    may_have_been_applied = True

    def __init__(self, operation: str, address: str, reason: str) -> None:
        self.operation = operation
        self.address = address
        self.reason = reason
        super().__init__(f"{operation} failed on replica {address} after its request was sent ({reason}). "
                         + _MAY_HAVE_BEEN_APPLIED)


class SessionLostError(_Remade, OperationalError):
    """The replica behind a pinned session failed; the session's state is gone with it.

    Raised instead of moving the session to another replica, where its temporary tables and
    ``SET`` settings would silently be missing. Open a new ``pool.session()`` to continue.
    ``reason`` is the failure, already redacted; the original exception is ``__cause__``.
    """

    def __init__(
        self, address: str, reason: str, *, may_have_been_applied: bool = False, session_id: str | None = None,
    ) -> None:
        self.address = address
        self.reason = reason
        #: True when the failed statement was a write whose request reached the replica.
        self.may_have_been_applied = may_have_been_applied
        #: The session named by the statement's ``settings={"session_id": ...}`` (None: a
        #: pinned session, ``pool.session()`` or a pool given ``session_id=``).
        self.session_id = session_id
        if session_id is None:
            told = (f"Session lost: replica {address} failed during a pinned session ({reason}); "
                    "its temporary tables and SET settings are gone. Open a new pool.session() to continue.")
        else:
            told = (f"Session lost: replica {address}, where session_id {session_id!r} lives, failed ({reason}); "
                    "its temporary tables and SET settings are gone. The next statement with that session_id "
                    "starts the session afresh, on the replica the strategy picks.")
        super().__init__(told + (" " + _MAY_HAVE_BEEN_APPLIED if may_have_been_applied else ""))


class ReplicaConnectError(_Remade, OperationalError):
    """Creating a replica's client failed with a replica failure (the client talks to the
    server while it is created), so the statement was never sent there: failover treats it as
    safe to retry, even for a write. Threads or tasks that waited for that same creation share
    this outcome instead of each waiting out the same timeout again. ``__cause__`` is the
    original failure; ``reason`` its redacted description; ``kind`` its failure kind (a server
    error at creation is not a refused connection)."""

    def __init__(self, address: str, reason: str, kind: str = "connect") -> None:
        self.address = address
        self.reason = reason
        self.kind = kind
        super().__init__(f"Could not connect to replica {address}: {reason}")


class AllReplicasStaleError(_Remade, OperationalError):
    """Every replica lags at least ``max_replica_delay_for_distributed_queries`` seconds and
    ``fallback_to_stale_replicas_for_distributed_queries`` is 0 (the server's
    ``ALL_REPLICAS_ARE_STALE``, code 369). ``delays`` maps each replica to its delay in seconds."""

    def __init__(self, delays: dict[str, float | None], max_delay: float) -> None:
        self.delays = dict(delays)
        self.max_delay = max_delay
        shown = ", ".join(f"{address}: {delay:g} s" for address, delay in self.delays.items() if delay is not None)
        super().__init__(
            f"All replicas are stale: every one lags at least max_replica_delay_for_distributed_queries="
            f"{max_delay:g} s ({shown}). Set fallback_to_stale_replicas_for_distributed_queries=1 to read "
            "from the least stale one, or raise the limit."
        )
        self.code = 369  # after the base class, which may set its own


class PoolMemberError(_Remade, NotSupportedError, AttributeError):
    """A clickhouse-connect Client member used on a pool in a way that has no pool meaning
    (assigning ``pool.server_version``: a fact the replicas report), or read before the pool
    has anything to answer it with (``pool.server_version`` before any replica answered, with
    ``connect_on_create=False``). The message says what to use instead.

    A DB-API ``NotSupportedError`` and also an ``AttributeError``: generic introspection
    (``hasattr``, ``getattr(pool, name, default)``, ``inspect.getmembers``, debuggers, IPython
    completion) treats such a member as absent instead of failing, as it would on any object
    whose attribute cannot be read."""


class ShardedInsertError(_Remade, OperationalError):
    """A routed insert (``sharded.insert(..., sharding_key=...)``) wrote some of its parts and
    not others. ``written`` maps each shard number whose part was acknowledged to its row
    count; ``failed`` maps each shard number whose part failed to that failure (each one's
    ``may_have_been_applied`` says whether the part may be there anyway). Repeating the whole
    insert with the same ``insert_deduplication_token`` setting writes only what is missing:
    every part's token is derived from it, so the written parts are deduplicated."""

    def __init__(self, table: str, written: dict[int, int], failed: dict[int, Exception], rows: dict[int, int]) -> None:
        self.table = table
        self.written = dict(written)
        self.failed = dict(failed)
        #: True when some failed part may have been applied (its request may have reached a replica).
        self.may_have_been_applied = any(map(may_have_been_applied, failed.values()))
        done = ", ".join(f"shard {n}: {count} rows" for n, count in sorted(written.items())) or "none"
        lines = [part_line(n, rows[n], e) for n, e in sorted(failed.items())]
        super().__init__(
            f"Insert into {table}: {len(failed)} of {len(failed) + len(written)} shard parts failed; "
            f"written: {done}; failed:\n" + "\n".join(lines)
            + "\nRepeat the insert with the same insert_deduplication_token to write only what is missing."
        )


class ReadYourWritesError(_Remade, OperationalError):
    """A read under ``read_your_writes`` could not be served by a replica known to have this
    thread's or task's recent write: the replica that acknowledged it (``writer``) failed, and
    ``replica`` was not made to catch up with ``table`` (``SYSTEM SYNC REPLICA``) within
    ``timeout`` seconds (``read_your_writes_timeout_ms``). ``reason`` says why (redacted); the
    original failure, if any, is ``__cause__``. Code 159 (the server's TIMEOUT_EXCEEDED, which its
    own ``SYNC REPLICA`` raises): a query failure for the pool, so the read stops here rather than
    go on to a replica that might not have the write either."""

    def __init__(self, writer: str, table: str, replica: str, timeout: float, reason: str) -> None:
        self.writer = writer
        self.table = table
        self.replica = replica
        self.timeout = timeout
        self.reason = redact(reason)
        super().__init__(
            f"Read-your-writes: the write to {table} was acknowledged by {writer}, which did not serve the "
            f"read; {replica} did not catch up with {table} within read_your_writes_timeout_ms="
            f"{timeout * 1000:g} ({self.reason}). Retry the read later, raise read_your_writes_timeout_ms, "
            "or read without read_your_writes."
        )
        self.code = 159  # after the base class, which may set its own
