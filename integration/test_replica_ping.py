"""A replica answers ``/ping`` within tens of ms while it runs other work, as a ClickHouse server
does (its HTTP handlers run in their own thread pool).

The pool fails a write as hung only when its checks (``/ping``) go unanswered for 0.15+0.6+2.4 s,
which is right for a real server; a test replica that cannot answer ``/ping`` for seconds gives
every test that uses it false "hung" verdicts. That happened: the local replica's ``INSERT ...
FORMAT`` detection backtracked exponentially on a statement's leading whitespace, holding the GIL
5.6 s for a ``CREATE`` indented by 24 spaces (clickhouse-connect's ``test_temporary_tables``
writes it so), and no thread of the replica ran meanwhile. Measured before the fix: the longest
wait for a ``/ping`` answer 12.3 s with this test's workload, 2.6-6.5 s with one thread (and the
pool test below failed with WriteOutcomeUnknownError "hung: no answer to /ping", the issue's
error); after: under 0.06 s, both at a load of 13-18 on 2 cores. The bound, 0.5 s, sits 8x above
the worst seen after and 5x below the best before.

An outside process does the pinging (:mod:`clickhouse_lb.testing._pingwatch`: a thread of the test
process would be delayed by the test process's own GIL).
"""

from __future__ import annotations

import threading
import time

import pytest

import clickhouse_lb
from clickhouse_lb.core.events import ErrorRecordedEvent
from clickhouse_lb.testing import ClusterBase
from clickhouse_lb.testing._pingwatch import ping_watch, temporary_table_round

pytestmark = pytest.mark.integration

#: The longest a ping may wait for its answer while the workload runs.
BOUND = 0.5
#: How long the workload runs at least (and every thread does at least MIN_ROUNDS rounds).
SECONDS = 3.0
MIN_ROUNDS = 3
THREADS = 3


def _temporary_table_rounds(client: object, deadline: float, rounds: list[int]) -> None:
    """The suite's pattern: a session, a temporary table, inserts (SQL and a DataFrame), reads."""
    done = 0
    while done < MIN_ROUNDS or time.monotonic() < deadline:
        temporary_table_round(client)
        done += 1
    rounds.append(done)


def test_ping_is_answered_while_sessions_with_temporary_tables_run(
    healthy_clickhouse_cluster: ClusterBase,
) -> None:
    cluster = healthy_clickhouse_cluster
    host, port = cluster.hosts[0].rsplit(":", 1)
    rounds: list[int] = []
    with ping_watch(host, int(port)) as watch:
        deadline = time.monotonic() + SECONDS
        clients = [cluster.client(0) for _ in range(THREADS)]
        workers = [threading.Thread(target=_temporary_table_rounds, args=(c, deadline, rounds)) for c in clients]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert len(rounds) == THREADS, "a workload thread failed (see its exception above)"
    assert watch.pings >= 20, watch  # the watcher ran alongside the workload
    assert watch.longest < BOUND, f"/ping went unanswered for {watch.longest:.2f}s ({watch})"


def test_pool_runs_the_temporary_table_pattern_without_a_false_failover(
    healthy_clickhouse_cluster: ClusterBase,
) -> None:
    """Through a pool as clickhouse-connect's suite runner makes it (``in_order``, every other
    setting its default, liveness checks on): before the fix the first round failed, with
    WriteOutcomeUnknownError (the session's replica taken for hung) or, once the replica was
    marked down, UNKNOWN_TABLE from the next replica, which has no such temporary table."""
    cluster = healthy_clickhouse_cluster
    errors: list[ErrorRecordedEvent] = []

    class Listener:
        def on_error_recorded(self, event: ErrorRecordedEvent) -> None:
            errors.append(event)

    rounds: list[int] = []
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", listeners=[Listener()]) as pool:
        _temporary_table_rounds(pool, time.monotonic() + SECONDS, rounds)
    assert rounds
    assert rounds[0] >= MIN_ROUNDS
    assert errors == []  # no error counted against a healthy replica (no "hung", no failed probe)
