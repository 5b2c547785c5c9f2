"""Every error the pools raise survives pickling: a pool used in a worker process
(``multiprocessing``, ``concurrent.futures.ProcessPoolExecutor``, a task queue) hands its
failures to the parent pickled. ``BaseException`` pickles only ``args`` (the message), which the
errors' constructors do not take: unpickling failed with a ``TypeError`` in the parent, in
place of the pool's error."""

from __future__ import annotations

import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from clickhouse_lb import errors
from clickhouse_lb.errors import (
    AllReplicasStaleError,
    AllReplicasUnavailableError,
    AttemptAbandonedError,
    AttemptFailure,
    ConfigurationError,
    PoolMemberError,
    ReadYourWritesError,
    ReplicaConnectError,
    RetryBudgetExhaustedError,
    SessionLostError,
    ShardedInsertError,
    StatementTimeoutError,
    WriteOutcomeUnknownError,
)

FAILURES = [AttemptFailure("r1:8123", 1, "connection refused"), AttemptFailure("r2:8123", 2, "hung")]
LAST = {"r1:8123": "connection refused", "r2:8123": "hung", "r3:8123": None}
ABANDONED = AttemptAbandonedError("r2:8123", "hung", "no answer to /ping", write=True)

#: One of each error class the package exports, made as the pools make them.
EXAMPLES: list[BaseException] = [
    AllReplicasUnavailableError(FAILURES, LAST, may_have_been_applied=True, write=True, operation="insert"),
    StatementTimeoutError(FAILURES, LAST, timeout=2.5, may_have_been_applied=True, operation="command"),
    RetryBudgetExhaustedError(FAILURES, LAST, budget="retry_budget_ratio=0.1", operation="query"),
    ABANDONED,
    WriteOutcomeUnknownError("insert", "r1:8123", "connection reset after the request was sent"),
    SessionLostError("r1:8123", "replica restarted", may_have_been_applied=True, session_id="s-1"),
    ReplicaConnectError("r1:8123", "connection refused"),
    AllReplicasStaleError({"r1:8123": 400.0, "r2:8123": None}, 300.0),
    PoolMemberError("server_version is the replicas' fact: read pool.server_versions()", name="server_version"),
    ConfigurationError("Bad load_balancing 'fastest'"),
    ReadYourWritesError("writer-1", "events", "r1:8123", 5.0, "no replica caught up"),
    ShardedInsertError("events", {1: 500}, {2: ABANDONED}, {1: 500, 2: 480}),
]


def _public(error: BaseException) -> dict[str, Any]:
    """What a caller reads of an error: its type, message and public attributes (errors inside
    it, a routed insert's failed parts, compared the same way)."""
    fields = {name: value for name, value in vars(error).items() if not name.startswith("_")}
    if isinstance(error, AttributeError):  # (kept by AttributeError itself, not in __dict__)
        fields["name"] = error.name
    for name, value in fields.items():
        if isinstance(value, dict):
            fields[name] = {k: _public(v) if isinstance(v, BaseException) else v for k, v in value.items()}
    return {"type": type(error), "message": str(error), **fields}


def test_every_exported_error_class_has_an_example() -> None:
    exported = {getattr(errors, name) for name in errors.__all__}
    classes = {c for c in exported if isinstance(c, type) and issubclass(c, BaseException)}
    assert classes == {type(e) for e in EXAMPLES}


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_an_error_survives_pickling_whole(error: BaseException) -> None:
    if sys.version_info >= (3, 11) and not getattr(error, "__notes__", None):
        error.add_note("while loading events")  # (kept in the error's __dict__: it must survive too)
    copy = pickle.loads(pickle.dumps(error))
    assert _public(copy) == _public(error)
    assert getattr(copy, "__notes__", None) == getattr(error, "__notes__", None)


def _fail_in_a_worker() -> None:
    raise StatementTimeoutError(FAILURES, LAST, timeout=2.5, operation="query")


def test_a_worker_process_hands_the_pools_error_to_its_parent() -> None:
    with ProcessPoolExecutor(max_workers=1) as workers, pytest.raises(StatementTimeoutError) as raised:
        workers.submit(_fail_in_a_worker).result(timeout=60)
    assert raised.value.timeout == 2.5
    assert raised.value.last_errors == LAST
    assert "failover_timeout=2.5s" in str(raised.value)
