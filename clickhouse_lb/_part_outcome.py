"""How :class:`~clickhouse_lb.errors.ShardedInsertError` tells each failed part: whether it may
have been applied, and its line of the message (kept apart: errors.py is at its size limit)."""

from __future__ import annotations

from clickhouse_connect.driver.exceptions import ProgrammingError

from clickhouse_lb._redact import brief, redact

__all__ = ["may_have_been_applied", "part_line"]


def may_have_been_applied(error: BaseException) -> bool:
    """Whether a part that failed with ``error`` may be on its shard anyway.

    The pool's own errors say it (``may_have_been_applied``). A ``ProgrammingError`` (the pool's
    ``ConfigurationError`` is one) is clickhouse-connect refusing the call before it builds the
    request: the insert's arguments, the data's column count (``InsertContext.data``), the
    column types and formats. Its serialisation errors (``DataError``, raised once the request
    is under way) and everything else may have reached a replica."""
    told = getattr(error, "may_have_been_applied", None)
    if told is not None:
        return bool(told)
    return not isinstance(error, ProgrammingError)


def part_line(shard_num: int, rows: int, error: BaseException) -> str:
    """``  shard 2 (32 rows): AllReplicasUnavailableError: ...: a:8123: refused; b:8123: refused [not applied]``:
    the error's first line, with the last error of each replica when it has them (the pool's
    unavailable errors list them on the lines after)."""
    text = str(error)
    head = text.splitlines()[0] if text else ""
    last_errors = getattr(error, "last_errors", None)
    if isinstance(last_errors, dict) and last_errors:
        replicas = "; ".join(f"{address}: {brief(str(e)) if e is not None else 'not tried'}"
                             for address, e in last_errors.items())
        head = f"{head.rstrip(': ')}: {replicas}"
    mark = "[may have been applied]" if may_have_been_applied(error) else "[not applied]"
    return f"  shard {shard_num} ({rows} rows): {redact(f'{type(error).__name__}: {head}')} {mark}"
