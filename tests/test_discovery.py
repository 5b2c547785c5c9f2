"""Discovery from system.clusters, the I/O-free part: rows to replicas, the port rule, seeds,
set-diffing, and retiring a removed replica after its in-flight statements.

Not integration-tested yet: the pool does not take ``cluster=`` (see clickhouse_lb/core/discovery.py).
"""

from __future__ import annotations

import pytest

from clickhouse_lb.config.discovery import DiscoveryError
from clickhouse_lb.config.replicas import Replica
from clickhouse_lb.core.discovery import (
    ClusterRow,
    InFlight,
    carry_over,
    diff_replicas,
    discover,
    http_port_for,
    replicas_from_rows,
)

ROWS = [
    ClusterRow(1, 1, "ch-1", "10.0.0.1", 9000),
    ClusterRow(1, 2, "ch-2", "10.0.0.2", 9000),
    ClusterRow(2, 1, "ch-3", "10.0.0.3", 9000),
    ClusterRow(2, 2, "", "10.0.0.4", 9440),
]


@pytest.mark.parametrize(
    ("port", "override", "expected"),
    [(9000, None, 8123), (9440, None, 8443), (8123, None, 8123), (41234, None, 41234), (9000, 18123, 18123)],
)
def test_the_port_rule(port: int, override: int | None, expected: int) -> None:
    assert http_port_for(port, http_port=override) == expected


def test_rows_become_replicas_named_by_host_name() -> None:
    replicas = replicas_from_rows(ROWS, cluster="lb_cluster")
    assert [r.address for r in replicas] == ["ch-1:8123", "ch-2:8123", "ch-3:8123", "10.0.0.4:8443"]


def test_one_shard() -> None:
    assert [r.address for r in replicas_from_rows(ROWS, cluster="c", shard=2)] == ["ch-3:8123", "10.0.0.4:8443"]


def test_a_server_listed_in_two_shards_is_one_replica() -> None:
    rows = [ClusterRow(1, 1, "ch-1", "", 9000), ClusterRow(2, 1, "ch-1", "", 9000)]
    assert len(replicas_from_rows(rows, cluster="c")) == 1


def test_unknown_cluster_or_shard_is_a_clear_error() -> None:
    with pytest.raises(DiscoveryError, match=r"Cluster 'nope' is not in system\.clusters"):
        replicas_from_rows([], cluster="nope")
    with pytest.raises(DiscoveryError, match="has no shard 7; its shards: 1, 2"):
        replicas_from_rows(ROWS, cluster="c", shard=7)


def test_a_seed_that_is_down_is_not_fatal_while_another_answers() -> None:
    seeds = [Replica("down-1"), Replica("up"), Replica("never-asked")]
    asked = []

    def fetch(seed: Replica) -> list[ClusterRow]:
        asked.append(seed.host)
        if seed.host.startswith("down"):
            raise ConnectionRefusedError("refused")
        return ROWS

    seed, rows = discover(seeds, fetch)
    assert (seed.host, rows, asked) == ("up", ROWS, ["down-1", "up"])


def test_no_seed_answering_lists_every_failure_without_secrets() -> None:
    def fetch(seed: Replica) -> list[ClusterRow]:
        raise OSError(f"http://u:secret@{seed.host}/ refused")

    with pytest.raises(DiscoveryError) as info:
        discover([Replica("a"), Replica("b")], fetch)
    message = str(info.value)
    assert "a:8123: OSError" in message
    assert "b:8123: OSError" in message
    assert "secret" not in message


def test_diff_keeps_the_current_order_and_appends_new_replicas() -> None:
    current = [Replica("a"), Replica("b"), Replica("c")]
    change = diff_replicas(current, [Replica("d"), Replica("C"), Replica("a")])
    assert [r.host for r in change.replicas] == ["a", "c", "d"]
    assert change.kept == {0: 0, 2: 1}
    assert change.added == (2,)
    assert change.removed == (1,)
    assert not change.unchanged
    assert diff_replicas(current, list(reversed(current))).unchanged


def test_kept_replicas_keep_their_counts_and_added_ones_start_clean() -> None:
    change = diff_replicas([Replica("a"), Replica("b"), Replica("c")], [Replica("c"), Replica("a"), Replica("d")])
    assert carry_over([5, 7, 9], change, 0) == [5, 9, 0]


def test_a_removed_replica_is_released_after_its_in_flight_statements() -> None:
    flight: InFlight[str] = InFlight()
    closed: list[str] = []
    flight.acquire("b")
    flight.acquire("b")
    flight.retire("b", lambda: closed.append("b"))
    assert closed == []  # two statements still run there
    flight.release("b")
    assert closed == []
    flight.release("b")
    assert closed == ["b"]
    flight.retire("c", lambda: closed.append("c"))  # nothing in flight: at once
    assert closed == ["b", "c"]
    assert flight.in_flight("b") == 0
