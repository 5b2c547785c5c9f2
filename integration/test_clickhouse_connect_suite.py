"""clickhouse-connect's own integration suite through pools.

Its retry tests, as the suite writes them (``http.request`` patched to reset a
stale keep-alive connection), through a pool over 3 local replicas: what a drop-in user gets.

By default the pool's clients have ``query_retries=0`` (failover is the pool's job; clickhouse-
connect still retries a remotely closed connection once on its own), so a second reset in a row
moves the statement to the next replica. A user who sets ``query_retries`` gets clickhouse-
connect's retries on the chosen replica first, exactly as a plain client makes them, and the
pool counts nothing against that replica when they succeed.

The suite itself is not in this repository (nothing is fetched at test time): its
``test_error_handling.py`` through pools, which ended in a pytest INTERNALERROR before the pool
released what it leaves behind (docs/busy-process.md), is run by
``tools/run_clickhouse_connect_suite.py`` over an export of it, and that runner exits 1 when the
pooled run leaves an "Exception ignored" or INTERNALERROR line (docs/local-cluster.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import urllib3

import clickhouse_lb
from clickhouse_lb.testing import ClusterBase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WHO = "SELECT getMacro('replica')"


def resets(pool: Any, count: int, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """The suite's ``flaky_request``: the first ``count`` requests fail as a reset keep-alive
    connection does in urllib3; the rest go through. Returns the number of requests made."""
    real_request = pool.http.request
    attempts = 0

    def flaky_request(method: str, url: str, **kwargs: Any) -> Any:
        nonlocal attempts
        attempts += 1
        if attempts <= count:
            try:
                raise ConnectionResetError("Connection reset by peer")
            except ConnectionResetError:
                raise urllib3.exceptions.ProtocolError("Connection aborted.")  # noqa: B904
        return real_request(method, url, **kwargs)

    monkeypatch.setattr(pool.http, "request", flaky_request)
    return lambda: attempts


@pytest.mark.parametrize("disconnect_count", [1, 2])
def test_an_explicit_query_retries_retries_on_the_chosen_replica(
    healthy_clickhouse_cluster: ClusterBase, monkeypatch: pytest.MonkeyPatch, disconnect_count: int
) -> None:
    cluster = healthy_clickhouse_cluster
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", share_state=False, query_retries=2) as pool:
        first = pool.command(WHO)
        attempts = resets(pool, disconnect_count, monkeypatch)
        answered = pool.query(WHO).result_rows[0][0]
        # The resets were retried on the chosen replica: no failover, no error counted.
        assert pool.stats.failovers == 0
        assert [r.errors_count for r in pool.replicas] == [0, 0, 0]
        if pool.hedged_requests == 0:
            assert answered == first
            assert attempts() == disconnect_count + 1  # as clickhouse-connect's suite counts them
        else:
            # This process stalled over 450 ms as the read's first check came due (the GIL-holding
            # thread of tools/busy_machine_tests.py): the read was raced on the next replica beside
            # its retries (docs/busy-process.md), and the first answer won; raced, not failed over.
            assert attempts() >= disconnect_count + 1


def test_by_default_a_second_reset_in_a_row_fails_over(
    healthy_clickhouse_cluster: ClusterBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = healthy_clickhouse_cluster
    with clickhouse_lb.get_pool(cluster.hosts, load_balancing="in_order", share_state=False) as pool:
        first = pool.command(WHO)
        for index in range(3):  # every replica's client made now: requests counted below are the statement's
            pool.client(pool.addresses[index]).command("SELECT 1")
        attempts = resets(pool, 2, monkeypatch)
        assert pool.query(WHO).result_rows[0][0] != first
        assert attempts() == 3  # clickhouse-connect's own retry, then the next replica
        assert pool.replicas[0].errors_count == 1
